"""Model weights on disk: safetensors, written atomically, with the config inside.

A weights file carries its `ModelConfig` as JSON in the safetensors metadata, so
`load_model(path)` needs nothing else to rebuild the model.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from safetensors.torch import load_model as _load_weights
from safetensors.torch import save_model as _save_weights
from torch import nn

from aiayn.config import ModelConfig
from aiayn.data.files import strict_json, write_dir_atomic, write_file_atomic
from aiayn.data.tokenizer import TOKENIZER_FILE as TOKENIZER_FILE  # RUN/spm.model, below
from aiayn.io.int8_weights import dequantize_weight, int8_weight_names, quantize_weight
from aiayn.models import build_model
from aiayn.models.encoder_decoder import Transformer

log = logging.getLogger(__name__)

CONFIG_KEY = "aiayn.model_config"


INT8_KEY = "aiayn.int8_weights"  # metadata: the names stored as int8, with a scale each
INT8_SCALE_SUFFIX = ".int8_scale"


def save_model(model: Transformer, path: str | Path, int8: bool = False) -> Path:
    """Write the weights and config to `path` atomically (temporary file, fsync, rename).

    A process killed half-way leaves any earlier file at `path` intact. With `int8`,
    the weights that int8 inference multiplies in int8
    (`aiayn.io.int8_weights.int8_weight_names`) are stored as int8 with a float32 scale per
    output channel (NAME + ".int8_scale"), as `Int8Linear` rounds them; the rest stays
    as it is. `load_model` reads both kinds.
    """
    metadata = _metadata(model)
    if not int8:
        return write_file_atomic(
            path, lambda tmp: _save_weights(model, str(tmp), metadata=metadata)
        )
    names = int8_weight_names(model)

    def write(tmp: Path) -> None:
        _save_weights(model, str(tmp), metadata=metadata)  # tied weights stored once
        tensors = load_file(str(tmp))
        for name in names:
            tensors[name], tensors[name + INT8_SCALE_SUFFIX] = quantize_weight(tensors[name])
        save_file(tensors, str(tmp), metadata={**metadata, INT8_KEY: json.dumps(names)})

    return write_file_atomic(path, write)


def int8_weights(path: str | Path) -> list[str]:
    """The names a weights file stores as int8 (`save_model(..., int8=True)`); [] for
    a float file.

    Raises:
        ValueError: an unreadable file or list.
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            names = json.loads((f.metadata() or {}).get(INT8_KEY, "[]"))
    except (SafetensorError, OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a readable safetensors checkpoint: {err}") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: its {INT8_KEY} metadata is not a list of names")
    return names


def _load_into(model: nn.Module, path: str | Path, device: str) -> None:
    """Load a weights file into `model` (strict), dequantizing int8 weights if it has some."""
    names = int8_weights(path)
    if not names:
        _load_weights(model, str(path), strict=True, device=device)
        return
    tensors = load_file(str(path), device=device)
    for name in names:
        scale = tensors.pop(name + INT8_SCALE_SUFFIX, None)
        if name not in tensors or scale is None or tensors[name].dtype != torch.int8:
            raise RuntimeError(f"int8 weight {name} or its scale is missing or not int8")
        tensors[name] = dequantize_weight(tensors[name], scale)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    state = model.state_dict()  # a tied weight is stored once, under one of its names
    stored = {state[name].data_ptr() for name in tensors if name in state}
    missing = [name for name in missing if state[name].data_ptr() not in stored]
    if missing or unexpected:
        raise RuntimeError(f"missing tensors {missing}, unexpected tensors {unexpected}")


