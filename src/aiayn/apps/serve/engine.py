"""What the inference thread does with a batch, and what the server says about its model.

The batcher (`aiayn.apps.serve.batcher`) knows nothing of models: it hands
`TranslationEngine.run_batch` a list of sentences that share one `Options`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import logging
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch

from aiayn.apps.serve.batcher import Sentence
from aiayn.apps.translate import Translator
from aiayn.inference.engine import Engine, slots_per_sentence
from aiayn.inference.search import DecodeConfig
from aiayn.inference.shortlist import Shortlisted
from aiayn.inference.static_step import StaticStep
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

    Engines are kept by their slots per sentence K (the beam; one when sampling), not by
    decoding configuration: a table of `sentences` x K slots, holding the model's
    `max_len` positions, serves every configuration of that width (`Engine.configure`:
    the length penalty and the other options are bookkeeping), and its step is compiled
    once, with `compile`. One runs at a time; another configuration's sentences join once
    it has drained. The tables kept hold at most `max_slots` slots per sentence in all
    (the widest table a request may ask for): a table that does not fit evicts the least
    recently used ones first. The table of the model's default decoding is made at once,
    so that a table too large for the machine is refused before the server starts.

    Results are `run_batch`'s: the translation and, when asked, the explorer's attention
    maps of the hypothesis the engine found.

    Args:
        translator, threads, corpus: as for `TranslationEngine`.
        sentences: sentences decoded at once (>= 1).
        compile: compile each engine's step when it is made.
        max_slots: slots per sentence kept in all, over every table (at least the
            model's default beam).

    Raises:
        ValueError: an output shortlist (the engine projects onto the whole vocabulary),
            or a table of the default decoding that cannot be made (too large).
    """

    def __init__(
        self,
        translator: Translator,
        threads: int,
        corpus: dict[Any, dict[str, Any]] | None = None,
        sentences: int = 16,
        compile: bool = False,
        max_slots: int = 16,
    ) -> None:
        super().__init__(translator, threads, corpus)
        if isinstance(translator.engine, Shortlisted):
            raise ValueError(
                "continuous batching projects onto the whole vocabulary: it does not take "
                "an output shortlist"
            )
        self.sentences, self.compile = sentences, compile
        default = translator.decode_config()
        self.max_slots = max(max_slots, slots_per_sentence(default))
        # by slots per sentence, least recently used first
        self._engines: OrderedDict[int, Engine] = OrderedDict()
        self._running: DecodeConfig | None = None  # the config of the sentences in the table
        self._joined: dict[tuple[DecodeConfig, int], tuple[Options, Sentence]] = {}
        self._blanks = itertools.count(1)  # blank sentences' handles: -1, -2, ...
        try:
            self._engine(default)
        except MemoryError as err:
            raise ValueError(
                f"continuous={sentences}: {err}; decode fewer sentences at once"
            ) from None
        except RuntimeError as err:  # e.g. compiling the step failed
            raise ValueError(
                f"continuous={sentences}: the table of the default decoding could not be "
                f"made ({type(err).__name__}: {err})"
            ) from None

    @property
    def tables(self) -> dict[int, Engine]:
        """The engines kept, by slots per sentence (least recently used first)."""
        return dict(self._engines)

    def _engine(self, config: DecodeConfig) -> Engine:
        """The engine for `config`, made (evicting others) or reconfigured if need be."""
        width = slots_per_sentence(config)
        engine = self._engines.get(width)
        if engine is None:
            while self._engines and sum(self._engines) + width > self.max_slots:
                evicted, _ = self._engines.popitem(last=False)
                log.info("continuous batching: dropped the table of %d slots per sentence", evicted)
            gc.collect()  # the step's tensors sit in reference cycles: free them before making more
            self._check_memory(width)
            try:
                engine = Engine(
                    self.translator.engine, config, self.sentences, compile=self.compile
                )
            except RuntimeError as err:  # the allocator's "can't allocate memory"?
                if isinstance(err, torch.OutOfMemoryError) or "allocate" in str(err):
                    raise MemoryError(f"{self._table(width)}: {err}") from None
                raise
            self._engines[width] = engine
        self._engines.move_to_end(width)
        if engine.config != config:
            engine.configure(config)
        return engine

    def _table(self, width: int) -> str:
        return f"a table of {self.sentences} sentences x {width} slots"

    def _check_memory(self, width: int) -> None:
        """Refuse a table larger than the memory available, before allocating it (an
        allocation that succeeds only lazily ends in the kernel's out-of-memory killer).

        Raises:
            MemoryError: naming the table's size and the memory available.
        """
        one = StaticStep(self.translator.engine, width, group=width)  # one sentence's slots
        stores = [*one.self_keys, *one.self_values, *one.cross_keys, *one.cross_values]
        need = self.sentences * sum(t.nbytes for t in stores)
        free = available_memory(one.device)
        if free is not None and need > free:
            raise MemoryError(
                f"{self._table(width)} needs {need / 2**20:,.0f} MiB; "
                f"{free / 2**20:,.0f} MiB are available"
            )

    def room(self, options: Options) -> int:
        if self._running is not None and options.decode != self._running:
            return 0
        engine = self._engine(options.decode)
        return engine.free_groups - engine.queued

    def join(self, options: Options, sentence: Sentence) -> tuple[DecodeConfig, int]:
        if not any(t != self.translator.model.cfg.eos_id for t in sentence.ids):  # blank
            handle = (options.decode, -next(self._blanks))
            self._joined[handle] = (options, sentence)
            return handle
        engine = self._engine(options.decode)
        handle = (options.decode, engine.submit(sentence.ids))
        self._running = options.decode
        self._joined[handle] = (options, sentence)
        return handle

    def leave(self, handle: tuple[DecodeConfig, int]) -> None:
        config, request = handle
        if request >= 0 and config == self._running:
            self._engines[slots_per_sentence(config)].cancel(request)
        self._joined.pop(handle, None)
        self._drained()

    def reset(self) -> None:
        """Forget every sentence, and drop the running engine (a failed step may have
        left its table half updated): the next sentences get a new one."""
        if self._running is not None:
            self._engines.pop(slots_per_sentence(self._running), None)
        self._joined.clear()
        self._running = None

    @property
    def busy(self) -> bool:
        return bool(self._joined)

    def advance(self) -> list[tuple[tuple[DecodeConfig, int], dict[str, Any]]]:
        finished = [handle for handle in self._joined if handle[1] < 0]  # blank: nothing to run
        found: dict[tuple[DecodeConfig, int], Any] = dict.fromkeys(finished)
        if self._running is not None:
            engine = self._engines[slots_per_sentence(self._running)]
            for done in engine.advance():
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
        self._drained()
        return out

    def _drained(self) -> None:
        """Once no sentence of the running config is left, any config may run next."""
        if not any(request >= 0 for _, request in self._joined):
            self._running = None


def available_memory(device: torch.device) -> int | None:
    """Bytes that may still be allocated on `device`, or None where that is not known.

    On the CPU: Linux's MemAvailable, or less where the process's cgroup (a container's
    memory cap) has less left.
    """
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    left = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/meminfo") as meminfo:
            found = [line for line in meminfo if line.startswith("MemAvailable:")]
        left.append(int(found[0].split()[1]) * 1024)
    with contextlib.suppress(OSError, ValueError):  # cgroup v2; "max" is no cap
        cap = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        left.append(int(cap) - int(used))
    return min(left) if left else None


def model_info(translator: Translator, source: Path) -> dict[str, Any]:
    """What `GET /info` says: the model, its shape, languages, size, precision (and how it
    was chosen: `Translator.precision`), decoding defaults."""
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
        "precision": translator.precision.record(),  # and, where auto chose it, on what measure
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
