"""Attention heat maps: one grid per kind of attention, a panel per layer and head.

    figures = plot_translation_attention(translator, "Ein Haus am See.", "attention/")
    # attention/encoder.png, attention/decoder.png, attention/cross.png

The sentence is translated first (beam search, or greedy with beam=1), then one
teacher-forced pass over source and translation takes the weights from the
explicit attention path (`Transformer.attention_maps`); nothing else changes the
model's fast default path. Rows are queries, columns keys: encoder self-attention
is source x source, decoder self-attention target x target (causal), and
encoder-decoder attention target x source. Target rows are labelled with the
decoder's input tokens (bos first), each row deciding the next token.

A one-stack model has one kind: `plot_self_attention` draws a decoder-only (GPT)
model's causal self-attention, or an encoder-only (BERT) model's bidirectional
one, over the sequence as the model reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Protocol

import torch
from matplotlib.figure import Figure
from torch import Tensor

from aiayn.data.files import write_file_atomic
from aiayn.data.tokenizer import Tokenizer
from aiayn.inference.search import Decodable, DecodeConfig, Hypothesis, search
from aiayn.models.encoder_decoder import AttentionMaps, Transformer


class Translating(Protocol):
    """What drawing a translation's attention needs of a translator
    (`aiayn.apps.translate.Translator` has it)."""

    model: Transformer  # the literal model: its explicit path gives the weights
    engine: Decodable  # what the search runs (a frozen copy, maybe shortlisted)
    tokenizer: Tokenizer

    def encode(self, texts: Sequence[str]) -> list[list[int]]: ...

    def to_batch(self, rows: Sequence[Sequence[int]]) -> Tensor: ...


class AttentionKind(str, Enum):
    """The three uses of attention in the model (section 3.2.3)."""

    ENCODER = "encoder"  # encoder self-attention
    DECODER = "decoder"  # causal decoder self-attention
    CROSS = "cross"  # encoder-decoder attention


def _select(n: int, chosen: Sequence[int] | None, what: str) -> list[int]:
    if chosen is None:
        return list(range(n))
    bad = [c for c in chosen if not 0 <= c < n]
    if bad:
        raise ValueError(f"{what} {bad} out of range: the model has {n} (numbered from 0)")
    return list(chosen)


def write_png(fig: Figure, path: str | Path) -> Path:
    """Write `fig` to `path` as a PNG (100 dpi), atomically (`write_file_atomic`)."""
    return write_file_atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=100, format="png"))


def plot_attention(
    weights: Sequence[Tensor],
    query_tokens: Sequence[str],
    key_tokens: Sequence[str],
    title: str,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> Figure:
    """A grid of heat maps, one row per layer and one column per head.

    Args:
        weights: per layer, (H, Tq, Tk) or (1, H, Tq, Tk) attention weights.
        query_tokens: Tq labels for the rows.
        key_tokens: Tk labels for the columns.
        title: the figure's title.
        layers: which layers to draw (0-based); all by default.
        heads: which heads to draw (0-based); all by default.

    Returns:
        The matplotlib figure (not shown; call `savefig`).

    Raises:
        ValueError: on a layer or head that does not exist, or labels that do not
            match the weights' shape.
    """
    maps = [w[0] if w.dim() == 4 else w for w in weights]  # (H, Tq, Tk) per layer
    layer_ids = _select(len(maps), layers, "layer")
    head_ids = _select(maps[0].size(0), heads, "head")
    n_query, n_key = maps[0].shape[-2:]
    if (len(query_tokens), len(key_tokens)) != (n_query, n_key):
        raise ValueError(
            f"{len(query_tokens)} x {len(key_tokens)} labels for {n_query} x {n_key} weights"
        )
    size = min(0.25 * max(n_query, n_key) + 1.5, 8.0)  # inches per panel, capped
    fig = Figure(figsize=(size * len(head_ids), size * len(layer_ids)), layout="constrained")
    grid = fig.subplots(len(layer_ids), len(head_ids), squeeze=False)
    for row, layer in enumerate(layer_ids):
        for col, head in enumerate(head_ids):
            ax = grid[row][col]
            ax.imshow(
                maps[layer][head].detach().float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0
            )
            ax.set_title(f"layer {layer} head {head}", fontsize=8)
            ax.set_xticks(range(n_key), list(key_tokens), rotation=90, fontsize=6)
            ax.set_yticks(range(n_query), list(query_tokens), fontsize=6)
    fig.suptitle(title)
    return fig


def translation_attention(
    translator: Translating, sentence: str, config: DecodeConfig | None = None
) -> tuple[AttentionMaps, list[str], list[str]]:
    """Translate `sentence`, then take every attention weight of that pair.

    Returns:
        The maps (batch of one), the source pieces (eos last) and the decoder's
        input pieces (bos first).
    """
    maps, src_pieces, tgt_pieces, _ = hypothesis_attention(translator, sentence, config)
    return maps, src_pieces, tgt_pieces


def hypothesis_attention(
    translator: Translating,
    sentence: str,
    config: DecodeConfig | None = None,
    best: Hypothesis | None = None,
) -> tuple[AttentionMaps, list[str], list[str], Hypothesis]:
    """`translation_attention`, and the search's best `Hypothesis` whose weights they are.

    `best`: the sentence's hypothesis when a search already found it (a server's
    batch); otherwise `config`'s search runs here.
    """
    if not sentence.strip():
        raise ValueError("cannot draw attention for an empty sentence")
    model, tokenizer = translator.model, translator.tokenizer
    cfg = model.cfg
    src = translator.to_batch(translator.encode([sentence]))  # (1, S)
    if best is None:
        (best, *_), *_ = search(translator.engine, src, config or DecodeConfig(beam=1))
    tgt_in = torch.tensor([[cfg.bos_id, *best.tokens]], device=src.device)  # (1, T)
    with torch.no_grad():
        maps = model.attention_maps(src, tgt_in)
    src_pieces = [tokenizer.id_to_piece(i) for i in src[0].tolist()]
    tgt_pieces = [tokenizer.id_to_piece(i) for i in tgt_in[0].tolist()]
    return maps, src_pieces, tgt_pieces, best


def plot_translation_attention(
    translator: Translating,
    sentence: str,
    out_dir: str | Path,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    config: DecodeConfig | None = None,
) -> dict[AttentionKind, Path]:
    """Heat maps of all three kinds of attention for one sentence, saved as PNG.

    Args:
        translator: the model and subword model.
        sentence: the source sentence.
        out_dir: where `encoder.png`, `decoder.png` and `cross.png` go.
        layers, heads: restrict the grids (0-based); all by default.
        config: how to translate first (greedy by default).

    Returns:
        The PNG path of each kind.
    """
    maps, src_pieces, tgt_pieces = translation_attention(translator, sentence, config)
    kinds = {
        AttentionKind.ENCODER: (maps.encoder, src_pieces, src_pieces, "encoder self-attention"),
        AttentionKind.DECODER: (maps.decoder, tgt_pieces, tgt_pieces, "decoder self-attention"),
        AttentionKind.CROSS: (maps.cross, tgt_pieces, src_pieces, "encoder-decoder attention"),
    }
    figures = {  # all drawn (and layers, heads checked) before anything is written
        kind: plot_attention(weights, rows, cols, title, layers, heads)
        for kind, (weights, rows, cols, title) in kinds.items()
    }
    paths = {}
    for kind, fig in figures.items():
        paths[kind] = write_png(fig, Path(out_dir) / f"{kind.value}.png")
    return paths


def plot_self_attention(
    model: torch.nn.Module,
    ids: Tensor,
    pieces: Sequence[str],
    out_dir: str | Path,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
) -> dict[AttentionKind, Path]:
    """Heat maps of a one-stack model's self-attention over one sequence, saved as PNG.

    A decoder-only model (GPT) has causal self-attention only: `decoder.png`. An
    encoder-only model (BERT) has bidirectional self-attention only: `encoder.png`.

    Args:
        model: a `DecoderOnly` or `EncoderOnly` (its `attention_maps(ids)`).
        ids: (1, T) the sequence as the model reads it.
        pieces: its T pieces, for the axes.
        out_dir: where the PNG goes.
        layers, heads: restrict the grid (0-based); all by default.

    Returns:
        The PNG path of the one kind drawn.
    """
    with torch.no_grad():
        maps = model.attention_maps(ids)
    if maps.decoder:
        kind, weights, title = AttentionKind.DECODER, maps.decoder, "causal self-attention"
    else:
        kind, weights, title = AttentionKind.ENCODER, maps.encoder, "self-attention"
    fig = plot_attention(
        weights, pieces, pieces, f"{title} ({model.cfg.architecture})", layers, heads
    )
    path = write_png(fig, Path(out_dir) / f"{kind.value}.png")
    return {kind: path}
