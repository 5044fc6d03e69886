"""How exactly an exported fast tokenizer (tokenizer.json) encodes as its sentencepiece model.

    python -m benchmarks.check_tokenizer_export /usr/lib/python3*/*.py --model-type bpe
    python -m benchmarks.check_tokenizer_export /usr/lib/python3*/*.py --model-type unigram

Trains a sentencepiece model (aiayn's `train_tokenizer`) on the lines of the files
given (the non-blank ones longer than 20 characters, shuffled with a fixed seed),
writes the fast tokenizer `aiayn export` writes for a language model, and counts the
held-out lines whose ids differ from sentencepiece's. Prints the count; writes nothing.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from aiayn.data.tokenizer import train_tokenizer
from aiayn.io.export import GPT2, fast_tokenizer_files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", type=Path, nargs="+", help="text to train and test on")
    parser.add_argument("--model-type", choices=("bpe", "unigram"), default="bpe")
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--train-lines", type=int, default=60_000)
    parser.add_argument("--test-lines", type=int, default=20_000)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    lines = []
    for path in sorted(args.files):
        try:
            lines += [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        except (OSError, UnicodeDecodeError):
            continue
    lines = [line for line in lines if len(line) > 20]
    random.Random(0).shuffle(lines)
    train = lines[: args.train_lines]
    test = lines[args.train_lines : args.train_lines + args.test_lines]
    with tempfile.TemporaryDirectory() as tmp:
        spm = Path(tmp) / "spm.model"
        tokenizer = train_tokenizer(train, spm, args.vocab_size, model_type=args.model_type)
        fast_tokenizer_files(spm, Path(tmp), tokenizer, GPT2, max_len=1024)
        fast = AutoTokenizer.from_pretrained(tmp)
        differ = sum(tokenizer.encode(line) != fast(line)["input_ids"] for line in test)
    print(
        f"{args.model_type}, {args.vocab_size} pieces, trained on {len(train)} lines: "
        f"{differ} of {len(test)} held-out lines encode differently"
    )


if __name__ == "__main__":
    main()
