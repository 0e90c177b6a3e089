"""Structured outputs: every decoder's answers are valid by construction (JSON schema, JSON mode,
regex, choice), constrained `verified` equals constrained `ar` token for token, compiled grammars
are cached, and bad constraints or a missing backend fail with the field named."""

import json
import re
import sys
from pathlib import Path

import pytest

from wedlm import LLM, SamplingParams, StructuredOutputs
from wedlm.engine.errors import RequestError
from wedlm.engine.structured import BackendMissingError, backend_for

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
DECODERS = ("ar", "wedlm", "blockwise", "verified")
SUM_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 198}},
              "required": ["answer"], "additionalProperties": False}
LIST_SCHEMA = {"type": "array", "items": {"type": "string", "enum": ["Mia", "Ben", "Sam"]}, "maxItems": 5}
COUNT_REGEX = r"\d+(, \d+)*"
CHOICES = ["yes", "no", "maybe"]
QUESTIONS = ["What is 47 + 38?", "Count from 1 to 12.", "Reverse the list: Mia, Ben, Sam.", "What is 90 - 25?"]
CONSTRAINTS = [{"json_schema": SUM_SCHEMA}, {"json_schema": LIST_SCHEMA}, {"json_object": True},
               {"regex": COUNT_REGEX}, {"choice": CHOICES}]


def valid(structured: dict, text: str) -> bool:
    """Whether a finished answer satisfies its constraint (the schemas here checked by hand)."""
    if "regex" in structured:
        return re.fullmatch(structured["regex"], text) is not None
    if "choice" in structured:
        return text in structured["choice"]
    value = json.loads(text)
    if structured.get("json_object"):
        return isinstance(value, dict)
    if structured["json_schema"] is SUM_SCHEMA:
        return set(value) == {"answer"} and isinstance(value["answer"], int) and 0 <= value["answer"] <= 198
    return isinstance(value, list) and len(value) <= 5 and all(v in ("Mia", "Ben", "Sam") for v in value)


@pytest.fixture(scope="module")
def shipped():
    return LLM(str(SHIPPED), device="cpu", dtype="float32")


def chat(llm, question: str) -> str:
    return llm.tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)


@pytest.mark.parametrize("decoding", DECODERS)
def test_every_finished_answer_is_valid_on_the_shipped_model(shipped, decoding):
    """Greedy and sampled, batched: each answer that ends with a stop satisfies its constraint."""
    prompts, params, kinds = [], [], []
    for i, structured in enumerate(CONSTRAINTS):
        for temperature in (0.0, 1.0):
            prompts.append(chat(shipped, QUESTIONS[i % len(QUESTIONS)]))
            params.append(SamplingParams(temperature=temperature, seed=i, max_tokens=40, decoding=decoding,
                                         structured=structured))
            kinds.append(structured)
    outs = shipped.generate(prompts, params)
    assert [o.get("error") for o in outs] == [None] * len(outs)
    finished = [(s, o["text"]) for s, o in zip(kinds, outs) if o["finish_reason"] == "stop"]
    assert len(finished) >= len(outs) // 2, [o["text"] for o in outs]
    for structured, text in finished:
        assert valid(structured, text), (structured, text)


def test_choice_is_one_of_the_choices_under_every_decoder(shipped):
    for decoding in DECODERS:
        for seed in range(3):
            p = SamplingParams(temperature=1.0, seed=seed, max_tokens=8, decoding=decoding,
                               structured={"choice": CHOICES})
            out = shipped.generate([chat(shipped, "Is 5 more than 3?")], p)[0]
            assert out["finish_reason"] == "stop" and out["text"] in CHOICES, out


def test_counting_under_a_regex_keeps_the_answer(shipped):
    """The model's own answer already matches: the constraint changes nothing, for every decoder."""
    for decoding in DECODERS:
        p = SamplingParams(temperature=0, max_tokens=48, decoding=decoding, structured={"regex": COUNT_REGEX})
        out = shipped.generate([chat(shipped, "Count from 1 to 12.")], p)[0]
        assert out["text"] == ", ".join(str(i) for i in range(1, 13)), (decoding, out["text"])


def test_constrained_verified_equals_constrained_ar(shipped):
    prompts = [chat(shipped, q) for q in QUESTIONS]
    for structured in CONSTRAINTS:
        ar = shipped.generate(prompts, SamplingParams(temperature=0, max_tokens=40, decoding="ar",
                                                      structured=structured))
        ver = shipped.generate(prompts, SamplingParams(temperature=0, max_tokens=40, decoding="verified",
                                                       structured=structured))
        assert [o["token_ids"] for o in ver] == [o["token_ids"] for o in ar], structured
        assert [o["finish_reason"] for o in ver] == [o["finish_reason"] for o in ar]


