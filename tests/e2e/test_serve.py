"""aiayn.apps.serve: the batcher against a recording fake, then the HTTP API on a tiny model."""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import aiayn.apps.serve.engine
import aiayn.apps.translate
from aiayn.apps.serve import ServeConfig, create_app
from aiayn.apps.serve.batcher import (
    Batcher,
    BatchLimits,
    DeadlineExceeded,
    QueueFull,
    Sentence,
    Stopped,
)
from aiayn.apps.serve.engine import Options, TranslationEngine
from aiayn.apps.translate import Translator
from aiayn.cli import app as cli
from infer_helpers import make_run, sentences

FAR = 1e9  # a deadline that never passes


class Recorder:
    """A `run_batch` that records each batch and answers each sentence's text reversed."""

    def __init__(self) -> None:
        self.batches: list[tuple[object, list[Sentence]]] = []

    def __call__(self, options: object, batch: list[Sentence]) -> list[str]:
        self.batches.append((options, list(batch)))
        return [s.text[::-1] for s in batch]


def sentence(rng: random.Random, n: int) -> Sentence:
    return Sentence(f"s{n}-" + "x" * rng.randint(0, 9), ids=[7] * rng.randint(1, 12))


def deadline() -> float:
    return time.monotonic() + FAR


# ----- the batcher ------------------------------------------------------------------


def test_batches_respect_budget_group_options_sort_by_length_and_route_results() -> None:
    rng = random.Random(0)
    record = Recorder()
    limits = BatchLimits(queue_size=500, max_tokens=30, max_batch=5, max_wait=0.0)
    batcher = Batcher(record, limits)
    requests = []
    for n in range(40):  # queued before the thread starts, so batches can fill
        texts = [sentence(rng, 100 * n + i) for i in range(rng.randint(1, 4))]
        options = ("beam", n % 3)
        requests.append((texts, batcher.submit(texts, options, deadline())))
    batcher.start()
    batcher.close(timeout=30)

    for texts, ticket in requests:
        assert ticket.future.result(timeout=0) == [s.text[::-1] for s in texts]
    seen = [s.text for _, batch in record.batches for s in batch]
    assert sorted(seen) == sorted(s.text for texts, _ in requests for s in texts)  # each once
    options_of = {s.text: ("beam", n % 3) for n, (texts, _) in enumerate(requests) for s in texts}
    for options, batch in record.batches:
        assert {options_of[s.text] for s in batch} == {options}
        lengths = [len(s) for s in batch]
        assert lengths == sorted(lengths, reverse=True)
        assert len(batch) <= limits.max_batch
        assert len(batch) == 1 or len(batch) * max(lengths) <= limits.max_tokens
    assert max(len(batch) for _, batch in record.batches) > 1  # it did batch


def test_oldest_sentence_goes_first_and_short_waits_do_not_starve_it() -> None:
    record = Recorder()
    batcher = Batcher(record, BatchLimits(max_tokens=8, max_wait=0.0))
    first = batcher.submit([Sentence("long", [1] * 8)], "a", deadline())
    batcher.submit([Sentence(f"short{i}", [1]) for i in range(6)], "a", deadline())
    batcher.start()
    batcher.close(timeout=30)
    assert [s.text for s in record.batches[0][1]] == ["long"]  # 8 tokens: a batch of its own
    assert first.future.result(timeout=0) == ["gnol"]
    assert [len(b) for _, b in record.batches] == [1, 6]


def test_a_full_queue_refuses_the_whole_request() -> None:
    batcher = Batcher(Recorder(), BatchLimits(queue_size=3))
    batcher.submit([Sentence("a", [1]), Sentence("b", [1])], "o", deadline())
    with pytest.raises(QueueFull, match="holds 2 of 3"):
        batcher.submit([Sentence("c", [1]), Sentence("d", [1])], "o", deadline())
    assert batcher.depth() == 2  # nothing of the refused request was queued
    batcher.submit([Sentence("c", [1])], "o", deadline())
    batcher.start()
    batcher.close(timeout=30)
    with pytest.raises(Stopped):
        batcher.submit([Sentence("e", [1])], "o", deadline())


