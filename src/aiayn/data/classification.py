"""A text-classification data set as a prepared corpus directory, so that the trainer reads
it as it reads any corpus (`aiayn.data.corpus.PreparedCorpus`): the text is the
"source" language, the label the "target".

    train.text  train.label  valid.text  valid.label  test.text  test.label
        one example per line: its text, and its class name on the same line of .label
    spm.model    a sentencepiece model of the texts, with one piece per class,
                 "<class:I>" (`class_piece`): a classifier scores the classes as the
                 vocabulary's rows of those pieces (`aiayn.training.tasks.classify`)
    corpus.json  languages, the model's file, and "classes": the class names in order

`write_classification_corpus` writes these into a directory being filled (the data
modules' `write_dir_atomic` temporaries); `read_classes` reads the classes back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from aiayn.data.corpus import CORPUS_FILE, SPLITS, PreparedCorpus
from aiayn.data.files import lines_text
from aiayn.data.tokenizer import train_tokenizer

TEXT, LABEL = "text", "label"  # the corpus's two "languages"
TOKENIZER_FILE = "spm.model"


def class_piece(index: int) -> str:
    """The vocabulary piece that stands for class `index`."""
    return f"<class:{index}>"


def write_classification_corpus(
    directory: Path,
    splits: Mapping[str, Sequence[tuple[str, str]]],
    classes: Sequence[str],
    model_type: str,
    vocab_size: int,
    symbols: Sequence[str] = (),
    seed: int = 0,
) -> None:
    """Write the examples of each split, a tokenizer trained on the training texts, and
    corpus.json, into `directory`.

    Args:
        directory: an existing directory (a temporary being filled).
        splits: "train", "valid", "test" -> (text, class name) examples.
        classes: every class name, in the order of their indices.
        model_type: the sentencepiece model: "char" (characters), "bpe", "unigram".
        vocab_size: its pieces, specials and class pieces included ("char" takes what
            the texts hold).
        symbols: pieces kept whole, besides the class pieces (a fixed vocabulary's words).
        seed: the tokenizer's training sample.

    Raises:
        ValueError: a split that is not train, valid or test, or a label not in `classes`.
    """
    known = set(classes)
    for split, examples in splits.items():
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        unknown = sorted({label for _, label in examples} - known)
        if unknown:
            raise ValueError(f"{split}: labels not among the classes: {unknown[:5]}")
        (directory / f"{split}.{TEXT}").write_text(
            lines_text(text for text, _ in examples), encoding="utf-8"
        )
        (directory / f"{split}.{LABEL}").write_text(
            lines_text(label for _, label in examples), encoding="utf-8"
        )
    train_tokenizer(
        (text for text, _ in splits["train"]),
        directory / TOKENIZER_FILE,
        vocab_size,
        model_type=model_type,
        seed=seed,
        user_defined_symbols=[*symbols, *(class_piece(i) for i in range(len(classes)))],
    )
    description = {
        "src_lang": TEXT,
        "tgt_lang": LABEL,
        "tokenizer": TOKENIZER_FILE,
        "classes": list(classes),
    }
    (directory / CORPUS_FILE).write_text(json.dumps(description, indent=2) + "\n", "utf-8")


def read_classes(corpus: PreparedCorpus) -> list[str]:
    """The class names of a classification corpus, in index order.

    Raises:
        ValueError: the corpus is not a classification corpus (naming its corpus.json).
    """
    path = Path(corpus.root) / CORPUS_FILE
    classes = json.loads(path.read_text(encoding="utf-8")).get("classes")
    if not isinstance(classes, list) or not classes:
        raise ValueError(
            f"{path} lists no classes: not a classification corpus (make one with aiayn "
            "prepare listops or aiayn prepare bible-books)"
        )
    return [str(name) for name in classes]
