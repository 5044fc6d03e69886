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

prepare_app = typer.Typer(
    help="Build a corpus directory: aligned splits, a shared subword model, stats.json.",
    no_args_is_help=True,
)
app.add_typer(prepare_app, name="prepare")

_OUT = typer.Option(..., "--out", help="Directory to write (created if missing).")
_MAX_TOKENS = typer.Option(256, help="Drop training pairs longer than this, in subwords.")
_MAX_RATIO = typer.Option(3.0, help="Drop training pairs whose sides differ more in length.")
_SEED = typer.Option(0, help="Seed of the subword model's training sample.")


def _prepare_config(vocab_size: int, max_tokens: int, max_ratio: float, seed: int):
    from aiayn.data.prepare import PrepareConfig

    return PrepareConfig(
        vocab_size=vocab_size, max_tokens=max_tokens, max_ratio=max_ratio, seed=seed
    )


def _run_prepare(build) -> None:
    """Run a prepare function; report the result, or the error without a traceback."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        corpus = build()
    except (OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
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
    src: str = typer.Option("web", help="English source: web (World English Bible) or kjv."),
    vocab_size: int = typer.Option(8000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
):
    """The built-in corpus: the Bible, English to Spanish, from Debian's SWORD modules."""
    from aiayn.data.bible import EnglishSource
    from aiayn.data.prepare import prepare_bible

    try:
        english = EnglishSource(src.lower())
    except ValueError:
        raise typer.BadParameter(f"--src must be web or kjv, got {src!r}") from None
    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
    _run_prepare(lambda: prepare_bible(out, english, config))


@prepare_app.command("text")
def prepare_text_command(
    src_train: str = typer.Option(..., help="Training source sentences, one per line."),
    tgt_train: str = typer.Option(..., help="Training target sentences, aligned by line."),
    src_lang: str = typer.Option(..., help="Source language code, the file suffix (en)."),
    tgt_lang: str = typer.Option(..., help="Target language code (de)."),
    out: str = _OUT,
    src_valid: str | None = typer.Option(None, help="Validation source sentences."),
    tgt_valid: str | None = typer.Option(None, help="Validation target sentences."),
    src_test: str | None = typer.Option(None, help="Test source sentences."),
    tgt_test: str | None = typer.Option(None, help="Test target sentences."),
    vocab_size: int = typer.Option(37000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
):
    """Aligned plain text files, one sentence per line (fairseq / OpenNMT style)."""
    from aiayn.data.prepare import prepare_text

    def both(src: str | None, tgt: str | None, split: str):
        if (src is None) != (tgt is None):
            raise typer.BadParameter(f"give both --src-{split} and --tgt-{split}, or neither")
        return (src, tgt) if src is not None else None

    valid, test = both(src_valid, tgt_valid, "valid"), both(src_test, tgt_test, "test")
    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
    _run_prepare(
        lambda: prepare_text((src_train, tgt_train), out, src_lang, tgt_lang, valid, test, config)
    )


@prepare_app.command("tsv")
def prepare_tsv_command(
    train: str = typer.Option(..., help="Training pairs: source<TAB>target per line."),
    src_lang: str = typer.Option(..., help="Source language code (en)."),
    tgt_lang: str = typer.Option(..., help="Target language code (de)."),
    out: str = _OUT,
    valid: str | None = typer.Option(None, help="Validation pairs, same format."),
    test: str | None = typer.Option(None, help="Test pairs, same format."),
    vocab_size: int = typer.Option(37000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
):
    """Files of two tab-separated columns: source, then target."""
    from aiayn.data.prepare import prepare_tsv

    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
    _run_prepare(lambda: prepare_tsv(train, out, src_lang, tgt_lang, valid, test, config))


@prepare_app.command("hf")
def prepare_hf_command(
    name: str = typer.Argument(..., help="Dataset name (wmt14) or a save_to_disk folder."),
    config_name: str | None = typer.Option(None, "--config", help="Dataset config (de-en)."),
    src_lang: str = typer.Option(..., help="Source language code (en)."),
    tgt_lang: str = typer.Option(..., help="Target language code (de)."),
    out: str = _OUT,
    vocab_size: int = typer.Option(37000, help="Shared subword vocabulary size."),
    max_tokens: int = _MAX_TOKENS,
    max_ratio: float = _MAX_RATIO,
    seed: int = _SEED,
):
    """A Hugging Face datasets source (downloads when given a name; needs the hf extra)."""
    from aiayn.data.prepare import prepare_hf

    config = _prepare_config(vocab_size, max_tokens, max_ratio, seed)
    _run_prepare(lambda: prepare_hf(name, out, src_lang, tgt_lang, config_name, config))


# ----- training: train, average ----------------------------------------------


# ----- inference: translate, evaluate, attention -----------------------------


if __name__ == "__main__":
    app()