def test_cancelled_and_expired_requests_are_dropped_before_decoding() -> None:
    record = Recorder()
    batcher = Batcher(record, BatchLimits(max_wait=0.0))
    gone = batcher.submit([Sentence("gone", [1, 2])], "o", deadline())
    late = batcher.submit([Sentence("late", [1, 2])], "o", time.monotonic() - 1)
    kept = batcher.submit([Sentence("kept", [1, 2])], "o", deadline())
    gone.cancel()
    assert batcher.depth() == 2
    batcher.start()
    batcher.close(timeout=30)
    assert [s.text for _, batch in record.batches for s in batch] == ["kept"]
    with pytest.raises(DeadlineExceeded):
        late.future.result(timeout=0)
    assert not gone.future.done()  # nobody waits for it any more
    assert kept.future.result(timeout=0) == ["tpek"]


def test_a_lone_sentence_is_flushed_after_the_wait() -> None:
    batcher = Batcher(Recorder(), BatchLimits(max_wait=0.01))
    batcher.start()
    ticket = batcher.submit([Sentence("one", [1])], "o", deadline())
    assert ticket.future.result(timeout=10) == ["eno"]  # no other sentence ever came
    batcher.close(timeout=10)


def test_after_a_batch_the_wait_lets_answered_clients_join_the_next() -> None:
    release = threading.Event()
    record = Recorder()

    def run_batch(options: str, batch: list[Sentence]) -> list[str]:
        if batch[0].text == "first":
            release.wait(timeout=30)  # the model is busy with it
        return record(options, batch)

    batcher = Batcher(run_batch, BatchLimits(max_wait=0.5))
    first = batcher.submit([Sentence("first", [1])], "o", deadline())
    batcher.start()
    while batcher.depth():  # until "first" is taken
        time.sleep(0.01)
    second = batcher.submit([Sentence("second", [1])], "o", deadline())
    time.sleep(0.8)  # "second" waits longer than max_wait while the model is busy
    release.set()
    first.future.result(timeout=30)
    time.sleep(0.1)  # the client answered by the first batch comes back
    third = batcher.submit([Sentence("third", [1])], "o", deadline())
    assert second.future.result(timeout=30) == ["dnoces"]
    assert third.future.result(timeout=30) == ["driht"]
    batcher.close(timeout=30)
    # "second" had waited long since it came, but the model had been idle only briefly.
    assert [[s.text for s in batch] for _, batch in record.batches] == [
        ["first"],
        ["second", "third"],
    ]


def test_a_failing_batch_fails_its_requests_only() -> None:
    def run_batch(options: str, batch: list[Sentence]) -> list[str]:
        if options == "bad":
            raise RuntimeError("boom")
        return [s.text for s in batch]

    batcher = Batcher(run_batch, BatchLimits(max_wait=0.0))
    bad = batcher.submit([Sentence("x", [1])], "bad", deadline())
    good = batcher.submit([Sentence("y", [1])], "good", deadline())
    batcher.start()
    batcher.close(timeout=30)
    with pytest.raises(RuntimeError, match="boom"):
        bad.future.result(timeout=0)
    assert good.future.result(timeout=0) == ["y"]


# ----- on a model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def translator(run: Path) -> Translator:
    return Translator.load(run)


def test_batched_translations_equal_one_at_a_time(translator: Translator) -> None:
    texts = sentences(12, seed=3)
    decode = translator.decode_config(beam=3, extra_len=6)
    engine = TranslationEngine(translator, threads=1)
    sizes: list[int] = []
    limits = BatchLimits(max_tokens=64, max_wait=0.0)
    batcher = Batcher(engine.run_batch, limits, on_batch=sizes.append)
    ids = translator.encode(texts)
    tickets = [
        batcher.submit([Sentence(t, row)], Options(decode), deadline())
        for t, row in zip(texts, ids, strict=True)
    ]
    batcher.start()
    batcher.close(timeout=60)
    batched = [ticket.future.result(timeout=0)[0]["translation"] for ticket in tickets]
    alone = [translator.translate([t], beam=3, extra_len=6)[0] for t in texts]
    assert batched == alone
    # a model that said the same for every sentence would pass the line above
    assert len(set(alone)) >= len(texts) // 2, alone
    assert max(sizes) > 1 and sum(sizes) == len(texts)


