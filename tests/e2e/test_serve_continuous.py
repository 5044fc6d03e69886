"""aiayn serve --continuous: the ContinuousBatcher against a fake table, then the HTTP API
on a tiny model, its answers against dynamic batching's."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from aiayn.apps.serve import ServeConfig, create_app
from aiayn.apps.serve.batcher import (
    BatchLimits,
    ContinuousBatcher,
    DeadlineExceeded,
    Sentence,
    Stopped,
    Unservable,
)
from aiayn.apps.translate import Translator
from aiayn.cli import app as cli
from infer_helpers import make_run, sentences

FAR = 1e9


class FakeTable:
    """A `Stepper` of `size` places: a sentence finishes after len(ids) steps, answering
    its text reversed; records who joined and left, and when."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.inside: dict[int, list[Any]] = {}  # handle -> [options, sentence, steps left]
        self.log: list[tuple[str, str, int]] = []  # (event, text, step)
        self.steps = 0
        self._next = 0

    def room(self, options: Hashable) -> int:
        if any(o != options for o, _, _ in self.inside.values()):
            return 0
        return self.size - len(self.inside)

    def join(self, options: Hashable, sentence: Sentence) -> int:
        self._next += 1
        self.inside[self._next] = [options, sentence, len(sentence.ids)]
        self.log.append(("join", sentence.text, self.steps))
        return self._next

    def leave(self, handle: int) -> None:
        self.log.append(("leave", self.inside.pop(handle)[1].text, self.steps))

    def reset(self) -> None:
        self.log += [("reset", entry[1].text, self.steps) for entry in self.inside.values()]
        self.inside.clear()

    @property
    def busy(self) -> bool:
        return bool(self.inside)

    def advance(self) -> list[tuple[int, str]]:
        self.steps += 1
        time.sleep(0.001)
        done = []
        for handle, entry in list(self.inside.items()):
            entry[2] -= 1
            if entry[2] == 0:
                del self.inside[handle]
                done.append((handle, entry[1].text[::-1]))
        return done


def _sentence(text: str, steps: int) -> Sentence:
    return Sentence(text, [7] * steps)


def test_sentences_join_as_places_free_up_first_in_first_out():
    table = FakeTable(size=2)
    sizes: list[int] = []
    batcher = ContinuousBatcher(table, BatchLimits(), on_batch=sizes.append)
    tickets = [
        batcher.submit([_sentence(f"s{i}", steps)], "a", time.monotonic() + FAR)
        for i, steps in enumerate([5, 1, 2, 1, 3])
    ]
    batcher.start()
    batcher.close(timeout=10)
    assert [t.future.result(timeout=0) for t in tickets] == [[f"{i}s"] for i in range(5)]
    joins = {text: step for event, text, step in table.log if event == "join"}
    # s1 finishes after one step and s2 takes its place while s0 still runs
    assert joins == {"s0": 0, "s1": 0, "s2": 1, "s3": 3, "s4": 4}
    assert sum(sizes) == 5


def test_other_options_wait_for_the_table_to_drain_and_nothing_overtakes_them():
    table = FakeTable(size=4)
    batcher = ContinuousBatcher(table, BatchLimits())
    order = [("a", 3), ("b", 1), ("a", 1)]
    tickets = [
        batcher.submit([_sentence(f"{options}{i}", steps)], options, time.monotonic() + FAR)
        for i, (options, steps) in enumerate(order)
    ]
    batcher.start()
    batcher.close(timeout=10)
    assert all(t.future.done() for t in tickets)
    joins = [(text, step) for event, text, step in table.log if event == "join"]
    assert joins == [("a0", 0), ("b1", 3), ("a2", 4)]


def test_a_cancelled_or_expired_request_leaves_the_table_at_once():
    table = FakeTable(size=2)
    batcher = ContinuousBatcher(table, BatchLimits())
    gone = batcher.submit([_sentence("gone", 10_000)], "a", time.monotonic() + FAR)
    late = batcher.submit([_sentence("late", 10_000)], "a", time.monotonic() + 0.05)
    batcher.start()
    while ("join", "late", 0) not in table.log:
        time.sleep(0.001)
    gone.cancel()
    with pytest.raises(DeadlineExceeded):
        late.future.result(timeout=10)
    kept = batcher.submit([_sentence("kept", 2)], "a", time.monotonic() + FAR)
    assert kept.future.result(timeout=10) == ["tpek"]
    batcher.close(timeout=10)
    left = [text for event, text, _ in table.log if event == "leave"]
    assert sorted(left) == ["gone", "late"] and not table.inside


