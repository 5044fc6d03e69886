"""Monolingual text for the decoder-only and encoder-only shapes: corpora, packing, batches.

A monolingual corpus directory (written by `aiayn prepare lm ...`) is a prepared
corpus (`aiayn.data.corpus.PreparedCorpus`) whose source and target language are the
same code, so every reader of corpus.json still works:

    train.{lang} valid.{lang} test.{lang}   one document (a verse, a line) per line
    spm.model    the subword model, with "[CLS]", "[SEP]" and "[MASK]" as pieces of
                 their own (ids right after unk) for BERT-style runs
    stats.json   documents and tokens per split, the settings, the source
    corpus.json  {"src_lang": lang, "tgt_lang": lang, "kind": "monolingual", ...}

Training sequences are *packed*: every document of a split, each followed by eos, is
one id stream cut into blocks of one length, so no position of a batch is padding
(`pack`). `SequenceBatches` serves blocks (or any id sequences) in token-budget
batches, shuffled per epoch and sharded by rank as `TokenBatcher` does, and hands each
batch a NumPy generator seeded by (seed, epoch, batch): draws made from it (BERT's
masking) are the same in a resumed run as in an uninterrupted one, with nothing to save.

Shape legend: B batch, T sequence length.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from aiayn.data import bible
from aiayn.data.batching import TokenBatcher
from aiayn.data.corpus import SPLITS, STATS_FILE, PreparedCorpus
from aiayn.data.files import check_output, read_lines, write_fresh_dir
from aiayn.data.prepare import (
    BIBLE_VOCAB_SIZE,
    PrepareConfig,
    _one_line,
    _token_counts,
    special_ids,
    train_corpus_tokenizer,
    write_corpus,
)
from aiayn.data.tokenizer import TOKENIZER_FILE, Tokenizer

log = logging.getLogger(__name__)

CLS, SEP, MASK = "[CLS]", "[SEP]", "[MASK]"
SYMBOLS = (CLS, SEP, MASK)  # user-defined pieces of every monolingual subword model
MONOLINGUAL = "monolingual"


# ----- a monolingual corpus ---------------------------------------------------------


def is_monolingual(corpus: PreparedCorpus) -> bool:
    """Whether `corpus` came from `aiayn prepare lm` (one language on both sides)."""
    return corpus.src_lang == corpus.tgt_lang


def read_documents(corpus: PreparedCorpus, split: str) -> list[str]:
    """The documents of `split` of a monolingual corpus, one per line.

    Raises:
        ValueError: `corpus` is a parallel corpus (the message says how to make one).
    """
    if not is_monolingual(corpus):
        raise ValueError(
            f"{corpus.root} is a parallel corpus ({corpus.src_lang}-{corpus.tgt_lang}); "
            "language modelling needs a monolingual one: aiayn prepare lm bible --lang "
            f"{corpus.src_lang} OUT, or aiayn prepare lm text FILE OUT"
        )
    path = corpus.files(split)[0]
    return read_lines(path) if path.is_file() else []


def symbol_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """The ids of "[CLS]", "[SEP]" and "[MASK]" in `tokenizer`, found by piece.

    Raises:
        ValueError: one of them is not a piece of its own (the subword model was not
            made by `aiayn prepare lm`).
    """
    wanted = set(SYMBOLS)
    found = {}
    for token_id in range(tokenizer.vocab_size):
        piece = tokenizer.id_to_piece(token_id)
        if piece in wanted:
            found[piece] = token_id
            if len(found) == len(wanted):
                return found
    missing = ", ".join(s for s in SYMBOLS if s not in found)
    raise ValueError(
        f"the subword model {tokenizer.path} has no piece {missing}: prepare the corpus "
        "with aiayn prepare lm, which adds them"
    )


@dataclass
class DocumentStats:
    """What one split of a monolingual corpus became."""

    documents: int = 0
    tokens: int = 0
    tokens_per_document: float = 0.0
    tokens_max: int = 0
    dropped_empty: int = 0


def prepare_monolingual(
    splits: dict[str, Sequence[str]],
    out: str | Path,
    lang: str,
    config: PrepareConfig | None = None,
    source: dict | None = None,
    *,
    inputs: Sequence[str | Path] = (),
    force: bool = False,
) -> PreparedCorpus:
    """Clean, tokenize and write a monolingual corpus directory.

    Empty documents are dropped (and counted); a line break inside one becomes a
    space. Nothing else is filtered: a long document is simply cut across blocks
    when packed. The subword model (`config.vocab_size` pieces, the three `SYMBOLS`
    among them) is trained on the training split only. The directory is written
    whole, as `prepare_corpus` writes it: a refusal or a failure leaves no partial
    `out`.

    Args:
        splits: documents for "train" (required), "valid" and "test".
        out: the directory to write, whole (`aiayn.data.files.write_fresh_dir`).
        lang: the language code, the files' suffix.
        config: vocabulary size, model type, sample size and seed (its length
            filters do not apply).
        source: where the documents came from, recorded in stats.json.
        inputs: the files the documents were read from: `out` may not be, lie inside
            or hold any of them.
        force: replace an `out` that exists and holds something (a corpus included).

    Raises:
        ValueError: no training documents, an unknown split, an empty code, a
            vocabulary sentencepiece cannot train, or an `out` refused (naming why).
        aiayn.data.files.WriteFailed: (an OSError) the system refused a write to `out`.
    """
    started = time.perf_counter()
    config = config or PrepareConfig()
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown splits {sorted(unknown)}; expected some of {SPLITS}")
    if not lang or "/" in lang:
        raise ValueError(f"need a language code for the file suffix, got {lang!r}")
    cleaned: dict[str, list[str]] = {}
    stats = {name: DocumentStats() for name in SPLITS}
    for name in SPLITS:
        documents = [_one_line(d) for d in splits.get(name, [])]
        cleaned[name] = [d for d in documents if d]
        stats[name].dropped_empty = len(documents) - len(cleaned[name])
    if not cleaned["train"]:
        raise ValueError("no training documents left after dropping empty ones")

    out = Path(out)

    def fill(tmp: Path) -> None:
        what = f"{len(cleaned['train'])} training documents"
        tokenizer = train_corpus_tokenizer(
            cleaned["train"], tmp, config, what, user_defined_symbols=SYMBOLS
        )
        for name in SPLITS:
            counts = _token_counts(tokenizer, cleaned[name], f"{name}.{lang}")
            split = stats[name]
            split.documents, split.tokens = len(counts), sum(counts)
            if counts:
                split.tokens_per_document = round(statistics.fmean(counts), 2)
                split.tokens_max = max(counts)
        summary = {
            "kind": MONOLINGUAL,
            "lang": lang,
            "source": source or {},
            "config": asdict(config),
            "vocab_size": tokenizer.vocab_size,
            "special_ids": {**special_ids(tokenizer), **symbol_ids(tokenizer)},
            "splits": {name: asdict(stats[name]) for name in SPLITS},
            "seconds": round(time.perf_counter() - started, 2),
        }
        corpus = {
            "kind": MONOLINGUAL,
            "src_lang": lang,
            "tgt_lang": lang,
            "tokenizer": TOKENIZER_FILE,
            "splits": {name: [f"{name}.{lang}"] for name in SPLITS},
            "stats": STATS_FILE,
        }
        files = {f"{name}.{lang}": cleaned[name] for name in SPLITS}
        write_corpus(tmp, tokenizer, files, summary, corpus)

    write_fresh_dir(inputs, out, fill, force)
    log.info(
        "wrote %s: %s documents (train / valid / test)",
        out,
        " / ".join(f"{stats[name].documents:,}" for name in SPLITS),
    )
    return PreparedCorpus.load(out)


def prepare_lm_bible(
    out: str | Path,
    lang: str,
    english: bible.EnglishSource = bible.EnglishSource.WEB,
    config: PrepareConfig | None = None,
    root: Path = bible.SWORD_ROOT,
    force: bool = False,
) -> PreparedCorpus:
    """One side of the built-in Bible corpus: "en" (WEB or KJV) or "es" (RV1909).

    The verses and the train / valid / test chapters are exactly those of the
    parallel corpus (`aiayn.data.prepare.prepare_bible`), so a model trained here
    has read none of the translation test set. See `prepare_monolingual` for `out`
    and `force`.

    Raises:
        ValueError: `lang` is neither "en" nor "es", or `out` is refused.
        bible.SwordModuleMissing: the Debian packages are not installed.
    """
    sides = {"en": 0, "es": 1}
    if lang not in sides:
        raise ValueError(f"--lang must be en or es, got {lang!r}")
    check_output(out, "OUT", directory=True, force=force)  # before reading
    config = config or PrepareConfig(vocab_size=BIBLE_VOCAB_SIZE)
    english = bible.EnglishSource(english)
    aligned = bible.load_bible(english, root)
    assignment = bible.split_by_chapter(aligned.refs)
    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    for pair, name in zip(aligned.pairs, assignment, strict=True):
        splits[name].append(pair[sides[lang]])
    module = bible.MODULES[english][0] if lang == "en" else bible.SPANISH_MODULE[0]
    source = {"kind": "bible", "lang": lang, "module": module, "split": "by chapter, as parallel"}
    return prepare_monolingual(splits, out, lang, config, source, force=force)


def prepare_lm_text(
    train: str | Path,
    out: str | Path,
    lang: str,
    valid: str | Path | None = None,
    test: str | Path | None = None,
    config: PrepareConfig | None = None,
    force: bool = False,
) -> PreparedCorpus:
    """Plain UTF-8 text files, one document per line (invalid UTF-8 is named by file
    and line). See `prepare_monolingual` for `out` and `force`."""
    files = {"train": train, "valid": valid, "test": test}
    inputs = [path for path in files.values() if path is not None]
    check_output(out, "OUT", directory=True, reads=inputs, force=force)  # before reading
    splits = {name: read_lines(path) for name, path in files.items() if path is not None}
    source = {"kind": "text", "files": {n: str(f) for n, f in files.items() if f is not None}}
    config = config or PrepareConfig()
    return prepare_monolingual(splits, out, lang, config, source, inputs=inputs, force=force)


# ----- packing ----------------------------------------------------------------------


@dataclass(frozen=True)
class Packed:
    """Blocks cut from one id stream.

    Attributes:
        blocks: the blocks, each `length` ids long.
        stream_tokens: ids in the stream (documents and their eos).
        left_out: ids at the stream's end that fill no whole block.
    """

    blocks: list[list[int]]
    stream_tokens: int
    left_out: int


def pack(documents: Sequence[Sequence[int]], eos_id: int, length: int, overlap: int = 0) -> Packed:
    """Concatenate documents, each followed by eos, and cut the stream into blocks.

    Consecutive blocks share `overlap` ids: a language model reads block[:-1] and
    predicts block[1:], so with `overlap=1` every id of the stream but the first is a
    target exactly once. The ids after the last whole block are left out (fewer than
    `length - overlap`), so no block holds padding.

    Raises:
        ValueError: `length` < 2 or `overlap` not in [0, length).
    """
    if length < 2 or not 0 <= overlap < length:
        raise ValueError(f"need length >= 2 and 0 <= overlap < length, got {length}, {overlap}")
    stream = [token for doc in documents for token in (*doc, eos_id)]
    step = length - overlap
    blocks = [stream[i : i + length] for i in range(0, len(stream) - length + 1, step)]
    used = len(blocks) * step + overlap if blocks else 0
    return Packed(blocks, len(stream), len(stream) - used)


# ----- batches ----------------------------------------------------------------------


@dataclass
class TokenBatch:
    """One batch of a single-stream model: inputs, and the labels its loss reads.

    Attributes:
        inputs: (B, T) ids the network reads, padded with pad_id.
        labels: (B, T) the id each position must predict, or pad_id where nothing is
            predicted (padding, a source, an unmasked MLM position).
        n_targets: positions with a label, the loss's denominator.
    """

    inputs: Tensor
    labels: Tensor
    n_targets: int

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch on `device`."""
        return TokenBatch(
            self.inputs.to(device, non_blocking=True),
            self.labels.to(device, non_blocking=True),
            self.n_targets,
        )


