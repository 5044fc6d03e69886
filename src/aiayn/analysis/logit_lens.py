"""The logit lens (nostalgebraist 2020): what each layer would predict if it were the last.

    result = logit_lens(model, (src, tgt_in))       # an encoder-decoder
    result = logit_lens(gpt, (ids,), target=next_ids)  # a decoder-only model
    result = prompt_lens(gpt, prompt_ids, continuation_ids)  # follows the text's next tokens
    plot_logit_lens(result, tokenizer, "lens/lens.png")

Shape legend: L layers, B batch, T positions of the stack that predicts, D d_model,
V vocabulary, k top tokens.

The residual stream of the stack that makes the logits (the decoder of an
encoder-decoder, the only stack of a decoder-only model) is read at its hook points
(`aiayn.nn.hooks`): after the embedding (layer 0's `hook_resid_pre`, "embed") and
after each layer (`hook_resid_post`, "layer 0" ... "layer L-1"). Each reading is then
mapped to next-token scores exactly as the model maps its last layer: the stack's
`final_norm` (a LayerNorm in a pre-norm model, the identity in a post-norm one, whose
layers end normalised), then the model's own pre-softmax projection (`project`: the
tied or untied output matrix and its bias). So the last row is the model's own
distribution, and the rows below it say how early that prediction takes shape.

An encoder-only model (BERT) is refused: it scores masked positions, not the next
token, and its output head (a dense layer and a LayerNorm) is not a projection of
the residual stream alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from torch import Tensor

from aiayn.analysis.viz import Translating, write_png
from aiayn.data.files import strict_json, write_atomic
from aiayn.data.tokenizer import Tokenizer
from aiayn.inference.search import DecodeConfig, search
from aiayn.models.encoder_decoder import Decoder, PreSoftmaxProjection, Transformer
from aiayn.nn.hooks import run_with_cache

EMBED = "embed"
JSON_FILE = "lens.json"
PNG_FILE = "lens.png"


@dataclass(frozen=True)
class LensResult:
    """Per layer (the embedding first) and position: the lens's top tokens and more.

    Attributes:
        layers: (L + 1) labels, "embed", "layer 0", ... "layer L-1".
        points: the hook point read for each label.
        tokens: (B, T) the ids the predicting stack read (tgt_in, or the ids).
        top_ids: (L + 1, B, T, k) the k likeliest next tokens, likeliest first.
        top_probs: (L + 1, B, T, k) their probabilities.
        predicted: (B, T) the token the model itself predicts (its logits' argmax).
        predicted_probs: (L + 1, B, T) that token's probability at each layer.
        predicted_ranks: (L + 1, B, T) its rank there (0: the likeliest).
        target: (B, T) a token followed at each position, or None.
        target_probs, target_ranks: as for `predicted`, or None without a target.
    """

    layers: tuple[str, ...]
    points: tuple[str, ...]
    tokens: Tensor
    top_ids: Tensor
    top_probs: Tensor
    predicted: Tensor
    predicted_probs: Tensor
    predicted_ranks: Tensor
    target: Tensor | None = None
    target_probs: Tensor | None = None
    target_ranks: Tensor | None = None

    def to_dict(self, tokenizer: Tokenizer, row: int = 0, **context: Any) -> dict[str, Any]:
        """lens.json's content for batch row `row`; `context` (run, text...) goes first.

        `layers` holds, per layer and position, the top tokens with their
        probabilities and the probability and rank of the predicted (and target) token.
        """

        def piece(token_id: int) -> str:
            return tokenizer.id_to_piece(int(token_id))

        tokens = self.tokens[row].tolist()
        predicted = self.predicted[row].tolist()
        target = None if self.target is None else self.target[row].tolist()
        positions = [
            {
                "input": piece(token),
                "input_id": token,
                "predicted": piece(predicted[t]),
                "predicted_id": predicted[t],
                **({} if target is None else {"target": piece(target[t]), "target_id": target[t]}),
            }
            for t, token in enumerate(tokens)
        ]
        layers = []
        for i, label in enumerate(self.layers):
            cells = []
            for t in range(len(tokens)):
                ids, probs = self.top_ids[i, row, t].tolist(), self.top_probs[i, row, t].tolist()
                cell = {
                    "top": [
                        {"piece": piece(j), "id": j, "prob": p}
                        for j, p in zip(ids, probs, strict=True)
                    ],
                    "predicted_prob": self.predicted_probs[i, row, t].item(),
                    "predicted_rank": int(self.predicted_ranks[i, row, t]),
                }
                if self.target_probs is not None and self.target_ranks is not None:
                    cell["target_prob"] = self.target_probs[i, row, t].item()
                    cell["target_rank"] = int(self.target_ranks[i, row, t])
                cells.append(cell)
            layers.append({"layer": label, "hook": self.points[i], "positions": cells})
        return {**context, "positions": positions, "layers": layers}


def _predicting_stack(model: torch.nn.Module, inputs: Sequence[Tensor]) -> Decoder:
    """The decoder whose residual stream the lens reads; refuses other shapes by name."""
    decoder = getattr(model, "decoder", None)
    shape = getattr(getattr(model, "cfg", None), "architecture", type(model).__name__)
    if not isinstance(model, PreSoftmaxProjection) or not isinstance(decoder, Decoder):
        raise ValueError(
            f"the logit lens reads a stack that predicts the next token; a {shape} model "
            "has none (an encoder_only model scores masked tokens): use an "
            "encoder_decoder or decoder_only model"
        )
    wanted = 2 if isinstance(model, Transformer) else 1
    if len(inputs) != wanted:
        names = "(src, tgt_in)" if wanted == 2 else "(ids,)"
        raise ValueError(
            f"a {shape} model's logit lens takes inputs {names}; got {len(inputs)} tensors"
        )
    return decoder


def residual_stream(
    model: torch.nn.Module, inputs: Sequence[Tensor]
) -> tuple[Tensor, tuple[str, ...], Tensor]:
    """The predicting stack's residual stream after the embedding and after each layer.

    Args:
        model: an encoder-decoder or decoder-only model (eval mode for a fixed answer).
        inputs: (src, tgt_in) for an encoder-decoder, (ids,) for a decoder-only model.

    Returns:
        The model's logits (B, T, V), the hook point of each reading, and the
        readings (L + 1, B, T, D), embedding first.

    Raises:
        ValueError: an encoder-only (or other) model without a predicting decoder, or
            the wrong number of inputs for the model's shape.
    """
    decoder = _predicting_stack(model, inputs)
    resid_post = (f"decoder.layers.{i}.hook_resid_post" for i in range(len(decoder.layers)))
    points = ("decoder.layers.0.hook_resid_pre", *resid_post)
    with torch.no_grad():
        logits, cache = run_with_cache(model, *inputs, names=points)
    return logits, points, torch.stack([cache[point] for point in points])


def lens_logits(model: torch.nn.Module, residual: Tensor) -> Tensor:
    """Next-token scores of residual-stream states, as the model scores its last layer's.

    Args:
        model: the model the states come from.
        residual: (..., D) states of its predicting stack.

    Returns:
        (..., V) logits: `model.project(final_norm(residual))`.
    """
    with torch.no_grad():
        return model.project(model.decoder.final_norm(residual))


def _rank(probs: Tensor, token: Tensor) -> tuple[Tensor, Tensor]:
    """The probability of `token` (B, T) in `probs` (B, T, V), and how many beat it."""
    chosen = probs.gather(-1, token.unsqueeze(-1))  # (B, T, 1)
    return chosen.squeeze(-1), (probs > chosen).sum(-1)


def logit_lens(
    model: torch.nn.Module,
    inputs: Sequence[Tensor],
    top_k: int = 5,
    target: Tensor | None = None,
) -> LensResult:
    """The logit lens of every layer of the stack that predicts the next token.

    Args:
        model: an encoder-decoder (`Transformer`) or decoder-only (`DecoderOnly`)
            model; put it in eval mode, or dropout changes every reading.
        inputs: (src, tgt_in) for an encoder-decoder, (ids,) for a decoder-only model.
        top_k: how many of the likeliest tokens to keep per layer and position.
        target: (B, T) a token to follow at each position (say, the next input
            token), or None.

    Returns:
        A `LensResult`; probabilities are float32 whatever the model's dtype.

    Raises:
        ValueError: an encoder-only model (named by its shape), the wrong number of
            inputs, `top_k` outside 1 to V, or a target of another shape or with an
            id outside the vocabulary.
    """
    logits, points, residual = residual_stream(model, inputs)
    vocab = logits.size(-1)
    if not 1 <= top_k <= vocab:
        raise ValueError(f"top_k must be between 1 and the vocabulary size {vocab}, got {top_k}")
    tokens = inputs[-1]
    if target is not None:
        if target.shape != tokens.shape:
            raise ValueError(
                f"target has shape {tuple(target.shape)}; it needs one token per "
                f"position, {tuple(tokens.shape)}"
            )
        if target.numel() and not 0 <= int(target.min()) <= int(target.max()) < vocab:
            raise ValueError(f"target ids must be in 0..{vocab - 1}")
    predicted = logits.argmax(-1)  # (B, T)
    top_ids, top_probs, predicted_probs, predicted_ranks = [], [], [], []
    target_probs, target_ranks = [], []
    for reading in residual:  # one layer at a time: (B, T, V) is the largest tensor
        probs = lens_logits(model, reading).float().softmax(-1)
        best = probs.topk(top_k, dim=-1)
        top_ids.append(best.indices)
        top_probs.append(best.values)
        prob, rank = _rank(probs, predicted)
        predicted_probs.append(prob)
        predicted_ranks.append(rank)
        if target is not None:
            prob, rank = _rank(probs, target)
            target_probs.append(prob)
            target_ranks.append(rank)
    n_layers = len(points) - 1
    return LensResult(
        layers=(EMBED, *(f"layer {i}" for i in range(n_layers))),
        points=points,
        tokens=tokens,
        top_ids=torch.stack(top_ids),
        top_probs=torch.stack(top_probs),
        predicted=predicted,
        predicted_probs=torch.stack(predicted_probs),
        predicted_ranks=torch.stack(predicted_ranks),
        target=target,
        target_probs=torch.stack(target_probs) if target is not None else None,
        target_ranks=torch.stack(target_ranks) if target is not None else None,
    )


def translation_lens(
    translator: Translating, sentence: str, target: str | None = None, top_k: int = 5
) -> LensResult:
    """The decoder's logit lens for one sentence and a target prefix.

    The target is `target`'s subword ids, or the model's own greedy translation
    without one; the decoder reads bos + target, and each position follows the
    next target token (eos after the last). The search never picks pad or bos, so
    where the model's own likeliest token is one of those, the greedy target differs
    from `LensResult.predicted` (the plain argmax of the logits).

    Raises:
        ValueError: an empty sentence, or a target longer than the model's max_len.
    """
    if not sentence.strip():
        raise ValueError("the logit lens needs a sentence; it is empty")
    cfg = translator.model.cfg
    src = translator.to_batch(translator.encode([sentence]))  # (1, S)
    if target is None:
        (best, *_), *_ = search(translator.engine, src, DecodeConfig(beam=1))
        ids = list(best.tokens)
    else:
        ids = translator.tokenizer.encode(target)
        if len(ids) + 1 > cfg.max_len:
            raise ValueError(
                f"--target has {len(ids)} tokens; the decoder reads at most "
                f"{cfg.max_len - 1} after bos (max_len {cfg.max_len})"
            )
    tgt_in = torch.tensor([[cfg.bos_id, *ids]], device=src.device)  # (1, T)
    tgt_out = torch.tensor([[*ids, cfg.eos_id]], device=src.device)
    return logit_lens(translator.model, (src, tgt_in), top_k, target=tgt_out)


def prompt_lens(
    model: torch.nn.Module,
    prompt: Sequence[int],
    continuation: Sequence[int] | None = None,
    top_k: int = 5,
) -> LensResult:
    """A decoder-only model's logit lens over a prompt, or over a prompt and its continuation.

    Without a continuation the model reads the prompt and no target is followed. With
    one, the text is prompt + continuation: the model reads all of it but its last
    token, and each position follows the text's next token.

    Raises:
        ValueError: an empty continuation, or a text longer than the model's max_len.
    """
    device = next(model.parameters()).device
    if continuation is None:
        return logit_lens(model, (torch.tensor([list(prompt)], device=device),), top_k)
    if not continuation:
        raise ValueError("--target is empty: give the continuation whose tokens to follow")
    text = [*prompt, *continuation]
    if len(text) - 1 > model.cfg.max_len:
        raise ValueError(
            f"the prompt and --target have {len(text)} tokens; the model reads all but "
            f"the last, at most {model.cfg.max_len} (max_len): shorten them"
        )
    ids = torch.tensor([text], device=device)  # (1, T + 1)
    return logit_lens(model, (ids[:, :-1],), top_k, target=ids[:, 1:])


def _short(piece: str, width: int) -> str:
    return piece if len(piece) <= width else piece[: width - 1] + "…"


def plot_logit_lens(
    result: LensResult, tokenizer: Tokenizer, path: str | Path, row: int = 0
) -> Path:
    """A layers x positions grid: the top-1 token in each cell, its probability as colour.

    The embedding is the bottom row and the last layer the top one; the columns are
    labelled with the input tokens below, and with the target (or, without one, the
    model's own prediction) above.

    Args:
        result: from `logit_lens`.
        tokenizer: for the pieces.
        path: the PNG to write (atomically).
        row: which batch row to draw.

    Returns:
        The PNG's path.
    """
    probs = result.top_probs[:, row, :, 0].cpu().numpy()  # (L + 1, T)
    ids = result.top_ids[:, row, :, 0].tolist()
    n_layers, n_pos = probs.shape
    fig = Figure(
        figsize=(min(1.0 * n_pos + 2.0, 40.0), 0.45 * n_layers + 2.0), layout="constrained"
    )
    ax = fig.subplots()
    image = ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=1.0, origin="lower", aspect="auto")
    for layer in range(n_layers):
        for t in range(n_pos):
            colour = "black" if probs[layer, t] > 0.6 else "white"
            text = _short(tokenizer.id_to_piece(ids[layer][t]), 8)
            ax.text(t, layer, text, ha="center", va="center", fontsize=7, color=colour)
    ax.set_yticks(range(n_layers), list(result.layers), fontsize=8)
    inputs = [_short(tokenizer.id_to_piece(i), 10) for i in result.tokens[row].tolist()]
    ax.set_xticks(range(n_pos), inputs, rotation=90, fontsize=7)
    ax.set_xlabel("input token")
    above = result.predicted if result.target is None else result.target
    top = ax.secondary_xaxis("top")
    top.set_xticks(
        range(n_pos), [_short(tokenizer.id_to_piece(i), 10) for i in above[row].tolist()]
    )
    top.tick_params(labelsize=7, labelrotation=90)
    top.set_xlabel("predicted token" if result.target is None else "target token")
    fig.colorbar(image, ax=ax, label="probability of the top-1 token")
    fig.suptitle(
        "logit lens: each layer's residual stream through the final norm and output matrix"
    )
    return write_png(fig, path)


def lens_table(result: LensResult, tokenizer: Tokenizer, row: int = 0, width: int = 10) -> str:
    """A plain-text table of top-1 pieces: the input pieces, then each layer, last first.

    Pieces are cut to `width` characters; each column is as wide as its widest piece.
    """
    header = ["", *(tokenizer.id_to_piece(i) for i in result.tokens[row].tolist())]
    rows = [header]
    for i in reversed(range(len(result.layers))):
        ids = result.top_ids[i, row, :, 0].tolist()
        rows.append([result.layers[i], *(tokenizer.id_to_piece(j) for j in ids)])
    cells = [[r[0], *(_short(c, width) for c in r[1:])] for r in rows]
    widths = [max(len(r[col]) for r in cells) for col in range(len(header))]
    lines = [" ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines) + "\n"


def write_logit_lens(
    result: LensResult, tokenizer: Tokenizer, out_dir: str | Path, **context: Any
) -> list[Path]:
    """lens.json (`LensResult.to_dict` with `context`) and lens.png in `out_dir`, batch row 0.

    Returns:
        The two paths written.
    """
    out = Path(out_dir)
    text = strict_json(result.to_dict(tokenizer, **context), ensure_ascii=False)
    png = plot_logit_lens(result, tokenizer, out / PNG_FILE)
    return [write_atomic(out / JSON_FILE, text), png]
