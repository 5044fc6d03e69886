"""The language models: `aiayn generate` (decoder-only, GPT) and `aiayn fill`
(encoder-only, BERT)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    DeviceOpt,
    PrecisionOpt,
    command,
    fail,
    load_lm,
    utf8,
    warnings_to_stderr,
)
from aiayn.config import Precision


@command()
def generate(
    run: Annotated[
        Path,
        typer.Argument(help="Run, checkpoint or converted directory, or a GPT-2 directory."),
    ],
    prompt: Annotated[str, typer.Argument(callback=utf8, help="The text to continue.")],
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

    warnings_to_stderr()
    try:
        generator = load_lm(run, device, "generate", dtype)
        if static or compile:
            generator.use_static_step(compile)
        pieces = generator.stream(prompt, max_tokens, temperature, top_k, top_p, seed, greedy)
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
    sys.stdout.write(prompt)
    for piece in pieces:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


@command()
def fill(
    run: Annotated[
        Path,
        typer.Argument(help="Run, checkpoint or converted directory, or a BERT directory."),
    ],
    text: Annotated[str, typer.Argument(callback=utf8, help="Text with one or more [MASK]s.")],
    top_k: Annotated[int, typer.Option(help="Candidates per [MASK].")] = 5,
    device: DeviceOpt = "cpu",
    dtype: PrecisionOpt = Precision.FP32,
) -> None:
    """Fill each [MASK] of TEXT with an encoder-only (BERT) model: top-k tokens, probabilities."""
    warnings_to_stderr()
    try:
        filler = load_lm(run, device, "fill", dtype)
        candidates = filler.fill(text, top_k)
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
    for number, options in enumerate(candidates, start=1):
        typer.echo(f"[MASK] {number}:")
        for token, probability in options:
            typer.echo(f"  {probability:.4f}  {token}")
