"""Translate text with a trained run: subword model + checkpoint + search.

    translator = Translator.load("runs/base")          # or a .safetensors file
    translator.translate(["Ein Haus.", ""], beam=4, alpha=0.6)   # -> ["A house.", ""]

A Marian / opus-mt model (a directory as `transformers` saves it) translates the
same way, with its own tokenization and generation settings:

    translator = Translator.from_marian("opus-mt-en-es")
    translator.translate(["A house."])                   # beam, length penalty... from it

Sentences are encoded, sorted by length and cut into batches of at most
`max_tokens` source tokens (padding included), searched, and returned in input
order. An empty (or blank) sentence gives an empty translation without running
the model. A source longer than the model's `max_len` is truncated to fit, with
a warning naming the sentence.

A caller that has encoded the sentences already (the server, which counts their
tokens to batch them) hands over the ids instead, and may batch them itself:

    rows = translator.encode(["A house.", "A tree."])
    translator.translate_ids(rows, max_tokens=None)      # one batch, in this order
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from aiayn.apps import precision_choice
from aiayn.apps.model_use import ENCODER_DECODER, check_shape, run_files
from aiayn.apps.precision_choice import PrecisionChoice
from aiayn.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer, Tokenizer
from aiayn.inference.decoding import Decodable
from aiayn.inference.engine import Engine
from aiayn.inference.frozen import freeze
from aiayn.inference.search import DecodeConfig, Hypothesis, max_output_lengths, search
from aiayn.inference.shortlist import Shortlist, Shortlisted, vocabulary_digest
from aiayn.io.checkpoint import find_in_run, int8_weights, load_model
from aiayn.io.marian import (
    CONVERTED_FILE,
    MarianTokenizer,
    load_marian_model,
    marian_generation,
    read_converted_generation,
)
from aiayn.models import add_to_shape
from aiayn.models.encoder_decoder import Transformer

log = logging.getLogger(__name__)


def find_tokenizer(weights: Path) -> Path:
    """The run's subword model: `spm.model` next to the weights or in a parent directory.

    Raises:
        FileNotFoundError: naming where it was looked for.
    """
    found = find_in_run(weights, TOKENIZER_FILE)
    if found is not None:
        return found
    raise FileNotFoundError(
        f"no subword model ({TOKENIZER_FILE}) found for {weights} in its run directory; "
        "pass the tokenizer path explicitly"
    )


@dataclass(frozen=True)
class Translation:
    """One candidate translation: its text and the search's `Hypothesis`."""

    text: str
    hypothesis: Hypothesis

    @property
    def score(self) -> float:
        return self.hypothesis.score


