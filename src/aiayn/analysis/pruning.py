"""Permanent head pruning: a new, smaller model without some attention heads.

    pruned = prune_heads(model, {"encoder.0.self": [1, 3], "decoder.1.cross": [0]})
    chosen = heads_by_fraction(scores, 0.3)          # the 30% least important heads
    chosen = random_heads(model, 0.3, seed=0)        # the random-order baseline

Michel et al. (2019), "Are Sixteen Heads Really Better than One?", silence heads
with a mask; pruning makes that permanent. Silencing query head h of a sub-layer
(`MultiHeadAttention.head_mask`) zeroes its output before W^O, so the head's
rows of W^Q and its columns of W^O can go without changing the output. A
key/value head goes when no kept query head reads it any more (with
grouped-query attention, only when its whole group goes): its rows of W^K and
W^V are then unused. The pruned model is described by its config alone
(`ModelConfig.kept_heads`), so a checkpoint of it reloads with
`aiayn.io.checkpoint.load_model`, and `aiayn.inference.frozen.freeze` runs it.

A sub-layer is named "encoder.I.self", "decoder.I.self" or "decoder.I.cross"
(`aiayn.models.encoder_decoder.attention_sublayers`); its kind is the name without the layer:
"encoder.self", "decoder.self" or "decoder.cross". Head indices are always the
sub-layer's current ones: after a first pruning, its heads are numbered 0.. again.

The second half writes a pruned run directory (`save_pruned_run`); `prune_run`
is all of `aiayn prune`: it chooses the heads (named, or a fraction by importance
or at random), reads the head importance `aiayn heads` measured
(`read_head_scores`), prunes and writes the run.

Shape legend: D d_model, H query heads, Hkv key/value heads, Dk / Dv head sizes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import operator
import random
import shutil
from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.config import SUBLAYER_KINDS, enum_member, split_sublayer
from aiayn.data.files import strict_json, write_dir_atomic
from aiayn.io import hf_models
from aiayn.io.checkpoint import (
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    find_in_run,
    load_model,
    resolve_weights,
    save_model,
)
from aiayn.io.marian import CONVERTED_FILE, TOKENIZATION_FILES
from aiayn.models import build_model
from aiayn.models.encoder_decoder import Transformer, attention_sublayers
from aiayn.nn.attention import MultiHeadAttention, regular_groups

log = logging.getLogger(__name__)

KINDS = SUBLAYER_KINDS
"""The kinds of attention sub-layer, in model order."""


class HeadOrder(str, Enum):
    """Which heads `aiayn prune --fraction` takes first."""

    IMPORTANCE = "importance"  # the least important, as `aiayn heads` measured them
    RANDOM = "random"  # a random order: the baseline importance has to beat


class Importance(str, Enum):
    """Which of `aiayn heads`' measures of a head's importance to prune by."""

    ABLATION = "ablation"  # how much the loss grows when the head alone is silenced
    GRADIENT = "gradient"  # Michel et al.'s first-order estimate: |dLoss / dmask|


# ----- naming sub-layers --------------------------------------------------------------


def kind_of(name: str) -> str:
    """The kind of sub-layer `name`: "encoder.0.self" -> "encoder.self".

    Raises:
        ValueError: `name` is not "encoder.I.self", "decoder.I.self" or "decoder.I.cross".
    """
    stack, _, kind = split_sublayer(name)
    return f"{stack}.{kind}"


def _model_order(name: str) -> tuple[int, int, int]:
    """A sort key putting sub-layer names in model order (encoder first, self before cross)."""
    stack, layer, kind = split_sublayer(name)
    return (stack == "decoder", layer, kind == "cross")


def _checked_kinds(kinds: Iterable[str] | None) -> tuple[str, ...]:
    """`kinds` (all of them by default), each one of `KINDS`."""
    if kinds is None:
        return KINDS
    kinds = tuple(str(k) for k in kinds)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"head kinds must be some of {', '.join(KINDS)}, got {', '.join(kinds) or 'none'}"
        )
    return kinds


# ----- pruning ------------------------------------------------------------------------


def kv_heads_read(module: MultiHeadAttention) -> tuple[int, ...]:
    """For each query head of `module`, the key/value head it reads."""
    if module.kv_of_head is not None:  # pruned before, irregularly
        return module.kv_of_head
    return regular_groups(module.n_heads, module.n_kv_heads)


def prune_heads(model: Transformer, heads: Mapping[str, Iterable[int]]) -> Transformer:
    """A new model without the query heads `heads` names; `model` is left as it was.

    Key/value heads no kept query head reads are removed too. The new model's
    config records what each pruned sub-layer keeps (`ModelConfig.kept_heads`,
    merged with what earlier prunings kept), and it is built from that config,
    then loaded with the sliced weights, strictly. It is on `model`'s device, in
    its dtype and training mode; head masks (`MultiHeadAttention.head_mask`) are
    not carried over, as a checkpoint does not carry them.

    Args:
        model: the literal model (not a frozen one).
        heads: sub-layer name ("encoder.0.self", "decoder.1.cross") -> the indices
            of its query heads to remove, numbered as the sub-layer numbers them now.

    Returns:
        The pruned model.

    Raises:
        ValueError: naming the sub-layer and head, for an unknown sub-layer, a head
            index out of range or named twice, or all the heads of a sub-layer.
    """
    sublayers = attention_sublayers(model)
    removals = _checked_removals(sublayers, heads)
    qualified = {id(module): name for name, module in model.named_modules()}
    state = dict(model.state_dict())
    kept_heads = dict(model.cfg.kept_heads)
    for name, removed in removals.items():
        module = sublayers[name]
        kept = [h for h in range(module.n_heads) if h not in removed]
        reads = kv_heads_read(module)
        kept_kv = sorted({reads[h] for h in kept})
        renumbered = {old: new for new, old in enumerate(kept_kv)}
        kept_heads[name] = tuple(renumbered[reads[h]] for h in kept)
        _slice_weights(state, qualified[id(module)], module, kept, kept_kv)

    ordered = tuple(sorted(kept_heads.items(), key=lambda item: _model_order(item[0])))
    cfg = dataclasses.replace(model.cfg, kept_heads=ordered)
    reference = next(model.parameters())
    with torch.device(reference.device):
        pruned = build_model(cfg)
    pruned = pruned.to(reference.dtype)
    pruned.load_state_dict(state, strict=True)
    return pruned.train(model.training)


def _checked_removals(
    sublayers: Mapping[str, nn.Module], heads: Mapping[str, Iterable[int]]
) -> dict[str, set[int]]:
    """`heads` as name -> set of indices, each checked against the model (see `prune_heads`)."""
    for name, module in sublayers.items():
        if not isinstance(module, MultiHeadAttention):
            raise ValueError(
                f"cannot prune heads of {name}: it is a {type(module).__name__}, not a "
                "MultiHeadAttention (prune the literal model, then freeze it)"
            )
    removals: dict[str, set[int]] = {}
    for name, indices in heads.items():
        if name not in sublayers:
            raise ValueError(
                f"cannot prune heads of {name!r}: the model has no such attention sub-layer "
                f"(it has {_name_ranges(sublayers)})"
            )
        module = sublayers[name]
        removed: set[int] = set()
        for index in indices:
            index = _as_index(name, index)
            if not 0 <= index < module.n_heads:
                raise ValueError(
                    f"{name} has {module.n_heads} heads (0 to {module.n_heads - 1}); "
                    f"there is no head {index} to prune"
                )
            if index in removed:
                raise ValueError(f"head {index} of {name} is named twice")
            removed.add(index)
        if len(removed) == module.n_heads:
            raise ValueError(
                f"cannot prune all {module.n_heads} heads of {name}: at least one must remain"
            )
        if removed:
            removals[name] = removed
    return removals


def _as_index(name: str, index: Any) -> int:
    if isinstance(index, bool):
        raise ValueError(f"head {index!r} of {name} is not an integer index")
    try:
        return operator.index(index)
    except TypeError:
        raise ValueError(f"head {index!r} of {name} is not an integer index") from None


def _name_ranges(sublayers: Mapping[str, nn.Module]) -> str:
    """What a model's sub-layers are called: "encoder.I.self with I < 6, ..."."""
    counts = count_by_kind({name: [0] for name in sublayers})
    return ", ".join(f"{kind.replace('.', '.I.')} with I < {n}" for kind, n in counts.items() if n)


