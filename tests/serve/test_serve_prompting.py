"""`/v1/models` reports how the model folder wants to be prompted (generation_config.json's
`wedlm_single_turn` / `wedlm_chat_only`); the web chat reads `single_turn`."""

import json
import shutil

import httpx
import pytest
from tests_serve_util import MODEL_NAME, make_llm, running_server


@pytest.mark.parametrize("fields,want", [
    ({}, {"single_turn": False, "chat_only": False}),
    ({"wedlm_single_turn": True, "wedlm_chat_only": True}, {"single_turn": True, "chat_only": True}),
])
def test_models_card_reports_prompting(tiny_wedlm, tmp_path, fields, want):
    from wedlm.serve import create_app

    folder = tmp_path / "model"
    shutil.copytree(tiny_wedlm, folder)
    config = folder / "generation_config.json"
    data = json.loads(config.read_text()) if config.exists() else {}
    config.write_text(json.dumps({**data, **fields}))
    with running_server(create_app(make_llm(folder), MODEL_NAME)) as url:
        card = httpx.get(f"{url}/v1/models").json()["data"][0]["wedlm"]
    assert {k: card[k] for k in want} == want


def test_bad_prompting_value_is_named(tiny_wedlm, tmp_path):
    from wedlm.serve.app import prompting

    folder = tmp_path / "model"
    shutil.copytree(tiny_wedlm, folder)
    (folder / "generation_config.json").write_text(json.dumps({"wedlm_single_turn": "yes"}))

    class Fake:
        model_path = str(folder)

    with pytest.raises(ValueError, match="wedlm_single_turn must be true or false"):
        prompting(Fake())


@pytest.mark.parametrize("body, library_param, param", [
    ({"prompt": "a", "echo": True, "logprobs": 1}, "prompt_logprobs", "echo"),
    ({"prompt": "a", "guided_regex": "a+"}, "structured", "guided_regex"),
    ({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_object"}},
     "structured.json_object", "response_format"),
    ({"messages": [{"role": "user", "content": "a"}]}, "prompt", "messages"),
    ({"messages": [{"role": "user", "content": "a"}], "max_completion_tokens": 5}, "max_tokens",
     "max_completion_tokens"),
    ({"prompt": "a"}, "max_tokens", "max_tokens"),
])
def test_library_refusals_name_the_field_the_client_sent(body, library_param, param):
    from wedlm.engine.errors import RequestError
    from wedlm.serve.prompts import refusal
    from wedlm.serve.schemas import ChatCompletionRequest, CompletionRequest

    req = (ChatCompletionRequest if "messages" in body else CompletionRequest).model_validate(body)
    err = refusal(RequestError(library_param, "the library's message"), req)
    assert (err.param, err.status) == (param, 400)
    assert str(err) == f"Invalid value for '{param}': the library's message"