def test_close_drains_the_table_and_the_queue_then_refuses():
    table = FakeTable(size=1)
    batcher = ContinuousBatcher(table, BatchLimits())
    tickets = [
        batcher.submit([_sentence(f"s{i}", 3)], "a", time.monotonic() + FAR) for i in range(3)
    ]
    batcher.start()
    batcher.close(timeout=10)
    assert [t.future.result(timeout=0) for t in tickets] == [["0s"], ["1s"], ["2s"]]
    with pytest.raises(Stopped):
        batcher.submit([_sentence("after", 1)], "a", time.monotonic() + FAR)


def test_a_failing_step_fails_the_tables_requests_and_the_server_goes_on():
    class Failing(FakeTable):
        def advance(self):
            if any(entry[1].text == "bad" for entry in self.inside.values()):
                raise RuntimeError("boom")
            return super().advance()

    batcher = ContinuousBatcher(Failing(size=1), BatchLimits())
    bad = batcher.submit([_sentence("bad", 1)], "a", time.monotonic() + FAR)
    good = batcher.submit([_sentence("good", 1)], "a", time.monotonic() + FAR)
    batcher.start()
    batcher.close(timeout=10)
    with pytest.raises(RuntimeError, match="boom"):
        bad.future.result(timeout=0)
    assert good.future.result(timeout=0) == ["doog"]


# ----- the HTTP API on a tiny model ----------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("serve_continuous"))


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator.load(run)


def test_requests_from_threads_get_dynamic_batchings_translations(translator, run):
    texts = [*sentences(9, seed=9), ""]
    settings = ServeConfig(continuous=3, max_chars=400)
    with TestClient(create_app(translator, settings, run)) as client:
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            reply = client.post("/v1/translate", json={"text": texts[i], "beam": 2})
            answers[i] = reply.json()["translations"][0]["translation"]

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        many = client.post("/v1/translate", json={"text": texts[:4], "alpha": 1.0}).json()
    expected = translator.translate(texts, beam=2)
    assert [answers[i] for i in range(len(texts))] == expected
    assert len(set(expected)) >= 5
    assert [t["translation"] for t in many["translations"]] == translator.translate(
        texts[:4], alpha=1.0
    )


def test_attention_maps_come_from_the_hypothesis_the_engine_found(translator, run):
    from aiayn.apps.explorer import attention_payload

    decode = translator.decode_config()
    with TestClient(create_app(translator, ServeConfig(continuous=2), run)) as client:
        reply = client.post("/v1/translate", json={"text": "house tree.", "attention": True})
    assert reply.status_code == 200
    item = reply.json()["translations"][0]
    assert item["attention"] == attention_payload(translator, "house tree.", decode)
    assert item["attention"]["translation"] == item["translation"]


def test_a_passed_deadline_is_504(translator, run):
    settings = ServeConfig(continuous=2, deadline_s=0.001)
    with TestClient(create_app(translator, settings, run)) as client:
        reply = client.post("/v1/translate", json={"text": "house."})
        assert reply.status_code == 504 and "deadline" in reply.json()["error"]


def test_cli_serve_continuous_refuses_a_negative_count_in_one_line(run):
    result = CliRunner().invoke(cli, ["serve", str(run), "--continuous", "-1"])
    assert result.exit_code == 1
    assert "continuous must be >= 0" in result.stderr and "Traceback" not in result.output
    alone = CliRunner().invoke(cli, ["serve", str(run), "--compile"])
    assert alone.exit_code == 1 and "set continuous too" in alone.stderr


# ----- issue 42: the continuous server survives any one request ------------------------


class Fatal(BaseException):
    """What no `except Exception` catches: it ends the inference thread."""


def test_a_table_that_cannot_be_made_fails_its_request_only():
    class Unmakeable(FakeTable):
        def room(self, options):
            if options == "huge":
                raise RuntimeError("can't allocate memory")
            return super().room(options)

    batcher = ContinuousBatcher(Unmakeable(size=2), BatchLimits())
    huge = batcher.submit([_sentence("h0", 1), _sentence("h1", 1)], "huge", time.monotonic() + FAR)
    good = batcher.submit([_sentence("good", 2)], "a", time.monotonic() + FAR)
    batcher.start()
    with pytest.raises(Unservable, match="can't allocate memory"):
        huge.future.result(timeout=10)
    assert good.future.result(timeout=10) == ["doog"]
    assert batcher.running and batcher.failure is None
    batcher.close(timeout=10)


