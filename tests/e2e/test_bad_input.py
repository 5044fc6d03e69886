"""Bad input, table-driven: every subcommand answers with one line, not a traceback.

Each case runs the command line in-process (typer's CliRunner captures stdout and
stderr together) and checks, against the case's own expectations:

- the exit code: 1 for aiayn's own errors, 2 where typer refuses an option itself;
- no traceback and no exception escaping the command;
- the message names the culprit (the file, field or value given);
- nothing half-written: the output the case names does not exist afterwards, and
  the trained run the cases share is unchanged, file for file.

One tiny run is trained once for the module (configs/tiny-test.yaml). Cases that
need a read-only directory mount a read-only tmpfs when running as root (root
writes through file modes), or use a 0555 directory otherwise; where neither is
possible they skip, saying why.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from aiayn.cli import app
from train_helpers import RECIPE, make_corpus

# ----- the shared world: a corpus, a trained run, some files -------------------------


def _mount_tmpfs(directory: Path, options: str) -> bool:
    """Mount a tmpfs on `directory`; False where this process may not."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _unmount(directory: Path) -> None:
    subprocess.run(["umount", str(directory)], capture_output=True, check=False)


@contextlib.contextmanager
def _read_only_dir(directory: Path):
    """`directory`, made read-only for this process, or None where that is impossible."""
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        yield directory
        directory.chmod(0o755)
    elif _mount_tmpfs(directory, "ro,size=64k"):
        try:
            yield directory
        finally:
            _unmount(directory)
    else:
        yield None


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad_input")
    corpus = make_corpus(root / "corpus", train_pairs=120)
    run = root / "run"
    trained = CliRunner().invoke(
        app,
        ["train", str(RECIPE), f"data.corpus={corpus}", "--run", str(run), "--no-progress"],
    )
    assert trained.exit_code == 0, trained.output
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["data"]["corpus"] = str(corpus)
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    files = {
        "src": "the house\nthe garden\n",
        "ref": "das haus\nder garten\n",
        "tsv": "house\thaus\ngarden\tgarten\n",
        "notab.tsv": "house haus\n",
        "short": "one line\n",
        "empty": "",
        "existing.txt": "keep me\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    (root / "latin1").write_bytes(b"caf\xe9\n")
    (root / "a_dir").mkdir()
    (root / "empty_dir").mkdir()
    (root / "corrupt.safetensors").write_bytes(b"not a safetensors file")
    (root / "marian_no_config").mkdir()
    with _read_only_dir(root / "ro") as read_only:
        yield {"root": root, "run": run, "corpus": corpus, "ro": read_only}


def _recipe(world, name: str, change) -> Path:
    """A copy of the shared recipe with `change(dict)` applied (or raw text from it)."""
    values = yaml.safe_load((world["root"] / "recipe.yaml").read_text())
    text = change(values)
    path = world["root"] / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text if isinstance(text, str) else yaml.safe_dump(values))
    return path


def _set(section: str, key: str, value):
    def change(values):
        values[section][key] = value

    return change


RECIPES = {
    "dropout_str": _set("model", "dropout", "0.1"),
    "betas_float": _set("train", "betas", 0.9),
    "keep_last_bool": _set("train", "keep_last", True),
    "max_epochs_str": _set("train", "max_epochs", "2"),
    "kept_heads_str": _set("model", "kept_heads", "encoder.0.self"),
    "n_heads_float": _set("model", "n_heads", 2.5),
    "latin1": lambda v: yaml.safe_dump(v).encode() + b"# caf\xe9\n",
    "duplicate": lambda v: yaml.safe_dump(v).replace("train:\n", "train:\n  seed: 1\n  seed: 2\n"),
    "invalid_yaml": lambda v: "model: [unclosed\n",
    "a_list": lambda v: "- data\n- model\n",
    "unknown_section": lambda v: yaml.safe_dump({**v, "optimizer": {"lr": 1}}),
    "unknown_key": _set("train", "learning_rate", 0.1),
    "section_not_mapping": lambda v: yaml.safe_dump({**v, "train": 5}),
}

# ----- the table ---------------------------------------------------------------------
# (id, command line, exit code, text the message must contain, the output path that
#  must not exist afterwards or None). The command line is split as a shell would; then
#  @MACRO words expand, {root} is the world's directory, {run} its trained run, {ro} a
#  read-only directory, {new} an output path of the case's own, and {recipe:NAME} a
#  copy of the recipe changed by RECIPES[NAME].

