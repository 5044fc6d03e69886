"""Tokenizers: the `Tokenizer` protocol, and aiayn's own shared subword model.

Everything downstream of text (translation, attention plots, the trainer's BLEU
set) knows a tokenizer only through `Tokenizer`. Two classes implement it:

    SentencePieceTokenizer   one sentencepiece model shared by source and target
                             (section 5.1), trained by `train_tokenizer`
    aiayn.io.marian.MarianTokenizer   a Marian / opus-mt directory's source and target
                             sentencepiece models and its vocab.json

`train_tokenizer`'s special ids match `ModelConfig`'s defaults: pad 0, bos 1,
eos 2, unk 3.
"""

from __future__ import annotations

import io
import logging
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import sentencepiece as spm

from aiayn.data.files import write_atomic

log = logging.getLogger(__name__)

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
TOKENIZER_FILE = "spm.model"  # the shared subword model in a corpus or run directory


@runtime_checkable
class Tokenizer(Protocol):
    """Text to ids and back: what translation, plots and training need of a tokenizer.

    `encode` adds no special tokens (batching adds bos / eos where they belong);
    `decode` drops them. The special ids must equal the model's (`ModelConfig`).
    """

    @property
    def path(self) -> Path | None:
        """Where it was loaded from (a file or a directory), for messages; None if built."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int:
        """The id the decoder starts from."""
        ...

    @property
    def eos_id(self) -> int: ...

    def encode(self, text: str) -> list[int]:
        """Ids of one (source) sentence, without special tokens."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` of each sentence."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of (target) ids; special tokens are dropped."""
        ...

    def pieces(self, text: str) -> list[str]:
        """The pieces `encode` maps to ids, for display."""
        ...

    def id_to_piece(self, token_id: int) -> str:
        """The piece of one id (a special token's too), for display.

        Raises:
            ValueError: the id is outside the vocabulary.
        """
        ...


class SentencePieceTokenizer:
    """A `Tokenizer` through one sentencepiece model, shared by source and target."""

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None) -> None:
        self._processor = processor
        self.path = path
        self.pad_id = processor.pad_id()
        self.bos_id = processor.bos_id()
        self.eos_id = processor.eos_id()
        self.unk_id = processor.unk_id()

    @classmethod
    def load(cls, path: str | Path) -> SentencePieceTokenizer:
        """Load a `.model` file.

        Raises:
            FileNotFoundError: if the file is missing.
            ValueError: if it is not a sentencepiece model.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"subword model not found: {path}")
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(str(path))
        except (OSError, RuntimeError) as err:
            raise ValueError(f"{path} is not a sentencepiece model: {err}") from None
        return cls(processor, path)

    @property
    def vocab_size(self) -> int:
        return self._processor.GetPieceSize()

    def encode(self, text: str) -> list[int]:
        """Subword ids of one sentence, without special tokens."""
        return self._processor.EncodeAsIds(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Subword ids of many sentences (sentencepiece runs them in parallel)."""
        return self._processor.Encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids; pad, bos and eos are dropped."""
        specials = {self.pad_id, self.bos_id, self.eos_id}
        return self._processor.DecodeIds([i for i in ids if i not in specials])

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of one sentence, for display (e.g. attention axes)."""
        return self._processor.EncodeAsPieces(text)

    def id_to_piece(self, token_id: int) -> str:
        """The piece of one id; pad, bos and eos give "<pad>", "<s>", "</s>"."""
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"id {token_id} is outside the vocabulary of {self.vocab_size} pieces")
        return self._processor.IdToPiece(token_id)


def train_tokenizer(
    texts: Iterable[str],
    model_path: str | Path,
    vocab_size: int,
    model_type: str = "bpe",
    sample_size: int = 2_000_000,
    character_coverage: float = 1.0,
    seed: int = 0,
    user_defined_symbols: Sequence[str] = (),
) -> SentencePieceTokenizer:
    """Train one shared subword model on a bounded random sample of `texts`.

    Args:
        texts: sentences of both languages.
        model_path: where to write the `.model` file.
        vocab_size: pieces in the vocabulary, specials included.
        model_type: "bpe" (the default, as the paper's byte-pair encoding) or "unigram".
        sample_size: at most this many sentences are used (reservoir sample).
        character_coverage: share of characters covered by the vocabulary.
        seed: fixes the sample.
        user_defined_symbols: pieces kept whole, with ids right after unk (e.g. BERT's
            "[CLS]", "[SEP]", "[MASK]"; see `aiayn.data.lm`).

    Returns:
        The trained tokenizer.
    """
    rng = random.Random(seed)
    sample: list[str] = []
    for i, text in enumerate(t for t in texts if t.strip()):
        if len(sample) < sample_size:
            sample.append(text)
        elif (j := rng.randrange(i + 1)) < sample_size:
            sample[j] = text
    if not sample:
        raise ValueError("cannot train a subword model on no text")
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(sample),
        model_writer=buffer,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        unk_id=UNK_ID,
        user_defined_symbols=list(user_defined_symbols),
        input_sentence_size=0,  # all of `sample`, already bounded (spm rejects 1..100)
        shuffle_input_sentence=False,
        num_threads=2,
        minloglevel=2,
    )
    write_atomic(model_path, buffer.getvalue())
    tokenizer = SentencePieceTokenizer.load(model_path)
    log.info(  # a char model has as many pieces as the text has characters, up to vocab_size
        "trained a %s subword model of %d pieces on %d sentences",
        model_type,
        tokenizer.vocab_size,
        len(sample),
    )
    return tokenizer
