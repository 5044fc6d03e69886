"""Hostile input on the newer surfaces (issue 34, item 8): extreme numbers, invalid
UTF-8 in arguments, devices that cannot run the model, pruning every model shape,
malformed Hugging Face directories, degenerate shortlists.

Every case is checked against the same contract as tests/e2e/test_bad_input.py: exit 1
(2 where typer refuses an option itself), no traceback, one error line that names
the culprit (the option or field, never a word the temporary paths could hold), and
nothing written.
"""

from __future__ import annotations

import copy
import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

import aiayn.apps.serve
from aiayn import ModelConfig
from aiayn.apps.fill import CLS, MASK, SEP
from aiayn.cli import app
from aiayn.data.tokenizer import train_tokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE, load_model, resolve_weights
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import attention_sublayers
from aiayn.models.encoder_only import EncoderOnly
from infer_helpers import make_run, save_run, sentences

# ----- the world: a translation run, a GPT run, a BERT run, some files ----------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("world")
    spm = root / "lm" / TOKENIZER_FILE
    tokenizer = train_tokenizer(
        sentences(300), spm, vocab_size=52, user_defined_symbols=(CLS, SEP, MASK)
    )
    shape = {"n_layers": 2, "d_model": 32, "n_heads": 4, "d_ff": 64, "max_len": 24}
    torch.manual_seed(0)
    gpt = DecoderOnly(ModelConfig.gpt(vocab_size=tokenizer.vocab_size, dropout=0.0, **shape))
    bert = EncoderOnly(ModelConfig.bert(vocab_size=tokenizer.vocab_size, dropout=0.0, **shape))
    (root / "src").write_text("the house\nthe garden\n")
    (root / "ref").write_text("das haus\nder garten\n")
    return {
        "root": root,
        "mt": make_run(root / "mt"),
        "gpt": save_run(root / "gpt", gpt, spm),
        "bert": save_run(root / "bert", bert, spm),
    }


