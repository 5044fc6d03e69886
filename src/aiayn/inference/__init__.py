"""Inference: what runs a trained model fast, with no link back to training.

    decoding    start(model, src, beam): the state of a batch the search steps; new_cache
    frozen      freeze(model, dtype) -> a fast copy: packed weights, fused products, int8
    kv_cache    the stores incremental decoding keeps: LayerKV, KVCache
    search      greedy, sampling and beam search over a model's decoding state
    shortlist   output vocabularies restricted per sentence
    threads     fewer intra-op threads for small decoding steps

`from aiayn.inference import freeze` is kept; the other names of the old flat
`aiayn.inference` module are found in `aiayn.inference.frozen` (with a
`DeprecationWarning` for one release).
"""

from __future__ import annotations

import warnings
from typing import Any


def __getattr__(name: str) -> Any:
    from aiayn.inference import frozen

    if name.startswith("__") or not hasattr(frozen, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name != "freeze":
        warnings.warn(
            f"aiayn.inference.{name} moved to aiayn.inference.frozen.{name}; "
            "the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
    return getattr(frozen, name)
