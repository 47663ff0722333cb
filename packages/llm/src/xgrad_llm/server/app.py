"""The HTTP app: OpenAI-compatible routes over the engine, and the web chat page.

Routes: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, POST /v1/embeddings, POST /tokenize,
POST /detokenize, GET /health (503 while the model loads), GET /metrics (Prometheus text), GET / (the chat page)
and /static/* (its files, shipped in the package).

Starlette on uvicorn: a small, well-kept ASGI stack that parses HTTP for us, streams server-sent events, and tells
a streaming response when its client disconnects. Handlers stay on the event loop and never run the model: they
validate, hand a `Job` to the engine's worker thread and relay its events, so /health and /metrics answer while a
long generation runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import pathlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from xgrad_llm.generate import LLM, SamplingParams
from xgrad_llm.server import protocol as wire
from xgrad_llm.server.chat import chat_constraint, chat_prompt
from xgrad_llm.server.embed import Embedder
from xgrad_llm.server.engine import Engine, Event, Job
from xgrad_llm.server.metrics import render_metrics
from xgrad_llm.server.protocol import APIError
from xgrad_llm.server.tools import ChatStream, merge_deltas

STATIC = pathlib.Path(__file__).parent / "static"


@dataclass
class ServerConfig:
    """How the server runs (the `xgrad-llm serve` flags)."""

    model_name: str = "model"
    parallel: int = 1
    max_queue: int = 64
    timeout: float | None = 600.0  # seconds a request may take, queueing included
    api_key: str | None = None
    cors: list[str] = field(default_factory=list)
    max_body: int = 8 << 20  # bytes
    batch: bool = True  # run concurrent decodes of most slots as one batched forward (README: when it pays)
    presence_penalty: float = 0.0  # for requests that do not set it (--presence-penalty)
    frequency_penalty: float = 0.0  # for requests that do not set it (--frequency-penalty)
    warm: bool = False  # capture the engine's programs before /health says ready (`Engine.warm`; --warm)


class _State:
    """The model and engine once loaded (None while loading), or why loading failed."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.llm: LLM | None = None
        self.engine: Engine | None = None
        self.embedder: Embedder | None = None
        self.load_error: str | None = None
        self.mailbox: _Mailbox | None = None

    def mail(self) -> _Mailbox:
        """The event loop's mailbox (made on first use, in the loop that serves)."""
        loop = asyncio.get_running_loop()
        if self.mailbox is None or self.mailbox.loop is not loop:
            self.mailbox = _Mailbox(loop)
        return self.mailbox

    def ready(self, llm: LLM) -> None:
        c = self.config
        engine = Engine(llm, c.parallel, c.max_queue, c.timeout, batch=c.batch)
        if c.warm:
            engine.warm()
        engine.start()
        self.llm, self.engine = llm, engine
        self.embedder = Embedder(llm, engine.model_lock)

    def need(self) -> tuple[LLM, Engine]:
        if self.llm is None or self.engine is None:
            why = f": {self.load_error}" if self.load_error else "; retry in a moment"
            raise APIError(
                f"the model is not loaded{why}",
                status=503,
                type="server_error",
                code="model_loading",
                headers={"Retry-After": "2"},
            )
        return self.llm, self.engine


def _state(request: Request) -> _State:
    state: _State = request.app.state.xgrad
    return state


def _check_key(request: Request) -> None:
    key = _state(request).config.api_key
    if key is None:
        return
    got = request.headers.get("authorization", "")
    if not got.startswith("Bearer ") or not hmac.compare_digest(got[7:].encode(), key.encode()):
        raise APIError(
            "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the server's --api-key",
            status=401,
            type="authentication_error",
            code="invalid_api_key",
        )


async def _body(request: Request) -> dict[str, Any]:
    limit = _state(request).config.max_body
    declared = request.headers.get("content-length", "")
    too_big = APIError(
        f"the request body is larger than the limit of {limit} bytes", status=413, code="request_too_large"
    )
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_big
    return wire.parse_json(bytes(body))


