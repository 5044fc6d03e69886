"""aiayn.inference.static_step: the decoding step of fixed shapes.

The step is checked against the literal model run on the whole sequence (teacher
forced, no cache), at every position, with slots standing at different positions; and
the search driving it (`StaticDecoder`) against today's search on the model itself,
token for token.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from typer.testing import CliRunner

from aiayn import ModelConfig, build_model, freeze
from aiayn.cli import app
from aiayn.data.tokenizer import TOKENIZER_FILE, train_tokenizer
from aiayn.inference.search import DecodeConfig, search
from aiayn.inference.static_step import StaticDecoder, StaticStep
from aiayn.io.checkpoint import save_model
from aiayn.models.encoder_decoder import normal_initialisation
from infer_helpers import sentences

VOCAB = 40
SETTINGS = dict(d_model=32, n_heads=4, d_ff=64, n_layers=2, max_len=24, dropout=0.0)
SCHEMES = ["sinusoidal", "learned", "rotary", "relative", "alibi"]


def small(architecture: str, std: float = 0.3, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny model of `architecture` with large random weights (varied outputs)."""
    preset = ModelConfig.tiny if architecture == "encoder_decoder" else ModelConfig.gpt
    cfg = preset(VOCAB, **{**SETTINGS, "architecture": architecture, **overrides})
    torch.manual_seed(seed)
    model = build_model(cfg).eval()
    normal_initialisation(model, std=std)
    return model


