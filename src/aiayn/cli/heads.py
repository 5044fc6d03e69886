"""Looking at the heads: `aiayn attention` (heat maps), `aiayn heads` (what each does)
and `aiayn prune` (removing them for good)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    DeviceOpt,
    RunArg,
    TokenizerOpt,
    architecture_of,
    check_device,
    command,
    fail,
    load_lm,
    load_translator,
    split_files,
    utf8,
    warnings_to_stderr,
)


@command()
def attention(
    run: RunArg,
    sentence: Annotated[str, typer.Argument(callback=utf8, help="The source sentence.")],
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
    from aiayn.data.files import check_output
    from aiayn.inference.search import DecodeConfig

    warnings_to_stderr()
    try:
        architecture = architecture_of(run)
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
        translator = load_translator(run, device, tokenizer)
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
        raise fail(err) from None
    for path in paths.values():
        typer.echo(str(path))


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

    check_device(device)
    if not sentence.strip():
        raise ValueError("cannot draw attention for an empty sentence")
    verb = verb_of(architecture)  # the shape's own command reads the sentence
    if verb not in ("generate", "fill"):
        raise ValueError(f"{run} holds a {architecture} model, which no aiayn command runs")
    user = load_lm(run, device, verb)
    ids = user.encode_prompt(sentence) if verb == "generate" else user.encode(sentence)
    pieces = [user.tokenizer.id_to_piece(i) for i in ids]
    batch = torch.tensor([ids], dtype=torch.long, device=user.device)  # (1, T)
    return plot_self_attention(user.model, batch, pieces, out, layers or None, heads or None)


@command()
def heads(
    run: Annotated[Path, typer.Argument(help="Run directory trained by aiayn (with its corpus).")],
    split: Annotated[
        str, typer.Option(callback=utf8, help="The corpus split to measure on.")
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
    from aiayn.data.files import check_output

    warnings_to_stderr()
    try:
        check_output(out or run / HEADS_FILE.parent, "--out", directory=True)
        if sentences < 1:
            raise ValueError(f"--sentences must be at least 1, got {sentences}")
        if not (run / "config.yaml").is_file():
            raise FileNotFoundError(
                f"aiayn heads needs a run trained by aiayn with a corpus; {run / 'config.yaml'} "
                "is missing (a converted or bare checkpoint has no validation split)"
            )
        pairs = read_parallel(*split_files(run, split))
        translator = load_translator(run, device, None)
        report = head_report(
            translator.model, translator.tokenizer, pairs, sentences, batch_tokens=max_tokens
        )
        paths = write_head_report(report, out or run / HEADS_FILE.parent, run=str(run), split=split)
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
    for path in paths:
        typer.echo(str(path))


@command()
def prune(
    run: RunArg,
    out: Annotated[
        Path, typer.Option("--out", help="The pruned run directory to write (must not exist).")
    ],
    heads: Annotated[
        list[str] | None,
        typer.Option(
            "--heads",
            callback=utf8,
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
            callback=utf8,
            help="With --fraction: the least important heads first (default), or at random.",
        ),
    ] = None,
    measure: Annotated[
        str | None,
        typer.Option(
            metavar="[ablation|gradient]",
            callback=utf8,
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
            callback=utf8,
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

    warnings_to_stderr()
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
        raise fail(err) from None
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
