"""Fill [MASK]s with an encoder-only (BERT-style) model: the likeliest tokens, with probabilities.

    filler = MaskFiller.load("runs/bert")                 # or MaskFiller.from_hf("bert/")
    filler.fill("For God so [MASK] the world", top_k=3)
    # [[("loved", 0.61), ("blessed", 0.07), ("made", 0.03)]]   (one list per [MASK])

The text is read as BERT reads it: [CLS], the tokens, [SEP], one segment (with
the tokenizer's eos after the tokens where it has one apart from [SEP]: an aiayn
run's training blocks end each document with eos, `aiayn.data.lm`). Each
[MASK] is filled independently from one forward pass (as `transformers`'
fill-mask pipeline does): its candidates are the top-k of the softmax over the
vocabulary at its position, the other masks left as [MASK].
"""

from __future__ import annotations

import torch

from aiayn.apps.model_use import ENCODER_ONLY, ModelUser, check_shape, check_tokenizer_fits
from aiayn.data.lm import CLS, MASK, SEP, symbol_ids
from aiayn.data.tokenizer import Tokenizer
from aiayn.models import add_to_shape


class FillError(ValueError):
    """A query the model cannot fill (no [MASK], too long)."""


class MaskFiller(ModelUser):
    """An encoder-only model with an MLM head and its tokenizer, ready to fill masks.

    Args:
        model: an `aiayn.models.encoder_only.EncoderOnly`.
        tokenizer: its tokenizer, which must hold [CLS], [SEP] and [MASK].
        device: where to run.
        dtype: the model's floating-point type there.

    Raises:
        ValueError: the model is of another shape, or the tokenizer does not fit it.
    """

    SHAPE = ENCODER_ONLY
    HF_LOADER = "load_bert"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Tokenizer,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> None:
        cfg = model.cfg
        check_shape(cfg, ENCODER_ONLY, "the model")
        check_tokenizer_fits(tokenizer, cfg)
        ids = symbol_ids(tokenizer)  # found by piece; a ValueError names one missing
        self.cls_id, self.sep_id, self.mask_id = ids[CLS], ids[SEP], ids[MASK]
        eos = tokenizer.eos_id
        self.end = [] if eos is None or eos == self.sep_id else [eos]  # a document's end
        self.device = torch.device(device)
        self.model = model.to(self.device, dtype=dtype).eval()
        self.tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        """[CLS] + the text's ids, each "[MASK]" as the mask id (+ eos) + [SEP].

        The text between masks is tokenized on its own, so that a mask stands for a
        whole token, as in training (no word-boundary piece of its own before it).

        Raises:
            FillError: more tokens than the model's max_len.
        """
        parts = text.split(MASK)
        ids = [self.cls_id]
        for i, part in enumerate(parts):
            if i:
                ids.append(self.mask_id)
            ids += self.tokenizer.encode(part) if part.strip() else []
        ids += [*self.end, self.sep_id]
        max_len = self.model.cfg.max_len
        if len(ids) > max_len:
            raise FillError(
                f"the text has {len(ids)} tokens with [CLS] and [SEP], more than the model's "
                f"max_len={max_len}: shorten it around its {MASK}s"
            )
        return ids

    @torch.no_grad()
    def fill(self, text: str, top_k: int = 5) -> list[list[tuple[str, float]]]:
        """The `top_k` likeliest tokens for each [MASK] in `text`, with their probabilities.

        Returns:
            One list per [MASK], in text order, of (token text, probability), likeliest
            first.

        Raises:
            FillError: no [MASK], or a text too long.
            ValueError: top_k < 1.
        """
        return [
            [(self.tokenizer.decode([token]), prob) for token, prob in candidates]
            for candidates in self.fill_ids(text, top_k)
        ]

    @torch.no_grad()
    def fill_ids(self, text: str, top_k: int = 5) -> list[list[tuple[int, float]]]:
        """As `fill`, with token ids instead of their text."""
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if MASK not in text:
            raise FillError(f"the text has no {MASK} to fill: {text!r}")
        ids = torch.tensor([self.encode(text)], device=self.device)  # (1, T)
        logits = self.model(ids)[0]  # (T, V)
        at_masks = logits[ids[0] == self.mask_id].float()  # (M, V)
        probs, tokens = at_masks.softmax(dim=-1).topk(min(top_k, at_masks.size(-1)), dim=-1)
        return [
            list(zip(row_tokens, row_probs, strict=True))
            for row_tokens, row_probs in zip(tokens.tolist(), probs.tolist(), strict=True)
        ]


# the shape's user and verb, from the apps layer (aiayn.models.add_to_shape)
add_to_shape("encoder_only", user=MaskFiller, verb="fill")