def test_an_answer_cut_by_max_tokens_finishes_with_length(shipped):
    p = SamplingParams(temperature=0, max_tokens=3, decoding="wedlm", structured={"json_schema": SUM_SCHEMA})
    out = shipped.generate([chat(shipped, "What is 47 + 38?")], p)[0]
    assert out["finish_reason"] == "length" and len(out["token_ids"]) == 3
    assert out["text"].startswith('{"')


ENUM_SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}, "b": {"type": "boolean"}},
               "required": ["a", "b"], "additionalProperties": False}


@pytest.mark.parametrize("decoding", DECODERS)
def test_random_model_with_batching_prefix_caching_and_preemption(tiny_path, decoding):
    """A random model on a cache small enough to preempt: bounded grammars always finish, and
    every answer is valid and equal to the one decoded alone."""
    llm = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, num_kv_blocks=14, device="cpu")
    ref = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu")
    constraints = [{"json_schema": ENUM_SCHEMA}, {"regex": "[ab]{1,3}-[0-9]{2}"}, {"choice": ["cat", "dog"]}]
    prompts = ["shared prefix of the batch " + str(i) for i in range(6)]
    params = [SamplingParams(temperature=0, max_tokens=24, decoding=decoding, structured=constraints[i % 3],
                             wedlm_entropy_threshold=5.0) for i in range(6)]
    outs = llm.generate(prompts, params)
    assert [o["finish_reason"] for o in outs] == ["stop"] * 6, [o["text"] for o in outs]
    assert sum(o["stats"]["preemptions"] for o in outs) > 0
    for o, p in zip(outs, params):
        s = p.structured
        if s.kind == "json_schema":
            value = json.loads(o["text"])
            assert value["a"] in ("x", "yy") and isinstance(value["b"], bool)
        elif s.kind == "regex":
            assert re.fullmatch(s.regex, o["text"]), o["text"]
        else:
            assert o["text"] in s.choice
    assert [ref.generate([q], p)[0]["token_ids"] for q, p in zip(prompts, params)] == [o["token_ids"] for o in outs]
    assert ref.metrics()["prefix_cache_hit_tokens"] > 0  # one by one, the shared prefix came from the cache


def test_wedlm_fills_the_text_the_grammar_forces_in_one_forward(shipped):
    """`{"answer": ` is forced by the schema: its 6 tokens (xgrammar's tokenization) are filled in
    one forward, so forwards <= tokens - 5; so are the closing brace and the stop once the digits
    are decided: 10 tokens in 3 forwards. Masking the leftmost mask alone gave 13 tokens (a key
    spelt letter by letter) in 8 forwards."""
    p = SamplingParams(temperature=0, max_tokens=48, decoding="wedlm", structured={"json_schema": SUM_SCHEMA})
    out = shipped.generate([chat(shipped, "What is 47 + 38?")], p)[0]
    tokens, forwards = len(out["token_ids"]), out["stats"]["decode_forwards"]
    assert out["finish_reason"] == "stop" and valid({"json_schema": SUM_SCHEMA}, out["text"]), out["text"]
    assert out["text"].startswith('{"answer": ') and forwards <= tokens - 5  # 6 forced tokens, one forward
    assert (tokens, forwards) == (10, 3) and tokens / forwards > 1.5


@pytest.mark.parametrize("decoding", ["wedlm", "blockwise"])
def test_random_model_fills_the_whole_window_with_grammar_accepted_tokens(tiny_path, decoding, monkeypatch):
    """tau above every constrained entropy: each step fills every mask of the window under the
    grammar's mask, left to right, so the leading run is the whole window (or ends at a stop) and
    the grammar accepts all of it. Unconstrained fills right of the leftmost mask (a random
    model's) would be rejected at once and leave the run short."""
    from wedlm.engine.decoders import constrain, streaming

    steps = []

    def checked(seq, slots, logits, ar_first=False):
        constrain.fill_in_order(seq, slots, logits, ar_first)
        window = seq.window
        run = window[:streaming.leading_filled(window)]
        ends = any(t in seq.stop_ids for t in run)
        steps.append((len(run), len(window), ends, seq.grammar.valid_prefix(run)))

    monkeypatch.setattr(streaming, "fill_in_order", checked)
    llm = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=8, device="cpu")
    regex = "[ab]{6}-[0-9]{6}"
    p = SamplingParams(temperature=0, max_tokens=32, decoding=decoding, structured={"regex": regex},
                       wedlm_entropy_threshold=5.0)
    out = llm.generate(["a prompt"], p)[0]
    assert out["finish_reason"] == "stop" and re.fullmatch(regex, out["text"]), out["text"]
    assert steps and all(accepted == run for run, _, _, accepted in steps)  # never a rejected token
    assert all(run == size or ends for run, size, ends, _ in steps), steps
    assert len(steps) == 2  # 13 characters and the stop: two windows of 8


