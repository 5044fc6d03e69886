"""The `aiayn` command line: one entry point, one subcommand per job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from aiayn.config import Precision
from aiayn.configs import recipe_names


class _OneLineErrors(TyperGroup):
    """The top command: an OS error no subcommand caught (a full disk, a read-only
    file system, permission denied) is reported in one line naming the path, exit 1.

    A reader that stops early (`aiayn translate ... | head`) closes the pipe; that is
    left to click, which ends quietly with status 1.
    """

    def invoke(self, ctx: typer.Context):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            raise  # click's own handling: no message, exit 1
        except OSError as err:
            raise _fail(err) from None


app = typer.Typer(
    name="aiayn",
    cls=_OneLineErrors,
    help="The Transformer of 'Attention Is All You Need': train, translate, score, look inside.",
    no_args_is_help=True,
    add_completion=False,
)


def _utf8(param: typer.CallbackParam, value):
    """Refuse a text argument that is not UTF-8, by name (exit 1).

    The shell passes bytes; Python keeps those it cannot decode as lone surrogates,
    which every later encoder (SentencePiece, JSON, the file system) chokes on.
    File paths are left alone: they may be any bytes.
    """
    for text in value if isinstance(value, list | tuple) else [value]:
        if text is None:
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            name = param.opts[0] if param.param_type_name == "option" else param.name.upper()
            bad = ord(text[err.start])
            byte = f"byte 0x{bad - 0xDC00:02x}" if 0xDC80 <= bad <= 0xDCFF else f"U+{bad:04X}"
            raise _fail(
                ValueError(
                    f"{name}: invalid UTF-8 ({byte} at character {err.start + 1}); "
                    "give the text as UTF-8"
                )
            ) from None
    return value


@app.callback()
def main() -> None:
    """The Transformer of 'Attention Is All You Need': train, translate, score, look inside."""


@app.command()
def demo(vocab_size: int = typer.Option(37000, help="Shared vocabulary size for the presets.")):
    """Build the paper's models, run a forward pass of a tiny one, print shapes and sizes."""
    import torch

    from aiayn import ModelConfig, Transformer

    try:
        ModelConfig.tiny(vocab_size=vocab_size)
    except ValueError as err:
        raise _fail(err) from None
    for name in ("base", "big"):
        cfg = getattr(ModelConfig, name)(vocab_size=vocab_size)
        with torch.device("meta"):  # count parameters without allocating them
            n = Transformer(cfg).num_parameters()
        typer.echo(
            f"Transformer ({name}): N={cfg.n_layers} d_model={cfg.d_model} d_ff={cfg.d_ff} "
            f"h={cfg.n_heads} vocab={vocab_size}: {n:,} parameters"
        )
    torch.manual_seed(0)
    cfg = ModelConfig.tiny(vocab_size=1000)
    model = Transformer(cfg).eval()
    src = torch.randint(3, cfg.vocab_size, (2, 7))
    tgt_in = torch.randint(3, cfg.vocab_size, (2, 5))
    with torch.no_grad():
        logits = model(src, tgt_in)
    typer.echo(
        f"Transformer (tiny): {model.num_parameters():,} parameters; "
        f"src {tuple(src.shape)} + tgt_in {tuple(tgt_in.shape)} -> logits {tuple(logits.shape)}"
    )


# ----- data: prepare ---------------------------------------------------------

prepare_app = typer.Typer(
    help="Build a corpus directory: aligned splits, a shared subword model, stats.json.",
    no_args_is_help=True,
)
app.add_typer(prepare_app, name="prepare")

_OUT = typer.Option(..., "--out", help="Directory to write (created if missing).")
_MAX_TOKENS = typer.Option(256, help="Drop training pairs longer than this, in subwords.")
_MAX_RATIO = typer.Option(3.0, help="Drop training pairs whose sides differ more in length.")
_SEED = typer.Option(0, help="Seed of the subword model's training sample.")
_PREPARE_FORCE = typer.Option(
    False,
    "--force",
    help="Replace the output directory, and everything in it, if it holds something (never "
    "an input file, nor a directory inside or around one).",
)


def _prepare_config(
    vocab_size: int, max_tokens: int, max_ratio: float, seed: int, model_type: str = "bpe"
):
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
        raise _fail(err) from None


def _build_corpus(build, out: str, option: str, inputs: list, force: bool):
    """Run a prepare function and return its corpus, or exit 1 with the error in one line.

    OUT is checked first (`aiayn.files.check_output`): never an input, nor inside or
    around one; one that holds something only with --force."""
    import logging

    from aiayn.files import check_output

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_output(out, option, directory=True, reads=inputs, force=force)
        return build()
    except (OSError, ValueError) as err:
        raise _fail(err) from None


def _run_prepare(build, out: str, inputs: list, force: bool) -> None:
    """Run a prepare function; report the result, or the error without a traceback."""
    corpus = _build_corpus(build, out, "--out", inputs, force)
    stats = corpus.stats
    for split, numbers in stats["splits"].items():
        dropped = ", ".join(f"{k} {v}" for k, v in numbers["dropped"].items() if v)
        typer.echo(
            f"{split:5}: {numbers['pairs']:>9,} pairs, "
            f"{numbers['src_tokens_per_sentence']:.1f} / {numbers['tgt_tokens_per_sentence']:.1f} "
            f"tokens per sentence ({corpus.src_lang} / {corpus.tgt_lang})"
            + (f"; dropped: {dropped}" if dropped else "")
        )
    typer.echo(f"wrote {corpus.root} (vocabulary {stats['vocab_size']}, {stats['seconds']} s)")