def _snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def assert_one_line(result, culprit: str, code: int = 1) -> None:
    """Exit `code`, no traceback, one error line, naming `culprit`."""
    output = result.output
    assert result.exit_code == code, output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in output
    assert culprit in output, output
    if code == 1:
        errors = [line for line in output.splitlines() if "error" in line.lower()]
        assert len(errors) == 1, output


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """`aiayn serve` must refuse before it listens: starting the server fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("aiayn serve started a server on bad input")

    monkeypatch.setattr(aiayn.apps.serve, "run_server", refuse)


def run_case(world, command: str, new: Path) -> object:
    """Run `command` ({root}, {mt}, {gpt}, {bert}, {new} filled) in-process."""
    names = {key: str(value) for key, value in world.items()}
    args = [word.format(**names, new=new) for word in shlex.split(command)]
    return CliRunner().invoke(app, args)


# ----- 1. extreme numbers ------------------------------------------------------------
# (id, command line, exit code, the words the message must hold). {new} must not exist
# afterwards; every run directory is unchanged.

NUMBERS = [
    ("generate-temperature-huge", "generate {gpt} 'In the' --temperature 1e308", "temperature"),
    ("generate-temperature-tiny", "generate {gpt} 'In the' --temperature 1e-308", "temperature"),
    ("generate-temperature-inf", "generate {gpt} 'In the' --temperature inf", "temperature"),
    ("generate-temperature-neg", "generate {gpt} 'In the' --temperature -1", "temperature"),
    ("generate-top-p-nan", "generate {gpt} 'In the' --top-p nan", "top_p"),
    ("generate-top-k-0", "generate {gpt} 'In the' --top-k 0", "top_k"),
    ("generate-seed-neg", "generate {gpt} 'In the' --seed -1", "seed"),
    ("generate-seed-huge", "generate {gpt} 'In the' --seed 18446744073709551616", "seed"),
    ("generate-max-tokens-0", "generate {gpt} 'In the' --max-tokens 0", "max_new_tokens"),
    ("fill-top-k-0", "fill {bert} 'In [MASK]' --top-k 0", "top_k"),
    (
        "translate-temp-huge",
        "translate {mt} -i {root}/src -o {new} --sample --temperature 1e308",
        "temperature",
    ),
    (
        "translate-temp-tiny",
        "translate {mt} -i {root}/src -o {new} --sample --temperature 1e-300",
        "temperature",
    ),
    ("translate-seed-neg", "translate {mt} -i {root}/src -o {new} --sample --seed -1", "seed"),
    (
        "translate-seed-huge",
        "translate {mt} -i {root}/src -o {new} --sample --seed 99999999999999999999999",
        "seed",
    ),
    ("translate-alpha-huge", "translate {mt} -i {root}/src -o {new} --alpha 1e308", "alpha"),
    ("translate-alpha-11", "translate {mt} -i {root}/src -o {new} --alpha 11", "alpha"),
    ("translate-beam-huge", "translate {mt} -i {root}/src -o {new} --beam 99999999999", "beam"),
    ("translate-beam-1025", "translate {mt} -i {root}/src -o {new} --beam 1025", "beam"),
    (
        "evaluate-alpha-huge",
        "evaluate {mt} --src {root}/src --ref {root}/ref --out {new} --alpha 1e308",
        "alpha",
    ),
    (
        "evaluate-beam-huge",
        "evaluate {mt} --src {root}/src --ref {root}/ref --out {new} --beam 999999",
        "beam",
    ),
    ("attention-alpha-huge", "attention {mt} 'the house' --out {new} --alpha 1e9", "alpha"),
    ("attention-beam-huge", "attention {mt} 'the house' --out {new} --beam 999999", "beam"),
    ("quickstart-minutes-nan", "quickstart --out {new} --minutes nan", "minutes"),
    ("quickstart-minutes-inf", "quickstart --out {new} --minutes inf", "minutes"),
    ("quickstart-seed-neg", "quickstart --out {new} --seed -1", "seed"),
    ("quickstart-alpha-huge", "quickstart --out {new} --alpha 1e308", "alpha"),
    (
        "prepare-max-ratio-nan",
        "prepare text --src-train {root}/src --tgt-train {root}/ref --src-lang en --tgt-lang de --out {new} --max-ratio nan",
        "max_ratio",
    ),
    (
        "prepare-seed-neg",
        "prepare text --src-train {root}/src --tgt-train {root}/ref --src-lang en --tgt-lang de --out {new} --seed -1",
        "seed",
    ),
    ("serve-deadline-nan", "serve {mt} --deadline nan", "deadline_s"),
    ("serve-deadline-inf", "serve {mt} --deadline inf", "deadline_s"),
    ("serve-deadline-neg", "serve {mt} --deadline -1", "deadline_s"),
    ("serve-max-wait-nan", "serve {mt} --max-wait-ms nan", "max_wait_ms"),
    ("serve-max-wait-inf", "serve {mt} --max-wait-ms inf", "max_wait_ms"),
    ("serve-max-wait-neg", "serve {mt} --max-wait-ms -1", "max_wait_ms"),
    ("serve-threads-huge", "serve {mt} --threads 1099511627776", "threads"),
    ("serve-queue-0", "serve {mt} --queue-size 0", "queue_size"),
    ("serve-beam-0", "serve {mt} --max-beam 0", "max_beam"),
]
TYPER_REFUSES = [  # typer's own range check: exit 2, the option named
    ("serve-port-0", "serve {mt} --port 0", "--port"),
    ("serve-port-huge", "serve {mt} --port 70000", "--port"),
    ("serve-port-neg", "serve {mt} --port -1", "--port"),
]


@pytest.mark.parametrize(
    ("command", "culprit", "code"),
    [(c[1], c[2], 1) for c in NUMBERS] + [(c[1], c[2], 2) for c in TYPER_REFUSES],
    ids=[c[0] for c in NUMBERS + TYPER_REFUSES],
)
def test_numbers_out_of_range_are_refused_by_name(world, no_server, command, culprit, code):
    new = world["root"] / "new"
    runs = {name: _snapshot(world[name]) for name in ("mt", "gpt", "bert")}
    result = run_case(world, command, new)
    assert_one_line(result, culprit, code)
    assert not new.exists()
    assert {name: _snapshot(world[name]) for name in runs} == runs


# ----- 2. invalid UTF-8 in text arguments -----------------------------------------------
# The shell hands Python bytes; those that are not UTF-8 arrive as lone surrogates
# ("\udcff" for the byte 0xff). (id, command line with BAD where the bytes go, the
# argument named.)

BAD = "\udcff"
TEXT = [
    ("generate-prompt", "generate {gpt} 'In BAD the'", "PROMPT"),
    ("fill-text", "fill {bert} 'In BAD [MASK]'", "TEXT"),
    ("attention-sentence", "attention {mt} 'the BAD house' --out {new}", "SENTENCE"),
    ("attention-lm-sentence", "attention {gpt} 'In BAD the' --out {new}", "SENTENCE"),
    ("translate-device", "translate {mt} -i {root}/src -o {new} --device cpBAD", "--device"),
    ("generate-device", "generate {gpt} 'In the' --device cpBAD", "--device"),
    ("evaluate-split", "evaluate {mt} --split teBADst --out {new}", "--split"),
    ("heads-split", "heads {mt} --split vaBADlid --out {new}", "--split"),
    ("prune-heads", "prune {mt} --out {new} --heads encoder.0.selfBAD:1", "--heads"),
    ("prune-by", "prune {mt} --out {new} --fraction 0.5 --by rBAD", "--by"),
    ("prune-measure", "prune {mt} --out {new} --fraction 0.5 --measure aBAD", "--measure"),
    ("prune-kinds", "prune {mt} --out {new} --fraction 0.5 --kinds encBAD", "--kinds"),
    ("convert-dtype", "convert marian {root} {new} --dtype int8BAD", "--dtype"),
    ("serve-host", "serve {mt} --host localBAD", "--host"),
    ("serve-device", "serve {mt} --device cpBAD", "--device"),
    ("train-override", "train tiny-test model.d_model=BAD --run {new}", "OVERRIDES"),
    ("quickstart-set", "quickstart --out {new} --set train.seed=BAD", "--set"),
    ("quickstart-device", "quickstart --out {new} --device cpBAD", "--device"),
    (
        "prepare-text-lang",
        "prepare text --src-train {root}/src --tgt-train {root}/ref --src-lang eBAD "
        "--tgt-lang de --out {new}",
        "--src-lang",
    ),
    (
        "prepare-tsv-lang",
        "prepare tsv --train {root}/src --src-lang en --tgt-lang dBAD --out {new}",
        "--tgt-lang",
    ),
    (
        "prepare-hf-config",
        "prepare hf x --config dBAD --src-lang en --tgt-lang de --out {new}",
        "--config",
    ),
    ("prepare-bible-src", "prepare bible --out {new} --src webBAD", "--src"),
    ("prepare-lm-lang", "prepare lm text {root}/src {new} --lang eBAD", "--lang"),
]


@pytest.mark.parametrize(("command", "culprit"), [c[1:] for c in TEXT], ids=[c[0] for c in TEXT])
def test_text_arguments_that_are_not_utf8_are_refused_by_name(world, no_server, command, culprit):
    new = world["root"] / "new"
    runs = {name: _snapshot(world[name]) for name in ("mt", "gpt", "bert")}
    result = run_case(world, command.replace("BAD", BAD), new)
    assert_one_line(result, f"{culprit}: invalid UTF-8 (byte 0xff", 1)
    assert not new.exists()
    assert {name: _snapshot(world[name]) for name in runs} == runs


def test_file_paths_may_hold_any_bytes(world, tmp_path):
    """Only text is checked: a file whose name is not UTF-8 is read and written as any."""
    source = tmp_path / f"in{BAD}.txt"
    source.write_text("the house\n")
    output = tmp_path / f"out{BAD}.txt"
    result = CliRunner().invoke(
        app, ["translate", str(world["mt"]), "-i", str(source), "-o", str(output)]
    )
    assert result.exit_code == 0, result.output
    assert len(output.read_text().splitlines()) == 1


# ----- 3. devices that cannot run the model ---------------------------------------------

DEVICES = ["meta", "xla", "mps", "cuda:99", "frobnicate", "cpu:x"]
DEVICE_COMMANDS = {
    "translate": "translate {mt} -i {root}/src -o {new} --device DEV",
    "evaluate": "evaluate {mt} --src {root}/src --ref {root}/ref --out {new} --device DEV",
    "attention": "attention {mt} 'the house' --out {new} --device DEV",
    "attention-lm": "attention {gpt} 'In the' --out {new} --device DEV",
    "generate": "generate {gpt} 'In the' --device DEV",
    "fill": "fill {bert} 'In [MASK]' --device DEV",
    "serve": "serve {mt} --device DEV",
    "train": "train tiny-test --run {new} --device DEV",
    "quickstart": "quickstart --out {new} --device DEV",
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("command", list(DEVICE_COMMANDS))
def test_devices_that_cannot_run_a_model_are_refused_by_name(world, no_server, command, device):
    new = world["root"] / "new"
    runs = {name: _snapshot(world[name]) for name in ("mt", "gpt", "bert")}
    result = run_case(world, DEVICE_COMMANDS[command].replace("DEV", device), new)
    assert_one_line(result, f"device {device}: ", 1)
    assert not new.exists()
    assert {name: _snapshot(world[name]) for name in runs} == runs


def test_usable_device_takes_the_cpu_and_names_the_rest():
    from aiayn.config.devices import usable_device

    assert usable_device("cpu") == torch.device("cpu")
    for name, words in [("meta", "no values"), ("xla", "cannot run"), ("nope", "not a device")]:
        with pytest.raises(ValueError, match=f"the device {name}: .*{words}"):
            usable_device(name, "the device")


# ----- 4. pruning a GPT or a BERT run ---------------------------------------------------


def _masked(model: torch.nn.Module, heads: dict[str, list[int]], ids: torch.Tensor):
    """The reference: the unpruned model with `heads` silenced by head masks."""
    model = copy.deepcopy(model).eval()
    sublayers = attention_sublayers(model)
    for name, indices in heads.items():
        mask = torch.ones(sublayers[name].n_heads)
        mask[indices] = 0.0
        sublayers[name].head_mask = mask
    with torch.no_grad():
        return model(ids)


@pytest.mark.parametrize(
    ("shape", "heads"),
    [
        ("gpt", ["decoder.0.self:1,3", "decoder.1.self:0"]),
        ("bert", ["encoder.1.self:2", "encoder.0.self:0,1,3"]),
    ],
)
def test_a_gpt_or_bert_run_prunes_to_what_masking_its_heads_computes(world, tmp_path, shape, heads):
    out = tmp_path / "pruned"
    args = ["prune", str(world[shape]), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, *(a for h in heads for a in ("--heads", h))])
    assert result.exit_code == 0, result.output
    removed = sum(len(h.split(":")[1].split(",")) for h in heads)
    assert f"pruned {removed} of 8 heads" in result.output
    verb = "generate" if shape == "gpt" else "fill"  # the shape spec's command
    assert f"run it with: aiayn {verb} {out}" in result.output.replace("\n", "")
    original = load_model(resolve_weights(world[shape])).eval()
    pruned = load_model(resolve_weights(out)).eval()
    ids = torch.randint(
        4, original.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1)
    )
    chosen = {h.split(":")[0]: [int(i) for i in h.split(":")[1].split(",")] for h in heads}
    with torch.no_grad():
        assert torch.allclose(pruned(ids), _masked(original, chosen, ids), atol=1e-5)
    assert pruned.num_parameters() < original.num_parameters()
    command = (
        ["generate", str(out), "In the", "--greedy"]
        if shape == "gpt"
        else ["fill", str(out), "In [MASK]"]
    )
    ran = CliRunner().invoke(app, command)
    assert ran.exit_code == 0, ran.output


@pytest.mark.parametrize("shape", ["gpt", "bert"])
def test_a_gpt_or_bert_run_prunes_a_random_fraction(world, tmp_path, shape):
    out = tmp_path / "pruned"
    args = ["prune", str(world[shape]), "--out", str(out), "--fraction", "0.5", "--by", "random"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "pruned 4 of 8 heads" in result.output
    kind = "decoder.self" if shape == "gpt" else "encoder.self"
    assert f"{kind} 4" in result.output and "cross" not in result.output
    assert (out / TOKENIZER_FILE).is_file()


@pytest.mark.parametrize(
    ("shape", "heads", "culprit"),
    [
        ("gpt", "decoder.0.cross:1", "it has decoder.I.self with I < 2)"),
        ("gpt", "encoder.0.self:1", "it has decoder.I.self with I < 2)"),
        ("bert", "decoder.0.self:1", "it has encoder.I.self with I < 2)"),
    ],
)
def test_a_sub_layer_the_shape_lacks_is_refused_by_name(world, tmp_path, shape, heads, culprit):
    out = tmp_path / "pruned"
    result = CliRunner().invoke(
        app, ["prune", str(world[shape]), "--out", str(out), "--heads", heads]
    )
    assert_one_line(result, culprit)
    assert heads.split(":")[0] in result.output
    assert not out.exists()


# ----- 5. malformed Hugging Face directories --------------------------------------------


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random Marian, GPT-2 and BERT directories, as test_marian.py and
    test_hf_models.py build them (with transformers)."""
    pytest.importorskip("transformers")
    from test_hf_models import bert_directory, gpt2_directory
    from test_marian import SHAPES, build_marian_directory

    root = tmp_path_factory.mktemp("hf")
    dirs = {name: root / name for name in ("marian", "gpt2", "bert")}
    for path in dirs.values():
        path.mkdir()
    build_marian_directory(dirs["marian"], SHAPES["swish-2x2"])
    gpt2_directory(dirs["gpt2"])
    bert_directory(dirs["bert"])
    return dirs


