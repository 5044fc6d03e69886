"""ListOps (Nangia and Bowman 2018) as Long Range Arena builds it (Tay et al. 2021, section 3.1).

An example is a nested list expression in prefix notation over the digits 0 ... 9, and
its label is the expression's value, one of 10 classes:

    [MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]   ->   5

    MAX, MIN   the largest / smallest argument
    MED        the median: the middle argument of the sorted list, and for an even count
               the mean of the two middle ones rounded down (LRA's int(numpy.median))
    SM         the sum modulo 10

LRA's rules: trees of depth at most 10 with 2 ... 10 arguments per operator, sequences
of 500 ... 2,000 tokens (a token is an operator with its bracket, "[MAX", a digit, or
"]"), 96,000 / 2,000 / 2,000 training / validation / test examples. The tree is drawn
top-down: below the root (always an operator), a node at depth d < 10 is an operator
with probability `branch_probability` (LRA's 0.25) and a digit otherwise, each
operator with a uniform number of arguments; trees outside the length range are drawn
again. `write_listops` writes a data set from a seed, its split sizes scaled down by
`scale` as a CPU budget needs, and keeps it: a directory that holds the same
settings' data set is reused, not regenerated.

Departure: LRA's files bracket every argument for a tree-structured model; ours are
the flat token sequence (the same expression and label), one example per line, as a
classification corpus (`aiayn.data.classification`) that `aiayn train` reads.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Union

from tqdm.auto import tqdm

from aiayn.data.classification import write_classification_corpus
from aiayn.data.files import write_dir_atomic

log = logging.getLogger(__name__)

OPERATORS = ("MAX", "MIN", "MED", "SM")
OFFICIAL_SPLITS = {"train": 96_000, "valid": 2_000, "test": 2_000}  # LRA's ListOps sizes
MANIFEST = "listops.json"
WORDS = (*(f"[{operator}" for operator in OPERATORS), "]", *"0123456789")
CLASSES = tuple("0123456789")  # an expression's value
SYMBOLS = tuple("\u2581" + word for word in WORDS)  # sentencepiece's word-initial pieces

# A tree: a digit, or (operator, [arguments]).
Tree = Union[int, tuple[str, list["Tree"]]]  # noqa: UP007 (a recursive alias)


@dataclass(frozen=True)
class ListOpsConfig:
    """How a ListOps data set is generated (LRA's rules by default).

    Args:
        scale: the fraction of LRA's split sizes to generate, in (0, 1]; each split
            gets at least one example.
        seed: the random seed; the same settings give the same files.
        max_depth: operators nest at most this deep (the root is depth 1).
        max_args: arguments per operator, 2 ... max_args.
        min_length: the fewest tokens in an example.
        max_length: the most tokens in an example.
        branch_probability: the chance that a node below the root is an operator.

    Raises:
        ValueError: a setting out of range, naming it and its range.
    """

    scale: float = 1.0
    seed: int = 0
    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000
    branch_probability: float = 0.25

    def __post_init__(self) -> None:
        if not 0 < self.scale <= 1:
            raise ValueError(f"ListOpsConfig.scale must be in (0, 1], got {self.scale}")
        if not 0 < self.branch_probability < 1:
            raise ValueError(
                f"ListOpsConfig.branch_probability must be in (0, 1), got {self.branch_probability}"
            )
        for name, least in (("max_depth", 2), ("max_args", 2), ("min_length", 1)):
            if getattr(self, name) < least:
                raise ValueError(
                    f"ListOpsConfig.{name} must be >= {least}, got {getattr(self, name)}"
                )
        if self.max_length < self.min_length:
            raise ValueError(
                f"ListOpsConfig.max_length must be >= min_length ({self.min_length}), "
                f"got {self.max_length}"
            )

    def split_sizes(self) -> dict[str, int]:
        """Examples per split: LRA's sizes times `scale`, at least 1."""
        return {name: max(1, round(size * self.scale)) for name, size in OFFICIAL_SPLITS.items()}


def draw_tree(rng: random.Random, cfg: ListOpsConfig, depth: int = 1) -> Tree:
    """A random expression tree: an operator at the root (depth 1), below it an
    operator with probability `cfg.branch_probability` while depth < `cfg.max_depth`."""
    if depth > 1 and (depth >= cfg.max_depth or rng.random() >= cfg.branch_probability):
        return rng.randrange(10)
    operator = rng.choice(OPERATORS)
    n_args = rng.randint(2, cfg.max_args)
    return operator, [draw_tree(rng, cfg, depth + 1) for _ in range(n_args)]


def tokens(tree: Tree) -> list[str]:
    """The expression in prefix notation: "[MAX", its arguments, "]"; digits as "0" ... "9"."""
    if isinstance(tree, int):
        return [str(tree)]
    operator, arguments = tree
    out = [f"[{operator}"]
    for argument in arguments:
        out += tokens(argument)
    return [*out, "]"]


def evaluate(tree: Tree) -> int:
    """The value of an expression tree, 0 ... 9 (see the module docstring)."""
    if isinstance(tree, int):
        return tree
    operator, arguments = tree
    values = sorted(evaluate(argument) for argument in arguments)
    if operator == "MAX":
        return values[-1]
    if operator == "MIN":
        return values[0]
    if operator == "SM":
        return sum(values) % 10
    middle = len(values) // 2  # MED
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) // 2


