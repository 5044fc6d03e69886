"""The `aiayn` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="aiayn",
    help="The Transformer of 'Attention Is All You Need': train, translate, score, look inside.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """The Transformer of 'Attention Is All You Need': train, translate, score, look inside."""


@app.command()
def demo(vocab_size: int = typer.Option(37000, help="Shared vocabulary size for the presets.")):
    """Build the paper's models, run a forward pass of a tiny one, print shapes and sizes."""
    import torch

    from aiayn import ModelConfig, Transformer

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


# ----- training: train, average ----------------------------------------------


# ----- inference: translate, evaluate, attention -----------------------------


if __name__ == "__main__":
    app()