def _slice_weights(
    state: dict[str, Tensor],
    prefix: str,
    module: MultiHeadAttention,
    kept: Sequence[int],
    kept_kv: Sequence[int],
) -> None:
    """Keep only the kept heads' rows of W^Q, W^K, W^V and columns of W^O, in `state`."""
    d_k, d_v = module.d_k, module.d_v

    def rows(heads: Sequence[int], size: int) -> Tensor:
        # head h owns rows h size .. (h + 1) size - 1 of its projection
        return torch.tensor([h * size + i for h in heads for i in range(size)], dtype=torch.long)

    for proj, heads, size in (
        ("q_proj", kept, d_k),
        ("k_proj", kept_kv, d_k),
        ("v_proj", kept_kv, d_v),
    ):
        index = rows(heads, size)
        for param in ("weight", "bias"):
            key = f"{prefix}.{proj}.{param}"
            if key in state:  # (H Dk, D) -> (H' Dk, D), and the bias alike
                state[key] = state[key].index_select(0, index.to(state[key].device))
    key = f"{prefix}.out_proj.weight"  # (D, H Dv) -> (D, H' Dv); its bias stays
    state[key] = state[key].index_select(1, rows(kept, d_v).to(state[key].device))


# ----- choosing heads -----------------------------------------------------------------


