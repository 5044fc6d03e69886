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
