"""The attention explorer: every head of one translation, for the browser.

    payload = attention_payload(translator, "Ein Haus am See.", DecodeConfig(beam=4))
    # JSON-ready: tokens, translation, weights [layer][head][query][key], per-head metrics
    write_explorer_html(payload, "attention.html")   # one file, opens offline

The sentence is translated with `decode` and beam search's final hypothesis is
drawn: `aiayn.analysis.viz.hypothesis_attention` takes the weights of that pair from the
model's explicit attention path, the same maps as the PNG grids. Rows are queries,
columns keys; target rows are the decoder's inputs (bos first), each deciding the
next token.

Per head, the cheap metrics of `aiayn.analysis.heads` measured on this one sentence (every
query real): entropy (nats), confidence (mean largest weight), the share of
queries whose strongest key is the previous / same / next token (self-attention
only) and the dominant one of those, the weight on eos (encoder self-attention
and encoder-decoder attention, whose keys end with the source's eos) or on bos
(decoder self-attention, whose keys have no eos), and monotonicity for
encoder-decoder attention.

Two views from the analysis modules join them: with the run's heads.json (`aiayn
heads`, read by `aiayn.analysis.heads.read_head_records`), each head's numbers over
the corpus beside this sentence's; and the decoder's logit lens of the translation
(`lens_payload`, `aiayn.analysis.logit_lens`), top-1 piece per layer and position.

The page itself is `STATIC_DIR` (index.html, explorer.js, explorer.css): plain
JavaScript drawing on canvas, nothing fetched from elsewhere. `aiayn serve`
mounts it at `/` and answers its `POST /v1/translate`; `explorer_html` inlines it
with a payload for a page that needs no server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from aiayn.analysis.heads import KIND_TITLES, HeadKey, HeadSums
from aiayn.analysis.logit_lens import logit_lens
from aiayn.analysis.viz import AttentionKind, hypothesis_attention
from aiayn.apps.translate import Translator
from aiayn.data.files import write_atomic
from aiayn.inference.search import DecodeConfig, Hypothesis

STATIC_DIR = Path(__file__).parent / "static"
DIGITS = 3  # decimals kept of each weight: 1/1000 is finer than a colour step

OFFSET_NAMES = {"offset_-1": "previous", "offset_0": "same", "offset_+1": "next"}


def head_metrics(weights: Tensor, kind: AttentionKind, key_marks: dict[str, Tensor]) -> list[dict]:
    """The cheap metrics of each head of one layer, for one sentence.

    Args:
        weights: (1, H, T, S) attention weights, every query and key real.
        kind: which attention they are (offsets for self-attention, monotonicity
            for encoder-decoder attention, eos or bos by the keys).
        key_marks: "eos" or "bos" -> (1, S) bool of the keys whose weight is summed.

    Returns:
        Per head: entropy, confidence, offset_-1 / offset_0 / offset_+1 (None for
        encoder-decoder attention, and offset_+1 for decoder self-attention),
        dominant_offset ("previous", "same", "next" or None), eos, bos, monotonicity
        (None where they do not apply).
    """
    batch, n_heads, n_query, n_key = weights.shape
    sums = HeadSums(n_heads)
    query_real = torch.ones(batch, n_query, dtype=torch.bool, device=weights.device)
    key_real = torch.ones(batch, n_key, dtype=torch.bool, device=weights.device)
    sums.add_weights(weights, query_real, key_real, key_marks, kind)
    metrics = []
    for stats in sums.stats(kind, layer=0, tokens=1, baseline_nll=0.0):
        offsets = {key: stats.value(key) for key in OFFSET_NAMES}
        shares = {key: v for key, v in offsets.items() if v is not None}
        dominant = max(shares, key=shares.__getitem__) if shares else None
        metrics.append(
            {
                "entropy": stats.entropy,
                "confidence": stats.confidence,
                **offsets,
                "dominant_offset": OFFSET_NAMES[dominant] if dominant else None,
                "eos": stats.eos,
                "bos": stats.bos,
                "monotonicity": stats.monotonicity,
            }
        )
    return metrics


def _rounded(metrics: dict[str, Any]) -> dict[str, Any]:
    """The numbers to DIGITS decimals; None and names as they are."""
    return {k: round(v, DIGITS) if isinstance(v, float) else v for k, v in metrics.items()}


def lens_payload(translator: Translator, text: str, best: Hypothesis) -> dict[str, Any]:
    """The decoder's logit lens (`aiayn.analysis.logit_lens`) of one translation, top-1 only.

    The decoder reads bos + the hypothesis, as in the attention maps, and each
    position follows the hypothesis's next token (eos after the last).

    Returns:
        {"layers" ("embed", "layer 0", ...), "inputs" / "targets" (the pieces read and
        followed at each position), "top" [layer][position] (the lens's likeliest
        piece), "prob" [layer][position] (its probability), "target_prob"
        [layer][position] (the followed token's)}, probabilities rounded to DIGITS.
    """
    model, tokenizer = translator.model, translator.tokenizer
    cfg = model.cfg
    src = translator.to_batch(translator.encode([text]))  # (1, S)
    tgt_in = torch.tensor([[cfg.bos_id, *best.tokens]], device=src.device)  # (1, T)
    tgt_out = torch.tensor([[*best.tokens, cfg.eos_id]], device=src.device)
    result = logit_lens(model, (src, tgt_in), top_k=1, target=tgt_out)

    def pieces(ids: list[int]) -> list[str]:
        return [tokenizer.id_to_piece(i) for i in ids]

    def rounded(probs: Tensor) -> list[list[float]]:  # (L + 1, T)
        return probs.double().cpu().numpy().round(DIGITS).tolist()

    assert result.target_probs is not None  # a target was given
    return {
        "layers": list(result.layers),
        "inputs": pieces(tgt_in[0].tolist()),
        "targets": pieces(tgt_out[0].tolist()),
        "top": [pieces(layer) for layer in result.top_ids[:, 0, :, 0].tolist()],
        "prob": rounded(result.top_probs[:, 0, :, 0]),
        "target_prob": rounded(result.target_probs[:, 0]),
    }


def attention_payload(
    translator: Translator,
    text: str,
    decode: DecodeConfig,
    best: Hypothesis | None = None,
    corpus: Mapping[HeadKey, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Everything the explorer draws for one sentence, as JSON-ready Python values.

    Args:
        translator: the model and its subword model.
        text: the source sentence (not blank).
        decode: how to translate it; its best hypothesis is the one drawn.
        best: that hypothesis, when a search already found it (the server's batch);
            otherwise it is searched for here.
        corpus: the run's heads.json records (`aiayn.analysis.heads.read_head_records`),
            shown beside this sentence's metrics; None without the file.

    Returns:
        {"source", "translation", "source_tokens" (pieces, eos last),
        "target_tokens" (decoder inputs: bos, then the translation's pieces),
        "decode": {"beam", "alpha"}, "model": {"encoder_layers", "decoder_layers",
        "heads"}, "attention": {"encoder" | "decoder" | "cross":
        {"title", "queries" / "keys" ("source" or "target": which tokens label
        them), "weights" [layer][head][query][key] rounded to DIGITS decimals,
        "metrics" [layer][head] (see `head_metrics`), and with `corpus`, "corpus"
        [layer][head]: that head's heads.json record or None}}, "lens" (see
        `lens_payload`)}.

    Raises:
        ValueError: on a blank sentence.
    """
    maps, src_pieces, tgt_pieces, best = hypothesis_attention(translator, text, decode, best)
    device = maps.encoder[0].device
    eos_keys = torch.arange(len(src_pieces), device=device)[None] == len(src_pieces) - 1  # (1, S)
    bos_keys = torch.arange(len(tgt_pieces), device=device)[None] == 0  # (1, T)
    uses = {
        AttentionKind.ENCODER: (maps.encoder, "source", "source", {"eos": eos_keys}),
        AttentionKind.DECODER: (maps.decoder, "target", "target", {"bos": bos_keys}),
        AttentionKind.CROSS: (maps.cross, "target", "source", {"eos": eos_keys}),
    }
    attention = {}
    for kind, (layers, queries, keys, marks) in uses.items():
        metrics = [head_metrics(w.float(), kind, marks) for w in layers]
        attention[kind.value] = {
            "title": KIND_TITLES[kind],
            "queries": queries,
            "keys": keys,
            "weights": [w[0].double().cpu().numpy().round(DIGITS).tolist() for w in layers],
            "metrics": [[_rounded(head) for head in layer] for layer in metrics],
        }
        if corpus is not None:
            attention[kind.value]["corpus"] = [
                [corpus.get((kind, layer, head)) for head in range(len(heads))]
                for layer, heads in enumerate(metrics)
            ]
    return {
        "source": text,
        "translation": translator.tokenizer.decode(best.tokens),
        "source_tokens": src_pieces,
        "target_tokens": tgt_pieces,
        "decode": {"beam": decode.beam, "alpha": decode.alpha},
        "model": {
            "encoder_layers": len(maps.encoder),
            "decoder_layers": len(maps.decoder),
            "heads": maps.encoder[0].size(1),
        },
        "attention": attention,
        "lens": lens_payload(translator, text, best),
    }


# ----- the page, served or as one file ------------------------------------------------

_STYLESHEET_TAG = '<link rel="stylesheet" href="explorer.css">'
_SCRIPT_TAG = '<script src="explorer.js"></script>'
_DATA_TAG = '<script type="application/json" id="aiayn-data"></script>'


def _embedded_json(payload: dict[str, Any]) -> str:
    """JSON that cannot end its <script> element early: every "<" escaped (only strings hold one)."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")


def explorer_html(payload: dict[str, Any]) -> str:
    """The explorer as one self-contained page: CSS, JavaScript and `payload` inlined.

    The page finds the embedded payload and draws it without calling any API.
    """
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    css = (STATIC_DIR / "explorer.css").read_text(encoding="utf-8")
    script = (STATIC_DIR / "explorer.js").read_text(encoding="utf-8")
    for tag in (_STYLESHEET_TAG, _SCRIPT_TAG, _DATA_TAG):
        if page.count(tag) != 1:
            raise RuntimeError(f"{STATIC_DIR / 'index.html'} must hold {tag} exactly once")
    data = _DATA_TAG.replace("></script>", f">{_embedded_json(payload)}</script>")
    page = page.replace(_DATA_TAG, data)  # first: the JSON holds no tag the others match
    page = page.replace(_STYLESHEET_TAG, f"<style>\n{css}</style>")
    return page.replace(_SCRIPT_TAG, f"<script>\n{script}</script>")


def write_explorer_html(payload: dict[str, Any], path: str | Path) -> Path:
    """Write `explorer_html(payload)` to `path` atomically; return the path."""
    return write_atomic(path, explorer_html(payload))
