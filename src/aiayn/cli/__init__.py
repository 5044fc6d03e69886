"""The `aiayn` command line: one entry point, one subcommand per job.

One module per group of commands: `prepare` (corpora), `train` (train, average,
evaluate), `translate` (translate, shortlist build), `heads` (attention, heads, prune),
`interpret` (lens, patch, induction, align), `generate` (generate, fill), `convert`
(convert, export), `serve` and `quickstart` (demo, quickstart); `common` holds the
one-line errors, the shared options and the loaders of a run's model. The commands are
registered below in the order `aiayn --help` lists them.
"""

from __future__ import annotations

import typer

from aiayn.cli import convert, generate, heads, interpret, quickstart, serve, train, translate
from aiayn.cli.common import OneLineErrors
from aiayn.cli.prepare import prepare_app

app = typer.Typer(
    name="aiayn",
    cls=OneLineErrors,
    help="The Transformer of 'Attention Is All You Need': train, translate, score, look inside.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def main() -> None:
    """The Transformer of 'Attention Is All You Need': train, translate, score, look inside."""


for _command in (
    quickstart.demo,
    train.train,
    train.average,
    translate.translate,
    train.evaluate,
    heads.attention,
    heads.heads,
    interpret.lens,
    interpret.patch,
    interpret.induction,
    interpret.align,
    generate.generate,
    generate.fill,
    heads.prune,
    convert.export,
    serve.serve,
    quickstart.quickstart,
):
    app.command(**_command.typer_settings)(_command)
del _command
app.add_typer(prepare_app, name="prepare")
app.add_typer(translate.shortlist_app, name="shortlist")
app.add_typer(convert.convert_app, name="convert")


def __getattr__(name: str):
    """`click_app`: the click command behind `app`, which the docs' CLI reference
    (mkdocs-click) reads; built on request, so a plain `aiayn` run never builds it."""
    if name == "click_app":
        return typer.main.get_command(app)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
