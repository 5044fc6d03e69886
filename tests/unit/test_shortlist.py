"""The output shortlist: its table (counted by hand), its file, and decoding over it."""

from __future__ import annotations

import pytest
import torch

from aiayn import ModelConfig, Transformer
from aiayn.inference.decoding import start as start_decoding
from aiayn.inference.frozen import freeze
from aiayn.inference.search import TokenRules, beam_search, greedy_search, next_log_probs
from aiayn.inference.shortlist import (
    Shortlist,
    Shortlisted,
    ShortlistedDecoding,
    build,
    read_parallel,
    recall,
)

V, EOS = 16, 2
# Sentence pairs: source pieces 5, 6, 7; target pieces 10, 11, 12.
SRC = [[5, 6], [5, 7], [5, 6]]
TGT = [[10, 11], [10, 12], [10, 11, 11]]


def hand_shortlist(min_count: int = 1) -> Shortlist:
    return build(SRC, TGT, V, EOS, frequent=1, per_source=2, min_count=min_count)


def test_build_counts_by_hand():
    # token counts: 10 x3, 11 x3 (the tie goes to the lower id), 12 x1 -> frequent {10}
    # p(t|s) over non-frequent t: s=5: 11 in 2 of 3 pairs, 12 in 1 of 3; s=6: 11 in 2/2;
    # s=7: 12 in 1/1.
    short = hand_shortlist()
    assert short.frequent.tolist() == [10]
    assert short.table[5].tolist() == [11, 12]
    assert short.table[6].tolist() == [11, -1]
    assert short.table[7].tolist() == [12, -1]
    assert (short.table[[0, 1, 2, 8, 15]] == -1).all()
    strict = hand_shortlist(min_count=2)  # 12 co-occurs with 5 and 7 once only
    assert strict.table[5].tolist() == [11, -1] and strict.table[7].tolist() == [-1, -1]


def test_candidates_union_with_eos_and_extra():
    short = hand_shortlist()
    assert short.candidates(torch.tensor([[6, 0], [7, 2]])).tolist() == [EOS, 10, 11, 12]
    assert short.candidates([6], extra=(9,)).tolist() == [EOS, 9, 10, 11]
    empty = Shortlist(torch.zeros(0, dtype=torch.long), torch.full((V, 0), -1), EOS)
    assert empty.candidates([5, 6]).tolist() == [EOS]  # eos is never dropped
    with pytest.raises(ValueError, match="outside the shortlist's vocabulary of 16"):
        short.candidates([16])


def test_recall_by_hand():
    short = hand_shortlist()  # source 7 -> {eos, 10, 12}; source 6 -> {eos, 10, 11}
    assert recall(short, [[7], [6]], [[12, 11, 10], [11, 13]]) == pytest.approx(3 / 5)


def test_build_rejects_bad_input():
    with pytest.raises(ValueError, match="different numbers of lines"):
        build([[5]], [[10], [11]], V, EOS)
    with pytest.raises(ValueError, match="target line 2: ids span"):
        build([[5], [5]], [[10], [99]], V, EOS)


def test_save_load_round_trip_and_corrupt_files(tmp_path):
    short = hand_shortlist()
    path = short.save(tmp_path / "s.safetensors")
    back = Shortlist.load(path, vocab_size=V)
    assert torch.equal(back.frequent, short.frequent) and torch.equal(back.table, short.table)
    assert back.eos_id == EOS
    with pytest.raises(ValueError, match="vocabulary of 16, but the model has 17"):
        Shortlist.load(path, vocab_size=17)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    with pytest.raises(ValueError, match=r"bad\.safetensors: not a valid shortlist file"):
        Shortlist.load(bad)
    truncated = tmp_path / "cut.safetensors"
    truncated.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ValueError, match=r"cut\.safetensors: not a valid shortlist file"):
        Shortlist.load(truncated)
    with pytest.raises(FileNotFoundError, match="no shortlist file"):
        Shortlist.load(tmp_path / "missing.safetensors")


