"""Translation by a decoder-only model: source, separator and target in one sequence.

data:        (source, target) pairs -> source + [bos] + target + [eos], one sequence per
             pair (bos is the separator: a piece no text encodes to), in token-budget
             batches right-padded with pad (causal attention never reads a later pad)
loss:        network(sequence[:-1]) -> label-smoothed cross-entropy on the target and
             its eos only: the positions that predict the source or the separator carry
             the pad label
validation:  greedy-search sacreBLEU on the first `valid_bleu_sentences` valid pairs:
             the prompt is source + separator, the search continues after it
             (`SeparatedSource`, a `Decodable` over `DecoderOnlyDecoding`)

The same corpus as the encoder-decoder (`aiayn prepare bible`), so the two shapes can
be compared at the same parameter count and training time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig, TrainConfig
from aiayn.data.lm import SequenceBatches, TokenBatch, is_monolingual, padded
from aiayn.training.loss import LossOutput
from aiayn.training.tasks.base import Autocast, TaskData, register_task
from aiayn.training.tasks.lm import check_budget, token_loss
from aiayn.training.tasks.translation import BleuSet, encode_pairs

if TYPE_CHECKING:
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.inference.decoding import Decoding
    from aiayn.training.distributed import DistEnv

log = logging.getLogger(__name__)


def joined(source: Sequence[int], target: Sequence[int], separator: int, eos: int) -> list[int]:
    """source + [separator] + target + [eos]: one pair as one sequence."""
    return [*source, separator, *target, eos]


class SeparatedSource:
    """A `Decodable` that translates with a decoder-only model: the prompt of each
    source is source + separator, and the search's output is what follows it.

    Args:
        model: a `DecoderOnly` (anything `aiayn.inference.decoding.start` takes) in eval mode.
        separator: the separator's id (the task's: bos).
    """

    def __init__(self, model: nn.Module, separator: int) -> None:
        self.model, self.cfg, self.separator = model, model.cfg, separator

    def start(self, src: Tensor, beam: int = 1) -> Decoding:
        """Begin decoding (B, S) unpadded sources, `beam` rows each."""
        from aiayn.inference.decoding import start as start_decoding

        column = torch.full((src.size(0), 1), self.separator, dtype=src.dtype, device=src.device)
        return start_decoding(self.model, torch.cat([src, column], dim=1), beam)

    def max_output_len(self, source_len: int) -> int:
        """The longest output, eos included, that fits after a source of `source_len`."""
        return self.cfg.max_len - source_len  # prompt S + 1, then outputs: see DecoderOnlyDecoding


def greedy_bleu(
    model: nn.Module, data: BleuSet, separator: int, autocast: Autocast, batch_size: int = 64
) -> float:
    """sacreBLEU of `model`'s greedy continuations of source + separator.

    Prompts have no padding, so sources of one length are decoded together.
    """
    from aiayn.inference.search import greedy_search
    from aiayn.training.evaluate import score

    translator = SeparatedSource(model, separator)
    device = next(model.parameters()).device
    by_length: dict[int, list[int]] = {}
    for i, source in enumerate(data.sources):
        by_length.setdefault(len(source), []).append(i)
    hypotheses = [""] * len(data.sources)
    for length, indices in sorted(by_length.items()):
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            src = torch.tensor([data.sources[i] for i in chunk], device=device)
            with autocast():
                found = greedy_search(
                    translator, src, None, max_output_len=translator.max_output_len(length)
                )
            for i, hypothesis in zip(chunk, found, strict=True):
                hypotheses[i] = data.detokenize(hypothesis[0].tokens)
    return score(hypotheses, data.references).bleu


@register_task
class DecoderOnlyTranslationTask:
    """A decoder-only model learns to translate (see `aiayn.training.tasks.base.Task`).

    Args:
        cfg: the model's config: a pair's sequence (less its last id) must fit `max_len`.
    """

    name: ClassVar[str] = "lm_translation"

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg
        self.separator = cfg.bos_id
        self.bleu: BleuSet | None = None

    def build_data(
        self, corpus: PreparedCorpus, tokenizer: Tokenizer, config: TrainConfig, env: DistEnv
    ) -> TaskData:
        """Token-budget batches of the joined train and valid pairs (and the BLEU set)."""
        if is_monolingual(corpus):
            raise ValueError(
                f"{corpus.root} is a monolingual corpus; translation needs a parallel one "
                "(aiayn prepare bible, text, tsv or hf)"
            )
        cfg = self.cfg
        check_budget(config, cfg.max_len + 1, "sequence")
        splits: dict[str, SequenceBatches | None] = {}
        for split in ("train", "valid"):
            sequences = self.fitting(encode_pairs(tokenizer, corpus.read(split)), split)
            if not sequences:
                splits[split] = None
                continue
            shard = {"rank": env.rank, "world_size": env.world_size} if split == "train" else {}
            splits[split] = batches = SequenceBatches(
                sequences, self.make_batch, config.max_tokens, cfg.pad_id,
                seed=config.seed, shuffle=split == "train", **shard,
            )  # fmt: skip
            log.info(
                "%s %s: %d pairs as one sequence each, %d batches, padding %.1f%%",
                self.name, split, len(sequences), len(batches), 100 * batches.padding_fraction(),
            )  # fmt: skip
        if splits["train"] is None:
            raise ValueError(f"{corpus.root}: no training pair fits model.max_len={cfg.max_len}")
        valid_text = corpus.read("valid")
        if config.valid_bleu_sentences and valid_text:
            chosen = valid_text[: config.valid_bleu_sentences]
            sources = tokenizer.encode_batch([s for s, _ in chosen])
            # room after source + separator for a translation as long as the source
            keep = [i for i, s in enumerate(sources) if 0 < len(s) < cfg.max_len // 2]
            self.bleu = BleuSet(
                [sources[i] for i in keep], [chosen[i][1] for i in keep], tokenizer.decode
            )
        return TaskData(train=splits["train"], valid=splits["valid"])

    def fitting(self, pairs: list[tuple[list[int], list[int]]], split: str) -> list[list[int]]:
        """The joined pairs whose inputs fit `max_len`; the others are counted and logged."""
        cfg = self.cfg
        sequences = [joined(s, t, self.separator, cfg.eos_id) for s, t in pairs]
        kept = [s for s in sequences if len(s) - 1 <= cfg.max_len]
        if len(kept) < len(sequences):
            log.warning(
                "%s: %d pair(s) longer than max_len=%d together left out",
                split, len(sequences) - len(kept), cfg.max_len,
            )  # fmt: skip
        return kept

    def make_batch(
        self, sequences: Sequence[Sequence[int]], rng: np.random.Generator
    ) -> TokenBatch:
        """Inputs sequence[:-1]; labels sequence[1:] with the source's and the
        separator's positions set to pad (`rng` is not needed: nothing is drawn)."""
        pad = self.cfg.pad_id
        labels = []
        for sequence in sequences:
            source_len = list(sequence).index(self.separator)
            labels.append([pad] * source_len + list(sequence[source_len + 1 :]))
        inputs = padded([s[:-1] for s in sequences], pad)
        targets = padded(labels, pad)
        return TokenBatch(inputs, targets, int((targets != pad).sum()))

    def loss(self, network: nn.Module, batch: TokenBatch, label_smoothing: float) -> LossOutput:
        """The loss on the target's positions only."""
        return token_loss(network, batch, self.cfg.pad_id, label_smoothing)

    def target_tokens(self, batch: TokenBatch) -> int:
        """Target tokens, eos included."""
        return batch.n_targets

    def validation_metrics(self, model: nn.Module, autocast: Autocast) -> dict[str, float]:
        """{"bleu": greedy sacreBLEU on the BLEU set}, or {} without one."""
        if self.bleu is None or not self.bleu.sources:
            return {}
        return {"bleu": greedy_bleu(model, self.bleu, self.separator, autocast)}
