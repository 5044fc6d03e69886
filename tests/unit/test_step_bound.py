"""The bytes one decoding step must read (benchmarks/bench_step_bound.py, issue 44 item 1),
against a count by hand and against the tensors a frozen model holds; and the report's
table of the bound (from a hand-made results file)."""

from __future__ import annotations

import json

import pytest
import torch

from aiayn import ModelConfig, Transformer, freeze
from benchmarks import report as bench_report
from benchmarks.bench_step_bound import precision_of, step_bytes
from benchmarks.report import bound, verdicts


def test_a_tiny_steps_bytes_by_hand():
    """D 4, F 8, one layer, V 10; 2 rows at position 2 (3 cached positions), S 3.

    fp32, in floats: self-attention QKV 12 x 4 + 12 = 60, W^O 16 + 4 = 20; cross W^Q 20,
    W^O 20; FFN 8 x 4 + 8 = 40 and 4 x 8 + 4 = 36; three norms 3 x 2 x 4 = 24: 220
    floats, 880 bytes. Output 10 x 4 + 10 = 50 floats, 200 bytes. Self cache: 2 rows x
    (K, V) x 3 positions x 4 x 4 B = 192; cross cache: 2 sentences x 2 x 3 x 4 x 4 B =
    192; embeddings: 2 rows x (token, position) x 4 x 4 B = 64. In all 1,528.
    """
    parts = step_bytes(4, 8, 1, 10, "fp32", rows=2, position=2, src_len=3)
    assert parts == {
        "weights": 880,
        "output": 200,
        "self_cache": 192,
        "cross_cache": 192,
        "embeddings": 64,
        "total": 1528,
    }


def test_int8_counts_a_byte_per_weight_and_a_float_scale_per_channel():
    """QKV: 48 B + 12 scales x 4 + 12 biases x 4 = 144; W^O 16 + 16 + 16 = 48; cross
    W^Q 48, W^O 48; FFN 32 + 32 + 32 = 96 and 32 + 16 + 16 = 64; norms 96 (float): 544.
    Output 40 + 40 + 40 = 120. Caches and embeddings as in float32."""
    parts = step_bytes(4, 8, 1, 10, "int8", rows=2, position=2, src_len=3)
    assert parts["weights"] == 544 and parts["output"] == 120
    assert parts["total"] == 544 + 120 + 192 + 192 + 64


def test_beams_share_their_sentences_cross_cache_and_layers_multiply():
    beam = step_bytes(4, 8, 1, 10, "fp32", rows=8, position=2, src_len=3, sentences=2)
    assert beam["self_cache"] == 8 * 2 * 3 * 4 * 4 and beam["cross_cache"] == 192
    two = step_bytes(4, 8, 2, 10, "fp32", rows=2, position=2, src_len=3)
    assert two["weights"] == 2 * 880 and two["output"] == 200
    assert two["self_cache"] == 2 * 192 and two["cross_cache"] == 2 * 192
    with pytest.raises(ValueError, match="fp32 or int8, got 'bf16'"):
        step_bytes(4, 8, 1, 10, "bf16", rows=1, position=0, src_len=1)


def test_the_weights_are_what_a_frozen_decoder_holds_less_cross_attentions_kv():
    torch.manual_seed(0)
    model = Transformer(ModelConfig.tiny(vocab_size=40, d_model=32, d_ff=64, dropout=0.0))
    frozen = freeze(model.eval())
    held = 0
    for layer in frozen.decoder.layers:
        products = [layer.self_attn.qkv_proj, layer.self_attn.out_proj]
        products += [layer.cross_attn.q_proj, layer.cross_attn.out_proj]
        products += [layer.feed_forward.linear1, layer.feed_forward.linear2]
        held += sum(p.weight_t.nbytes + p.bias.nbytes for p in products)
        norms = [m for m in layer.modules() if isinstance(m, torch.nn.LayerNorm)]
        held += sum(p.nbytes for norm in norms for p in norm.parameters())
    parts = step_bytes(32, 64, len(frozen.decoder.layers), 40, "fp32", 1, 0, 1)
    assert parts["weights"] == held
    # the output projection: V x D (this model has no output bias; Marian's has V floats)
    assert parts["output"] == frozen.output.weight_t.nbytes + 40 * 4


