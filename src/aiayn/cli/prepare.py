"""`aiayn prepare ...` and `aiayn prepare lm ...`: corpus directories for translation and
for language models, through one runner (check OUT, build, report each split)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from aiayn.cli.common import fail, info_to_stderr, utf8

prepare_app = typer.Typer(
    help="Build a corpus directory: aligned splits, a shared subword model, stats.json.",
    no_args_is_help=True,
)
prepare_lm_app = typer.Typer(
    help="Build a monolingual corpus (GPT / BERT training): one language, documents "
    "one per line, a subword model with [CLS], [SEP] and [MASK].",
    no_args_is_help=True,
)

_OUT = typer.Option(..., "--out", help="Directory to write (created if missing).")
_LM_OUT = typer.Argument(..., help="Directory to write (created if missing).")
_VOCAB_SIZE = typer.Option(37000, help="Shared subword vocabulary size.")
_MAX_TOKENS = typer.Option(256, help="Drop training pairs longer than this, in subwords.")
_MAX_RATIO = typer.Option(3.0, help="Drop training pairs whose sides differ more in length.")
_SEED = typer.Option(0, help="Seed of the subword model's training sample.")
_PREPARE_FORCE = typer.Option(
    False,
    "--force",
    help="Replace the output directory, and everything in it, if it holds something (never "
    "an input file, nor a directory inside or around one).",
)
_LM_MODEL_TYPE = typer.Option(
    "bpe",
    help="bpe, unigram, or char: one piece per character (a character-level model; "
    "--vocab-size is then an upper bound).",
)


# ----- the shared runner -----------------------------------------------------------


def _prepare_config(
    vocab_size: int,
    seed: int,
    max_tokens: int = 256,
    max_ratio: float = 3.0,
    model_type: str = "bpe",
):
    """The subword and filter settings, or exit 1 naming the one refused."""
    from aiayn.data.prepare import PrepareConfig

    try:
        return PrepareConfig(
            vocab_size=vocab_size,
            model_type=model_type,
            max_tokens=max_tokens,
            max_ratio=max_ratio,
            seed=seed,
        )
    except ValueError as err:
        raise fail(err) from None


def _english(src: str):
    """The `EnglishSource` --src names (web or kjv), or a usage error (exit 2)."""
    from aiayn.data.bible import EnglishSource

    try:
        return EnglishSource(src.lower())
    except ValueError:
        raise typer.BadParameter(f"--src must be web or kjv, got {src!r}") from None


def _pairs(corpus, numbers: dict) -> str:
    """A parallel split's line: pairs, tokens per sentence each side, what was dropped."""
    dropped = ", ".join(f"{k} {v}" for k, v in numbers["dropped"].items() if v)
    return (
        f"{numbers['pairs']:>9,} pairs, "
        f"{numbers['src_tokens_per_sentence']:.1f} / {numbers['tgt_tokens_per_sentence']:.1f} "
        f"tokens per sentence ({corpus.src_lang} / {corpus.tgt_lang})"
        + (f"; dropped: {dropped}" if dropped else "")
    )


def _documents(corpus, numbers: dict) -> str:
    """A monolingual split's line: documents, tokens, empty lines dropped."""
    return (
        f"{numbers['documents']:>9,} documents, {numbers['tokens']:>11,} tokens "
        f"({numbers['tokens_per_document']:.1f} per document)"
        + (f"; dropped {numbers['dropped_empty']} empty" if numbers["dropped_empty"] else "")
    )


def _run_prepare(
    build: Callable,
    out: str,
    inputs: list | tuple = (),
    force: bool = False,
    *,
    option: str = "--out",
    describe: Callable[..., str] = _pairs,
) -> None:
    """Run a prepare function and report its corpus, a line per split; or exit 1 with the
    error in one line, without a traceback.

    OUT is checked first (`aiayn.data.files.check_output`, named `option`): never an input,
    nor inside or around one; one that holds something only with --force."""
    from aiayn.data.files import check_output

    info_to_stderr()
    try:
        check_output(out, option, directory=True, reads=inputs, force=force)
        corpus = build()
    except (OSError, ValueError) as err:
        raise fail(err) from None
    stats = corpus.stats
    for split, numbers in stats["splits"].items():
        typer.echo(f"{split:5}: {describe(corpus, numbers)}")
    typer.echo(f"wrote {corpus.root} (vocabulary {stats['vocab_size']}, {stats['seconds']} s)")


def _run_prepare_lm(build: Callable, out: str, inputs: list | tuple = (), force=False) -> None:
    """`_run_prepare` for a monolingual corpus: OUT is an argument; documents per split."""
    _run_prepare(build, out, inputs, force, option="OUT", describe=_documents)


# ----- translation corpora ---------------------------------------------------------