MACROS = {  # words that stand for several, to keep each case on one line
    "@text": "prepare text --src-train {root}/src --tgt-train {root}/ref @langs",
    "@langs": "--src-lang en --tgt-lang de",
    "@tsv": "prepare tsv --train {root}/tsv @langs",
    "@hf": "prepare hf {root}/no_such_dataset @langs",
    "@train": "train {root}/recipe.yaml --no-progress",
    "@translate": "translate {run} -i {root}/src",
    "@test": "evaluate {run} --split test",
    "@eval-src": "evaluate {run} --src {root}/src",
    "@attend": "attention {run} 'the house'",
}

CASES = [
    # prepare text
    ("text-vocab-3", "@text --out {new} --vocab-size 3", 1, "vocab_size", "{new}"),
    ("text-max-ratio", "@text --out {new} --max-ratio 0.5", 1, "max_ratio", "{new}"),
    ("text-max-tokens-0", "@text --out {new} --max-tokens 0", 1, "max_tokens", "{new}"),
    ("text-vocab-word", "@text --out {new} --vocab-size abc", 2, "--vocab-size", "{new}"),
    (
        "text-src-missing",
        "prepare text --src-train {root}/nope.en --tgt-train {root}/ref @langs --out {new}",
        1,
        "nope.en",
        "{new}",
    ),
    (
        "text-src-dir",
        "prepare text --src-train {root}/a_dir --tgt-train {root}/ref @langs --out {new}",
        1,
        "a_dir",
        "{new}",
    ),
    (
        "text-src-latin1",
        "prepare text --src-train {root}/latin1 --tgt-train {root}/ref @langs --out {new}",
        1,
        "latin1",
        "{new}",
    ),
    (
        "text-lines-differ",
        "prepare text --src-train {root}/src --tgt-train {root}/short @langs --out {new}",
        1,
        "short",
        "{new}",
    ),
    ("text-valid-half", "@text --out {new} --src-valid {root}/src", 2, "--tgt-valid", "{new}"),
    ("text-out-file", "@text --out {root}/existing.txt", 1, "existing.txt", None),
    ("text-out-ro", "@text --out {ro}/corpus", 1, "{ro}", "{ro}/corpus"),
    ("text-out-under-file", "@text --out {root}/existing.txt/c", 1, "existing.txt", None),
    # prepare tsv
    (
        "tsv-missing",
        "prepare tsv --train {root}/nope.tsv @langs --out {new}",
        1,
        "nope.tsv",
        "{new}",
    ),
    ("tsv-dir", "prepare tsv --train {root}/a_dir @langs --out {new}", 1, "a_dir", "{new}"),
    (
        "tsv-no-tab",
        "prepare tsv --train {root}/notab.tsv @langs --out {new}",
        1,
        "notab.tsv",
        "{new}",
    ),
    ("tsv-latin1", "prepare tsv --train {root}/latin1 @langs --out {new}", 1, "latin1", "{new}"),
    ("tsv-vocab-3", "@tsv --out {new} --vocab-size 3", 1, "vocab_size", "{new}"),
    ("tsv-max-ratio", "@tsv --out {new} --max-ratio 0.9", 1, "max_ratio", "{new}"),
    ("tsv-valid-missing", "@tsv --out {new} --valid {root}/nope", 1, "nope", "{new}"),
    ("tsv-out-file", "@tsv --out {root}/existing.txt", 1, "existing.txt", None),
    ("tsv-out-ro", "@tsv --out {ro}/c", 1, "{ro}", "{ro}/c"),
    # prepare bible (every case fails before the SWORD modules are read)
    ("bible-src", "prepare bible --out {new} --src xyz", 2, "xyz", "{new}"),
    ("bible-vocab-3", "prepare bible --out {new} --vocab-size 3", 1, "vocab_size", "{new}"),
    ("bible-out-file", "prepare bible --out {root}/existing.txt", 1, "existing.txt", None),
    ("bible-out-ro", "prepare bible --out {ro}/b", 1, "{ro}", "{ro}/b"),
    # prepare hf (never reaches the network: each fails before loading)
    ("hf-vocab-3", "@hf --out {new} --vocab-size 3", 1, "vocab_size", "{new}"),
    ("hf-max-tokens-0", "@hf --out {new} --max-tokens 0", 1, "max_tokens", "{new}"),
    ("hf-out-file", "@hf --out {root}/existing.txt", 1, "existing.txt", None),
    ("hf-out-ro", "@hf --out {ro}/h", 1, "{ro}", "{ro}/h"),
    # train: the recipe file
    ("train-recipe-missing", "train {root}/nope.yaml --run {new}", 1, "nope.yaml", "{new}"),
    ("train-recipe-dir", "train {root}/a_dir --run {new}", 1, "a_dir", "{new}"),
    ("train-recipe-latin1", "train {recipe:latin1} --run {new}", 1, "latin1.yaml", "{new}"),
    (
        "train-duplicate-key",
        "train {recipe:duplicate} --run {new}",
        1,
        "'seed' is given twice",
        "{new}",
    ),
    (
        "train-invalid-yaml",
        "train {recipe:invalid_yaml} --run {new}",
        1,
        "invalid_yaml.yaml",
        "{new}",
    ),
    ("train-recipe-list", "train {recipe:a_list} --run {new}", 1, "a_list.yaml", "{new}"),
    (
        "train-unknown-section",
        "train {recipe:unknown_section} --run {new}",
        1,
        "optimizer",
        "{new}",
    ),
    ("train-unknown-key", "train {recipe:unknown_key} --run {new}", 1, "learning_rate", "{new}"),
    (
        "train-section-int",
        "train {recipe:section_not_mapping} --run {new}",
        1,
        "section train",
        "{new}",
    ),
    # train: field types, named
    ("train-dropout-str", "train {recipe:dropout_str} --run {new}", 1, "dropout", "{new}"),
    ("train-betas-float", "train {recipe:betas_float} --run {new}", 1, "betas", "{new}"),
    ("train-keep-last-bool", "train {recipe:keep_last_bool} --run {new}", 1, "keep_last", "{new}"),
    ("train-epochs-str", "train {recipe:max_epochs_str} --run {new}", 1, "max_epochs", "{new}"),
    ("train-kept-heads-str", "train {recipe:kept_heads_str} --run {new}", 1, "kept_heads", "{new}"),
    ("train-n-heads-float", "train {recipe:n_heads_float} --run {new}", 1, "n_heads", "{new}"),
    # train: overrides
    ("override-keep-last-true", "@train train.keep_last=true --run {new}", 1, "keep_last", "{new}"),
    ("override-lr-abc", "@train train.lr_scale=abc --run {new}", 1, "lr_scale", "{new}"),
    ("override-steps-abc", "@train train.max_steps=abc --run {new}", 1, "max_steps", "{new}"),
    ("override-seed-abc", "@train train.seed=abc --run {new}", 1, "seed", "{new}"),
    ("override-tokens-float", "@train train.max_tokens=1.5 --run {new}", 1, "max_tokens", "{new}"),
    ("override-betas-one", "@train train.betas=[0.9] --run {new}", 1, "betas", "{new}"),
    (
        "override-ckpt-bool",
        "@train train.checkpoint_every_steps=true --run {new}",
        1,
        "checkpoint_every_steps",
        "{new}",
    ),
    ("override-no-equals", "@train train.max_steps --run {new}", 1, "train.max_steps", "{new}"),
    ("override-bad-section", "@train optim.lr=1 --run {new}", 1, "optim.lr=1", "{new}"),
    ("override-unknown-key", "@train train.lr=1 --run {new}", 1, "train.lr", "{new}"),
    ("override-corpus-missing", "@train data.corpus={root}/nope --run {new}", 1, "nope", "{new}"),
    ("override-task", "@train data.task=xyz --run {new}", 1, "xyz", "{new}"),
    ("override-preset", "@train model.preset=huge --run {new}", 1, "huge", "{new}"),
    ("override-steps-0", "@train train.max_steps=0 --run {new}", 1, "max_steps", "{new}"),
    ("override-warmup-neg", "@train train.warmup=-1 --run {new}", 1, "warmup", "{new}"),
    (
        "override-smoothing",
        "@train train.label_smoothing=1.5 --run {new}",
        1,
        "label_smoothing",
        "{new}",
    ),
    ("override-precision", "@train train.precision=fp64 --run {new}", 1, "fp64", "{new}"),
    ("override-d-model", "@train model.d_model=33 --run {new}", 1, "d_model", "{new}"),
    ("override-positional", "@train model.positional=xyz --run {new}", 1, "xyz", "{new}"),
    ("override-heads-0", "@train model.n_heads=0 --run {new}", 1, "n_heads", "{new}"),
    ("override-activation", "@train model.activation=tanh --run {new}", 1, "tanh", "{new}"),
    ("override-dropout-neg", "@train model.dropout=-0.1 --run {new}", 1, "dropout", "{new}"),
    # train: the run directory
    ("train-run-file", "@train --run {root}/existing.txt", 1, "existing.txt", None),
    ("train-run-ro", "@train --run {ro}/run", 1, "{ro}", "{ro}/run"),
    ("train-run-under-file", "@train --run {root}/existing.txt/run", 1, "existing.txt", None),
    ("train-device", "@train --run {new} --device xyz", 1, "xyz", "{new}"),
    # average
    ("average-missing", "average {root}/nope", 1, "nope", None),
    (
        "average-last-0",
        "average {run} --last 0",
        1,
        "--last must be at least 1",
        "{run}/checkpoints/average-last-0",
    ),
    ("average-last-word", "average {run} --last abc", 2, "--last", None),
    ("average-file", "average {root}/existing.txt", 1, "existing.txt", None),
    (
        "average-empty-run",
        "average {root}/empty_dir",
        1,
        "empty_dir",
        "{root}/empty_dir/checkpoints",
    ),
    # translate
    ("translate-run-missing", "translate {root}/nope -i {root}/src", 1, "nope", None),
    ("translate-run-empty", "translate {root}/empty_dir -i {root}/src", 1, "empty_dir", None),
    (
        "translate-corrupt",
        "translate {root}/corrupt.safetensors -i {root}/src",
        1,
        "corrupt.safetensors",
        None,
    ),
    ("translate-input-missing", "translate {run} -i {root}/nope -o {new}", 1, "nope", "{new}"),
    ("translate-input-dir", "translate {run} -i {root}/a_dir -o {new}", 1, "a_dir", "{new}"),
    ("translate-input-latin1", "translate {run} -i {root}/latin1 -o {new}", 1, "latin1:1", "{new}"),
    ("translate-alpha-nan", "@translate -o {new} --alpha nan", 1, "nan", "{new}"),
    ("translate-alpha-inf", "@translate -o {new} --alpha inf", 1, "inf", "{new}"),
    ("translate-alpha-neg", "@translate -o {new} --alpha -1", 1, "alpha", "{new}"),
    ("translate-beam-0", "@translate -o {new} --beam 0", 1, "beam", "{new}"),
    ("translate-beam-word", "@translate -o {new} --beam abc", 2, "--beam", "{new}"),
    ("translate-nbest", "@translate -o {new} --nbest 9", 1, "nbest", "{new}"),
    ("translate-max-tokens-0", "@translate -o {new} --max-tokens 0", 1, "max_tokens", "{new}"),
    ("translate-extra-len", "@translate -o {new} --extra-len -1", 1, "extra_len", "{new}"),
    ("translate-device", "@translate --device xyz", 1, "xyz", None),
    ("translate-dtype", "@translate --dtype float64", 2, "float64", None),
    (
        "translate-temperature-0",
        "@translate -o {new} --sample --temperature 0",
        1,
        "temperature",
        "{new}",
    ),
    (
        "translate-temperature-nan",
        "@translate -o {new} --sample --temperature nan",
        1,
        "temperature",
        "{new}",
    ),
    ("translate-top-p", "@translate -o {new} --sample --top-p 2", 1, "top_p", "{new}"),
    ("translate-top-k", "@translate -o {new} --sample --top-k 0", 1, "top_k", "{new}"),
    (
        "translate-tokenizer-missing",
        "@translate --tokenizer {root}/nope.model",
        1,
        "nope.model",
        None,
    ),
    ("translate-out-dir", "@translate -o {root}/a_dir", 1, "a_dir", None),
    ("translate-out-ro", "@translate -o {ro}/out.txt", 1, "{ro}", "{ro}/out.txt"),
    ("translate-out-under-file", "@translate -o {root}/existing.txt/o", 1, "existing.txt", None),
    # evaluate
    ("evaluate-nothing", "evaluate {run} --out {new}", 1, "--split", "{new}"),
    ("evaluate-src-only", "@eval-src --out {new}", 1, "--ref", "{new}"),
    (
        "evaluate-src-missing",
        "evaluate {run} --src {root}/nope --ref {root}/ref --out {new}",
        1,
        "nope",
        "{new}",
    ),
    (
        "evaluate-src-dir",
        "evaluate {run} --src {root}/a_dir --ref {root}/ref --out {new}",
        1,
        "a_dir",
        "{new}",
    ),
    ("evaluate-ref-latin1", "@eval-src --ref {root}/latin1 --out {new}", 1, "latin1", "{new}"),
    ("evaluate-lines-differ", "@eval-src --ref {root}/short --out {new}", 1, "short", "{new}"),
    ("evaluate-split-unknown", "evaluate {run} --split nope --out {new}", 1, "nope", "{new}"),
    (
        "evaluate-split-no-run",
        "evaluate {root}/corrupt.safetensors --split test --out {new}",
        1,
        "config.yaml",
        "{new}",
    ),
    ("evaluate-alpha-nan", "@test --out {new} --alpha nan", 1, "nan", "{new}"),
    ("evaluate-beam-0", "@test --out {new} --beam 0", 1, "beam", "{new}"),
    ("evaluate-out-file", "@test --out {root}/existing.txt", 1, "existing.txt", None),
    ("evaluate-out-ro", "@test --out {ro}/e", 1, "{ro}", "{ro}/e"),
    ("evaluate-device", "@test --out {new} --device cuda:7", 1, "cuda:7", "{new}"),
    # attention
    ("attention-run-missing", "attention {root}/nope 'the house' --out {new}", 1, "nope", "{new}"),
    ("attention-out-file", "@attend --out {root}/existing.txt", 1, "existing.txt", None),
    ("attention-out-ro", "@attend --out {ro}/a", 1, "{ro}", "{ro}/a"),
    ("attention-layer", "@attend --out {new} --layer 9", 1, "layer [9] out of range", "{new}"),
    ("attention-head", "@attend --out {new} --head 9", 1, "head [9] out of range", "{new}"),
    ("attention-beam-0", "@attend --out {new} --beam 0", 1, "beam", "{new}"),
    ("attention-alpha-nan", "@attend --out {new} --alpha nan", 1, "nan", "{new}"),
    ("attention-html-dir", "@attend --html {root}/a_dir", 1, "a_dir", None),
    ("attention-html-ro", "@attend --html {ro}/x.html", 1, "{ro}", "{ro}/x.html"),
    # heads
    ("heads-sentences-0", "heads {run} --sentences 0 --out {new}", 1, "--sentences", "{new}"),
    ("heads-split", "heads {run} --split nope --out {new}", 1, "nope", "{new}"),
    ("heads-no-run", "heads {root}/empty_dir --out {new}", 1, "config.yaml", "{new}"),
    ("heads-out-file", "heads {run} --out {root}/existing.txt", 1, "existing.txt", None),
    ("heads-out-ro", "heads {run} --out {ro}/h", 1, "{ro}", "{ro}/h"),
    # prune
    (
        "prune-out-exists",
        "prune {run} --out {root}/a_dir --fraction 0.5 --by random",
        1,
        "a_dir",
        None,
    ),
    ("prune-nothing", "prune {run} --out {new}", 1, "--fraction", "{new}"),
    (
        "prune-heads-syntax",
        "prune {run} --out {new} --heads encoder",
        1,
        "--heads 'encoder'",
        "{new}",
    ),
    (
        "prune-heads-layer",
        "prune {run} --out {new} --heads encoder.9.self:0",
        1,
        "encoder.9.self",
        "{new}",
    ),
    ("prune-fraction", "prune {run} --out {new} --fraction 1.5", 1, "1.5", "{new}"),
    ("prune-by", "prune {run} --out {new} --fraction 0.5 --by xyz", 1, "xyz", "{new}"),
    (
        "prune-scores-missing",
        "prune {run} --out {new} --fraction 0.5 --scores {root}/nope.json",
        1,
        "nope.json",
        "{new}",
    ),
    ("prune-out-ro", "prune {run} --out {ro}/p --fraction 0.5 --by random", 1, "{ro}", "{ro}/p"),
    # convert marian
    ("marian-missing", "convert marian {root}/nope {new}", 1, "nope", "{new}"),
    ("marian-no-config", "convert marian {root}/marian_no_config {new}", 1, "config.json", "{new}"),
    (
        "marian-out-file",
        "convert marian {root}/marian_no_config {root}/existing.txt",
        1,
        "existing.txt",
        None,
    ),
    ("marian-out-ro", "convert marian {root}/marian_no_config {ro}/m", 1, "{ro}", "{ro}/m"),
    # quickstart (every case fails before the Bible is prepared)
    ("quickstart-minutes", "quickstart --out {new} --minutes 0", 1, "minutes", "{new}"),
    (
        "quickstart-recipe",
        "quickstart --out {new} --recipe {root}/nope.yaml",
        1,
        "nope.yaml",
        "{new}",
    ),
    ("quickstart-out-file", "quickstart --out {root}/existing.txt", 1, "existing.txt", None),
    ("quickstart-out-ro", "quickstart --out {ro}/q", 1, "{ro}", "{ro}/q"),
    ("quickstart-average", "quickstart --out {new} --average 0", 1, "average_last", "{new}"),
    ("quickstart-device", "quickstart --out {new} --device cuda:3", 1, "cuda", "{new}"),
    ("quickstart-beam-0", "quickstart --out {new} --beam 0", 1, "beam", "{new}"),
    ("quickstart-alpha-nan", "quickstart --out {new} --alpha nan", 1, "nan", "{new}"),
    # demo
    ("demo-vocab-0", "demo --vocab-size 0", 1, "vocab_size", None),
    ("demo-vocab-word", "demo --vocab-size abc", 2, "--vocab-size", None),
    # the top command
    ("unknown-command", "frobnicate", 2, "frobnicate", None),
    ("unknown-option", "translate {run} --beams 4", 2, "--beams", None),
]


