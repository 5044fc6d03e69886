"""Continuous batching: sentences join and leave a table of slots at every step.

    engine = Engine(model, DecodeConfig(beam=4), sentences=16)
    for index, hypotheses in engine.run(rows):        # rows: source (or prompt) id lists
        ...                                           # in the order they finish

Why: a batch of the search (`aiayn.inference.search`) lives as long as its longest
sentence, so its finished rows idle and new sentences wait for the whole batch.
Here (iteration-level batching, as Orca (OSDI 2022) and vLLM (SOSP 2023) schedule)
the engine owns a `StaticStep` of `sentences` x beam slots, in groups of `beam`
consecutive slots, one group per sentence:

- a new sentence takes a free group at the next step boundary: its source is encoded
  and its cross-attention keys and values written once for the group's slots (a
  decoder-only model's prompt runs once and fills them);
- every step is one call of the step over all slots (fixed shapes: compiled once),
  then the search's bookkeeping for every live group at once, each at its own step;
- beam search's reorder moves hypotheses between the slots of one group: a parent's
  first child keeps its slot, a further child takes a childless parent's slot and
  copies its parent's keys and values from where their prefixes differ (`_beam_slots`);
- a finished sentence frees its group at once; its result is returned by that step.

Every sentence is decoded exactly as `aiayn.inference.search` decodes it alone (the
same rules, length limits and length penalty, float32 scores): greedy (beam 1), beam
search and sampling. Sampling draws from one generator for the whole table, so a
sentence's sample depends on what shares the table with it (as in a batch of
`sample`); the run as a whole is reproducible from its seed and arrival order.

Shape legend: G groups (sentences decoded at once), K beam (slots per group), N = G K
slots, n live groups, P n-best kept, L longest output, V vocabulary.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from aiayn.config import EarlyStopping
from aiayn.inference.search import (
    NEG_INF,
    DecodeConfig,
    Finished,
    Hypothesis,
    apply_rules,
    greedy_pick,
    length_penalty,
    max_output_lengths,
    normalised,
    sampling_picker,
    top_candidates,
)
from aiayn.inference.static_step import StaticStep
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import Transformer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Done:
    """A sentence the engine finished.

    Attributes:
        request: the number `submit` gave it.
        hypotheses: up to `nbest` of them, best first (as `search` returns per sentence).
    """

    request: int
    hypotheses: list[Hypothesis]


class Engine:
    """A table of slots that sentences join and leave at every step (see the module).

    Args:
        model: a `Transformer` or `DecoderOnly` (literal or frozen), in eval mode.
        config: how every sentence is searched (`DecodeConfig`).
        sentences: G, sentences decoded at once (the table holds G x beam slots).
        max_target, max_source: the slots' positions (see `StaticStep`); a sentence
            whose longest output does not fit `max_target` is refused by `submit`.
        compile: compile the step ahead of time (`StaticStep.compile` with AOTInductor)
            before the first sentence.

    Raises:
        ValueError: what `StaticStep` refuses, or sentences < 1.
    """

    def __init__(
        self,
        model: Transformer | DecoderOnly,
        config: DecodeConfig,
        sentences: int,
        max_target: int | None = None,
        max_source: int | None = None,
        compile: bool = False,
    ) -> None:
        if sentences < 1:
            raise ValueError(f"sentences must be >= 1, got {sentences}")
        self.cfg = model.cfg
        self.k = slots_per_sentence(config)
        self.groups = sentences
        # a group's k slots share its sentence's source (stored once, attended together)
        self.step = StaticStep(model, sentences * self.k, max_target, max_source, group=self.k)
        if compile:  # AOTInductor: no guards checked per call (bench_static_step.py)
            self.step.compile(log_probs=True, ahead_of_time=True)
        self.score_dtype = torch.float64 if self.step.dtype == torch.float64 else torch.float32
        self._queue: deque[tuple[int, Tensor]] = deque()
        self._next_request = 0
        self.live = torch.zeros(sentences, dtype=torch.bool, device=self.step.device)
        self.configure(config)  # sets the search's bookkeeping and the table

    def configure(self, config: DecodeConfig) -> None:
        """Search the sentences submitted from now on as `config` says, in the same slots.

        The slots (and their compiled step) depend only on `slots_per_sentence(config)`,
        so a table serves every config of that width: the length penalty, n-best,
        length limits, token rules and sampling options are only bookkeeping.

        Raises:
            ValueError: while sentences are queued or decoded, or for a config of
                another width (naming both).
        """
        if slots_per_sentence(config) != self.k:
            raise ValueError(
                f"the table holds {self.k} slots per sentence; a config of "
                f"{slots_per_sentence(config)} needs another Engine"
            )
        if not self.idle:
            raise ValueError("configure needs an idle engine: sentences are still in its table")
        self.config = config
        self.rules = config.rules
        self.exact = config.early_stopping is EarlyStopping.EXACT
        self.n_keep = config.nbest if self.exact else self.k
        self._picker = (
            sampling_picker(
                config.temperature,
                config.top_k,
                config.top_p,
                torch.Generator(device=self.step.device).manual_seed(config.seed),
            )
            if config.sampling
            else greedy_pick
        )
        self._reset_table()

    def _reset_table(self) -> None:
        g, k, device = self.groups, self.k, self.step.device
        longest = self.step.max_target
        self.request = [-1] * g  # each group's request, -1 when free
        self.live = torch.zeros(g, dtype=torch.bool, device=device)
        self.t = torch.zeros(g, dtype=torch.long, device=device)  # the step each group is at
        self.offset = torch.zeros(g, dtype=torch.long, device=device)  # position of step 1
        self.max_out = torch.ones(g, dtype=torch.long, device=device)
        self.tokens = torch.full(
            (g, k, longest + 1), self.cfg.pad_id, dtype=torch.long, device=device
        )
        self.scores = torch.zeros(g, k, dtype=self.score_dtype, device=device)
        self.finished = Finished.empty(
            g, self.n_keep, longest, self.cfg.pad_id, self.score_dtype, device
        )
        self.first_logits = torch.zeros(0)  # a decoder-only prompt's, for its first step
        self.slot_tokens = torch.full((g * k,), self.cfg.pad_id, dtype=torch.long, device=device)
        # the slot each group's row (hypothesis) lives in: one of the group's own k, moved
        # by beam search's reorder (`_beam_slots`)
        self.row_slot = torch.arange(g * k, device=device).view(g, k)

    # ----- the queue --------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No sentence is queued or being decoded."""
        return not self._queue and not bool(self.live.any())

    @property
    def free_groups(self) -> int:
        """Groups free for new sentences now."""
        return self.groups - int(self.live.sum())

    @property
    def queued(self) -> int:
        """Sentences waiting for a group."""
        return len(self._queue)

    def submit(self, ids: Sequence[int] | Tensor) -> int:
        """Queue a source (encoder-decoder: ids ending in eos) or a prompt (decoder-only).

        Returns:
            The request's number (0, 1, ... in submission order), which `Done` carries.

        Raises:
            ValueError: empty ids, or ids whose decoding does not fit the slots.
        """
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.step.device).view(-1)
        limit = self.step.max_source if self.step.cross else self.step.max_target - 1
        if not 1 <= ids.numel() <= limit:
            raise ValueError(f"ids must hold 1 to {limit} tokens, got {ids.numel()}")
        if self.step.cross:  # the output's longest, as the search reckons it
            length, offset = int((ids != self.cfg.pad_id).sum()), 0
        else:
            length, offset = ids.numel(), ids.numel() - 1
        longest = int(self._max_out(torch.tensor([length])))
        if offset + longest > self.step.max_target:
            raise ValueError(
                f"an output of up to {longest} tokens after {offset} positions does not fit "
                f"the slots' max_target={self.step.max_target}"
            )
        request = self._next_request
        self._next_request += 1
        self._queue.append((request, ids))
        return request

    def cancel(self, request: int) -> bool:
        """Drop a request, queued or being decoded (its group is freed at once).

        Returns:
            Whether it was found.
        """
        for i, (queued, _) in enumerate(self._queue):
            if queued == request:
                del self._queue[i]
                return True
        if request in self.request:
            group = self.request.index(request)
            self.request[group] = -1
            self._free(torch.tensor([group], device=self.live.device))
            return True
        return False

    def run(self, rows: Iterable[Sequence[int]]) -> Iterator[Done]:
        """Decode every row, streaming them through the table; yield each as it finishes.

        Rows are taken from `rows` only as groups free up, so a long iterator streams.

        Yields:
            `Done` per row, `request` being its index in `rows` (when nothing else
            was submitted before).
        """
        rows = iter(rows)
        exhausted = False
        while True:
            while not exhausted and self.queued < self.free_groups:
                row = next(rows, None)
                if row is None:
                    exhausted = True
                else:
                    self.submit(row)
            if self.idle:
                return
            yield from self.advance()

    # ----- one step -----------------------------------------------------------------

    @torch.no_grad()
    def advance(self) -> list[Done]:
        """One step boundary: admit queued sentences to free groups, then one step of
        every live group.

        Returns:
            The sentences finished by this step (their groups are free again).
        """
        self._admit()
        if not bool(self.live.any()):
            return []
        k = self.k
        live = self.live.nonzero().squeeze(1)  # (n,)
        t = self.t[live]  # (n,) each group's step
        last = self.tokens[live, :, :].gather(2, (t - 1)[:, None, None].expand(-1, k, 1))
        slots = self.row_slot[live].view(-1)  # (n K,) the rows' slots, in row order
        self.slot_tokens[slots] = last.view(-1)
        # a prompt's step 1 feeds nothing: its slots write junk at position T, which
        # step 2 overwrites (not at T - 1, the prompt's own)
        step = self.t if self.step.cross else self.t.clamp(min=2)
        positions = (self.offset + step - 1).clamp(0, self.step.max_target - 1)  # (G,)
        # a free group stands at 0, so that an eager step attends no further than the
        # live groups' positions (its junk there is overwritten before it is read)
        positions = positions.masked_fill(~self.live, 0)
        # an eager step runs the slots up to the last live group's (groups are taken
        # lowest first, so a light load stays in the first rows); a compiled one, all
        rows = (int(live[-1]) + 1) * k if self.step.trim else self.step.slots
        log_probs = self.step.log_probs(  # (n K, V): the live rows, in row order
            self.slot_tokens[:rows], positions.repeat_interleave(k)[:rows], order=slots
        )
        if self.first_logits.numel():  # a prompt's own logits at its first step
            first = (t == 1).repeat_interleave(k)
            if bool(first.any()):
                from_prompt = self.first_logits.index_select(0, slots)[first]
                log_probs[first] = normalised(self.cfg, from_prompt).to(log_probs.dtype)
        at_limit = (self.max_out[live] == t).repeat_interleave(k)
        # only eos may follow where some row is at its limit (no (n K, V) mask otherwise)
        log_probs = apply_rules(
            self.cfg, log_probs, self.rules, at_limit if bool(at_limit.any()) else None
        )
        if k == 1 or self.config.sampling:
            done = self._one_path(live, t, log_probs)
        else:
            done = self._beam(live, t, log_probs)
        self.t[live] += 1
        return done

    def _admit(self) -> None:
        """Queued sentences take free groups, in arrival order."""
        free = (~self.live).nonzero().squeeze(1).tolist()
        taken: list[tuple[int, int, Tensor]] = []
        while free and self._queue:
            request, ids = self._queue.popleft()
            taken.append((free.pop(0), request, ids))
        if not taken:
            return
        k, device, cfg = self.k, self.step.device, self.cfg
        groups = torch.tensor([group for group, _, _ in taken], device=device)
        self.row_slot[groups] = groups[:, None] * k + torch.arange(k, device=device)
        slots = self.row_slot[groups].view(-1)
        if self.step.cross:
            width = max(ids.numel() for _, _, ids in taken)
            src = torch.full((len(taken), width), cfg.pad_id, dtype=torch.long, device=device)
            for row, (_, _, ids) in enumerate(taken):
                src[row, : ids.numel()] = ids
            input_lengths = self.step.load_source(slots, src, k)
            self.offset[groups] = 0
        else:  # prompts of different lengths run one by one (they have no padding)
            input_lengths = torch.tensor([ids.numel() for _, _, ids in taken], device=device)
            if not self.first_logits.numel():
                self.first_logits = torch.zeros(
                    self.step.slots, cfg.vocab_size, dtype=self.step.dtype, device=device
                )
            for row, (_, _, ids) in enumerate(taken):
                own = slots[row * k : (row + 1) * k]
                self.first_logits[own] = self.step.load_prompt(own, ids[None], k).to(
                    self.first_logits.dtype
                )
            self.offset[groups] = input_lengths - 1  # step t feeds position T + t - 2
        max_out = self._max_out(input_lengths)
        for group, request, _ in taken:
            self.request[group] = request
        self.live[groups] = True
        self.t[groups] = 1
        self.max_out[groups] = max_out
        self.tokens[groups] = cfg.pad_id
        self.tokens[groups, :, 0] = cfg.bos_id
        self.scores[groups] = NEG_INF
        self.scores[groups, 0] = 0.0  # all beams start equal: keep one
        fresh = Finished.empty(len(taken), self.n_keep, self.step.max_target, cfg.pad_id,
                               self.score_dtype, device)  # fmt: skip
        _put(self.finished, groups, fresh)

    def _one_path(self, live: Tensor, t: Tensor, log_probs: Tensor) -> list[Done]:
        """Greedy search and sampling (`aiayn.inference.search._one_path_search`): each
        live group's one row takes the token `pick` chooses."""
        chosen = self._picker(log_probs)  # (n,)
        self.tokens[live, 0, :] = self.tokens[live, 0, :].scatter(1, t[:, None], chosen[:, None])
        gained = log_probs.gather(1, chosen[:, None]).squeeze(1).to(self.score_dtype)
        self.scores[live, 0] += gained
        ended = chosen == self.cfg.eos_id
        if not bool(ended.any()):
            return []
        done = []
        for group, row in zip(live[ended].tolist(), self.tokens[live[ended], 0, 1:].tolist(),
                              strict=True):  # fmt: skip
            log_prob = float(self.scores[group, 0])
            tokens = [i for i in row[: row.index(self.cfg.eos_id)] if i != self.cfg.pad_id]
            done.append(Done(self.request[group], [Hypothesis(tokens, log_prob, log_prob)]))
            self.request[group] = -1
        self._free(live[ended])
        return done

    def _beam(self, live: Tensor, t: Tensor, log_probs: Tensor) -> list[Done]:
        """One step of beam search (`aiayn.inference.search.beam_search`'s loop body) for
        every live group at its own step `t`."""
        cfg, k, config = self.cfg, self.k, self.config
        n, vocab, width = live.numel(), cfg.vocab_size, self.tokens.size(2)
        scores, tokens = self.scores[live], self.tokens[live]  # (n, K), (n, K, L + 1)
        fed = tokens  # the rows' prefixes so far (their keys and values are in the slots)
        candidates = log_probs.view(n, k, vocab).add_(scores[:, :, None]).view(n, -1)
        top_scores, top_index = top_candidates(candidates, 2 * k)  # (n, 2K), best first
        parent, token = top_index // vocab, top_index % vocab
        ends = token == cfg.eos_id

        finished = self.finished.select(live)
        finishing = ends[:, :k] & (top_scores[:, :k] > NEG_INF)
        if bool(finishing.any()):
            new_tokens = tokens.gather(1, parent[:, :k, None].expand(-1, -1, width))
            new_tokens = new_tokens[:, :, 1:].clone()  # (n, K, L) without bos
            new_tokens.scatter_(2, (t - 1)[:, None, None].expand(-1, k, 1), cfg.eos_id)
            penalty = self._penalty(t)
            new_scores = top_scores[:, :k] / penalty[:, None]
            finished.add(new_tokens, new_scores, top_scores[:, :k], finishing)

        live_scores, pick = top_scores.masked_fill(ends, NEG_INF).topk(k, dim=1)  # (n, K)
        live_parent = parent.gather(1, pick)
        tokens = tokens.gather(1, live_parent[:, :, None].expand(-1, -1, width))
        tokens.scatter_(2, t[:, None, None].expand(-1, k, 1), token.gather(1, pick)[:, :, None])
        scores = live_scores

        max_out = self.max_out[live]
        if self.exact or config.early_stopping is EarlyStopping.NEVER:  # as the search's lp_longest
            lp_now = length_penalty(
                max_out.to(self.score_dtype), config.alpha, config.length_penalty
            )
        else:
            lp_now = self._penalty(t)
        done = finished.settled(scores[:, 0] / lp_now, k, self.exact) | (max_out <= t)

        self.scores[live], self.tokens[live] = scores, tokens
        _put(self.finished, live, finished)
        # beam search's reorder, within each group's slots, for the groups going on:
        # each parent's first child stays in its slot, the others take childless
        # parents' slots and copy their parent's keys and values
        going = ~done
        slots, copied, parent_slots, replaced = _beam_slots(self.row_slot[live], live_parent)
        self.row_slot[live] = slots
        moved = copied & going[:, None]
        if bool(moved.any()):
            group, row = moved.nonzero(as_tuple=True)  # (M,) each copy's group and row
            # the keys and values of a position depend on the tokens up to it: where the
            # prefix the slot held and the parent's first differ, the copy starts
            ours = fed[group, replaced[group, row]]  # (M, L + 1)
            theirs = fed[group, live_parent[group, row]]
            steps = t[group]
            differ = (ours != theirs) & (
                torch.arange(ours.size(1), device=ours.device) < steps[:, None]
            )
            first = torch.where(differ.any(dim=1), differ.int().argmax(dim=1), steps)
            offset = self.offset[live][group]
            self.step.copy_ranges(
                slots[group, row], parent_slots[group, row], offset + first, offset + steps
            )
        if not bool(done.any()):
            return []
        results = finished.select(done).nbest_lists(config.nbest, cfg.eos_id, cfg.pad_id)
        out = []
        for group, hypotheses in zip(live[done].tolist(), results, strict=True):
            out.append(Done(self.request[group], hypotheses))
            self.request[group] = -1
        self._free(live[done])
        return out

    def _free(self, groups: Tensor) -> None:
        """`groups` (left by their sentences) are free, and their slots of the step empty."""
        self.live[groups] = False
        if self.step.cross:
            self.step.release(self.row_slot[groups].view(-1))

    def _max_out(self, input_lengths: Tensor) -> Tensor:
        """(B,) longest outputs, as the search allows them (`max_output_lengths`)."""
        return max_output_lengths(
            input_lengths, self.config.extra_len, self.cfg.max_len, self.config.max_output_len
        ).to(self.step.device)

    def _penalty(self, length: Tensor) -> Tensor:
        """(n,) length penalties in the scores' dtype, as the search divides by them."""
        penalty = length_penalty(length.double(), self.config.alpha, self.config.length_penalty)
        return penalty.to(self.score_dtype)