@prepare_app.command("bible")
def prepare_bible_command(
    out: str = _OUT,
    src: str = typer.Option(
        "web", callback=_utf8, help="English source: web (World English Bible) or kjv."
    ),
    vocab_size: int = typer.Option(8000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
    force: bool = _PREPARE_FORCE,
):
    """The built-in corpus: the Bible, English to Spanish, from Debian's SWORD modules."""
    from aiayn.data.bible import EnglishSource
    from aiayn.data.prepare import prepare_bible

    try:
        english = EnglishSource(src.lower())
    except ValueError:
        raise typer.BadParameter(f"--src must be web or kjv, got {src!r}") from None
    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
    _run_prepare(lambda: prepare_bible(out, english, config, force=force), out, [], force)


@prepare_app.command("text")
def prepare_text_command(
    src_train: str = typer.Option(..., help="Training source sentences, one per line."),
    tgt_train: str = typer.Option(..., help="Training target sentences, aligned by line."),
    src_lang: str = typer.Option(
        ..., callback=_utf8, help="Source language code, the file suffix (en)."
    ),
    tgt_lang: str = typer.Option(..., callback=_utf8, help="Target language code (de)."),
    out: str = _OUT,
    src_valid: str | None = typer.Option(None, help="Validation source sentences."),
    tgt_valid: str | None = typer.Option(None, help="Validation target sentences."),
    src_test: str | None = typer.Option(None, help="Test source sentences."),
    tgt_test: str | None = typer.Option(None, help="Test target sentences."),
    vocab_size: int = typer.Option(37000, help="Shared subword vocabulary size."),
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
    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
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
    src_lang: str = typer.Option(..., callback=_utf8, help="Source language code (en)."),
    tgt_lang: str = typer.Option(..., callback=_utf8, help="Target language code (de)."),
    out: str = _OUT,
    valid: str | None = typer.Option(None, help="Validation pairs, same format."),
    test: str | None = typer.Option(None, help="Test pairs, same format."),
    vocab_size: int = typer.Option(37000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
    force: bool = _PREPARE_FORCE,
):
    """Files of two tab-separated columns: source, then target."""
    from aiayn.data.prepare import prepare_tsv

    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
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
        None, "--config", callback=_utf8, help="Dataset config (de-en)."
    ),
    src_lang: str = typer.Option(..., callback=_utf8, help="Source language code (en)."),
    tgt_lang: str = typer.Option(..., callback=_utf8, help="Target language code (de)."),
    out: str = _OUT,
    vocab_size: int = typer.Option(37000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
    force: bool = _PREPARE_FORCE,
):
    """A Hugging Face datasets source (downloads when given a name; needs the hf extra)."""
    from aiayn.data.prepare import prepare_hf

    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
    saved = [name] if Path(name).is_dir() else []  # a save_to_disk folder
    _run_prepare(
        lambda: prepare_hf(name, out, src_lang, tgt_lang, config_name, config, force),
        out,
        saved,
        force,
    )


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
    import logging
    from dataclasses import asdict

    from aiayn.data.listops import MANIFEST, ListOpsConfig, write_listops
    from aiayn.files import check_output

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config = ListOpsConfig(scale=scale, seed=seed)
        try:  # the same settings' data set is kept by write_listops: nothing is written
            recorded = json.loads((Path(out) / MANIFEST).read_text("utf-8"))["settings"]
        except (OSError, ValueError, KeyError, TypeError):
            recorded = None
        check_output(out, "--out", directory=True, force=force or recorded == asdict(config))
        write_listops(out, config)
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    sizes = ", ".join(f"{name} {size:,}" for name, size in config.split_sizes().items())
    typer.echo(f"wrote {out} ({sizes} expressions)")


@prepare_app.command("bible-books")
def prepare_bible_books_command(
    out: str = _OUT,
    labels: str = typer.Option("book", help="book (66 classes) or genre (9)."),
    src: str = typer.Option(
        "web", callback=_utf8, help="English text: web (World English Bible) or kjv."
    ),
    seed: int = typer.Option(0, help="Seed of the passage lengths."),
    force: bool = _PREPARE_FORCE,
):
    """Byte-level classification: which book of the Bible a 1-4 KB passage comes from,
    held out by chapter (aiayn.data.bible_books)."""
    import logging

    from aiayn.data.bible import EnglishSource
    from aiayn.data.bible_books import PassageConfig, write_bible_books
    from aiayn.files import check_output

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        english = EnglishSource(src.lower())
    except ValueError:
        raise _fail(ValueError(f"--src must be web or kjv, got {src!r}")) from None
    try:
        config = PassageConfig(labels=labels.lower(), seed=seed)
        check_output(out, "--out", directory=True, force=force)
        sizes = write_bible_books(out, config, english)
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    counts = ", ".join(f"{name} {size:,}" for name, size in sizes.items())
    typer.echo(f"wrote {out} ({counts} passages)")


prepare_lm_app = typer.Typer(
    help="Build a monolingual corpus (GPT / BERT training): one language, documents "
    "one per line, a subword model with [CLS], [SEP] and [MASK].",
    no_args_is_help=True,
)
prepare_app.add_typer(prepare_lm_app, name="lm")
_LM_OUT = typer.Argument(..., help="Directory to write (created if missing).")
_LM_MODEL_TYPE = typer.Option(
    "bpe",
    help="bpe, unigram, or char: one piece per character (a character-level model; "
    "--vocab-size is then an upper bound).",
)


def _run_prepare_lm(build, out: str, inputs: list | tuple = (), force: bool = False) -> None:
    """Run a monolingual prepare function; report the result, or the error in one line."""
    corpus = _build_corpus(build, out, "OUT", inputs, force)
    stats = corpus.stats
    for split, numbers in stats["splits"].items():
        typer.echo(
            f"{split:5}: {numbers['documents']:>9,} documents, {numbers['tokens']:>11,} tokens "
            f"({numbers['tokens_per_document']:.1f} per document)"
            + (f"; dropped {numbers['dropped_empty']} empty" if numbers["dropped_empty"] else "")
        )
    typer.echo(f"wrote {corpus.root} (vocabulary {stats['vocab_size']}, {stats['seconds']} s)")


@prepare_lm_app.command("bible")
def prepare_lm_bible_command(
    out: str = _LM_OUT,
    lang: str = typer.Option(
        ..., callback=_utf8, help="en (WEB or KJV, see --src) or es (RV1909)."
    ),
    src: str = typer.Option(
        "web", callback=_utf8, help="English text: web (World English Bible) or kjv."
    ),
    vocab_size: int = typer.Option(8000, help="Subword vocabulary size."),
    seed: int = _SEED,
    model_type: str = _LM_MODEL_TYPE,
    force: bool = _PREPARE_FORCE,
):
    """One side of the built-in Bible corpus, split by chapter exactly as `prepare bible`."""
    from aiayn.data.bible import EnglishSource
    from aiayn.data.lm import prepare_lm_bible

    try:
        english = EnglishSource(src.lower())
    except ValueError:
        raise typer.BadParameter(f"--src must be web or kjv, got {src!r}") from None
    config = _prepare_config(vocab_size, 256, 3.0, seed, model_type)
    _run_prepare_lm(
        lambda: prepare_lm_bible(out, lang, english, config, force=force), out, [], force
    )


@prepare_lm_app.command("text")
def prepare_lm_text_command(
    train: str = typer.Argument(..., help="Training text, UTF-8, one document per line."),
    out: str = _LM_OUT,
    lang: str = typer.Option("xx", callback=_utf8, help="Language code, the files' suffix."),
    valid: str | None = typer.Option(None, help="Validation text, same format."),
    test: str | None = typer.Option(None, help="Test text, same format."),
    vocab_size: int = typer.Option(8000, help="Subword vocabulary size."),
    seed: int = _SEED,
    model_type: str = _LM_MODEL_TYPE,
    force: bool = _PREPARE_FORCE,
):
    """Any plain-text file, one document (or line) per line."""
    from aiayn.data.lm import prepare_lm_text

    config = _prepare_config(vocab_size, 256, 3.0, seed, model_type)
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
):
    """Repeated random symbols, each line a random half then its copy, for induction
    heads (aiayn.data.repeated); one id per symbol."""
    from aiayn.data.repeated import RepeatedConfig, prepare_lm_repeated

    def build():
        config = RepeatedConfig(
            symbols, min_length, max_length, (lines, 200, 200), seed, line_length
        )
        return prepare_lm_repeated(out, config)

    _run_prepare_lm(build, out)


# ----- training: train, average ----------------------------------------------


