"""`aiayn serve`: translations over HTTP with dynamic or continuous batching, and the
attention explorer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from aiayn.cli.common import (
    AutoPrecisionOpt,
    DeviceOpt,
    ShortlistOpt,
    TokenizerOpt,
    check_device,
    command,
    fail,
    load_translator,
    utf8,
    warnings_to_stderr,
)
from aiayn.config import Precision


@command()
def serve(
    run: Annotated[
        Path,
        typer.Argument(help="Run, checkpoint or converted directory, or a Marian directory."),
    ],
    host: Annotated[str, typer.Option(callback=utf8, help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8000,
    queue_size: Annotated[int, typer.Option(help="Sentences waiting at most (429 above).")] = 256,
    max_tokens: Annotated[
        int, typer.Option(help="Source tokens per batch, padding included.")
    ] = 4096,
    max_batch: Annotated[int, typer.Option(help="Sentences per batch (1 = no batching).")] = 128,
    max_wait_ms: Annotated[
        float, typer.Option(help="How long the model may idle while sentences wait for company.")
    ] = 5.0,
    max_chars: Annotated[int, typer.Option(help="Characters per request (413 above).")] = 20_000,
    max_sentences: Annotated[int, typer.Option(help="Sentences per request (413 above).")] = 64,
    max_request_tokens: Annotated[
        int, typer.Option(help="Source tokens per request (413 above).")
    ] = 4096,
    max_beam: Annotated[int, typer.Option(help="Widest beam a request may ask for.")] = 16,
    deadline: Annotated[
        float, typer.Option(help="Seconds a request may take, queueing included (504 after).")
    ] = 30.0,
    body_timeout: Annotated[
        float, typer.Option(help="Seconds a request's body may take to arrive (408 after).")
    ] = 30.0,
    header_timeout: Annotated[
        float, typer.Option(help="Seconds a request's headers may take (the connection closes).")
    ] = 10.0,
    max_response_bytes: Annotated[
        int, typer.Option(help="Largest answer with attention maps (413 above).")
    ] = 32 * 2**20,
    threads: Annotated[int, typer.Option(help="torch threads of the inference thread.")] = 1,
    continuous: Annotated[
        int | None,
        typer.Option(
            help="Decode N sentences at once by continuous batching: each joins at the next "
            "step and leaves when done (0: dynamic batching; default: the one measured "
            "faster, see aiayn.apps.decoder_choice).",
        ),
    ] = None,
    compile: Annotated[
        bool, typer.Option("--compile", help="With --continuous: compile the decoding step.")
    ] = False,
    access_log: Annotated[bool, typer.Option(help="Log every request.")] = True,
    device: DeviceOpt = "cpu",
    dtype: AutoPrecisionOpt = Precision.AUTO,
    tokenizer: TokenizerOpt = None,
    shortlist: ShortlistOpt = None,
) -> None:
    """Serve translations over HTTP with dynamic batching, and the attention explorer.

    POST /v1/translate, GET /health /ready /info /metrics; the API's documentation is
    at /docs. SIGTERM finishes the requests in flight, then exits.
    """
    import dataclasses

    from aiayn.apps.decoder_choice import Use, default_decoder
    from aiayn.apps.precision_choice import MAX_TIMED_ROWS, sample_rows
    from aiayn.apps.serve import ServeConfig, ServerError, create_app, run_server
    from aiayn.apps.translate import Translator

    warnings_to_stderr()
    try:
        settings = ServeConfig(
            queue_size=queue_size,
            max_tokens=max_tokens,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            max_chars=max_chars,
            max_sentences=max_sentences,
            max_request_tokens=max_request_tokens,
            max_beam=max_beam,
            deadline_s=deadline,
            body_timeout_s=body_timeout,
            header_timeout_s=header_timeout,
            max_response_bytes=max_response_bytes,
            threads=threads,
            continuous=continuous or 0,  # None: chosen below, once the model's beam is known
            compile=compile,
        )
        if continuous and shortlist is not None:
            raise ValueError(
                "--continuous decodes onto the whole vocabulary: it does not take --shortlist"
            )
        check_device(device)
        if (run / "config.json").is_file():  # a Marian directory as transformers saves it
            translator = Translator.from_marian(
                run,
                device=device,
                dtype=None if dtype is Precision.AUTO else dtype.dtype,
                shortlist=shortlist,
            )
        else:
            translator = load_translator(run, device, tokenizer, dtype, shortlist)
        if continuous is None:  # the decoder measured faster at the model's own beam
            chosen = default_decoder(
                Use.SERVE, translator.decode.beam, threads, device, shortlist is not None
            )
            settings = dataclasses.replace(settings, continuous=chosen.continuous)
        if dtype is Precision.AUTO:  # timed on a full batch of sentences of a usual length
            sentences = min(settings.continuous or settings.max_batch, MAX_TIMED_ROWS)
            rows = sample_rows(translator.model.cfg, sentences)  # the timing cuts them further
            max_tokens = None if settings.continuous else settings.max_tokens
            translator.choose_precision(rows, translator.decode.beam, max_tokens)
        server = create_app(translator, settings, run)
        run_server(server, host, port, access_log)
    except (FileNotFoundError, ValueError, ServerError) as err:
        raise fail(err) from None