def _config(**changes):
    def change(path: Path) -> None:
        values = json.loads((path / "config.json").read_text())
        for field, value in changes.items():
            if value is _DROP:
                del values[field]
            else:
                values[field] = value
        (path / "config.json").write_text(json.dumps(values))

    return change


_DROP = object()


def _write(name: str, text: str | bytes):
    def change(path: Path) -> None:
        (path / name).write_bytes(text if isinstance(text, bytes) else text.encode())

    return change


def _tensor(part: str, how):
    """Change the first stored tensor whose name holds `part` with `how(tensor)`."""

    def change(path: Path) -> None:
        tensors = load_file(str(path / "model.safetensors"))
        name = next(n for n in sorted(tensors) if part in n)
        tensors[name] = how(tensors[name].clone())
        save_file(tensors, str(path / "model.safetensors"))

    return change


def _nan(tensor):
    tensor.view(-1)[0] = float("nan")
    return tensor


def _extra(path: Path) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    save_file(
        {**tensors, "model.extra_adapter.weight": torch.ones(2)}, str(path / "model.safetensors")
    )


def _vocab_ids_as_strings(path: Path) -> None:
    vocab = json.loads((path / "vocab.json").read_text())
    (path / "vocab.json").write_text(json.dumps({p: str(i) for p, i in vocab.items()}))