@app.command(
    context_settings={"allow_extra_args": False},
    epilog="Overrides: section.key=value, e.g. train.lr_scale=2 model.d_model=256 "
    "train.max_minutes=30 data.corpus=DIR. Run again with the same --run to resume; "
    "several processes: torchrun --nproc_per_node N -m aiayn.cli train ... --run-dir DIR",
)
def train(
    config: Annotated[
        Path,
        typer.Argument(
            help="A YAML recipe, or the name of a packaged one ("
            + ", ".join(recipe_names())
            + "; see configs/)."
        ),
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(callback=_utf8, help="section.key=value overrides of the recipe."),
    ] = None,
    run: Annotated[
        Path,
        typer.Option(
            "--run",
            "--run-dir",
            help="Run directory (resumed if it exists). Under torchrun write --run-dir: "
            "torchrun reads --run as its own --run-path.",
        ),
    ] = ...,
    device: Annotated[
        str | None,
        typer.Option(
            "--device", callback=_utf8, help="cpu, cuda, cuda:1 (default: cuda if available)."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train a Transformer from a recipe; checkpoints, metrics and logs go to --run."""
    import logging

    from aiayn.configs import find_recipe
    from aiayn.files import check_output
    from aiayn.training.trainer import train_from_recipe

    config = find_recipe(config)
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)  # info lines go to RUN/train.log, not over the bar
    handler.setFormatter(logging.Formatter("aiayn: %(levelname)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        check_output(run, "--run", directory=True)
        result = train_from_recipe(config, run, overrides or [], device=device, progress=progress)
    except (OSError, ValueError) as err:  # a full disk too: the checkpoints so far are intact
        raise _fail(err) from None
    finally:
        logging.getLogger().removeHandler(handler)
    valid = (
        f"; valid loss {result.last_valid_loss:.4f}" if result.last_valid_loss is not None else ""
    )
    bleu = f", BLEU {result.last_valid_bleu:.2f}" if result.last_valid_bleu is not None else ""
    typer.echo(
        f"stopped ({result.stopped}) at update {result.steps}, epoch {result.epochs:.2f}, "
        f"{result.train_minutes:.1f} training minutes{valid}{bleu}; run: {result.run_dir}"
    )
    if result.stopped == "non_finite":
        raise _fail(ValueError("too many non-finite losses in a row; see RUN/train.log"))
    if result.signal_number is not None:  # the shell's convention: 128 + the signal
        raise typer.Exit(code=128 + result.signal_number)


@app.command()
def average(
    run: Annotated[Path, typer.Argument(help="Run directory.")],
    last: Annotated[int, typer.Option("--last", help="Average this many latest checkpoints.")] = 5,
) -> None:
    """Average the last K step checkpoints (section 6) into RUN/checkpoints/average-last-K."""
    from aiayn.io.checkpoint import average_last, averaged_steps

    try:
        path = average_last(run, last)
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    steps = ", ".join(str(step) for step in averaged_steps(path.parent) or [])
    typer.echo(f"wrote {path} (the average of steps {steps})")


# ----- inference: translate, evaluate, attention -----------------------------


def _fail(err: Exception) -> typer.Exit:
    """Report a user error in one line (no traceback) and exit with status 1."""
    if type(err).__str__ is OSError.__str__ and err.filename is not None:  # "[Errno 28] ..."
        err = f"{err.filename}: {err.strerror}"
    typer.echo(f"aiayn: error: {err}", err=True)
    return typer.Exit(code=1)


def _warnings_to_stderr() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="aiayn: %(levelname)s: %(message)s")


def _check_device(device: str) -> None:
    from aiayn.devices import usable_device

    usable_device(device, "--device")


def _load_translator(
    run: Path,
    device: str,
    tokenizer: Path | None,
    precision: Precision | None = None,
    shortlist: Path | None = None,
):
    from aiayn.apps.translate import Translator

    _check_device(device)
    return Translator.load(  # a GPT or BERT run is refused by name before its weights are read
        run,
        device=device,
        tokenizer=tokenizer,
        dtype=None if precision is None else precision.dtype,
        shortlist=shortlist,
    )


def _write_lines(lines: list[str], output: Path | None) -> None:
    """To stdout, or to `output` atomically (an earlier file survives a failure)."""
    import sys

    from aiayn.files import lines_text, write_atomic

    text = lines_text(lines)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(output, text)


RunArg = Annotated[
    Path, typer.Argument(help="Run directory, checkpoint directory or .safetensors file.")
]
BeamOpt = Annotated[int, typer.Option("--beam", help="Beam width (1 = greedy search).")]
AlphaOpt = Annotated[float, typer.Option("--alpha", help="Length penalty exponent (section 6).")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", help="Source tokens per batch.")]
DeviceOpt = Annotated[str, typer.Option("--device", callback=_utf8, help="cpu, cuda, cuda:1, ...")]
# Inference names a `Precision` by torch's name of its dtype (auto names none).
_DTYPES = {p.dtype_name: p for p in Precision if p is not Precision.AUTO}


def _inference_precision(name: str | Precision) -> Precision:
    if isinstance(name, Precision):  # the default
        return name
    if name not in _DTYPES:
        raise typer.BadParameter(f"{name!r}; use {', '.join(_DTYPES)}")
    return _DTYPES[name]


PrecisionOpt = Annotated[
    Precision,
    typer.Option(
        "--dtype",
        parser=_inference_precision,
        metavar="[" + "|".join(_DTYPES) + "]",
        show_default=Precision.FP32.dtype_name,
        help="Model precision (bfloat16 suits GPUs; int8: int8 products on the CPU).",
    ),
]
ModelPrecisionOpt = Annotated[
    Precision | None,
    typer.Option(
        "--dtype",
        parser=_inference_precision,
        metavar="[" + "|".join(_DTYPES) + "]",
        show_default="the weights': int8 for `convert marian --dtype int8`, else float32",
        help="Model precision (bfloat16 suits GPUs; int8: int8 products on the CPU).",
    ),
]
TokenizerOpt = Annotated[
    Path | None, typer.Option("--tokenizer", help="Subword model (default: RUN/spm.model).")
]
ShortlistOpt = Annotated[
    Path | None,
    typer.Option(
        "--shortlist",
        help="Output shortlist file (aiayn prepare's shortlist.safetensors or aiayn shortlist "
        "build's): pick only among each batch's candidates (default: the whole vocabulary).",
    ),
]


@app.command()
def translate(
    run: RunArg,
    input: Annotated[
        Path | None, typer.Option("-i", "--input", help="Input file (default stdin).")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="Output file (default stdout).")
    ] = None,
    beam: Annotated[
        int | None, typer.Option(help="Beam width, 1 = greedy (default: the model's, or 4).")
    ] = None,
    alpha: Annotated[
        float | None, typer.Option(help="Length penalty exponent (default: the model's, or 0.6).")
    ] = None,
    nbest: Annotated[
        int,
        typer.Option(help="With N > 1, write N candidates per line as 'i ||| text ||| score'."),
    ] = 1,
    extra_len: Annotated[
        int | None, typer.Option(help="Output may exceed the source by this (default: 50).")
    ] = None,
    sample: Annotated[bool, typer.Option("--sample", help="Sample instead of searching.")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    top_k: Annotated[int | None, typer.Option(help="Sample among the k likeliest.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling mass.")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    max_tokens: MaxTokensOpt = 4096,
    device: DeviceOpt = "cpu",
    dtype: ModelPrecisionOpt = None,
    tokenizer: TokenizerOpt = None,
    shortlist: ShortlistOpt = None,
    continuous: Annotated[
        int,
        typer.Option(
            min=0,
            help="Decode N sentences at once on the continuous-batching engine: each "
            "takes a free slot as another finishes (0: batches of --max-tokens).",
        ),
    ] = 0,
    compile: Annotated[
        bool, typer.Option("--compile", help="With --continuous: compile its step first.")
    ] = False,
) -> None:
    """Translate stdin or a file, one sentence per line, keeping order and empty lines.

    Search settings not given are the model's: the paper's (section 6) for our own
    runs, the config's for a converted Marian model (see `aiayn convert marian`).
    """
    import sys

    from aiayn.files import check_output, decode_lines, read_lines

    _warnings_to_stderr()
    given = {"beam": beam, "alpha": alpha, "extra_len": extra_len}
    try:
        if compile and not continuous:
            raise ValueError("--compile compiles the engine's step: give --continuous N too")
        if output is not None:  # never over or inside the run, the input or a model file
            check_output(output, "-o", reads=[run, input, tokenizer, shortlist])
        lines = read_lines(input) if input else list(decode_lines(sys.stdin.buffer, "<stdin>"))
        translator = _load_translator(run, device, tokenizer, dtype, shortlist)
        config = translator.decode_config(
            nbest=nbest,
            sampling=sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            **{name: value for name, value in given.items() if value is not None},
        )
        results = translator.translate_nbest(
            lines, config, max_tokens, output is not None, continuous, compile
        )
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    if nbest == 1:
        out = [candidates[0].text if candidates else "" for candidates in results]
    else:
        out = [
            f"{i} ||| {c.text} ||| {c.score:.4f}"
            for i, candidates in enumerate(results)
            for c in (candidates or [])
        ]
    _write_lines(out, output)


def _split_files(run: Path, split: str) -> tuple[Path, Path]:
    """(source, reference) files of `split` in the corpus named by RUN/config.yaml."""
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.training.recipe import load_recipe

    recipe = run / "config.yaml"
    if not recipe.is_file():
        raise FileNotFoundError(
            f"--split needs a run directory with a config.yaml; {recipe} is missing "
            "(give --src and --ref instead)"
        )
    return PreparedCorpus.load(load_recipe(recipe).corpus).files(split)


@app.command()
def evaluate(
    run: RunArg,
    split: Annotated[
        str | None,
        typer.Option(
            callback=_utf8, help="Score a split (valid, test) of the corpus RUN was trained on."
        ),
    ] = None,
    src: Annotated[Path | None, typer.Option(help="Source file (with --ref).")] = None,
    ref: Annotated[Path | None, typer.Option(help="Reference file (with --src).")] = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Where hypotheses.txt and scores.json go (default RUN/eval/NAME)."),
    ] = None,
    beam: Annotated[
        int | None, typer.Option(help="Beam width, 1 = greedy (default: the model's, or 4).")
    ] = None,
    alpha: Annotated[
        float | None, typer.Option(help="Length penalty exponent (default: the model's, or 0.6).")
    ] = None,
    max_tokens: MaxTokensOpt = 4096,
    device: DeviceOpt = "cpu",
    dtype: ModelPrecisionOpt = None,
    tokenizer: TokenizerOpt = None,
    shortlist: ShortlistOpt = None,
) -> None:
    """sacreBLEU (with signature) and chrF, plus the paper-style tokenized BLEU, labelled.

    Search settings not given are the model's, as in `aiayn translate`.
    """
    from aiayn.files import check_output, read_lines
    from aiayn.training import evaluate as scoring

    _warnings_to_stderr()
    try:
        if (split is None) == (src is None and ref is None) or (src is None) != (ref is None):
            raise ValueError("give either --split NAME or both --src FILE and --ref FILE")
        if split is not None:
            src, ref = _split_files(run, split)
        name = split or src.stem
        out_dir = out or (run if run.is_dir() else run.parent) / "eval" / name
        check_output(out_dir, "--out", directory=True)
        sources, references = read_lines(src), read_lines(ref)
        if len(sources) != len(references):
            raise ValueError(f"{src} has {len(sources)} lines but {ref} has {len(references)}")
        translator = _load_translator(run, device, tokenizer, dtype, shortlist)
        hypotheses = translator.translate(
            sources, beam=beam, alpha=alpha, max_tokens=max_tokens, progress=True
        )
        scores = scoring.score(hypotheses, references)
        json_path = scoring.write_report(scores, hypotheses, out_dir)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(scores.summary())
    typer.echo(f"wrote {out_dir / 'hypotheses.txt'} and {json_path}", err=True)


@app.command()
def attention(
    run: RunArg,
    sentence: Annotated[str, typer.Argument(callback=_utf8, help="The source sentence.")],
    out: Annotated[Path, typer.Option(help="Directory for the PNGs.")] = Path("attention"),
    layer: Annotated[list[int] | None, typer.Option(help="Layer(s) to draw, from 0.")] = None,
    head: Annotated[list[int] | None, typer.Option(help="Head(s) to draw, from 0.")] = None,
    beam: Annotated[int, typer.Option(help="Beam width for the translation drawn.")] = 1,
    alpha: Annotated[float, typer.Option(help="Length-penalty exponent of beam search.")] = 0.6,
    html: Annotated[
        Path | None,
        typer.Option(
            help="Write the interactive explorer, data inlined, to this HTML file "
            "(opens offline) instead of the PNGs."
        ),
    ] = None,
    device: DeviceOpt = "cpu",
    tokenizer: TokenizerOpt = None,
) -> None:
    """Heat maps of encoder, decoder and encoder-decoder attention: PNG grids, or --html.

    A decoder-only (GPT) or encoder-only (BERT) run draws its one self-attention over
    SENTENCE itself: decoder.png or encoder.png.
    """
    from aiayn.analysis.viz import plot_translation_attention
    from aiayn.apps.model_use import ENCODER_DECODER
    from aiayn.files import check_output
    from aiayn.inference.search import DecodeConfig

    _warnings_to_stderr()
    try:
        architecture = _architecture(run)
        if architecture != ENCODER_DECODER:
            if html is not None:
                raise ValueError(
                    f"--html explores translation models; {run} holds a {architecture} "
                    "model: leave --html out for its PNG"
                )
            check_output(out, "--out", directory=True)
            paths = _one_stack_attention(run, architecture, sentence, out, layer, head, device)
            for path in paths.values():
                typer.echo(str(path))
            return
        if html is not None and (layer or head):
            raise ValueError("--layer and --head choose PNG panels; --html shows every head")
        if html is not None:
            check_output(html, "--html")
        else:
            check_output(out, "--out", directory=True)
        decode = DecodeConfig(beam=beam, alpha=alpha)
        translator = _load_translator(run, device, tokenizer)
        if html is not None:
            from aiayn.analysis.heads import HEADS_FILE, read_head_records
            from aiayn.apps.explorer import attention_payload, write_explorer_html

            scores = (run if run.is_dir() else run.parent) / HEADS_FILE  # from aiayn heads
            corpus = read_head_records(scores) if scores.is_file() else None
            payload = attention_payload(translator, sentence, decode, corpus=corpus)
            payload = {"run": str(run), **payload}
            paths = {"html": write_explorer_html(payload, html)}
        else:
            paths = plot_translation_attention(
                translator, sentence, out, layer or None, head or None, decode
            )
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    for path in paths.values():
        typer.echo(str(path))


@app.command()
def heads(
    run: Annotated[Path, typer.Argument(help="Run directory trained by aiayn (with its corpus).")],
    split: Annotated[
        str, typer.Option(callback=_utf8, help="The corpus split to measure on.")
    ] = "valid",
    sentences: Annotated[int, typer.Option(help="Pairs of the split, from its start.")] = 200,
    out: Annotated[
        Path | None,
        typer.Option(help="Directory for heads.json, report.md and PNGs (default RUN/heads)."),
    ] = None,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Padded tokens per batch, each side.")
    ] = 4096,
    device: DeviceOpt = "cpu",
) -> None:
    """What each head does: entropy, confidence, positions, importance; JSON, PNG, markdown."""
    from aiayn.analysis.heads import HEADS_FILE, head_report, write_head_report
    from aiayn.data.corpus import read_parallel
    from aiayn.files import check_output

    _warnings_to_stderr()
    try:
        check_output(out or run / HEADS_FILE.parent, "--out", directory=True)
        if sentences < 1:
            raise ValueError(f"--sentences must be at least 1, got {sentences}")
        if not (run / "config.yaml").is_file():
            raise FileNotFoundError(
                f"aiayn heads needs a run trained by aiayn with a corpus; {run / 'config.yaml'} "
                "is missing (a converted or bare checkpoint has no validation split)"
            )
        pairs = read_parallel(*_split_files(run, split))
        translator = _load_translator(run, device, None)
        report = head_report(
            translator.model, translator.tokenizer, pairs, sentences, batch_tokens=max_tokens
        )
        paths = write_head_report(report, out or run / HEADS_FILE.parent, run=str(run), split=split)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    for path in paths:
        typer.echo(str(path))


@app.command()
def lens(
    run: RunArg,
    text: Annotated[
        str, typer.Argument(callback=_utf8, help="The source sentence, or a GPT run's prompt.")
    ],
    target: Annotated[
        str | None,
        typer.Option(
            callback=_utf8,
            help="A translation's target prefix (default: its greedy translation), or the "
            "continuation of a GPT run's prompt; each position follows its next token.",
        ),
    ] = None,
    top_k: Annotated[
        int, typer.Option("--top-k", help="Tokens kept per layer and position in lens.json.")
    ] = 5,
    out: Annotated[Path, typer.Option(help="Directory for lens.png and lens.json.")] = Path("lens"),
    device: DeviceOpt = "cpu",
    tokenizer: TokenizerOpt = None,
) -> None:
    """The logit lens: what each decoder layer would predict if it were the last.

    Prints the top-1 token per layer (last first) and position; writes lens.png and
    lens.json to --out. A translation run reads TEXT as the source and its greedy
    translation (or --target) as the decoder's input; a GPT run reads TEXT as the prompt
    (and --target as its continuation).
    """
    from aiayn.analysis.logit_lens import (
        lens_table,
        prompt_lens,
        translation_lens,
        write_logit_lens,
    )
    from aiayn.apps.model_use import DECODER_ONLY, ENCODER_DECODER
    from aiayn.files import check_output

    _warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run, tokenizer])
        if top_k < 1:
            raise ValueError(f"--top-k must be at least 1, got {top_k}")
        architecture = _architecture(run)
        if architecture not in (ENCODER_DECODER, DECODER_ONLY):
            raise ValueError(
                f"{run} holds a model of shape {architecture}, which does not predict the "
                "next token: the logit lens reads a translation or GPT run (encoder_decoder "
                "or decoder_only)"
            )
        if architecture == ENCODER_DECODER:
            user = _load_translator(run, device, tokenizer)
        elif tokenizer is not None:
            raise ValueError(f"--tokenizer is for a translation run; {run} holds its own")
        else:
            user = _load_lm(run, device, "generate")
        if top_k > user.model.cfg.vocab_size:
            raise ValueError(
                f"--top-k {top_k} exceeds the vocabulary ({user.model.cfg.vocab_size})"
            )
        if architecture == ENCODER_DECODER:
            result = translation_lens(user, text, target, top_k)
        else:
            continuation = None if target is None else user.tokenizer.encode(target)
            result = prompt_lens(user.model, user.encode_prompt(text), continuation, top_k)
        paths = write_logit_lens(
            result, user.tokenizer, out, run=str(run), text=text, target=target
        )
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(lens_table(result, user.tokenizer), nl=False)
    for path in paths:
        typer.echo(str(path), err=True)


@app.command()
def patch(
    run: RunArg,
    clean: Annotated[str, typer.Option(callback=_utf8, help="The clean text (source or prompt).")],
    corrupt: Annotated[
        str, typer.Option(callback=_utf8, help="The corrupted text, as many tokens as --clean.")
    ],
    metric: Annotated[str, typer.Option(help="logit-diff (--right, --wrong) or logprob.")] = (
        "logit-diff"
    ),
    right: Annotated[
        str | None,
        typer.Option(callback=_utf8, help="logit-diff: the token the clean run favours."),
    ] = None,
    wrong: Annotated[
        str | None, typer.Option(callback=_utf8, help="logit-diff: the token to compare it with.")
    ] = None,
    target: Annotated[
        str,
        typer.Option(
            callback=_utf8,
            help="The target read in both runs: the translation (scored by logprob) or its "
            "prefix; for a GPT run, text after the prompt.",
        ),
    ] = "",
    stack: Annotated[
        str | None, typer.Option(help="encoder or decoder (default: the one whose input differs).")
    ] = None,
    point: Annotated[
        str, typer.Option(help="resid_pre, resid_mid, resid_cross or resid_post.")
    ] = "resid_pre",
    normalize: Annotated[
        bool, typer.Option("--normalize", help="Draw (patched - corrupt) / (clean - corrupt).")
    ] = False,
    heads: Annotated[
        bool, typer.Option("--heads", help="Also patch each head's output: patching-heads-*.png.")
    ] = False,
    out: Annotated[Path, typer.Option(help="Directory for patching.png and .json.")] = Path(
        "patching"
    ),
    device: DeviceOpt = "cpu",
) -> None:
    """Activation patching: the metric with each layer x position of the residual stream
    taken from the clean run into the corrupted one (translation and GPT runs)."""
    from aiayn.analysis.patching import patch_text, write_patching
    from aiayn.apps.model_use import DECODER_ONLY, ENCODER_DECODER
    from aiayn.files import check_output

    _warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run])
        architecture = _architecture(run)
        if architecture == ENCODER_DECODER:
            user = _load_translator(run, device, None)
        elif architecture == DECODER_ONLY:
            user = _load_lm(run, device, "generate")
        else:
            raise ValueError(f"aiayn patch runs translation and GPT runs; {run} is {architecture}")
        report = patch_text(
            user.model, user.tokenizer, clean, corrupt, metric, right, wrong, target, stack, point,
            normalize, heads,
        )  # fmt: skip
        paths = write_patching(report, out, run=str(run))
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(f"clean {report.clean_metric:.4f}, corrupted {report.corrupt_metric:.4f} ({metric})")
    for path in paths:
        typer.echo(str(path))


@app.command()
def induction(
    run: RunArg,
    length: Annotated[int, typer.Option(help="Random tokens in each of the two repeats.")] = 50,
    batch: Annotated[int, typer.Option(help="Sequences averaged over.")] = 8,
    seed: Annotated[int, typer.Option(help="Seed of the random tokens.")] = 0,
    out: Annotated[Path, typer.Option(help="Directory for induction.json and the PNGs.")] = Path(
        "induction"
    ),
    html: Annotated[
        Path | None,
        typer.Option(help="Also write the three grids as one HTML page (opens offline)."),
    ] = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Induction heads (Olsson et al. 2022) of a GPT run: each head's prefix-matching,
    previous-token and copying scores on bos + random tokens repeated twice."""
    from aiayn.analysis.induction import repeated_random_tokens, score_model, write_induction
    from aiayn.apps.model_use import DECODER_ONLY
    from aiayn.files import check_output

    _warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run])
        if html is not None:
            check_output(html, "--html", reads=[run])
        for name, value in (("--length", length), ("--batch", batch)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        architecture = _architecture(run)
        if architecture != DECODER_ONLY:
            raise ValueError(
                f"aiayn induction scores a GPT run (decoder_only); {run} holds a "
                f"{architecture} model"
            )
        user = _load_lm(run, device, "generate")
        cfg = user.model.cfg
        if 1 + 2 * length > cfg.max_len:
            raise ValueError(
                f"--length {length} makes sequences of 1 + 2 x {length} tokens, more than the "
                f"model's max_len {cfg.max_len}: use at most {(cfg.max_len - 1) // 2}"
            )
        specials = {cfg.pad_id, cfg.bos_id, cfg.eos_id, getattr(user.tokenizer, "unk_id", None)}
        ids = repeated_random_tokens(
            cfg.vocab_size, length, batch, seed, specials - {None}, cfg.bos_id
        ).to(user.device)
        scores = score_model(user.model, ids)
        context = {"run": str(run), "length": length, "batch": batch, "seed": seed}
        paths = write_induction(scores, out, **context)
        if html is not None:
            from aiayn.apps.explorer.induction import write_induction_html

            paths.append(write_induction_html(scores, html, **context))
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    typer.echo("layer head  induction  previous-token  copying")
    for layer, head in scores.top_heads():
        matching, previous, copying = (
            float(grid[layer, head])
            for grid in (scores.induction, scores.previous_token, scores.copying)
        )
        typer.echo(f"{layer:>5} {head:>4}  {matching:>9.3f}  {previous:>14.3f}  {copying:>7.3f}")
    for path in paths:
        typer.echo(str(path), err=True)


@app.command()
def align(
    run: RunArg,
    pairs: Annotated[int, typer.Option(help="Pairs to align, from the start.")] = 100,
    split: Annotated[
        str | None,
        typer.Option(callback=_utf8, help="The split of RUN's corpus to align (default: test)."),
    ] = None,
    src: Annotated[Path | None, typer.Option(help="Source file (with --ref).")] = None,
    ref: Annotated[Path | None, typer.Option(help="Its translations (with --src).")] = None,
    model1_pairs: Annotated[
        int,
        typer.Option(
            "--model1-pairs", help="Pairs of RUN's train split IBM Model 1 also learns from."
        ),
    ] = 20000,
    out: Annotated[Path, typer.Option(help="Directory for align.json.")] = Path("align"),
    device: DeviceOpt = "cpu",
) -> None:
    """Word alignment from each layer's cross-attention and from attention rollout,
    scored by AER against IBM Model 1's alignment of the same pairs."""
    from aiayn.analysis.alignment import align_pairs, write_alignment
    from aiayn.apps.model_use import ENCODER_DECODER
    from aiayn.data.corpus import read_parallel
    from aiayn.files import check_output

    _warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run, src, ref])
        if pairs < 1:
            raise ValueError(f"--pairs must be at least 1, got {pairs}")
        if model1_pairs < 0:
            raise ValueError(f"--model1-pairs must be at least 0, got {model1_pairs}")
        if (split is not None and src is not None) or (src is None) != (ref is None):
            raise ValueError("give --split NAME or both --src FILE and --ref FILE, not both")
        architecture = _architecture(run)
        if architecture != ENCODER_DECODER:
            raise ValueError(
                f"aiayn align reads a translation model's cross-attention; {run} holds a "
                f"{architecture} model"
            )
        if src is None or ref is None:
            split = split or "test"
            src, ref = _split_files(run, split)
            check_output(out, "--out", directory=True, reads=[src, ref])  # nor in the corpus
        train = []
        if (run / "config.yaml").is_file() and model1_pairs:
            train = read_parallel(*_split_files(run, "train"))[:model1_pairs]
        chosen = read_parallel(src, ref)[:pairs]
        translator = _load_translator(run, device, None)
        report = align_pairs(translator.model, translator.tokenizer, chosen, train)
        path = write_alignment(report, out, run=str(run), src=str(src), ref=str(ref))
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(report.table(), nl=False)
    typer.echo(str(path), err=True)


