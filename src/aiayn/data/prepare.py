"""Build a prepared corpus directory from any source (see `aiayn.data.corpus`).

Each source (the Bible, aligned text files, TSV, a Hugging Face dataset) is read into
(source, target) pairs per split; `prepare_corpus` then

1. drops empty or whitespace-only pairs (every split),
2. trains one shared sentencepiece model on a bounded sample of the training text,
3. drops training pairs longer than `max_tokens` subwords on either side, or whose
   longer side has more than `max_ratio` times the tokens of the shorter one
   (validation and test keep every non-empty pair, so scores stay comparable),
4. writes the whole directory `out` at once (`aiayn.data.files.write_fresh_dir`): it is
   filled under a temporary name and renamed when whole, so a refusal or a failure
   leaves no partial `out`. An `out` that holds something is replaced only with
   `force`, and never one that is, lies inside or holds an input file.

Every drop is counted by reason in stats.json.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from aiayn.config import check_seed
from aiayn.data import bible
from aiayn.data.corpus import (
    CORPUS_FILE,
    SPLITS,
    STATS_FILE,
    PreparedCorpus,
    read_parallel,
    read_tsv,
)
from aiayn.data.files import check_output, lines_text, strict_json, write_fresh_dir
from aiayn.data.tokenizer import (
    TOKENIZER_FILE,
    SentencePieceTokenizer,
    Tokenizer,
    train_tokenizer,
)

log = logging.getLogger(__name__)

Pairs = list[tuple[str, str]]

# The Bible (WEB / RV1909, ~31k verse pairs; 24.1 English and 22.6 Spanish words a
# verse), measured tokens per verse with a shared BPE model of
#     4,000 pieces: 34.1 en / 34.7 es     8,000: 31.3 / 31.2     16,000: 29.7 / 28.9
# 8,000 is where the curve flattens: doubling it saves only 5-7% of the tokens but
# halves the training examples per piece (each piece's embedding is seen about 240
# times per epoch at 8,000), which matters on a corpus this small.
BIBLE_VOCAB_SIZE = 8000
WMT_VOCAB_SIZE = 37000  # section 5.1: a shared source-target vocabulary of about 37,000
MODEL_TYPES = ("bpe", "unigram", "char")  # sentencepiece's model types a corpus may use
SHORTLIST_MAX_PAIRS = 300_000  # training pairs counted for the output shortlist


@dataclass(frozen=True)
class PrepareConfig:
    """How a corpus is filtered and tokenized.

    Args:
        vocab_size: pieces in the shared subword vocabulary (specials included).
        model_type: "bpe" (the paper's byte-pair encoding), "unigram", or "char" (one
            piece per character, for character-level models; `vocab_size` is then
            an upper bound).
        max_tokens: longest training sentence kept, in subwords, on either side.
        max_ratio: largest ratio of the longer to the shorter side, in subwords,
            for a training pair (pairs whose shorter side has fewer than
            `ratio_min_tokens` tokens are exempt: "Amen." / "Amén." is fine).
        ratio_min_tokens: see `max_ratio`.
        sample_size: at most this many sentences train the subword model.
        seed: fixes that sample.
    """

    vocab_size: int = WMT_VOCAB_SIZE
    model_type: str = "bpe"
    max_tokens: int = 256
    max_ratio: float = 3.0
    ratio_min_tokens: int = 4
    sample_size: int = 2_000_000
    seed: int = 0

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ValueError(f"PrepareConfig.vocab_size must be at least 8, got {self.vocab_size}")
        if self.max_tokens < 1:
            raise ValueError(f"PrepareConfig.max_tokens must be positive, got {self.max_tokens}")
        if not self.max_ratio >= 1.0:  # nan too; inf keeps every pair
            raise ValueError(f"PrepareConfig.max_ratio must be at least 1, got {self.max_ratio}")
        check_seed(self.seed, "PrepareConfig.seed")
        if self.model_type not in MODEL_TYPES:
            raise ValueError(
                f"PrepareConfig.model_type must be one of {', '.join(MODEL_TYPES)}, "
                f"got {self.model_type!r}"
            )


@dataclass
class SplitStats:
    """What one split became: pairs written, their tokens, and what was dropped."""

    pairs: int = 0
    src_tokens: int = 0
    tgt_tokens: int = 0
    src_tokens_per_sentence: float = 0.0
    tgt_tokens_per_sentence: float = 0.0
    src_tokens_max: int = 0
    tgt_tokens_max: int = 0
    dropped: dict[str, int] = field(
        default_factory=lambda: {"empty": 0, "too_long": 0, "length_ratio": 0}
    )


def _one_line(text: str) -> str:
    # a line break inside a sentence (possible in a dataset) would break the alignment
    return text.replace("\r", " ").replace("\n", " ").strip()


def drop_empty(pairs: Sequence[tuple[str, str]]) -> tuple[Pairs, int]:
    """Pairs with text on both sides, and how many went.

    Surrounding whitespace is removed and line breaks inside a sentence become spaces.
    """
    kept = [(_one_line(s), _one_line(t)) for s, t in pairs]
    kept = [(s, t) for s, t in kept if s and t]
    return kept, len(pairs) - len(kept)


def length_filter(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    config: PrepareConfig,
) -> tuple[list[int], dict[str, int]]:
    """Indices of the pairs within the length and ratio limits, and drop counts.

    Lengths are in subwords, without specials. A pair over the length limit is
    counted as "too_long" only, even if its ratio is also out of range.
    """
    keep, too_long, ratio = [], 0, 0
    for i, (n, m) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        if max(n, m) > config.max_tokens:
            too_long += 1
        elif min(n, m) >= config.ratio_min_tokens and max(n, m) > config.max_ratio * min(n, m):
            ratio += 1
        else:
            keep.append(i)
    return keep, {"too_long": too_long, "length_ratio": ratio}


def _token_counts(
    tokenizer: Tokenizer, texts: list[str], what: str, chunk: int = 20_000
) -> list[int]:
    # only the counts are kept: WMT14's 4.5M pairs as lists of ids would need gigabytes
    counts: list[int] = []
    with tqdm(total=len(texts), desc=f"encode {what}", unit="sent", disable=None) as bar:
        for start in range(0, len(texts), chunk):
            part = texts[start : start + chunk]
            counts.extend(map(len, tokenizer.encode_batch(part)))
            bar.update(len(part))
    return counts


def special_ids(tokenizer: SentencePieceTokenizer) -> dict[str, int]:
    """The special ids a corpus's stats.json records."""
    return {
        "pad_id": tokenizer.pad_id,
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "unk_id": tokenizer.unk_id,
    }


