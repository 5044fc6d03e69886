"""The tutorials' diagrams, drawn by code: the paper's architecture (its figure 1), the
split of d_model into heads and their concatenation, grouped-query attention's
grouping, and the key/value cache. Run it after changing one:

    .venv/bin/python docs/hooks/diagrams.py          # writes docs/tutorials/img/*.png

Each figure is drawn at `DPI` with text of at least `MIN_FONT` points, so that its
smallest label is about 14 pixels high on the page (tests/docs/test_diagrams.py checks
the files are the ones this script draws, and their size). Not a MkDocs hook: it lives
here with the site's other build code and is not run at build time.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

OUT = Path(__file__).resolve().parents[1] / "tutorials" / "img"
DPI = 110
MIN_FONT = 9

# One colour per kind of block, as the paper's figure 1 colours them.
ATTENTION, FEED_FORWARD, NORM, EMBED, OUTPUT = "#f9d9a6", "#a6d8f0", "#f3f2b0", "#f6c3c3", "#d6c8ee"
QUERY, KEY, VALUE = "#f4a582", "#92c5de", "#a6dba0"


def _box(ax, x, y, w, h, text, colour, size=10):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=colour, edgecolor="#333333", linewidth=1))  # fmt: skip
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def _arrow(ax, start, end, colour="#333333"):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12,
                                 color=colour, linewidth=1.2))  # fmt: skip


def _sublayers(ax, x, y, w, names):
    """Stack sub-layers bottom to top from y; each is followed by Add & Norm."""
    for name, colour in names:
        _box(ax, x, y, w, 0.55, name, colour, size=MIN_FONT + 0.5)
        _arrow(ax, (x + w / 2, y + 0.55), (x + w / 2, y + 0.75))
        _box(ax, x, y + 0.75, w, 0.4, "Add & Norm", NORM, size=MIN_FONT)
        _arrow(ax, (x + w / 2, y + 1.15), (x + w / 2, y + 1.4))
        y += 1.4
    return y


def architecture() -> Figure:
    """The Transformer of the paper's figure 1: N encoder layers, N decoder layers."""
    fig = Figure(figsize=(7.2, 7.0))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(0, 10)
    ax.set_ylim(-0.05, 9.75)
    ax.axis("off")
    # the encoder (left) and decoder (right) stacks, framed as "N x"
    ax.add_patch(Rectangle((0.6, 2.55), 3.6, 3.1, facecolor="#f2f2f2", edgecolor="#888888"))
    ax.add_patch(Rectangle((5.4, 2.55), 3.6, 4.5, facecolor="#f2f2f2", edgecolor="#888888"))
    ax.text(0.35, 4.1, "N x", ha="center", va="center", fontsize=11, fontweight="bold")
    ax.text(9.3, 4.8, "x N", ha="center", va="center", fontsize=11, fontweight="bold")
    ax.text(2.4, 5.85, "Encoder (3.1)", ha="center", fontsize=11, fontweight="bold")
    ax.text(9.3, 7.25, "Decoder (3.1)", ha="right", fontsize=11, fontweight="bold")
    top = _sublayers(ax, 0.9, 2.75, 3.0, [("Multi-head self-attention", ATTENTION),
                                          ("Feed-forward (3.3)", FEED_FORWARD)])  # fmt: skip
    top_dec = _sublayers(ax, 5.7, 2.75, 3.0, [("Masked multi-head self-attention", ATTENTION),
                                              ("Multi-head cross-attention", ATTENTION),
                                              ("Feed-forward (3.3)", FEED_FORWARD)])  # fmt: skip
    # inputs: embedding + positional encoding
    for x, label in ((0.9, "Inputs (source tokens)"), (5.7, "Outputs, shifted right")):
        ax.text(x + 1.5, 0.15, label, ha="center", fontsize=10)
        _arrow(ax, (x + 1.5, 0.45), (x + 1.5, 0.65))
        _box(ax, x, 0.65, 3.0, 0.55, "Embedding x sqrt(d_model) (3.4)", EMBED, size=MIN_FONT)
        _arrow(ax, (x + 1.5, 1.2), (x + 1.5, 1.5))
        _box(ax, x, 1.5, 3.0, 0.55, "+ Positional encoding (3.5)", EMBED, size=MIN_FONT)
        _arrow(ax, (x + 1.5, 2.05), (x + 1.5, 2.75))
    # the encoder's output feeds every decoder layer's cross-attention (keys, values)
    _arrow(ax, (2.4, top - 0.25), (2.4, 6.6))
    ax.plot([2.4, 5.0, 5.0], [6.6, 6.6, 4.425], color="#333333", linewidth=1.2)
    _arrow(ax, (5.0, 4.425), (5.7, 4.425))
    ax.text(3.7, 6.75, "keys and values", ha="center", fontsize=MIN_FONT, style="italic")
    # output: linear + softmax
    _arrow(ax, (7.2, top_dec - 0.25), (7.2, top_dec + 0.6))
    _box(ax, 5.7, top_dec + 0.6, 3.0, 0.55, "Linear (tied to embedding)", OUTPUT, size=MIN_FONT)
    _arrow(ax, (7.2, top_dec + 1.15), (7.2, top_dec + 1.4))
    _box(ax, 5.7, top_dec + 1.4, 3.0, 0.55, "Softmax", OUTPUT)
    _arrow(ax, (7.2, top_dec + 1.95), (7.2, top_dec + 2.2))
    ax.text(7.2, top_dec + 2.3, "next-token probabilities", ha="center", fontsize=10)
    return fig


