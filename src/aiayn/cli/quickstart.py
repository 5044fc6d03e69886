"""`aiayn demo` (the paper's models in a few lines) and `aiayn quickstart` (prepare,
train, evaluate, translate and plot the Bible, English to Spanish)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    AlphaOpt,
    BeamOpt,
    command,
    fail,
    restart_with_jemalloc,
    utf8,
    warnings_to_stderr,
)


@command()
def demo(vocab_size: int = typer.Option(37000, help="Shared vocabulary size for the presets.")):
    """Build the paper's models, run a forward pass of a tiny one, print shapes and sizes."""
    import torch

    from aiayn import ModelConfig, Transformer

    try:
        ModelConfig.tiny(vocab_size=vocab_size)
    except ValueError as err:
        raise fail(err) from None
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


@command()
def quickstart(
    out: Annotated[Path, typer.Option(help="Directory for everything it writes.")] = Path(
        "quickstart"
    ),
    minutes: Annotated[
        float, typer.Option(help="Training time in all; a second run resumes up to it.")
    ] = 15.0,
    device: Annotated[
        str | None, typer.Option(callback=utf8, help="cpu or cuda (default: cuda when available).")
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
            "--set", callback=utf8, help="Recipe override section.key=value (repeatable)."
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
    restart_with_jemalloc()  # where jemalloc is installed: this command again, with it
    from aiayn.apps.quickstart import QuickstartConfig, default_device, run_quickstart
    from aiayn.data.bible import SwordModuleMissing
    from aiayn.data.files import check_output
    from aiayn.inference.search import DecodeConfig

    warnings_to_stderr()
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
        raise fail(err) from None
