"""`aiayn translate` and `aiayn shortlist build`: a run's translations of a file or
stdin, and the output shortlists that narrow them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    AutoPrecisionOpt,
    DeviceOpt,
    MaxTokensOpt,
    RunArg,
    ShortlistOpt,
    TokenizerOpt,
    command,
    fail,
    load_translator,
    warnings_to_stderr,
)
from aiayn.config import Precision


@command()
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
    dtype: AutoPrecisionOpt = Precision.AUTO,
    tokenizer: TokenizerOpt = None,
    shortlist: ShortlistOpt = None,
    continuous: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Decode N sentences at once on the continuous-batching engine: each "
            "takes a free slot as another finishes (0: batches of --max-tokens; default: "
            "the one measured faster, see aiayn.apps.decoder_choice).",
        ),
    ] = None,
    compile: Annotated[
        bool, typer.Option("--compile", help="With --continuous: compile its step first.")
    ] = False,
) -> None:
    """Translate stdin or a file, one sentence per line, keeping order and empty lines.

    Search settings not given are the model's: the paper's (section 6) for our own
    runs, the config's for a converted Marian model (see `aiayn convert marian`).
    """
    import sys

    import torch

    from aiayn.apps.decoder_choice import Use, default_decoder
    from aiayn.data.files import check_output, decode_lines, read_lines

    warnings_to_stderr()
    given = {"beam": beam, "alpha": alpha, "extra_len": extra_len}
    try:
        if compile and not continuous:
            raise ValueError("--compile compiles the engine's step: give --continuous N too")
        if output is not None:  # never over or inside the run, the input or a model file
            check_output(output, "-o", reads=[run, input, tokenizer, shortlist])
        lines = read_lines(input) if input else list(decode_lines(sys.stdin.buffer, "<stdin>"))
        translator = load_translator(run, device, tokenizer, dtype, shortlist)
        config = translator.decode_config(
            nbest=nbest,
            sampling=sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            **{name: value for name, value in given.items() if value is not None},
        )
        if continuous is None:  # the decoder measured faster in this setting
            continuous = default_decoder(
                Use.FILE, config.beam, torch.get_num_threads(), device, shortlist is not None
            ).continuous
        rows = translator.encode(lines)
        progress = output is not None
        if dtype is Precision.AUTO:  # timed on the first batch the decoder will run
            first = sorted(rows, key=len, reverse=True)[:continuous] if continuous else rows
            translator.choose_precision(first, config.beam, None if continuous else max_tokens)
        if continuous:
            results = translator.stream_ids(rows, config, continuous, compile, progress)
        else:
            results = translator.translate_ids(rows, config, max_tokens, progress)
    except (FileNotFoundError, ValueError) as err:
        raise fail(err) from None
    if nbest == 1:
        out = [candidates[0].text if candidates else "" for candidates in results]
    else:
        out = [
            f"{i} ||| {c.text} ||| {c.score:.4f}"
            for i, candidates in enumerate(results)
            for c in (candidates or [])
        ]
    _write_lines(out, output)


def _write_lines(lines: list[str], output: Path | None) -> None:
    """To stdout, or to `output` atomically (an earlier file survives a failure)."""
    import sys

    from aiayn.data.files import lines_text, write_atomic

    text = lines_text(lines)
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_atomic(output, text)


# ----- output shortlists ---------------------------------------------------------

shortlist_app = typer.Typer(
    help="Output shortlists: decode over each batch's likely target pieces only.",
    no_args_is_help=True,
)


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
    from aiayn.data.files import check_output
    from aiayn.data.tokenizer import SentencePieceTokenizer
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
        raise fail(err) from None
    typer.echo(f"wrote {out} ({shortlist}); use it with --shortlist {out}")
