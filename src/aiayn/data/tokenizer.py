"""One shared sentencepiece subword model for source and target (section 5.1).

The special ids match `ModelConfig`'s defaults: pad 0, bos 1, eos 2, unk 3.
"""

from __future__ import annotations

import io
import logging
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

log = logging.getLogger(__name__)

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


class Tokenizer:
    """Text to subword ids and back, through one sentencepiece model.

    `encode` adds no special tokens; batching adds bos / eos where they belong.
    """

    def __init__(self, processor: spm.SentencePieceProcessor, path: Path | None = None) -> None:
        self.processor = processor
        self.path = path
        self.pad_id = processor.pad_id()
        self.bos_id = processor.bos_id()
        self.eos_id = processor.eos_id()
        self.unk_id = processor.unk_id()

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
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
        return self.processor.GetPieceSize()

    def encode(self, text: str) -> list[int]:
        """Subword ids of one sentence, without special tokens."""
        return self.processor.EncodeAsIds(text)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Subword ids of many sentences (sentencepiece runs them in parallel)."""
        return self.processor.Encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids; pad, bos and eos are dropped."""
        specials = {self.pad_id, self.bos_id, self.eos_id}
        return self.processor.DecodeIds([i for i in ids if i not in specials])

    def pieces(self, text: str) -> list[str]:
        """The subword pieces of one sentence, for display (e.g. attention axes)."""
        return self.processor.EncodeAsPieces(text)


def train_tokenizer(
    texts: Iterable[str],
    model_path: str | Path,
    vocab_size: int,
    model_type: str = "bpe",
    sample_size: int = 2_000_000,
    character_coverage: float = 1.0,
    seed: int = 0,
) -> Tokenizer:
    """Train one shared subword model on a bounded random sample of `texts`.

    Args:
        texts: sentences of both languages.
        model_path: where to write the `.model` file.
        vocab_size: pieces in the vocabulary, specials included.
        model_type: "bpe" (the default, as the paper's byte-pair encoding) or "unigram".
        sample_size: at most this many sentences are used (reservoir sample).
        character_coverage: share of characters covered by the vocabulary.
        seed: fixes the sample.

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
    model_path = Path(model_path)
    model_path.parent.mkdir(parents=True, exist_ok=True)
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
        input_sentence_size=0,  # all of `sample`, already bounded (spm rejects 1..100)
        shuffle_input_sentence=False,
        num_threads=2,
        minloglevel=2,
    )
    tmp = model_path.with_suffix(".tmp")
    tmp.write_bytes(buffer.getvalue())
    tmp.replace(model_path)
    log.info(
        "trained a %s subword model of %d pieces on %d sentences",
        model_type,
        vocab_size,
        len(sample),
    )
    return Tokenizer.load(model_path)