def _fill(text: str, world, case: str = "") -> str:
    if text.startswith("{recipe:"):
        name = text[len("{recipe:") : -1]
        return str(_recipe(world, f"{name}.yaml", RECIPES[name]))
    new = f"{world['root']}/out-{case}"
    return text.format(root=world["root"], run=world["run"], ro=world["ro"], new=new)


def _without_paths(text: str, world, case: str) -> str:
    """`text` with the case's own output path and the world's directory replaced by
    placeholders, so that a culprit is found in what the message says, not in a temporary
    path (pytest-0/bad_input0 holds a "0", out-translate-beam-0 a "beam")."""
    new = _fill("{new}", world, case)
    return text.replace(new, "<new>").replace(str(world["root"]), "<root>")


def _words(command: str) -> list[str]:
    """The command line's words, macros expanded, placeholders not yet filled."""
    words = []
    for word in shlex.split(command):
        words.extend(_words(MACROS[word]) if word in MACROS else [word])
    return words


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()  # a directory's mtime moves when a temporary comes and goes
    }


def test_the_table_is_big_and_its_ids_distinct():
    ids = [case[0] for case in CASES]
    assert len(ids) == len(set(ids)) >= 100
    argvs = [_words(case[1]) for case in CASES]
    commands = {argv[1] if argv[0] in ("prepare", "convert") else argv[0] for argv in argvs}
    for command in ("text", "tsv", "hf", "bible", "train", "average", "translate", "evaluate"):
        assert command in commands
    for command in ("attention", "heads", "prune", "marian", "quickstart", "demo"):
        assert command in commands
    for case in CASES:  # a culprit of a character or two ("0", "9") is found in any message
        assert case[3].startswith("{") or len(case[3]) >= 3, case


