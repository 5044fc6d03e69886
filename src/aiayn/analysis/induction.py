"""Induction heads (Olsson et al. 2022): the prefix-matching and copying scores of every head.

    ids = repeated_random_tokens(cfg.vocab_size, 50, 8, seed=0,
                                 specials=(cfg.pad_id, cfg.bos_id, cfg.eos_id), bos_id=cfg.bos_id)
    matching = induction_scores(gpt, ids)         # (L, H)
    previous = previous_token_scores(gpt, ids)    # (L, H)
    copying = copying_scores(gpt)                 # (L, H), from the weights alone
    write_induction(InductionScores(matching, previous, copying), "induction/")

Shape legend: B batch, T tokens repeated, L layers, H heads, D d_model, Dv value head
size, V vocabulary.

An induction head completes "[A][B] ... [A]" with "[B]": from the second [A] it attends
to the token after the first one (prefix matching) and raises that token's logit
(copying). Olsson et al. test it on a sequence of random tokens repeated, where only
in-context copying can predict the second repeat: bos, then T random tokens, then the
same T again (`repeated_random_tokens`).

Prefix matching (`induction_scores`): at position i of the second repeat (bos is
position 0, so i runs from T + 1 to 2T), token i is token i - T, and the token after
that earlier occurrence is at i - T + 1. A head's score is its attention weight from i
to i - T + 1 (`hook_weights` of each layer's self-attention), averaged over those T
positions and the batch: 1 for a perfect induction head. `previous_token_scores`
is the weight from i to i - 1 averaged over every position after bos (1 to 2T): the
previous-token heads an induction head builds on, a useful contrast.

Copying (`copying_scores`) reads the weights only: see its docstring for the
definition. Tokens are drawn with replacement, so a token may occur twice within one
repeat; the score still looks at i - T + 1 only, as TransformerLens's induction score does.

Only decoder-only models are scored (`DecoderOnly`, and `PrefixLM`, whose prefix is
bos alone on these sequences, so its attention is causal as GPT's): an encoder-only
model attends both ways, and an encoder-decoder's decoder reads a translation, not
a repeated sequence; both are refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.analysis.heads import plot_head_metric
from aiayn.analysis.patching import mean_ablation
from aiayn.analysis.patching_text import grid_to_json
from aiayn.analysis.viz import write_png
from aiayn.data.files import strict_json, write_atomic
from aiayn.models.decoder_only import DecoderOnly
from aiayn.nn.attention import MultiHeadAttention, regular_groups
from aiayn.nn.hooks import hooks, run_with_cache

JSON_FILE = "induction.json"
PNG_FILES = {  # score name -> its heat map
    "induction": "induction.png",
    "previous_token": "previous-token.png",
    "copying": "copying.png",
}


def repeated_random_tokens(
    vocab_size: int,
    length: int,
    batch: int,
    seed: int,
    specials: Iterable[int],
    bos_id: int,
) -> Tensor:
    """Olsson et al.'s test sequences: bos, T random ordinary tokens, the same T again.

    Args:
        vocab_size: V; tokens are drawn uniformly, with replacement, from the ids in
            [0, V) that are not special.
        length: T, the tokens of one repeat.
        batch: B, rows (each with its own random tokens).
        seed: fixes the tokens.
        specials: ids never drawn (pad, bos, eos, unk...).
        bos_id: the first token of every row.

    Returns:
        (B, 1 + 2T) int64 ids.

    Raises:
        ValueError: a length or batch below 1, or no ordinary token left.
    """
    if length < 1 or batch < 1:
        raise ValueError(f"length and batch must be at least 1, got {length} and {batch}")
    special = set(specials)
    ordinary = torch.tensor([i for i in range(vocab_size) if i not in special], dtype=torch.long)
    if not len(ordinary):
        raise ValueError(f"the vocabulary of {vocab_size} ids has only special tokens")
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(ordinary), (batch, length), generator=generator)
    tokens = ordinary[picks]  # (B, T)
    bos = torch.full((batch, 1), bos_id, dtype=torch.long)
    return torch.cat([bos, tokens, tokens], dim=1)  # (B, 1 + 2T)


def _decoder_only(model: nn.Module) -> DecoderOnly:
    """`model`, refused by name unless it is decoder-only."""
    if not isinstance(model, DecoderOnly):
        shape = getattr(getattr(model, "cfg", None), "architecture", type(model).__name__)
        raise ValueError(
            f"induction scores read a decoder-only (GPT) model's causal self-attention; a "
            f"{shape} model has none: use a decoder_only model"
        )
    return model


def _repeat_length(ids: Tensor) -> int:
    """T of (B, 1 + 2T) ids whose two halves after bos are equal."""
    if ids.dim() != 2 or ids.size(1) < 3 or ids.size(1) % 2 == 0:
        raise ValueError(
            f"ids must be (B, 1 + 2T), bos then T tokens twice (repeated_random_tokens); "
            f"got shape {tuple(ids.shape)}"
        )
    length = (ids.size(1) - 1) // 2
    if not torch.equal(ids[:, 1 : 1 + length], ids[:, 1 + length :]):
        raise ValueError("ids must repeat: the T tokens after bos, then the same T again")
    return length


def attention_weights(model: nn.Module, ids: Tensor) -> list[Tensor]:
    """Each layer's self-attention weights on `ids` (B, N), as (B, H, N, N) float32, read
    in eval mode without gradients (the model's mode is restored after).

    Raises:
        ValueError: a model that is not decoder-only, or an attention kernel that
            gives no weights.
    """
    model = _decoder_only(model)
    names = [f"decoder.layers.{i}.self_attn.hook_weights" for i in range(len(model.decoder.layers))]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            _, cache = run_with_cache(model, ids, names=names)
    finally:
        model.train(was_training)
    if len(cache) != len(names):
        raise ValueError(
            f"the attention kernel {model.cfg.attention!r} gives no attention weights; "
            "induction scores need them (a kernel that declares dense_softmax)"
        )
    return [cache[name].float() for name in names]


def _grid(rows: Sequence[Tensor]) -> Tensor:
    """(L, H) from one (H_l,) row per layer; NaN past a pruned layer's last head."""
    grid = torch.full((len(rows), max(len(row) for row in rows)), math.nan)
    for layer, row in enumerate(rows):
        grid[layer, : len(row)] = row.cpu()
    return grid


def induction_scores(model: nn.Module, ids: Tensor) -> Tensor:
    """The prefix-matching score of every head (Olsson et al. 2022).

    Args:
        model: a decoder-only model.
        ids: (B, 1 + 2T) from `repeated_random_tokens`.

    Returns:
        (L, H) float32: each head's attention weight from position i of the second
        repeat (T + 1 to 2T) to i - T + 1, averaged over those positions and the
        batch; NaN for heads a pruned layer no longer has.

    Raises:
        ValueError: a model that is not decoder-only, ids that are not bos and T
            tokens twice, or longer than the model's max_len.
    """
    length = _repeat_length(ids)
    rows = []
    for weights in attention_weights(model, ids):  # (B, H, 1 + 2T, 1 + 2T)
        second = weights[:, :, 1 + length :, :]  # (B, H, T, 1 + 2T): queries T + 1 .. 2T
        # query T + 1 + r attends to key r + 2: the diagonal at offset 2
        rows.append(second.diagonal(offset=2, dim1=-2, dim2=-1).mean(dim=(0, 2)))  # (H,)
    return _grid(rows)


def previous_token_scores(model: nn.Module, ids: Tensor) -> Tensor:
    """Each head's attention weight from i to i - 1, averaged over positions 1 to 2T and the
    batch: 1 for a previous-token head.

    Args:
        model: a decoder-only model.
        ids: (B, 1 + 2T) from `repeated_random_tokens`.

    Returns:
        (L, H) float32, NaN for heads a pruned layer no longer has.

    Raises:
        ValueError: as `induction_scores`.
    """
    _repeat_length(ids)
    rows = []
    for weights in attention_weights(model, ids):
        rows.append(weights.diagonal(offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2)))  # (H,)
    return _grid(rows)


