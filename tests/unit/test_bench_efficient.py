"""benchmarks/bench_efficient.py: the per-kernel summary over seeds, the baselines that
read no context and the conversion to bits per character, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.data.lm import prepare_lm_text
from aiayn.data.prepare import PrepareConfig
from benchmarks.bench_efficient import (
    KERNEL_SETTINGS,
    KERNELS,
    LRA_LISTOPS,
    TASKS,
    bits_per_character,
    first_token_share,
    majority_share,
    naive_bayes_share,
    pieces_per_character,
    summarise,
    unigram_bpc,
)


def run(kernel: str, seed: int, accuracy: float, peak: float = 100.0) -> dict:
    return dict(kernel=kernel, seed=seed, test_accuracy=accuracy, best_valid_accuracy=None,
                tokens_per_s=None, peak_mib=peak, steps=10)  # fmt: skip


def test_the_summary_gives_each_kernels_mean_and_sample_std_in_the_kernels_order():
    runs = [run("linear", 0, 20.0), run("sdpa", 0, 30.0), run("sdpa", 1, 40.0)]
    runs += [run("sdpa", 2, 20.0, peak=400.0)]
    summary = summarise(runs)
    assert list(summary) == ["sdpa", "linear"]  # KERNELS' order, not the runs'
    sdpa = summary["sdpa"]
    assert sdpa["seeds"] == [0, 1, 2]
    assert sdpa["test_accuracy"] == pytest.approx(30.0)
    # sample std: sqrt(((30-30)^2 + (40-30)^2 + (20-30)^2) / (3 - 1)) = 10
    assert sdpa["test_accuracy_std"] == pytest.approx(10.0)
    assert sdpa["peak_mib"] == pytest.approx(200.0)
    assert sdpa["peak_mib_std"] == pytest.approx(math.sqrt((100**2 + 100**2 + 200**2) / 2))
    assert summary["linear"]["test_accuracy_std"] == 0.0  # one seed
    assert "best_valid_accuracy" not in sdpa  # never measured: absent, not 0


def test_every_kernel_has_its_settings_and_its_lra_counterpart():
    assert set(KERNEL_SETTINGS) == set(KERNELS) == set(LRA_LISTOPS)
    assert LRA_LISTOPS["sdpa"] == ("Transformer", 36.37)  # Tay et al. 2021, Table 1


def test_every_task_runs_only_kernels_that_have_its_form():
    assert TASKS["listops"].kernels == KERNELS
    assert "bigbird" not in TASKS["charlm"].kernels  # no causal form
    assert {t.metric for t in TASKS.values()} == {"accuracy", "bpc"}


def write_split(root, split: str, rows: list[tuple[str, str]]) -> None:
    (root / f"{split}.text").write_text("".join(f"{t}\n" for t, _ in rows), encoding="utf-8")
    (root / f"{split}.label").write_text("".join(f"{c}\n" for _, c in rows), encoding="utf-8")


def test_the_first_token_baseline_answers_each_first_words_commonest_training_class(tmp_path):
    train = [("[MAX 1 9 ]", "9"), ("[MAX 9 2 ]", "9"), ("[MAX 3 4 ]", "4"), ("[MIN 0 5 ]", "0")]
    write_split(tmp_path, "train", train)
    test = [("[MAX 8 9 ]", "9"), ("[MIN 0 7 ]", "0"), ("[MIN 3 4 ]", "3"), ("[SM 1 2 ]", "3")]
    write_split(tmp_path, "test", test)
    # MAX -> 9 (2 of 3), MIN -> 0; SM never starts a training text: no answer, wrong
    assert first_token_share(tmp_path, "test") == pytest.approx(100 * 2 / 4)
    assert majority_share(tmp_path, "test") == pytest.approx(50.0)  # 9, 0, 3, 3: "3" twice


def test_the_unigram_baseline_is_the_cross_entropy_of_the_training_characters(tmp_path):
    (tmp_path / "train.en").write_text("aab\n", encoding="utf-8")  # a 2, b 1, newline 1
    (tmp_path / "test.en").write_text("ab\nc", encoding="utf-8")  # c unseen: counted once
    total = 4 + 1
    bits = -(math.log2(2 / total) + math.log2(1 / total) + math.log2(1 / total))
    bits -= math.log2(1 / total)
    assert unigram_bpc(tmp_path, "test") == pytest.approx(bits / 4)


def test_bits_per_character_count_each_documents_word_start_piece_and_eos(tmp_path):
    text = tmp_path / "train.txt"
    text.write_text("the river\nthe stone bridge\nan old road\n" * 20, encoding="utf-8")
    valid = tmp_path / "valid.txt"
    valid.write_text("the road\nan old stone\n", encoding="utf-8")
    config = PrepareConfig(vocab_size=200, model_type="char")
    prepare_lm_text(text, tmp_path / "lm", "en", valid=valid, config=config)
    # "the road": 1 word-start piece + 8 characters + eos = 10 pieces for 8 + 1 characters;
    # "an old stone": 1 + 12 + 1 = 14 pieces for 13 characters
    assert pieces_per_character(tmp_path / "lm", "valid") == pytest.approx(24 / 22)
    assert bits_per_character(math.log(2), tmp_path / "lm", "valid") == pytest.approx(24 / 22)


def test_naive_bayes_counts_character_ngrams_with_add_one_smoothing(tmp_path):
    write_split(tmp_path, "train", [("abab", "x"), ("cdcd", "y"), ("abcd", "y")])
    # bigrams: x {ab 2, ba 1}; y {cd 3, dc 1, ab 1, bc 1}; 5 distinct, so x's
    # denominator is 3 + 5, y's 6 + 5; priors 1/3, 2/3
    write_split(tmp_path, "test", [("aba", "x"), ("ab", "y")])
    # "aba": x: log 1/3 + log 3/8 + log 2/8 = -3.47; y: log 2/3 + log 2/11 + log 1/11 = -4.51
    # "ab":  x: log 1/3 + log 3/8 = -2.08;         y: log 2/3 + log 2/11 = -2.11: x, wrong
    assert naive_bayes_share(tmp_path, "test", n=2) == pytest.approx(50.0)
    write_split(
        tmp_path, "test", [("dc", "y")]
    )  # y: log 2/3 + log 2/11 beats x's log 1/3 + log 1/8
    assert naive_bayes_share(tmp_path, "test", n=2) == pytest.approx(100.0)


def test_the_cpu_char_lm_is_causal_and_its_window_is_smaller_than_its_context():
    from benchmarks.bench_efficient import recipe_context

    task = TASKS["charlm-cpu"]
    assert task.kernels == TASKS["charlm"].kernels
    window = task.kernel_settings("sliding_window")
    assert window == ["model.attention_options={window: 32, global_tokens: 0}"]
    assert 32 < recipe_context(task.recipe) == 256
    assert task.kernel_settings("performer") == KERNEL_SETTINGS["performer"]  # not changed
    assert TASKS["charlm"].kernel_settings("sliding_window") == KERNEL_SETTINGS["sliding_window"]


def test_position_buckets_double_from_the_position_that_reads_one_character():
    from benchmarks.bench_efficient import bucket_names, position_edges

    assert position_edges(256) == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert position_edges(6) == [0, 1, 2, 4, 6]  # the last bucket is cut at the length
    assert position_edges(2) == [0, 1, 2]
    assert bucket_names([0, 1, 2, 4, 6]) == ["0", "1", "2–3", "4–5"]


class KnownLosses(torch.nn.Module):
    """A model whose loss at position t is known by hand: its logits give id 0 the
    score t and every other id 0, whatever it reads."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        logits = torch.zeros(B, T, self.vocab)
        logits[:, :, 0] = torch.arange(T, dtype=torch.float32)
        return logits