def check_fraction(fraction: float) -> None:
    """Raise a ValueError, with the value, unless `fraction` lies in [0, 1)."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ValueError(f"the fraction of heads to prune must be a number, got {fraction!r}")
    if not 0.0 <= fraction < 1.0:
        raise ValueError(
            f"the fraction of heads to prune must lie in [0, 1) (at least one head of each "
            f"sub-layer remains), got {fraction}"
        )


def heads_by_fraction(
    scores: Mapping[str, Sequence[float]],
    fraction: float,
    kinds: Iterable[str] | None = None,
) -> dict[str, list[int]]:
    """The `fraction` of all heads (of `kinds`) with the lowest scores, for `prune_heads`.

    The count is `fraction` times the heads of the chosen kinds, rounded down. Heads
    are taken from the lowest score up; ties go to the sub-layer earlier in the model,
    then to the lower head index. The last head of a sub-layer is never taken: the
    next-lowest head elsewhere is taken instead (so fewer than asked are returned
    only when every other sub-layer is down to one head).

    Args:
        scores: sub-layer name -> one score per head (higher = more important).
        fraction: in [0, 1).
        kinds: which kinds of sub-layer to prune ("encoder.self", "decoder.self",
            "decoder.cross"); all by default.

    Returns:
        Sub-layer name -> head indices to remove, ascending; sub-layers losing
        nothing are left out.

    Raises:
        ValueError: a fraction outside [0, 1), an unknown kind or sub-layer name,
            or a score that is not a finite number.
    """
    check_fraction(fraction)
    kinds = _checked_kinds(kinds)
    candidates = []  # (score, model order, head, name)
    remaining: dict[str, int] = {}
    for name, values in scores.items():
        if kind_of(name) not in kinds:
            continue
        remaining[name] = len(values)
        for head, value in enumerate(values):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"head {head} of {name} has no numeric score: {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"head {head} of {name} has a score of {value}")
            candidates.append((float(value), _model_order(name), head, name))
    wanted = math.floor(fraction * len(candidates) + 1e-9)  # 0.3 x 10 is 2.9999...
    chosen: dict[str, list[int]] = {}
    taken = 0
    for _, _, head, name in sorted(candidates):
        if taken == wanted:
            break
        if remaining[name] == 1:  # its last head: skip to the next-lowest
            continue
        remaining[name] -= 1
        chosen.setdefault(name, []).append(head)
        taken += 1
    if taken < wanted:
        log.warning(
            "pruning %d heads instead of %d: the others are the last of their sub-layers",
            taken,
            wanted,
        )
    return {name: sorted(chosen[name]) for name in sorted(chosen, key=_model_order)}


def random_heads(
    model: Transformer,
    fraction: float,
    seed: int,
    kinds: Iterable[str] | None = None,
) -> dict[str, list[int]]:
    """The `fraction` of `model`'s heads (of `kinds`) in a random order: the baseline.

    As `heads_by_fraction` with a random score per head drawn from `seed`: the
    same count, never the last head of a sub-layer, the same choice for the same
    seed and model.

    Raises:
        ValueError: as `heads_by_fraction`.
    """
    rng = random.Random(seed)
    scores = {
        name: [rng.random() for _ in range(module.n_heads)]
        for name, module in attention_sublayers(model).items()
    }
    return heads_by_fraction(scores, fraction, kinds)


def count_by_kind(heads: Mapping[str, Iterable[int]]) -> dict[str, int]:
    """How many heads `heads` names per kind, every kind listed (0 where none)."""
    counts = dict.fromkeys(KINDS, 0)
    for name, indices in heads.items():
        counts[kind_of(name)] += len(list(indices))
    return counts


# ----- heads.json, written by `aiayn heads` ----------------------------------------------

# heads.json names kinds as `aiayn.analysis.viz.AttentionKind` does (not imported: it needs matplotlib)
_KIND_ALIASES = {"encoder": "encoder.self", "decoder": "decoder.self", "cross": "decoder.cross"}


def read_head_scores(
    path: str | Path, measure: Importance | str = Importance.ABLATION
) -> dict[str, list[float]]:
    """Each sub-layer's per-head importance `measure`, from the heads.json `aiayn heads` wrote.

    The file holds records with "kind" ("encoder", "decoder", "cross", as
    `aiayn.analysis.heads` writes them, or "encoder.self", "decoder.self", "decoder.cross"),
    "layer", "head" and one number per measure ("ablation", "gradient"; higher
    = more important): under "heads" in an object (or another key), or as a list.

    Returns:
        Sub-layer name -> scores by head index, in model order.

    Raises:
        FileNotFoundError: no such file (run `aiayn heads RUN` first).
        ValueError: unreadable JSON, no records, a record without the measure,
            or a sub-layer whose head indices are not 0..H-1.
    """
    path = Path(path)
    measure = Importance(measure)
    hint = "run `aiayn heads RUN` first"
    if not path.is_file():
        raise FileNotFoundError(f"no head importance at {path}: {hint}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not readable JSON ({err}); {hint}") from None
    records = _records(data)
    if not records:
        raise ValueError(f"{path} holds no per-head records; {hint}")
    by_name: dict[str, dict[int, float]] = {}
    for number, record in enumerate(records, start=1):
        where = f"{path}: record {number}"
        try:
            kind = str(record["kind"]).replace("_", ".").replace("-", ".")
            kind = _KIND_ALIASES.get(kind, kind)
            name = f"{kind.split('.')[0]}.{int(record['layer'])}.{kind.split('.')[-1]}"
            kind_of(name)
            head = int(record["head"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{where} lacks a valid kind, layer and head ({record!r}); {hint}"
            ) from None
        value = record.get(measure.value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f"{where} ({name} head {head}) has no {measure.value!r} number; run "
                f"`aiayn heads RUN` with that measure first"
            )
        if head in by_name.setdefault(name, {}):
            raise ValueError(f"{where}: {name} head {head} is listed twice")
        by_name[name][head] = float(value)
    scores = {}
    for name in sorted(by_name, key=_model_order):
        heads = by_name[name]
        if sorted(heads) != list(range(len(heads))):
            raise ValueError(
                f"{path}: {name} has scores for heads {sorted(heads)}, not 0 to {len(heads) - 1}"
            )
        scores[name] = [heads[h] for h in range(len(heads))]
    return scores


def _records(data: Any) -> list[dict[str, Any]]:
    """The list of per-head records in heads.json's top level (a list or an object)."""
    if isinstance(data, dict):
        lists = [v for k, v in data.items() if k == "heads" and isinstance(v, list)]
        lists = lists or [
            v for v in data.values() if isinstance(v, list) and v and isinstance(v[0], dict)
        ]
        data = lists[0] if lists else []
    if not isinstance(data, list):
        return []
    return [r for r in data if isinstance(r, dict)]