def write_corpus(
    out: Path,
    tokenizer: SentencePieceTokenizer,
    files: dict[str, Sequence[str]],
    summary: dict,
    corpus: dict,
) -> None:
    """Write a computed corpus into the fresh directory `out` (the temporary of
    `aiayn.data.files.write_fresh_dir`): the subword model (unless it is there already),
    the text files (name -> lines), stats.json (`summary`) and corpus.json (`corpus`)."""
    if tokenizer.path.resolve() != (out / TOKENIZER_FILE).resolve():
        (out / TOKENIZER_FILE).write_bytes(tokenizer.path.read_bytes())
    for name, lines in files.items():
        (out / name).write_text(lines_text(lines), encoding="utf-8")
    (out / STATS_FILE).write_text(strict_json(summary, ensure_ascii=False), encoding="utf-8")
    (out / CORPUS_FILE).write_text(strict_json(corpus), encoding="utf-8")


def train_corpus_tokenizer(
    texts: list[str], directory: Path, config: PrepareConfig, what: str, **options
) -> SentencePieceTokenizer:
    """The corpus's subword model, trained on `texts` into `directory`.

    Raises:
        ValueError: sentencepiece refused (a vocabulary too large for the text), saying
            what to change.
    """
    try:
        return train_tokenizer(
            texts,
            directory / TOKENIZER_FILE,
            vocab_size=config.vocab_size,
            model_type=config.model_type,
            sample_size=config.sample_size,
            seed=config.seed,
            **options,
        )
    except RuntimeError as err:  # sentencepiece: e.g. "Vocabulary size too high"
        raise ValueError(
            f"cannot train a {config.vocab_size}-piece subword model on {what}: {err}; "
            "try a smaller --vocab-size"
        ) from None


