"""Model weights on disk: safetensors, written atomically, with the config inside.

A weights file carries its `ModelConfig` as JSON in the safetensors metadata, so
`load_model(path)` needs nothing else to rebuild the model.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_model as _load_weights
from safetensors.torch import safe_open
from safetensors.torch import save_model as _save_weights

from aiayn.config import ModelConfig
from aiayn.model import Transformer

CONFIG_KEY = "aiayn.model_config"


def fsync_dir(directory: Path) -> None:
    """Make a rename inside `directory` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_model(model: Transformer, path: str | Path) -> Path:
    """Write the weights and config to `path` atomically (temporary file, fsync, rename).

    A process killed half-way leaves any earlier file at `path` intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    metadata = {CONFIG_KEY: json.dumps(model.cfg.to_dict())}
    _save_weights(model, str(tmp), metadata=metadata)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


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
    return ModelConfig.from_dict(json.loads(metadata[CONFIG_KEY]))


def load_model(path: str | Path, device: str | torch.device = "cpu") -> Transformer:
    """Rebuild a `Transformer` from a weights file written by `save_model`.

    Raises:
        FileNotFoundError: if `path` does not exist.
        ValueError: if the file is corrupt, foreign, or does not match its config.
    """
    cfg = read_config(path)
    model = Transformer(cfg)
    try:
        _load_weights(model, str(path), strict=True, device=str(device))
    except (SafetensorError, RuntimeError, OSError) as err:
        raise ValueError(f"cannot load weights from {path}: {err}") from None
    return model.to(device)


# ----- a run directory's layout ------------------------------------------------
#   RUN/config.yaml                              the resolved training recipe
#   RUN/spm.model                                the shared subword model
#   RUN/checkpoints/step-00001000/model.safetensors (+ trainer.pt, the trainer state)
#   RUN/checkpoints/best/model.safetensors       lowest validation loss so far
#   RUN/checkpoints/average-last-5/model.safetensors   from `aiayn average RUN --last 5`

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "spm.model"


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's step checkpoint directories, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [d for d in root.glob("step-*") if (d / WEIGHTS_FILE).is_file()]
    return sorted(found, key=lambda d: int(d.name.removeprefix("step-")))


def resolve_weights(run_or_file: str | Path) -> Path:
    """The weights file to translate with.

    A `.safetensors` file is taken as it is. In a run directory the preference is:
    the newest averaged checkpoint, then `best`, then the latest step.

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
    averaged = sorted(
        (path / "checkpoints").glob(f"average-last-*/{WEIGHTS_FILE}"),
        key=lambda p: p.stat().st_mtime,
    )
    if averaged:
        return averaged[-1]
    if (path / "checkpoints" / "best" / WEIGHTS_FILE).is_file():
        return path / "checkpoints" / "best" / WEIGHTS_FILE
    steps = step_checkpoints(path)
    if steps:
        return steps[-1] / WEIGHTS_FILE
    raise FileNotFoundError(
        f"{path} holds no checkpoint: looked for {path}/checkpoints/"
        f"{{average-last-*,best,step-*}}/{WEIGHTS_FILE}"
    )
