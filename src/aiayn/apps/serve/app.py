"""The HTTP API of `aiayn serve` (FastAPI): translation with dynamic batching, health,
model information, metrics, and the attention explorer's page.

    POST /v1/translate  {"text": "A house." | ["...", ...], "beam": 4, "alpha": 0.6,
                         "attention": false}
        -> {"translations": [{"translation": "Una casa."}, ...], "beam": 4, "alpha": 0.6}
           with "attention": true, each item also carries "attention": the explorer's
           `attention_payload` for that sentence (501 while aiayn.apps.explorer is missing)
    GET /health         200 while the process runs
    GET /ready          200 once the inference thread runs, 503 while starting or stopping
    GET /info           the model, its shape, languages, parameters, decoding defaults, limits
    GET /metrics        Prometheus text (see aiayn.apps.serve.metrics)
    GET /docs           the OpenAPI page FastAPI writes
    GET /               the explorer (aiayn.apps.explorer.STATIC_DIR), when installed

Every error is JSON, {"error": "what went wrong", "status": 4xx}, validation errors
with their "details": 400 for a body that is not UTF-8 (UTF-16 and UTF-32 included);
408 for a body not received within `body_timeout_s`; 413 for a body, request or
sentence count over the limits, or attention maps that could exceed
`max_response_bytes`; 422 for a malformed body (bad JSON, a wrong type, an unknown
field, beam 0, a lone surrogate in a sentence); 429 with Retry-After when the queue is
full; 499 (logged only) when the client went away before its answer or before sending
its whole body; 500 for a decoding that failed (that request's, or its batch's or
table's, only); 501 for attention without the explorer; 503 while stopping, when the
inference thread has stopped, or when the continuous engine's table for the request's
options cannot be made; 504 when the request's deadline passed. A connection whose
request headers do not arrive within `header_timeout_s` is closed
(`aiayn.apps.serve.protocol`).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from aiayn.apps.serve.batcher import (
    Batcher,
    ContinuousBatcher,
    DeadlineExceeded,
    QueueFull,
    Sentence,
    Stopped,
    Ticket,
    Unservable,
)
from aiayn.apps.serve.engine import (
    ContinuousEngine,
    Options,
    TranslationEngine,
    corpus_heads,
    model_info,
)
from aiayn.apps.serve.metrics import CONTENT_TYPE, ServerMetrics
from aiayn.apps.serve.settings import ServeConfig
from aiayn.apps.translate import Translator
from aiayn.inference.search import DecodeConfig, max_output_lengths

log = logging.getLogger(__name__)

TRANSLATE_PATH = "/v1/translate"
CLIENT_CLOSED = 499  # nginx's status for a client that left before its answer
RETRY_AFTER_S = 1


class TranslateRequest(BaseModel):
    """One or more sentences, decoded with one beam and length penalty."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | list[str] = Field(description="A sentence, or a list of sentences.")
    beam: int | None = Field(None, ge=1, description="Beam width, 1 = greedy (model default).")
    alpha: float | None = Field(None, ge=0, description="Length-penalty exponent.")
    attention: bool = Field(False, description="Also return each sentence's attention maps.")


class Translated(BaseModel):
    translation: str
    attention: dict[str, Any] | None = None


class TranslateResponse(BaseModel):
    translations: list[Translated]
    beam: int
    alpha: float