def heads_split_and_concat(n_heads: int = 4) -> Figure:
    """(T, d_model) -> h heads of (T, d_k) -> attention each -> concat -> W^O."""
    fig = Figure(figsize=(9.0, 3.6))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-1.0, 18.6)
    ax.set_ylim(0, 7.2)
    ax.axis("off")
    colours = ["#fdb863", "#b2abd2", "#80cdc1", "#f1b6da"]
    # x W^Q, reshaped: (B, T, d_model) -> (B, H, T, d_k)
    ax.text(1.6, 6.6, "Q = x W^Q\n(T, d_model)", ha="center", va="center", fontsize=10)
    for i in range(n_heads):
        ax.add_patch(Rectangle((0.4 + 0.6 * i, 1.2), 0.6, 4.4, facecolor=colours[i],
                               edgecolor="#333333"))  # fmt: skip
        ax.text(0.7 + 0.6 * i, 0.8, "d_k", ha="center", fontsize=MIN_FONT)
    ax.text(1.6, 0.2, "split into h heads (view + transpose)", ha="center", fontsize=MIN_FONT)
    for i in range(n_heads):
        y = 5.6 - 1.35 * i
        _arrow(ax, (2.9, 3.4), (4.6, y - 0.45))
        ax.add_patch(Rectangle((4.7, y - 1.0), 0.6, 1.1, facecolor=colours[i], edgecolor="#333"))
        _arrow(ax, (5.4, y - 0.45), (6.4, y - 0.45))
        _box(ax, 6.5, y - 0.85, 3.6, 0.8, f"head {i}: attention (eq. 1)", ATTENTION, size=MIN_FONT)
        _arrow(ax, (10.2, y - 0.45), (11.2, 3.4))
    ax.text(5.0, 6.6, "(T, d_k) each", ha="center", fontsize=10)
    for i in range(n_heads):
        ax.add_patch(Rectangle((11.3 + 0.6 * i, 1.2), 0.6, 4.4, facecolor=colours[i],
                               edgecolor="#333333"))  # fmt: skip
    ax.text(12.5, 6.6, "Concat(head_1..head_h)\n(T, h d_v)", ha="center", va="center",
            fontsize=10)  # fmt: skip
    ax.text(12.5, 0.2, "transpose + reshape back", ha="center", fontsize=MIN_FONT)
    _arrow(ax, (13.9, 3.4), (14.7, 3.4))
    _box(ax, 14.8, 2.9, 1.2, 1.0, "W^O", OUTPUT)
    _arrow(ax, (16.1, 3.4), (16.7, 3.4))
    ax.add_patch(Rectangle((16.8, 1.2), 0.9, 4.4, facecolor="#dddddd", edgecolor="#333333"))
    ax.text(17.25, 6.6, "output\n(T, d_model)", ha="center", va="center", fontsize=10)
    return fig