@pytest.fixture(scope="module")
def client(translator: Translator, run: Path):
    with TestClient(create_app(translator, ServeConfig(max_chars=400), run)) as client:
        yield client


def test_translate_one_sentence_or_a_list(client: TestClient, translator: Translator) -> None:
    texts = sentences(3, seed=5)
    one = client.post("/v1/translate", json={"text": texts[0], "beam": 2, "alpha": 1.0})
    assert one.status_code == 200
    assert one.json() == {
        "translations": [{"translation": translator.translate(texts[:1], beam=2, alpha=1.0)[0]}],
        "beam": 2,
        "alpha": 1.0,
    }
    many = client.post("/v1/translate", json={"text": [*texts, ""]}).json()
    assert [t["translation"] for t in many["translations"]] == translator.translate([*texts, ""])
    assert (many["beam"], many["alpha"]) == (translator.decode.beam, translator.decode.alpha)


def test_limits_and_bad_options_are_json_errors(client: TestClient) -> None:
    cases = [
        ({"text": "a" * 401}, 413, "401 characters"),
        ({"text": ["a"] * 65}, 413, "65 sentences"),
        ({"text": "house.", "beam": 17}, 422, "max_beam=16"),
        ({"text": "house.", "beam": 0}, 422, "beam"),
        ({"text": "house.", "alpha": -1}, 422, "alpha"),
        ({"text": []}, 422, "at least one"),
        ({"text": ["house.", " "], "attention": True}, 422, "blank"),
    ]
    for body, status, words in cases:
        reply = client.post("/v1/translate", json=body)
        assert reply.status_code == status, body
        assert reply.json()["status"] == status and words in reply.json()["error"], body


def test_health_ready_and_info(client: TestClient, translator: Translator) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200
    info = client.get("/info").json()
    model = translator.model
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert info["shape"]["d_model"] == model.cfg.d_model
    assert info["shape"]["n_heads"] == model.cfg.n_heads
    assert info["decoding"]["beam"] == translator.decode.beam
    assert info["limits"]["max_chars"] == 400
    assert info["languages"] is None  # a run without a recipe names none
    assert client.get("/docs").status_code == 200
    assert "/v1/translate" in client.get("/openapi.json").json()["paths"]