def test_a_ct2_systems_precision_is_in_its_name():
    assert precision_of("ct2-int8", "fp32") == "int8"
    assert precision_of("compiled", "int8") == "int8"


BOUND = {
    "date": "2026-11-27 15:00",
    "machine": "test cpu",
    "cpu_flags": ["avx2", "avx512f"],
    "versions": {"torch": "2.13"},
    "commit": "abc1234",
    "command": "python -m benchmarks.bench_step_bound --threads 1",
    "args": {"threads": "1", "position": 15, "src_len": 30, "array_mib": 512},
    "last_level_cache_bytes": 32 << 20,
    "bounds": [
        dict(size="small", precision="fp32", slots=1, threads=1, dram_gb_s=14.0,
             at_size_gb_s=24.0, bound_ms=1.4, at_size_bound_ms=0.8, fits_in_llc=True,
             bytes=dict(weights=11e6, output=8.2e6, self_cache=0.1e6, cross_cache=0.2e6,
                        embeddings=2048, total=19.6e6)),
    ],
    "steps": [
        dict(size="small", precision="fp32", slots=1, threads=1, system="cache",
             ms_per_step=2.8, times_bound=2.0, times_at_size_bound=3.5),
        dict(size="small", precision="fp32", slots=1, threads=1, system="ct2-fp32",
             ms_per_step=0.7, times_bound=0.5, times_at_size_bound=0.875),
    ],
}  # fmt: skip


def test_the_bound_table_gives_bytes_bandwidth_and_each_systems_multiple(monkeypatch):
    monkeypatch.setattr(bench_report, "load", lambda name: BOUND)
    text = bound.step_bound()
    assert "| small | fp32 | 1 | 19.6 | 14.0 | 1.40 | yes | 0.80 |" in text
    assert "| small | fp32 | 1 | aiayn, cached step | 2.80 | 2.00x | 3.50x |" in text
    assert "| small | fp32 | 1 | CTranslate2 fp32 | 0.70 | 0.50x | 0.88x |" in text
    assert "position 15" in text and "512 MiB arrays" in text and "32 MiB" in text


def test_the_step_goal_takes_aiayns_fastest_step_at_batch_1_against_the_bound_at_its_size(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(bench_report, "RESULTS", tmp_path)
    assert verdicts.step_bound_goals() == []  # not measured until the quiet run writes it
    one = dict(size="small", slots=1, threads=1, times_bound=9.0)  # the DRAM bound: not read
    steps = [
        dict(one, precision="fp32", system="cache", times_at_size_bound=3.5),
        dict(one, precision="fp32", system="aoti", times_at_size_bound=1.2),
        dict(one, precision="fp32", system="ct2-fp32", times_at_size_bound=0.9),  # not aiayn
        dict(one, precision="fp32", system="static", slots=32, times_at_size_bound=1.0),
        dict(one, precision="fp32", system="static", size="base", times_at_size_bound=2.0),
        dict(one, precision="int8", system="static", times_at_size_bound=1.3),
    ]
    (tmp_path / "step-bound.json").write_text(json.dumps({**BOUND, "steps": steps}))
    goals = {g.name: g for g in verdicts.step_bound_goals()}
    fp32, int8 = goals["step-bound-fp32"], goals["step-bound-int8"]
    assert fp32.values == (2.0, 1.2)  # base, small: each shape's fastest aiayn step
    assert fp32.met is False and fp32.goal_text() == "≤ 1.3x"
    assert int8.values == (1.3,) and int8.met is True  # at the goal: within it
    assert fp32.files == ("step-bound",) and fp32.precision == "fp32"
    # a newer machine's file: its cells replace the older file's, the rest stay
    newer = [dict(one, precision="fp32", system="aoti", size="base", times_at_size_bound=1.1)]
    xeon = {**BOUND, "date": "2099-01-01 00:00", "steps": newer}
    (tmp_path / "step-bound-xeon.json").write_text(json.dumps(xeon))
    goals = {g.name: g for g in verdicts.step_bound_goals()}
    fp32, int8 = goals["step-bound-fp32"], goals["step-bound-int8"]
    assert fp32.values == (1.1, 1.2) and fp32.met is True
    assert fp32.files == ("step-bound-xeon", "step-bound") and int8.files == ("step-bound",)