def prepare_corpus(
    splits: dict[str, Sequence[tuple[str, str]]],
    out: str | Path,
    src_lang: str,
    tgt_lang: str,
    config: PrepareConfig | None = None,
    source: dict | None = None,
    *,
    inputs: Sequence[str | Path] = (),
    force: bool = False,
) -> PreparedCorpus:
    """Filter, tokenize and write a corpus directory.

    Args:
        splits: pairs for "train" (required), "valid" and "test" (may be empty).
        out: the directory to write, whole (`aiayn.data.files.write_fresh_dir`).
        src_lang, tgt_lang: language codes, the file suffixes.
        config: vocabulary and filters (default: `PrepareConfig()`).
        source: where the pairs came from, with counts dropped before this step;
            recorded in stats.json.
        inputs: the files the pairs were read from: `out` may not be, lie inside or
            hold any of them.
        force: replace an `out` that exists and holds something.

    Returns:
        The prepared corpus.

    Raises:
        ValueError: no training pairs, an unknown split, equal language codes, a
            vocabulary sentencepiece cannot train, or an `out` refused (naming why).
        aiayn.data.files.WriteFailed: (an OSError) the system refused a write to `out`.
    """
    started = time.perf_counter()
    config = config or PrepareConfig()
    unknown = set(splits) - set(SPLITS)
    if unknown:
        raise ValueError(f"unknown splits {sorted(unknown)}; expected some of {SPLITS}")
    if src_lang == tgt_lang or not src_lang or not tgt_lang:
        raise ValueError(f"need two different language codes, got {src_lang!r} and {tgt_lang!r}")
    out = Path(out)
    stats = {name: SplitStats() for name in SPLITS}
    cleaned: dict[str, Pairs] = {}
    for name in SPLITS:
        cleaned[name], stats[name].dropped["empty"] = drop_empty(splits.get(name, []))
    if not cleaned["train"]:
        raise ValueError("no training pairs left after dropping empty ones")

    def fill(tmp: Path) -> None:
        texts = [s for s, _ in cleaned["train"]] + [t for _, t in cleaned["train"]]
        what = f"{len(cleaned['train'])} training pairs"
        tokenizer = train_corpus_tokenizer(texts, tmp, config, what)

        kept: dict[str, Pairs] = {}
        for name in SPLITS:
            pairs = cleaned[name]
            src_n = _token_counts(tokenizer, [s for s, _ in pairs], f"{name}.{src_lang}")
            tgt_n = _token_counts(tokenizer, [t for _, t in pairs], f"{name}.{tgt_lang}")
            if name == "train":
                keep, dropped = length_filter(src_n, tgt_n, config)
                stats[name].dropped.update(dropped)
                pairs = [pairs[i] for i in keep]
                src_n = [src_n[i] for i in keep]
                tgt_n = [tgt_n[i] for i in keep]
            split = stats[name]
            split.pairs = len(pairs)
            split.src_tokens, split.tgt_tokens = sum(src_n), sum(tgt_n)
            if pairs:
                split.src_tokens_per_sentence = round(statistics.fmean(src_n), 2)
                split.tgt_tokens_per_sentence = round(statistics.fmean(tgt_n), 2)
                split.src_tokens_max, split.tgt_tokens_max = max(src_n), max(tgt_n)
            kept[name] = pairs

        summary = {
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "source": source or {},
            "config": asdict(config),
            "vocab_size": tokenizer.vocab_size,
            "special_ids": special_ids(tokenizer),
            "splits": {name: asdict(stats[name]) for name in SPLITS},
            "seconds": round(time.perf_counter() - started, 2),
        }
        corpus = {
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "tokenizer": TOKENIZER_FILE,
            "splits": {name: [f"{name}.{src_lang}", f"{name}.{tgt_lang}"] for name in SPLITS},
            "stats": STATS_FILE,
        }
        _write_shortlist(tmp, tokenizer, kept["train"])
        files = {}
        for name, pairs in kept.items():
            files[f"{name}.{src_lang}"] = [s for s, _ in pairs]
            files[f"{name}.{tgt_lang}"] = [t for _, t in pairs]
        write_corpus(tmp, tokenizer, files, summary, corpus)

    write_fresh_dir(inputs, out, fill, force)
    log.info(
        "prepared %s: %s",
        out,
        ", ".join(f"{name} {stats[name].pairs} pairs" for name in SPLITS),
    )
    return PreparedCorpus.load(out)


