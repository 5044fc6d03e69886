"""Which `transformers` architecture expresses an aiayn model exactly, or which setting
none does."""

from __future__ import annotations

from aiayn.config import Activation, ModelConfig
from aiayn.nn.kernels import kernel_class

MARIAN, PEGASUS, GPT2, NEOX, BERT = "marian", "pegasus", "gpt2", "gpt_neox", "bert"
LANGUAGE_MODELS = (GPT2, NEOX)
ARCHITECTURES = {
    MARIAN: "MarianMTModel",
    PEGASUS: "PegasusForConditionalGeneration",
    GPT2: "GPT2LMHeadModel",
    NEOX: "GPTNeoXForCausalLM",
    BERT: "BertForMaskedLM",
}
TARGETS = ("hf", "ctranslate2")
QUANTIZATIONS = ("int8", "int8_float32", "bfloat16")
WEIGHTS = "model.safetensors"
RESULTS_FILE = "results.json"  # where `aiayn quickstart` records its test BLEU
RUN_CONFIG_FILE = "config.yaml"
HF_LAYER_NORM_EPS = 1e-5  # Marian's and Pegasus's LayerNorms: torch's default, not a setting

# aiayn's activations under the names transformers' ACT2FN (and CTranslate2) know them by.
HF_ACTIVATIONS = {
    Activation.RELU: "relu",
    Activation.GELU: "gelu",
    Activation.GELU_TANH: "gelu_pytorch_tanh",  # torch.nn.functional.gelu(approximate="tanh")
    Activation.SWISH: "swish",
}


class ExportError(ValueError):
    """A model that no export target expresses exactly (the message names the setting)."""


# ----- which target, or why none ---------------------------------------------------


def hf_target(cfg: ModelConfig) -> str:
    """The `transformers` model type that expresses `cfg` exactly: marian, pegasus, gpt2,
    gpt_neox or bert.

    Raises:
        ExportError: naming the first setting no target expresses, and the target.
    """
    target = {
        "encoder_decoder": PEGASUS if cfg.norm_first else MARIAN,
        "decoder_only": NEOX if cfg.positional == "rotary" else GPT2,
        "encoder_only": BERT,
    }.get(cfg.architecture)
    if target is None:
        raise ExportError(
            f"architecture={cfg.architecture}: no Hugging Face architecture expresses it "
            "(exported: encoder_decoder, decoder_only, encoder_only)"
        )
    name = ARCHITECTURES[target]

    def refuse(setting: str, why: str) -> ExportError:
        return ExportError(f"{setting}: {name} has no equivalent ({why}); not exported")

    if not kernel_class(cfg.attention).exact_in_hf:  # what the kernel declares
        raise refuse(
            f"attention={cfg.attention} (it does not declare exact_in_hf)",
            "it computes dense softmax attention",
        )
    if cfg.attention_options:
        raise refuse(f"attention_options={dict(cfg.attention_options)}", "no kernel options")
    if cfg.position_options and (target != NEOX or set(dict(cfg.position_options)) - {"base"}):
        raise refuse(f"position_options={dict(cfg.position_options)}", "fixed positions")
    if cfg.n_kv_heads != cfg.n_heads:
        raise refuse(
            f"n_kv_heads={cfg.n_kv_heads} (grouped-query attention)", "no num_key_value_heads"
        )
    if cfg.d_k != cfg.d_model // cfg.n_heads or cfg.d_v != cfg.d_model // cfg.n_heads:
        raise refuse(
            f"d_k={cfg.d_k}, d_v={cfg.d_v} (separate head sizes)",
            f"its heads are d_model / n_heads = {cfg.d_model // cfg.n_heads} wide",
        )
    if cfg.d_model % cfg.n_heads:
        raise refuse(f"d_model={cfg.d_model} not divisible by n_heads={cfg.n_heads}", "head size")
    if cfg.kept_heads:
        raise refuse("kept_heads (pruned attention heads)", "every layer has all its heads")
    if cfg.d_ff == 0:
        raise refuse("d_ff=0 (attention-only layers)", "every layer has a feed-forward network")
    if cfg.activation not in HF_ACTIVATIONS:
        raise refuse(f"activation={cfg.activation.value}", "not among its activations")

    if target in (MARIAN, PEGASUS):
        if cfg.positional not in ("sinusoidal", "sinusoidal_halves"):
            raise refuse(f"positional={cfg.positional}", "fixed sinusoidal positions only")
        if not cfg.tie_embeddings:
            raise refuse("tie_embeddings=false (separate source and target embeddings)", "one")
        if cfg.type_vocab_size or cfg.embedding_norm:
            raise refuse("token types or an embedding LayerNorm", "neither")
        if cfg.layer_norm_eps != HF_LAYER_NORM_EPS:
            raise refuse(f"layer_norm_eps={cfg.layer_norm_eps:g}", "its LayerNorms use 1e-05")
        if cfg.n_encoder_layers < 1 or cfg.n_decoder_layers < 1:
            raise refuse("a stack without layers", "both stacks have layers")
    elif target in LANGUAGE_MODELS:
        if target == GPT2 and cfg.positional != "learned":
            raise refuse(f"positional={cfg.positional}", "learned or rotary positions only")
        if not cfg.norm_first:
            raise refuse("norm_first=false (post-norm)", "GPT-2 and GPT-NeoX are pre-norm")
        if cfg.scale_embeddings:
            raise refuse("scale_embeddings=true", "GPT-2 does not scale its embeddings")
        if cfg.output_bias:
            raise refuse("output_bias=true", "GPT-2's output projection has no bias")
        if cfg.embedding_norm or cfg.type_vocab_size:
            raise refuse("token types or an embedding LayerNorm", "neither")
    else:  # BERT
        if cfg.positional != "learned":
            raise refuse(f"positional={cfg.positional}", "learned positions only")
        if cfg.norm_first:
            raise refuse("norm_first=true (pre-norm)", "BERT is post-norm")
        if cfg.scale_embeddings:
            raise refuse("scale_embeddings=true", "BERT does not scale its embeddings")
        if not cfg.embedding_norm:
            raise refuse("embedding_norm=false", "BERT normalises its embeddings")
    return target
