"""Other toolkits' checkpoints in and out: `aiayn convert marian / gpt2 / bert` and
`aiayn export` (to transformers or CTranslate2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    ForceOpt,
    command,
    fail,
    utf8,
    warnings_to_stderr,
)

convert_app = typer.Typer(
    help="Turn checkpoints of other toolkits into aiayn directories.", no_args_is_help=True
)


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
            callback=utf8,
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

    warnings_to_stderr()
    try:
        if dtype not in ("float32", "int8"):
            raise ValueError(f"--dtype {dtype!r}: use float32 or int8")
        weights = convert_marian(path, out, int8=dtype == "int8", force=force)
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
    typer.echo(f"wrote {weights}; translate with: aiayn translate {out}")


def _convert_hf(model_type: str, path: Path, out: Path, usage: str, force: bool) -> None:
    """`aiayn convert gpt2 / bert`: the conversion, or its error in one line."""
    from aiayn.io import hf_models

    warnings_to_stderr()
    try:
        weights = getattr(hf_models, f"convert_{model_type}")(path, out, force=force)
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
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


@command()
def export(
    run: Annotated[Path, typer.Argument(help="Run, checkpoint directory or weights file.")],
    out: Annotated[Path, typer.Argument(help="The directory to write.")],
    to: Annotated[
        str,
        typer.Option("--to", metavar="[hf|ctranslate2]", callback=utf8, help="The format."),
    ] = "hf",
    quantization: Annotated[
        str | None,
        typer.Option(
            "--quantization",
            metavar="[int8|int8_float32|bfloat16]",
            callback=utf8,
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

    warnings_to_stderr()
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
        raise fail(err) from None
    typer.echo(f"wrote {out} ({to})")