@pytest.mark.parametrize("decoding", DECODERS)
def test_unconstrained_requests_never_reach_the_grammar(shipped, decoding, monkeypatch):
    """Batched with constrained requests, an unconstrained one decodes exactly as alone, and no
    grammar helper ever sees it."""
    from wedlm.engine.decoders import ar, streaming, verified

    plain = SamplingParams(temperature=0, max_tokens=48, decoding=decoding)
    alone = shipped.generate([chat(shipped, "Count from 1 to 12.")], plain)[0]
    seen = []

    def spy(fn):
        def run(seq, *args, **kwargs):
            seen.append(seq.params.structured)
            return fn(seq, *args, **kwargs)
        return run

    for module, name in ((streaming, "fill_in_order"), (ar, "mask_first_row"), (verified, "verify_rows"),
                         (verified, "with_forced")):
        monkeypatch.setattr(module, name, spy(getattr(module, name)))
    constrained = SamplingParams(temperature=0, max_tokens=48, decoding=decoding,
                                 structured={"json_schema": SUM_SCHEMA})
    outs = shipped.generate([chat(shipped, "What is 47 + 38?"), chat(shipped, "Count from 1 to 12."),
                             chat(shipped, "What is 90 - 25?")], [constrained, plain, constrained])
    assert outs[1]["token_ids"] == alone["token_ids"]
    assert outs[1]["text"] == ", ".join(str(i) for i in range(1, 13))
    assert seen and None not in seen  # the grammar path ran, for the constrained requests only


def test_compiled_grammars_are_cached_by_text(shipped):
    tok = shipped.tokenizer
    first = backend_for(tok, 4096, {1, 3})
    assert backend_for(tok, 4096, {1, 3}) is first  # one backend per tokenizer
    hits, misses = first.hits, first.misses
    a = first.compiled(StructuredOutputs(json_schema={"type": "object", "properties": {"q": {"type": "string"}}}))
    b = first.compiled(StructuredOutputs(json_schema='{"type":"object",  "properties": {"q":{"type": "string"}}}'))
    assert a is b and (first.hits, first.misses) == (hits + 1, misses + 1)
    c = first.compiled(StructuredOutputs(json_schema={"properties": {"q": {"type": "string"}}, "type": "object"}))
    assert c is not a and first.misses == misses + 2  # key order is part of the schema's text


def test_properties_come_in_the_schema_order(shipped):
    schema = {"type": "object", "properties": {"question": {"enum": ["q"]}, "answer": {"type": "integer"}},
              "required": ["question", "answer"], "additionalProperties": False}
    p = SamplingParams(temperature=0, max_tokens=24, structured={"json_schema": schema})
    text = shipped.generate([chat(shipped, "What is 47 + 38?")], p)[0]["text"]
    assert text.startswith('{"question": "q", "answer": '), text


@pytest.mark.parametrize("fields,param", [
    ({"regex": "("}, "structured.regex"),
    ({"json_schema": {"type": "objec"}}, "structured.json_schema"),
    ({"json_schema": "{not json"}, "structured.json_schema"),
    ({"choice": []}, "structured.choice"),
    ({"choice": ["a", 3]}, "structured.choice"),
    ({"choice": "abc"}, "structured.choice"),
    ({"regex": 5}, "structured.regex"),
    ({"json_object": "yes"}, "structured.json_object"),
    ({"json_schema": 5}, "structured.json_schema"),
    ({}, "structured"),
    ({"regex": "a", "choice": ["a"]}, "structured"),
    ({"grammar": "x"}, "structured"),
])
def test_bad_constraints_name_the_field(fields, param):
    with pytest.raises(RequestError) as err:
        SamplingParams(structured=fields)
    assert err.value.param == param
    assert param.split(".")[-1] in str(err.value)


def test_structured_with_ignore_eos_is_refused():
    with pytest.raises(RequestError) as err:
        SamplingParams(structured={"regex": "a+"}, ignore_eos=True)
    assert err.value.param == "structured" and "ignore_eos" in str(err.value)


def test_missing_backend_is_a_clear_request_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now raises ImportError
    with pytest.raises(BackendMissingError) as err:
        SamplingParams(structured={"regex": "a+"})
    assert err.value.param == "structured.regex" and "wedlm[structured]" in str(err.value)


