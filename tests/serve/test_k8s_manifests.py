"""The Kubernetes sketches in deploy/k8s parse, and what they run is a valid wedlm command line
(the Deployment's container) or valid `app_builder` arguments (the RayService)."""

from pathlib import Path

import pytest
import yaml

from wedlm.cli.main import build_parser
from wedlm.serve.ray_app import BUILDER_KEYS, ENGINE_KEYS, PROXY_CALLBACK_ENV, PROXY_IMPORT_PATH, ReplicaSpec

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"


def documents(name: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((K8S / name).read_text())}


def test_deployment_runs_wedlm_serve_and_is_scraped():
    docs = documents("wedlm-deployment.yaml")
    deployment, service = docs["Deployment"], docs["Service"]
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["wedlm"]
    args = build_parser().parse_args(container["args"])  # argparse exits on a bad option
    assert args.command == "serve" and args.host == "0.0.0.0" and args.device == "cuda"
    port = container["ports"][0]["containerPort"]
    assert args.port == port
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    volume_path = container["volumeMounts"][0]["mountPath"]
    assert args.model == volume_path


def test_rayservice_arguments_are_app_builder_arguments():
    service = documents("wedlm-rayservice.yaml")["RayService"]
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    (app,) = config["applications"]
    assert app["import_path"] == "wedlm.serve.ray_app:app_builder" and app["route_prefix"] == "/"
    args = app["args"]
    assert set(args) <= set(BUILDER_KEYS) | set(ENGINE_KEYS)
    spec = ReplicaSpec(model=args["model"], min_replicas=int(args["min_replicas"]),
                       max_replicas=int(args["max_replicas"]), engine={"device": args["device"]})
    assert spec.gpus_per_replica == 1 and spec.most_replicas == 8
    cluster = service["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"], *(g["template"] for g in cluster["workerGroupSpecs"])]
    for pod in pods:  # every node's proxy loads the failover middleware
        (container,) = pod["spec"]["containers"]
        assert {"name": PROXY_CALLBACK_ENV, "value": PROXY_IMPORT_PATH} in container["env"]


@pytest.mark.parametrize("name", ["wedlm-deployment.yaml", "wedlm-rayservice.yaml"])
def test_manifests_say_what_they_are(name):
    assert (K8S / name).read_text().startswith("#")  # each opens with what it deploys