def create_app(translator: Translator, settings: ServeConfig, source: Path) -> FastAPI:
    """The server for `translator` (loaded from `source`), not yet started.

    The inference thread starts with the app's lifespan and, on shutdown, decodes
    what is queued before it stops.
    """
    metrics = ServerMetrics(queue_depth=lambda: batcher.depth())
    batcher: Batcher
    if settings.continuous:  # sentences join and leave a table of slots at every step
        engine: TranslationEngine = ContinuousEngine(
            translator, settings.threads, corpus_heads(source), settings.continuous,
            settings.compile, max_slots=settings.max_beam,
        )  # fmt: skip
        batcher = ContinuousBatcher(
            engine, settings.batch_limits(), on_batch=metrics.batch, on_start=engine.start_thread
        )
    else:
        engine = TranslationEngine(translator, settings.threads, corpus_heads(source))
        batcher = Batcher(
            engine.run_batch,
            settings.batch_limits(),
            on_batch=metrics.batch,
            on_start=engine.start_thread,
        )
    info = {**model_info(translator, source), "limits": _limits(settings)}

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        log.info("serving %s", source)
        yield
        await asyncio.to_thread(batcher.close)

    app = FastAPI(
        title="aiayn",
        summary="Translation with dynamic batching.",
        lifespan=lifespan,
    )
    app.state.settings, app.state.batcher = settings, batcher  # for run_server
    app.add_middleware(
        _Guard,
        metrics=metrics,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
    )
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected_error)

    @app.post(TRANSLATE_PATH, response_model=TranslateResponse, response_model_exclude_none=True)
    async def translate(body: TranslateRequest, request: Request) -> dict[str, Any]:
        """Translate one sentence or a list (batched with other requests' sentences)."""
        deadline = time.monotonic() + settings.deadline_s
        texts = [body.text] if isinstance(body.text, str) else body.text
        _check_limits(texts, body, settings)
        if body.attention and engine.attention_payload is None:
            raise HTTPException(
                501, "attention maps need aiayn.apps.explorer, which is not installed"
            )
        given = {"beam": body.beam, "alpha": body.alpha}
        try:
            decode = translator.decode_config(**{k: v for k, v in given.items() if v is not None})
        except ValueError as err:
            raise HTTPException(422, str(err)) from None
        ids = translator.encode(texts)  # the only tokenizing: the batch searches these ids
        tokens = sum(len(row) for row in ids)
        if tokens > settings.max_request_tokens:
            raise HTTPException(
                413, f"the request has {tokens} source tokens; at most "
                f"{settings.max_request_tokens} are taken (max_request_tokens)",
            )  # fmt: skip
        if body.attention:
            _check_attention_size(translator, ids, decode, settings.max_response_bytes)
        sentences = [Sentence(text, row) for text, row in zip(texts, ids, strict=True)]
        try:
            ticket = batcher.submit(sentences, Options(decode, body.attention), deadline)
        except QueueFull as err:
            raise HTTPException(429, f"busy: {err}", {"Retry-After": str(RETRY_AFTER_S)}) from None
        except Stopped as err:
            raise HTTPException(503, str(err)) from None
        results = await _answer(ticket, request, deadline, settings.deadline_s)
        return {"translations": results, "beam": decode.beam, "alpha": decode.alpha}

    @app.get("/health")
    async def health() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """The inference thread runs and takes work."""
        if batcher.failure is not None:
            error = f"the inference thread stopped: {type(batcher.failure).__name__}"
            return JSONResponse({"status": "not ready", "error": error}, status_code=503)
        if not batcher.running:
            return JSONResponse({"status": "not ready", "error": "not serving"}, status_code=503)
        return JSONResponse({"status": "ready", "queue_depth": batcher.depth()})

    @app.get("/info")
    async def model() -> dict[str, Any]:
        """The model, its shape, languages, parameters, decoding defaults and limits."""
        return {**info, "attention": engine.attention_payload is not None}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> PlainTextResponse:
        """Requests by status, batch sizes, queue depth, latency (Prometheus text)."""
        return PlainTextResponse(metrics.exposition(), media_type=CONTENT_TYPE)

    _mount_explorer(app)
    return app


def _limits(settings: ServeConfig) -> dict[str, Any]:
    names = ["max_chars", "max_sentences", "max_request_tokens", "max_beam", "deadline_s"]
    return {name: getattr(settings, name) for name in names}