@pytest.mark.parametrize("decoding", DECODERS)
def test_min_tokens_yields_where_the_grammar_must_end(shipped, decoding):
    """min_tokens puts -inf on the stop ids, the grammar allows only them after "a": the grammar
    decides (the answer ends, valid), greedy and sampled, instead of a row with no finite logit."""
    for temperature in (0.0, 1.0):
        p = SamplingParams(temperature=temperature, seed=1, max_tokens=10, min_tokens=5, decoding=decoding,
                           structured={"regex": "a"})
        out = shipped.generate([chat(shipped, "What is 4 + 5?")], p)[0]
        assert out["finish_reason"] == "stop" and out["text"] == "a", out
        assert len(out["token_ids"]) == 2 and out["token_ids"][0] == shipped.tokenizer.convert_tokens_to_ids("a")
        assert out["token_ids"][1] in shipped.engine.stop_ids


@pytest.mark.parametrize("decoding", DECODERS)
def test_a_stop_token_never_spells_grammar_text(shipped, decoding):
    """The choice "<|im_end|>" is literal text: the stop token of that name must not be read as
    it (the answer would end empty, which no choice is); it is spelt with ordinary tokens. A
    request's extra stop id (the token "a") likewise only ends the answer."""
    im_end = shipped.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in shipped.engine.stop_ids
    for structured, extra in (({"choice": ["<|im_end|>", "x"]}, {}),
                              ({"choice": ["yes", "a"]}, {"stop_token_ids": [shipped.tokenizer.convert_tokens_to_ids("a")]})):
        for temperature in (0.0, 1.0):
            p = SamplingParams(temperature=temperature, seed=0, max_tokens=16, decoding=decoding,
                               structured=structured, **extra)
            out = shipped.generate([chat(shipped, "What is 4 + 5?")], p)[0]
            assert out["finish_reason"] == "stop" and out["text"] in structured["choice"], out
            ids = out["token_ids"]
            assert len(ids) >= 2 and shipped.tokenizer.decode(ids[:-1]) == out["text"]


def test_a_grammar_that_accepts_nothing_is_refused_before_queueing(shipped):
    p = SamplingParams(temperature=0, max_tokens=8, structured={"regex": r"[^\s\S]"})
    before = shipped.engine.metrics()
    with pytest.raises(RequestError) as err:
        shipped.generate([chat(shipped, "What is 4 + 5?")], p)
    assert err.value.param == "structured.regex" and "accepts no answer" in str(err.value)
    assert shipped.engine.metrics() == before and not shipped.engine.seqs


def _pair_spelt_only_by_its_letters(tokenizer) -> tuple[str, str]:
    """Two different lowercase letters c1, c2, single tokens, while no token starts with c1 + c2: the
    text c1 + c2 is spelt only as c1 then c2."""
    vocab = tokenizer.get_vocab()
    letters = [c for c in "abcdefghijklmnopqrstuvwxyz" if c in vocab]
    for c1 in letters:
        for c2 in letters:
            if c1 != c2 and not any(t.startswith(c1 + c2) for t in vocab):
                return c1, c2
    raise AssertionError("every pair of letters starts a token")


@pytest.mark.parametrize("decoding", DECODERS)
def test_a_grammar_stuck_part_way_fails_its_request_alone(shipped, decoding):
    """Regex c1c2 with c2 a stop id: c1 is allowed (so the request is queued), after it only c2
    spells the rest and a stop token never spells grammar text, so the grammar allows nothing.
    That request fails with a message saying so; the unconstrained one beside it is unchanged
    and no KV block stays in use."""
    c1, c2 = _pair_spelt_only_by_its_letters(shipped.tokenizer)
    stuck = SamplingParams(temperature=0, max_tokens=8, decoding=decoding, structured={"regex": c1 + c2},
                           stop_token_ids=[shipped.tokenizer.convert_tokens_to_ids(c2)])
    plain = SamplingParams(temperature=0, max_tokens=8, decoding=decoding)
    prompt = chat(shipped, "What is 4 + 5?")
    alone = shipped.generate([prompt], plain)[0]
    out = shipped.generate([prompt, prompt], [stuck, plain])
    assert out[0]["finish_reason"] == "abort" and "allows no token" in out[0]["error"], out[0]
    assert out[1]["token_ids"] == alone["token_ids"] and out[1]["finish_reason"] == alone["finish_reason"]
    assert shipped.engine.block_manager.num_free == shipped.engine.block_manager.num_blocks