def grouped_query_attention(n_heads: int = 8) -> Figure:
    """Which key/value head each query head reads: MHA, GQA (2 groups), MQA."""
    fig = Figure(figsize=(9.0, 3.4))
    panels = fig.subplots(1, 3)
    for ax, (title, n_kv) in zip(panels, (("MHA: n_kv_heads = 8", 8),
                                         ("GQA: n_kv_heads = 2", 2),
                                         ("MQA: n_kv_heads = 1", 1)), strict=True):  # fmt: skip
        ax.set_xlim(-0.5, n_heads - 0.5)
        ax.set_ylim(-0.6, 2.9)
        ax.axis("off")
        ax.set_title(title, fontsize=11)
        width = n_heads / n_kv
        for j in range(n_kv):  # key/value heads, each under its group of query heads
            x = j * width + width / 2 - 0.5
            ax.add_patch(Rectangle((x - 0.42, -0.2), 0.84, 0.7, facecolor=KEY, edgecolor="#333"))
            ax.text(x, 0.15, "K,V", ha="center", va="center", fontsize=MIN_FONT)
            for i in range(int(j * width), int((j + 1) * width)):
                ax.plot([i, x], [1.9, 0.5], color="#555555", linewidth=1)
        for i in range(n_heads):
            ax.add_patch(Rectangle((i - 0.35, 1.9), 0.7, 0.7, facecolor=QUERY, edgecolor="#333"))
            ax.text(i, 2.25, "Q", ha="center", va="center", fontsize=MIN_FONT)
        ax.text((n_heads - 1) / 2, -0.55, f"cache: {n_kv} x (K, V) per token", ha="center",
                fontsize=MIN_FONT)  # fmt: skip
    fig.subplots_adjust(left=0.02, right=0.98, top=0.86, bottom=0.06, wspace=0.12)
    return fig


def kv_cache(steps: int = 5) -> Figure:
    """Decoding step t: the new token's query reads the cached keys/values 0..t-1 and
    its own; its key and value are appended for the next step."""
    fig = Figure(figsize=(9.0, 3.6))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlim(-1.8, 16)
    ax.set_ylim(-1.3, 5.6)
    ax.axis("off")
    for t in range(steps):
        x = 3.2 * t
        ax.text(x + 1.1, 5.2, f"step t = {t}", ha="center", fontsize=10, fontweight="bold")
        for s in range(t + 1):  # the cache after step t: keys (top row) and values
            new = s == t
            edge = "#d62728" if new else "#333333"
            ax.add_patch(Rectangle((x + 0.45 * s, 2.6), 0.4, 0.9, facecolor=KEY, edgecolor=edge,
                                   linewidth=2 if new else 1))  # fmt: skip
            ax.add_patch(Rectangle((x + 0.45 * s, 1.5), 0.4, 0.9, facecolor=VALUE,
                                   edgecolor=edge, linewidth=2 if new else 1))  # fmt: skip
        ax.add_patch(Rectangle((x + 0.45 * t, 4.0), 0.4, 0.7, facecolor=QUERY, edgecolor="#d62728",
                               linewidth=2))  # fmt: skip
        _arrow(ax, (x + 0.45 * t + 0.2, 4.0), (x + 0.45 * t + 0.2, 3.55), colour="#d62728")
        ax.text(x + 1.1, 0.9, f"{t} cached + 1 new", ha="center", fontsize=MIN_FONT)
    ax.text(-1.0, 4.35, "query", ha="center", va="center", fontsize=MIN_FONT)
    ax.text(-1.0, 3.05, "keys", ha="center", va="center", fontsize=MIN_FONT)
    ax.text(-1.0, 1.95, "values", ha="center", va="center", fontsize=MIN_FONT)
    ax.text(7.0, -0.3, "red: computed this step; black: read from the cache (never recomputed)",
            ha="center", fontsize=10)  # fmt: skip
    ax.text(7.0, -1.0, "per token and layer: 2 x n_kv_heads x d_k numbers", ha="center",
            fontsize=10)  # fmt: skip
    return fig


FIGURES: dict[str, Callable[[], Figure]] = {
    "04-architecture.png": architecture,
    "02-split-concat.png": heads_split_and_concat,
    "09-gqa-groups.png": grouped_query_attention,
    "09-kv-cache.png": kv_cache,
}


def draw(out: Path = OUT) -> list[Path]:
    """Draw every figure into `out`; the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, make in FIGURES.items():
        fig = make()
        fig.savefig(out / name, dpi=DPI, metadata={"Software": None})
        written.append(out / name)
    return written


if __name__ == "__main__":
    for path in draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT):
        print(path)