def draw_examples(
    rng: random.Random, cfg: ListOpsConfig, count: int, exclude: set[str] | None = None
) -> list[tuple[str, int]]:
    """`count` distinct (expression, value) examples within the length range, none in
    `exclude` (which is extended with them)."""
    exclude = set() if exclude is None else exclude
    examples: list[tuple[str, int]] = []
    with tqdm(total=count, desc="listops", unit="ex", leave=False) as bar:
        while len(examples) < count:
            tree = draw_tree(rng, cfg)
            words = tokens(tree)
            if not cfg.min_length <= len(words) <= cfg.max_length:
                continue
            text = " ".join(words)
            if text in exclude:
                continue
            exclude.add(text)
            examples.append((text, evaluate(tree)))
            bar.update(1)
    return examples


def write_listops(out: str | Path, cfg: ListOpsConfig | None = None) -> Path:
    """Generate a ListOps data set into directory `out`, or reuse the one there.

    Writes a classification corpus (`aiayn.data.classification`: each split's
    expressions and values, no expression in two splits; a sentencepiece model with one
    piece per ListOps token, so that an expression of n tokens is n ids) and
    `MANIFEST`, the settings and split sizes, all at once
    (`aiayn.data.files.write_dir_atomic`). A directory whose manifest records the same
    settings is kept as it is.

    Args:
        out: the directory.
        cfg: the settings (default: LRA's rules, full size, seed 0).

    Returns:
        `out`.
    """
    cfg = ListOpsConfig() if cfg is None else cfg
    out = Path(out)
    settings = asdict(cfg)
    manifest = out / MANIFEST
    if manifest.is_file():
        try:
            if json.loads(manifest.read_text(encoding="utf-8")).get("settings") == settings:
                log.info("reusing the ListOps data set in %s", out)
                return out
        except (ValueError, OSError):
            pass  # unreadable: regenerate
    rng = random.Random(cfg.seed)
    seen: set[str] = set()
    splits = {name: draw_examples(rng, cfg, size, seen) for name, size in cfg.split_sizes().items()}

    def fill(tmp: Path) -> None:
        labelled = {name: [(t, str(v)) for t, v in rows] for name, rows in splits.items()}
        write_classification_corpus(
            tmp, labelled, CLASSES, "bpe", 4 + len(WORDS) + len(CLASSES), symbols=SYMBOLS
        )  # the 4 specials, then one piece per word and per class: nothing else
        sizes = {name: len(examples) for name, examples in splits.items()}
        record = {"settings": settings, "sizes": sizes, "classes": 10}
        (tmp / MANIFEST).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")

    write_dir_atomic(out, fill)
    log.info("wrote ListOps %s to %s", cfg.split_sizes(), out)
    return out
