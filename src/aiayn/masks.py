"""Attention masks, built in one place with one convention: bool, True = may attend.

Shapes: B batch, S source (key) length, T target (query) length.
"""

from __future__ import annotations

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """True at real tokens, False at padding.

    Args:
        ids: (B, S) token ids.
        pad_id: the id that marks padding.

    Returns:
        (B, S) bool.
    """
    return ids != pad_id


def key_mask(real_tokens: Tensor) -> Tensor:
    """Broadcast a (B, S) padding mask over heads and queries: (B, 1, 1, S)."""
    return real_tokens[:, None, None, :]


def causal_mask(q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
    """Causal mask aligned to the end: the last query sees every key.

    Query i stands at absolute position `k_len - q_len + i` (the earlier keys come
    from a cache), so it may attend keys 0 .. k_len - q_len + i (section 3.2.3:
    "prevent leftward information flow").

    Returns:
        (q_len, k_len) bool.
    """
    if q_len > k_len:
        raise ValueError(f"causal_mask needs q_len <= k_len, got q_len={q_len}, k_len={k_len}")
    offset = k_len - q_len
    query_pos = torch.arange(q_len, device=device)[:, None] + offset
    key_pos = torch.arange(k_len, device=device)[None, :]
    return key_pos <= query_pos
