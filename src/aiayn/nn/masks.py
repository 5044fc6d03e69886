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


def relative_positions(q_len: int, k_len: int, device: torch.device | None = None) -> Tensor:
    """Key position minus query position, with the queries the last q_len of k_len positions.

    Query i stands at position k_len - q_len + i (the earlier keys come from a
    cache); key j at position j. The causal mask and the relative position biases
    (`aiayn.nn.positions`) share this alignment.

    Returns:
        (T, S) long: entry (i, j) is j - (k_len - q_len + i); negative for earlier keys.

    Raises:
        ValueError: unless 0 <= q_len <= k_len.
    """
    if not 0 <= q_len <= k_len:
        raise ValueError(f"need 0 <= q_len <= k_len, got q_len={q_len}, k_len={k_len}")
    query_position = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    key_position = torch.arange(k_len, device=device)[None, :]
    return key_position - query_position


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
    return relative_positions(q_len, k_len, device) <= 0