def scored_kinds(scores: Mapping[str, Sequence[float]]) -> tuple[str, ...]:
    """The kinds of sub-layer `scores` has scores for, in model order."""
    have = {kind_of(name) for name in scores}
    return tuple(kind for kind in KINDS if kind in have)


def check_scores_fit(
    model: Transformer, scores: Mapping[str, Sequence[float]], kinds: Iterable[str]
) -> None:
    """Raise a ValueError unless `scores` has one score per head of every sub-layer of
    `model` of `kinds`, and none for sub-layers `model` does not have."""
    kinds = _checked_kinds(kinds)
    hint = "run `aiayn heads RUN` on this model first"
    sublayers = attention_sublayers(model)
    for name, values in scores.items():
        module = sublayers.get(name)
        if module is None or len(values) != module.n_heads:
            has = "no such sub-layer" if module is None else f"{module.n_heads} heads"
            raise ValueError(
                f"the head scores do not fit this model: {len(values)} scores for {name}, "
                f"which has {has}; {hint}"
            )
    missing = [name for name in sublayers if kind_of(name) in kinds and name not in scores]
    if missing:
        raise ValueError(f"no head scores for {', '.join(missing)}; {hint}")


# ----- a pruned run on disk -------------------------------------------------------------
#   OUT/model.safetensors   the pruned model (its config, with kept_heads, inside)
#   OUT/spm.model           the source run's subword model, copied
#   OUT/config.yaml         the source run's recipe, copied if it has one (evaluate --split)
#   OUT/pruning.json        what was pruned, from what, and the parameter counts
#   or, for a converted Marian directory: OUT/model.safetensors, source.spm,
#   target.spm, vocab.json and marian.json.

