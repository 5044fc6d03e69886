"""`ModelConfig`: the network's hyper-parameters, validated on construction.

`ModelConfig` describes the network of section 3 of "Attention Is All You Need"
(Vaswani et al., 2017). Its presets are the paper's models:

    ModelConfig.base(vocab_size=37000)    # Table 3, "base": N=6, d_model 512, h 8, d_ff 2048
    ModelConfig.big(vocab_size=37000)     # Table 3, "big":  N=6, d_model 1024, h 16, d_ff 4096
    ModelConfig.tiny(vocab_size=1000)     # for tests and CPU demos

and every row of Table 3 is a keyword override of a preset, for example
row (A) `ModelConfig.base(v, n_heads=16)` (d_k = d_v = 32 follow), row (B)
`ModelConfig.base(v, d_k=16)`, row (C) `ModelConfig.base(v, n_layers=4, d_ff=1024)`,
row (D) `ModelConfig.base(v, dropout=0.2)`, row (E) `ModelConfig.base(v,
positional="learned")`. The two descendants built from the same blocks have
presets too, overridden the same way:

    ModelConfig.gpt(vocab_size=50257)     # GPT-2 small, decoder-only (aiayn.models.decoder_only)
    ModelConfig.bert(vocab_size=30522)    # BERT-base, encoder-only (aiayn.models.encoder_only)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from enum import Enum
from typing import Any

from aiayn.config import plugins
from aiayn.config.fields import (
    check_field_types,
    config_from_dict,
    config_to_dict,
    enum_member,
)


class Activation(str, Enum):
    """The non-linearity of the position-wise feed-forward network."""

    RELU = "relu"  # section 3.3: FFN(x) = max(0, xW1 + b1)W2 + b2
    GELU = "gelu"  # x Phi(x) with the exact (erf) Phi: BERT's
    GELU_TANH = "gelu_tanh"  # GELU with Phi approximated through tanh: GPT-2's "gelu_new"
    SWISH = "swish"


def _positive(name: str, value: int | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")


def _probability(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"ModelConfig.{name} must lie in [0, 1), got {value!r}")


SUBLAYER_KINDS = ("encoder.self", "decoder.self", "decoder.cross")
"""The kinds of attention sub-layer; a sub-layer is named "encoder.I.self",
"decoder.I.self" or "decoder.I.cross" (I its layer, from 0)."""

POOLINGS = ("mean", "first")  # ModelConfig.pooling: how encoder_classifier reads a sequence


def split_sublayer(name: str) -> tuple[str, int, str]:
    """ "decoder.3.cross" -> ("decoder", 3, "cross").

    Raises:
        ValueError: `name` is not "encoder.I.self", "decoder.I.self" or "decoder.I.cross".
    """
    parts = str(name).split(".")
    if len(parts) != 3 or not parts[1].isdigit() or f"{parts[0]}.{parts[2]}" not in SUBLAYER_KINDS:
        raise ValueError(
            f"{name!r} names no attention sub-layer (expected encoder.I.self, "
            "decoder.I.self or decoder.I.cross)"
        )
    return parts[0], int(parts[1]), parts[2]


@dataclass(frozen=True)
class ModelConfig:
    """The encoder-decoder Transformer's hyper-parameters.

    Args:
        vocab_size: size of the (shared) subword vocabulary.
        d_model: width of every residual stream, embedding and sub-layer output.
        n_heads: attention heads h.
        n_kv_heads: key/value heads; fewer than `n_heads` gives grouped-query
            attention (1 gives multi-query). Defaults to `n_heads` (plain MHA).
        d_k: size of each query/key head. Defaults to `d_model // n_heads`.
        d_v: size of each value head. Defaults to `d_model // n_heads`.
        d_ff: inner size of the position-wise feed-forward network; 0 for none: every
            layer is then attention-only, without the feed-forward sub-layer and its
            residual and norm (Olsson et al. 2022's attention-only models).
        n_layers: N, layers in both stacks unless the two below are given.
        n_encoder_layers: encoder layers (defaults to `n_layers`).
        n_decoder_layers: decoder layers (defaults to `n_layers`).
        dropout: P_drop on every sub-layer output and on embeddings + positions.
        attention_dropout: dropout on attention weights (not in the paper: 0).
        activation: the FFN non-linearity (the paper: ReLU).
        positional: a registered position scheme (`aiayn.nn.positions`, checked when
            the model is built): sinusoidal
            (the paper), sinusoidal_halves (Marian's layout), learned (Table 3 E),
            rotary, relative (T5's bias), alibi or none.
        attention: the self-attention kernel, by its registered name (`aiayn.nn.kernels`):
            sdpa, explicit, sliding_window, linear, performer, bigbird, or a plug-in's.
        attention_options: the kernel's own settings, a mapping (stored as sorted
            (name, value) pairs); the kernel declares which names it takes
            (sliding_window: window, global_tokens).
        position_options: the position scheme's own settings, likewise (relative:
            num_buckets, max_distance; rotary: base); the scheme declares their names.
        attention_window, global_tokens: the old spellings of sliding_window's options
            `window` and `global_tokens`, still read from saved runs and recipes (they
            move into `attention_options`; other kernels ignore them, as before).
        architecture: the registered model shape (`aiayn.models`) the config builds:
            encoder_decoder (the paper), decoder_only (GPT: its layers are
            `n_decoder_layers`) or encoder_only (BERT: `n_encoder_layers`). A shape
            ignores the other stack's layer count.
        kept_heads: the attention sub-layers whose heads were pruned (`aiayn.analysis.pruning`),
            each as (name, kv_of_head): "encoder.2.self", "decoder.0.self" or
            "decoder.0.cross", and for each query head kept, the key/value head it
            reads. Other sub-layers have `n_heads` heads.
        max_len: the longest sequence, in tokens, the model accepts.
        norm_first: pre-norm `x + Sublayer(LayerNorm(x))` with a final LayerNorm
            per stack, instead of the paper's post-norm `LayerNorm(x + Sublayer(x))`.
        tie_embeddings: one matrix for the source and the target embedding (section
            3.4); needs a shared vocabulary.
        tie_output: the pre-softmax projection is the target embedding matrix (section
            3.4). The paper ties all three: both flags True.
        output_bias: a bias on the pre-softmax projection (not in the paper; Marian's
            `final_logits_bias`).
        scale_embeddings: multiply embeddings by sqrt(d_model) (section 3.4).
        layer_norm_eps: epsilon of every LayerNorm.
        type_vocab_size: token types (BERT's segments A and B) whose learned
            vectors are added to the encoder's input embeddings; 0 for none.
        embedding_norm: a LayerNorm on the embedding sum, before its dropout (BERT).
        pooling: encoder_classifier only: the one vector per sequence its head reads,
            "mean" (of the states at the real positions) or "first" (the state at
            position 0, as BERT's classifier reads its [CLS] token's).
        pad_id, bos_id, eos_id: special token ids of the vocabulary. The decoder
            starts from bos_id, which may equal pad_id (Marian starts from pad).

    The plug-in names (`attention`, `positional`, `architecture`) and their options'
    names are checked here, by the registries that own them (`aiayn.config.plugins`).

    Raises:
        ValueError: on a field out of range or an inconsistent combination; the
            message names the field.
        aiayn.config.plugins.UnknownPlugin: a plug-in name no registry holds (a ValueError
            listing those registered, and any plug-in that failed to load).
    """

    vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None
    d_k: int | None = None
    d_v: int | None = None
    d_ff: int = 2048
    n_layers: int = 6
    n_encoder_layers: int | None = None
    n_decoder_layers: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: Activation = Activation.RELU
    positional: str = "sinusoidal"
    attention: str = "sdpa"
    attention_options: tuple[tuple[str, Any], ...] = ()
    max_len: int = 1024
    norm_first: bool = False
    tie_embeddings: bool = True
    tie_output: bool = True
    output_bias: bool = False
    scale_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    type_vocab_size: int = 0
    embedding_norm: bool = False
    pooling: str = "mean"
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    architecture: str = "encoder_decoder"
    kept_heads: tuple[tuple[str, tuple[int, ...]], ...] = ()
    position_options: tuple[tuple[str, Any], ...] = ()
    attention_window: InitVar[int | None] = None
    global_tokens: InitVar[int | None] = None

    def __post_init__(self, attention_window: int | None, global_tokens: int | None) -> None:
        set_field = object.__setattr__  # frozen: derived defaults are filled in once, here
        for name in ("attention_options", "position_options"):
            if isinstance(getattr(self, name), Mapping):
                set_field(self, name, tuple(getattr(self, name).items()))
        self._read_old_window_keys(attention_window, global_tokens)
        check_field_types(self)
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "max_len"):
            _positive(name, getattr(self, name))
        if self.d_ff < 0:
            raise ValueError(
                f"ModelConfig.d_ff must be >= 0 (0: attention-only layers), got {self.d_ff}"
            )
        for name in ("n_kv_heads", "d_k", "d_v", "n_encoder_layers", "n_decoder_layers"):
            _positive(name, getattr(self, name))
        if self.type_vocab_size < 0:
            raise ValueError(
                f"ModelConfig.type_vocab_size must be >= 0 (0: no token types), "
                f"got {self.type_vocab_size}"
            )
        _probability("dropout", self.dropout)
        _probability("attention_dropout", self.attention_dropout)
        if self.layer_norm_eps <= 0:
            raise ValueError(
                f"ModelConfig.layer_norm_eps must be positive, got {self.layer_norm_eps}"
            )
        set_field(self, "attention", str(getattr(self.attention, "value", self.attention)))
        set_field(self, "attention_options", self._checked_options("attention_options"))
        set_field(self, "position_options", self._checked_options("position_options"))
        # the plug-ins' names and their options' names, by the registries that own them
        plugins.check_choice("ModelConfig.attention", self.attention, self.attention_options)
        plugins.check_choice("ModelConfig.positional", self.positional, self.position_options)
        plugins.check_choice("ModelConfig.architecture", self.architecture)
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"ModelConfig.pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}"
            )
        activation = enum_member(Activation, self.activation, "ModelConfig.activation")
        set_field(self, "activation", activation)

        if self.d_k is None or self.d_v is None:
            if self.d_model % self.n_heads != 0:
                raise ValueError(
                    f"ModelConfig.d_model ({self.d_model}) is not divisible by n_heads "
                    f"({self.n_heads}); set d_k and d_v explicitly or change one of them"
                )
            if self.d_k is None:
                set_field(self, "d_k", self.d_model // self.n_heads)
            if self.d_v is None:
                set_field(self, "d_v", self.d_model // self.n_heads)
        if self.n_kv_heads is None:
            set_field(self, "n_kv_heads", self.n_heads)
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"ModelConfig.n_heads ({self.n_heads}) must be a multiple of n_kv_heads "
                f"({self.n_kv_heads}): each key/value head serves a whole group of query heads"
            )
        if self.n_encoder_layers is None:
            set_field(self, "n_encoder_layers", self.n_layers)
        if self.n_decoder_layers is None:
            set_field(self, "n_decoder_layers", self.n_layers)
        set_field(self, "kept_heads", self._checked_kept_heads())

        ids = {"pad_id": self.pad_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        for name, value in ids.items():
            if not 0 <= value < self.vocab_size:
                raise ValueError(
                    f"ModelConfig.{name} ({value}) must lie in [0, vocab_size={self.vocab_size})"
                )
        if self.pad_id == self.eos_id:
            raise ValueError(
                f"ModelConfig.pad_id ({self.pad_id}) must differ from eos_id ({self.eos_id}): "
                "padding is masked out of the source, the end of a sentence is not"
            )

    def _read_old_window_keys(self, window: int | None, global_tokens: int | None) -> None:
        """Move the sliding window's settings of runs saved before they became its options
        (`attention_window`, `global_tokens` beside the other fields) into
        `attention_options`; every saved run carries them, and other kernels ignore them.

        Raises:
            ValueError: a setting given both ways.
        """
        if self.attention != "sliding_window" or (window is None and global_tokens is None):
            return
        options = dict(self.attention_options)
        for old, new, value in (
            ("attention_window", "window", window),
            ("global_tokens", "global_tokens", global_tokens),
        ):
            if value is None:
                continue
            if new in options:
                raise ValueError(
                    f"ModelConfig.{old} is the old spelling of attention_options {new!r}, "
                    "which is given too: keep attention_options only"
                )
            options[new] = value
        object.__setattr__(self, "attention_options", tuple(options.items()))

    def _checked_kept_heads(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """`kept_heads` as tuples (JSON gives lists), each name and head checked."""
        checked = []
        layers = {"encoder": self.n_encoder_layers, "decoder": self.n_decoder_layers}
        for entry in self.kept_heads:
            name, kv_of_head = entry
            try:
                stack, layer, _ = split_sublayer(name)
                known = layer < layers[stack]
            except ValueError:
                known = False
            if not known:
                raise ValueError(
                    f"ModelConfig.kept_heads: {name!r} names no attention sub-layer (expected "
                    "encoder.I.self, decoder.I.self or decoder.I.cross within the layers)"
                )
            kv_of_head = tuple(int(i) for i in kv_of_head)
            if not kv_of_head or min(kv_of_head) < 0 or max(kv_of_head) >= self.n_kv_heads:
                raise ValueError(
                    f"ModelConfig.kept_heads: {name!r} keeps {kv_of_head}: at least one head, "
                    f"each reading a key/value head in [0, n_kv_heads={self.n_kv_heads})"
                )
            checked.append((str(name), kv_of_head))
        return tuple(checked)

    def heads_of(self, sublayer: str) -> tuple[int, ...] | None:
        """The kept heads' key/value heads of a pruned sub-layer, or None if it has them all."""
        return dict(self.kept_heads).get(sublayer)

    def _checked_options(self, field: str) -> tuple[tuple[str, Any], ...]:
        """A plug-in's options (`attention_options`, `position_options`) as sorted
        (name, value) pairs (JSON gives lists)."""
        pairs = []
        for entry in getattr(self, field):
            if len(entry) != 2 or not isinstance(entry[0], str):
                raise ValueError(
                    f"ModelConfig.{field} must map option names to values, got {entry!r}"
                )
            pairs.append((entry[0], entry[1]))
        names = [name for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"ModelConfig.{field} names an option twice: {names}")
        return tuple(sorted(pairs))

    # ----- presets (Table 3) -------------------------------------------------

    @classmethod
    def base(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
        """Transformer (base): N=6, d_model 512, d_ff 2048, h 8, P_drop 0.1."""
        preset = dict(d_model=512, n_heads=8, d_ff=2048, n_layers=6, dropout=0.1)
        return cls(vocab_size=vocab_size, **{**preset, **overrides})

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
        """Transformer (big): N=6, d_model 1024, d_ff 4096, h 16, P_drop 0.3."""
        preset = dict(d_model=1024, n_heads=16, d_ff=4096, n_layers=6, dropout=0.3)
        return cls(vocab_size=vocab_size, **{**preset, **overrides})

    @classmethod
    def tiny(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
        """A small model for tests and CPU demos: N=2, d_model 64, d_ff 256, h 4.

        Every preset takes `d_ff=0` as an override for attention-only layers (no
        feed-forward sub-layer), e.g. `ModelConfig.tiny(v, d_ff=0)`."""
        preset = dict(d_model=64, n_heads=4, d_ff=256, n_layers=2, dropout=0.1, max_len=256)
        return cls(vocab_size=vocab_size, **{**preset, **overrides})

    # ----- the two descendants: GPT and BERT ----------------------------------

    @classmethod
    def gpt(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
        """GPT-2 small (Radford et al. 2019): a decoder-only stack of 12 layers,
        d_model 768, d_ff 3072, h 12, learned positions up to 1024, pre-norm with a
        final LayerNorm, GELU (tanh form), dropout 0.1, unscaled embeddings tied to
        the output."""
        preset = dict(
            architecture="decoder_only",
            d_model=768,
            n_heads=12,
            d_ff=3072,
            n_layers=12,
            positional="learned",
            max_len=1024,
            norm_first=True,
            activation=Activation.GELU_TANH,
            dropout=0.1,
            attention_dropout=0.1,
            scale_embeddings=False,
            layer_norm_eps=1e-5,
        )
        return cls(vocab_size=vocab_size, **{**preset, **overrides})

    @classmethod
    def bert(cls, vocab_size: int, **overrides: Any) -> ModelConfig:
        """BERT-base (Devlin et al. 2019): an encoder-only stack of 12 post-norm layers,
        d_model 768, d_ff 3072, h 12, learned positions up to 512, two token types,
        a LayerNorm on the embeddings (eps 1e-12 everywhere), GELU, dropout 0.1,
        unscaled embeddings tied to the masked-LM output, which has a bias."""
        preset = dict(
            architecture="encoder_only",
            d_model=768,
            n_heads=12,
            d_ff=3072,
            n_layers=12,
            positional="learned",
            max_len=512,
            norm_first=False,
            activation=Activation.GELU,
            dropout=0.1,
            attention_dropout=0.1,
            scale_embeddings=False,
            layer_norm_eps=1e-12,
            type_vocab_size=2,
            embedding_norm=True,
            output_bias=True,
        )
        return cls(vocab_size=vocab_size, **{**preset, **overrides})

    # ----- (de)serialisation ---------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain types only (enums as their values), for YAML and JSON."""
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModelConfig:
        """Inverse of `to_dict`; unknown keys raise a ValueError naming them."""
        return config_from_dict(cls, values)