def _api(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """An API route: the key checked, then the handler."""

    async def route(request: Request) -> Response:
        _check_key(request)
        return await handler(request)

    return route


# ---- generation ----
class _Mailbox:
    """Events from the worker thread to the event loop, with one wake-up for all that arrive before the loop takes
    them: a batched round emits an event per stream, and each `call_soon_threadsafe` writes to the loop's wake-up
    socket and queues a callback of its own."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: collections.deque[tuple[asyncio.Queue[Event | None], Event]] = collections.deque()
        self.lock = threading.Lock()
        self.scheduled = False
        self.wakeups = 0  # call_soon_threadsafe calls so far

    def post(self, queue: asyncio.Queue[Event | None], ev: Event) -> None:
        with self.lock:
            self.items.append((queue, ev))
            if self.scheduled:
                return
            self.scheduled = True
            self.wakeups += 1
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self.lock:
            items, self.items = self.items, collections.deque()
            self.scheduled = False
        for queue, ev in items:
            queue.put_nowait(ev)


class _Relay:
    """A job's events, handed from the worker thread to this request's event loop."""

    def __init__(self, mailbox: _Mailbox) -> None:
        self.mailbox = mailbox
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()

    def emit(self, ev: Event) -> None:
        self.mailbox.post(self.queue, ev)

    async def events(self, request: Request | None, job: Job, engine: Engine) -> AsyncIterator[Event]:
        """The events until the finish. With `request`, a client that disconnects ends them (a streamed response
        passes None: Starlette cancels it on a disconnect). Either way the job is cancelled unless it finished."""
        watcher = asyncio.create_task(self._watch(request)) if request is not None else None
        try:
            while True:
                ev = await self.queue.get()
                if ev is None:
                    return
                yield ev
                if ev.finish is not None:
                    return
        finally:
            if watcher is not None:
                watcher.cancel()
            job.cancel()  # no-op when it finished; else the slot is freed before its next step
            engine.wake()

    async def _watch(self, request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.queue.put_nowait(None)


def _job(relay: _Relay, prompt: list[int], s: wire.Sampling, max_context: int, config: ServerConfig) -> Job:
    if len(prompt) >= max_context:
        raise APIError(
            f"the prompt is {len(prompt)} tokens; this server's context is {max_context} tokens, which must also "
            "hold the reply: shorten the prompt",
            code="context_length_exceeded",
            param="messages",
        )
    room = max_context - len(prompt)
    params = SamplingParams(
        max_tokens=min(s.max_tokens or room, room),
        temperature=s.temperature,
        top_k=s.top_k,
        top_p=s.top_p,
        min_p=s.min_p,
        repetition_penalty=s.repeat_penalty,
        presence_penalty=config.presence_penalty if s.presence_penalty is None else s.presence_penalty,
        frequency_penalty=config.frequency_penalty if s.frequency_penalty is None else s.frequency_penalty,
        seed=s.seed,
        stop=s.stop,
    )
    return Job(
        prompt=prompt,
        params=params,
        emit=relay.emit,
        logprobs=s.logprobs,
        top_logprobs=s.top_logprobs,
    )


def _error_finish(ev: Event) -> APIError:
    if ev.error is not None:
        return ev.error
    if ev.finish == "timeout":
        return APIError("the request took longer than the server's --timeout", status=504, type="timeout_error")
    return APIError("the server is shutting down", status=503, type="server_error", code="shutting_down")


def _sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


async def _stream(
    request: Request,
    relay: _Relay,
    job: Job,
    engine: Engine,
    chunk: Callable[[Event, bool], list[dict[str, Any]]],
    tail: Callable[[Event], dict[str, Any] | None],
) -> AsyncIterator[bytes]:
    """SSE bytes: a chunk per event (`chunk(ev, first)`), `tail(last)` (the usage chunk, if asked), [DONE]."""
    first = True
    async for ev in relay.events(None, job, engine):
        if ev.finish in ("error", "timeout", "cancelled"):
            yield _sse(_error_finish(ev).body())
            break
        for c in chunk(ev, first):
            yield _sse(c)
        first = False
        if ev.finish is not None and (t := tail(ev)) is not None:
            yield _sse(t)
    yield b"data: [DONE]\n\n"


async def chat_completions(request: Request) -> Response:
    state = _state(request)
    llm, engine = state.need()
    data = await _body(request)
    max_context = llm.runner.max_context
    req = wire.parse_chat(data, max_context)
    try:
        prompt, thinking = await anyio.to_thread.run_sync(chat_prompt, llm, req)
    except APIError:
        raise
    except Exception as e:  # the template refused the conversation
        raise APIError(f"the chat template could not render these messages: {e}", param="messages") from e
    relay = _Relay(state.mail())
    job = _job(relay, prompt, req.sampling, max_context, state.config)
    job.constraint = await anyio.to_thread.run_sync(chat_constraint, llm, req)  # the first builds a token table
    parser = ChatStream(tools=bool(req.tools) and req.tool_choice != "none", thinking=thinking)
    rid, created, model = wire.new_id("chatcmpl"), wire.now(), state.config.model_name
    s = req.sampling
    engine.submit(job)

    def finish_reason(ev: Event) -> str:
        return "tool_calls" if parser.calls else ("length" if ev.finish == "length" else "stop")

    if s.stream:

        def base(choices: list[dict[str, Any]]) -> dict[str, Any]:
            obj: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": "xgrad",
                "choices": choices,
            }
            if s.include_usage:
                obj["usage"] = None
            return obj

        def chunk(ev: Event, first: bool) -> list[dict[str, Any]]:
            deltas = ([{"role": "assistant", "content": ""}] if first else []) + parser.push(ev.text)
            if ev.finish is not None:
                deltas += parser.finish()
            out = []
            lp = {"content": ev.logprobs} if s.logprobs else None
            for i, d in enumerate(deltas):
                out.append(base([{"index": 0, "delta": d, "logprobs": lp if i == 0 else None, "finish_reason": None}]))
                lp = None if i == 0 else lp
            if lp is not None and ev.logprobs:  # logprobs of tokens whose text is still held back
                out.append(base([{"index": 0, "delta": {}, "logprobs": lp, "finish_reason": None}]))
            if ev.finish is not None:
                out.append(base([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason(ev)}]))
            return out

        def tail(ev: Event) -> dict[str, Any] | None:
            if not s.include_usage:
                return None
            obj = base([])
            obj["usage"] = wire.usage(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens)
            return obj

        return StreamingResponse(
            _stream(request, relay, job, engine, chunk, tail),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    deltas: list[dict[str, Any]] = []
    logprobs: list[dict[str, Any]] = []
    last: Event | None = None
    async for ev in relay.events(request, job, engine):
        if ev.finish in ("error", "timeout", "cancelled"):
            raise _error_finish(ev)
        deltas += parser.push(ev.text)
        logprobs += ev.logprobs
        last = ev
    if last is None:  # the client left
        return Response(status_code=499)
    deltas += parser.finish()
    return JSONResponse(
        {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "system_fingerprint": "xgrad",
            "choices": [
                {
                    "index": 0,
                    "message": merge_deltas(deltas),
                    "logprobs": {"content": logprobs} if s.logprobs else None,
                    "finish_reason": finish_reason(last),
                }
            ],
            "usage": wire.usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens),
        }
    )


def _legacy_logprobs(entries: list[dict[str, Any]], offset: int) -> dict[str, Any]:
    """The completions API's logprobs object (tokens, token_logprobs, top_logprobs, text_offset)."""
    offsets, pos = [], offset
    for e in entries:
        offsets.append(pos)
        pos += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }


