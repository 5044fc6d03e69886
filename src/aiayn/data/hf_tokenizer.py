"""A Hugging Face tokenizer directory behind aiayn's `Tokenizer` protocol.

    tokenizer = HFTokenizer("gpt2-converted/")      # tokenizer.json, vocab.json + merges.txt,
    tokenizer.encode("In the beginning")            # vocab.txt (WordPiece)... as saved
                                                    # by `save_pretrained`

A GPT-2 or BERT directory (as `transformers` saves it, or as `aiayn convert gpt2 /
bert` copies it) brings its own tokenizer; this runs it through `transformers`
(imported when a directory is loaded, as aiayn's other optional parts are), from
the local files only: nothing is downloaded.

`encode` adds no special tokens ([CLS], [SEP], GPT-2's <|endoftext|>): the model
users add those where their shape needs them. `decode` drops them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class HFTokenizer:
    """A `transformers` tokenizer saved in `directory`, as an `aiayn.data.tokenizer.Tokenizer`.

    Special ids a tokenizer does not define (GPT-2 has no pad, BERT no bos or eos)
    are None; GPT-2's bos and eos are both <|endoftext|>.

    Raises:
        FileNotFoundError: the directory has no tokenizer files.
    """

    def __init__(self, directory: str | Path) -> None:
        from transformers import AutoTokenizer

        directory = Path(directory)
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError) as err:
            raise FileNotFoundError(
                f"no Hugging Face tokenizer in {directory} (tokenizer.json, vocab.json + "
                f"merges.txt or vocab.txt): {str(err).splitlines()[0]}"
            ) from None
        self.path = directory
        self.pad_id = self._tokenizer.pad_token_id
        self.bos_id = self._tokenizer.bos_token_id
        self.eos_id = self._tokenizer.eos_token_id

    @property
    def vocab_size(self) -> int:
        return len(self._tokenizer)  # added tokens included

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids, special tokens dropped, as `transformers`' `decode` writes it."""
        return self._tokenizer.decode(list(ids), skip_special_tokens=True)

    def pieces(self, text: str) -> list[str]:
        return self._tokenizer.tokenize(text)

    def id_to_piece(self, token_id: int) -> str:
        """The piece of one id (a special token's too).

        Raises:
            ValueError: the id is outside the vocabulary.
        """
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"id {token_id} is outside the vocabulary of {self.vocab_size} pieces")
        return self._tokenizer.convert_ids_to_tokens(token_id)
