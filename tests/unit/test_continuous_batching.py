"""aiayn.inference.engine: continuous batching over a table of slots.

Every sentence the engine decodes, whatever joins or leaves the table around it, must
equal the same sentence decoded alone by today's search (`aiayn.inference.search`).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from test_static_step import VOCAB, small, sources
from typer.testing import CliRunner

from aiayn import freeze
from aiayn.apps.translate import Translator
from aiayn.cli import app
from aiayn.inference.engine import Engine, _beam_slots
from aiayn.inference.search import DecodeConfig, search
from infer_helpers import make_run, sentences

SETTINGS = {
    "greedy": dict(beam=1, extra_len=6),
    "beam": dict(beam=3, alpha=0.6, nbest=2, extra_len=6),
    "beam_heuristic": dict(beam=3, alpha=1.0, extra_len=6, early_stopping="heuristic"),
}


def _rows(src: torch.Tensor, pad_id: int = 0) -> list[list[int]]:
    return [[i for i in row if i != pad_id] for row in src.tolist()]


def _alone(model, rows: list[list[int]], config: DecodeConfig) -> list[list[tuple]]:
    """Each row decoded alone by today's search: (tokens, score) of its n-best (the scores
    within 1e-4: the step attends its masked slots in another order of additions)."""
    with torch.no_grad():
        return [
            [
                (h.tokens, pytest.approx(h.score, abs=1e-4))
                for h in search(model, torch.tensor([row]), config)[0]
            ]
            for row in rows
        ]


def _seen(done) -> list[tuple]:
    return [(h.tokens, h.score) for h in done.hypotheses]


def test_a_sentence_in_a_slot_another_just_left_is_decoded_as_alone():
    model = small("encoder_decoder", std=0.5, tie_output=False)
    config = DecodeConfig(**SETTINGS["beam"])
    rows = _rows(sources(3, seed=5))
    engine = Engine(model, config, sentences=1)  # one group: each sentence reuses it
    results = {done.request: _seen(done) for done in engine.run(rows)}
    assert [results[i] for i in range(3)] == _alone(model, rows, config)
    assert len({tuple(r[0][0]) for r in results.values()}) == 3


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("search_name", sorted(SETTINGS))
def test_random_arrivals_decode_every_sentence_as_alone(frozen, search_name):
    model = small("encoder_decoder", std=0.5, tie_output=False, positional="rotary")
    model = freeze(model) if frozen else model
    config = DecodeConfig(**SETTINGS[search_name])
    rows = _rows(sources(12, seed=7))
    expected = _alone(model, rows, config)
    assert len({tuple(e[0][0]) for e in expected}) >= 5  # distinct outputs
    engine = Engine(model, config, sentences=3)
    arrivals = random.Random(search_name).sample(range(12), 12)  # a random order
    found = {}
    while arrivals or not engine.idle:
        # join mid-flight: 0 to 2 sentences at a random step boundary
        for _ in range(random.Random(len(found) + len(arrivals)).randint(0, 2)):
            if arrivals:
                index = arrivals.pop()
                found[engine.submit(rows[index])] = index
        for done in engine.advance():
            found[done.request] = (found[done.request], _seen(done))
    assert all(isinstance(v, tuple) for v in found.values())
    for index, seen in found.values():
        assert seen == expected[index], index


@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
@pytest.mark.parametrize("beam", [1, 3])
def test_prompts_of_different_lengths_continue_as_alone(architecture, beam):
    model = small(architecture, std=0.5, positional="learned")
    generator = torch.Generator().manual_seed(3)
    rows = [torch.randint(3, VOCAB, (2 + i % 4,), generator=generator).tolist() for i in range(7)]
    config = DecodeConfig(beam=beam, extra_len=None, max_output_len=8)
    expected = _alone(model, rows, config)
    assert len({tuple(e[0][0]) for e in expected}) >= 5
    engine = Engine(model, config, sentences=2)
    results = {done.request: _seen(done) for done in engine.run(rows)}
    assert [results[i] for i in range(len(rows))] == expected


def test_a_table_reconfigured_for_another_search_of_its_width_decodes_as_alone():
    """The server keeps one table per beam, not per (beam, alpha): `configure` must leave
    nothing of the previous search behind."""
    model = small("encoder_decoder", std=0.5, tie_output=False)
    rows = _rows(sources(6, seed=3))
    first = DecodeConfig(**SETTINGS["beam"])
    engine = Engine(model, first, sentences=2)
    step = engine.step
    assert len(list(engine.run(rows[:3]))) == 3
    for settings in [SETTINGS["beam_heuristic"], dict(beam=3, alpha=2.0, nbest=3, extra_len=4)]:
        config = DecodeConfig(**settings)
        engine.configure(config)
        found = {done.request: _seen(done) for done in engine.run(rows)}
        assert [found[i] for i in sorted(found)] == _alone(model, rows, config)
    assert engine.step is step  # the same slots
    with pytest.raises(ValueError, match="3 slots per sentence; a config of 2"):
        engine.configure(DecodeConfig(beam=2))
    engine.submit(rows[0])
    with pytest.raises(ValueError, match="idle"):
        engine.configure(first)


def test_beam_reorder_moves_each_row_to_its_parents_keys_with_fewest_copies():
    generator = torch.Generator().manual_seed(4)
    k = 6
    parent = torch.randint(0, k, (50, k), generator=generator)  # 50 groups' new rows
    parent[0] = torch.tensor([0, 0, 1, 2, 3, 4])  # a child inserted at rank 1: a shift
    slots = torch.stack([torch.randperm(k, generator=generator) + 10 * k * g for g in range(50)])
    new, copied, parent_slots, replaced = _beam_slots(slots, parent)
    for g in range(50):
        own = slots[g].tolist()
        # a copied row takes the slot of a parent without children
        assert (slots[g][replaced[g][copied[g]]] == new[g][copied[g]]).all()
        assert not set(replaced[g][copied[g]].tolist()) & set(parent[g].tolist())
        assert sorted(new[g].tolist()) == sorted(own)  # the group's own slots, each once
        # a store whose slot s holds its row: copy as the engine does, then read each row's
        store = {s: row for row, s in enumerate(own)}
        moves = [(t, store[f]) for t, f, c in zip(new[g].tolist(), parent_slots[g].tolist(),
                                                  copied[g].tolist(), strict=True) if c]  # fmt: skip
        for target, held in moves:
            store[target] = held
        assert [store[s] for s in new[g].tolist()] == parent[g].tolist()
        # only rows past a parent's first child copy: K - distinct parents
        assert int(copied[g].sum()) == k - len(set(parent[g].tolist()))
        assert not set(new[g][copied[g]].tolist()) & set(parent_slots[g][copied[g]].tolist())
    assert copied[0].tolist() == [False, True, False, False, False, False]  # not 5 moves
    assert int(replaced[0, 1]) == 5  # the one row without a child


def test_copying_from_where_the_prefixes_differ_leaves_the_slots_as_whole_copies_do():
    # beam search with the engine's copies (from the first token where the slot's old
    # hypothesis and its new one's parent differ) against copies of whole prefixes: the
    # slots hold the same keys and values, bit for bit, at every step
    model = small("encoder_decoder", std=0.5, tie_output=False)
    config = DecodeConfig(beam=4, alpha=0.6, extra_len=6)
    rows = _rows(sources(4, seed=2))
    ranged, whole = Engine(model, config, 2), Engine(model, config, 2)

    ranged_copies, whole_copies = ranged.step.copy_ranges, whole.step.copy_ranges
    copied = []
    ranged.step.copy_ranges = lambda *args: (copied.append(args), ranged_copies(*args))
    whole.step.copy_ranges = lambda t, s, a, e: whole_copies(t, s, torch.zeros_like(a), e)
    for engine in (ranged, whole):
        for row in rows:
            engine.submit(row)
    outputs = {}
    while not ranged.idle:
        for engine in (ranged, whole):
            outputs.setdefault(id(engine), []).extend(_seen(d) for d in engine.advance())
        assert torch.equal(ranged.row_slot, whole.row_slot)
        for group in ranged.live.nonzero().view(-1).tolist():
            end = int(ranged.t[group] - 1)  # positions written so far
            slots = ranged.row_slot[group]
            for mine, theirs in zip(ranged.step.self_keys + ranged.step.self_values,
                                    whole.step.self_keys + whole.step.self_values,
                                    strict=True):  # fmt: skip
                assert torch.equal(mine[slots, :, :end], theirs[slots, :, :end])
    assert whole.idle and outputs[id(ranged)] == outputs[id(whole)]
    starts, ends = torch.cat([c[2] for c in copied]), torch.cat([c[3] for c in copied])
    assert int((ends - starts).sum()) < int(ends.sum())  # shared prefixes were not copied


def test_a_free_group_stands_at_position_0_so_the_step_attends_the_live_ones():
    model = small("encoder_decoder", std=0.5, tie_output=False)
    rows = _rows(sources(2, seed=5))
    engine = Engine(model, DecodeConfig(**SETTINGS["greedy"]), sentences=2)
    first = engine.submit(rows[0])
    engine.submit(rows[1])
    for _ in range(4):
        engine.advance()
    seen = []
    log_probs = engine.step.log_probs

    def spy(tokens, positions, **order):
        seen.append(positions.clone())
        return log_probs(tokens, positions, **order)

    engine.step.log_probs = spy
    assert engine.free_groups == 0  # both still decoding
    engine.cancel(first)  # group 0 leaves at step 5; group 1 goes on
    engine.advance()
    assert seen[0].tolist() == [0, 4]
    assert engine.step.source_ends.tolist() == [0, len(rows[1])]  # its source let go too


def test_sampling_runs_through_the_table_reproducibly():
    model = small("encoder_decoder", std=0.5)
    config = DecodeConfig(sampling=True, top_k=8, seed=2, extra_len=6)
    rows = _rows(sources(6, seed=2))

    def run() -> dict:
        return {d.request: d.hypotheses[0].tokens for d in Engine(model, config, 2).run(rows)}

    first = run()
    assert first == run() and sorted(first) == list(range(6))
    assert len({tuple(v) for v in first.values()}) >= 3


def test_a_cancelled_sentence_frees_its_group_and_others_go_on():
    model = small("encoder_decoder", std=0.5, tie_output=False)
    config = DecodeConfig(**SETTINGS["greedy"])
    rows = _rows(sources(3, seed=5))
    engine = Engine(model, config, sentences=1)
    first, second = engine.submit(rows[0]), engine.submit(rows[1])
    engine.advance()
    assert engine.cancel(first) and engine.free_groups == 1
    done = []
    while not engine.idle:
        done += engine.advance()
    assert [d.request for d in done] == [second]
    assert _seen(done[0]) == _alone(model, [rows[1]], config)[0]


def test_an_output_that_cannot_fit_the_slots_is_refused_at_submit():
    engine = Engine(small("encoder_decoder"), DecodeConfig(beam=1, extra_len=50), 2, max_target=10)
    with pytest.raises(ValueError, match="does not fit the slots' max_target=10"):
        engine.submit([5, 6, 2])
    assert engine.idle


# ----- aiayn translate through the engine ----------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_run(tmp_path_factory.mktemp("engine"))


def test_cli_translate_streams_a_file_through_the_slots_as_batches_translate_it(tmp_path, run):
    lines = [*sentences(9, seed=3), "", "river."]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "hyp.txt"
    args = ["-i", str(src), "-o", str(out), "--beam", "3", "--extra-len", "5"]
    result = CliRunner().invoke(app, ["translate", str(run), *args, "--continuous", "2"])
    assert result.exit_code == 0, result.output
    expected = Translator.load(run).translate(lines, beam=3, extra_len=5)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expected
    assert len(set(expected)) >= 5
    assert "11/11" in result.stderr  # the progress bar counts streamed sentences


def test_stream_ids_feeds_the_engine_longest_first(run, monkeypatch):
    import aiayn.apps.translate as translate

    submitted = []

    class Recording(Engine):
        def submit(self, ids):
            submitted.append(len(ids))
            return super().submit(ids)

    monkeypatch.setattr(translate, "Engine", Recording)
    translator = Translator.load(run)
    lines = sentences(7, seed=4)
    rows = translator.encode(lines)
    config = translator.decode_config(beam=2, extra_len=4)
    streamed = translator.stream_ids(rows, config, sentences=2)
    assert submitted == sorted((len(r) for r in rows), reverse=True)
    assert len(set(submitted)) >= 3
    batched = translator.translate_ids(rows, config)
    assert [[h.text for h in s] for s in streamed] == [[h.text for h in s] for s in batched]


def test_cli_translate_continuous_takes_no_negative_count(run):
    result = CliRunner().invoke(app, ["translate", str(run), "--continuous", "-1"], input="a.\n")
    assert result.exit_code != 0 and "--continuous" in result.output
    alone = CliRunner().invoke(app, ["translate", str(run), "--compile"], input="a.\n")
    assert alone.exit_code == 1 and "give --continuous N too" in alone.stderr
    assert alone.stderr.count("\n") == 1 and alone.stdout == ""
