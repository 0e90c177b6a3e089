"""Concurrency on the real engine: 20 streaming clients at once share the one engine loop
and each gets its complete greedy answer; clients killed mid-stream abort their requests
and leave no KV blocks held."""

import asyncio
import json

import httpx
import openai
from tests_serve_util import MODEL_NAME, metric_value, wait_until

from wedlm import SamplingParams

N_CLIENTS = 20
FAST = {"wedlm_entropy_threshold": 6.0}
LONG = {"decoding": "ar", "ignore_eos": True, "max_tokens": 200, "temperature": 0}


def metrics(base_url):
    return httpx.get(f"{base_url}/metrics").text


def knobs(i):
    """Client i's decoding: half AR (one token per forward), half WeDLM with many tokens per forward."""
    return {"decoding": "ar"} if i % 2 == 0 else FAST


async def stream_answer(client, i, prompt):
    stream = await client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                             stream=True, extra_body=knobs(i))
    text, finish = "", None
    async for chunk in stream:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    return text, finish


async def killed_client(base_url, started: asyncio.Event):
    """Open a long stream, read two events, then drop the connection."""
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{base_url}/v1/completions",
                               json={"prompt": "never ending", "stream": True, **LONG}) as response:
            seen = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    assert "finish_reason\":null" in line
                    seen += 1
                    if seen == 2:
                        started.set()
                        return


async def run_clients(base_url, prompts):
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    started = [asyncio.Event(), asyncio.Event()]
    killers = [asyncio.create_task(killed_client(base_url, event)) for event in started]
    answers = await asyncio.gather(*(stream_answer(client, i, p) for i, p in enumerate(prompts)))
    await asyncio.gather(*killers)
    await client.close()
    return answers


def test_twenty_streaming_clients_and_two_killed_ones(base_url, server, reference_llm):
    engine = server[1].state.server.engine
    before = metrics(base_url)
    aborted_before = aborted(before)
    prompts = [f"Client {i} says: {'ab' * (i % 5)}" for i in range(N_CLIENTS)]
    want = reference_llm.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=16, **knobs(i))
                                            for i in range(N_CLIENTS)])
    steps_before = engine.steps
    answers = asyncio.run(run_clients(base_url, prompts))
    # one shared, continuously batched engine: far fewer steps than the requests' forwards
    assert engine.steps - steps_before < sum(r["stats"]["decode_forwards"] for r in want) / 2
    for (text, finish), ref in zip(answers, want):
        assert text == ref["text"] and finish == ref["finish_reason"] == "length"
    assert wait_until(lambda: engine.num_active() == 0 and engine.snapshot.get("num_running") == 0, timeout=30)
    after = metrics(base_url)
    assert metric_value(after, "wedlm_kv_blocks_in_use") == 0
    assert aborted(after) == aborted_before + 2
    assert engine.snapshot["kv_blocks_free"] == engine.snapshot["kv_blocks_total"]


def test_kill_mid_stream_frees_the_blocks_it_held(base_url, server):
    engine = server[1].state.server.engine
    with httpx.stream("POST", f"{base_url}/v1/completions",
                      json={"prompt": "x" * 40, "stream": True, **LONG}, timeout=60) as response:
        events = (line for line in response.iter_lines() if line.startswith("data: "))
        first = json.loads(next(events)[6:])
        assert first["choices"][0]["finish_reason"] is None
        assert wait_until(lambda: engine.snapshot.get("kv_blocks_used", 0) > 0)
    assert wait_until(lambda: engine.snapshot.get("kv_blocks_used") == 0 and engine.num_active() == 0, timeout=30)
    assert engine.snapshot["num_running"] == 0 and engine.snapshot["num_waiting"] == 0


def aborted(text):
    for line in text.splitlines():
        if line.startswith('wedlm_requests_finished_total{finish_reason="abort"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