def slots_per_sentence(config: DecodeConfig) -> int:
    """K, the slots one sentence takes in a table searching with `config` (its beam; one
    when sampling)."""
    return 1 if config.sampling else config.beam


def _beam_slots(slots: Tensor, parent: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Beam search's reorder as slot moves, with as few copies as the parents allow.

    Row j of a group (its j-th hypothesis) continues row `parent[j]`, which lives in
    slot `slots[parent[j]]`. A parent's first child takes over its slot as it is;
    each further child takes the slot of a parent that has no child (there are as many
    of those as further children) and needs its parent's keys and values copied in.
    The slots copied into are childless parents' and the slots copied from are parents
    with a child: no slot is both.

    Args:
        slots: (n, K) the slot of each group's row.
        parent: (n, K) each new row's parent row, in [0, K).

    Returns:
        (n, K) each new row's slot, (n, K) bool where it must be copied into, (n, K)
        the slot of its parent (where it is copied from), and (n, K) for a copied row
        the old row whose slot it takes (a parent left without children).
    """
    k = parent.size(1)
    parent_slots = slots.gather(1, parent)
    earlier = torch.ones(k, k, dtype=torch.bool, device=parent.device).tril(-1)  # j' < j
    # (n, K): another row before j continues the same parent
    copied = ((parent[:, :, None] == parent[:, None, :]) & earlier).any(dim=2)
    has_child = torch.zeros_like(copied).scatter_(1, parent, True)
    # the r-th further child takes the r-th childless parent's slot (stable sorts put
    # them first, in order)
    children = torch.sort(copied.to(torch.uint8), dim=1, descending=True, stable=True)[1]
    childless = torch.sort(has_child.to(torch.uint8), dim=1, stable=True)[1]
    replaced = torch.empty_like(parent).scatter_(1, children, childless)
    taken = slots.gather(1, replaced)
    return torch.where(copied, taken, parent_slots), copied, parent_slots, replaced


def _put(into: Finished, rows: Tensor, other: Finished) -> None:
    """Store `other`'s rows at `rows` of `into`, their counts included."""
    into.put(rows, other)
    into.count[rows] = other.count
