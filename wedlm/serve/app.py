"""FastAPI app: OpenAI-compatible completions and chat (streamed or not), models,
health, Prometheus metrics, and the web chat at `/`.

`create_app(llm, model_name)` wraps one `wedlm.LLM`; its `EngineLoop` thread starts and
stops with the app (lifespan), and every request becomes engine requests in that one
continuous batch. Streaming is native: each engine step's committed tokens for a
request become one SSE chunk, so a chunk is exactly what one decode step committed
(the web chat colours text by it; `wedlm_trace: true` adds the step index and token
ids to each chunk). A client that disconnects aborts its requests, which frees their
KV blocks. Bad input is a 400 with an OpenAI error body naming the field.

`/v1/completions` sends the prompt to the model as raw text, as OpenAI's endpoint does,
even for a model trained on chat-formatted prompts only (generation_config.json's
`wedlm_chat_only`; such a model may answer a raw prompt with nothing): chat-formatted
requests go to `/v1/chat/completions`. `/v1/models` reports the model folder's
`wedlm_single_turn` and `wedlm_chat_only` under `wedlm`; the web chat reads `wedlm_single_turn` and then
sends only the current question each turn (the API itself sends what the client sends).

No request body can crash the server or stall other clients (`limits.py`): bodies are
parsed and checked off the event loop, prompts that cannot fit are refused from their
length before tokenizing, tokenizing and chat templates run on one worker thread (the
private tokenizer is not re-entrant), and prompts x `n` per request and the sequences
held at once are capped (400 / 429). `security.py` adds the API key, the Host check,
CORS, and the JSON content type the POST routes require.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..engine.defaults import DECODERS, DEFAULTS, model_prompt_defaults
from . import logprobs as lp
from . import protocol
from .engine_loop import EngineLoop
from .errors import APIError, bad_request, error_body, server_error
from .limits import Admission, PromptBound, ServeLimits, Ticket, parse_json_body
from .metrics import CONTENT_TYPE, ServerMetrics
from .prompts import PromptBuilder, private_tokenizer, refusal, sampling_params
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingFields, param_of
from .security import AccessPolicy, install_access_control, require_json
from .streams import RequestGroup, abort_on_disconnect

log = logging.getLogger(__name__)
STATIC_DIR = Path(__file__).resolve().parent / "static"


class Server:
    """Everything the routes share: the engine loop, metrics, prompt builder, limits."""

    def __init__(self, llm: Any, model_name: str, sampling_params_cls: Any = None,
                 limits: ServeLimits | None = None):
        self.llm = llm
        self.model_name = model_name
        self.created = int(time.time())
        if sampling_params_cls is None:
            from wedlm import SamplingParams as sampling_params_cls
        self.sampling_params_cls = sampling_params_cls
        self.engine = EngineLoop(llm, on_finished=lambda delta: self.metrics.observe_finished(delta))
        self.metrics = ServerMetrics(lambda: self.engine.snapshot)
        self.prompts = PromptBuilder(private_tokenizer(llm.tokenizer), llm.max_model_len)
        self.token_strings = lp.TokenStrings(private_tokenizer(llm.tokenizer))  # its own: read on the event loop
        self.prompting = prompting(llm)
        self.bound = PromptBound(self.prompts.tokenizer, llm.max_model_len)
        self.admission = Admission(limits or ServeLimits())
        # The one thread that uses the private tokenizer (tokenizing, chat templates, echo).
        self.tokenizer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wedlm-tokenizer")

    # ----- request handling -----
    async def handle(self, request: Request, chat: bool) -> Response:
        """Parse, validate, submit, then stream or collect one API request."""
        endpoint = "chat" if chat else "completions"
        ticket = None
        try:
            require_json(request)
            raw = await request.body()
            req = await asyncio.to_thread(parse_body, raw, ChatCompletionRequest if chat else CompletionRequest)
            self.check_model(req.model)
            ticket = self.admit(req, chat)
            env = protocol.Envelope(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}",
                                    self.model_name, chat)
            try:  # the server's checks and the engine's raise the same RequestError(param)
                prompts, echo = await self.tokenized(lambda: self.encode(req, chat))
                params = [[sampling_params(self.sampling_params_cls, req, self.prompts.max_tokens(req, len(ids)),
                                           choice) for choice in range(req.n)] for ids in prompts]
                group = await self.submit(env.id, prompts, params)
            except ValueError as err:
                raise refusal(err, req) from err
        except APIError as err:
            if ticket is not None:
                ticket.release()
            self.metrics.observe_request(endpoint, err.status)
            return err.response()
        except BaseException:
            if ticket is not None:
                ticket.release()
            raise
        lengths = [len(ids) for ids in prompts]
        if req.stream:
            self.metrics.observe_request(endpoint, 200)
            return EngineStream(self.events(group, env, req, echo), group, ticket)
        try:
            response = await self.collect(request, group, env, req, lengths, echo)
        finally:
            ticket.release()
        self.metrics.observe_request(endpoint, response.status_code)
        return response

    def admit(self, req: SamplingFields, chat: bool) -> Ticket:
        """The cheap refusals before tokenizing: prompts x n, the prompts' size, then the
        server's queue (a held `Ticket` for the request's sequences).

        Raises:
            APIError: 400 naming the field and the limit, 429 when the server is full.
        """
        prompts = [None] if chat else req.prompts()
        self.admission.check_request(len(prompts), req.n)
        if chat:
            self.bound.check_count("messages", len(req.messages), "messages")
            self.bound.check_text("messages", sum(len(m.text()) for m in req.messages), "the messages' content")
        for prompt in prompts:
            if isinstance(prompt, str):
                self.bound.check_text("prompt", len(prompt), "a prompt")
            elif prompt is not None:
                self.bound.check_count("prompt", len(prompt), "prompt token ids")
        return self.admission.reserve(len(prompts) * req.n)

    def encode(self, req: SamplingFields, chat: bool) -> tuple[list[list[int]], list[str] | None]:
        """(token ids of each prompt, their text for `echo` or None); on the tokenizer thread.

        Raises:
            RequestError: a prompt or a message the engine's checks refuse (naming the field).
        """
        prompts = [self.prompts.chat_prompt(req)] if chat else self.prompts.completion_prompts(req)
        # not getattr: bodies keep unknown fields as attributes, and `echo` in a chat body is one
        echo = [self.prompts.decode(ids) for ids in prompts] if not chat and req.echo else None
        return prompts, echo

    async def tokenized(self, work: Callable[[], Any]) -> Any:
        """`work()` on the tokenizer thread, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_thread, work)

    def check_model(self, model: str | None) -> None:
        """404 (code `model_not_found`, as OpenAI's API and vLLM answer) unless `model` is unset or
        the served model's name."""
        if model is not None and model != self.model_name:
            raise APIError(f"The model '{model}' does not exist; this server serves '{self.model_name}'",
                           param="model", status=404, code="model_not_found")

    async def submit(self, base_id: str, prompts: list[list[int]], params: list[list[Any]]) -> RequestGroup:
        """One engine request per (prompt, choice), `params[prompt][choice]`.

        Raises:
            ValueError: the engine refused one (a `RequestError` naming the field); the
                submitted ones are aborted.
        """
        group = RequestGroup(self.engine, base_id)
        try:
            await group.submit([(ids, param) for ids, per_choice in zip(prompts, params) for param in per_choice])
        except BaseException:
            group.close()
            raise
        return group

    async def collect(self, request: Request, group: RequestGroup, env: protocol.Envelope, req: SamplingFields,
                      lengths: list[int], echo: list[str] | None) -> JSONResponse:
        """Wait for every choice; abort them if the client goes away meanwhile."""
        states = [protocol.ChoiceState() for _ in group.choices]
        watcher = asyncio.create_task(abort_on_disconnect(request, group))
        stops = lp.stop_ids(self.llm, req)
        try:
            async for index, delta in group:
                failure = delta_failure(delta)
                if failure:
                    raise server_error(failure)
                states[index].add(delta, stops)
        except APIError as err:
            return err.response()
        finally:
            watcher.cancel()
            group.close()
        if echo:
            per_prompt = len(states) // len(echo)
            for i, state in enumerate(states):
                state.text = echo[i // per_prompt] + state.text
        logprobs = None
        if lp.wanted(req):
            source = lp.distribution(self.llm, req)
            logprobs = [{**lp.choice_logprobs(env.chat, state, self.token_strings, choice.prompt_ids if echo else None),
                         "distribution": source} for state, choice in zip(states, group.choices)]
        return JSONResponse(protocol.full_response(env, states, protocol.usage(lengths, states), logprobs))

    async def events(self, group: RequestGroup, env: protocol.Envelope, req: SamplingFields,
                     echo: list[str] | None) -> AsyncIterator[str]:
        """SSE events of a streamed response; closing early aborts the engine requests."""
        states = [protocol.ChoiceState() for _ in group.choices]
        with_usage = req.include_usage()
        lengths = [len(choice.prompt_ids) for choice in group.choices[::req.n]]
        logprobs, stops, source = lp.wanted(req), lp.stop_ids(self.llm, req), lp.distribution(self.llm, req)
        held: set[int] = set()  # echo chunks that wait for their prompt logprobs (the first delta)
        try:
            for choice in group.choices:
                first = None
                if echo:
                    first = echo[choice.index // req.n]
                if first and logprobs:
                    held.add(choice.index)
                elif env.chat or first:
                    yield protocol.sse(protocol.chunk(
                        env, [protocol.stream_choice(env, choice.index, text=first or "", role=env.chat)],
                        with_usage))
            async for index, delta in group:
                failure = delta_failure(delta)
                if failure:
                    yield protocol.sse(error_body(failure, type="server_error"))
                    break
                states[index].add(delta, stops)
                if index in held:
                    held.discard(index)
                    body = {**lp.echo_logprobs(states[index], group.choices[index].prompt_ids, self.token_strings),
                            "distribution": "ar_head"}  # prompt logprobs: one teacher-forced forward
                    yield protocol.sse(protocol.chunk(
                        env, [protocol.stream_choice(env, index, text=echo[index // req.n], logprobs=body)],
                        with_usage))
                tokens_lp = (lp.delta_logprobs(env.chat, states[index], delta, self.token_strings, stops)
                             if logprobs else None)
                if tokens_lp is not None:
                    tokens_lp["distribution"] = source
                for event in self.delta_events(env, index, delta, req, with_usage, tokens_lp):
                    yield event
            else:
                if with_usage:
                    yield protocol.sse(protocol.chunk(env, [], True, protocol.usage(lengths, states)))
            yield protocol.DONE
        finally:
            group.close()

    @staticmethod
    def delta_events(env: protocol.Envelope, index: int, delta: Any, req: SamplingFields,
                     with_usage: bool, logprobs: dict | None = None) -> list[str]:
        """The chunk for one engine delta (what one decode step committed, with its tokens' `logprobs`),
        then the finish chunk."""
        out = []
        trace = protocol.trace_of(delta) if req.wedlm_trace else None
        if delta.new_text or (trace and delta.new_token_ids) or logprobs:
            out.append(protocol.sse(protocol.chunk(
                env, [protocol.stream_choice(env, index, text=delta.new_text, trace=trace, logprobs=logprobs)],
                with_usage)))
        if delta.finished:
            text = None if env.chat else ""
            out.append(protocol.sse(protocol.chunk(
                env, [protocol.stream_choice(env, index, text=text, finish_reason=delta.finish_reason)],
                with_usage)))
        return out

    # ----- other endpoints -----
    def models(self) -> dict[str, Any]:
        """`GET /v1/models`: a list holding the served model's card."""
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self, model_id: str | None = None) -> dict[str, Any]:
        """The served model's card (`GET /v1/models/{model_id}` when `model_id` is given).

        Raises:
            APIError: 404 (code `model_not_found`, param `model`) when `model_id` is not the
                served model's name (`check_model`).
        """
        self.check_model(model_id)
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "wedlm",
                "root": str(getattr(self.llm, "model_path", self.model_name)),
                "max_model_len": self.prompts.max_model_len,
                "wedlm": {"decoders": list(DECODERS), **decoding_defaults(self.llm), **self.prompting}}

    def health(self) -> JSONResponse:
        """`GET /health`: 200 while the engine loop runs, else 503."""
        ok = self.engine.alive
        body = {"status": "ok" if ok else "engine stopped", "model": self.model_name,
                "running": self.engine.num_active(), "last_error": self.engine.last_error}
        return JSONResponse(body, status_code=200 if ok else 503)


class EngineStream(StreamingResponse):
    """An SSE response that aborts its engine requests however it ends.

    The events generator closes the group itself, but a client that is gone before the
    first byte means the generator never starts; closing here covers that case too.
    """

    def __init__(self, events: AsyncIterator[str], group: RequestGroup, ticket: Ticket):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.group = group
        self.ticket = ticket

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.group.close()
            self.ticket.release()


def decoding_defaults(llm: Any) -> dict[str, Any]:
    """The engine's W, tau and lambda for requests that set none (`LLM.decoding_defaults`;
    `engine/defaults.py`'s values for an engine without it)."""
    defaults = getattr(llm, "decoding_defaults", None)
    if isinstance(defaults, dict):
        return dict(defaults)
    return dict(DEFAULTS)


def prompting(llm: Any) -> dict[str, bool]:
    """{"wedlm_single_turn", "wedlm_chat_only"} of the engine's model folder (generation_config.json's
    keys of the same names; false for an engine without a folder).

    Raises:
        ValueError: a bad value in generation_config.json, naming file and key.
    """
    path = getattr(llm, "model_path", None)
    if not isinstance(path, str) or not Path(path).is_dir():
        return {"wedlm_single_turn": False, "wedlm_chat_only": False}
    d = model_prompt_defaults(path)
    return {key: d[key] for key in ("wedlm_single_turn", "wedlm_chat_only")}


def delta_failure(delta: Any) -> str | None:
    """An error message when the delta ends its request in failure (engine error or abort)."""
    if delta.error:
        return delta.error
    if delta.finished and delta.finish_reason == "abort":
        return f"the request ended early ({delta.finish_reason})"
    return None


def parse_body(raw: bytes, schema: type[SamplingFields]) -> SamplingFields:
    """JSON body -> request model; 400 naming the field on any problem (`parse_json_body`
    first: no value that no field may hold reaches pydantic)."""
    body = parse_json_body(raw)
    try:
        return schema.model_validate(body)
    except ValidationError as err:
        param, message = param_of(err)
        raise bad_request(param, message) from err


def install_error_handlers(app: FastAPI) -> None:
    """OpenAI-style bodies for API errors, unknown routes, wrong methods and crashes."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError) -> JSONResponse:
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if err.status_code < 500 else "server_error"
        return JSONResponse(error_body(str(err.detail), kind), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def _crash(request: Request, err: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(error_body(f"{type(err).__name__}: {err}", "server_error"), status_code=500)


def create_app(llm: Any, model_name: str | None = None, sampling_params_cls: Any = None,
               access: AccessPolicy | None = None, limits: ServeLimits | None = None) -> FastAPI:
    """The server for `llm` (a `wedlm.LLM`), announcing it as `model_name`.

    Args:
        llm: the engine; the app's engine thread becomes its only user.
        model_name: the `model` clients must send (default: the model folder's name).
        sampling_params_cls: `SamplingParams` factory (default `wedlm.SamplingParams`).
        access: API key, allowed Host names, CORS origins (default: none of them;
            `wedlm serve` builds one from its bind address and flags).
        limits: sequences per request and held at once (default `ServeLimits()`).
    """
    name = model_name or Path(str(getattr(llm, "model_path", "wedlm"))).name
    server = Server(llm, name, sampling_params_cls, limits)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        server.engine.start()
        yield
        server.engine.stop()
        server.tokenizer_thread.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="wedlm", summary="OpenAI-compatible WeDLM server", lifespan=lifespan)
    app.state.server = server
    install_error_handlers(app)
    install_access_control(app, access or AccessPolicy())
    add_routes(app, server)
    return app


def add_routes(app: FastAPI, server: Server) -> None:
    """Register every endpoint on `app`."""

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await server.handle(request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await server.handle(request, chat=True)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return server.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        return server.model_card(model_id)

    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' and curl -I's probe
    async def health() -> JSONResponse:
        return server.health()

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
