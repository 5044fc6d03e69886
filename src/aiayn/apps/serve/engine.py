"""What the inference thread does with a batch, and what the server says about its model.

The batcher (`aiayn.apps.serve.batcher`) knows nothing of models: it hands
`TranslationEngine.run_batch` a list of sentences that share one `Options`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from aiayn.apps.serve.batcher import Sentence
from aiayn.apps.translate import Translator
from aiayn.inference.engine import Engine
from aiayn.inference.search import DecodeConfig
from aiayn.inference.shortlist import Shortlisted
from aiayn.io.checkpoint import find_in_run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    """How a request's sentences are decoded; sentences batch together only when equal."""

    decode: DecodeConfig
    attention: bool = False


def attention_payload_function():
    """The explorer's `attention_payload`, or None while `aiayn.apps.explorer` is missing."""
    try:
        from aiayn.apps.explorer import attention_payload
    except ImportError as err:
        log.info("attention maps unavailable: %s", err)
        return None
    return attention_payload


def corpus_heads(source: Path) -> dict[Any, dict[str, Any]] | None:
    """The run's heads.json records (`aiayn heads`) for the explorer, or None.

    None without the file; with one that cannot be read, a warning names it and the
    explorer shows this sentence's numbers alone (the server still starts).
    """
    try:
        from aiayn.analysis.heads import HEADS_FILE, read_head_records
    except ImportError:  # the explorer's extras are missing: attention_payload_function says so
        return None
    path = (source if source.is_dir() else source.parent) / HEADS_FILE
    if not path.is_file():
        return None
    try:
        return read_head_records(path)
    except (OSError, ValueError) as err:
        log.warning("the explorer leaves out the heads' corpus numbers: %s", err)
        return None


class TranslationEngine:
    """A `Translator` behind the batcher: one batched search per batch.

    The batch is searched as the batcher made it: its sentences' ids (encoded once,
    when the request came) in its order, within its token budget.

    Args:
        translator: the model; used only from the inference thread once serving.
        threads: torch's intra-op threads, set by `start_thread` on that thread.
        corpus: the run's heads.json records (`corpus_heads`), shown in the explorer
            beside each head's numbers for the sentence; None without them.
    """

    def __init__(
        self, translator: Translator, threads: int, corpus: dict[Any, dict[str, Any]] | None = None
    ) -> None:
        self.translator, self.threads, self.corpus = translator, threads, corpus
        self.attention_payload = attention_payload_function()

    def start_thread(self) -> None:
        torch.set_num_threads(self.threads)

    def run_batch(self, options: Options, sentences: list[Sentence]) -> list[dict[str, Any]]:
        """{"translation": text} per sentence (and "attention": the explorer's payload)."""
        texts = [s.text for s in sentences]
        rows = [s.ids for s in sentences]
        nbest = self.translator.translate_ids(rows, options.decode, max_tokens=None)
        results = [{"translation": c[0].text if c else ""} for c in nbest]
        if options.attention:
            if self.attention_payload is None:
                raise RuntimeError(
                    "attention maps need aiayn.apps.explorer, which is not installed"
                )
            for text, result, candidates in zip(texts, results, nbest, strict=True):
                best = candidates[0].hypothesis if candidates else None  # drawn, not re-searched
                result["attention"] = self.attention_payload(
                    self.translator, text, options.decode, best, corpus=self.corpus
                )
        return results


