"""`aiayn train`, `aiayn average` and `aiayn evaluate`: a run from a recipe, the
average of its last checkpoints, and its scores."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    DeviceOpt,
    MaxTokensOpt,
    ModelPrecisionOpt,
    RunArg,
    ShortlistOpt,
    TokenizerOpt,
    command,
    fail,
    load_translator,
    restart_with_jemalloc,
    split_files,
    utf8,
    warnings_to_stderr,
)
from aiayn.config.recipes import recipe_names


@command(
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
        typer.Argument(callback=utf8, help="section.key=value overrides of the recipe."),
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
            "--device", callback=utf8, help="cpu, cuda, cuda:1 (default: cuda if available)."
        ),
    ] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
) -> None:
    """Train a Transformer from a recipe; checkpoints, metrics and logs go to --run."""
    restart_with_jemalloc()  # where jemalloc is installed: this command again, with it
    import logging

    from aiayn.config.recipes import find_recipe
    from aiayn.data.files import check_output
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
        raise fail(err) from None
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
        raise fail(ValueError("too many non-finite losses in a row; see RUN/train.log"))
    if result.signal_number is not None:  # the shell's convention: 128 + the signal
        raise typer.Exit(code=128 + result.signal_number)


@command()
def average(
    run: Annotated[Path, typer.Argument(help="Run directory.")],
    last: Annotated[int, typer.Option("--last", help="Average this many latest checkpoints.")] = 5,
) -> None:
    """Average the last K step checkpoints (section 6) into RUN/checkpoints/average-last-K."""
    from aiayn.io.checkpoint import average_last, averaged_steps

    try:
        path = average_last(run, last)
    except (OSError, ValueError) as err:
        raise fail(err) from None
    steps = ", ".join(str(step) for step in averaged_steps(path.parent) or [])
    typer.echo(f"wrote {path} (the average of steps {steps})")


@command()
def evaluate(
    run: RunArg,
    split: Annotated[
        str | None,
        typer.Option(
            callback=utf8, help="Score a split (valid, test) of the corpus RUN was trained on."
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
    from aiayn.data.files import check_output, read_lines
    from aiayn.training import evaluate as scoring

    warnings_to_stderr()
    try:
        if (split is None) == (src is None and ref is None) or (src is None) != (ref is None):
            raise ValueError("give either --split NAME or both --src FILE and --ref FILE")
        if split is not None:
            src, ref = split_files(run, split)
        name = split or src.stem
        out_dir = out or (run if run.is_dir() else run.parent) / "eval" / name
        check_output(out_dir, "--out", directory=True)
        sources, references = read_lines(src), read_lines(ref)
        if len(sources) != len(references):
            raise ValueError(f"{src} has {len(sources)} lines but {ref} has {len(references)}")
        translator = load_translator(run, device, tokenizer, dtype, shortlist)
        hypotheses = translator.translate(
            sources, beam=beam, alpha=alpha, max_tokens=max_tokens, progress=True
        )
        scores = scoring.score(hypotheses, references)
        json_path = scoring.write_report(scores, hypotheses, out_dir)
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
    typer.echo(scores.summary())
    typer.echo(f"wrote {out_dir / 'hypotheses.txt'} and {json_path}", err=True)