def _architecture(run: Path) -> str:
    """The model shape of the weights a run (or checkpoint) resolves to."""
    from aiayn.io.checkpoint import read_config, resolve_weights

    return read_config(resolve_weights(run)).architecture


def _one_stack_attention(
    run: Path,
    architecture: str,
    sentence: str,
    out: Path,
    layers: list[int] | None,
    heads: list[int] | None,
    device: str,
) -> dict:
    """`aiayn attention` for a decoder-only or encoder-only run: its self-attention PNG."""
    import torch

    from aiayn.analysis.viz import plot_self_attention
    from aiayn.apps import verb_of

    _check_device(device)
    if not sentence.strip():
        raise ValueError("cannot draw attention for an empty sentence")
    verb = verb_of(architecture)  # the shape's own command reads the sentence
    if verb not in ("generate", "fill"):
        raise ValueError(f"{run} holds a {architecture} model, which no aiayn command runs")
    user = _load_lm(run, device, verb)
    ids = user.encode_prompt(sentence) if verb == "generate" else user.encode(sentence)
    pieces = [user.tokenizer.id_to_piece(i) for i in ids]
    batch = torch.tensor([ids], dtype=torch.long, device=user.device)  # (1, T)
    return plot_self_attention(user.model, batch, pieces, out, layers or None, heads or None)