def test_read_parallel_names_file_and_line(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.es"
    src.write_text("one\ntwo\nthree\n")
    tgt.write_text("uno\ndos\n")
    with pytest.raises(ValueError, match=r"a\.es:3: the file ends here"):
        read_parallel(src, tgt)
    tgt.write_bytes(b"uno\nd\xffos\ntres\n")
    with pytest.raises(ValueError, match=r"a\.es:2: invalid UTF-8"):
        read_parallel(src, tgt)


# ----- decoding -----------------------------------------------------------------------


def tiny_model(vocab: int = 40, dtype=torch.float32, **overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig.tiny(vocab_size=vocab, max_len=40, **overrides)
    return Transformer(cfg).to(dtype).eval()


def random_src(vocab: int = 40) -> torch.Tensor:
    torch.manual_seed(1)
    src = torch.randint(4, vocab, (3, 7))
    src[:, -1] = EOS
    src[1, 4:] = 0  # padding
    src[1, 3] = EOS
    return src


def every_piece(vocab: int) -> Shortlist:
    return Shortlist(torch.arange(vocab), torch.full((vocab, 1), -1), EOS)


def restricted(vocab: int = 40) -> Shortlist:
    table = torch.full((vocab, 2), -1)
    table[4:, 0] = (torch.arange(4, vocab) * 7) % vocab
    table[4:, 1] = (torch.arange(4, vocab) * 3 + 1) % vocab
    return Shortlist(torch.tensor([5, 9, 17]), table, EOS)


class _AlwaysGather(Shortlisted):
    """Gathers the candidates' rows even when they are every piece."""

    def start(self, src, beam=1):
        ids = self.shortlist.candidates(src, self.forced_ids)
        return ShortlistedDecoding(self, src, beam, ids)


def outputs(hypotheses):
    return [[h.tokens for h in hyps] for hyps in hypotheses]


@pytest.mark.parametrize("frozen", [False, True])
def test_every_piece_decodes_as_the_full_model(frozen):
    model = tiny_model()
    engine = freeze(model) if frozen else model
    short = Shortlisted(engine, every_piece(40))
    src = random_src()
    assert outputs(greedy_search(short, src, 10)) == outputs(greedy_search(engine, src, 10))
    assert outputs(beam_search(short, src, 4, nbest=2, extra_len=10)) == outputs(
        beam_search(engine, src, 4, nbest=2, extra_len=10)
    )


def test_every_piece_gathered_matches_in_float64():
    # the gathered product's path, over all pieces: same hypotheses and scores
    model = tiny_model(dtype=torch.float64, output_bias=True)
    with torch.no_grad():
        model.output_bias.normal_()
    engine = freeze(model)
    gathered = _AlwaysGather(engine, every_piece(40))
    src = random_src()
    for run in (
        lambda m: greedy_search(m, src, 10),
        lambda m: beam_search(m, src, 3, nbest=3, extra_len=10),
    ):
        ours, full = run(gathered), run(engine)
        assert outputs(ours) == outputs(full)
        for a, b in zip(ours, full, strict=True):
            assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-9)


@pytest.mark.parametrize("fallback", [False, True])
def test_restricted_set_logits_and_outputs(fallback):
    model = tiny_model(output_bias=True)
    with torch.no_grad():
        model.output_bias.normal_()
    engine = freeze(model)
    short = Shortlisted(engine, restricted())
    if fallback:  # as for an output layer without a float weight (int8)
        short.weight_t = short.bias = None
    src = random_src()
    allowed = restricted().candidates(src)
    assert 3 < allowed.numel() < 40
    outside = torch.ones(40, dtype=torch.bool)
    outside[allowed] = False

    ours, full = short.start(src, beam=2), start_decoding(engine, src, beam=2)
    last = torch.full((6,), model.cfg.bos_id)
    for _ in range(4):
        got, want = ours.step(last), full.step(last)
        torch.testing.assert_close(got[:, allowed], want[:, allowed], atol=1e-5, rtol=1e-5)
        assert torch.isneginf(got[:, outside]).all()
        rows = torch.tensor([1, 0, 3, 3, 5, 4])  # a beam reorder
        ours.keep(rows)
        full.keep(rows)
        last = allowed[torch.arange(6) % allowed.numel()]

    for hyps in greedy_search(short, src, 12) + beam_search(short, src, 4, nbest=4, extra_len=12):
        for h in hyps:
            assert set(h.tokens) <= set(allowed.tolist())


def test_forced_eos_and_forced_tokens_survive():
    model = tiny_model()
    engine = freeze(model)
    nothing = Shortlist(torch.zeros(0, dtype=torch.long), torch.full((40, 1), -1), EOS)
    short = Shortlisted(engine, nothing, forced_ids=(7,))
    src = random_src()
    decoding = short.start(src)
    finite = torch.isfinite(decoding.step(torch.full((3,), model.cfg.bos_id)))
    assert finite.nonzero()[:, 1].unique().tolist() == [EOS, 7]
    # at the longest output only eos may follow, with log-probability 0 (forced)
    rules = TokenRules(free_forced_eos=True)
    for hyps in greedy_search(short, src, None, max_output_len=3, rules=rules):
        assert set(hyps[0].tokens) <= {7} and len(hyps[0].tokens) <= 2
    decoding = short.start(src)
    at_limit = torch.ones(3, dtype=torch.bool)
    log_probs = next_log_probs(model.cfg, decoding, torch.full((3,), 1), rules, at_limit)
    assert (log_probs[:, EOS] == 0).all()


def test_translator_takes_a_shortlist_file(tmp_path):
    from aiayn.apps.translate import Translator
    from infer_helpers import make_run, sentences

    run = make_run(tmp_path / "run")
    plain = Translator.load(run)
    vocab = plain.model.cfg.vocab_size
    path = every_piece(vocab).save(tmp_path / "all.safetensors")
    texts = sentences(4)
    assert Translator.load(run, shortlist=path).translate(texts, beam=2) == plain.translate(
        texts, beam=2
    )
    with pytest.raises(ValueError, match="vocabulary of 16, but the model has"):
        Translator.load(run, shortlist=hand_shortlist().save(tmp_path / "small.safetensors"))


def test_prepare_writes_the_training_splits_shortlist(tmp_path):
    import random

    from aiayn.data.prepare import PrepareConfig, PreparedCorpus, prepare_corpus
    from aiayn.data.tokenizer import SentencePieceTokenizer
    from train_helpers import word_pairs

    rng = random.Random(0)
    splits = {"train": word_pairs(200, rng), "valid": word_pairs(5, rng)}
    prepare_corpus(splits, tmp_path / "c", "en", "de", PrepareConfig(vocab_size=40))
    corpus = PreparedCorpus.load(tmp_path / "c")
    tokenizer = SentencePieceTokenizer.load(corpus.tokenizer_path)
    saved = Shortlist.load(tmp_path / "c" / "shortlist.safetensors", tokenizer.vocab_size)
    train = corpus.read("train")
    expected = build(
        tokenizer.encode_batch([s for s, _ in train]),
        tokenizer.encode_batch([t for _, t in train]),
        tokenizer.vocab_size,
        tokenizer.eos_id,
        exclude=[tokenizer.pad_id, tokenizer.bos_id],
    )
    assert torch.equal(saved.frequent, expected.frequent)
    assert torch.equal(saved.table, expected.table)
    assert saved.eos_id == tokenizer.eos_id


def _marian_tokenizer_dir(path):
    """source.spm, target.spm and vocab.json as a Marian directory holds them (eos 0)."""
    import json

    from aiayn.data.tokenizer import train_tokenizer

    en = ["the cat sat", "a dog ran", "the red house", "a small cat ran"] * 30
    de = ["die katze sass", "ein hund lief", "das rote haus", "eine kleine katze lief"] * 30
    source = train_tokenizer(en, path / "src.model", vocab_size=30)
    target = train_tokenizer(de, path / "tgt.model", vocab_size=30)
    (path / "source.spm").write_bytes((path / "src.model").read_bytes())
    (path / "target.spm").write_bytes((path / "tgt.model").read_bytes())
    pieces = ["</s>", "<unk>"]
    for tok in (source, target):
        pieces += [tok.id_to_piece(i) for i in range(4, tok.vocab_size)]
    pieces = [*dict.fromkeys(pieces), "<pad>"]
    (path / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(pieces)}))
    return en, de


