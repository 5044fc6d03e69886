"""Interpretability: `aiayn lens` (the logit lens), `aiayn patch` (activation
patching), `aiayn induction` (induction heads) and `aiayn align` (word alignment)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    DeviceOpt,
    RunArg,
    TokenizerOpt,
    architecture_of,
    command,
    fail,
    load_lm,
    load_translator,
    split_files,
    utf8,
    warnings_to_stderr,
)


@command()
def lens(
    run: RunArg,
    text: Annotated[
        str, typer.Argument(callback=utf8, help="The source sentence, or a GPT run's prompt.")
    ],
    target: Annotated[
        str | None,
        typer.Option(
            callback=utf8,
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
    from aiayn.data.files import check_output

    warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run, tokenizer])
        if top_k < 1:
            raise ValueError(f"--top-k must be at least 1, got {top_k}")
        architecture = architecture_of(run)
        if architecture not in (ENCODER_DECODER, DECODER_ONLY):
            raise ValueError(
                f"{run} holds a model of shape {architecture}, which does not predict the "
                "next token: the logit lens reads a translation or GPT run (encoder_decoder "
                "or decoder_only)"
            )
        if architecture == ENCODER_DECODER:
            user = load_translator(run, device, tokenizer)
        elif tokenizer is not None:
            raise ValueError(f"--tokenizer is for a translation run; {run} holds its own")
        else:
            user = load_lm(run, device, "generate")
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
        raise fail(err) from None
    typer.echo(lens_table(result, user.tokenizer), nl=False)
    for path in paths:
        typer.echo(str(path), err=True)


@command()
def patch(
    run: RunArg,
    clean: Annotated[str, typer.Option(callback=utf8, help="The clean text (source or prompt).")],
    corrupt: Annotated[
        str, typer.Option(callback=utf8, help="The corrupted text, as many tokens as --clean.")
    ],
    metric: Annotated[str, typer.Option(help="logit-diff (--right, --wrong) or logprob.")] = (
        "logit-diff"
    ),
    right: Annotated[
        str | None,
        typer.Option(callback=utf8, help="logit-diff: the token the clean run favours."),
    ] = None,
    wrong: Annotated[
        str | None, typer.Option(callback=utf8, help="logit-diff: the token to compare it with.")
    ] = None,
    target: Annotated[
        str,
        typer.Option(
            callback=utf8,
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
    from aiayn.analysis.patching_text import patch_text, write_patching
    from aiayn.apps.model_use import DECODER_ONLY, ENCODER_DECODER
    from aiayn.data.files import check_output

    warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run])
        architecture = architecture_of(run)
        if architecture == ENCODER_DECODER:
            user = load_translator(run, device, None)
        elif architecture == DECODER_ONLY:
            user = load_lm(run, device, "generate")
        else:
            raise ValueError(f"aiayn patch runs translation and GPT runs; {run} is {architecture}")
        report = patch_text(
            user.model, user.tokenizer, clean, corrupt, metric, right, wrong, target, stack, point,
            normalize, heads,
        )  # fmt: skip
        paths = write_patching(report, out, run=str(run))
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
    typer.echo(f"clean {report.clean_metric:.4f}, corrupted {report.corrupt_metric:.4f} ({metric})")
    for path in paths:
        typer.echo(str(path))


@command()
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
    from aiayn.data.files import check_output

    warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run])
        if html is not None:
            check_output(html, "--html", reads=[run])
        for name, value in (("--length", length), ("--batch", batch)):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        architecture = architecture_of(run)
        if architecture != DECODER_ONLY:
            raise ValueError(
                f"aiayn induction scores a GPT run (decoder_only); {run} holds a "
                f"{architecture} model"
            )
        user = load_lm(run, device, "generate")
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
        raise fail(err) from None
    typer.echo("layer head  induction  previous-token  copying")
    for layer, head in scores.top_heads():
        matching, previous, copying = (
            float(grid[layer, head])
            for grid in (scores.induction, scores.previous_token, scores.copying)
        )
        typer.echo(f"{layer:>5} {head:>4}  {matching:>9.3f}  {previous:>14.3f}  {copying:>7.3f}")
    for path in paths:
        typer.echo(str(path), err=True)


@command()
def align(
    run: RunArg,
    pairs: Annotated[int, typer.Option(help="Pairs to align, from the start.")] = 100,
    split: Annotated[
        str | None,
        typer.Option(callback=utf8, help="The split of RUN's corpus to align (default: test)."),
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
    from aiayn.data.files import check_output

    warnings_to_stderr()
    try:
        check_output(out, "--out", directory=True, reads=[run, src, ref])
        if pairs < 1:
            raise ValueError(f"--pairs must be at least 1, got {pairs}")
        if model1_pairs < 0:
            raise ValueError(f"--model1-pairs must be at least 0, got {model1_pairs}")
        if (split is not None and src is not None) or (src is None) != (ref is None):
            raise ValueError("give --split NAME or both --src FILE and --ref FILE, not both")
        architecture = architecture_of(run)
        if architecture != ENCODER_DECODER:
            raise ValueError(
                f"aiayn align reads a translation model's cross-attention; {run} holds a "
                f"{architecture} model"
            )
        if src is None or ref is None:
            split = split or "test"
            src, ref = split_files(run, split)
            check_output(out, "--out", directory=True, reads=[src, ref])  # nor in the corpus
        train = []
        if (run / "config.yaml").is_file() and model1_pairs:
            train = read_parallel(*split_files(run, "train"))[:model1_pairs]
        chosen = read_parallel(src, ref)[:pairs]
        translator = load_translator(run, device, None)
        report = align_pairs(translator.model, translator.tokenizer, chosen, train)
        path = write_alignment(report, out, run=str(run), src=str(src), ref=str(ref))
    except (OSError, ValueError) as err:
        raise fail(err) from None
    typer.echo(report.table(), nl=False)
    typer.echo(str(path), err=True)