def test_a_thread_that_dies_fails_what_it_holds_and_says_so():
    class Dying(FakeTable):
        def advance(self):
            raise Fatal("gone")

    stopped = threading.Event()
    batcher = ContinuousBatcher(Dying(size=1), BatchLimits())
    batcher.on_fatal = stopped.set
    inside = batcher.submit([_sentence("in", 3)], "a", time.monotonic() + FAR)
    queued = batcher.submit([_sentence("queued", 3)], "a", time.monotonic() + FAR)
    batcher.start()
    assert stopped.wait(timeout=10)
    for ticket in (inside, queued):
        with pytest.raises(Stopped, match="inference thread stopped"):
            ticket.future.result(timeout=10)
    assert isinstance(batcher.failure, Fatal) and not batcher.running
    with pytest.raises(Stopped, match="Fatal: gone"):
        batcher.submit([_sentence("later", 1)], "a", time.monotonic() + FAR)


@pytest.mark.parametrize("broken", ["make", "step"])
def test_a_failure_once_fails_its_request_and_the_next_one_is_answered(
    translator, run, monkeypatch, broken
):
    """The issue's `--continuous 1000000000`: a table that cannot be made (or a step that
    fails) killed the inference thread; every later request got 504 and /ready 503."""
    from aiayn.inference import engine

    failures = []
    real = engine.Engine.__init__ if broken == "make" else engine.Engine.advance

    def once(self, *args, **kwargs):
        if not failures:
            failures.append(broken)
            raise RuntimeError("can't allocate memory")
        return real(self, *args, **kwargs)

    settings = ServeConfig(continuous=2, deadline_s=20)
    with TestClient(create_app(translator, settings, run)) as client:  # the default table
        monkeypatch.setattr(engine.Engine, "__init__" if broken == "make" else "advance", once)
        body = {"text": "house tree.", "beam": 3}  # beam 3: a table not yet made
        first = client.post("/v1/translate", json=body)
        assert first.status_code == (503 if broken == "make" else 500), first.text
        assert first.headers["content-type"] == "application/json"
        assert "can't allocate memory" in first.json()["error"]
        assert client.get("/ready").status_code == 200
        again = client.post("/v1/translate", json=body)
        assert again.status_code == 200, again.text
        other = client.post("/v1/translate", json={"text": "river.", "beam": 2})
    assert failures == [broken]
    assert (
        again.json()["translations"][0]["translation"]
        == translator.translate(["house tree."], beam=3)[0]
    )
    assert (
        other.json()["translations"][0]["translation"]
        == translator.translate(["river."], beam=2)[0]
    )


def test_many_alphas_share_one_table_and_tables_stay_within_max_beam(translator, run):
    """An engine was made and kept for every (beam, alpha) asked for: about 100 MiB per new
    alpha at beam 16. The tables are kept by beam, at most max_beam slots per sentence."""
    import weakref

    texts = sentences(3, seed=12)
    alphas = [0.1 * i for i in range(12)]
    settings = ServeConfig(continuous=2, max_beam=8, max_chars=400)
    app = create_app(translator, settings, run)
    stepper = app.state.batcher.stepper
    with TestClient(app) as client:
        answers = [
            client.post("/v1/translate", json={"text": texts, "beam": 3, "alpha": a}).json()
            for a in alphas
        ]
        assert list(stepper.tables) == [translator.decode.beam, 3]
        three = weakref.ref(stepper.tables[3])
        for beam in [1, 2, 5, 6, 2]:
            reply = client.post("/v1/translate", json={"text": texts[0], "beam": beam})
            assert reply.status_code == 200
            assert sum(stepper.tables) <= 8
        assert three() is None  # dropped, and its memory freed
        assert list(stepper.tables) == [6, 2]  # least recently used first
    for alpha, answer in zip(alphas, answers, strict=True):
        found = [t["translation"] for t in answer["translations"]]
        assert found == translator.translate(texts, beam=3, alpha=alpha)


def test_cli_serve_refuses_a_table_too_large_for_memory_in_one_line(run, monkeypatch):
    import aiayn.apps.serve

    def refuse(*args, **kwargs):
        raise AssertionError("aiayn serve started a server with an absurd --continuous")

    monkeypatch.setattr(aiayn.apps.serve, "run_server", refuse)
    result = CliRunner().invoke(cli, ["serve", str(run), "--continuous", "1000000000"])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aiayn: error: continuous=1000000000: a table")
    assert "MiB are available; decode fewer sentences at once" in lines[0]