# (id, kind, change to a copy of the directory, what the message must hold)
MALFORMED = [
    ("marian-config-list", "marian", _write("config.json", "[1, 2]"), "holds a JSON list"),
    (
        "marian-config-latin1",
        "marian",
        _write("config.json", b'{"d_model": "\xe9"}'),
        "config.json is not valid JSON",
    ),
    ("marian-no-d-model", "marian", _config(d_model=_DROP), "no field d_model"),
    ("marian-d-model-str", "marian", _config(d_model="32"), "d_model='32'"),
    ("marian-layers-float", "marian", _config(encoder_layers=2.5), "encoder_layers=2.5"),
    ("marian-dropout-str", "marian", _config(dropout="0.1"), "dropout='0.1'"),
    ("marian-pad-out", "marian", _config(pad_token_id=10**6), "pad_token_id=1000000"),
    (
        "marian-positions-huge",
        "marian",
        _config(max_position_embeddings=10**12),
        "max_position_embeddings",
    ),
    (
        "marian-vocab-huge",
        "marian",
        _config(vocab_size=10**12, decoder_vocab_size=10**12),
        "(1000000000000,) by the config",
    ),
    (
        "marian-generation-list",
        "marian",
        _write("generation_config.json", "[]"),
        "generation_config.json holds a JSON list",
    ),
    (
        "marian-beams-str",
        "marian",
        _write("generation_config.json", '{"num_beams": "4"}'),
        "num_beams='4'",
    ),
    ("marian-vocab-str-ids", "marian", _vocab_ids_as_strings, "vocab.json: piece"),
    (
        "marian-vocab-no-pad",
        "marian",
        _write("vocab.json", '{"</s>": 0, "<unk>": 1}'),
        "no <pad> piece",
    ),
    (
        "marian-corrupt-spm",
        "marian",
        _write("source.spm", b"not a model"),
        "source.spm is not a sentencepiece model",
    ),
    ("marian-nan", "marian", _tensor("model.shared.weight", _nan), "model.shared.weight holds NaN"),
    (
        "marian-int32",
        "marian",
        _tensor("final_logits_bias", lambda t: t.to(torch.int32)),
        "final_logits_bias is torch.int32",
    ),
    ("marian-extra-tensor", "marian", _extra, "does not map: model.extra_adapter.weight"),
    ("gpt2-config-list", "gpt2", _write("config.json", '["gpt2"]'), "holds a JSON list"),
    ("gpt2-no-n-embd", "gpt2", _config(n_embd=_DROP), "no field n_embd"),
    ("gpt2-n-embd-str", "gpt2", _config(n_embd="32"), "n_embd='32'"),
    ("gpt2-positions-huge", "gpt2", _config(n_positions=10**12), "n_positions=1000000000000"),
    ("gpt2-layers-huge", "gpt2", _config(n_layer=10**9), "no tensor h.2."),
    ("gpt2-heads-bool", "gpt2", _config(n_head=True), "n_head=True"),
    (
        "gpt2-eps-nan",
        "gpt2",
        _config(layer_norm_epsilon=float("nan")),
        "layer_norm_epsilon=nan",
    ),
    ("gpt2-vocab-str-ids", "gpt2", _vocab_ids_as_strings, "vocab.json: piece"),
    ("gpt2-nan", "gpt2", _tensor("wte.weight", _nan), "wte.weight holds NaN"),
    (
        "gpt2-int32",
        "gpt2",
        _tensor("ln_f.bias", lambda t: t.to(torch.int32)),
        "ln_f.bias is torch.int32",
    ),
    ("bert-config-list", "bert", _write("config.json", "[]"), "holds a JSON list"),
    ("bert-hidden-str", "bert", _config(hidden_size="32"), "hidden_size='32'"),
    (
        "bert-positions-huge",
        "bert",
        _config(max_position_embeddings=10**12),
        "max_position_embeddings",
    ),
    ("bert-vocab-small", "bert", _config(vocab_size=7), "(60,) in the file, (7,) by the config"),
    ("bert-vocab-latin1", "bert", _write("vocab.txt", b"[PAD]\n\xe9\n"), "vocab.txt is not UTF-8"),
    ("bert-nan", "bert", _tensor("word_embeddings", _nan), "word_embeddings.weight holds NaN"),
    (
        "bert-int32",
        "bert",
        _tensor("LayerNorm.bias", lambda t: t.to(torch.int32)),
        "is torch.int32",
    ),
]