def test_the_loss_by_position_averages_each_position_over_the_blocks_by_hand():
    from benchmarks.bench_efficient import bits_by_bucket, nats_by_position

    V, T = 5, 4
    # 6 blocks of T + 1 ids (split 4 + 2 by nats_by_position): half predict id 0 at
    # every position, half id 3
    blocks = torch.tensor([[1, 0, 0, 0, 0]] * 3 + [[2, 3, 3, 3, 3]] * 3)
    nats = nats_by_position(KnownLosses(V), blocks, "cpu")
    # at position t: -log p(0) = log(e^t + 4) - t, -log p(3) = log(e^t + 4)
    hand = [(math.log(math.e**t + 4) - t + math.log(math.e**t + 4)) / 2 for t in range(T)]
    assert nats.tolist() == pytest.approx(hand)
    ratio = 1.25  # pieces per character
    bits = bits_by_bucket(nats, [0, 1, 2, 4], ratio)
    expect = [hand[0], hand[1], (hand[2] + hand[3]) / 2]
    assert bits == pytest.approx([n * ratio / math.log(2) for n in expect])


def test_the_summary_averages_the_loss_by_position_over_seeds():
    runs = [run("sdpa", seed, 0.0) for seed in (0, 1)]
    for r, curve in zip(runs, ([3.0, 2.0], [4.0, 1.0]), strict=True):
        r["test_bpc_by_position"] = {"edges": [0, 1, 2], "bpc": curve}
    by_position = summarise(runs)["sdpa"]["test_bpc_by_position"]
    assert by_position == {"edges": [0, 1, 2], "bpc": [3.5, 1.5]}
