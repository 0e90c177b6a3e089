"""The Ray Serve layer without a Ray cluster: replica placement and autoscaling options, the
`serve run` argument parsing, the replica header on every response, and the CLI's errors
(conflicting replica options, Ray Serve missing)."""

import sys

import httpx
import pytest
from serve_fake_engine import FakeLLM, FakeParams
from tests_serve_util import running_server

from wedlm.cli.main import main
from wedlm.serve import create_app
from wedlm.serve.ray_app import REPLICA_HEADER, ReplicaHeader, ReplicaSpec, replicas_text
from wedlm.testing import byte_tokenizer


def test_cpu_replicas_split_the_host_cpus_and_reserve_them():
    spec = ReplicaSpec(model="m", num_replicas=3).fit_threads(8)
    assert spec.threads == 2  # 8 CPUs // 3 replicas
    options = spec.deployment_options()
    assert options["ray_actor_options"] == {"num_cpus": 2, "num_gpus": 0}
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["max_ongoing_requests"] == 128  # twice the engine's default batch of 64
    assert ReplicaSpec(model="m", num_replicas=4).fit_threads(2).threads == 1  # never below one thread
    assert ReplicaSpec(model="m", num_replicas=2, threads=3).fit_threads(64).threads == 3  # given: kept
    assert ReplicaSpec(model="m", num_replicas=2).fit_threads(64, largest_node=16).threads == 16  # fits one node
    assert replicas_text(spec) == "3 replicas x 2 threads"


def test_autoscaling_bounds_and_target_come_from_the_batch_size():
    spec = ReplicaSpec(model="m", min_replicas=1, max_replicas=4, engine={"max_num_seqs": 8}).fit_threads(16)
    assert spec.threads == 4  # 16 CPUs // the most replicas (4)
    options = spec.deployment_options()
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                             "target_ongoing_requests": 8}
    assert "num_replicas" not in options and options["max_ongoing_requests"] == 16
    assert replicas_text(spec) == "1..4 replicas (autoscaled) x 4 threads"


def test_cuda_replicas_reserve_their_tensor_parallel_gpus():
    spec = ReplicaSpec(model="m", num_replicas=2, engine={"device": "cuda", "tensor_parallel_size": 2})
    spec = spec.fit_threads(32)
    assert spec.gpus_per_replica == 2 and spec.threads == 1
    assert spec.deployment_options()["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 2}
    assert ReplicaSpec(model="m", engine={"device": "cuda:1"}).gpus_per_replica == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"num_replicas": 0}, "num_replicas must be an integer >= 1, got 0"),
    ({"threads": 0}, "threads must be an integer >= 1"),
    ({"min_replicas": 1}, "min_replicas and max_replicas go together"),
    ({"min_replicas": 3, "max_replicas": 2}, "max_replicas (2) must be >= min_replicas (3)"),
    ({"num_replicas": True}, "num_replicas must be an integer"),
])
def test_bad_specs_name_the_field(kwargs, message):
    with pytest.raises(ValueError) as err:
        ReplicaSpec(model="m", **kwargs)
    assert message in str(err.value)


def test_every_response_names_the_replica():
    app = create_app(FakeLLM(byte_tokenizer(256)), "fake", sampling_params_cls=FakeParams)
    app.add_middleware(ReplicaHeader, name="r1@host:42")
    with running_server(app) as url:
        ok = httpx.post(f"{url}/v1/completions", json={"prompt": "abc", "max_tokens": 3})
        streamed = httpx.post(f"{url}/v1/completions", json={"prompt": "abc", "max_tokens": 3, "stream": True})
        bad = httpx.post(f"{url}/v1/completions", json={"prompt": "abc", "max_tokens": 0})
        missing = httpx.get(f"{url}/nowhere")
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    assert streamed.text.endswith("data: [DONE]\n\n")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    assert missing.status_code == 404
    assert [r.headers[REPLICA_HEADER] for r in (ok, streamed, bad, missing)] == ["r1@host:42"] * 4


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "2", "--min-replicas", "1", "--max-replicas", "2"], "give one or the other"),
    (["--min-replicas", "2"], "--min-replicas and --max-replicas go together"),
    (["--min-replicas", "3", "--max-replicas", "2"], "--max-replicas (2) must be >= --min-replicas (3)"),
])
def test_cli_rejects_conflicting_replica_options(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wedlm serve: error: ") and message in err and "Traceback" not in err


def test_cli_without_ray_names_the_install_command(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["serve", "--replicas", "2"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "wedlm[ray]"' in err and "Traceback" not in err


def test_serve_run_builder_parses_its_arguments():
    pytest.importorskip("ray.serve")
    from wedlm.serve.ray_app import app_builder

    app = app_builder({"model": "models/wedlm-tiny", "num_replicas": "2", "max_model_len": "256", "threads": "1"})
    deployment = app._bound_deployment
    assert deployment.num_replicas == 2
    assert deployment.ray_actor_options["num_cpus"] == 1
    with pytest.raises(ValueError, match="num_replicas must be int, got 'two'"):
        app_builder({"model": "m", "num_replicas": "two"})
    with pytest.raises(ValueError, match="unknown argument 'replicas'"):
        app_builder({"model": "m", "replicas": "2"})
    with pytest.raises(ValueError, match="model is required"):
        app_builder({"num_replicas": "2"})


def test_the_engine_closes_when_the_replica_app_shuts_down():
    from fastapi.testclient import TestClient

    from wedlm.serve.ray_app import close_with_app

    llm = FakeLLM(byte_tokenizer(256))
    closed = []
    llm.close = lambda: closed.append(True)
    app = create_app(llm, "fake", sampling_params_cls=FakeParams)
    close_with_app(app, llm)
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        assert closed == []
    assert closed == [True]