@pytest.mark.parametrize(
    ("kind", "change", "culprit"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_hugging_face_directories_are_refused_at_conversion(
    hf_dirs, tmp_path, kind, change, culprit
):
    source = shutil.copytree(hf_dirs[kind], tmp_path / "source")
    change(source)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["convert", kind, str(source), str(out)])
    assert_one_line(result, culprit)
    assert not out.exists()


# ----- 6. shortlists ---------------------------------------------------------------------


def test_shortlist_build_finds_the_runs_own_subword_model(world, tmp_path):
    """RUN/spm.model is found from RUN (it was looked for beside a directory, never found)."""
    out = tmp_path / "shortlist.safetensors"
    source, target = world["root"] / "src", world["root"] / "ref"
    args = [
        "shortlist",
        "build",
        str(world["mt"]),
        "--source",
        str(source),
        "--target",
        str(target),
    ]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--min-count", "1"])
    assert result.exit_code == 0, result.output
    assert out.is_file()
    with_tokenizer = tmp_path / "explicit.safetensors"
    explicit = [*args, "--out", str(with_tokenizer), "--min-count", "1"]
    explicit += ["--tokenizer", str(world["mt"] / TOKENIZER_FILE)]
    assert CliRunner().invoke(app, explicit).exit_code == 0
    assert load_file(str(out)).keys() == load_file(str(with_tokenizer)).keys()
    for name, tensor in load_file(str(out)).items():
        assert torch.equal(tensor, load_file(str(with_tokenizer))[name])