def test_metrics_count_requests_batches_and_latency(client: TestClient) -> None:
    def series(text: str) -> dict[str, float]:
        return {
            name: float(value)
            for name, value in re.findall(r"^(\S+) (\S+)$", text, flags=re.MULTILINE)
            if not name.startswith("#")
        }

    before = series(client.get("/metrics").text)
    for body in ({"text": "house."}, {"text": ["river.", "tree."]}, {"text": "x", "beam": 0}):
        client.post("/v1/translate", json=body)
    reply = client.get("/metrics")
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    after = series(reply.text)

    def grew(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert grew('aiayn_requests_total{status="200"}') == 2
    assert grew('aiayn_requests_total{status="422"}') == 1
    assert grew("aiayn_request_seconds_count") == 3
    assert grew('aiayn_request_seconds_bucket{le="+Inf"}') == 3
    assert grew("aiayn_batch_size_sum") == 3  # three sentences were decoded
    assert after["aiayn_queue_depth"] == 0
    buckets = [v for k, v in after.items() if k.startswith("aiayn_batch_size_bucket")]
    assert buckets == sorted(buckets)  # cumulative


def test_attention_returns_the_explorers_payload(client: TestClient) -> None:
    pytest.importorskip("aiayn.apps.explorer")
    reply = client.post("/v1/translate", json={"text": "house tree.", "attention": True})
    assert reply.status_code == 200
    item = reply.json()["translations"][0]
    assert item["attention"]["translation"] == item["translation"]


def test_attention_without_the_explorer_is_501(
    translator: Translator, run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(aiayn.apps.serve.engine, "attention_payload_function", lambda: None)
    with TestClient(create_app(translator, ServeConfig(), run)) as client:
        reply = client.post("/v1/translate", json={"text": "house.", "attention": True})
        assert reply.status_code == 501 and "aiayn.apps.explorer" in reply.json()["error"]
        assert client.post("/v1/translate", json={"text": "house."}).status_code == 200


def test_a_passed_deadline_is_504(translator: Translator, run: Path) -> None:
    settings = ServeConfig(deadline_s=0.001, max_wait_ms=200)  # expires while it waits
    with TestClient(create_app(translator, settings, run)) as client:
        reply = client.post("/v1/translate", json={"text": "house."})
        assert reply.status_code == 504 and "deadline" in reply.json()["error"]


def test_requests_from_threads_batch_together(translator: Translator, run: Path) -> None:
    texts = sentences(8, seed=9)
    settings = ServeConfig(max_wait_ms=300)  # long enough for all eight to arrive
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
        metrics = client.get("/metrics").text
    assert [answers[i] for i in range(len(texts))] == translator.translate(texts, beam=2)
    batches = float(re.search(r"^aiayn_batch_size_count (\S+)$", metrics, re.M).group(1))
    assert batches < len(texts)  # some requests shared a batch


def test_cli_serve_bad_settings_are_one_line(run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["serve", str(run), "--queue-size", "4", "--max-sentences", "8"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "aiayn: error: max_sentences (8) must not exceed queue_size (4): such a request "
        "could never be queued"
    ]
    missing = runner.invoke(cli, ["serve", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "nope" in missing.output


# ----- issue 28: each sentence tokenised once, each batch sorted once ---------------------


class CountingTokenizer:
    """A tokenizer that records every sentence it is asked to encode."""

    def __init__(self, inner: object) -> None:
        self.inner, self.encoded = inner, []

    def encode(self, text: str) -> list[int]:
        self.encoded.append(text)
        return self.inner.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        self.encoded += texts
        return self.inner.encode_batch(texts)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_the_server_encodes_each_sentence_once_and_searches_the_batchers_batches(
    translator: Translator, run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = sentences(8, seed=13)
    expected = translator.translate(texts, beam=2)
    assert len(set(expected)) >= 4, expected  # a constant model would pass the test below
    ids = translator.encode(texts)
    counting = CountingTokenizer(translator.tokenizer)
    monkeypatch.setattr(translator, "tokenizer", counting)
    searched: list[list[list[int]]] = []  # the rows of each search, as the search got them
    search = aiayn.apps.translate.search

    def recording_search(model, src, config):
        pad = translator.model.cfg.pad_id
        searched.append([[t for t in row if t != pad] for row in src.tolist()])
        return search(model, src, config)

    monkeypatch.setattr(aiayn.apps.translate, "search", recording_search)
    settings = ServeConfig(max_wait_ms=300)  # long enough for all eight to arrive
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
        blank = client.post("/v1/translate", json={"text": ["  ", texts[0]], "beam": 2}).json()
    assert [answers[i] for i in range(len(texts))] == expected
    assert [t["translation"] for t in blank["translations"]] == ["", expected[0]]
    assert sorted(counting.encoded) == sorted([*texts, texts[0]])  # each once; blanks never
    assert len(searched) < len(texts) + 1  # some requests shared a search
    for rows in searched:  # longest first, as the batcher sorted them
        assert [len(r) for r in rows] == sorted((len(r) for r in rows), reverse=True)
    assert sorted(tuple(row) for rows in searched for row in rows) == sorted(
        tuple(row) for row in [*ids, ids[0]]
    )


def test_translate_ids_as_one_batch_equals_translate_nbest(translator: Translator) -> None:
    texts = [*sentences(6, seed=17), " "]
    decode = translator.decode_config(beam=3, nbest=2)
    rows = translator.encode(texts)
    assert rows[-1] == [translator.model.cfg.eos_id]  # the blank one: nothing to translate
    as_one = translator.translate_ids(rows, decode, max_tokens=None)
    by_length = translator.translate_nbest(texts, decode, max_tokens=16)
    assert [[c.text for c in n] for n in as_one] == [[c.text for c in n] for n in by_length]
    through_text = translator.translate_nbest(texts, decode, max_tokens=None)  # one batch too
    assert [[c.text for c in n] for n in through_text] == [[c.text for c in n] for n in as_one]
    assert as_one[-1] == [] and all(len(n) == 2 for n in as_one[:-1])
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        translator.translate_ids(rows, decode, max_tokens=0)