def _write_shortlist(out: Path, tokenizer: SentencePieceTokenizer, train: Pairs) -> None:
    """Write the output shortlist (`aiayn.data.shortlist`) of the training pairs into `out`.

    At most `SHORTLIST_MAX_PAIRS` pairs are counted, evenly spaced over the split.
    """
    from aiayn.data.shortlist import SHORTLIST_FILE, build, vocabulary_digest

    step = max(1, -(-len(train) // SHORTLIST_MAX_PAIRS))
    sample = train[::step]
    log.info("counting the shortlist's translations on %d training pairs", len(sample))
    shortlist = build(
        tokenizer.encode_batch([s for s, _ in sample]),
        tokenizer.encode_batch([t for _, t in sample]),
        tokenizer.vocab_size,
        tokenizer.eos_id,
        exclude=sorted({tokenizer.pad_id, tokenizer.bos_id}),
        vocabulary_sha256=vocabulary_digest(tokenizer),  # of the spm.model written beside it
    )
    shortlist.save(out / SHORTLIST_FILE)
    log.info("wrote %s (%r)", out / SHORTLIST_FILE, shortlist)


# ----- sources ----------------------------------------------------------------------


def prepare_bible(
    out: str | Path,
    english: bible.EnglishSource = bible.EnglishSource.WEB,
    config: PrepareConfig | None = None,
    root: Path = bible.SWORD_ROOT,
    force: bool = False,
) -> PreparedCorpus:
    """The built-in corpus: English (WEB or KJV) to Spanish (RV1909), split by chapter;
    see `prepare_corpus` for `out` and `force`.

    Raises:
        bible.SwordModuleMissing: the Debian packages are not installed.
    """
    check_output(out, "OUT", directory=True, force=force)  # before reading
    config = config or PrepareConfig(vocab_size=BIBLE_VOCAB_SIZE)
    english = bible.EnglishSource(english)
    aligned = bible.load_bible(english, root)
    assignment = bible.split_by_chapter(aligned.refs)
    splits: dict[str, Pairs] = {name: [] for name in SPLITS}
    chapters: dict[str, set] = {name: set() for name in SPLITS}
    for ref, pair, name in zip(aligned.refs, aligned.pairs, assignment, strict=True):
        splits[name].append(pair)
        chapters[name].add(f"{ref.book} {ref.chapter}")
    source = {
        "kind": "bible",
        "english": english.value,
        "modules": [bible.MODULES[english][0], bible.SPANISH_MODULE[0]],
        "aligned_pairs": len(aligned.pairs),
        "dropped_in_alignment": aligned.dropped,
        "shifted_chapters_dropped": aligned.shifted_chapters,
        "held_out_chapters": {name: sorted(chapters[name]) for name in ("valid", "test")},
    }
    return prepare_corpus(splits, out, "en", "es", config, source, force=force)


def prepare_text(
    train: tuple[str | Path, str | Path],
    out: str | Path,
    src_lang: str,
    tgt_lang: str,
    valid: tuple[str | Path, str | Path] | None = None,
    test: tuple[str | Path, str | Path] | None = None,
    config: PrepareConfig | None = None,
    force: bool = False,
) -> PreparedCorpus:
    """Aligned plain text files, one sentence per line (fairseq / OpenNMT style); see
    `prepare_corpus` for `out` and `force`."""
    files = {"train": train, "valid": valid, "test": test}
    inputs = [path for paths in files.values() if paths for path in paths]
    check_output(out, "OUT", directory=True, reads=inputs, force=force)  # before reading
    splits = {name: read_parallel(*paths) for name, paths in files.items() if paths}
    source = {"kind": "text", "files": {n: [str(p) for p in f] for n, f in files.items() if f}}
    config = config or PrepareConfig()
    return prepare_corpus(
        splits, out, src_lang, tgt_lang, config, source, inputs=inputs, force=force
    )


def prepare_tsv(
    train: str | Path,
    out: str | Path,
    src_lang: str,
    tgt_lang: str,
    valid: str | Path | None = None,
    test: str | Path | None = None,
    config: PrepareConfig | None = None,
    force: bool = False,
) -> PreparedCorpus:
    """Files of two tab-separated columns: source, then target; see `prepare_corpus` for
    `out` and `force`."""
    files = {"train": train, "valid": valid, "test": test}
    inputs = [path for path in files.values() if path]
    check_output(out, "OUT", directory=True, reads=inputs, force=force)  # before reading
    splits = {name: read_tsv(path) for name, path in files.items() if path}
    source = {"kind": "tsv", "files": {n: str(f) for n, f in files.items() if f}}
    config = config or PrepareConfig()
    return prepare_corpus(
        splits, out, src_lang, tgt_lang, config, source, inputs=inputs, force=force
    )


HF_SPLITS = {"train": "train", "validation": "valid", "valid": "valid", "test": "test"}


def _hf_pair_reader(features: dict, src_lang: str, tgt_lang: str) -> Callable:
    if "translation" in features:  # the WMT / OPUS layout: {"translation": {"de": .., "en": ..}}
        inner = features["translation"]
        languages = list(getattr(inner, "languages", None) or inner)
        if src_lang not in languages or tgt_lang not in languages:
            raise ValueError(
                f"the dataset translates between {languages}, not '{src_lang}' and '{tgt_lang}'"
            )
        return lambda row: (row["translation"][src_lang], row["translation"][tgt_lang])
    if src_lang in features and tgt_lang in features:
        return lambda row: (row[src_lang], row[tgt_lang])
    raise ValueError(
        f"the dataset has columns {list(features)}; expected 'translation' or "
        f"'{src_lang}' and '{tgt_lang}'"
    )


def load_hf_pairs(name: str, config_name: str | None, src_lang: str, tgt_lang: str) -> dict:
    """Pairs per split from a Hugging Face dataset: a hub name, or a `save_to_disk` folder.

    Splits named "train", "validation" (or "valid") and "test" are read.
    """
    try:
        import datasets
    except ImportError:
        raise ValueError(
            "Hugging Face sources need the datasets package: pip install 'aiayn[hf]'"
        ) from None

    if Path(name).is_dir():
        loaded = datasets.load_from_disk(name)
    else:  # downloads: only when the user asks for a dataset by name
        loaded = datasets.load_dataset(name, config_name)
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict({"train": loaded})
    splits: dict[str, Pairs] = {}
    for hf_name, dataset in loaded.items():
        if hf_name not in HF_SPLITS:
            log.warning("skipping split %r of %s", hf_name, name)
            continue
        read = _hf_pair_reader(dataset.features, src_lang, tgt_lang)
        rows = tqdm(dataset, desc=f"read {hf_name}", unit="pair", disable=None)
        splits[HF_SPLITS[hf_name]] = [read(row) for row in rows]
    return splits


def prepare_hf(
    name: str,
    out: str | Path,
    src_lang: str,
    tgt_lang: str,
    config_name: str | None = None,
    config: PrepareConfig | None = None,
    force: bool = False,
) -> PreparedCorpus:
    """A Hugging Face `datasets` source, e.g. `wmt14` / `de-en` (the paper's data); see
    `prepare_corpus` for `out` and `force`."""
    inputs = [name] if Path(name).is_dir() else []  # a save_to_disk folder
    check_output(out, "OUT", directory=True, reads=inputs, force=force)  # before reading
    splits = load_hf_pairs(name, config_name, src_lang, tgt_lang)
    if "train" not in splits:
        raise ValueError(f"{name} has no 'train' split (found {sorted(splits)})")
    source = {"kind": "hf", "name": name, "config": config_name}
    config = config or PrepareConfig()
    return prepare_corpus(
        splits, out, src_lang, tgt_lang, config, source, inputs=inputs, force=force
    )