@prepare_app.command("bible")
def prepare_bible_command(
    out: str = _OUT,
    src: str = typer.Option(
        "web", callback=utf8, help="English source: web (World English Bible) or kjv."
    ),
    vocab_size: int = typer.Option(8000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
    force: bool = _PREPARE_FORCE,
):
    """The built-in corpus: the Bible, English to Spanish, from Debian's SWORD modules."""
    from aiayn.data.prepare import prepare_bible

    english = _english(src)
    config = _prepare_config(vocab_size, seed, max_tokens, max_ratio)
    _run_prepare(lambda: prepare_bible(out, english, config, force=force), out, [], force)


@prepare_app.command("text")
def prepare_text_command(
    src_train: str = typer.Option(..., help="Training source sentences, one per line."),
    tgt_train: str = typer.Option(..., help="Training target sentences, aligned by line."),
    src_lang: str = typer.Option(
        ..., callback=utf8, help="Source language code, the file suffix (en)."
    ),
    tgt_lang: str = typer.Option(..., callback=utf8, help="Target language code (de)."),
    out: str = _OUT,
    src_valid: str | None = typer.Option(None, help="Validation source sentences."),
    tgt_valid: str | None = typer.Option(None, help="Validation target sentences."),
    src_test: str | None = typer.Option(None, help="Test source sentences."),
    tgt_test: str | None = typer.Option(None, help="Test target sentences."),
    vocab_size: int = _VOCAB_SIZE,
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
    force: bool = _PREPARE_FORCE,
):
    """Aligned plain text files, one sentence per line (fairseq / OpenNMT style)."""
    from aiayn.data.prepare import prepare_text

    def both(src: str | None, tgt: str | None, split: str):
        if (src is None) != (tgt is None):
            raise typer.BadParameter(f"give both --src-{split} and --tgt-{split}, or neither")
        return (src, tgt) if src is not None else None

    valid, test = both(src_valid, tgt_valid, "valid"), both(src_test, tgt_test, "test")
    config = _prepare_config(vocab_size, seed, max_tokens, max_ratio)
    inputs = [src_train, tgt_train, *(valid or ()), *(test or ())]
    _run_prepare(
        lambda: prepare_text(
            (src_train, tgt_train), out, src_lang, tgt_lang, valid, test, config, force
        ),
        out,
        inputs,
        force,
    )


@prepare_app.command("tsv")
def prepare_tsv_command(
    train: str = typer.Option(..., help="Training pairs: source<TAB>target per line."),
    src_lang: str = typer.Option(..., callback=utf8, help="Source language code (en)."),
    tgt_lang: str = typer.Option(..., callback=utf8, help="Target language code (de)."),
    out: str = _OUT,
    valid: str | None = typer.Option(None, help="Validation pairs, same format."),
    test: str | None = typer.Option(None, help="Test pairs, same format."),
    vocab_size: int = _VOCAB_SIZE,
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
    force: bool = _PREPARE_FORCE,
):
    """Files of two tab-separated columns: source, then target."""
    from aiayn.data.prepare import prepare_tsv

    config = _prepare_config(vocab_size, seed, max_tokens, max_ratio)
    _run_prepare(
        lambda: prepare_tsv(train, out, src_lang, tgt_lang, valid, test, config, force),
        out,
        [train, valid, test],
        force,
    )


@prepare_app.command("hf")
def prepare_hf_command(
    name: str = typer.Argument(..., help="Dataset name (wmt14) or a save_to_disk folder."),
    config_name: str | None = typer.Option(
        None, "--config", callback=utf8, help="Dataset config (de-en)."
    ),
    src_lang: str = typer.Option(..., callback=utf8, help="Source language code (en)."),
    tgt_lang: str = typer.Option(..., callback=utf8, help="Target language code (de)."),
    out: str = _OUT,
    vocab_size: int = _VOCAB_SIZE,
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
    force: bool = _PREPARE_FORCE,
):
    """A Hugging Face datasets source (downloads when given a name; needs the hf extra)."""
    from aiayn.data.prepare import prepare_hf

    config = _prepare_config(vocab_size, seed, max_tokens, max_ratio)
    saved = [name] if Path(name).is_dir() else []  # a save_to_disk folder
    _run_prepare(
        lambda: prepare_hf(name, out, src_lang, tgt_lang, config_name, config, force),
        out,
        saved,
        force,
    )


# ----- generated and classification data sets --------------------------------------


@prepare_app.command("listops")
def prepare_listops_command(
    out: str = _OUT,
    scale: float = typer.Option(
        0.05, help="Fraction of LRA's 96,000 / 2,000 / 2,000 split sizes, in (0, 1]."
    ),
    seed: int = typer.Option(0, help="Seed of the expressions drawn."),
    force: bool = _PREPARE_FORCE,
):
    """Long Range Arena's ListOps, generated offline with its rules (aiayn.data.listops);
    a directory already holding the same settings' data set is kept."""
    import json
    from dataclasses import asdict

    from aiayn.data.files import check_output
    from aiayn.data.listops import MANIFEST, ListOpsConfig, write_listops

    info_to_stderr()
    try:
        config = ListOpsConfig(scale=scale, seed=seed)
        try:  # the same settings' data set is kept by write_listops: nothing is written
            recorded = json.loads((Path(out) / MANIFEST).read_text("utf-8"))["settings"]
        except (OSError, ValueError, KeyError, TypeError):
            recorded = None
        check_output(out, "--out", directory=True, force=force or recorded == asdict(config))
        write_listops(out, config)
    except (OSError, ValueError) as err:
        raise fail(err) from None
    sizes = ", ".join(f"{name} {size:,}" for name, size in config.split_sizes().items())
    typer.echo(f"wrote {out} ({sizes} expressions)")


@prepare_app.command("bible-books")
def prepare_bible_books_command(
    out: str = _OUT,
    labels: str = typer.Option("book", help="book (66 classes) or genre (9)."),
    src: str = typer.Option(
        "web", callback=utf8, help="English text: web (World English Bible) or kjv."
    ),
    seed: int = typer.Option(0, help="Seed of the passage lengths."),
    force: bool = _PREPARE_FORCE,
):
    """Byte-level classification: which book of the Bible a 1-4 KB passage comes from,
    held out by chapter (aiayn.data.bible_books)."""
    from aiayn.data.bible import EnglishSource
    from aiayn.data.bible_books import PassageConfig, write_bible_books
    from aiayn.data.files import check_output

    info_to_stderr()
    try:
        english = EnglishSource(src.lower())
    except ValueError:
        raise fail(ValueError(f"--src must be web or kjv, got {src!r}")) from None
    try:
        config = PassageConfig(labels=labels.lower(), seed=seed)
        check_output(out, "--out", directory=True, force=force)
        sizes = write_bible_books(out, config, english)
    except (OSError, ValueError) as err:
        raise fail(err) from None
    counts = ", ".join(f"{name} {size:,}" for name, size in sizes.items())
    typer.echo(f"wrote {out} ({counts} passages)")


# ----- monolingual corpora: prepare lm ---------------------------------------------


@prepare_lm_app.command("bible")
def prepare_lm_bible_command(
    out: str = _LM_OUT,
    lang: str = typer.Option(..., callback=utf8, help="en (WEB or KJV, see --src) or es (RV1909)."),
    src: str = typer.Option(
        "web", callback=utf8, help="English text: web (World English Bible) or kjv."
    ),
    vocab_size: int = typer.Option(8000, help="Subword vocabulary size."),
    seed: int = _SEED,
    model_type: str = _LM_MODEL_TYPE,
    force: bool = _PREPARE_FORCE,
):
    """One side of the built-in Bible corpus, split by chapter exactly as `prepare bible`."""
    from aiayn.data.lm import prepare_lm_bible

    english = _english(src)
    config = _prepare_config(vocab_size, seed, model_type=model_type)
    _run_prepare_lm(
        lambda: prepare_lm_bible(out, lang, english, config, force=force), out, [], force
    )


@prepare_lm_app.command("text")
def prepare_lm_text_command(
    train: str = typer.Argument(..., help="Training text, UTF-8, one document per line."),
    out: str = _LM_OUT,
    lang: str = typer.Option("xx", callback=utf8, help="Language code, the files' suffix."),
    valid: str | None = typer.Option(None, help="Validation text, same format."),
    test: str | None = typer.Option(None, help="Test text, same format."),
    vocab_size: int = typer.Option(8000, help="Subword vocabulary size."),
    seed: int = _SEED,
    model_type: str = _LM_MODEL_TYPE,
    force: bool = _PREPARE_FORCE,
):
    """Any plain-text file, one document (or line) per line."""
    from aiayn.data.lm import prepare_lm_text

    config = _prepare_config(vocab_size, seed, model_type=model_type)
    _run_prepare_lm(
        lambda: prepare_lm_text(train, out, lang, valid, test, config, force),
        out,
        [train, valid, test],
        force,
    )


@prepare_lm_app.command("repeated")
def prepare_lm_repeated_command(
    out: str = _LM_OUT,
    symbols: int = typer.Option(62, help="Alphabet size (2 ... 62: letters and digits)."),
    min_length: int = typer.Option(8, help="Fewest symbols in a line's first half."),
    max_length: int = typer.Option(48, help="Most symbols in a line's first half."),
    lines: int = typer.Option(40_000, help="Training lines (valid and test get 200 each)."),
    seed: int = typer.Option(0, help="Seed of the symbols drawn."),
    line_length: int | None = typer.Option(
        None, help="Every line this many symbols, random filler around the pair."
    ),
    repeat_to_fill: bool = typer.Option(
        False, help="With --line-length: repeat the half to fill the line, no random filler."
    ),
):
    """Repeated random symbols, each line a random half then its copy, for induction
    heads (aiayn.data.repeated); one id per symbol."""
    from aiayn.data.repeated import RepeatedConfig, prepare_lm_repeated

    def build():
        config = RepeatedConfig(
            symbols, min_length, max_length, (lines, 200, 200), seed, line_length, repeat_to_fill
        )
        return prepare_lm_repeated(out, config)

    _run_prepare_lm(build, out)


prepare_app.add_typer(prepare_lm_app, name="lm")