PRUNING_FILE = "pruning.json"
RECIPE_FILE = "config.yaml"


def save_pruned_run(
    model: Transformer, source_weights: str | Path, out: str | Path, record: dict[str, Any]
) -> list[str]:
    """Write `out` as a run directory of the source's kind: one `aiayn translate`
    (`Translator.load`), `aiayn generate` or `aiayn fill` accept.

    The weights go to OUT/model.safetensors; the files that make the source run
    usable are copied beside them (its subword model and recipe, a converted Marian
    directory's tokenization and marian.json, or a converted GPT-2 / BERT
    directory's tokenizer files and converted.json). The directory is written under
    a temporary name and renamed when whole.

    Args:
        model: the pruned model.
        source_weights: the weights file it was pruned from.
        out: the directory to write; it must not exist.
        record: written as OUT/pruning.json.

    Returns:
        The names of the files copied from the source run.

    Raises:
        FileExistsError: `out` exists.
    """
    source_weights, out = Path(source_weights), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists; name a new directory for the pruned run")
    if (source_weights.parent / CONVERTED_FILE).is_file():
        names = (*TOKENIZATION_FILES, CONVERTED_FILE)
        copies = {name: source_weights.parent / name for name in names}
    elif (source_weights.parent / hf_models.CONVERTED_FILE).is_file():
        names = (*hf_models.TOKENIZER_FILES, hf_models.CONVERTED_FILE)
        copies = {name: source_weights.parent / name for name in names}
        copies = {name: path for name, path in copies.items() if path.is_file()}
    else:
        copies = {name: find_in_run(source_weights, name) for name in (TOKENIZER_FILE, RECIPE_FILE)}
        copies = {name: path for name, path in copies.items() if path is not None}
        if TOKENIZER_FILE not in copies:
            log.warning(
                "no %s found for %s: translating %s will need --tokenizer",
                TOKENIZER_FILE,
                source_weights,
                out,
            )

    def fill(tmp: Path) -> None:
        save_model(model, tmp / WEIGHTS_FILE)
        for name, path in copies.items():
            shutil.copyfile(path, tmp / name)
        (tmp / PRUNING_FILE).write_text(strict_json(record), encoding="utf-8")

    write_dir_atomic(out, fill)
    return sorted(copies)


# ----- a run in, a pruned run out: `aiayn prune` ------------------------------------


@dataclasses.dataclass(frozen=True)
class PrunedRun:
    """What `prune_run` wrote, for a summary.

    Attributes:
        out: the pruned run directory.
        removed: sub-layer name -> the head indices removed.
        removed_by_kind: heads removed per kind, for the kinds the model has.
        heads_before: the model's attention heads before pruning.
        parameters_before, parameters_after: the parameter counts.
        architecture: the model's `ModelConfig.architecture`.
    """

    out: Path
    removed: dict[str, list[int]]
    removed_by_kind: dict[str, int]
    heads_before: int
    parameters_before: int
    parameters_after: int
    architecture: str


def parse_heads(values: Iterable[str]) -> dict[str, list[int]]:
    """Heads named as "SUBLAYER:HEAD[,HEAD...]" (e.g. "encoder.0.self:1,3"), merged per
    sub-layer: {"encoder.0.self": [1, 3]}.

    Raises:
        ValueError: a value not of that form (naming it).
    """
    heads: dict[str, list[int]] = {}
    for value in values:
        name, _, indices = value.rpartition(":")
        try:
            numbers = [int(i) for i in indices.split(",")]
        except ValueError:
            numbers = []
        if not name or not numbers:
            raise ValueError(
                f"--heads {value!r}: expected SUBLAYER:HEAD[,HEAD...], e.g. encoder.0.self:1,3"
            )
        heads.setdefault(name.strip(), []).extend(numbers)
    return heads