@pytest.mark.parametrize(
    ("name", "command", "code", "culprit", "absent"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_input_gets_one_line(world, name, command, code, culprit, absent):
    if "{ro}" in command and world["ro"] is None:
        pytest.skip("no read-only directory here: root without permission to mount a tmpfs")
    args = [_fill(word, world, name) for word in _words(command)]
    gone = None if absent is None else Path(_fill(absent, world, name))
    assert gone is None or not gone.exists()
    before = _snapshot(world["run"])
    existing = (world["root"] / "existing.txt").read_text()
    result = CliRunner().invoke(app, args)
    output = result.output
    assert result.exit_code == code, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in output
    said = _without_paths(output, world, name)
    assert _without_paths(_fill(culprit, world, name), world, name) in said, output
    if code == 1:
        errors = [line for line in output.splitlines() if "error" in line.lower()]
        assert len(errors) == 1, output
    assert gone is None or not gone.exists()
    assert _snapshot(world["run"]) == before
    assert (world["root"] / "existing.txt").read_text() == existing


# ----- beyond the table ----------------------------------------------------------------


def test_process_substitution_and_pipes_are_files(world, tmp_path):
    """`<(...)` gives /dev/fd/N, a pipe: read once, like any file (bash makes the pipes)."""
    if shutil.which("bash") is None:
        pytest.skip("no bash for process substitution")
    run, src, ref = world["run"], world["root"] / "src", world["root"] / "ref"
    code = (  # one Python process for both commands: $1 for translate, $2 and $3 for evaluate
        "import sys; from typer.testing import CliRunner; from aiayn.cli import app\n"
        "for args in (['translate', sys.argv[4], '-i', sys.argv[1], '-o', sys.argv[5]],\n"
        "             ['evaluate', sys.argv[4], '--src', sys.argv[2], '--ref', sys.argv[3],\n"
        "              '--out', sys.argv[6]]):\n"
        "    result = CliRunner().invoke(app, args)\n"
        "    assert result.exit_code == 0, result.output\n"
    )
    script = f'"$0" -c "$1" <(cat {src}) <(cat {src}) <(cat {ref}) {run} "$2" "$3"'
    piped, scored = tmp_path / "piped.txt", tmp_path / "eval"
    argv = ["bash", "-c", script, sys.executable, code, str(piped), str(scored)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    plain = tmp_path / "plain.txt"
    result = CliRunner().invoke(app, ["translate", str(run), "-i", str(src), "-o", str(plain)])
    assert result.exit_code == 0, result.output
    assert piped.read_text() == plain.read_text()
    assert len(piped.read_text().splitlines()) == 2
    assert (scored / "hypotheses.txt").read_text() == plain.read_text()  # the same search


def test_a_full_disk_is_one_line_and_damages_nothing(world, tmp_path):
    """translate -o, evaluate --out and average on a full file system: ENOSPC named in
    one line, the files already there intact."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount_tmpfs(disk, "size=4m"):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        run = shutil.copytree(world["run"], disk / "run")
        (disk / "out.txt").write_text("the old translation\n")
        with contextlib.suppress(OSError), open(disk / "filler", "wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
        before = _snapshot(run)
        src = str(world["root"] / "src")
        evaluate = ["evaluate", str(world["run"]), "--src", src, "--ref", src]
        cases = [
            (["translate", str(world["run"]), "-i", src, "-o", str(disk / "out.txt")], "out.txt"),
            ([*evaluate, "--out", str(disk / "e")], "e"),
            (["average", str(run), "--last", "2"], "average-last-2"),
        ]
        for args, culprit in cases:
            result = CliRunner().invoke(app, args)
            assert result.exit_code == 1, result.output
            assert "Traceback" not in result.output
            assert "No space left" in result.output and culprit in result.output
            errors = [line for line in result.output.splitlines() if "error" in line]
            assert len(errors) == 1, result.output  # (a progress bar may precede it)
        assert (disk / "out.txt").read_text() == "the old translation\n"
        assert _snapshot(run) == before
        assert not (disk / "e").exists() or not list((disk / "e").iterdir())
    finally:
        _unmount(disk)


def test_resuming_with_another_shape_names_the_fields(world, tmp_path):
    """Without config.yaml to compare, the checkpoint's own config is: one line, fields named."""
    run = tmp_path / "run"
    shutil.copytree(world["run"], run)
    (run / "config.yaml").unlink()
    before = _snapshot(run / "checkpoints")
    args = [_fill(word, world) for word in _words("@train model.d_model=64 train.max_steps=20")]
    result = CliRunner().invoke(app, [*args, "--run", str(run)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "size mismatch" not in result.output
    assert "d_model 32 in the file, 64 here" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert _snapshot(run / "checkpoints") == before