# ----- language models: generate, fill -------------------------------------------


def _load_lm(run: Path, device: str, command: str, precision: Precision = Precision.FP32):
    """The `Generator` (command "generate") or `MaskFiller` ("fill") of RUN: an aiayn run
    or checkpoint, a directory `aiayn convert` wrote, or a transformers directory."""
    _check_device(device)
    if precision is Precision.INT8:
        raise ValueError(
            f"--dtype int8: {command} runs float32, bfloat16 or float16; int8 is for "
            "translate, evaluate and serve"
        )
    if command == "generate":
        from aiayn.apps.generate import Generator as User
    else:
        from aiayn.apps.fill import MaskFiller as User
    if (run / "config.json").is_file() and not (run / "checkpoints").is_dir():
        return User.from_hf(run, device=device, dtype=precision.dtype)  # as transformers saved it
    return User.load(run, device=device, dtype=precision.dtype)


@app.command()
def generate(
    run: Annotated[
        Path,
        typer.Argument(help="Run, checkpoint or converted directory, or a GPT-2 directory."),
    ],
    prompt: Annotated[str, typer.Argument(callback=_utf8, help="The text to continue.")],
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Generate at most this many tokens.")
    ] = 50,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    top_k: Annotated[int | None, typer.Option(help="Sample among the k likeliest.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling mass.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (default: random).")] = None,
    greedy: Annotated[
        bool, typer.Option("--greedy", help="The likeliest token at every step.")
    ] = False,
    device: DeviceOpt = "cpu",
    dtype: PrecisionOpt = Precision.FP32,
    static: Annotated[
        bool, typer.Option("--static", help="Decode on a step of fixed shapes (same tokens).")
    ] = False,
    compile: Annotated[
        bool, typer.Option("--compile", help="Compile that step first (implies --static).")
    ] = False,
) -> None:
    """Continue PROMPT with a decoder-only (GPT) model, streaming tokens as they come.

    Sampling (temperature, top-k, top-p) unless --greedy; the KV cache holds the
    prompt and every token so far. A prompt longer than the model's max_len is refused.
    """
    import sys

    _warnings_to_stderr()
    try:
        generator = _load_lm(run, device, "generate", dtype)
        if static or compile:
            generator.use_static_step(compile)
        pieces = generator.stream(prompt, max_tokens, temperature, top_k, top_p, seed, greedy)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    sys.stdout.write(prompt)
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