class Translator:
    """A model and its subword model, ready to translate lists of sentences.

    `model` is kept (eval mode, on `device`) for what needs the literal model, such
    as attention maps; translating runs `engine`, its `aiayn.inference.frozen.freeze` copy.

    Args:
        model: the Transformer (put in eval mode on `device`).
        tokenizer: the shared subword model it was trained with (or a Marian one).
        device: where to run the search.
        dtype: the model's floating-point type there (e.g. torch.bfloat16 on a GPU);
            unchanged by default. Search scores are summed in float32 regardless.
            torch.int8 (CPU only): `engine` runs int8 products
            (`aiayn.inference.frozen.freeze`) while `model` stays float32. The
            translator's `precision` says what it runs in; `choose_precision` picks
            float32 or bfloat16 by timing (the command line's `--dtype auto`).
        decode: how `translate` searches unless told otherwise (default: the
            paper's beam search, `DecodeConfig()`).
        shortlist: an output shortlist (`aiayn.inference.shortlist`), or its file: the
            search then picks only among each batch's candidates. None (the
            default): the whole vocabulary.

    Raises:
        ValueError: if the subword model's vocabulary or special ids do not match
            the model's, or int8 is asked for on a device other than the CPU, or
            the shortlist is invalid, empty (eos only) or for another vocabulary
            (its recorded tokenizer digest is not the tokenizer's).
    """

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        decode: DecodeConfig | None = None,
        shortlist: Shortlist | str | Path | None = None,
    ) -> None:
        # a GPT or BERT model is refused by name
        check_shape(model.cfg, ENCODER_DECODER, "the model")
        self._take(model, tokenizer, device, dtype, decode, shortlist)

    @classmethod
    def _of_checked(cls, *args: Any) -> Translator:
        """The constructor (its arguments, in its order), for a model whose shape `load` has
        checked already (`run_files`)."""
        translator = cls.__new__(cls)
        translator._take(*args)
        return translator

    def _take(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        device: str | torch.device,
        dtype: torch.dtype | None,
        decode: DecodeConfig | None,
        shortlist: Shortlist | str | Path | None,
    ) -> None:
        """The constructor's work after the shape check (its arguments, in its order)."""
        cfg = model.cfg
        source = f" ({tokenizer.path})" if tokenizer.path else ""
        if tokenizer.vocab_size != cfg.vocab_size:
            raise ValueError(
                f"the subword model{source} has {tokenizer.vocab_size} pieces but the "
                f"checkpoint's vocabulary has {cfg.vocab_size}: they do not belong together"
            )
        ids = (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
        if ids != (cfg.pad_id, cfg.bos_id, cfg.eos_id):
            raise ValueError(
                f"the subword model{source} has pad/bos/eos ids {ids} but the checkpoint "
                f"uses {(cfg.pad_id, cfg.bos_id, cfg.eos_id)}"
            )
        self.device = torch.device(device)
        int8 = dtype == torch.int8
        if int8 and self.device.type != "cpu":
            raise ValueError(f"int8 runs on the CPU, not on {self.device}; use bfloat16 there")
        self.model = model.to(self.device, dtype=torch.float32 if int8 else dtype).eval()
        self.tokenizer = tokenizer
        self.decode = decode or DecodeConfig()
        self.shortlist: Shortlist | None = None
        if shortlist is not None:  # the output projection runs over candidates only
            digest = vocabulary_digest(tokenizer)
            if isinstance(shortlist, Shortlist):
                shortlist.check_usable()
                shortlist.check_vocabulary(digest, "the model's tokenizer")
            else:
                shortlist = Shortlist.load(shortlist, cfg.vocab_size, digest, cfg.eos_id)
            self.shortlist = shortlist
        # what decodes: the inference transform of `model`
        self.engine = self._frozen(torch.int8 if int8 else None)
        self.dtype = dtype if int8 else next(self.model.parameters()).dtype  # what it runs in
        name = str(self.dtype).removeprefix("torch.")
        asked = name if dtype is None else str(dtype).removeprefix("torch.")
        self.precision = PrecisionChoice(asked, name)

    def _frozen(self, dtype: torch.dtype | None) -> Decodable:
        """`self.model`'s inference transform in `dtype` (None: the model's own), over the
        output shortlist if there is one."""
        engine = freeze(self.model, dtype)
        return engine if self.shortlist is None else Shortlisted(engine, self.shortlist)

    def choose_precision(
        self,
        rows: Sequence[Sequence[int]],
        beam: int | None = None,
        max_tokens: int | None = 4096,
    ) -> PrecisionChoice:
        """`--dtype auto`: decode in bfloat16 from now on where it is timed clearly faster
        than float32 here, on the batch that is about to run (`aiayn.apps.precision_choice`).

        The batch timed is the first that `translate_ids(rows, config, max_tokens)` would
        decode (the longest), cut to its longest sentences that fit
        `aiayn.apps.precision_choice.MAX_TIMED_ROWS` hypothesis rows. A translator that runs another type than float32 (int8
        weights, or a dtype given) keeps it, untimed, and so does one with nothing to
        translate. Where bfloat16 wins, the model and its frozen copy become bfloat16, as
        `dtype=torch.bfloat16` would have made them: the same translations follow.

        Args:
            rows: source ids per sentence, as `encode` gives them (the input, or rows like
                it: `aiayn.apps.precision_choice.sample_rows`).
            beam: the beam the translations will search with; default: the translator's.
            max_tokens: as for `translate_ids` (None: `rows` are one batch).

        Returns:
            The choice, also kept as `self.precision` and logged in one line.
        """
        beam = self.decode.beam if beam is None else beam
        eos = self.model.cfg.eos_id
        work = [i for i, row in enumerate(rows) if any(t != eos for t in row)]
        if self.dtype != torch.float32:
            why = "the weights are int8" if self.dtype == torch.int8 else "a type given, not timed"
            self.precision = precision_choice.untimed_choice(self.dtype, why)
        elif not work:
            self.precision = precision_choice.untimed_choice(self.dtype, "nothing to translate")
        else:
            one_batch = len(rows) * max(map(len, rows))  # max_tokens None: all rows fit
            batch = next(_batches_by_tokens(work, rows, max_tokens or one_batch))
            batch = batch[: max(1, precision_choice.MAX_TIMED_ROWS // beam)]  # longest first
            src = self.to_batch([rows[i] for i in batch])
            bf16 = self._frozen(torch.bfloat16)
            self.precision = precision_choice.timed_choice(self.engine, bf16, src, beam)
            if self.precision.chosen == "bfloat16":
                self.model.to(torch.bfloat16)
                self.engine, self.dtype = bf16, torch.bfloat16
        return self.precision

    @classmethod
    def load(
        cls,
        run_or_checkpoint: str | Path,
        device: str | torch.device = "cpu",
        tokenizer: str | Path | None = None,
        dtype: torch.dtype | None = None,
        shortlist: Shortlist | str | Path | None = None,
    ) -> Translator:
        """Load a run directory, a checkpoint directory or a weights file.

        In a run directory the weights are chosen by the one rule of
        `aiayn.io.checkpoint.resolve_weights`: an up-to-date average, else `best`, else
        the newest step checkpoint (a stale average is skipped with a warning). The
        subword model is the run's own spm.model (`aiayn.io.checkpoint.find_in_run`),
        never one from a folder above the run.

        A directory written by `aiayn convert marian` (its `marian.json` next to the
        weights) gets Marian's tokenization and generation settings, unless a
        `tokenizer` is given.

        Args:
            run_or_checkpoint: a run directory, a checkpoint directory or a
                `.safetensors` file; see `aiayn.io.checkpoint.resolve_weights`.
            device: e.g. "cpu" or "cuda".
            tokenizer: the subword model; by default the run's `spm.model`.
            dtype, shortlist: see the class docstring; dtype None on a file of int8
                weights (`aiayn convert marian --dtype int8`) is torch.int8.

        Raises:
            FileNotFoundError: if the checkpoint or subword model is missing.
            ValueError: if either is corrupt or they do not match, or the checkpoint
                holds another model shape (`aiayn.apps.model_use.WrongShapeError`).
        """
        # One pass: the weights resolved, their config read and its shape checked (a GPT
        # or BERT run is refused by name before any weight is read), each once.
        files = run_files(run_or_checkpoint, ENCODER_DECODER)
        weights = files.weights
        if dtype is None and int8_weights(weights):  # `aiayn convert marian --dtype int8`
            dtype = torch.int8
        if tokenizer is None and (weights.parent / CONVERTED_FILE).is_file():
            generation = read_converted_generation(weights.parent)
            model = load_model(weights, device="cpu", cfg=files.cfg)
            log.info("loaded %s with Marian tokenization", weights)
            marian = MarianTokenizer(weights.parent)
            return cls._of_checked(
                model,
                marian,
                device,
                dtype,
                DecodeConfig(**generation.search_settings()),
                shortlist,
            )
        spm_path = Path(tokenizer) if tokenizer is not None else find_tokenizer(weights)
        model = load_model(weights, device="cpu", cfg=files.cfg)
        log.info("loaded %s with subword model %s", weights, spm_path)
        tokenizer = SentencePieceTokenizer.load(spm_path)
        return cls._of_checked(model, tokenizer, device, dtype, None, shortlist)

    @classmethod
    def from_marian(
        cls,
        directory: str | Path,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        shortlist: Shortlist | str | Path | None = None,
        **overrides: Any,
    ) -> Translator:
        """A Marian / opus-mt directory as `transformers` saves it, run by aiayn.

        Nothing is downloaded and `transformers` is not imported. `translate`
        searches as `transformers`' `generate` would with the directory's settings
        (beam, length penalty, max length, bad words; see `aiayn.io.marian`).

        Args:
            directory: holds config.json, the weights (safetensors or PyTorch),
                source.spm, target.spm and vocab.json.
            device, dtype, shortlist: see the class docstring.
            **overrides: `DecodeConfig` fields to set otherwise (beam, alpha, ...).

        Raises:
            FileNotFoundError: if a file is missing.
            aiayn.io.marian.MarianFormatError: (a ValueError) naming a config field the
                conversion does not cover.
        """
        model = load_marian_model(directory)
        decode = DecodeConfig(**{**marian_generation(directory).search_settings(), **overrides})
        return cls(model, MarianTokenizer(directory), device, dtype, decode, shortlist)

    # ----- translating --------------------------------------------------------

    def decode_config(self, **overrides: Any) -> DecodeConfig:
        """This translator's default `DecodeConfig` with some fields set otherwise."""
        return dataclasses.replace(self.decode, **overrides)

    def translate(
        self,
        sentences: Sequence[str],
        beam: int | None = None,
        alpha: float | None = None,
        max_tokens: int | None = 4096,
        progress: bool = False,
        **options: Any,
    ) -> list[str]:
        """Best translation of each sentence, in input order.

        Args:
            sentences: source sentences (an empty one gives "").
            beam: beam width (1 = greedy search); default: the translator's
                (the paper's 4, or a Marian model's own).
            alpha: length-penalty exponent; default: the translator's (0.6, or a
                Marian model's length_penalty).
            max_tokens: source tokens per batch, padding included (None: all the
                sentences in one batch).
            progress: show a progress bar on stderr.
            **options: further `DecodeConfig` fields (extra_len, sampling, top_k, ...).
        """
        given = {"beam": beam, "alpha": alpha}
        config = self.decode_config(**{k: v for k, v in given.items() if v is not None}, **options)
        nbest = self.translate_nbest(sentences, config, max_tokens, progress)
        return [candidates[0].text if candidates else "" for candidates in nbest]

    def translate_nbest(
        self,
        sentences: Sequence[str],
        config: DecodeConfig | None = None,
        max_tokens: int | None = 4096,
        progress: bool = False,
        continuous: int = 0,
        compile: bool = False,
    ) -> list[list[Translation]]:
        """Up to `config.nbest` translations per sentence, best first, in input order.

        An empty (or blank) sentence gets an empty list. `config` defaults to the
        translator's. `translate_ids` of the sentences' `encode`, or with `continuous`
        N > 0 `stream_ids` (N sentences at once, `compile` as it says).
        """
        rows = self.encode(sentences)
        if continuous > 0:
            return self.stream_ids(rows, config, continuous, compile, progress)
        return self.translate_ids(rows, config, max_tokens, progress)

    def translate_ids(
        self,
        rows: Sequence[Sequence[int]],
        config: DecodeConfig | None = None,
        max_tokens: int | None = 4096,
        progress: bool = False,
    ) -> list[list[Translation]]:
        """Up to `config.nbest` translations per encoded sentence, best first, in input order.

        Args:
            rows: source ids per sentence, eos last, as `encode` gives them. A row with
                no source token (eos alone: a blank sentence) gets an empty list,
                without running the model.
            config: how to search; default: the translator's.
            max_tokens: source tokens per batch, padding included: the rows are sorted
                by length and cut into batches that fit. None: the rows are one batch
                already (the caller batched them, as the server's batcher does),
                searched at once in the order given.
            progress: show a progress bar on stderr.

        Raises:
            ValueError: if `max_tokens` is below 1.
        """
        config = config or self.decode
        if max_tokens is not None and max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        eos = self.model.cfg.eos_id
        results: list[list[Translation]] = [[] for _ in rows]
        work = [i for i, row in enumerate(rows) if any(t != eos for t in row)]
        if max_tokens is None:
            batches = [work] if work else []
        else:
            batches = list(_batches_by_tokens(work, rows, max_tokens))
        with tqdm(total=len(rows), disable=not progress, unit="sent", dynamic_ncols=True) as bar:
            bar.update(len(rows) - len(work))
            for batch in batches:
                src = self.to_batch([rows[i] for i in batch])
                for i, hyps in zip(batch, search(self.engine, src, config), strict=True):
                    results[i] = [Translation(self.tokenizer.decode(h.tokens), h) for h in hyps]
                bar.update(len(batch))
        return results

    def stream_ids(
        self,
        rows: Sequence[Sequence[int]],
        config: DecodeConfig | None = None,
        sentences: int = 16,
        compile: bool = False,
        progress: bool = False,
    ) -> list[list[Translation]]:
        """`translate_ids` on the continuous-batching engine (`aiayn.inference.engine`):
        the rows stream through a table of `sentences` x beam slots, each taking a free
        group as one finishes, instead of being cut into batches. They enter longest
        first, as `translate_ids` batches them: sentences of like lengths share the
        table, so its steps attend little beyond what each needs. The outputs are
        `translate_ids`'s, in input order.

        The slots hold the longest row's source and its longest output
        (`max_output_lengths`), not the model's `max_len`.

        Args:
            rows, config, progress: as for `translate_ids`.
            sentences: sentences decoded at once (>= 1).
            compile: compile the engine's step first (`torch.compile`, once: minutes on
                a busy CPU; see docs/explanation/decoding-engine.md).

        Raises:
            ValueError: `sentences` below 1, or an output shortlist (the engine runs the
                whole vocabulary).
        """
        config = config or self.decode
        if isinstance(self.engine, Shortlisted):
            raise ValueError(
                "the continuous-batching engine projects onto the whole vocabulary: "
                "it does not take an output shortlist"
            )
        eos = self.model.cfg.eos_id
        results: list[list[Translation]] = [[] for _ in rows]
        work = [i for i, row in enumerate(rows) if any(t != eos for t in row)]
        work.sort(key=lambda i: -len(rows[i]))  # stable: equal lengths in input order
        with tqdm(total=len(rows), disable=not progress, unit="sent", dynamic_ncols=True) as bar:
            bar.update(len(rows) - len(work))
            if not work:
                return results
            longest = max(len(rows[i]) for i in work)
            max_target = max_output_lengths(
                torch.tensor([longest]), config.extra_len, self.model.cfg.max_len,
                config.max_output_len,
            )  # fmt: skip
            engine = Engine(
                self.engine, config, sentences, int(max_target), longest, compile=compile
            )
            for done in engine.run(rows[i] for i in work):
                hyps = done.hypotheses
                results[work[done.request]] = [
                    Translation(self.tokenizer.decode(h.tokens), h) for h in hyps
                ]
                bar.update(1)
        return results

    def encode(self, texts: Sequence[str], indices: Sequence[int] | None = None) -> list[list[int]]:
        """Subword ids + eos per sentence, truncated (with a warning) to the model's max_len.

        A blank sentence gives eos alone (nothing to translate: `translate_ids` skips
        it), without asking the tokenizer what it makes of whitespace.

        Args:
            texts: source sentences.
            indices: their 0-based positions in the input, for the warning
                (default: 0, 1, ...).
        """
        limit = self.model.cfg.max_len - 1  # room for eos
        pieces = iter(self.tokenizer.encode_batch([t for t in texts if t.strip()]))
        encoded = [next(pieces) if t.strip() else [] for t in texts]
        numbers = range(len(texts)) if indices is None else indices
        for row, number in zip(encoded, numbers, strict=True):
            if len(row) > limit:
                log.warning(
                    "sentence %d has %d subword tokens, more than the model's max_len=%d "
                    "allows; translating only its first %d",
                    number + 1,
                    len(row) + 1,
                    self.model.cfg.max_len,
                    limit,
                )
                del row[limit:]
            row.append(self.model.cfg.eos_id)
        return encoded

    def to_batch(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """Pad id lists into a (B, S) tensor on the translator's device."""
        width = max(len(r) for r in rows)
        src = torch.full((len(rows), width), self.model.cfg.pad_id, dtype=torch.long)
        for i, r in enumerate(rows):
            src[i, : len(r)] = torch.tensor(list(r))
        return src.to(self.device)


def _batches_by_tokens(
    order: list[int], ids: Sequence[Sequence[int]], max_tokens: int
) -> Iterator[list[int]]:
    """Sentence indices grouped, longest first, so that rows x longest <= max_tokens.

    Sorting by length keeps padding (wasted compute) small; the longest batch comes
    first, so that running out of memory shows at once. A sentence longer than
    `max_tokens` gets a batch of its own.
    """
    batch: list[int] = []
    for i in sorted(order, key=lambda i: -len(ids[i])):
        width = len(ids[batch[0]]) if batch else len(ids[i])
        if batch and (len(batch) + 1) * width > max_tokens:
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


# the shape's user and verb, from the apps layer (aiayn.models.add_to_shape)
add_to_shape("encoder_decoder", user=Translator, verb="translate")