def _zero_heads(heads: Sequence[int]):
    """A hook function that zeroes the given heads of a `hook_z` activation (B, H, T, Dv)."""

    def zero(z: Tensor, _name: str) -> Tensor:
        z = z.clone()
        z[:, list(heads)] = 0.0
        return z

    return zero


def repeat_losses(
    model: nn.Module,
    ids: Tensor,
    ablate: Iterable[tuple[int, int]] = (),
    reference: Tensor | None = None,
) -> tuple[float, float]:
    """The mean next-token loss on the first repeat and on the repeated half, in nats.

    On bos, T random tokens, the same T again (`repeated_random_tokens`), the first
    repeat's tokens (positions 1 to T) can only be guessed; in the repeated half,
    tokens T + 2 to 2T follow a token that occurred before, so an induction head can
    copy them (token T + 1 follows the last token of the first repeat, which occurred
    only there, and is left out). A model with induction heads has a much lower loss
    on the repeated half; ablating them takes that gain away.

    Args:
        model: a decoder-only model (run in eval mode without gradients; its mode
            is restored after).
        ids: (B, 1 + 2T) from `repeated_random_tokens`.
        ablate: (layer, head) pairs whose output before W^O (`hook_z`) is set to
            zero at every position (zero ablation), or with `reference` replaced by
            its mean over the reference rows, position by position (mean ablation,
            `aiayn.analysis.patching.mean_ablation`).
        reference: (B_ref, 1 + 2T) ids as long as `ids` (other rows of
            `repeated_random_tokens`), for mean ablation; None: zero ablation.

    Returns:
        (first-repeat loss, repeated-half loss), each averaged over its tokens and rows.

    Raises:
        ValueError: as `induction_scores`, a layer or head out of range, or a
            reference of another length.
    """
    length = _repeat_length(ids)
    model = _decoder_only(model)
    by_layer: dict[int, list[int]] = {}
    for layer, head in ablate:
        if not 0 <= layer < len(model.decoder.layers):
            raise ValueError(
                f"layer {layer} out of range: the model has {len(model.decoder.layers)}"
            )
        n_heads = model.decoder.layers[layer].self_attn.n_heads
        if not 0 <= head < n_heads:
            raise ValueError(f"head {head} out of range: layer {layer} has {n_heads}")
        by_layer.setdefault(layer, []).append(head)
    if reference is not None and (reference.dim() != 2 or reference.size(1) != ids.size(1)):
        raise ValueError(
            f"the reference for mean ablation must be (B, {ids.size(1)}) ids like the "
            f"sequences scored (the mean is per position); got shape {tuple(reference.shape)}"
        )
    functions = {}
    for layer, heads in by_layer.items():
        name = f"decoder.layers.{layer}.self_attn.hook_z"
        if reference is None:
            functions[name] = _zero_heads(heads)
        else:  # each head's mean from the reference run with nothing ablated
            functions[name] = mean_ablation(model, [reference], name, heads)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), hooks(model, functions):
            logits = model(ids)  # (B, 1 + 2T, V)
    finally:
        model.train(was_training)
    # column j predicts id j + 1
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")
    first = nll[:, :length]  # (B, T): ids 1 .. T
    repeated = nll[:, length + 1 :]  # (B, T - 1): ids T + 2 .. 2T
    return first.mean().item(), repeated.mean().item()


