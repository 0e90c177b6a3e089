"""The web chat in real headless Chromium (Debian's /usr/bin/chromium driven by Playwright):
type a prompt, watch a streamed answer coloured by decode step, with live stats; a second
turn carries the conversation. Saves a screenshot under the pytest tmp dir."""

from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed at /usr/bin/chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        chrome = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        yield chrome
        chrome.close()


def set_value(page, selector, value):
    page.eval_on_selector(selector, "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                          str(value))


def ask(page, text, turn):
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    answer = page.locator(".msg.assistant").nth(turn)
    answer.locator(".meta").wait_for(timeout=60_000)
    return answer


def test_web_chat_streams_a_coloured_answer(browser, base_url, tmp_path):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    errors = []
    page.on("pageerror", lambda err: errors.append(str(err)))
    page.goto(base_url + "/")
    page.wait_for_function("document.querySelector('#model').textContent.includes('wedlm-test')")
    page.select_option("#decoding", "wedlm")
    set_value(page, "#tau", 4.5)  # random weights are uncertain: a high tau shows parallel commits
    set_value(page, "#window", 8)
    set_value(page, "#max-tokens", 40)
    set_value(page, "#temperature", 0)

    answer = ask(page, "Hello! Count to five.", turn=0)
    steps = answer.locator(".step")
    assert steps.count() >= 2
    colours = {steps.nth(i).evaluate("el => getComputedStyle(el).backgroundColor") for i in range(steps.count())}
    assert len(colours) >= 2
    tokens = [int(steps.nth(i).get_attribute("data-tokens")) for i in range(steps.count())]
    assert sum(tokens) == 40 and max(tokens) > 1  # several tokens landed in one forward
    assert float(page.inner_text("#stat-tpf")) > 1.0 and float(page.inner_text("#stat-tps")) > 0
    assert "tokens/forward" in answer.locator(".meta").inner_text()

    second = ask(page, "And again?", turn=1)
    assert second.locator(".step").count() >= 1
    assert page.locator(".msg.user").count() == 2 and not page.locator(".msg.error").count()
    assert not errors, errors

    shot = tmp_path / "web_chat.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"web chat screenshot: {shot}")
    assert shot.stat().st_size > 10_000
    page.close()


def single_turn_copy(folder, tmp_path):
    """A copy of the checkpoint whose generation_config.json declares it single-turn."""
    import json
    import shutil

    copy = tmp_path / "single_turn"
    shutil.copytree(folder, copy)
    config = copy / "generation_config.json"
    data = json.loads(config.read_text()) if config.exists() else {}
    config.write_text(json.dumps({**data, "wedlm_single_turn": True}))
    return copy


def test_single_turn_model_sends_each_question_alone(browser, tiny_wedlm, tmp_path):
    from tests_serve_util import MODEL_NAME, make_llm, running_server

    from wedlm.serve import create_app

    app = create_app(make_llm(single_turn_copy(tiny_wedlm, tmp_path)), MODEL_NAME)
    sent = []
    with running_server(app) as url:
        page = browser.new_page()
        page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/chat/completions") else None)
        page.goto(url + "/")
        page.wait_for_selector(".msg.note")
        assert page.locator(".msg.note").count() == 1 and "single questions" in page.inner_text(".msg.note")
        set_value(page, "#max-tokens", 4)
        ask(page, "one", turn=0)
        ask(page, "two", turn=1)
        page.close()
    assert [m["content"] for m in sent[1]["messages"]] == ["two"]  # the first turn is not sent again


def test_web_chat_with_an_api_key(browser, tiny_wedlm):
    """A keyed server: the page asks for the key, keeps it in localStorage and sends it as a
    Bearer token with /v1/models and every chat request."""
    from tests_serve_util import MODEL_NAME, make_llm, running_server

    from wedlm.serve import create_app
    from wedlm.serve.security import AccessPolicy

    key = "web-chat-key"
    app = create_app(make_llm(tiny_wedlm), MODEL_NAME, access=AccessPolicy(api_key=key))
    sent = []
    with running_server(app) as url:
        page = browser.new_page()
        page.on("request", lambda r: sent.append((r.url, r.headers.get("authorization"))) if "/v1/" in r.url else None)
        page.goto(url + "/")
        page.wait_for_function("document.querySelector('#model').textContent.includes('no model')")
        assert "API key" in page.inner_text("#model")
        set_value(page, "#api-key", key)
        page.dispatch_event("#api-key", "change")
        page.wait_for_function("document.querySelector('#model').textContent.includes('wedlm-test')")
        set_value(page, "#max-tokens", 4)
        answer = ask(page, "hi", turn=0)
        assert "tokens/forward" in answer.locator(".meta").inner_text()
        page.reload()
        page.wait_for_function("document.querySelector('#model').textContent.includes('wedlm-test')")
        assert page.input_value("#api-key") == key
        page.close()
    chats = [auth for u, auth in sent if u.endswith("/v1/chat/completions")]
    models = [auth for u, auth in sent if u.endswith("/v1/models")]
    assert chats == [f"Bearer {key}"] and models == [None, f"Bearer {key}", f"Bearer {key}"]


def test_a_json_schema_in_the_web_chat_constrains_the_answer(browser, base_url):
    """The schema box becomes response_format; the answer parses and fits the schema; bad JSON in
    the box is an error shown in the chat, nothing sent."""
    import json

    schema = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}}, "required": ["a"],
              "additionalProperties": False}
    page = browser.new_page()
    sent = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/chat/completions") else None)
    page.goto(base_url + "/")
    page.wait_for_function("document.querySelector('#model').textContent.includes('wedlm-test')")
    set_value(page, "#max-tokens", 24)
    set_value(page, "#temperature", 0)
    page.fill("#schema", json.dumps(schema))
    answer = ask(page, "Pick one.", turn=0)
    assert sent[-1]["response_format"]["json_schema"]["schema"] == schema
    text = "".join(answer.locator(".step").nth(i).inner_text() for i in range(answer.locator(".step").count()))
    assert json.loads(text)["a"] in ("x", "yy")
    page.fill("#schema", "{not json")
    page.fill("#prompt", "Again.")
    page.press("#prompt", "Enter")
    page.locator(".msg.assistant.error").wait_for(timeout=10_000)
    assert "not valid JSON" in page.locator(".msg.assistant.error").inner_text() and len(sent) == 1
    page.close()