def prune_run(
    run: str | Path,
    out: str | Path,
    heads: Sequence[str] | None = None,
    fraction: float | None = None,
    by: HeadOrder | str | None = None,
    measure: Importance | str | None = None,
    scores: str | Path | None = None,
    kinds: Sequence[str] | None = None,
    seed: int | None = None,
) -> PrunedRun:
    """Prune a run's attention heads for good and write the smaller model as run `out`.

    Exactly one of `heads` (the heads named) and `fraction` (that share of all
    heads) is given. With `fraction`, the heads go by importance (`by` "importance",
    the default: the lowest of `aiayn heads`' `measure`, read from `scores`,
    default RUN/heads/heads.json; see `heads_by_fraction`) or at random (`by`
    "random", from `seed`, default 0; see `random_heads`). OUT/pruning.json records
    the choice; see `save_pruned_run` for the rest of OUT. Messages name the
    options as `aiayn prune` takes them (--heads, --fraction, ...).

    Args:
        run: a run directory, checkpoint directory or weights file (any model shape).
        out: the directory to write; it must not exist.
        heads: "SUBLAYER:HEAD[,HEAD...]" values (`parse_heads`).
        fraction: in [0, 1).
        by: a `HeadOrder` (with `fraction` only).
        measure: an `Importance` (with `fraction` only).
        scores: the heads.json to read (with `fraction` only).
        kinds: the kinds of sub-layer to prune (with `fraction` only; default: all
            the scored kinds, or all kinds at random).
        seed: the random order's seed (with `fraction` only).

    Returns:
        The `PrunedRun`.

    Raises:
        FileExistsError: `out` exists.
        FileNotFoundError: no weights, or no scores file.
        ValueError: options that do not go together, values out of range, heads or
            scores that do not fit the model (each naming the problem).
        OSError: the run cannot be written.
    """
    from aiayn.analysis.heads import HEADS_FILE  # here: the heads module needs matplotlib

    run, out = Path(run), Path(out)
    if out.exists():
        raise FileExistsError(f"--out {out} exists; name a new directory for the pruned run")
    if (heads is None) == (fraction is None):
        raise ValueError("give either --heads SUBLAYER:HEAD,... or --fraction F")
    if heads is not None and any(x is not None for x in (by, measure, scores, kinds, seed)):
        raise ValueError("--by, --measure, --scores, --kinds and --seed go with --fraction")
    if fraction is not None:
        check_fraction(fraction)
    order = enum_member(HeadOrder, by or HeadOrder.IMPORTANCE, "--by")
    importance = enum_member(Importance, measure or Importance.ABLATION, "--measure")
    kind_list = None if kinds is None else list(kinds)
    weights = resolve_weights(run)
    model = load_model(weights)
    how: dict[str, object] = {"heads": None if heads is None else list(heads)}
    if heads is not None:
        chosen = parse_heads(heads)
    elif order is HeadOrder.RANDOM:
        chosen = random_heads(model, fraction, seed or 0, kind_list)
        how = {"fraction": fraction, "by": order.value, "seed": seed or 0}
    else:
        path = Path(scores) if scores else (run if run.is_dir() else run.parent) / HEADS_FILE
        table = read_head_scores(path, importance)
        kind_list = kind_list or list(scored_kinds(table))
        check_scores_fit(model, table, kind_list)
        chosen = heads_by_fraction(table, fraction, kind_list)
        how = {"fraction": fraction, "by": order.value, "measure": importance.value}
    sublayers = attention_sublayers(model)
    total = sum(module.n_heads for module in sublayers.values())
    pruned = prune_heads(model, chosen)
    before, after = model.num_parameters(), pruned.num_parameters()
    record = {
        "source": str(weights),
        **how,
        "kinds": kind_list,
        "removed": chosen,
        "parameters": {"before": before, "after": after},
    }
    save_pruned_run(pruned, weights, out, record)
    present = {kind_of(name) for name in sublayers}
    counts = count_by_kind(chosen)
    return PrunedRun(
        out=out,
        removed=chosen,
        removed_by_kind={kind: n for kind, n in counts.items() if kind in present},
        heads_before=total,
        parameters_before=before,
        parameters_after=after,
        architecture=model.cfg.architecture,
    )
