"""A tiny trained-looking run directory for the inference tests (random weights).

RUN/spm.model, RUN/checkpoints/step-00000001/model.safetensors
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from aiayn import ModelConfig, Transformer
from aiayn.data.tokenizer import SentencePieceTokenizer, train_tokenizer
from aiayn.io.checkpoint import TOKENIZER_FILE, save_model
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_only import EncoderOnly

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
    return save_run(root / "run", Transformer(cfg), spm_path)


def save_run(run: Path, model: torch.nn.Module, spm: Path) -> Path:
    """`run` as a run directory: `model` as its one step checkpoint, `spm` as its subword model."""
    save_model(model, run / "checkpoints" / "step-00000001" / "model.safetensors")
    shutil.copy(spm, run / TOKENIZER_FILE)
    return run


def shape_runs(root: Path) -> dict[str, Path]:
    """A tiny run of each shape sharing one subword model: "mt" (`make_run`), "gpt" and
    "bert" (random weights, seeded)."""
    mt = make_run(root / "mt")
    vocab_size = SentencePieceTokenizer.load(mt / TOKENIZER_FILE).vocab_size
    torch.manual_seed(0)
    cfg = ModelConfig.gpt(
        vocab_size=vocab_size, dropout=0.0, n_layers=2, d_model=32, n_heads=4, d_ff=64,
        max_len=24,
    )  # fmt: skip
    gpt = save_run(root / "gpt", DecoderOnly(cfg), mt / TOKENIZER_FILE)
    bert_cfg = ModelConfig.bert(vocab_size, n_layers=1, d_model=32, n_heads=2, d_ff=64)
    bert = save_run(root / "bert", EncoderOnly(bert_cfg), mt / TOKENIZER_FILE)
    return {"mt": mt, "gpt": gpt, "bert": bert}
