"""A model shape other than the encoder-decoder plugs in with one class and one registration.

The toy decoder-only language model below is built from the same blocks
(`DecoderLayer` without cross-attention, the position plug-ins, `KVCache`
without cross stores) and registered under a name of its own; the search, the
checkpoint files and the config then handle it without knowing its class.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from aiayn import ModelConfig, build_model
from aiayn.inference.kv_cache import KVCache
from aiayn.inference.search import beam_search, greedy_search
from aiayn.io.checkpoint import load_model, save_model
from aiayn.models import SHAPES, register_model
from aiayn.models.encoder_decoder import Embedding, attention_positions
from aiayn.nn.attention import MultiHeadAttention
from aiayn.nn.layers import DecoderLayer, FeedForward
from aiayn.nn.positions import build_positions


class ToyLanguageModel(nn.Module):
    """GPT's shape: causal self-attention blocks over one token stream, tied output."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        tokens = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        positions = build_positions(cfg.positional, cfg, causal=True)
        self.embedding = Embedding(tokens, positions, cfg.dropout, cfg.scale_embeddings)
        self.layers = nn.ModuleList(
            DecoderLayer(
                MultiHeadAttention(cfg.d_model, cfg.n_heads),
                None,  # no encoder-decoder attention
                FeedForward(cfg.d_model, cfg.d_ff),
                cfg.d_model,
                cfg.dropout,
            )
            for _ in range(cfg.n_decoder_layers)
        )

    def forward(self, ids: Tensor, cache: KVCache | None = None) -> Tensor:
        offset = 0 if cache is None else cache.length
        x = self.embedding(ids, offset)
        rotary, bias = attention_positions(
            self.embedding.positions, ids.size(1), offset + ids.size(1)
        )
        for i, layer in enumerate(self.layers):
            store = None if cache is None else cache.self_attention[i]
            x = layer(x, self_cache=store, rotary=rotary, bias=bias)
        return x @ self.embedding.tokens.weight.T  # (B, T, V)

    def start(self, src: Tensor, beam: int = 1) -> LanguageModelDecoding:
        return LanguageModelDecoding(self, src, beam)


class LanguageModelDecoding:
    """Continue each prompt (no padding), `beam` rows per prompt, after a bos."""

    def __init__(self, model: ToyLanguageModel, prompt: Tensor, beam: int) -> None:
        self.model, self.dtype = model, torch.float32
        self.input_lengths = torch.full((prompt.size(0),), prompt.size(1))
        self.cache = KVCache.empty(model.cfg.n_decoder_layers, cross=False)
        model(prompt.repeat_interleave(beam, dim=0), self.cache)  # the prompt fills the cache

    def step(self, last: Tensor) -> Tensor:
        return self.model(last[:, None], self.cache)[:, -1]

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        self.cache.reorder(rows)


@pytest.fixture
def toy_shape():
    register_model("toy_decoder_only")(ToyLanguageModel)
    yield
    SHAPES.unregister("toy_decoder_only")


def config(**overrides) -> ModelConfig:
    return ModelConfig.tiny(
        vocab_size=20, architecture="toy_decoder_only", dropout=0.0, **overrides
    )


def greedy_by_hand(model: ToyLanguageModel, prompt: Tensor, steps: int) -> list[list[int]]:
    """The whole sequence through the model at every step: no cache, no search code."""
    eos = model.cfg.eos_id
    sequences = torch.cat([prompt, torch.full((prompt.size(0), 1), model.cfg.bos_id)], dim=1)
    outputs = []
    for row in sequences:
        ids, out = row[None], []
        for _ in range(steps):
            logits = model(ids)[0, -1]
            logits[[model.cfg.pad_id, model.cfg.bos_id]] = float("-inf")
            token = int(logits.argmax())
            if token == eos:
                break
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
        outputs.append(out)
    return outputs


@pytest.mark.parametrize("positional", ["sinusoidal", "rotary", "alibi"])
def test_a_registered_decoder_only_shape_is_searched_saved_and_loaded(
    toy_shape, tmp_path, positional
):
    model = build_model(config(positional=positional)).eval()
    assert isinstance(model, ToyLanguageModel)
    prompt = torch.randint(3, 20, (3, 5))
    steps = 5  # at most 5 + 1 output tokens (prompt + extra_len), the last one eos
    with torch.no_grad():
        found = greedy_search(model, prompt, extra_len=1)
        expected = greedy_by_hand(model, prompt, steps)
    assert [h[0].tokens for h in found] == expected
    assert all(len(h[0].tokens) > 0 for h in found)

    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path).eval()  # rebuilt from the config's architecture alone
    assert type(loaded) is ToyLanguageModel
    with torch.no_grad():
        again = beam_search(loaded, prompt, beam=3, extra_len=1)
        first = beam_search(model, prompt, beam=3, extra_len=1)
    assert [h[0].tokens for h in again] == [h[0].tokens for h in first]


def test_an_unregistered_architecture_is_refused_by_name():
    with pytest.raises(ValueError, match=r"architecture 'decoder_only_gpt'.*encoder_decoder"):
        ModelConfig.tiny(vocab_size=20, architecture="decoder_only_gpt")
