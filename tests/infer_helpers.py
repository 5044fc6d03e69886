"""A tiny trained-looking run directory for the inference tests (random weights).

RUN/spm.model, RUN/checkpoints/step-00000001/model.safetensors
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from aiayn import ModelConfig, Transformer
from aiayn.data.tokenizer import train_tokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE, save_model

# As main's tests/conftest.py does (this branch predates it): one thread, since the
# machines running the tests are shared and two threads there can be far slower.
torch.set_num_threads(1)

WORDS = [
    "house",
    "garden",
    "river",
    "tree",
    "stone",
    "bridge",
    "light",
    "water",
    "night",
    "summer",
    "ein",
    "das",
    "haus",
]
VOCAB_SIZE = 48


def sentences(n: int, seed: int = 0) -> list[str]:
    """`n` sentences of 1 to 8 words from a tiny word list, seeded."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(1, 8))) + "." for _ in range(n)]


def make_run(root: Path, max_len: int = 32, seed: int = 0) -> Path:
    """Write a run directory with a tiny subword model and a random tiny Transformer."""
    spm_path = root / "spm-build" / TOKENIZER_FILE
    tokenizer = train_tokenizer(sentences(300), spm_path, vocab_size=VOCAB_SIZE)
    torch.manual_seed(seed)
    cfg = ModelConfig.tiny(
        vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, max_len=max_len, dropout=0.0
    )
    run = root / "run"
    save_model(Transformer(cfg), run / "checkpoints" / "step-00000001" / "model.safetensors")
    shutil.copy(spm_path, run / TOKENIZER_FILE)
    return run