def _check_limits(texts: list[str], body: TranslateRequest, settings: ServeConfig) -> None:
    if not texts:
        raise HTTPException(422, "text: give at least one sentence")
    for number, text in enumerate(texts, 1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:  # an unpaired JSON escape: no tokenizer takes it
            which = f" (sentence {number})" if isinstance(body.text, list) else ""
            raise HTTPException(
                422, f"text{which}: a lone surrogate (U+{ord(text[err.start]):04X}) at character "
                f"{err.start + 1} is not Unicode text; pair it or leave it out",
            ) from None  # fmt: skip
    if len(texts) > settings.max_sentences:
        raise HTTPException(
            413, f"text: {len(texts)} sentences; at most {settings.max_sentences} are taken "
            "(max_sentences)",
        )  # fmt: skip
    chars = sum(len(t) for t in texts)
    if chars > settings.max_chars:
        raise HTTPException(
            413, f"text: {chars} characters; at most {settings.max_chars} are taken (max_chars)"
        )
    if body.attention and not all(t.strip() for t in texts):
        raise HTTPException(422, "text: attention maps need sentences that are not blank")
    if body.beam is not None and body.beam > settings.max_beam:
        raise HTTPException(422, f"beam: {body.beam} is wider than max_beam={settings.max_beam}")


def attention_bytes(translator: Translator, ids: list[list[int]], decode: DecodeConfig) -> int:
    """The most bytes the attention maps of sentences `ids` can take in an answer.

    Each sentence of S source tokens (eos included) gets at most T = its longest
    translation + 1 decoder positions (bos first), and its maps hold encoder (S x S),
    decoder (T x T) and cross (T x S) weights per layer and head, each written with
    `DIGITS` decimals and a comma ("0.125,"); the rest of the payload (tokens, per-head
    metrics, the logit lens) is counted as 4 more weights per position and head.
    """
    from aiayn.apps.explorer import DIGITS

    cfg = translator.model.cfg
    heads, encoder, decoder = cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers
    source = torch.tensor([len(row) for row in ids])  # (B,)
    longest = max_output_lengths(source, decode.extra_len, cfg.max_len, decode.max_output_len)
    target = longest + 1
    weights = heads * (
        encoder * source**2 + decoder * (target**2 + target * source) + 4 * (source + target)
    )  # (B,)
    return int(weights.sum()) * (DIGITS + 3)


def _check_attention_size(
    translator: Translator, ids: list[list[int]], decode: DecodeConfig, limit: int
) -> None:
    size = attention_bytes(translator, ids, decode)
    if size > limit:
        raise HTTPException(
            413, f"attention maps of these {len(ids)} sentences could take {size:,} bytes; "
            f"answers hold at most {limit:,} (max_response_bytes): ask for attention on "
            "fewer or shorter sentences",
        )  # fmt: skip


async def _answer(ticket: Ticket, request: Request, deadline: float, budget: float) -> list:
    """The ticket's results; 504 once the deadline passes, 499 if the client leaves.

    Either way the ticket is cancelled, so its sentences not yet decoded are dropped.
    """
    waiting = asyncio.wrap_future(ticket.future)
    gone = asyncio.ensure_future(_disconnect(request))
    try:
        timeout = max(deadline - time.monotonic(), 0)
        await asyncio.wait({waiting, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if waiting.done():
        try:
            return waiting.result()
        except DeadlineExceeded:
            pass  # answered below
        except Unservable as err:
            raise HTTPException(
                503, f"these decoding options cannot be served now ({err}); ask for a "
                "narrower beam, or retry later",
            ) from None  # fmt: skip
        except Stopped as err:
            raise HTTPException(503, str(err)) from None
        except Exception as err:
            log.exception("translation failed")
            raise HTTPException(500, f"translation failed: {type(err).__name__}: {err}") from None
    ticket.cancel()
    if gone.done() and not gone.cancelled():
        raise HTTPException(CLIENT_CLOSED, "the client closed the connection")
    raise HTTPException(504, f"the request took longer than its deadline ({budget:g} s)")


async def _disconnect(request: Request) -> None:
    """Return when the client disconnects (the body is read: nothing else comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(status: int, message: str, headers=None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, "status": status, **extra}, status, headers)


async def _http_error(request: Request, err: Exception) -> JSONResponse:
    """The error as JSON; FastAPI's "error parsing the body" gets its cause (bad UTF-8)."""
    assert isinstance(err, HTTPException)
    cause = err.__cause__
    reason = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    return _error(err.status_code, f"{err.detail}{reason}", err.headers)


async def _unexpected_error(request: Request, err: Exception) -> JSONResponse:
    """A fault of the server's own, answered as JSON like any error (and logged with its
    traceback by uvicorn, to which Starlette raises it again)."""
    return _error(500, f"internal error: {type(err).__name__}")


async def _validation_error(request: Request, err: Exception) -> JSONResponse:
    """422 naming each bad field; the offending input is not echoed (it may be huge)."""
    assert isinstance(err, RequestValidationError)
    details = [
        {
            "loc": [str(part) for part in e["loc"]],
            "msg": e["msg"] + (f" ({e['ctx']['error']})" if "error" in e.get("ctx", {}) else ""),
            "type": e["type"],
        }
        for e in err.errors()
    ]
    summary = "; ".join(f"{'.'.join(d['loc'])}: {d['msg']}" for d in details)
    return _error(422, summary or "invalid request", details=details)


class _Guard:
    """ASGI middleware around the app: counts /v1/translate requests by status and
    latency, and refuses a body over `max_body_bytes` (413, in JSON): at once when its
    declared length says so, else once that many bytes have come. A body not whole
    `body_timeout_s` after the request came gets 408; a client that leaves before
    sending it all is counted as 499, not as a malformed body. A body that is not UTF-8
    gets 400 (`_Utf8Body`): JSON's own reader would take UTF-16 and UTF-32 as well.
    """

    def __init__(
        self, app: ASGIApp, metrics: ServerMetrics, max_body_bytes: int, body_timeout_s: float
    ) -> None:
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes
        self.body_timeout_s = body_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.monotonic(), 500

        async def send_counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        received, body_done, utf8 = 0, False, _Utf8Body()

        async def receive_limited() -> Message:
            # An HTTPException raised here is answered by the route (FastAPI re-raises it).
            nonlocal received, body_done
            if body_done:  # after the body, only a disconnect comes
                return await receive()
            remaining = start + self.body_timeout_s - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), max(remaining, 0))
            except TimeoutError:
                raise HTTPException(
                    408, f"the request body did not arrive within {self.body_timeout_s:g} s "
                    "(body_timeout_s)", {"Connection": "close"},
                ) from None  # fmt: skip
            if message["type"] == "http.disconnect":
                raise HTTPException(CLIENT_CLOSED, "the client left before sending its body")
            body_done = not message.get("more_body", False)
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise HTTPException(413, self._too_large(f"more than {self.max_body_bytes}"))
            utf8.check(message.get("body", b""), final=body_done)
            return message

        declared = dict(scope["headers"]).get(b"content-length", b"")
        try:
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                refusal = _error(413, self._too_large(int(declared)), {"Connection": "close"})
                await refusal(scope, receive, send_counted)
            else:
                await self.app(scope, receive_limited, send_counted)
        finally:
            if scope["path"] == TRANSLATE_PATH:
                self.metrics.request(status, time.monotonic() - start)

    def _too_large(self, size: int | str) -> str:
        return f"the request body has {size} bytes; at most {self.max_body_bytes} are read"


class _Utf8Body:
    """Checks a body, chunk by chunk, for what the API takes: UTF-8 text with no NUL byte.

    JSON text never holds a raw NUL (a control character, escaped inside strings), and
    UTF-16 and UTF-32 put one beside every ASCII character, so that a body in either,
    with or without a byte-order mark, is refused even where its bytes happen to be
    valid UTF-8.
    """

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.offset = 0  # bytes checked so far

    def check(self, chunk: bytes, final: bool) -> None:
        """Raises: HTTPException 400 naming the first offending byte."""
        nul = chunk.find(b"\0")
        try:
            if nul >= 0:
                raise ValueError(f"a NUL byte at byte {self.offset + nul} (UTF-16 or UTF-32?)")
            self.decoder.decode(chunk, final)
        except (UnicodeDecodeError, ValueError) as err:
            reason = f"{type(err).__name__}: {err}"
            raise HTTPException(
                400, f"the request body is not UTF-8 ({reason}); send JSON encoded as UTF-8"
            ) from None
        self.offset += len(chunk)


def _mount_explorer(app: FastAPI) -> None:
    """The explorer's page at / (after the API routes, which take precedence)."""
    try:
        from aiayn.apps.explorer import STATIC_DIR
    except ImportError:

        @app.get("/", include_in_schema=False)
        async def index() -> JSONResponse:
            return JSONResponse({"error": "the explorer (aiayn.apps.explorer) is not installed; "
                                 "the API is at /docs", "status": 404}, 404)  # fmt: skip

        return
    from fastapi.staticfiles import StaticFiles

    app.mount("/", StaticFiles(directory=STATIC_DIR, html=True), name="explorer")
