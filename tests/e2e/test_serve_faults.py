"""`aiayn serve` as a real process on loopback: load, malformed input, disconnects, SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from aiayn.apps.serve import ServeConfig, create_app, uvicorn_config
from aiayn.apps.translate import Translator
from aiayn.cli import app as cli
from infer_helpers import make_run, sentences


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server on a free loopback port; `url`, `port`, and its metrics by name."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, alive: Callable[[], bool]) -> None:
        limit = time.monotonic() + 60
        while time.monotonic() < limit and alive():
            try:
                if httpx.get(f"{self.url}/ready", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"the server on port {self.port} did not start")

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0


class ThreadServer(Server):
    """The app under uvicorn in a thread of this process (the model loaded once)."""

    def __init__(self, translator: Translator, run: Path, settings: ServeConfig) -> None:
        self.port = free_port()
        app = create_app(translator, settings, run)
        config = uvicorn_config(app, port=self.port, access_log=False, log_config=None)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        self.wait_ready(self.thread.is_alive)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


class ProcessServer(Server):
    """`aiayn serve RUN --port P ...` in a subprocess."""

    def __init__(self, run: Path, *options: str) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "aiayn", "serve", str(run), "--port", str(self.port)]
        self.process = subprocess.Popen(
            [*command, "--no-access-log", *options],
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            self.wait_ready(lambda: self.process.poll() is None)
        except RuntimeError:
            self.stop()
            raise RuntimeError(
                f"aiayn serve did not start:\n{self.process.stdout.read()}"
            ) from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("serve-faults"))


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator.load(run)


@pytest.fixture(scope="module")
def server(translator: Translator, run: Path) -> Iterator[Server]:
    settings = ServeConfig(queue_size=16, max_sentences=16, max_chars=2000)
    server = ThreadServer(translator, run, settings)
    yield server
    server.stop()


def translate(server: Server, body: object) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/translate", json=body, timeout=30)


def test_200_concurrent_requests_are_answered_or_refused_with_429(server: Server) -> None:
    texts = sentences(200, seed=2)

    async def ask_all() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=200)
        async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as client:
            return await asyncio.gather(
                *(client.post("/v1/translate", json={"text": t, "beam": 2}) for t in texts)
            )

    replies = asyncio.run(ask_all())
    statuses = [r.status_code for r in replies]
    assert set(statuses) <= {200, 429}
    assert 429 in statuses and 200 in statuses  # a queue of 16 cannot hold 200
    for reply in replies:
        if reply.status_code == 429:
            assert reply.headers["retry-after"] == "1" and "busy" in reply.json()["error"]
        else:
            assert reply.json()["translations"][0]["translation"] is not None
    assert httpx.get(f"{server.url}/health").status_code == 200
    assert translate(server, {"text": "house."}).status_code == 200
    assert server.metric('aiayn_requests_total{status="429"}') == statuses.count(429)


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b'{"text": "house.",', 422, "JSON decode error"),
        (b'{"text": 42}', 422, "valid string"),
        (b'{"text": "house.", "beam": "four"}', 422, "valid integer"),
        (b'{"text": "house.", "beam": 0}', 422, "greater than or equal to 1"),
        (b'{"text": "house.", "colour": "red"}', 422, "Extra inputs"),
        (b'{"text": "caf\xe9 \xff"}', 400, "UnicodeDecodeError"),
        (b'["house."]', 422, "valid dictionary"),
        (b'{"text": "' + b"a" * 10_000_000 + b'"}', 413, "bytes"),
    ],
    ids=["malformed", "text-int", "beam-str", "beam-0", "unknown", "utf8", "list", "10MB"],
)
def test_bad_requests_get_a_json_error_and_serving_goes_on(
    server: Server, body: bytes, status: int, words: str
) -> None:
    reply = httpx.post(
        f"{server.url}/v1/translate",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code == status
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["status"] == status and words in reply.json()["error"]
    assert translate(server, {"text": "house."}).status_code == 200


def test_a_client_that_leaves_frees_its_work(translator: Translator, run: Path) -> None:
    # The sentence waits long in the queue.
    server = ThreadServer(translator, run, ServeConfig(max_wait_ms=1500))
    try:
        body = json.dumps({"text": "house tree."}).encode()
        with socket.create_connection(("127.0.0.1", server.port)) as conn:
            conn.sendall(
                b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            limit = time.monotonic() + 10
            while server.metric("aiayn_queue_depth") < 1 and time.monotonic() < limit:
                time.sleep(0.02)
            assert server.metric("aiayn_queue_depth") == 1
        limit = time.monotonic() + 10  # the client has gone
        while server.metric('aiayn_requests_total{status="499"}') < 1 and time.monotonic() < limit:
            time.sleep(0.02)
        assert server.metric('aiayn_requests_total{status="499"}') == 1
        assert server.metric("aiayn_queue_depth") == 0
        time.sleep(1.6)  # past the wait: the thread wakes, finds nothing to decode
        assert server.metric("aiayn_batch_size_count") == 0
        assert translate(server, {"text": "house."}).status_code == 200
    finally:
        server.stop()


@pytest.mark.slow  # a server process: a few seconds to import and load
def test_sigterm_answers_the_requests_in_flight_then_exits_0(run: Path) -> None:
    # The batch waits 3 s for more sentences, so that all six are still queued at SIGTERM
    # (the drain answers them when that wait ends).
    server = ProcessServer(run, "--max-wait-ms", "3000")
    texts = sentences(6, seed=4)

    async def ask_then_stop() -> tuple[bool, list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            asking = [
                asyncio.ensure_future(client.post("/v1/translate", json={"text": t})) for t in texts
            ]
            queued, limit = False, time.monotonic() + 3  # later, the batch has left
            while not queued and time.monotonic() < limit:
                await asyncio.sleep(0.02)
                metrics = (await client.get("/metrics")).text
                queued = re.search(r"^aiayn_queue_depth 6$", metrics, re.MULTILINE) is not None
            server.process.send_signal(signal.SIGTERM)
            return queued, await asyncio.gather(*asking)

    try:
        queued, replies = asyncio.run(ask_then_stop())
        assert queued, "the six requests were never all queued: SIGTERM had nothing to drain"
        assert [r.status_code for r in replies] == [200] * len(texts)
        assert all(r.json()["translations"][0]["translation"] is not None for r in replies)
        assert server.process.wait(timeout=30) == 0
    finally:
        server.stop()


# ----- issue 34: every request gets a JSON 4xx or a 2xx -------------------------------


def post_raw(server: Server, body: bytes) -> httpx.Response:
    """POST `body` as it is (JSON escapes stay escapes: httpx would encode a str)."""
    headers = {"content-type": "application/json"}
    return httpx.post(f"{server.url}/v1/translate", content=body, headers=headers, timeout=30)


def http_exchange(port: int, head: bytes, wait_s: float) -> tuple[bytes, bool]:
    """Send `head` on a fresh connection; what came back within `wait_s`, and whether
    the server closed the connection by then."""
    received, closed = b"", False
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head)
        limit = time.monotonic() + wait_s
        while time.monotonic() < limit:
            conn.settimeout(max(limit - time.monotonic(), 0.01))
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            received += chunk
    return received, closed


def status_of(server: Server, status: int) -> float:
    return server.metric(f'aiayn_requests_total{{status="{status}"}}')


@pytest.mark.parametrize(
    "body, words",
    [
        (rb'{"text": "\ud800 house"}', "text: a lone surrogate (U+D800) at character 1"),
        (rb'{"text": ["house.", "tree \udfff"]}', "text (sentence 2): a lone surrogate (U+DFFF)"),
    ],
    ids=["one", "list"],
)
def test_a_lone_surrogate_is_a_json_422_naming_the_field(
    server: Server, body: bytes, words: str
) -> None:
    reply = post_raw(server, body)
    assert reply.status_code == 422
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["status"] == 422 and words in reply.json()["error"]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    # the pair it belongs in is text, and is translated
    assert post_raw(server, rb'{"text": "\ud83c\udfe0 house"}').status_code == 200


@pytest.mark.parametrize(
    "body, words",
    [
        (rb'{"text": "house.", "alpha": 1e308}', "alpha"),  # the length penalty overflows
        (rb'{"text": "house.", "alpha": 1e400}', "alpha"),  # inf, as Python's json reads it
        (rb'{"text": "house.", "alpha": Infinity}', "alpha"),
        (rb'{"text": "house.", "alpha": NaN}', "alpha"),
        (rb'{"text": "house.", "alpha": 10.5}', "alpha"),
        (rb'{"text": "house.", "alpha": -1e308}', "alpha"),
        (rb'{"text": "house.", "beam": 100000000000000000000000000000}', "beam"),
        (rb'{"text": "house.", "beam": -3}', "beam"),
        (rb'{"text": "house.", "beam": 2.5}', "beam"),
    ],
)
def test_out_of_range_numbers_get_a_json_422_naming_the_field(
    server: Server, body: bytes, words: str
) -> None:
    reply = post_raw(server, body)
    assert reply.status_code == 422, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json()["status"] == 422 and words in reply.json()["error"]
    assert translate(server, {"text": "house.", "alpha": 10.0}).status_code == 200


def test_a_fault_inside_the_server_is_still_a_json_error(
    server: Server, translator: Translator, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> list[list[int]]:
        raise RuntimeError("a bug")

    monkeypatch.setattr(translator, "encode", broken)
    reply = translate(server, {"text": "house."})
    assert reply.status_code == 500
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"error": "internal error: RuntimeError", "status": 500}
    monkeypatch.undo()
    assert translate(server, {"text": "house."}).status_code == 200


def test_a_body_that_never_finishes_gets_408_and_the_server_stays_healthy(
    translator: Translator, run: Path
) -> None:
    server = ThreadServer(translator, run, ServeConfig(body_timeout_s=0.5))
    try:
        head = (
            b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"text": "ho'  # 12 of the 100 bytes, then nothing
        )
        started = time.monotonic()
        received, closed = http_exchange(server.port, head, wait_s=10)
        assert received.startswith(b"HTTP/1.1 408 "), received
        assert time.monotonic() - started < 5  # the body timeout, not the wait above
        answer = json.loads(received.split(b"\r\n\r\n", 1)[1])
        assert answer["status"] == 408 and "body_timeout_s" in answer["error"]
        assert closed
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        assert translate(server, {"text": "house."}).status_code == 200
        assert status_of(server, 408) == 1
    finally:
        server.stop()


def test_an_abandoned_upload_counts_as_499_not_400(server: Server) -> None:
    before = {status: status_of(server, status) for status in (400, 499)}
    head = (
        b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"text": "ho'
    )
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(head)
        time.sleep(0.2)  # the server starts reading the body, then the client leaves
    limit = time.monotonic() + 10
    while status_of(server, 499) == before[499] and time.monotonic() < limit:
        time.sleep(0.02)
    assert status_of(server, 499) == before[499] + 1
    assert status_of(server, 400) == before[400]
    assert translate(server, {"text": "house."}).status_code == 200


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1", "86401"])
def test_cli_refuses_a_body_timeout_out_of_range_in_one_line(run: Path, value: str) -> None:
    result = CliRunner().invoke(cli, ["serve", str(run), "--body-timeout", value])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"aiayn: error: body_timeout_s must lie in (0, 86400] seconds, got {float(value)}"
    ]


# ----- issue 42: the server's edges ----------------------------------------------------


def drip(port: int, head: bytes, every_s: float, for_s: float) -> tuple[bool, bytes]:
    """Send `head`, then one more header byte every `every_s` seconds for up to `for_s`
    (slow loris); whether the server closed the connection meanwhile, and what it sent."""
    received = b""
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(head)
        limit = time.monotonic() + for_s
        while time.monotonic() < limit:
            conn.settimeout(every_s)
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                try:
                    conn.sendall(b"a")
                except OSError:  # reset: closed
                    return True, received
                continue
            except OSError:
                return True, received
            if not chunk:
                return True, received
            received += chunk
    return False, received


@pytest.fixture(scope="module")
def impatient(translator: Translator, run: Path) -> Iterator[Server]:
    """A server that waits 0.5 s for a request's headers."""
    server = ThreadServer(translator, run, ServeConfig(header_timeout_s=0.5))
    yield server
    server.stop()


