"""`/v1/models` reports how the model folder wants to be prompted (generation_config.json's
`wedlm_single_turn` / `wedlm_chat_only`, under the same names); the web chat reads `wedlm_single_turn`."""

import json
import shutil

import httpx
import pytest
from tests_serve_util import MODEL_NAME, make_llm, running_server


@pytest.mark.parametrize("fields,want", [
    ({}, {"wedlm_single_turn": False, "wedlm_chat_only": False}),
    ({"wedlm_single_turn": True, "wedlm_chat_only": True}, {"wedlm_single_turn": True, "wedlm_chat_only": True}),
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


def test_model_by_id_is_the_list_card_and_an_unknown_id_is_404(tiny_wedlm):
    """`GET /v1/models/{id}` (the openai client's `models.retrieve`): the served model's card, the
    same as `/v1/models` lists; any other id is a 404 naming it, code `model_not_found`."""
    import openai

    from wedlm.serve import create_app

    with running_server(create_app(make_llm(tiny_wedlm), MODEL_NAME)) as url:
        listed = httpx.get(f"{url}/v1/models").json()["data"][0]
        one = httpx.get(f"{url}/v1/models/{MODEL_NAME}")
        missing = httpx.get(f"{url}/v1/models/org/other")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)
        retrieved = client.models.retrieve(MODEL_NAME)
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("other")
    assert one.status_code == 200 and one.json() == listed
    assert retrieved.id == MODEL_NAME and retrieved.owned_by == "wedlm"
    assert missing.status_code == 404
    assert missing.json()["error"] == {"message": f"The model 'org/other' does not exist; this server serves "
                                                  f"'{MODEL_NAME}'", "type": "invalid_request_error",
                                       "param": "model", "code": "model_not_found"}