async def completions(request: Request) -> Response:
    state = _state(request)
    llm, engine = state.need()
    data = await _body(request)
    max_context = llm.runner.max_context
    req = wire.parse_completion(data, max_context, llm.model.cfg.vocab_size)
    prompt = req.prompt if isinstance(req.prompt, list) else await anyio.to_thread.run_sync(llm.encode, req.prompt)
    prompt_text = req.prompt if isinstance(req.prompt, str) else llm.decode(req.prompt)
    relay = _Relay(state.mail())
    job = _job(relay, prompt, req.sampling, max_context, state.config)
    s = req.sampling
    rid, created, model = wire.new_id("cmpl"), wire.now(), state.config.model_name
    engine.submit(job)
    echo = prompt_text if req.echo else ""
    sent = [len(echo)]

    def choice(text: str, ev: Event, finish: str | None) -> dict[str, Any]:
        lp = _legacy_logprobs(ev.logprobs, sent[0]) if s.logprobs else None
        return {"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}

    if s.stream:

        def chunk(ev: Event, first: bool) -> list[dict[str, Any]]:
            text = (echo if first else "") + ev.text
            finish = None if ev.finish is None else ("length" if ev.finish == "length" else "stop")
            c = choice(text, ev, finish)
            sent[0] += len(ev.text)
            return [{"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [c]}]

        def tail(ev: Event) -> dict[str, Any] | None:
            if not s.include_usage:
                return None
            return {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": [],
                "usage": wire.usage(ev.prompt_tokens, ev.completion_tokens, ev.cached_tokens),
            }

        return StreamingResponse(_stream(request, relay, job, engine, chunk, tail), media_type="text/event-stream")

    text, entries, last = echo, [], None
    async for ev in relay.events(request, job, engine):
        if ev.finish in ("error", "timeout", "cancelled"):
            raise _error_finish(ev)
        text += ev.text
        entries += ev.logprobs
        last = ev
    if last is None:
        return Response(status_code=499)
    whole = Event(logprobs=entries)
    return JSONResponse(
        {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": "xgrad",
            "choices": [choice(text, whole, "length" if last.finish == "length" else "stop")],
            "usage": wire.usage(last.prompt_tokens, last.completion_tokens, last.cached_tokens),
        }
    )


# ---- the rest of the API ----
async def models(request: Request) -> Response:
    state = _state(request)
    llm, _ = state.need()
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": state.config.model_name,
                    "object": "model",
                    "created": wire.now(),
                    "owned_by": "xgrad",
                    "meta": {
                        "n_ctx": llm.runner.max_context,
                        "n_vocab": llm.model.cfg.vocab_size,
                        "arch": llm.model.cfg.arch,
                    },
                }
            ],
        }
    )