@pytest.mark.parametrize(
    "head",
    [b"", b"POST /v1/translate HTTP/1.1\r\n", b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "],
    ids=["nothing", "request-line", "a-header"],
)
def test_a_client_dripping_its_headers_is_disconnected(impatient: Server, head: bytes) -> None:
    # 40 such connections stayed open 12 s and more: there was no header timeout
    closed, received = drip(impatient.port, head, every_s=0.1, for_s=15)
    assert closed and received == b""
    assert httpx.get(f"{impatient.url}/health", timeout=10).status_code == 200


def test_a_keep_alive_connection_dripping_its_next_headers_is_disconnected(
    impatient: Server,
) -> None:
    body = json.dumps({"text": "house."}).encode()
    first = (
        b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
        + b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "  # the next request, dripping
    )
    closed, received = drip(impatient.port, first, every_s=0.1, for_s=15)
    assert closed
    assert received.startswith(b"HTTP/1.1 200 ") and b'"translations"' in received
    assert received.count(b"HTTP/1.1 ") == 1  # the dripped request got nothing


def test_a_slow_request_whose_headers_came_in_time_is_answered(impatient: Server) -> None:
    """The header timeout is not a request timeout: the body has its own (body_timeout_s)."""
    body = json.dumps({"text": "house tree."}).encode()
    with socket.create_connection(("127.0.0.1", impatient.port)) as conn:
        conn.sendall(
            b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
        )
        time.sleep(1.0)  # twice the header timeout, the body not sent yet
        conn.sendall(body)
        conn.settimeout(30)
        received = conn.recv(65536)
    assert received.startswith(b"HTTP/1.1 200 "), received


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_a_body_in_another_encoding_than_utf8_gets_400(server: Server, encoding: str) -> None:
    # JSON's reader takes UTF-16 and UTF-32 too; the documentation says UTF-8 only
    reply = post_raw(server, json.dumps({"text": "house."}).encode(encoding))
    assert reply.status_code == 400, reply.text
    assert reply.headers["content-type"] == "application/json"
    answer = reply.json()
    assert answer["status"] == 400 and "not UTF-8" in answer["error"]
    assert translate(server, {"text": "house."}).status_code == 200


def test_utf8_with_or_without_a_byte_order_mark_is_taken(server: Server) -> None:
    text = "caf\u00e9 house \U0001f3e0."
    plain = post_raw(server, json.dumps({"text": text}, ensure_ascii=False).encode())
    marked = post_raw(server, json.dumps({"text": text}).encode("utf-8-sig"))
    assert plain.status_code == marked.status_code == 200
    assert plain.json() == marked.json()


def test_attention_maps_above_the_response_cap_are_refused_before_decoding(
    translator: Translator, run: Path
) -> None:
    """A 30 KB request with "attention": true was answered with 102 MiB."""
    from aiayn.apps.serve.app import attention_bytes

    texts = sentences(8, seed=21)
    decode = translator.decode_config()
    sizes = [attention_bytes(translator, translator.encode([t]), decode) for t in texts]
    cap = sorted(sizes)[4]  # some sentences fit alone, all together do not
    settings = ServeConfig(max_response_bytes=cap, max_chars=2000)
    server = ThreadServer(translator, run, settings)
    try:
        before = server.metric("aiayn_batch_size_count")
        refused = translate(server, {"text": texts, "attention": True})
        assert refused.status_code == 413, refused.text
        assert refused.json()["status"] == 413
        assert "max_response_bytes" in refused.json()["error"]
        assert server.metric("aiayn_batch_size_count") == before  # nothing was decoded
        for text, size in zip(texts, sizes, strict=True):
            reply = translate(server, {"text": text, "attention": True})
            if size > cap:
                assert reply.status_code == 413
                continue
            assert reply.status_code == 200, reply.text
            # the estimate bounds what is sent (the rest of the answer is a few bytes)
            payload = reply.json()["translations"][0]["attention"]
            assert len(json.dumps(payload, separators=(",", ":"))) <= size
            assert len(reply.content) <= cap
        assert translate(server, {"text": texts}).status_code == 200  # no maps: no cap
    finally:
        server.stop()


def test_attention_bytes_counts_the_weights_the_maps_hold(translator: Translator) -> None:
    """The bound, against the maps' own shapes: S x S, T x T and T x S weights per layer and
    head, for the longest T the search allows."""
    from aiayn.apps.explorer import DIGITS
    from aiayn.apps.serve.app import attention_bytes

    cfg = translator.model.cfg
    decode = translator.decode_config()
    ids = translator.encode(["house tree.", "river."])
    found = attention_bytes(translator, ids, decode)
    expected = 0
    for row in ids:
        s = len(row)
        t = min(s + decode.extra_len, cfg.max_len) + 1
        per_head = cfg.n_encoder_layers * s * s + cfg.n_decoder_layers * (t * t + t * s)
        expected += cfg.n_heads * (per_head + 4 * (s + t)) * (DIGITS + 3)
    assert found == expected


def test_cli_serve_on_a_busy_port_is_one_error_line(run: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", str(run), "--port", str(port)])
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines() == [
        f"aiayn: error: cannot listen on 127.0.0.1:{port} (Address already in use); choose "
        "another --port, or stop what holds it"
    ]


@pytest.mark.parametrize(
    "host, words",
    [
        ("999.1.1.1", "--host '999.1.1.1': not an address to listen on"),
        ("no such host.invalid", "--host 'no such host.invalid': not an address to listen on"),
        ("192.0.2.1", "cannot listen on 192.0.2.1:"),  # TEST-NET-1: not this machine's
    ],
    ids=["bad-ip", "bad-name", "not-ours"],
)
def test_cli_serve_on_an_invalid_host_is_one_error_line(run: Path, host: str, words: str) -> None:
    result = CliRunner().invoke(cli, ["serve", str(run), "--host", host, "--port", "8000"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"aiayn: error: {words}"), result.output
    assert "give an address of this machine" in lines[0]


def test_a_server_whose_inference_thread_stops_exits_1_for_its_supervisor(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the process stayed up answering 504 for ever, /ready 503."""
    from aiayn.apps.serve.batcher import Batcher

    def dies(self: Batcher) -> None:
        raise SystemError("the inference thread's own fault")

    monkeypatch.setattr(Batcher, "_loop", dies)
    result = CliRunner().invoke(cli, ["serve", str(run), "--port", str(free_port())])
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("aiayn: error:")]
    assert errors == [
        "aiayn: error: the inference thread stopped (SystemError: the inference thread's own "
        "fault); the server shut down so that it can be restarted"
    ]