@app.command()
def fill(
    run: Annotated[
        Path,
        typer.Argument(help="Run, checkpoint or converted directory, or a BERT directory."),
    ],
    text: Annotated[str, typer.Argument(callback=_utf8, help="Text with one or more [MASK]s.")],
    top_k: Annotated[int, typer.Option(help="Candidates per [MASK].")] = 5,
    device: DeviceOpt = "cpu",
    dtype: PrecisionOpt = Precision.FP32,
) -> None:
    """Fill each [MASK] of TEXT with an encoder-only (BERT) model: top-k tokens, probabilities."""
    _warnings_to_stderr()
    try:
        filler = _load_lm(run, device, "fill", dtype)
        candidates = filler.fill(text, top_k)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    for number, options in enumerate(candidates, start=1):
        typer.echo(f"[MASK] {number}:")
        for token, probability in options:
            typer.echo(f"  {probability:.4f}  {token}")


# ----- looking inside: prune -----------------------------------------------------


@app.command()
def prune(
    run: RunArg,
    out: Annotated[
        Path, typer.Option("--out", help="The pruned run directory to write (must not exist).")
    ],
    heads: Annotated[
        list[str] | None,
        typer.Option(
            "--heads",
            callback=_utf8,
            help="SUBLAYER:HEAD,HEAD to remove, e.g. encoder.0.self:1,3 (repeatable).",
        ),
    ] = None,
    fraction: Annotated[
        float | None, typer.Option(help="Remove this fraction of the heads, in [0, 1).")
    ] = None,
    by: Annotated[
        str | None,
        typer.Option(
            metavar="[importance|random]",
            callback=_utf8,
            help="With --fraction: the least important heads first (default), or at random.",
        ),
    ] = None,
    measure: Annotated[
        str | None,
        typer.Option(
            metavar="[ablation|gradient]",
            callback=_utf8,
            help="With --by importance: which of `aiayn heads`' measures (default ablation).",
        ),
    ] = None,
    scores: Annotated[
        Path | None,
        typer.Option(help="With --by importance: the scores (default RUN/heads/heads.json)."),
    ] = None,
    kinds: Annotated[
        str | None,
        typer.Option(
            callback=_utf8,
            help="With --fraction: prune only these, e.g. encoder.self,decoder.cross "
            "(default: all the scored kinds).",
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="With --by random: the seed (default 0).")
    ] = None,
) -> None:
    """Remove attention heads for good: a smaller model, written as a run OUT to translate.

    A key/value head goes too when no kept query head reads it. At least one head
    of each sub-layer remains. A GPT or BERT run is pruned alike (its OUT runs with
    generate or fill). See `aiayn.analysis.pruning`.
    """
    from aiayn.analysis import pruning
    from aiayn.apps import verb_of

    _warnings_to_stderr()
    try:
        done = pruning.prune_run(
            run,
            out,
            heads=heads,
            fraction=fraction,
            by=by,
            measure=measure,
            scores=scores,
            kinds=None if kinds is None else [k.strip() for k in kinds.split(",")],
            seed=seed,
        )
    except (OSError, ValueError) as err:
        raise _fail(err) from None
    before, after = done.parameters_before, done.parameters_after
    by_kind = ", ".join(f"{kind} {n}" for kind, n in done.removed_by_kind.items())
    typer.echo(
        f"pruned {sum(map(len, done.removed.values()))} of {done.heads_before} heads ({by_kind}); "
        f"parameters {before:,} -> {after:,} ({after / before - 1:+.1%})"
    )
    verb = verb_of(done.architecture)  # the pruned shape's own command
    example = {"generate": ' "..."', "fill": ' "[MASK] ..."'}.get(verb, "")
    runs_it = f"run it with: aiayn {verb} {out}{example}" if verb else "no aiayn command runs it"
    typer.echo(f"wrote {out}; {runs_it}")


