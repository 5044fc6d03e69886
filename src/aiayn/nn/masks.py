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


def prefix_mask(prefix_lengths: Tensor, q_len: int, k_len: int) -> Tensor:
    """A prefix LM's self-attention pattern (T5's and UniLM's): the first P positions of a
    row see each other both ways; every other position sees the keys up to its own.

    The queries are the last q_len of k_len positions (as in `causal_mask`).

    Args:
        prefix_lengths: (B,) P of each row (0: plain causal attention).

    Returns:
        (B, 1, T, S) bool, True = may attend.
    """
    device = prefix_lengths.device
    query_position = torch.arange(q_len, device=device) + (k_len - q_len)  # (T,)
    key_position = torch.arange(k_len, device=device)  # (S,)
    causal = key_position[None, :] <= query_position[:, None]  # (T, S)
    prefix = prefix_lengths[:, None, None]  # (B, 1, 1)
    both_in_prefix = (query_position[None, :, None] < prefix) & (key_position[None, None] < prefix)
    return (causal[None] | both_in_prefix)[:, None]  # (B, 1, T, S)
