"""A decoding step of fixed shapes: one call per step over a table of slots.

    step = StaticStep(model, slots=32)          # caches preallocated, nothing compiled yet
    step.load_source(slots, src)                # encoder-decoder: cross-attention keys/values
    logits = step.logits(tokens, positions)     # (slots, V): every layer and the projection
    step.compile(ahead_of_time=True)            # optional: AOTInductor, once per process

    fast = StaticDecoder(model, slots=32)       # what the search drives (`start`)
    beam_search(fast, src)                      # the same outputs as beam_search(model, src)

Why: the incremental decoder of `aiayn.inference.decoding` grows its caches and feeds
Python ints (the cache's length) to the positions, so every step is dozens of small
PyTorch calls whose shapes change, which no compiler can turn into one program. Here
everything a step reads has a fixed shape for a given number of slots (Hugging Face's
"static cache" makes the same trade):

- each slot's self-attention keys and values are preallocated up to `max_target`
  positions, (slots, Hkv, L, Dk) per layer; a step writes its keys at each slot's own
  position (`scatter_`) and attends all L with a mask of the positions written so far;
- positions are a (slots,) tensor, not a Python int, so slots may stand at different
  positions (continuous batching, `aiayn.inference.engine`): position vectors, rotary
  angles and attention biases are rows of tables made once;
- an encoder-decoder's cross-attention keys and values are computed once per source
  (`load_source`) and stored per slot, (slots, Hkv, S, Dk) with S = `max_source`, with
  the source's padding as a mask;
- a decoder-only model's prompt runs once through the model itself (`load_prompt`:
  a prefix LM's bidirectional prefix included), and its keys and values are copied in.

`StaticStep.logits` (and `log_probs`: the search's log-softmax in the same call) is one
function of fixed shapes: `compile()` hands it to `torch.compile` (Inductor; its C++
backend on the CPU) or, ahead of time, to AOTInductor (`torch.export`, then a shared
library called without Python in between: what the apps' `--compile` runs); either
compiles once per process and slot count. The weights are the model's own: a literal
`Transformer` / `DecoderOnly` (any float dtype) or its frozen form
(`aiayn.inference.frozen.freeze`: stacked products, bfloat16, int8 `Int8Linear`). The
compiled step multiplies by plain copies of oneDNN-packed weights, which do not trace.

The attention itself is the kernel's (`aiayn.nn.kernels.Kernel.attend_slots`): the step
keeps the slots' stores and says, per span of slots, how far each attends (`SlotSpan`);
the sub-layers' projections, rotation and kernel calls over the slots are
`aiayn.inference.slot_attention`'s.
What is not covered, and refused with a ValueError naming it: kernels that do not
declare `static_step` (a sliding window or linear attention keeps other state), rotary
schemes other than `RotaryPositions`, and token types in the decoder.

Shape legend: N slots, L target positions (`max_target`), S source positions
(`max_source`), D d_model, H heads, Hkv key/value heads, Dk / Dv head sizes, V vocabulary.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from aiayn.config import ModelConfig
from aiayn.inference.decoding import new_cache
from aiayn.inference.frozen_products import Int8Linear
from aiayn.inference.scoring import normalised
from aiayn.inference.slot_attention import (
    SlotAttention,
    cross_keys_values,
    cross_spans,
    kv_sizes,
    self_spans,
)
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_decoder import Transformer, check_ids
from aiayn.nn.kernels import KERNELS, SlotSpan
from aiayn.nn.positions.rotary import RotaryPositions

log = logging.getLogger(__name__)


def has_slow_int8_products(model: nn.Module) -> bool:
    """Whether a compiled step of `model` would multiply in int8 without VNNI.

    A compiled step multiplies its `Int8Linear` weights by `torch._int_mm`
    (`int8_product`), whose CPU kernel is fast only with VNNI: on an AVX2-only EPYC
    a 32-row step of the small shape took 218 ms compiled against 13.7 eager
    (`benchmarks/results/step-small-int8.json`). `StaticStep.compile` warns there.
    """
    return not torch.cpu._is_vnni_supported() and any(
        isinstance(module, Int8Linear) for module in model.modules()
    )


class StaticStep:
    """The decoder of `model` as one step of fixed shapes over `slots` rows (see the module).

    Args:
        model: a `Transformer` or `DecoderOnly` (or `PrefixLM`), literal or frozen, in
            eval mode; its weights are used, not copied.
        slots: N, rows decoded by every step.
        max_target: L, positions each slot's self-attention holds (default and most:
            `cfg.max_len`).
        max_source: S, source positions each slot's cross-attention holds (an
            encoder-decoder's; default and most: `cfg.max_len`).
        group: slots that share a source, in groups of `group` consecutive slots (beam
            search's hypotheses of one sentence): its cross-attention keys and values
            are stored once per group, and the group's queries attend them together
            (as `aiayn.inference.frozen.FrozenCrossAttention` shares them); 1: every
            slot its own. A group's sentence is loaded into the whole group.

    Raises:
        ValueError: another model shape, a kernel or position scheme the step does not
            cover, or sizes out of range (naming them).
    """

    def __init__(
        self,
        model: Transformer | DecoderOnly,
        slots: int,
        max_target: int | None = None,
        max_source: int | None = None,
        group: int = 1,
    ) -> None:
        if not isinstance(model, Transformer | DecoderOnly):
            raise ValueError(
                f"{type(model).__name__} has no decoder to step: StaticStep takes a "
                "Transformer or a DecoderOnly model"
            )
        cfg: ModelConfig = model.cfg
        self.cfg = cfg
        self.model = model
        self.cross = isinstance(model, Transformer)
        self.max_target = _checked_size(max_target, cfg.max_len, "max_target")
        self.max_source = _checked_size(max_source, cfg.max_len, "max_source") if self.cross else 0
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if group < 1 or slots % group:
            raise ValueError(f"group must be >= 1 and divide slots={slots}, got {group}")
        self.slots, self.group = slots, group
        sources = slots // group  # what the cross-attention stores hold: one per group
        decoder = model.decoder
        embedding = decoder.embedding
        if embedding.token_types is not None:
            raise ValueError("StaticStep does not cover token types in the decoder")
        positions = embedding.positions
        if positions.rotary and not isinstance(positions, RotaryPositions):
            raise ValueError(
                f"StaticStep rotates by RotaryPositions only, not {type(positions).__name__}"
            )
        for i, layer in enumerate(decoder.layers):
            for attention in (layer.self_attn, getattr(layer, "cross_attn", None)):
                kernel = getattr(attention, "kernel", None)
                if attention is not None and not getattr(kernel, "static_step", False):
                    covered = ", ".join(name for name, kind in KERNELS.items() if kind.static_step)
                    raise ValueError(
                        f"decoder layer {i} attends with {type(kernel).__name__}, which does "
                        f"not declare static_step: StaticStep covers the kernels that do "
                        f"({covered})"
                    )
        param = next(iter(model.decoder.embedding.tokens.parameters()))
        self.dtype, self.device = param.dtype, param.device
        with torch.no_grad():
            table = positions.embeddings(self.max_target, 0)  # (L, D) or None
            self.position_table = None if table is None else table.detach()
            bias = positions.attention_bias(self.max_target, self.max_target)  # (H, L, L)
            self.bias_table = None if bias is None else bias.detach().to(self.dtype)
        self.rotary = positions if positions.rotary else None
        self.n_layers = len(decoder.layers)
        self.self_keys: list[Tensor] = []
        self.self_values: list[Tensor] = []
        self.cross_keys: list[Tensor] = []
        self.cross_values: list[Tensor] = []
        for layer in decoder.layers:
            heads, size_k, size_v = kv_sizes(layer.self_attn)
            shape = (slots, heads, self.max_target)
            self.self_keys.append(self._zeros(*shape, size_k))
            self.self_values.append(self._zeros(*shape, size_v))
            if self.cross:
                heads, size_k, size_v = kv_sizes(layer.cross_attn)
                shape = (sources, heads, self.max_source)
                self.cross_keys.append(self._zeros(*shape, size_k))
                self.cross_values.append(self._zeros(*shape, size_v))
        # (N / group, S) True at real source tokens; all False in an empty group
        self.source_mask = torch.zeros(
            sources, self.max_source, dtype=torch.bool, device=self.device
        )
        # the step by what it returns (log-probabilities or not): eager until `compile`
        self._steps: dict[bool, Callable[[Tensor, Tensor], Tensor]] = {
            False: self._logits,
            True: self._log_probs,
        }
        self._compiled: set[bool] = set()  # the keys of `_steps` compiled
        self.compile_seconds: float | None = None
        # Eager steps attend only the positions written so far (the stores' prefix up to
        # the furthest slot, and the furthest source of the slots run): views, the same
        # values. A compiled step keeps the fixed shapes it was compiled for.
        self.trim = True
        # (N / group,) how far each group's source reaches (0: none): an eager step
        # attends the furthest of the slots it runs, not the longest source ever loaded
        self.source_ends = torch.zeros(sources, dtype=torch.long, device=self.device)
        # the sub-layers' arithmetic over the slots (rotation, products, kernel calls)
        self.attention = SlotAttention(self.rotary)

    def _zeros(self, *shape: int) -> Tensor:
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    # ----- what goes into the slots ------------------------------------------------

    @torch.no_grad()
    def load_source(self, slots: Tensor, src: Tensor, beam: int = 1) -> Tensor:
        """Encode sources and store their cross-attention keys and values in `slots`.

        Args:
            slots: (B x beam,) the slots to fill, each sentence's `beam` consecutive.
            src: (B, S') source ids, padded with `cfg.pad_id`, S' <= `max_source`.
            beam: slots per sentence (its hypotheses share its source); with `group` > 1,
                `group` itself, each sentence's slots one whole group.

        Returns:
            (B,) the sources' real tokens (eos included).

        Raises:
            ValueError: a decoder-only model, a source longer than `max_source`, or
                slots that are not whole groups.
        """
        if not self.cross:
            raise ValueError("a decoder-only model has no source: load_prompt fills its slots")
        check_ids(src, "source", self.max_source)
        batch = src.size(0)
        if self.group == 1:  # every slot its own copy
            targets = slots
            rows = torch.arange(batch, device=src.device).repeat_interleave(beam)
        else:
            owners = slots.view(-1) // self.group
            if beam != self.group or owners.numel() != batch * beam:
                raise ValueError(
                    f"the step's slots share sources in groups of {self.group}: give "
                    f"{self.group} slots per sentence, not {beam}"
                )
            targets = owners.view(batch, beam)[:, 0]
            if not bool((owners.view(batch, beam) == targets[:, None]).all()):
                raise ValueError(
                    f"each sentence's {beam} slots must make one group of {self.group} "
                    f"consecutive slots, got {slots.tolist()}"
                )
            rows = torch.arange(batch, device=src.device)
        encoded = self.model.encode(src)
        length = src.size(1)
        for i, layer in enumerate(self.model.decoder.layers):
            keys, values = cross_keys_values(layer.cross_attn, encoded.hidden)  # (B, Hkv, S', D)
            self.cross_keys[i][targets] = 0
            self.cross_values[i][targets] = 0
            self.cross_keys[i][targets, :, :length] = keys.index_select(0, rows).to(self.dtype)
            self.cross_values[i][targets, :, :length] = values.index_select(0, rows).to(self.dtype)
        real = encoded.real_tokens.index_select(0, rows)  # (targets, S')
        self.source_mask[targets] = False
        self.source_mask[targets, :length] = real
        # one past each source's last real token (padding may only follow it)
        reach = torch.arange(1, length + 1, device=real.device)
        self.source_ends[targets] = (real * reach).amax(dim=1)
        return encoded.real_tokens.sum(dim=1)

    @torch.no_grad()
    def release(self, slots: Tensor) -> None:
        """Mark `slots` empty (their sentence left): an eager step no longer attends their
        source, and they attend junk until `load_source` or `load_prompt` fills them
        again (their own outputs are junk, never NaN).

        Args:
            slots: (M,) slot indices (with `group` > 1: whole groups).
        """
        groups = slots // self.group
        self.source_mask[groups] = False
        self.source_ends[groups] = 0

    @torch.no_grad()
    def load_prompt(self, slots: Tensor, prompt: Tensor, beam: int = 1) -> Tensor:
        """Run prompts through the model and copy their keys and values into `slots`.

        The model's own pass does it (a prefix LM's bidirectional prefix included);
        positions 0 .. T - 1 of each slot then hold the prompt.

        Args:
            slots: (B x beam,) the slots to fill, each prompt's `beam` consecutive.
            prompt: (B, T) ids without padding, 1 <= T < `max_target`.
            beam: slots per prompt.

        Returns:
            (B x beam, V) the logits of the token after each prompt, one row per slot.

        Raises:
            ValueError: an encoder-decoder, or a prompt empty or too long for the slots.
        """
        if self.cross:
            raise ValueError("an encoder-decoder has no prompt: load_source fills its slots")
        if prompt.dim() != 2 or not 1 <= prompt.size(1) < self.max_target:
            raise ValueError(
                f"prompt must be (batch, length) with 1 <= length < max_target="
                f"{self.max_target}, got {tuple(prompt.shape)}"
            )
        cache = new_cache(self.model)
        logits = self.model.project(self.model.hidden(prompt, cache)[:, -1:])[:, -1]  # (B, V)
        rows = torch.arange(prompt.size(0), device=prompt.device).repeat_interleave(beam)
        length = prompt.size(1)
        for i, store in enumerate(cache.self_attention):
            self.self_keys[i][slots, :, :length] = store.key.index_select(0, rows).to(self.dtype)
            self.self_values[i][slots, :, :length] = store.value.index_select(0, rows).to(
                self.dtype
            )
        return logits.index_select(0, rows)

    @torch.no_grad()
    def copy_slots(self, targets: Tensor, sources: Tensor, length: int | None = None) -> None:
        """Beam search's reorder: slots `targets` take the self-attention keys and values of
        slots `sources` (gathered before any is overwritten).

        Args:
            targets, sources: (M,) slot indices.
            length: positions to copy (all `max_target` by default): the longest prefix
                written so far is enough.
        """
        end = self.max_target if length is None else min(length, self.max_target)
        for store in (*self.self_keys, *self.self_values):
            written = store.narrow(2, 0, end)  # (N, Hkv, end, Dk): a view
            written.index_copy_(0, targets, written.index_select(0, sources))

    @torch.no_grad()
    def copy_ranges(self, targets: Tensor, sources: Tensor, starts: Tensor, ends: Tensor) -> None:
        """`copy_slots` of positions `starts[i]` .. `ends[i]` - 1 only, per copy i: beam
        search's reorder where a slot already holds the keys and values of the parent's
        prefix up to `starts[i]` (the hypotheses share it). Targets and sources must not
        overlap.

        Args:
            targets, sources: (M,) slot indices.
            starts, ends: (M,) positions; nothing is copied where ends <= starts.
        """
        lengths = (ends.clamp(max=self.max_target) - starts).clamp(min=0)
        copy = torch.repeat_interleave(
            torch.arange(lengths.numel(), device=lengths.device), lengths
        )
        if copy.numel() == 0:
            return
        # (P,) each copied position: copy i's ends[i] - starts[i] of them in turn
        before = lengths.cumsum(0) - lengths
        positions = starts[copy] + torch.arange(copy.numel(), device=copy.device) - before[copy]
        to, source = targets[copy], sources[copy]
        for store in (*self.self_keys, *self.self_values):
            store[to, :, positions] = store[source, :, positions]  # (P, Hkv, Dk)

    # ----- the step ----------------------------------------------------------------

    def logits(self, tokens: Tensor, positions: Tensor, order: Tensor | None = None) -> Tensor:
        """One step over every slot: each slot's token at its position in, logits out.

        Args:
            tokens: (N,) int64, the newest token of each slot; an eager step (not
                compiled) also takes the first M < N slots alone, (M,), M a multiple
                of `group`.
            positions: (N,) int64, its position (0 for bos), below `max_target`; a slot's
                keys and values at earlier positions must have been written.
            order: (R,) the slots whose logits to return, in this order (default: all,
                in slot order); an eager step projects only these onto the vocabulary.

        Returns:
            (N, V) logits in the model's dtype (compiled or not, as `compile` left it);
            (R, V) with `order`.

        Raises:
            ValueError: another number of slots (naming what the step takes).
        """
        with torch.no_grad():
            return self._run(False, tokens, positions, order)

    def log_probs(self, tokens: Tensor, positions: Tensor, order: Tensor | None = None) -> Tensor:
        """`logits`, then the search's log-softmax in float32 with pad and bos at -inf
        (`aiayn.inference.scoring.normalised`), in the same call.

        Returns:
            (N, V) float32 (float64 for a float64 model) log-probabilities; (R, V) with
            `order`.
        """
        with torch.no_grad():
            return self._run(True, tokens, positions, order)

    def _run(self, log_probs: bool, tokens: Tensor, positions: Tensor, order: Tensor | None):
        step = self._steps[log_probs]
        if order is None:
            return step(tokens, positions)
        if log_probs in self._compiled:  # fixed shapes: every slot, then the rows asked for
            return step(tokens, positions).index_select(0, order)
        return step(tokens, positions, order)

    def compile(
        self, log_probs: bool = True, mode: str | None = None, ahead_of_time: bool = False
    ) -> float:
        """Compile a step (fixed shapes: once per process and slot count) and warm it up.

        Two compilers: `torch.compile` (Inductor behind TorchDynamo, whose guards are
        checked at every call), or with `ahead_of_time` AOTInductor: the step is
        exported (`torch.export`, the stores as inputs it writes in place) and compiled
        into a shared library called without Python in between
        (`benchmarks/bench_static_step.py` measures both).

        Args:
            log_probs: compile `log_probs` (what `aiayn.inference.engine` runs); False:
                `logits` (what `StaticDecoder`'s search runs).
            mode: `torch.compile`'s mode (None: its default; not used ahead of time).
            ahead_of_time: AOTInductor instead of `torch.compile`.

        Returns:
            Seconds the compilation and warm-up took (also `compile_seconds`).
        """
        if has_slow_int8_products(self.model):
            log.warning(
                "compiling int8 products on a CPU without VNNI: torch._int_mm has no fast "
                "kernel here, and the eager step is several times faster "
                "(benchmarks/results/step-small-int8.json)"
            )
        self.attention.unpack(self.model)
        self.trim = False  # fixed shapes, compiled once
        eager = self._log_probs if log_probs else self._logits
        began = time.perf_counter()
        tokens = torch.full((self.slots,), self.cfg.bos_id, dtype=torch.long, device=self.device)
        positions = torch.zeros(self.slots, dtype=torch.long, device=self.device)
        stores = (*self.self_keys, *self.self_values)
        saved = [store[:, :, :1].clone() for store in stores]
        if ahead_of_time:
            compiled = self._ahead_of_time(eager, tokens, positions)
        else:
            compiled = torch.compile(eager, dynamic=False, mode=mode)
        with torch.no_grad():
            compiled(tokens, positions)  # the warm-up compiles; its writes are undone below
        for store, copy in zip(stores, saved, strict=True):
            store[:, :, :1] = copy
        self._steps[log_probs] = compiled
        self._compiled.add(log_probs)
        self.compile_seconds = time.perf_counter() - began
        log.info(
            "compiled the decoding step for %d slots in %.1f s", self.slots, self.compile_seconds
        )
        return self.compile_seconds

    def _stores(self) -> list[Tensor]:
        return [*self.self_keys, *self.self_values, *self.cross_keys, *self.cross_values]

    def _use_stores(self, stores: Sequence[Tensor]) -> None:
        n, cross = self.n_layers, len(self.cross_keys)
        self.self_keys, self.self_values = list(stores[:n]), list(stores[n : 2 * n])
        self.cross_keys = list(stores[2 * n : 2 * n + cross])
        self.cross_values = list(stores[2 * n + cross :])

    def _ahead_of_time(
        self, eager: Callable[[Tensor, Tensor], Tensor], tokens: Tensor, positions: Tensor
    ) -> Callable[[Tensor, Tensor], Tensor]:
        """`eager` exported with the stores and the source mask as inputs, compiled by
        AOTInductor; returns a function of (tokens, positions) that passes them, and
        writes the step's new keys and values, which the exported step returns (the
        compiled library does not write its inputs)."""
        step = self

        class Exported(nn.Module):
            def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor, *stores: Tensor):
                held, held_mask = step._stores(), step.source_mask
                step._use_stores(stores)
                step.source_mask = mask
                step.attention.written = []
                try:
                    return eager(tokens, positions), *step.attention.written
                finally:
                    step._use_stores(held)
                    step.source_mask = held_mask
                    step.attention.written = None

        with torch.no_grad():
            exported = torch.export.export(
                Exported(), (tokens, positions, self.source_mask, *self._stores())
            )
        with tempfile.TemporaryDirectory() as folder:
            path = str(Path(folder) / "step.pt2")
            torch._inductor.aoti_compile_and_package(exported, package_path=path)
            runner = torch._inductor.aoti_load_package(path)

        def run(tokens: Tensor, positions: Tensor) -> Tensor:
            # the library reads its inputs with the strides they were exported with
            tokens, positions = tokens.contiguous(), positions.contiguous()
            out, *written = runner(tokens, positions, self.source_mask, *self._stores())
            where = positions[:, None, None, None]
            for i in range(self.n_layers):
                k, v = written[2 * i], written[2 * i + 1]
                self.self_keys[i].scatter_(2, where.expand(k.shape), k)
                self.self_values[i].scatter_(2, where.expand(v.shape), v)
            return out

        return run

    def _log_probs(self, tokens: Tensor, positions: Tensor, order: Tensor | None = None) -> Tensor:
        return normalised(self.cfg, self._logits(tokens, positions, order))

    def _project(self, hidden: Tensor) -> Tensor:
        output = getattr(self.model, "output", None)  # the frozen forms' output product
        if output is None:
            return self.model.project(hidden)
        return self.attention.product(output, hidden)

    def _logits(self, tokens: Tensor, positions: Tensor, order: Tensor | None = None) -> Tensor:
        """The step itself (see `logits`), every layer written out over fixed shapes."""
        decoder = self.model.decoder
        embedding = decoder.embedding
        rows = tokens.size(0)  # N, or (eager) the first M < N slots: views of their stores
        if rows != self.slots and not (self.trim and 1 <= rows < self.slots):
            raise ValueError(
                f"a step takes all {self.slots} slots (an eager one: the first M of them), "
                f"got {rows}"
            )
        x = embedding.tokens(tokens[:, None]) * embedding.scale  # (N, 1, D)
        if self.position_table is not None:
            x = x + self.position_table[positions][:, None]
        if embedding.norm is not None:
            x = embedding.norm(x)
        own, source = self._spans(positions)  # what the slots attend, this step
        for i, layer in enumerate(decoder.layers):
            h = layer.self_residual.sublayer_input(x)
            keys, values = self.self_keys[i][:rows], self.self_values[i][:rows]
            out = self.attention.self_attention(layer.self_attn, h, keys, values, positions, own)
            x = layer.self_residual(x, out)
            if self.cross:
                h = layer.cross_residual.sublayer_input(x)
                keys, values = self.cross_keys[i], self.cross_values[i]
                out = self.attention.cross_attention(
                    layer.cross_attn, h, keys, values, source, self.group
                )
                x = layer.cross_residual(x, out)
            if layer.feed_forward is not None:
                h = layer.ff_residual.sublayer_input(x)
                x = layer.ff_residual(x, self.attention.feed_forward(layer.feed_forward, h))
        if order is not None:  # only these rows go on to the vocabulary
            x = x.index_select(0, order)
        return self._project(decoder.final_norm(x))[:, 0]  # (N, V)

    def _spans(self, positions: Tensor) -> tuple[list[SlotSpan], list[SlotSpan]]:
        """What the slots attend, in calls over consecutive slot groups: a compiled step,
        all L positions and S source positions of every slot in one call each (its fixed
        shapes); an eager one, the positions written so far up to each call's furthest
        slot, and the source positions up to its furthest source, the groups cut into
        calls as `aiayn.inference.slot_attention.SPAN_COST` says."""
        rows, group = positions.size(0), self.group
        if rows % group:
            raise ValueError(f"a step takes whole groups of {group} slots, got {rows}")
        groups = rows // group
        fixed_end = None if self.trim else self.max_target
        spans = self_spans(positions, group, fixed_end, self.bias_table, self.dtype)
        if not self.cross:
            return spans, []
        ends = self.source_ends[:groups] if self.trim else None
        return spans, cross_spans(self.source_mask[:groups], ends, self.dtype)


def _checked_size(given: int | None, max_len: int, name: str) -> int:
    if given is None:
        return max_len
    if not 1 <= given <= max_len:
        raise ValueError(f"{name} must lie in [1, max_len={max_len}], got {given}")
    return given


class StaticDecoder:
    """A model whose decoding runs on a `StaticStep`: what the search drives.

    `aiayn.inference.search` (greedy, beam search, sampling, every option) decodes it
    as it decodes `model`, through `start`; each batch's B x beam rows take slots of
    one `StaticStep` of `slots` rows, whose shapes never change (compiled once with
    `compile=True`).

    Args:
        model: a `Transformer` or `DecoderOnly` (literal or frozen), in eval mode.
        slots: rows of the step; a batch needs B x beam of them.
        max_target, max_source: see `StaticStep`.
        compile: compile the step now, ahead of time (`StaticStep.compile` with
            AOTInductor).
        compile_mode: compile the step now with `torch.compile` in this mode instead
            (e.g. "reduce-overhead": on CUDA, the step replayed as a CUDA graph).

    Raises:
        ValueError: what `StaticStep` refuses.
    """

    def __init__(
        self,
        model: Transformer | DecoderOnly,
        slots: int,
        max_target: int | None = None,
        max_source: int | None = None,
        compile: bool = False,
        compile_mode: str | None = None,
    ) -> None:
        self.model = model
        self.cfg = model.cfg
        self.step = StaticStep(model, slots, max_target, max_source)
        if compile_mode is not None:
            self.step.compile(log_probs=False, mode=compile_mode)
        elif compile:
            self.step.compile(log_probs=False, ahead_of_time=True)

    def start(self, src: Tensor, beam: int = 1) -> StaticDecoding:
        """The search's state for a batch (see `aiayn.inference.decoding.start`)."""
        return StaticDecoding(self.step, src, beam)


class StaticDecoding:
    """One batch decoded on a `StaticStep`: a `aiayn.inference.decoding.Decoding`.

    Row r of the search lives in slot `row_slot[r]`; a sentence's `beam` rows keep the
    slots they started in. `keep` follows beam search's parents by copying keys and
    values between a sentence's own slots (only where a row's parent is another
    row), and a finished sentence's slots are left idle: nothing moves when the batch
    shrinks. Every step runs all the step's slots (its shapes are fixed).

    A decoder-only model's first `step` returns the prompt's logits and feeds nothing
    (as `aiayn.inference.decoding.DecoderOnlyDecoding` does).

    Args:
        step: the `StaticStep` (its slots are overwritten).
        src: (B, S) source ids, or (B, T) prompts without padding.
        beam: rows per sentence.

    Raises:
        ValueError: B x beam rows more than the step's slots, or a source or prompt the
            step refuses.
    """

    def __init__(self, step: StaticStep, src: Tensor, beam: int = 1) -> None:
        rows = src.size(0) * beam
        if rows > step.slots:
            raise ValueError(
                f"{src.size(0)} sentences x beam {beam} = {rows} rows do not fit the step's "
                f"{step.slots} slots"
            )
        self.static, self.beam = step, beam
        device = step.device
        self.row_slot = torch.arange(rows, device=device)
        self.tokens = torch.full((step.slots,), step.cfg.pad_id, dtype=torch.long, device=device)
        self.dtype = step.dtype
        self._first_logits: Tensor | None = None
        if step.cross:
            self.input_lengths = step.load_source(self.row_slot, src, beam)
            self.position = 0  # of the next token fed
        else:
            self._first_logits = step.load_prompt(self.row_slot, src, beam)
            self.input_lengths = torch.full(
                (src.size(0),), src.size(1), dtype=torch.long, device=device
            )
            self.position = src.size(1)
        self.positions = torch.full((step.slots,), self.position, dtype=torch.long, device=device)

    def step(self, last: Tensor) -> Tensor:
        """(R,) the newest token of each row -> (R, V) logits of the token after it."""
        if self._first_logits is not None:  # `last` is the start token: the prompt's turn
            logits, self._first_logits = self._first_logits, None
            return logits
        if self.position >= self.static.max_target:
            raise ValueError(
                f"position {self.position} is past the step's max_target={self.static.max_target}"
            )
        self.tokens[self.row_slot] = last
        self.positions.fill_(self.position)
        logits = self.static.logits(self.tokens, self.positions)
        self.position += 1
        return logits.index_select(0, self.row_slot)

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Go on with rows `rows` (each new row's parent); `sentences`: the live sentences
        kept when some finished, None when all stay."""
        if sentences is None:
            base = torch.arange(rows.numel(), device=rows.device)
        else:  # the rows the kept sentences had: their slots stay theirs
            within = torch.arange(self.beam, device=rows.device)
            base = (sentences[:, None] * self.beam + within).view(-1)
        targets, sources = self.row_slot[base], self.row_slot[rows]
        moved = targets != sources
        if bool(moved.any()):
            self.static.copy_slots(targets[moved], sources[moved], self.position)
        self.row_slot = targets