# ----- output shortlists ---------------------------------------------------------

shortlist_app = typer.Typer(
    help="Output shortlists: decode over each batch's likely target pieces only.",
    no_args_is_help=True,
)
app.add_typer(shortlist_app, name="shortlist")


@shortlist_app.command("build")
def shortlist_build_command(
    model_dir: Annotated[
        Path,
        typer.Argument(help="A converted or transformers Marian directory, or an aiayn run."),
    ],
    source: Annotated[Path, typer.Option(help="Source sentences, one per line.")],
    target: Annotated[Path, typer.Option(help="Their translations, aligned by line.")],
    out: Annotated[Path, typer.Option(help="The shortlist file to write (.safetensors).")],
    frequent: Annotated[int, typer.Option(help="Most frequent target pieces kept.")] = 1000,
    per_source: Annotated[int, typer.Option(help="Translations kept per source piece.")] = 20,
    min_count: Annotated[
        int, typer.Option(help="Sentence pairs a translation must co-occur in.")
    ] = 2,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Build a shortlist from a parallel text, with the model's own tokenization.

    Use it with `aiayn translate / evaluate / serve MODEL --shortlist OUT`.
    """
    import logging

    from aiayn.apps.translate import find_tokenizer
    from aiayn.data.tokenizer import SentencePieceTokenizer
    from aiayn.files import check_output
    from aiayn.inference.shortlist import build_from_files
    from aiayn.io.checkpoint import resolve_weights
    from aiayn.io.marian import MarianTokenizer

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        check_output(out, "--out")
        if tokenizer is not None:
            subwords = SentencePieceTokenizer.load(tokenizer)
        elif (model_dir / "vocab.json").is_file():
            subwords = MarianTokenizer(model_dir)
        else:
            # find_tokenizer looks beside a weights file and up its run
            subwords = SentencePieceTokenizer.load(find_tokenizer(resolve_weights(model_dir)))
        shortlist = build_from_files(subwords, source, target, frequent, per_source, min_count)
        shortlist.save(out)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(f"wrote {out} ({shortlist}); use it with --shortlist {out}")


# ----- conversion: convert marian ----------------------------------------------

convert_app = typer.Typer(
    help="Turn checkpoints of other toolkits into aiayn directories.", no_args_is_help=True
)
app.add_typer(convert_app, name="convert")


ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace OUT, and everything in it, if it exists and is not empty (never a "
        "run, corpus or input the command reads, nor a directory inside or around one).",
    ),
]


@convert_app.command("marian")
def convert_marian_command(
    path: Annotated[
        Path, typer.Argument(help="A Marian / opus-mt directory as transformers saves it.")
    ],
    out: Annotated[Path, typer.Argument(help="The aiayn directory to write.")],
    dtype: Annotated[
        str,
        typer.Option(
            "--dtype",
            metavar="[float32|int8]",
            callback=_utf8,
            help="int8: store the weights int8 inference multiplies as int8, with their "
            "scales; `aiayn translate OUT` then runs int8 unless --dtype says otherwise.",
        ),
    ] = "float32",
    force: ForceOpt = False,
) -> None:
    """Convert a local Marian / opus-mt model; then `aiayn translate OUT` runs it.

    OUT gets model.safetensors, source.spm, target.spm, vocab.json and marian.json
    (the generation settings: beam, length penalty, max length, bad words).
    Nothing is downloaded and transformers is not needed.
    """
    from aiayn.io.marian import convert_marian

    _warnings_to_stderr()
    try:
        if dtype not in ("float32", "int8"):
            raise ValueError(f"--dtype {dtype!r}: use float32 or int8")
        weights = convert_marian(path, out, int8=dtype == "int8", force=force)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(f"wrote {weights}; translate with: aiayn translate {out}")


def _convert_hf(model_type: str, path: Path, out: Path, usage: str, force: bool) -> None:
    """`aiayn convert gpt2 / bert`: the conversion, or its error in one line."""
    from aiayn.io import hf_models

    _warnings_to_stderr()
    try:
        weights = getattr(hf_models, f"convert_{model_type}")(path, out, force=force)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(f"wrote {weights}; run it with: aiayn {usage.format(out=out)}")


HFDirArg = Annotated[Path, typer.Argument(help="A directory as transformers saves it.")]
ConvertOutArg = Annotated[Path, typer.Argument(help="The aiayn directory to write.")]


@convert_app.command("gpt2")
def convert_gpt2_command(path: HFDirArg, out: ConvertOutArg, force: ForceOpt = False) -> None:
    """Convert a local GPT-2 checkpoint; then `aiayn generate OUT "..."` runs it.

    OUT gets model.safetensors, the tokenizer files and converted.json. Nothing is
    downloaded. Configurations the mapping does not cover are refused by field.
    """
    _convert_hf("gpt2", path, out, 'generate {out} "In the beginning"', force)


@convert_app.command("bert")
def convert_bert_command(path: HFDirArg, out: ConvertOutArg, force: ForceOpt = False) -> None:
    """Convert a local BERT (masked-LM) checkpoint; then `aiayn fill OUT "... [MASK] ..."`.

    OUT gets model.safetensors, the tokenizer files and converted.json. Nothing is
    downloaded. Configurations the mapping does not cover are refused by field.
    """
    _convert_hf("bert", path, out, 'fill {out} "For God so [MASK] the world"', force)


# ----- export: the inverse of convert -----------------------------------------------


@app.command()
def export(
    run: Annotated[Path, typer.Argument(help="Run, checkpoint directory or weights file.")],
    out: Annotated[Path, typer.Argument(help="The directory to write.")],
    to: Annotated[
        str,
        typer.Option("--to", metavar="[hf|ctranslate2]", callback=_utf8, help="The format."),
    ] = "hf",
    quantization: Annotated[
        str | None,
        typer.Option(
            "--quantization",
            metavar="[int8|int8_float32|bfloat16]",
            callback=_utf8,
            help="ctranslate2 only: the weights' type (default float32).",
        ),
    ] = None,
    beam: Annotated[int, typer.Option(help="num_beams in generation_config.json.")] = 4,
    alpha: Annotated[
        float, typer.Option(help="length_penalty in generation_config.json (|Y|^alpha).")
    ] = 0.6,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            "--tokenizer", help="Subword model (default: the run's spm.model, beside its weights)."
        ),
    ] = None,
    force: ForceOpt = False,
) -> None:
    """Export a trained model for transformers (--to hf) or CTranslate2 (--to ctranslate2).

    An encoder-decoder becomes MarianMTModel (post-norm) or
    PegasusForConditionalGeneration (pre-norm), a decoder-only model GPT2LMHeadModel
    (GPTNeoXForCausalLM with rotary positions), an encoder-only one BertForMaskedLM,
    with tokenizer files, generation_config.json
    and a model card (README.md). A setting no target expresses exactly is refused by
    name and nothing is written.
    """
    from aiayn.io.export import TARGETS, GenerationSettings
    from aiayn.io.export import export as export_model

    _warnings_to_stderr()
    try:
        if to not in TARGETS:
            raise ValueError(f"--to {to!r}: not one of {', '.join(TARGETS)}")
        if quantization is not None and to != "ctranslate2":
            raise ValueError("--quantization applies to --to ctranslate2 only")
        options = {"generation": GenerationSettings(beam=beam, length_penalty=alpha)}
        options["spm"] = tokenizer
        if to == "ctranslate2":
            options["quantization"] = quantization
        export_model(run, out, to=to, force=force, **options)
    except (FileNotFoundError, ValueError) as err:
        raise _fail(err) from None
    typer.echo(f"wrote {out} ({to})")


# ----- serving ---------------------------------------------------------------------


@app.command()
def serve(
    run: Annotated[
        Path,
        typer.Argument(help="Run, checkpoint or converted directory, or a Marian directory."),
    ],
    host: Annotated[str, typer.Option(callback=_utf8, help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    queue_size: Annotated[int, typer.Option(help="Sentences waiting at most (429 above).")] = 256,
    max_tokens: Annotated[
        int, typer.Option(help="Source tokens per batch, padding included.")
    ] = 4096,
    max_batch: Annotated[int, typer.Option(help="Sentences per batch (1 = no batching).")] = 128,
    max_wait_ms: Annotated[
        float, typer.Option(help="How long the model may idle while sentences wait for company.")
    ] = 5.0,
    max_chars: Annotated[int, typer.Option(help="Characters per request (413 above).")] = 20_000,
    max_sentences: Annotated[int, typer.Option(help="Sentences per request (413 above).")] = 64,
    max_request_tokens: Annotated[
        int, typer.Option(help="Source tokens per request (413 above).")
    ] = 4096,
    max_beam: Annotated[int, typer.Option(help="Widest beam a request may ask for.")] = 16,
    deadline: Annotated[
        float, typer.Option(help="Seconds a request may take, queueing included (504 after).")
    ] = 30.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a request's body may take to arrive (408 after).")
    ] = 30.0,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a request's headers may take (the connection closes).")
    ] = 10.0,
    max_response_bytes: Annotated[
        int, typer.Option(help="Largest answer with attention maps (413 above).")
    ] = 32 * 2**20,
    threads: Annotated[int, typer.Option(help="torch threads of the inference thread.")] = 1,
    continuous: Annotated[
        int,
        typer.Option(
            help="Decode N sentences at once by continuous batching: each joins at the next "
            "step and leaves when done (0: dynamic batching).",
        ),
    ] = 0,
    compile: Annotated[
        bool, typer.Option("--compile", help="With --continuous: compile the decoding step.")
    ] = False,
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = True,
    device: DeviceOpt = "cpu",
    dtype: ModelPrecisionOpt = None,
    tokenizer: TokenizerOpt = None,
    shortlist: ShortlistOpt = None,
) -> None:
    """Serve translations over HTTP with dynamic batching, and the attention explorer.

    POST /v1/translate, GET /health /ready /info /metrics; the API's documentation is
    at /docs. SIGTERM finishes the requests in flight, then exits.
    """
    from aiayn.apps.serve import ServeConfig, ServerError, create_app, run_server
    from aiayn.apps.translate import Translator

    _warnings_to_stderr()
    try:
        settings = ServeConfig(
            queue_size=queue_size,
            max_tokens=max_tokens,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            max_chars=max_chars,
            max_sentences=max_sentences,
            max_request_tokens=max_request_tokens,
            max_beam=max_beam,
            deadline_s=deadline,
            body_timeout_s=body_timeout,
            header_timeout_s=header_timeout,
            max_response_bytes=max_response_bytes,
            threads=threads,
            continuous=continuous,
            compile=compile,
        )
        if continuous and shortlist is not None:
            raise ValueError(
                "--continuous decodes onto the whole vocabulary: it does not take --shortlist"
            )
        _check_device(device)
        if (run / "config.json").is_file():  # a Marian directory as transformers saves it
            translator = Translator.from_marian(
                run,
                device=device,
                dtype=None if dtype is None else dtype.dtype,
                shortlist=shortlist,
            )
        else:
            translator = _load_translator(run, device, tokenizer, dtype, shortlist)
        server = create_app(translator, settings, run)
        run_server(server, host, port, access_log)
    except (FileNotFoundError, ValueError, ServerError) as err:
        raise _fail(err) from None


# ----- the main job: quickstart ------------------------------------------------


@app.command()
def quickstart(
    out: Annotated[Path, typer.Option(help="Directory for everything it writes.")] = Path(
        "quickstart"
    ),
    minutes: Annotated[
        float, typer.Option(help="Training time in all; a second run resumes up to it.")
    ] = 15.0,
    device: Annotated[
        str | None, typer.Option(callback=_utf8, help="cpu or cuda (default: cuda when available).")
    ] = None,
    recipe: Annotated[
        Path | None,
        typer.Option(
            help="Training recipe, a file or a packaged name (default: bible-en-es-{cpu,gpu})."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", callback=_utf8, help="Recipe override section.key=value (repeatable)."
        ),
    ] = None,
    vocab_size: Annotated[
        int | None, typer.Option(help="Shared subword vocabulary size (default: tuned).")
    ] = None,
    average: Annotated[
        int,
        typer.Option(help="Average the last K checkpoints (1: none; the best validation loss)."),
    ] = 1,
    test_pairs: Annotated[
        int | None, typer.Option(help="Score only the first N test pairs (default: all).")
    ] = None,
    beam: BeamOpt = 8,
    alpha: AlphaOpt = 1.0,
    seed: Annotated[
        int | None,
        typer.Option(help="Training seed (default: the recipe's); a run resumes with its own."),
    ] = None,
) -> None:
    """The demo: prepare the Bible (English -> Spanish), train, evaluate, translate, plot."""
    from aiayn.apps.quickstart import QuickstartConfig, default_device, run_quickstart
    from aiayn.data.bible import SwordModuleMissing
    from aiayn.files import check_output
    from aiayn.inference.search import DecodeConfig

    _warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True)
        DecodeConfig(beam=beam, alpha=alpha)  # refused now, not after the training
        config = QuickstartConfig(
            out=out,
            minutes=minutes,
            device=device or default_device(),
            recipe=recipe,
            overrides=tuple(set_ or ()),
            **({"vocab_size": vocab_size} if vocab_size else {}),
            average_last=average,
            beam=beam,
            alpha=alpha,
            test_pairs=test_pairs,
            seed=seed,
        )
        run_quickstart(config, echo=typer.echo)
    except (SwordModuleMissing, FileNotFoundError, ValueError) as err:
        raise _fail(err) from None


def __getattr__(name: str):
    """`click_app`: the click command behind `app`, which the docs' CLI reference
    (mkdocs-click) reads; built on request, so a plain `aiayn` run never builds it."""
    if name == "click_app":
        return typer.main.get_command(app)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    app()