def eigenvalue_copying(matrix: Tensor) -> float:
    """sum(eigenvalues) / sum(|eigenvalues|) of a square matrix: Elhage et al.'s copying
    statistic (see `copying_scores`); NaN for a matrix whose eigenvalues are all 0."""
    eigenvalues = torch.linalg.eigvals(matrix.double())
    total = eigenvalues.abs().sum().item()
    # eigenvalues of a real matrix come in conjugate pairs: their sum is real (the trace)
    return eigenvalues.real.sum().item() / total if total > 0 else math.nan


def ov_factors(model: nn.Module, layer: int, head: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The four factors of a head's OV circuit, in row-vector form.

    Returns:
        W_E (V, D) token embedding, W_V (D, Dv) the head's value projection,
        W_O (Dv, D) its rows of the output projection, W_U (D, V) the unembedding.
        The full circuit is `W_E @ W_V @ W_O @ W_U`: row t is what attending to token t
        adds to each token's logit.
    """
    model = _decoder_only(model)
    attention: MultiHeadAttention = model.decoder.layers[layer].self_attn
    kv_of_head = attention.kv_of_head or regular_groups(attention.n_heads, attention.n_kv_heads)
    d_v, kv = attention.d_v, kv_of_head[head]
    w_v = attention.v_proj.weight[kv * d_v : (kv + 1) * d_v].T  # (D, Dv)
    w_o = attention.out_proj.weight[:, head * d_v : (head + 1) * d_v].T  # (Dv, D)
    w_e = model.decoder.embedding.tokens.weight  # (V, D)
    return w_e, w_v, w_o, model.output_weight().T


def qk_factors(model: nn.Module, layer: int, head: int) -> tuple[Tensor, Tensor]:
    """A head's query and key projections, in row-vector form: W_Q (D, Dk), W_K (D, Dk).

    The attention score of a query row x_q and a key row x_k, before the 1/sqrt(d_k)
    scale and biases, is x_q W_Q W_K^T x_k^T: the QK circuit W_Q W_K^T (D, D).
    """
    model = _decoder_only(model)
    attention: MultiHeadAttention = model.decoder.layers[layer].self_attn
    kv_of_head = attention.kv_of_head or regular_groups(attention.n_heads, attention.n_kv_heads)
    d_k, kv = attention.d_k, kv_of_head[head]
    w_q = attention.q_proj.weight[head * d_k : (head + 1) * d_k].T  # (D, Dk)
    w_k = attention.k_proj.weight[kv * d_k : (kv + 1) * d_k].T  # (D, Dk)
    return w_q, w_k


@dataclass(frozen=True)
class Composition:
    """Elhage et al.'s composition scores between the heads of an earlier and a later layer.

    Each grid is (H of the earlier layer, H of the later layer): entry [i, j] says how
    much head j of the later layer reads what head i of the earlier layer writes,
    through its queries (q), its keys (k) or its values (v). An induction head reads
    its previous-token head through its keys: K-composition.
    """

    q: Tensor
    k: Tensor
    v: Tensor


def _frobenius_ratio(left: Tensor, right: Tensor) -> float:
    """||left @ right||_F / (||left||_F ||right||_F), in [0, 1]; NaN if either is zero."""
    denominator = torch.linalg.matrix_norm(left) * torch.linalg.matrix_norm(right)
    if denominator == 0:
        return math.nan
    return (torch.linalg.matrix_norm(left @ right) / denominator).item()


def composition_scores(model: nn.Module, earlier: int = 0, later: int = 1) -> Composition:
    """The Q-, K- and V-composition scores of every pair of heads of two layers.

    Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits",
    "Two-Layer Attention-Only Transformers"): with A = W_V W_O (D, D) the OV circuit
    of a head of the earlier layer (what it writes, for what it reads), and
    B = W_Q W_K^T (D, D), C = W_V W_O the QK and OV circuits of a head of the later
    layer, all in row-vector form (x @ W), the scores are

        Q-composition  ||A B||_F   / (||A||_F ||B||_F)     queries read its output
        K-composition  ||B A^T||_F / (||A||_F ||B||_F)     keys read its output
        V-composition  ||A C||_F   / (||A||_F ||C||_F)     values read its output

    Each lies in [0, 1] (the Frobenius norm is submultiplicative). As the paper does,
    LayerNorm, biases and the 1/sqrt(d_k) scale are left out. Random matrices of size
    D score about 1/sqrt(D), not 0: compare a pair with the other pairs.

    Args:
        model: a decoder-only model.
        earlier, later: the two layers, earlier < later.

    Returns:
        The three (H_earlier, H_later) grids, float32 (computed in float64).

    Raises:
        ValueError: a model that is not decoder-only, or layers out of order or range.
    """
    model = _decoder_only(model)
    n_layers = len(model.decoder.layers)
    if not 0 <= earlier < later < n_layers:
        raise ValueError(
            f"need 0 <= earlier < later < {n_layers} (the model's layers), "
            f"got earlier={earlier}, later={later}"
        )

    def ov(layer: int, head: int) -> Tensor:
        _, w_v, w_o, _ = ov_factors(model, layer, head)
        return w_v.double() @ w_o.double()  # (D, D)

    def qk(layer: int, head: int) -> Tensor:
        w_q, w_k = qk_factors(model, layer, head)
        return w_q.double() @ w_k.double().T  # (D, D)

    sources = range(model.decoder.layers[earlier].self_attn.n_heads)
    targets = range(model.decoder.layers[later].self_attn.n_heads)
    grids = {name: torch.zeros(len(sources), len(targets)) for name in ("q", "k", "v")}
    with torch.no_grad():
        for i in sources:
            a = ov(earlier, i)
            for j in targets:
                b, c = qk(later, j), ov(later, j)
                grids["q"][i, j] = _frobenius_ratio(a, b)
                grids["k"][i, j] = _frobenius_ratio(b, a.T)
                grids["v"][i, j] = _frobenius_ratio(a, c)
    return Composition(**grids)


def copying_scores(model: nn.Module) -> Tensor:
    """The copying score of every head, from its OV circuit (weights only).

    Olsson et al. 2022 take copying from Elhage et al. 2021 ("A Mathematical Framework
    for Transformer Circuits", "One-Layer Attention-Only Transformers", "Detecting
    copying behaviour"): a head copies when its OV circuit W_U W_O^h W_V^h W_E (V x V,
    token attended to -> logits) has positive eigenvalues, summarised as

        score = sum_i lambda_i / sum_i |lambda_i|

    over the eigenvalues lambda_i (complex ones come in conjugate pairs, so the sum is
    real). It is 1 when every eigenvalue is positive (the identity copies each token),
    -1 when every one is negative (-I: the head suppresses the token it reads), near 0
    for a random matrix.

    As they do, the circuit leaves out LayerNorm, biases and positions (and a constant
    embedding scale, which does not change the score). The V x V matrix is not formed:
    W_E W_V W_O W_U and its cyclic permutation W_O W_U W_E W_V (Dv x Dv) have the same
    nonzero eigenvalues, and zero eigenvalues add nothing to either sum, so the score
    is computed on the small one (in float64).

    Args:
        model: a decoder-only model.

    Returns:
        (L, H) float32, NaN for heads a pruned layer no longer has (or whose circuit
        is zero).

    Raises:
        ValueError: a model that is not decoder-only.
    """
    model = _decoder_only(model)
    rows = []
    with torch.no_grad():
        for layer, block in enumerate(model.decoder.layers):
            scores = []
            for head in range(block.self_attn.n_heads):
                w_e, w_v, w_o, w_u = (w.double() for w in ov_factors(model, layer, head))
                scores.append(eigenvalue_copying(w_o @ w_u @ w_e @ w_v))  # (Dv, Dv)
            rows.append(torch.tensor(scores))
    return _grid(rows)


@dataclass(frozen=True)
class InductionScores:
    """The three (L, H) grids: prefix matching, previous token, copying."""

    induction: Tensor
    previous_token: Tensor
    copying: Tensor

    def grids(self) -> dict[str, Tensor]:
        """Score name (a key of `PNG_FILES`) -> its grid."""
        return {
            "induction": self.induction,
            "previous_token": self.previous_token,
            "copying": self.copying,
        }

    def top_heads(self, n: int = 5) -> list[tuple[int, int]]:
        """The (layer, head) pairs of the `n` highest prefix-matching scores, highest first."""
        flat = self.induction.nan_to_num(-math.inf).flatten()
        order = flat.argsort(descending=True)[: min(n, int(flat.isfinite().sum()))]
        n_heads = self.induction.size(1)
        return [(int(i) // n_heads, int(i) % n_heads) for i in order]


def score_model(model: nn.Module, ids: Tensor) -> InductionScores:
    """All three scores of `model` on `ids` (`repeated_random_tokens`)."""
    return InductionScores(
        induction_scores(model, ids), previous_token_scores(model, ids), copying_scores(model)
    )


_TITLES = {
    "induction": "prefix matching: attention from i to i - T + 1 on a repeat",
    "previous_token": "previous token: attention from i to i - 1",
    "copying": "copying: sum(eigenvalues) / sum(|eigenvalues|) of the OV circuit",
}


def write_induction(scores: InductionScores, out_dir: str | Path, **context: Any) -> list[Path]:
    """induction.json (`context` first, then the three grids, layer x head, NaN as null)
    and a layers x heads heat map of each score (`PNG_FILES`) in `out_dir`.

    Returns:
        The paths: PNGs first, the JSON last.
    """
    out = Path(out_dir)
    paths = []
    for name, grid in scores.grids().items():
        fig = plot_head_metric(grid_to_json(grid), _TITLES[name])
        paths.append(write_png(fig, out / PNG_FILES[name]))
    data = {**context, **{name: grid_to_json(grid) for name, grid in scores.grids().items()}}
    text = strict_json(data)
    return [*paths, write_atomic(out / JSON_FILE, text)]