def test_cli_builds_a_marian_shortlist_with_the_target_model(tmp_path):
    from typer.testing import CliRunner

    from aiayn.cli import app
    from aiayn.io.marian import MarianTokenizer

    model_dir = tmp_path / "opus"
    model_dir.mkdir()
    en, de = _marian_tokenizer_dir(model_dir)
    (tmp_path / "x.en").write_text("\n".join(en) + "\n")
    (tmp_path / "x.de").write_text("\n".join(de) + "\n")
    out = tmp_path / "s.safetensors"
    args = ["shortlist", "build", str(model_dir), "--source", str(tmp_path / "x.en")]
    args += ["--target", str(tmp_path / "x.de"), "--out", str(out), "--frequent", "2"]
    result = CliRunner().invoke(app, [*args, "--per-source", "3"])
    assert result.exit_code == 0, result.output
    tokenizer = MarianTokenizer(model_dir)
    saved = Shortlist.load(out, tokenizer.vocab_size)
    assert saved.eos_id == tokenizer.eos_id == 0
    target_ids = [  # the target side through target.spm, by hand
        [tokenizer.piece_to_id[p] for p in tokenizer.target.EncodeAsPieces(t)] for t in de
    ]
    expected = build(
        tokenizer.encode_batch(en),
        target_ids,
        tokenizer.vocab_size,
        0,
        frequent=2,
        per_source=3,
        exclude=[tokenizer.pad_id],
    )
    assert torch.equal(saved.table, expected.table)
    assert torch.equal(saved.frequent, expected.frequent)

    (tmp_path / "x.de").write_text("\n".join(de[:-1]) + "\n")
    result = CliRunner().invoke(app, [*args, "--per-source", "3"])
    assert result.exit_code == 1
    assert f"x.de:{len(de)}: the file ends here" in result.output