class ContinuousEngine(TranslationEngine):
    """A `Translator` behind the `ContinuousBatcher`: a `Stepper` over the continuous-batching
    engine (`aiayn.inference.engine.Engine`).

    One `Engine` per decoding configuration, made when first asked for (its step is
    compiled then, with `compile`), of `sentences` x beam slots holding the model's
    `max_len` positions; one runs at a time, and another's sentences join once it has
    drained. Results are `run_batch`'s: the translation and, when asked, the explorer's
    attention maps of the hypothesis the engine found.

    Args:
        translator, threads, corpus: as for `TranslationEngine`.
        sentences: sentences decoded at once (>= 1).
        compile: compile each engine's step when it is made.

    Raises:
        ValueError: an output shortlist (the engine projects onto the whole vocabulary).
    """

    def __init__(
        self,
        translator: Translator,
        threads: int,
        corpus: dict[Any, dict[str, Any]] | None = None,
        sentences: int = 16,
        compile: bool = False,
    ) -> None:
        super().__init__(translator, threads, corpus)
        if isinstance(translator.engine, Shortlisted):
            raise ValueError(
                "continuous batching projects onto the whole vocabulary: it does not take "
                "an output shortlist"
            )
        self.sentences, self.compile = sentences, compile
        self._engines: dict[DecodeConfig, Engine] = {}
        self._running: DecodeConfig | None = None
        self._joined: dict[tuple[DecodeConfig, int], tuple[Options, Sentence]] = {}

    def _engine(self, config: DecodeConfig) -> Engine:
        if config not in self._engines:
            self._engines[config] = Engine(
                self.translator.engine, config, self.sentences, compile=self.compile
            )
        return self._engines[config]

    def room(self, options: Options) -> int:
        if self.busy and options.decode != self._running:
            return 0
        engine = self._engine(options.decode)
        return engine.free_groups - engine.queued

    def join(self, options: Options, sentence: Sentence) -> tuple[DecodeConfig, int]:
        if not any(t != self.translator.model.cfg.eos_id for t in sentence.ids):  # blank
            handle = (options.decode, -1 - len(self._joined))
            self._joined[handle] = (options, sentence)
            return handle
        self._running = options.decode
        handle = (options.decode, self._engine(options.decode).submit(sentence.ids))
        self._joined[handle] = (options, sentence)
        return handle

    def leave(self, handle: tuple[DecodeConfig, int]) -> None:
        config, request = handle
        if request >= 0:
            self._engine(config).cancel(request)
        self._joined.pop(handle, None)

    @property
    def busy(self) -> bool:
        return bool(self._joined)

    def advance(self) -> list[tuple[tuple[DecodeConfig, int], dict[str, Any]]]:
        finished = [handle for handle in self._joined if handle[1] < 0]  # blank: nothing to run
        found: dict[tuple[DecodeConfig, int], Any] = dict.fromkeys(finished)
        if self._running is not None:
            for done in self._engine(self._running).advance():
                found[(self._running, done.request)] = done.hypotheses
        out = []
        for handle, hypotheses in found.items():
            options, sentence = self._joined.pop(handle)
            best = hypotheses[0] if hypotheses else None
            text = self.translator.tokenizer.decode(best.tokens) if best else ""
            result: dict[str, Any] = {"translation": text}
            if options.attention:
                if self.attention_payload is None:
                    raise RuntimeError(
                        "attention maps need aiayn.apps.explorer, which is not installed"
                    )
                result["attention"] = self.attention_payload(
                    self.translator, sentence.text, options.decode, best, corpus=self.corpus
                )
            out.append((handle, result))
        return out


def model_info(translator: Translator, source: Path) -> dict[str, Any]:
    """What `GET /info` says: the model, its shape, languages, size, decoding defaults."""
    cfg = translator.model.cfg
    shape = {
        name: getattr(cfg, name)
        for name in [
            "vocab_size",
            "d_model",
            "n_heads",
            "n_kv_heads",
            "d_k",
            "d_v",
            "d_ff",
            "n_encoder_layers",
            "n_decoder_layers",
            "max_len",
            "positional",
            "norm_first",
        ]
        if hasattr(cfg, name)
    }
    return {
        "model": str(source),
        "shape": _plain(shape),
        "languages": languages(source),
        "parameters": translator.model.num_parameters(),
        "device": str(translator.device),
        "dtype": str(translator.dtype).removeprefix("torch."),
        "decoding": _plain(dataclasses.asdict(translator.decode)),
    }


def languages(source: Path) -> dict[str, str] | None:
    """{"source": "en", "target": "es"} from the run's recipe and corpus, or None
    where they are not known (a converted Marian model, a lone weights file)."""
    from aiayn.data.corpus import PreparedCorpus
    from aiayn.training.recipe import load_recipe

    recipe = source / "config.yaml" if source.is_dir() else find_in_run(source, "config.yaml")
    if recipe is None or not recipe.is_file():
        return None
    try:
        corpus = PreparedCorpus.load(load_recipe(recipe).corpus)
    except (FileNotFoundError, ValueError) as err:
        log.info("languages unknown: %s", err)
        return None
    return {"source": corpus.src_lang, "target": corpus.tgt_lang}


def _plain(values: dict[str, Any]) -> dict[str, Any]:
    """Enums by their value, tuples as lists: ready for JSON."""
    return {
        k: v.value if isinstance(v, Enum) else list(v) if isinstance(v, tuple) else v
        for k, v in values.items()
    }
