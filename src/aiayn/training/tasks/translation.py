"""Translation, the paper's task: source sentence in, target sentence out (sections 5, 6).

data:        (source, target) pairs -> ids -> token-budget batches of `Batch`
             (pairs that do not fit the model's max_len are left out and counted)
loss:        network(src, tgt_in) -> states -> projection and label-smoothed
             cross-entropy on tgt_out, fused (`aiayn.training.loss.network_loss`)
validation:  greedy-search sacreBLEU on the first `valid_bleu_sentences` pairs
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from torch import nn

from aiayn.config import ModelConfig, TrainConfig
from aiayn.data.batch import Batch
from aiayn.data.batching import TokenBatcher
from aiayn.training.loss import LossOutput, network_loss
from aiayn.training.tasks.base import Autocast, TaskData, register_task

if TYPE_CHECKING:
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.data.tokenizer import Tokenizer
    from aiayn.training.distributed import DistEnv

log = logging.getLogger(__name__)

Pairs = list[tuple[list[int], list[int]]]


@dataclass(frozen=True)
class BleuSet:
    """Validation sentences for BLEU during training.

    Attributes:
        sources: source ids (without specials), one list per sentence.
        references: reference translations, as text.
        detokenize: ids to text (the tokenizer's `decode`).
    """

    sources: list[list[int]]
    references: list[str]
    detokenize: Callable[[list[int]], str]


@register_task
class TranslationTask:
    """An encoder-decoder learns to translate (see `aiayn.training.tasks.base.Task`).

    Args:
        cfg: the model's config (its special ids and `max_len`).
        bleu: sentences for greedy BLEU at each validation, or None; `build_data`
            sets them from the recipe's `valid_bleu_sentences`.
    """

    name: ClassVar[str] = "translation"

    def __init__(self, cfg: ModelConfig, bleu: BleuSet | None = None) -> None:
        self.cfg, self.bleu = cfg, bleu

    def build_data(
        self, corpus: PreparedCorpus, tokenizer: Tokenizer, config: TrainConfig, env: DistEnv
    ) -> TaskData:
        """Token-budget batches of the corpus's train and valid pairs (and the BLEU set)."""
        cfg = self.cfg
        multiple = config.length_multiple
        # a padded side must fit both the batch and the positions: round the limit down
        limit = min(config.max_tokens, cfg.max_len) // multiple * multiple
        train_pairs = fitting_pairs(encode_pairs(tokenizer, corpus.read("train")), limit, "train")
        valid_text = corpus.read("valid")
        valid_pairs = fitting_pairs(encode_pairs(tokenizer, valid_text), limit, "valid")
        specials = (cfg.pad_id, cfg.bos_id, cfg.eos_id)
        train = TokenBatcher(
            train_pairs, config.max_tokens, *specials, seed=config.seed,
            rank=env.rank, world_size=env.world_size, length_multiple=multiple,
        )  # fmt: skip
        valid = None
        if valid_pairs:
            valid = TokenBatcher(
                valid_pairs, config.max_tokens, *specials, shuffle=False, length_multiple=multiple
            )
        if config.valid_bleu_sentences and valid_text:
            chosen = valid_text[: config.valid_bleu_sentences]
            sources = tokenizer.encode_batch([s for s, _ in chosen])
            keep = [i for i, s in enumerate(sources) if len(s) < cfg.max_len]
            self.bleu = BleuSet(
                [sources[i] for i in keep], [chosen[i][1] for i in keep], tokenizer.decode
            )
        log.info(
            "translation: %d training pairs (%d batches per epoch per process), %d validation",
            len(train_pairs), len(train), len(valid_pairs),
        )  # fmt: skip
        return TaskData(train=train, valid=valid)

    def loss(self, network: nn.Module, batch: Batch, label_smoothing: float) -> LossOutput:
        """Teacher forcing: the decoder reads bos + target and predicts target + eos (the
        projection to the vocabulary fused with the loss: `network_loss`)."""
        inputs = (batch.src, batch.tgt_in)
        return network_loss(network, inputs, batch.tgt_out, self.cfg.pad_id, label_smoothing)

    def target_tokens(self, batch: Batch) -> int:
        """Real tokens of `tgt_out`, eos included."""
        return batch.n_tgt_tokens

    def validation_metrics(self, model: nn.Module, autocast: Autocast) -> dict[str, float]:
        """{"bleu": greedy-search sacreBLEU on the BLEU set}, or {} without one."""
        if self.bleu is None or not self.bleu.sources:
            return {}
        return {"bleu": greedy_bleu(model, self.bleu, autocast)}


def greedy_bleu(
    model: nn.Module, data: BleuSet, autocast: Autocast, sentences_per_batch: int = 64
) -> float:
    """sacreBLEU of `model`'s greedy translations of `data.sources` (a `Decodable` model)."""
    from aiayn.inference.frozen import freeze
    from aiayn.inference.search import greedy_search
    from aiayn.training.evaluate import score

    cfg, device = model.cfg, next(model.parameters()).device
    engine = freeze(model)  # decoding runs the inference transform, as translation does
    hypotheses = []
    for start in range(0, len(data.sources), sentences_per_batch):
        chunk = data.sources[start : start + sentences_per_batch]
        src = Batch.from_pairs([(s, []) for s in chunk], cfg.pad_id, cfg.bos_id, cfg.eos_id).src
        with autocast():
            found = greedy_search(engine, src.to(device))
        hypotheses += [data.detokenize(h[0].tokens) for h in found]
    return score(hypotheses, data.references).bleu


def encode_pairs(tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]]) -> Pairs:
    """(source ids, target ids) per (source, target) text pair, without specials."""
    if not pairs:
        return []
    sources = tokenizer.encode_batch([s for s, _ in pairs])
    targets = tokenizer.encode_batch([t for _, t in pairs])
    return list(zip(sources, targets, strict=True))


def fitting_pairs(pairs: Pairs, limit: int, split: str) -> Pairs:
    """Pairs whose sides, with one special token, fit `limit`; the others are counted and logged."""
    kept = [p for p in pairs if len(p[0]) < limit and len(p[1]) < limit]
    if len(kept) < len(pairs):
        log.warning(
            "%s: %d pair(s) longer than %d tokens left out", split, len(pairs) - len(kept), limit
        )
    return kept
