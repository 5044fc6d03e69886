"""Recall and copying tasks: synthetic sequences that only a model able to look far back solves.

Multi-query associative recall (MQAR; Arora et al. 2023, "Zoology: Measuring and
Improving Recall in Efficient Language Models", section 3 and their code's
`multiquery_ar`): N key-value pairs, then the keys again, one at a time, in a stretch
of filler; at each query the answer is the value paired with that key.

    inputs   k1 v1 k2 v2 k3 v3 | 0  k2 0  0  k1 0  0  0  k3 0  0  0
    targets  .  .  .  .  .  .  | .  v2 .  .  v1 .  .  .  v3 .  .  .

Zoology's setup, which `MQARConfig` follows: keys are drawn without repeats from
1 ... V/2 - 1 and values from V/2 ... V - 1 (so a key is never a value); every key is
queried once; the queries stand at even offsets 2g after the 2N pair tokens, the gaps
g drawn without repeats from 0 ... (L - 2N)/2 - 1 with probability proportional to
(g + 1)^(a - 1), a = `power_a` (their 0.01: a power law, most queries soon after the
pairs, as a repeated bigram in text is most often repeated soon); the rest is filler
token 0 (their `random_non_queries=False`, as in their Figure 2's runs), or random
tokens (`random_non_queries=True`). Their Figure 2 uses V = 8,192 and
(L, N) = (64, 4), (128, 8), (256, 16), (512, 64), two layers, widths 64 ... 512;
their first release's defaults were V = 64, L = 64, N = 8, the scale of a CPU run.

The targets stand at the positions of the inputs they answer (the value at the query's
own position, -100 = `IGNORE` elsewhere, which `torch.nn.functional.cross_entropy`
skips): a causal model predicts the value from the query and what came before it, and
a bidirectional one cannot read the answer either, since no value follows a query.

Copying (`CopyConfig`): n data tokens, then n markers at which the model must output
them in order.

    selective:  .  a  .  .  b  .  c  .  .  d  |  >  >  >  >      (random positions)
    distance:   a  b  c  d  .  .  .  .  .  .  |  >  >  >  >      (a fixed delay)
    targets:    .  .  .  .  .  .  .  .  .  .  |  a  b  c  d

Copying over a distance is the copy-memory task (Hochreiter and Schmidhuber 1997;
Arjovsky et al. 2016, section 4.1: the tokens first, a delay of blanks, then the
recall): the answer lies a fixed distance back. Selective copying (Gu and Dao 2023,
"Mamba", section 3.1) spreads the tokens at random positions among the blanks, so no
fixed offset finds them: the model has to select by content.

Token ids: 0 is the filler / blank (`FILLER`); the copying tasks' marker is 1
(`MARKER`) and their data tokens 2 ... V - 1. A model for these tasks needs a padding
id outside them (`ModelConfig(pad_id=...)`, e.g. V with a vocabulary of V + 1), since
aiayn's default padding id is 0.

Every generator takes a seed and gives the same batch for it, on any machine (torch's
CPU generator).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

FILLER = 0  # MQAR's filler between queries, the copying tasks' blank
MARKER = 1  # the copying tasks' "output the next token here"
IGNORE = -100  # a target position that is not scored (cross_entropy's ignore_index)


@dataclass(frozen=True)
class MQARConfig:
    """How MQAR sequences are drawn (Zoology's `multiquery_ar`; see the module docstring).

    Args:
        vocab_size: V, even: keys 1 ... V/2 - 1, values V/2 ... V - 1, filler 0.
            (Zoology's later code also asks V > L, which nothing here needs.)
        seq_len: L, even.
        num_pairs: N key-value pairs, all queried once; 4 N <= L and N <= V/2 - 1.
        power_a: a in (0, 1]: query gap g has probability proportional to
            (g + 1)^(a - 1); 1 spreads the queries uniformly over the query stretch.
        random_non_queries: the filler positions get random tokens 0 ... V - 1 rather
            than 0 (Zoology's option; their Figure 2 runs without it).

    Raises:
        ValueError: a setting out of range, naming it and the rule.
    """

    vocab_size: int = 64
    seq_len: int = 64
    num_pairs: int = 8
    power_a: float = 0.01
    random_non_queries: bool = False

    def __post_init__(self) -> None:
        if self.seq_len < 4 or self.seq_len % 2:
            raise ValueError(f"MQARConfig.seq_len must be even and >= 4, got {self.seq_len}")
        if self.vocab_size % 2 or self.vocab_size < 4:
            raise ValueError(f"MQARConfig.vocab_size must be even and >= 4, got {self.vocab_size}")
        if self.num_pairs < 1 or 4 * self.num_pairs > self.seq_len:
            raise ValueError(
                f"MQARConfig.num_pairs must be >= 1 with 4 * num_pairs <= seq_len "
                f"({self.seq_len}), got {self.num_pairs}"
            )
        if self.num_pairs > self.vocab_size // 2 - 1:
            raise ValueError(
                f"MQARConfig.num_pairs must be <= vocab_size / 2 - 1 "
                f"({self.vocab_size // 2 - 1} distinct keys), got {self.num_pairs}"
            )
        if not 0 < self.power_a <= 1:
            raise ValueError(f"MQARConfig.power_a must be in (0, 1], got {self.power_a}")


def _distinct(generator: torch.Generator, rows: int, low: int, high: int, count: int) -> Tensor:
    """(rows, count) int64: in each row `count` distinct integers from [low, high), in a
    uniformly random order."""
    return torch.rand(rows, high - low, generator=generator).argsort(dim=1)[:, :count] + low


def mqar(count: int, cfg: MQARConfig, seed: int) -> tuple[Tensor, Tensor]:
    """`count` MQAR sequences and their targets.

    Args:
        count: sequences B >= 1.
        cfg: the task's settings.
        seed: the random seed; the same (count, cfg, seed) gives the same tensors.

    Returns:
        (inputs, targets), both (B, L) int64: the pairs at positions 0 ... 2N - 1 (key at
        2i, its value at 2i + 1), each key again at one position 2N + 2g; targets hold
        the key's value at that position and `IGNORE` elsewhere.
    """
    if count < 1:
        raise ValueError(f"mqar: count must be >= 1, got {count}")
    generator = torch.Generator().manual_seed(seed)
    n, half, context = cfg.num_pairs, cfg.vocab_size // 2, 2 * cfg.num_pairs
    keys = _distinct(generator, count, 1, half, n)  # (B, N)
    values = _distinct(generator, count, half, cfg.vocab_size, n)  # (B, N)
    # N gaps without repeats, P(g) ~ (g + 1)^(a - 1): successive sampling, done at once
    # by adding Gumbel noise to the log-probabilities and keeping the N largest.
    space = (cfg.seq_len - context) // 2
    log_p = (cfg.power_a - 1) * torch.arange(1, space + 1, dtype=torch.float64).log()
    uniform = torch.rand(count, space, generator=generator, dtype=torch.float64)
    gumbel = -(-uniform.clamp_min(1e-300).log()).log()
    gaps = (log_p + gumbel).topk(n, dim=1).indices  # (B, N): pair i's gap
    inputs = torch.full((count, cfg.seq_len), FILLER, dtype=torch.long)
    if cfg.random_non_queries:
        inputs = torch.randint(cfg.vocab_size, (count, cfg.seq_len), generator=generator)
    inputs[:, 0:context:2], inputs[:, 1:context:2] = keys, values
    targets = torch.full((count, cfg.seq_len), IGNORE, dtype=torch.long)
    positions = context + 2 * gaps  # (B, N)
    inputs.scatter_(1, positions, keys)
    targets.scatter_(1, positions, values)
    return inputs, targets


@dataclass(frozen=True)
class CopyConfig:
    """How copying sequences are drawn (see the module docstring).

    Args:
        vocab_size: V >= 3: data tokens 2 ... V - 1, blank 0, marker 1.
        num_tokens: n tokens to copy (>= 1).
        context_len: C >= n positions that hold them (and blanks); n markers follow, so
            a sequence is C + n long.
        selective: the tokens at random positions among the C (selective copying);
            False: at positions 0 ... n - 1, then C - n blanks (copying over a distance).

    Raises:
        ValueError: a setting out of range, naming it.
    """

    vocab_size: int = 16
    num_tokens: int = 8
    context_len: int = 64
    selective: bool = True

    def __post_init__(self) -> None:
        if self.vocab_size < 3:
            raise ValueError(f"CopyConfig.vocab_size must be >= 3, got {self.vocab_size}")
        if not 1 <= self.num_tokens <= self.context_len:
            raise ValueError(
                f"CopyConfig needs 1 <= num_tokens <= context_len, got {self.num_tokens} "
                f"and {self.context_len}"
            )

    @property
    def seq_len(self) -> int:
        """C + n: the context, then the markers."""
        return self.context_len + self.num_tokens


def copying(count: int, cfg: CopyConfig, seed: int) -> tuple[Tensor, Tensor]:
    """`count` copying sequences (selective, or over a distance) and their targets.

    Args:
        count: sequences B >= 1.
        cfg: the task's settings.
        seed: the random seed; the same (count, cfg, seed) gives the same tensors.

    Returns:
        (inputs, targets), both (B, C + n) int64: the n data tokens among C positions,
        then n `MARKER`s; targets hold the data tokens, in order, at the markers'
        positions and `IGNORE` elsewhere.
    """
    if count < 1:
        raise ValueError(f"copying: count must be >= 1, got {count}")
    generator = torch.Generator().manual_seed(seed)
    n, c = cfg.num_tokens, cfg.context_len
    tokens = torch.randint(2, cfg.vocab_size, (count, n), generator=generator)  # (B, n)
    if cfg.selective:
        positions = _distinct(generator, count, 0, c, n).sort(dim=1).values  # (B, n)
    else:
        positions = torch.arange(n).expand(count, n)
    inputs = torch.full((count, c + n), FILLER, dtype=torch.long)
    inputs.scatter_(1, positions, tokens)
    inputs[:, c:] = MARKER
    targets = torch.full((count, c + n), IGNORE, dtype=torch.long)
    targets[:, c:] = tokens
    return inputs, targets