def sources(batch: int, seed: int = 1, pad: bool = True) -> torch.Tensor:
    """(batch, S) random sources ending in eos, padded to different lengths."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [5 + (i * 3) % 7 if pad else 8 for i in range(batch)]
    src = torch.zeros(batch, max(lengths), dtype=torch.long)
    for i, length in enumerate(lengths):
        src[i, : length - 1] = torch.randint(3, VOCAB, (length - 1,), generator=generator)
        src[i, length - 1] = 2
    return src


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_encoder_decoder_step_equals_the_literal_model_at_every_position(scheme):
    model = small("encoder_decoder", positional=scheme, n_kv_heads=2)
    batch, steps = 3, 12
    src = sources(batch)
    tgt = torch.randint(3, VOCAB, (batch, steps))
    tgt[:, 0] = model.cfg.bos_id
    with torch.no_grad():
        expected = model(src, tgt)  # (B, T, V), no cache
    step = StaticStep(model, slots=batch + 1, max_target=16)  # one slot stays empty
    slots = torch.tensor([2, 0, 3])
    step.load_source(slots, src)
    # sentence b starts b steps late: the slots stand at different positions
    for clock in range(steps + batch):
        tokens = torch.zeros(step.slots, dtype=torch.long)
        positions = torch.zeros(step.slots, dtype=torch.long)
        live = [b for b in range(batch) if 0 <= clock - b < steps]
        for b in live:
            tokens[slots[b]], positions[slots[b]] = tgt[b, clock - b], clock - b
        logits = step.logits(tokens, positions)
        for b in live:
            torch.testing.assert_close(
                logits[slots[b]], expected[b, clock - b], atol=1e-5, rtol=1e-5
            )


@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
@pytest.mark.parametrize("scheme", ["learned", "rotary", "alibi"])
def test_the_decoder_only_step_equals_the_literal_model_after_the_prompt(architecture, scheme):
    model = small(architecture, positional=scheme)
    batch, prompt_len, steps = 2, 5, 10
    ids = torch.randint(3, VOCAB, (batch, prompt_len + steps))
    ids[:, 2] = model.cfg.bos_id  # a prefix LM's separator: a bidirectional prefix of 3
    with torch.no_grad():
        expected = model(ids)  # (B, T, V)
    step = StaticStep(model, slots=batch)
    slots = torch.tensor([1, 0])
    first = step.load_prompt(slots, ids[:, :prompt_len])
    torch.testing.assert_close(first, expected[:, prompt_len - 1], atol=1e-5, rtol=1e-5)
    for t in range(prompt_len, prompt_len + steps - 1):
        tokens = torch.zeros(batch, dtype=torch.long)
        tokens[slots] = ids[:, t]
        logits = step.logits(tokens, torch.full((batch,), t))
        torch.testing.assert_close(logits[slots], expected[:, t], atol=1e-5, rtol=1e-5)


def _outputs(model, src, **settings) -> list[list[int]]:
    with torch.no_grad():
        return [hyps[0].tokens for hyps in search(model, src, DecodeConfig(**settings))]


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize(
    "settings",
    [dict(beam=1), dict(beam=4, alpha=0.6), dict(sampling=True, top_k=5, seed=3)],
    ids=["greedy", "beam", "sampling"],
)
def test_the_search_on_the_static_step_gives_todays_outputs(frozen, settings):
    model = small("encoder_decoder", std=0.5, tie_output=False, positional="rotary")
    model = freeze(model) if frozen else model
    src = sources(6, seed=4)
    expected = _outputs(model, src, extra_len=6, **settings)
    assert len({tuple(o) for o in expected}) >= 4  # several distinct outputs
    assert min(len(o) for o in expected) < max(len(o) for o in expected)
    static = StaticDecoder(model, slots=6 * settings.get("beam", 1) + 2)
    assert _outputs(static, src, extra_len=6, **settings) == expected


@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
def test_a_prompt_continued_on_the_static_step_gives_todays_outputs(architecture):
    model = small(architecture, std=0.5, positional="learned")
    prompt = torch.randint(3, VOCAB, (3, 4))
    prompt[:, 1] = model.cfg.bos_id
    settings = dict(extra_len=None, max_output_len=12)
    for beam in (1, 3):
        expected = _outputs(model, prompt, beam=beam, **settings)
        assert len({tuple(o) for o in expected}) == 3
        assert _outputs(StaticDecoder(model, slots=9), prompt, beam=beam, **settings) == expected


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int8])
def test_bf16_and_int8_weights_step_as_their_frozen_model_does(dtype):
    model = freeze(small("encoder_decoder", d_model=64, d_ff=256), dtype)
    src = sources(2, pad=False)
    tgt = torch.randint(3, VOCAB, (2, 8))
    tgt[:, 0] = model.cfg.bos_id
    with torch.no_grad():
        expected = model.decode(tgt, model.encode(src)).float()
    step = StaticStep(model, slots=2)
    step.load_source(torch.arange(2), src)
    tolerance = 5e-2 if dtype == torch.bfloat16 else 1e-4
    for t in range(tgt.size(1)):
        logits = step.logits(tgt[:, t], torch.full((2,), t)).float()
        torch.testing.assert_close(logits, expected[:, t], atol=tolerance, rtol=tolerance)


def test_what_the_step_refuses_is_named():
    with pytest.raises(ValueError, match="attends with SlidingWindowKernel"):
        StaticStep(small("encoder_decoder", attention="sliding_window"), slots=2)
    with pytest.raises(ValueError, match=r"max_target must lie in \[1, max_len=24\], got 30"):
        StaticStep(small("decoder_only"), slots=2, max_target=30)
    static = StaticDecoder(small("encoder_decoder"), slots=3)
    with pytest.raises(ValueError, match="2 sentences x beam 2 = 4 rows do not fit the step's 3"):
        static.start(sources(2), beam=2)


def test_aiayn_generate_on_the_static_step_writes_the_same_text(tmp_path):
    from test_generate import random_lm

    tokenizer = train_tokenizer(sentences(300), tmp_path / TOKENIZER_FILE, vocab_size=48)
    run = tmp_path / "run"
    save_model(random_lm(tokenizer.vocab_size, seed=2), run / "model.safetensors")
    shutil.copy(tmp_path / TOKENIZER_FILE, run / TOKENIZER_FILE)
    texts = []
    for extra in ([], ["--static"]):
        for prompt in ("house", "river tree garden"):
            args = ["generate", str(run), prompt, "--greedy", "--max-tokens", "12", *extra]
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 0, result.output
            texts.append(result.stdout)
    assert texts[:2] == texts[2:]
    assert texts[0] != texts[1] and len(texts[0]) > len("house\n")


@pytest.mark.slow
def test_the_compiled_step_equals_the_eager_one_with_packed_weights(monkeypatch):
    # AOTInductor, what the apps' --compile runs (torch.compile traces the same function;
    # one compilation is all the suite pays: about 30 s on 2 cores)
    # every product of the frozen model packed by oneDNN (opaque to the compiler: the
    # step compiles their plain copies), as a base model's are
    monkeypatch.setattr("aiayn.inference.frozen_products.PACK_MIN_ELEMENTS", 1)
    model = freeze(small("encoder_decoder", positional="rotary"))
    assert model.output.packed is not None
    src = sources(2)
    tgt = torch.randint(3, VOCAB, (2, 6))  # tgt[:, t] is a strided view: as the search's
    tgt[:, 0] = model.cfg.bos_id
    eager, compiled = StaticStep(model, slots=2), StaticStep(model, slots=2)
    for step in (eager, compiled):
        step.load_source(torch.arange(2), sources(2, seed=9))
    assert compiled.compile(log_probs=True, ahead_of_time=True) > 0
    for step in (eager, compiled):  # another source after compiling: read, not baked in
        step.load_source(torch.arange(2), src)
    for t in range(tgt.size(1)):
        positions = torch.full((2,), t)
        expected = eager.log_probs(tgt[:, t], positions)
        torch.testing.assert_close(compiled.log_probs(tgt[:, t], positions), expected)


def test_an_eager_step_over_the_first_slots_or_written_positions_equals_the_full_step():
    model = small("encoder_decoder", positional="relative")  # a score bias to cut too
    src = sources(3)
    full, trimmed = (StaticStep(model, slots=5, max_target=16) for _ in range(2))
    full.trim = False  # every slot, every position: the fixed shapes a compiled step keeps
    for step in (full, trimmed):
        step.load_source(torch.tensor([0, 1, 2]), src)
    for t in range(6):
        tokens = torch.randint(3, VOCAB, (5,))
        positions = torch.full((5,), t)
        expected = full.logits(tokens, positions)  # (5, V)
        got = trimmed.logits(tokens[:3], positions[:3])  # the first 3 slots, positions <= t
        assert got.shape == (3, VOCAB)
        torch.testing.assert_close(got, expected[:3], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="takes all 5 slots"):
        full.logits(tokens[:3], positions[:3])  # fixed shapes: all slots or none


def test_an_eager_step_attends_no_further_than_the_sources_of_the_slots_it_runs():
    model = small("encoder_decoder")
    src = sources(3)  # 5, 8 and 11 tokens
    full, trimmed = (StaticStep(model, slots=4, max_target=8) for _ in range(2))
    full.trim = False
    for step in (full, trimmed):
        step.load_source(torch.tensor([0, 1, 2]), src)
    assert trimmed.source_ends.tolist() == [5, 8, 11, 0]
    tokens, positions = torch.randint(3, VOCAB, (4,)), torch.zeros(4, dtype=torch.long)
    expected = full.logits(tokens, positions)
    trimmed.release(torch.tensor([2]))  # the longest source leaves
    assert trimmed.source_ends.tolist() == [5, 8, 0, 0]
    for values in trimmed.cross_values:  # what lies past the 8th source position: unread
        values[:, :, 8:] = float("nan")
    got = trimmed.logits(tokens[:3], positions[:3])
    assert bool(got.isfinite().all())  # the released slot attends junk, never NaN
    torch.testing.assert_close(got[:2], expected[:2], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", ["rotary", "alibi"])
def test_slots_grouped_by_source_step_as_slots_each_with_their_own(scheme):
    model = small("encoder_decoder", positional=scheme, n_kv_heads=2)
    src = sources(2)
    alone = StaticStep(model, slots=6, max_target=10)
    grouped = StaticStep(model, slots=6, max_target=10, group=3)
    for step in (alone, grouped):
        step.load_source(torch.tensor([3, 4, 5, 0, 1, 2]), src, beam=3)
    assert grouped.cross_keys[0].size(0) == 2  # a source stored once per group
    for t in range(5):  # every slot its own hypothesis and position
        tokens = torch.randint(3, VOCAB, (6,))
        positions = torch.tensor([t, t, max(t - 1, 0), t, 0, t])
        torch.testing.assert_close(
            grouped.logits(tokens, positions), alone.logits(tokens, positions),
            atol=1e-5, rtol=1e-5,
        )  # fmt: skip
    with pytest.raises(ValueError, match="one group of 3 consecutive slots"):
        grouped.load_source(torch.tensor([0, 1, 3]), src[:1], beam=3)
    with pytest.raises(ValueError, match="give 3 slots per sentence, not 1"):
        grouped.load_source(torch.tensor([0]), src[:1])
    with pytest.raises(ValueError, match="group must be >= 1 and divide slots=6"):
        StaticStep(model, slots=6, group=4)


def test_each_span_of_slots_attends_no_further_than_its_own_furthest_position(monkeypatch):
    import aiayn.inference.slot_attention as slot_attention

    monkeypatch.setattr(slot_attention, "SPAN_COST", 0)  # a call per span of like positions
    model = small("encoder_decoder", positional="relative")
    full, spans = (StaticStep(model, slots=4, max_target=8) for _ in range(2))
    full.trim = False
    for step in (full, spans):
        step.load_source(torch.arange(4), sources(4))
    for t in range(5):  # slots 0-1 stay at position 1; 2-3 go on to 4
        tokens, positions = torch.randint(3, VOCAB, (4,)), torch.tensor([1, 1, t, t]).clamp(max=t)
        expected = full.logits(tokens, positions)
        if t == 4:  # past slots 0-1's position 1: never read for them
            for store in (*spans.self_keys, *spans.self_values):
                store[:2, :, 2:] = float("nan")
        torch.testing.assert_close(spans.logits(tokens, positions), expected, atol=1e-5, rtol=1e-5)


def test_copy_ranges_copies_each_slots_own_positions_only():
    step = StaticStep(small("encoder_decoder"), slots=6, max_target=10)
    for store in (*step.self_keys, *step.self_values):
        store.copy_(torch.randn(store.shape))
    before = [store.clone() for store in (*step.self_keys, *step.self_values)]
    targets, sources_ = torch.tensor([0, 4, 5]), torch.tensor([1, 2, 2])
    starts, ends = torch.tensor([3, 0, 6]), torch.tensor([7, 2, 6])  # the last: nothing
    step.copy_ranges(targets, sources_, starts, ends)
    for store, old in zip((*step.self_keys, *step.self_values), before, strict=True):
        expected = old.clone()
        expected[0, :, 3:7] = old[1, :, 3:7]
        expected[4, :, 0:2] = old[2, :, 0:2]
        assert torch.equal(store, expected)


def test_slot_groups_share_an_attention_call_while_that_costs_less_than_another_call(
    monkeypatch,
):
    import aiayn.inference.slot_attention as slot_attention

    monkeypatch.setattr(slot_attention, "SPAN_COST", 10)
    # groups of 2 slots: joining the third (end 9) to ends 3, 3 would attend 2 x 2 x 6
    # more positions than apart (24 > 10); the fourth (end 8) adds 2 x 1 = 2 < 10
    assert slot_attention.merged([3, 3, 9, 8], rows=2) == [(0, 2, 3), (2, 4, 9)]
    assert slot_attention.merged([3, 3, 4], rows=2) == [(0, 3, 4)]  # 2 x 2 x 1 = 4 < 10
    monkeypatch.setattr(slot_attention, "SPAN_COST", 100)
    assert slot_attention.merged([3, 3, 9, 8], rows=2) == [(0, 4, 9)]


def test_an_eager_step_projects_only_the_slots_asked_for_in_their_order():
    model = small("encoder_decoder")
    step = StaticStep(model, slots=4, max_target=8)
    step.load_source(torch.arange(4), sources(4))
    tokens, positions = torch.randint(3, VOCAB, (4,)), torch.zeros(4, dtype=torch.long)
    everything = step.log_probs(tokens, positions)
    order = torch.tensor([2, 0, 3])
    calls = []
    project = step._project
    step._project = lambda hidden: (calls.append(hidden.size(0)), project(hidden))[1]
    got = step.log_probs(tokens, positions, order=order)
    assert calls == [3]  # three rows onto the vocabulary, not four
    torch.testing.assert_close(got, everything[order], atol=1e-6, rtol=1e-6)