async def embeddings(request: Request) -> Response:
    state = _state(request)
    llm, _ = state.need()
    data = await _body(request)
    inputs = wire.parse_embeddings(data)
    assert state.embedder is not None
    max_context = llm.runner.max_context
    vocab = llm.model.cfg.vocab_size
    ids = [x if isinstance(x, list) else llm.encode(x) for x in inputs]
    for i, x in enumerate(ids):
        if not x:
            raise APIError(f"input {i} has no tokens", param="input")
        if len(x) > max_context:
            raise APIError(
                f"input {i} is {len(x)} tokens, more than the context of {max_context}",
                code="context_length_exceeded",
                param="input",
            )
        if bad := [t for t in x if not 0 <= t < vocab]:
            raise APIError(f"input {i} has token ids {bad[:5]} outside the vocabulary of {vocab}", param="input")
    vectors = await anyio.to_thread.run_sync(state.embedder.embed_many, ids)
    total = sum(len(x) for x in ids)
    return JSONResponse(
        {
            "object": "list",
            "model": state.config.model_name,
            "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)],
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }
    )


async def tokenize(request: Request) -> Response:
    llm, _ = _state(request).need()
    content, add_special = wire.parse_tokenize(await _body(request))
    ids = await anyio.to_thread.run_sync(lambda: llm.encode(content, add_bos=None if add_special else False))
    return JSONResponse({"tokens": ids})


async def detokenize(request: Request) -> Response:
    llm, _ = _state(request).need()
    ids = wire.parse_detokenize(await _body(request), llm.model.cfg.vocab_size)
    return JSONResponse({"content": llm.decode(ids)})


async def health(request: Request) -> Response:
    state = _state(request)
    if state.engine is None:
        status = "error" if state.load_error else "loading"
        return JSONResponse({"status": status, "error": state.load_error}, status_code=503)
    e = state.engine
    return JSONResponse({"status": "ok", "slots_idle": len(e.slots) - e.busy_slots(), "slots_busy": e.busy_slots()})


async def metrics(request: Request) -> Response:
    _check_key(request)
    state = _state(request)
    text = render_metrics(state.engine) if state.engine is not None else "# the model is loading\n"
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


async def index(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


# ---- errors ----
async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
    err = APIError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code, type=kind)
    return JSONResponse(err.body(), status_code=exc.status_code, headers=dict(exc.headers or {}))


async def _server_error(request: Request, exc: Exception) -> Response:
    err = APIError(f"internal error: {type(exc).__name__}: {exc}", status=500, type="server_error")
    return JSONResponse(err.body(), status_code=500)


def create_app(config: ServerConfig, llm: LLM | None = None, loader: Callable[[], LLM] | None = None) -> Starlette:
    """The ASGI app. Give a loaded `llm`, or a `loader` that loads one in a thread at startup (/health says 503
    until it is done)."""
    state = _State(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if llm is not None:
            state.ready(llm)
        elif loader is not None:

            def load() -> None:
                try:
                    state.ready(loader())
                except Exception as e:  # shown by /health and every request
                    state.load_error = f"{type(e).__name__}: {e}"

            threading.Thread(target=load, name="xgrad-llm-load", daemon=True).start()
        try:
            yield
        finally:
            if state.engine is not None:
                state.engine.stop()

    routes = [
        Route("/", index),
        Route("/health", health),
        Route("/metrics", metrics),
        Route("/v1/models", _api(models)),
        Route("/v1/chat/completions", _api(chat_completions), methods=["POST"]),
        Route("/v1/completions", _api(completions), methods=["POST"]),
        Route("/v1/embeddings", _api(embeddings), methods=["POST"]),
        Route("/tokenize", _api(tokenize), methods=["POST"]),
        Route("/detokenize", _api(detokenize), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = []
    if config.cors:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=config.cors,
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["Authorization", "Content-Type"],
            )
        )
    app = Starlette(
        routes=routes,
        middleware=middleware,
        lifespan=lifespan,
        exception_handlers={APIError: _api_error, HTTPException: _http_error, Exception: _server_error},
    )
    app.state.xgrad = state
    return app