def padded(rows: Sequence[Sequence[int]], pad_id: int) -> Tensor:
    """(B, T) ids, rows right-padded with `pad_id` to the longest."""
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


MakeBatch = Callable[[list[Sequence[int]], np.random.Generator], TokenBatch]


class SequenceBatches:
    """Token-budget batches of id sequences, each made into a `TokenBatch` by a task.

    Batching, the per-epoch shuffle and the sharding are `TokenBatcher`'s (a batch
    holds B sequences with B * (longest + 1) <= max_tokens; each epoch shuffles the
    batch order by (seed, epoch); rank r takes every world_size-th batch). Each batch
    is made by `make(sequences, rng)`, where `rng` is seeded by (seed, epoch, the
    batch's first sequence index): the same batch of the same epoch gets the same
    draws, however the run was interrupted and resumed.

    Args:
        sequences: the id sequences (packed blocks, or prompt + target sequences).
        make: sequences of a batch and its generator -> the batch.
        max_tokens: the budget of a batch's padded positions.
        pad_id: what `padding_fraction` counts as padding.
        seed, rank, world_size, shuffle: as for `TokenBatcher`.
    """

    def __init__(
        self,
        sequences: Sequence[Sequence[int]],
        make: MakeBatch,
        max_tokens: int,
        pad_id: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
    ) -> None:
        self.sequences, self.make, self.seed = sequences, make, seed
        # TokenBatcher budgets (len + 1) per side: give it each sequence less one id
        shorter = [range(len(s) - 1) for s in sequences]
        self.order = TokenBatcher(
            list(zip(shorter, shorter, strict=True)), max_tokens, pad_id, pad_id, pad_id,
            seed=seed, rank=rank, world_size=world_size, shuffle=shuffle,
        )  # fmt: skip

    def __len__(self) -> int:
        """Batches per epoch on this rank (the same on every rank)."""
        return len(self.order)

    def epoch(self, epoch: int, skip: int = 0) -> Iterator[TokenBatch]:
        """This rank's batches of `epoch` after the first `skip` (see `TokenBatcher.epoch`)."""
        if not 0 <= skip <= len(self):
            raise ValueError(f"skip must lie in [0, {len(self)}], got {skip}")
        return self._batches(epoch, self.order.batch_indices(epoch)[skip:])

    def _batches(self, epoch: int, indices: list[list[int]]) -> Iterator[TokenBatch]:
        for batch in indices:
            rng = np.random.default_rng([self.seed, epoch, batch[0]])
            yield self.make([self.sequences[i] for i in batch], rng)

    def padding_fraction(self) -> float:
        """Share of padding among one epoch's input positions: 0 for packed blocks.

        A batch's inputs are its sequences less their last id, as a next-token model
        reads them (for blocks of one length the share is 0 however it is counted).
        """
        real = total = 0
        for batch in self.order.batches:
            lengths = [len(self.sequences[i]) - 1 for i in batch]
            real += sum(lengths)
            total += len(lengths) * max(lengths)
        return 1.0 - real / total
