"""What the `aiayn` commands share: one-line errors, the UTF-8 check of text arguments,
the options several commands take, and the loaders of a run's translator or language model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup

from aiayn.config import Precision


def command(**settings) -> Callable:
    """Mark a function as a top-level `aiayn` command, with typer's `settings` for it.

    `aiayn.cli` registers the marked functions on its app in the order its help lists them.
    """

    def mark(function: Callable) -> Callable:
        function.typer_settings = settings
        return function

    return mark


# ----- errors ----------------------------------------------------------------------


def fail(err: Exception) -> typer.Exit:
    """Report a user error in one line (no traceback) and exit with status 1."""
    if type(err).__str__ is OSError.__str__ and err.filename is not None:  # "[Errno 28] ..."
        err = f"{err.filename}: {err.strerror}"
    typer.echo(f"aiayn: error: {err}", err=True)
    return typer.Exit(code=1)


class OneLineErrors(TyperGroup):
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
            raise fail(err) from None


def restart_with_jemalloc() -> None:
    """A training command's first step: `aiayn.training.host_memory.restart_with_jemalloc`
    (this command again with jemalloc preloaded, where installed); a bad
    AIAYN_HOST_MEMORY is a one-line error."""
    from aiayn.training import host_memory

    try:
        host_memory.restart_with_jemalloc()
    except ValueError as err:
        raise fail(err) from None


def utf8(param: typer.CallbackParam, value):
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
            raise fail(
                ValueError(
                    f"{name}: invalid UTF-8 ({byte} at character {err.start + 1}); "
                    "give the text as UTF-8"
                )
            ) from None
    return value


def warnings_to_stderr() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="aiayn: %(levelname)s: %(message)s")


def info_to_stderr() -> None:
    """Progress lines of the data builders (logging's INFO) as plain lines on stderr."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")


# ----- options ---------------------------------------------------------------------

RunArg = Annotated[
    Path, typer.Argument(help="Run directory, checkpoint directory or .safetensors file.")
]
BeamOpt = Annotated[int, typer.Option("--beam", help="Beam width (1 = greedy search).")]
AlphaOpt = Annotated[float, typer.Option("--alpha", help="Length penalty exponent (section 6).")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", help="Source tokens per batch.")]
DeviceOpt = Annotated[str, typer.Option("--device", callback=utf8, help="cpu, cuda, cuda:1, ...")]
# Inference names a `Precision` by torch's name of its dtype (auto names none).
_DTYPES = {p.dtype_name: p for p in Precision if p is not Precision.AUTO}


# ... and `--dtype auto` (translate, serve) names AUTO by its own name.
_AUTO_DTYPES = {**_DTYPES, Precision.AUTO.value: Precision.AUTO}


def _precision_parser(names: dict[str, Precision]) -> Callable[[str | Precision], Precision]:
    """The `--dtype` parser that takes `names`."""

    def parse(name: str | Precision) -> Precision:
        if isinstance(name, Precision):  # the default
            return name
        if name not in names:
            raise typer.BadParameter(f"{name!r}; use {', '.join(names)}")
        return names[name]

    return parse


_inference_precision = _precision_parser(_DTYPES)


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
AutoPrecisionOpt = Annotated[
    Precision,
    typer.Option(
        "--dtype",
        parser=_precision_parser(_AUTO_DTYPES),
        metavar="[" + "|".join(_AUTO_DTYPES) + "]",
        show_default="auto",
        envvar="AIAYN_DTYPE",
        help="Model precision. auto: int8 for the weights of `convert marian --dtype int8`, "
        "else float32 or bfloat16, whichever decodes this model faster here (a few steps "
        "timed at load; bfloat16 only if clearly faster: aiayn.apps.precision_choice). "
        "AIAYN_DTYPE in the environment sets the default (a deployment, a test suite).",
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
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Replace OUT, and everything in it, if it exists and is not empty (never a "
        "run, corpus or input the command reads, nor a directory inside or around one).",
    ),
]


# ----- runs and the models in them -------------------------------------------------


def check_device(device: str) -> None:
    from aiayn.config.devices import usable_device

    usable_device(device, "--device")


def architecture_of(run: Path) -> str:
    """The model shape of the weights a run (or checkpoint) resolves to."""
    from aiayn.io.checkpoint import read_config, resolve_weights

    return read_config(resolve_weights(run)).architecture


def split_files(run: Path, split: str) -> tuple[Path, Path]:
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


def load_translator(
    run: Path,
    device: str,
    tokenizer: Path | None,
    precision: Precision | None = None,
    shortlist: Path | None = None,
):
    """RUN's `Translator`; `precision` None or AUTO: the weights' type (`--dtype auto` then
    times float32 against bfloat16 with `Translator.choose_precision`)."""
    from aiayn.apps.translate import Translator

    check_device(device)
    given = precision not in (None, Precision.AUTO)
    return Translator.load(  # a GPT or BERT run is refused by name before its weights are read
        run,
        device=device,
        tokenizer=tokenizer,
        dtype=precision.dtype if given else None,
        shortlist=shortlist,
    )


def load_lm(run: Path, device: str, command: str, precision: Precision = Precision.FP32):
    """The `Generator` (command "generate") or `MaskFiller` ("fill") of RUN: an aiayn run
    or checkpoint, a directory `aiayn convert` wrote, or a transformers directory."""
    check_device(device)
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