def read_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` stored in a weights file.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: if it is not a safetensors file written by aiayn.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors checkpoint: {err}") from None
    if CONFIG_KEY not in metadata:
        raise ValueError(f"{path} has no aiayn model config in its metadata")
    try:
        values = json.loads(metadata[CONFIG_KEY])
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: its {CONFIG_KEY} metadata is not JSON: {err}") from None
    if not isinstance(values, dict):
        raise ValueError(
            f"{path}: its {CONFIG_KEY} metadata is {type(values).__name__} "
            f"{json.dumps(values)[:80]}, not a JSON object of ModelConfig fields: "
            "the file is damaged or not written by aiayn"
        )
    try:
        return ModelConfig.from_dict(values)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{path}: its {CONFIG_KEY} metadata is no valid model config: {err}"
        ) from None


def build_checked(cfg: ModelConfig, path: str | Path) -> nn.Module:
    """Build the model `cfg` describes, refusing a config whose tensors are not the sizes
    the weights file stores, and doing so before any memory is allocated for a config
    far larger than the file (a damaged config's vocab_size of 1e11 would otherwise
    ask for terabytes).

    A config whose size (`config_size_bound`, an over-estimate from its fields) is within
    a few times the numbers the file holds (`affordable`) is built at once, and each tensor the file stores
    is compared with the model's of the same name. Any other is first built on the meta
    device (shapes only, no storage) and compared there: that way costs about a second
    in every process, the first meta-device operations importing torch's reference
    implementations, so only a config that could not be afforded pays it. A model that
    cannot be built on the meta device (a module that needs real values to be made, as
    Performer's seeded directions) is held to a lower bound instead: the file stores at
    least its token embedding and one feed-forward matrix, vocab_size x d_model +
    d_ff x d_model numbers. Missing and extra names are left to the loading itself.

    Returns:
        the model, built with fresh weights, for the file's to be loaded into.

    Raises:
        ValueError: naming the file, the config's sizes, and the tensor and both
            shapes (or the numbers the file holds against those the config needs).
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())  # a safe_open is not iterable
            stored = {name: tuple(f.get_slice(name).get_shape()) for name in names}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{path} is not a readable safetensors checkpoint: {err}") from None
    held = sum(math.prod(shape) for shape in stored.values())
    if not affordable(cfg, held):
        try:
            with torch.device("meta"):
                model = build_model(cfg)
        except (RuntimeError, NotImplementedError):  # a module that reads values as it is made
            least = (cfg.vocab_size + cfg.d_ff) * cfg.d_model
            if least > held:
                raise ValueError(
                    f"{path}: its model config ({_sizes(cfg)}) needs at least {least:,} "
                    f"weights, but the file holds {held:,}: {DAMAGED}"
                ) from None
        else:
            _compare_shapes(cfg, model, stored, path)
    model = build_model(cfg)
    _compare_shapes(cfg, model, stored, path)
    return model


DAMAGED = "the config does not belong to these weights (a damaged file?)"


def _sizes(cfg: ModelConfig) -> str:
    fields = ("vocab_size", "d_model", "d_ff", "max_len")
    return ", ".join(f"{field}={getattr(cfg, field)}" for field in fields)


def _compare_shapes(
    cfg: ModelConfig, model: nn.Module, stored: dict[str, tuple[int, ...]], path: str | Path
) -> None:
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, shape in stored.items():
        if name in expected and expected[name] != shape:
            raise ValueError(
                f"{path}: its model config ({_sizes(cfg)}) makes {name} of shape "
                f"{expected[name]}, but the file stores it as {shape}: {DAMAGED}"
            )


AFFORDABLE_FACTOR = 4
"""How many times the numbers a weights file holds a config's over-estimate may reach
and the model still be built at once, without a meta-device check first."""


def affordable(cfg: ModelConfig, held: int) -> bool:
    """Whether the model `cfg` describes can be built at once beside a weights file
    holding `held` numbers: `config_size_bound(cfg)` is at most `AFFORDABLE_FACTOR`
    times `held`, plus a million numbers of slack for the smallest models."""
    return config_size_bound(cfg) <= AFFORDABLE_FACTOR * held + 2**20


def config_size_bound(cfg: ModelConfig) -> int:
    """An over-estimate of the numbers (weights and buffers) a model of `cfg` holds, from
    its fields alone: every size field enters it, so a damaged one makes it huge.

    Per layer of either stack: two attention sub-layers of four projections (each at
    most (d_model + 1) x the widest of d_model, heads x d_k and heads x d_v), three
    feed-forward matrices with biases (a gated activation's third), and norms; then
    three vocabulary matrices with an output bias, a position table of max_len rows
    (twice: stored and a buffer), the token-type vectors and a classifier of a
    vocabulary's width. `test_checkpoint_checks` holds it above every built-in shape,
    kernel and position scheme's real count.
    """
    d = cfg.d_model
    heads = max(cfg.n_heads, cfg.n_kv_heads or 0)
    width = max(d, heads * (cfg.d_k or d // cfg.n_heads), heads * (cfg.d_v or d // cfg.n_heads))
    attention = 4 * (d + 1) * width
    layer = 2 * attention + 3 * (d + 1) * cfg.d_ff + 8 * d
    layers = (cfg.n_encoder_layers or cfg.n_layers) + (cfg.n_decoder_layers or cfg.n_layers)
    vocabulary = 4 * cfg.vocab_size * (d + 1)
    rows = 2 * cfg.max_len + cfg.type_vocab_size + 8
    return layers * layer + vocabulary + rows * d


def load_model(
    path: str | Path, device: str | torch.device = "cpu", cfg: ModelConfig | None = None
) -> nn.Module:
    """Rebuild a model from a weights file written by `save_model`.

    The class comes from the stored config's `architecture` (`aiayn.models`): a
    `Transformer` for an encoder-decoder.

    Args:
        path: the weights file.
        device: where the model's weights are loaded.
        cfg: the config stored in `path`, where the caller has read it already
            (`read_config`; `aiayn.apps.model_use.run_files`); read here otherwise.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: if the file is corrupt, foreign, or does not match its config.
    """
    cfg = read_config(path) if cfg is None else cfg
    model = build_checked(cfg, path)
    try:
        _load_into(model, path, str(device))
    except (SafetensorError, RuntimeError, OSError) as err:
        raise ValueError(f"cannot load weights from {path}: {err}") from None
    return model.to(device)


# ----- a run directory's layout ------------------------------------------------
#   RUN/config.yaml                              the resolved training recipe
#   RUN/spm.model                                the shared subword model
#   RUN/.lock                                    held by the one trainer of the run
#   RUN/checkpoints/step-00001000/model.safetensors (+ trainer.pt, the trainer state)
#   RUN/checkpoints/best/model.safetensors       lowest validation loss so far
#   RUN/checkpoints/average-last-5/model.safetensors   from `aiayn average RUN --last 5`
#                                     (+ averaged.json: the steps it averages)

WEIGHTS_FILE = "model.safetensors"
BEST_DIR = "best"
LOCK_FILE = ".lock"
AVERAGED_FILE = "averaged.json"
STEP_PREFIX = "step-"


def step_of(checkpoint_dir: Path) -> int:
    """The update count a step checkpoint directory is named after.

    Raises:
        ValueError: a name that is not step-NNNN (digits after the prefix), naming it.
    """
    digits = checkpoint_dir.name.removeprefix(STEP_PREFIX)
    if not (checkpoint_dir.name.startswith(STEP_PREFIX) and digits.isascii() and digits.isdigit()):
        raise ValueError(
            f"{checkpoint_dir} is not a step checkpoint: its name is not {STEP_PREFIX}NUMBER"
        )
    return int(digits)


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's step checkpoint directories, oldest first.

    A directory named step-* whose suffix is not a number (step-abc, copied or renamed
    by hand) is no checkpoint of the run: it is left out, with a warning naming it.
    """
    root = Path(run_dir) / "checkpoints"
    found = []
    for directory in root.glob(f"{STEP_PREFIX}*"):
        if not (directory / WEIGHTS_FILE).is_file():
            continue
        try:
            step_of(directory)
        except ValueError:
            log.warning(
                "%s is not a step checkpoint (its name is not %sNUMBER): ignored",
                directory,
                STEP_PREFIX,
            )
            continue
        found.append(directory)
    return sorted(found, key=step_of)


def find_in_run(weights: str | Path, name: str) -> Path | None:
    """The run's file `name` (spm.model, config.yaml) for a weights file, or None.

    Looked for where a run's layout puts it, and nowhere else: beside the weights (a
    pruned run, a bare checkpoint directory), then in RUN when the weights are
    RUN/checkpoints/NAME/model.safetensors. A parent folder's file of the same name
    belongs to another run and is never taken.
    """
    weights = Path(weights).absolute()
    places = [weights.parent]
    if weights.parent.parent.name == "checkpoints":
        places.append(weights.parents[2])
    return next((p / name for p in places if (p / name).is_file()), None)


def averaged_steps(average_dir: Path) -> list[int] | None:
    """The steps an `average_last` directory averages (from its averaged.json), or None
    for an average without that record."""
    try:
        record = json.loads((average_dir / AVERAGED_FILE).read_text(encoding="utf-8"))
        return [int(step) for step in record["steps"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def resolve_weights(run_or_file: str | Path) -> Path:
    """The weights file to translate with: the one rule of aiayn.

    A `.safetensors` file is taken as it is, and so is a checkpoint directory's
    model.safetensors. In a run directory, the first of:

    1. an average (RUN/checkpoints/average-last-K, from `aiayn average`) whose
       averaged steps reach the newest step checkpoint; the most recently written
       one if several do;
    2. RUN/checkpoints/best, the lowest validation loss so far;
    3. the newest step checkpoint.

    An average older than the newest step checkpoint (training went on after it was
    made) is not used: a warning names it and the command that re-averages.

    Raises:
        FileNotFoundError: naming what was looked for, if nothing is there.
    """
    path = Path(run_or_file)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint or run directory at {path}")
    if (path / WEIGHTS_FILE).is_file():  # a single checkpoint directory
        return path / WEIGHTS_FILE
    steps = step_checkpoints(path)
    newest = step_of(steps[-1]) if steps else None
    averages = sorted(
        (path / "checkpoints").glob(f"average-last-*/{WEIGHTS_FILE}"),
        key=lambda p: p.stat().st_mtime,
    )
    current = [
        weights
        for weights in averages
        if newest is None or max(averaged_steps(weights.parent) or [-1]) >= newest
    ]
    if current:
        return current[-1]
    fallback = path / "checkpoints" / BEST_DIR / WEIGHTS_FILE
    if not fallback.is_file():
        fallback = steps[-1] / WEIGHTS_FILE if steps else None
    if averages and fallback is not None:
        stale = averages[-1].parent
        log.warning(
            "%s is older than the newest checkpoint (step %d): translating with %s instead; "
            "re-average with: aiayn average %s --last %s",
            stale,
            newest,
            fallback,
            path,
            stale.name.removeprefix("average-last-"),
        )
    if fallback is not None:
        return fallback
    raise FileNotFoundError(
        f"{path} holds no checkpoint: looked for {path}/checkpoints/"
        f"{{average-last-*,best,step-*}}/{WEIGHTS_FILE}"
    )


# ----- training checkpoints ----------------------------------------------------------
#   A step checkpoint is a directory: model.safetensors (weights + config, as above)
#   and trainer.pt (the state that makes a resumed run exact, see `save_checkpoint`).
#   It is written complete under a hidden temporary name, every file fsynced, then
#   renamed into place: a directory named step-* is always whole.
#   Test hook: AIAYN_TEST_SLOW_SAVE=SECONDS makes every step checkpoint pause that long
#   half-way through its write (weights written, trainer state not yet), so that a test
#   can kill the process mid-write. Never set it otherwise.

TRAINER_FILE = "trainer.pt"
SLOW_SAVE_VARIABLE = "AIAYN_TEST_SLOW_SAVE"


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: Transformer,
    trainer_state: dict[str, Any],
    keep_last: int | None = None,
) -> Path:
    """Write RUN/checkpoints/step-NNNNNNNN/ atomically; keep only the last `keep_last`.

    Args:
        run_dir: the run directory.
        step: the number of updates made; names the directory.
        model: the bare model (not wrapped in DDP or torch.compile).
        trainer_state: what the trainer needs to resume exactly: optimizer,
            scheduler, step, epoch and batch position, RNG states, cumulative train
            seconds, best validation loss, non-finite counters (any picklable dict).
        keep_last: delete older step checkpoints beyond this many (None keeps all).

    Returns:
        The checkpoint directory.

    Raises:
        aiayn.data.files.WriteFailed: (an OSError) the disk is full or not writable; it
            names the checkpoint directory, and the earlier checkpoints are intact.
    """
    target = Path(run_dir) / "checkpoints" / f"{STEP_PREFIX}{step:08d}"
    pause = float(os.environ.get(SLOW_SAVE_VARIABLE) or 0)

    def write(tmp: Path) -> None:
        _save_weights(model, str(tmp / WEIGHTS_FILE), metadata=_metadata(model))
        if pause:
            time.sleep(pause)
        # An open file, not a path: then a full disk surfaces as the OSError behind
        # torch's RuntimeError (see aiayn.data.files.system_error).
        with open(tmp / TRAINER_FILE, "wb") as file:
            torch.save(trainer_state, file)

    write_dir_atomic(target, write)
    if keep_last is not None:
        for old in step_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return target


def save_best(run_dir: str | Path, model: Transformer, info: dict[str, Any]) -> Path:
    """Write RUN/checkpoints/best/ (weights + info.json) atomically, replacing the old one."""
    target = Path(run_dir) / "checkpoints" / BEST_DIR

    def write(tmp: Path) -> None:
        _save_weights(model, str(tmp / WEIGHTS_FILE), metadata=_metadata(model))
        (tmp / "info.json").write_text(strict_json(info), encoding="utf-8")

    return write_dir_atomic(target, write)


def _metadata(model: Transformer) -> dict[str, str]:
    return {CONFIG_KEY: json.dumps(model.cfg.to_dict())}


def load_weights(model: Transformer, path: str | Path, device: str | torch.device = "cpu") -> None:
    """Load a weights file into an existing model, in place (the optimizer keeps its tensors).

    Raises:
        ValueError: the file does not match the model; the config fields that
            differ are named when the file records its config.
    """
    try:
        _load_into(model, path, str(device))
    except (SafetensorError, RuntimeError, OSError) as err:
        try:
            differ = _differing_fields(read_config(path), model.cfg)
        except (FileNotFoundError, ValueError):  # no config to compare: the loader's message
            differ = ""
        if differ:  # one line, not a size mismatch per tensor
            raise ValueError(f"{path} holds a model of another shape: {differ}") from None
        raise ValueError(f"cannot load weights from {path}: {err}") from None


def _differing_fields(saved: ModelConfig, wanted: ModelConfig) -> str:
    """ "d_model 32 in the file, 64 here; ..." for every field that differs."""
    old, new = saved.to_dict(), wanted.to_dict()
    return "; ".join(
        f"{k} {old.get(k)!r} in the file, {new.get(k)!r} here"
        for k in sorted(old.keys() | new.keys())
        if old.get(k) != new.get(k)
    )


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest step checkpoint with a trainer state, or None."""
    found = [d for d in step_checkpoints(run_dir) if (d / TRAINER_FILE).is_file()]
    return found[-1] if found else None


def load_trainer_state(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The trainer state saved by `save_checkpoint`.

    The file is a pickle (it holds numpy RNG states): load only checkpoints you wrote.

    Raises:
        FileNotFoundError: no trainer.pt in `checkpoint_dir`.
        ValueError: the file is unreadable.
    """
    path = Path(checkpoint_dir) / TRAINER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no trainer state at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # pickle and zip errors of many kinds
        raise ValueError(f"cannot read the trainer state {path}: {err}") from None


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the weights in several `.safetensors` files.

    Accumulates in float64 and returns each tensor in its stored dtype. Section 6:
    "we used a single model obtained by averaging the last 5 checkpoints".

    Raises:
        ValueError: no paths, or the files hold different models (configs or tensors).
    """
    if not paths:
        raise ValueError("nothing to average: no checkpoints given")
    configs = {str(p): read_config(p) for p in paths}
    if len(set(configs.values())) > 1:
        raise ValueError(f"cannot average checkpoints of different models: {list(configs)}")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        state = load_file(str(path))
        if total and set(state) != set(total):
            raise ValueError(f"{path} holds other tensors than {paths[0]}")
        for name, tensor in state.items():
            dtypes[name] = tensor.dtype
            total[name] = total.get(name, 0) + tensor.to(torch.float64)
    return {name: (t / len(paths)).to(dtypes[name]) for name, t in total.items()}


def average_last(run_dir: str | Path, k: int) -> Path:
    """Average the last `k` step checkpoints of a run into RUN/checkpoints/average-last-K/,
    with averaged.json recording which steps (`averaged_steps` reads it back).

    Returns:
        The path of the averaged `model.safetensors`.

    Raises:
        ValueError: `k` < 1, or the run has fewer than `k` step checkpoints.
    """
    if k < 1:
        raise ValueError(f"--last must be at least 1, got {k}")
    steps = step_checkpoints(run_dir)
    if len(steps) < k:
        raise ValueError(
            f"{run_dir} has {len(steps)} step checkpoint(s), fewer than the {k} to average"
        )
    chosen = steps[-k:]
    weights = [d / WEIGHTS_FILE for d in chosen]
    averaged = average_checkpoints(weights)
    names = json.dumps([d.name for d in chosen])
    metadata = {CONFIG_KEY: json.dumps(read_config(weights[0]).to_dict()), "aiayn.averaged": names}
    record = {"steps": [step_of(d) for d in chosen], "checkpoints": [d.name for d in chosen]}
    target = Path(run_dir) / "checkpoints" / f"average-last-{k}"

    def fill(tmp: Path) -> None:
        save_file(averaged, str(tmp / WEIGHTS_FILE), metadata=metadata)
        (tmp / AVERAGED_FILE).write_text(strict_json(record, indent=None), encoding="utf-8")

    write_dir_atomic(target, fill)
    return target / WEIGHTS_FILE
