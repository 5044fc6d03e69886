"""GPT-2 and BERT checkpoints, as `transformers` saves them, run by aiayn's own blocks.

    model, cfg = load_gpt2("path/to/gpt2")          # a DecoderOnly
    model, cfg = load_bert("path/to/bert")          # an EncoderOnly
    convert_gpt2("path/to/gpt2", "out/")            # an aiayn directory (below)

A checkpoint directory holds `config.json` and `model.safetensors` (or
`pytorch_model.bin`), read directly (nothing here imports `transformers`). Each
model's differences from the paper are `ModelConfig` fields, not special layers:

    GPT-2 (config.json)                  aiayn (`ModelConfig.gpt`)
    wpe: learned positions, n_positions  positional = "learned", max_len
    activation_function gelu_new         activation = gelu_tanh
    ln_1, ln_2 before each sub-layer     norm_first = True
    ln_f                                 the decoder's final LayerNorm
    Conv1D weights, stored (in, out)     transposed to nn.Linear's (out, in)
    c_attn: W^Q, W^K, W^V side by side   split into q_proj, k_proj, v_proj
    lm_head equal to wte                 tie_output (read from the weights)

    BERT (config.json)                   aiayn (`ModelConfig.bert`)
    position_embeddings                  positional = "learned", max_len
    token_type_embeddings                type_vocab_size
    embeddings.LayerNorm                 embedding_norm = True
    LayerNorm after each sub-layer       norm_first = False, layer_norm_eps
    hidden_act gelu                      activation = gelu
    cls.predictions.transform            `MaskedLanguageModelHead`
    cls.predictions.bias                 output_bias = True

Special tokens: GPT-2's <|endoftext|> ends a text (eos_id). GPT-2 has no padding
token and aiayn's search starts from bos, so pad_id = the config's `pad_token_id`,
or 0 when it names none (or names eos), and bos_id = pad_id. Neither is ever fed to
the model (a prompt stands for the start token, see `DecoderOnlyDecoding`), but the
search never generates them (`aiayn.inference.search`), so a GPT-2 continuation
through the search never contains token 0. A config whose `bos_token_id` is a token
of its own, neither eos nor pad (an aiayn export's), keeps it as bos_id, so that an
export read back never generates its bos either.

BERT's pad_id is `pad_token_id`, bos_id and eos_id are [CLS] and [SEP], read from
`vocab.txt` (or `cls_token_id` and `sep_token_id` in config.json).

Configurations the mapping does not cover are refused with an `HFFormatError`
naming the field, as are tensors it does not account for.

`convert_gpt2` / `convert_bert` write an aiayn directory: `model.safetensors` (an
aiayn checkpoint, `aiayn.io.checkpoint.load_model` reads it), the tokenizer files
found (`TOKENIZER_FILES`, byte for byte) and, last, `converted.json`, which names
the source, the shape and the files copied.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from aiayn.config import Activation, ModelConfig
from aiayn.data.files import write_atomic, write_fresh_dir
from aiayn.io.checkpoint import WEIGHTS_FILE, save_model
from aiayn.io.hf_config import (
    MAX_POSITIONS,
    ConfigFields,
    check_shapes,
    checked_tensor,
    read_json_object,
)
from aiayn.io.marian import read_weights
from aiayn.models.decoder_only import DecoderOnly
from aiayn.models.encoder_only import EncoderOnly

CONVERTED_FILE = "converted.json"  # written last: marks a complete directory
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",  # GPT-2's byte-level BPE vocabulary...
    "merges.txt",  # ...and merges
    "vocab.txt",  # BERT's WordPiece vocabulary
)
_NEEDED_TOKENIZER = {  # at least one of these sets, for a tokenizer to be built
    "gpt2": (("tokenizer.json",), ("vocab.json", "merges.txt")),
    "bert": (("tokenizer.json",), ("vocab.txt",)),
}

_ACTIVATIONS = {
    "gelu_new": Activation.GELU_TANH,
    "gelu_pytorch_tanh": Activation.GELU_TANH,
    "gelu": Activation.GELU,
    "relu": Activation.RELU,
}

# Fields that change the network in ways the mapping does not cover, with the one
# value accepted (a field the config lacks takes that value).
_GPT2_REFUSED_UNLESS: dict[str, Any] = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
}
_BERT_REFUSED_UNLESS: dict[str, Any] = {
    "position_embedding_type": "absolute",
    "is_decoder": False,
    "add_cross_attention": False,
}

# Stored tensors that are no weights of the shape (buffers, other heads).
_GPT2_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")
_BERT_IGNORED_PREFIXES = ("pooler.", "cls.seq_relationship.", "embeddings.position_ids")


class HFFormatError(ValueError):
    """A `transformers` checkpoint directory that cannot be converted faithfully."""


def read_hf_config(directory: Path, model_type: str) -> dict[str, Any]:
    """DIRECTORY/config.json, checked to be of `model_type` ("gpt2", "bert").

    Raises:
        FileNotFoundError: no config.json.
        HFFormatError: not JSON, or another model type.
    """
    path = directory / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {directory}: not a {model_type} directory")
    hf = read_json_object(path, HFFormatError)
    if hf.get("model_type") != model_type:
        found = hf.get("model_type")
        raise HFFormatError(
            f"{path}: model_type={found!r}, expected {model_type!r} "
            f"(aiayn convert {model_type} reads {model_type} checkpoints only)"
        )
    return hf


def _refuse(model_type: str, hf: dict[str, Any], field: str, why: str) -> HFFormatError:
    return HFFormatError(f"{model_type} config field {field}={hf.get(field)!r}: {why}")


def _check_refused(model_type: str, hf: dict[str, Any], refused: dict[str, Any]) -> None:
    for field, accepted in refused.items():
        if hf.get(field, accepted) != accepted:
            raise _refuse(
                model_type, hf, field, f"not covered by the conversion (needs {accepted!r})"
            )


def _activation(model_type: str, hf: dict[str, Any], field: str) -> Activation:
    activation = _ACTIVATIONS.get(hf.get(field))
    if activation is None:
        raise _refuse(model_type, hf, field, f"supported: {', '.join(_ACTIVATIONS)}")
    return activation


def gpt2_model_config(hf: dict[str, Any]) -> ModelConfig:
    """Translate a GPT-2 `config.json` into a `ModelConfig`, refusing what it cannot map.

    Raises:
        HFFormatError: naming the field that has no faithful mapping.
    """

    fields = ConfigFields(hf, "gpt2 config.json", HFFormatError)
    _check_refused("gpt2", hf, _GPT2_REFUSED_UNLESS)
    activation = _activation("gpt2", hf, "activation_function")
    dropout = fields.probability("resid_pdrop", 0.1)
    if fields.probability("embd_pdrop", dropout) != dropout:
        raise _refuse("gpt2", hf, "embd_pdrop", f"aiayn has one dropout, resid_pdrop={dropout}")
    d_model = fields.int("n_embd")
    vocab_size = fields.int("vocab_size")
    eos_id = fields.int("eos_token_id", 50256, low=0, high=vocab_size - 1)
    pad_id = fields.int("pad_token_id", 0, low=0, high=vocab_size - 1)
    if pad_id == eos_id:
        pad_id = 0
    # GPT-2's own bos is its eos (<|endoftext|>), which must stay generable.
    bos_id = fields.int("bos_token_id", pad_id, low=0, high=vocab_size - 1)
    if bos_id == eos_id:
        bos_id = pad_id
    return _model_config(
        "gpt2",
        ModelConfig.gpt,
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=fields.int("n_head"),
        d_ff=fields.int("n_inner", 4 * d_model),
        n_layers=fields.int("n_layer"),
        max_len=fields.int("n_positions", high=MAX_POSITIONS),
        activation=activation,
        dropout=dropout,
        attention_dropout=fields.probability("attn_pdrop", 0.1),
        layer_norm_eps=fields.float("layer_norm_epsilon", 1e-5, 1e-30, 1.0),
        pad_id=pad_id,
        bos_id=bos_id,
        eos_id=eos_id,
    )


def bert_model_config(hf: dict[str, Any], vocabulary: list[str] | None = None) -> ModelConfig:
    """Translate a BERT `config.json` into a `ModelConfig`, refusing what it cannot map.

    Args:
        hf: the config.json values.
        vocabulary: the lines of vocab.txt, where [CLS] and [SEP] are looked up
            (when config.json has no cls_token_id and sep_token_id).

    Raises:
        HFFormatError: naming the field that has no faithful mapping, or when the
            [CLS] and [SEP] ids cannot be found.
    """

    fields = ConfigFields(hf, "bert config.json", HFFormatError)
    _check_refused("bert", hf, _BERT_REFUSED_UNLESS)
    vocab_size = fields.int("vocab_size")
    activation = _activation("bert", hf, "hidden_act")
    specials = {}
    for name, token in (("cls_token_id", "[CLS]"), ("sep_token_id", "[SEP]")):
        value = fields.int(name, None, low=0, high=vocab_size - 1)
        if value is None and vocabulary is not None and token in vocabulary:
            value = vocabulary.index(token)
        if value is None:
            raise HFFormatError(
                f"bert config has no {name} and no vocab.txt with {token}: "
                "cannot tell the special token ids"
            )
        specials[name] = value
    return _model_config(
        "bert",
        ModelConfig.bert,
        vocab_size=vocab_size,
        d_model=fields.int("hidden_size"),
        n_heads=fields.int("num_attention_heads"),
        d_ff=fields.int("intermediate_size"),
        n_layers=fields.int("num_hidden_layers"),
        max_len=fields.int("max_position_embeddings", high=MAX_POSITIONS),
        type_vocab_size=fields.int("type_vocab_size", 2, low=0, high=MAX_POSITIONS),
        activation=activation,
        dropout=fields.probability("hidden_dropout_prob", 0.1),
        attention_dropout=fields.probability("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=fields.float("layer_norm_eps", 1e-12, 1e-30, 1.0),
        pad_id=fields.int("pad_token_id", 0, low=0, high=vocab_size - 1),
        bos_id=specials["cls_token_id"],
        eos_id=specials["sep_token_id"],
    )


def _model_config(model_type: str, preset: Any, **fields: Any) -> ModelConfig:
    """`preset(**fields)`, with a missing or out-of-range value reported as the config's."""
    try:
        return preset(**fields)
    except (TypeError, ValueError) as err:
        raise HFFormatError(f"{model_type} config.json has no valid aiayn mapping: {err}") from None


# ----- weights ------------------------------------------------------------------


class _Weights:
    """A checkpoint's tensors, handed out by name; those handed out are counted."""

    def __init__(self, tensors: dict[str, torch.Tensor], prefix: str, where: Path) -> None:
        self.where = where
        # A task head's checkpoint (GPT2LMHeadModel, BertForMaskedLM) prefixes the
        # base model's names ("transformer.", "bert."); a bare base model does not.
        self.tensors = {
            (name[len(prefix) :] if name.startswith(prefix) else name): tensor
            for name, tensor in tensors.items()
        }
        for name in list(self.tensors):  # old BERT files: LayerNorm.gamma / .beta
            for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
                if "LayerNorm" in name and name.endswith(old):
                    self.tensors[name[: -len(old)] + new] = self.tensors.pop(name)
        self.used: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def take(self, name: str) -> torch.Tensor:
        if name not in self.tensors:
            raise HFFormatError(f"the checkpoint has no tensor {name}")
        self.used.add(name)
        return checked_tensor(name, self.tensors[name], self.where, HFFormatError)

    def check_all_used(self, ignored: Any) -> None:
        """Refuse tensors neither used nor `ignored(name)`: they would be dropped silently."""
        left = sorted(n for n in self.tensors if n not in self.used and not ignored(n))
        if left:
            shown = ", ".join(left[:5]) + (" ..." if len(left) > 5 else "")
            raise HFFormatError(f"the checkpoint has tensors the conversion does not map: {shown}")


def _tied(weights: _Weights, embedding: str, output: str) -> bool:
    """Whether the output matrix is the embedding: stored once (tied), or twice and equal."""
    return output not in weights or torch.equal(weights.take(output), weights.take(embedding))


def _linear(state: dict, ours: str, weight: torch.Tensor, bias: torch.Tensor) -> None:
    state[f"{ours}.weight"], state[f"{ours}.bias"] = weight, bias


def gpt2_state_dict(weights: _Weights, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """GPT-2's tensors under aiayn's `DecoderOnly` names (Conv1D weights transposed)."""
    state = {
        "decoder.embedding.tokens.weight": weights.take("wte.weight"),
        "decoder.embedding.positions.weight": weights.take("wpe.weight"),
        "decoder.final_norm.weight": weights.take("ln_f.weight"),
        "decoder.final_norm.bias": weights.take("ln_f.bias"),
    }
    if not cfg.tie_output:
        state["output_proj.weight"] = weights.take("lm_head.weight")

    def conv1d(name: str) -> tuple[torch.Tensor, torch.Tensor]:
        # Conv1D computes x W + b with W stored (in, out): nn.Linear's weight transposed.
        return weights.take(f"{name}.weight").t(), weights.take(f"{name}.bias")

    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"h.{i}"
        qkv_weight, qkv_bias = conv1d(f"{theirs}.attn.c_attn")  # (3D, D), (3D,)
        for name, weight, bias in zip(
            ("q_proj", "k_proj", "v_proj"), qkv_weight.chunk(3), qkv_bias.chunk(3), strict=True
        ):
            _linear(state, f"{ours}.self_attn.{name}", weight, bias)
        _linear(state, f"{ours}.self_attn.out_proj", *conv1d(f"{theirs}.attn.c_proj"))
        _linear(state, f"{ours}.feed_forward.linear1", *conv1d(f"{theirs}.mlp.c_fc"))
        _linear(state, f"{ours}.feed_forward.linear2", *conv1d(f"{theirs}.mlp.c_proj"))
        for norm, ours_norm in (("ln_1", "self_residual"), ("ln_2", "ff_residual")):
            _linear(
                state,
                f"{ours}.{ours_norm}.norm",
                weights.take(f"{theirs}.{norm}.weight"),
                weights.take(f"{theirs}.{norm}.bias"),
            )
    return state


def bert_state_dict(weights: _Weights, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """BERT's tensors under aiayn's `EncoderOnly` names."""
    state: dict[str, torch.Tensor] = {}

    def copy(ours: str, theirs: str) -> None:
        _linear(state, ours, weights.take(f"{theirs}.weight"), weights.take(f"{theirs}.bias"))

    state["encoder.embedding.tokens.weight"] = weights.take("embeddings.word_embeddings.weight")
    state["encoder.embedding.positions.weight"] = weights.take(
        "embeddings.position_embeddings.weight"
    )
    if cfg.type_vocab_size > 0:
        state["encoder.embedding.token_types.weight"] = weights.take(
            "embeddings.token_type_embeddings.weight"
        )
    copy("encoder.embedding.norm", "embeddings.LayerNorm")
    for i in range(cfg.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"encoder.layer.{i}"
        for name, hf_name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            copy(f"{ours}.self_attn.{name}", f"{theirs}.attention.self.{hf_name}")
        copy(f"{ours}.self_attn.out_proj", f"{theirs}.attention.output.dense")
        copy(f"{ours}.attn_residual.norm", f"{theirs}.attention.output.LayerNorm")
        copy(f"{ours}.feed_forward.linear1", f"{theirs}.intermediate.dense")
        copy(f"{ours}.feed_forward.linear2", f"{theirs}.output.dense")
        copy(f"{ours}.ff_residual.norm", f"{theirs}.output.LayerNorm")
    if "cls.predictions.transform.dense.weight" not in weights:
        raise HFFormatError(
            "the checkpoint has no masked-LM head (cls.predictions.*): a bare BertModel "
            "cannot fill masks; convert a BertForMaskedLM or BertForPreTraining checkpoint"
        )
    copy("mlm_head.dense", "cls.predictions.transform.dense")
    copy("mlm_head.norm", "cls.predictions.transform.LayerNorm")
    bias_names = ("cls.predictions.bias", "cls.predictions.decoder.bias")
    state["output_bias"] = next(weights.take(n) for n in bias_names if n in weights)
    for name in bias_names:  # one bias, stored under either name or both
        if name in weights:
            weights.take(name)
    if not cfg.tie_output:
        state["output_proj.weight"] = weights.take("cls.predictions.decoder.weight")
    return state


def _build(shape: type, cfg: ModelConfig, state: dict[str, torch.Tensor], directory: Path):
    """`shape(cfg)` holding `state`, its sizes checked against the weights before it is made."""
    check_shapes(lambda: shape(cfg), state, directory, HFFormatError)
    model = shape(cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()


def load_gpt2(directory: str | Path) -> tuple[DecoderOnly, ModelConfig]:
    """A `DecoderOnly` holding a GPT-2 checkpoint's weights, and its config.

    Raises:
        FileNotFoundError: config.json or the weights are missing.
        HFFormatError: the config has no faithful mapping, or a tensor is missing or
            left over.
    """
    directory = Path(directory)
    cfg = gpt2_model_config(read_hf_config(directory, "gpt2"))
    weights = _Weights(read_weights(directory), prefix="transformer.", where=directory)
    tied = _tied(weights, "wte.weight", "lm_head.weight")
    cfg = dataclasses.replace(cfg, tie_output=tied)
    model = _build(DecoderOnly, cfg, gpt2_state_dict(weights, cfg), directory)
    weights.check_all_used(lambda name: name.endswith(_GPT2_IGNORED_SUFFIXES))
    return model, cfg


def load_bert(directory: str | Path) -> tuple[EncoderOnly, ModelConfig]:
    """An `EncoderOnly` holding a BERT checkpoint's weights and masked-LM head, and its config.

    The pooler and the next-sentence head of a BertForPreTraining checkpoint are
    not part of the shape and are left out.

    Raises:
        FileNotFoundError: config.json or the weights are missing.
        HFFormatError: the config has no faithful mapping, the checkpoint has no
            masked-LM head, or a tensor is missing or left over.
    """
    directory = Path(directory)
    vocab = directory / "vocab.txt"
    try:
        vocabulary = vocab.read_text(encoding="utf-8").splitlines() if vocab.is_file() else None
    except UnicodeDecodeError as err:
        raise HFFormatError(f"{vocab} is not UTF-8 text: {err}") from None
    cfg = bert_model_config(read_hf_config(directory, "bert"), vocabulary)
    weights = _Weights(read_weights(directory), prefix="bert.", where=directory)
    tied = _tied(weights, "embeddings.word_embeddings.weight", "cls.predictions.decoder.weight")
    cfg = dataclasses.replace(cfg, tie_output=tied)
    model = _build(EncoderOnly, cfg, bert_state_dict(weights, cfg), directory)
    weights.check_all_used(lambda name: name.startswith(_BERT_IGNORED_PREFIXES))
    return model, cfg


# ----- conversion to an aiayn directory --------------------------------------------


def _tokenizer_files(directory: Path, model_type: str) -> list[str]:
    """The tokenizer files present, refusing a directory from which none can be built."""
    present = [name for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not any(all(n in present for n in needed) for needed in _NEEDED_TOKENIZER[model_type]):
        wanted = " or ".join(" + ".join(needed) for needed in _NEEDED_TOKENIZER[model_type])
        raise FileNotFoundError(f"no tokenizer in {directory}: it needs {wanted}")
    for name in (n for n in present if n.endswith(".json")):
        values = read_json_object(directory / name, HFFormatError)
        if name == "vocab.json":  # GPT-2's pieces -> ids
            bad = next(((p, i) for p, i in values.items() if type(i) is not int or i < 0), None)
            if bad is not None:
                raise HFFormatError(
                    f"{directory / name}: piece {bad[0]!r} has id {bad[1]!r}; ids must be "
                    "integers >= 0"
                )
    return present


def _convert(directory: str | Path, out: str | Path, model_type: str, force: bool) -> Path:
    """`convert_gpt2` / `convert_bert`: load with `load_<model_type>`, write into a fresh
    OUT (`aiayn.data.files.write_fresh_dir`); the weights file written."""
    directory, out = Path(directory), Path(out)
    load = {"gpt2": load_gpt2, "bert": load_bert}[model_type]

    def fill(tmp: Path) -> None:
        model, _ = load(directory)
        files = _tokenizer_files(directory, model_type)
        for name in files:
            write_atomic(tmp / name, (directory / name).read_bytes())
        save_model(model, tmp / WEIGHTS_FILE)
        marker = {
            "format": f"aiayn-{model_type}",
            "version": 1,
            "source": str(directory.resolve()),
            "architecture": model.cfg.architecture,
            "tokenizer_files": files,
        }
        write_atomic(tmp / CONVERTED_FILE, json.dumps(marker, indent=2) + "\n")

    write_fresh_dir(directory, out, fill, force)
    return out / WEIGHTS_FILE


def convert_gpt2(directory: str | Path, out: str | Path, force: bool = False) -> Path:
    """Write a GPT-2 directory as an aiayn one: OUT/model.safetensors, the tokenizer files
    and OUT/converted.json (last).

    OUT must not exist or be empty (unless `force`: then it is replaced whole), and
    is never the source directory, inside it or holding it. It is built under a
    temporary name and renamed when whole, so a directory that cannot be converted,
    or a full disk, leaves OUT as it was (`aiayn.data.files.write_fresh_dir`).

    Args:
        directory: the GPT-2 directory, as `transformers` saves it.
        out: the aiayn directory to write.
        force: replace an OUT that exists and is not empty.

    Returns:
        The weights file written.

    Raises:
        FileNotFoundError, HFFormatError: as `load_gpt2`, or when no tokenizer
            (tokenizer.json, or vocab.json + merges.txt) is there.
        ValueError: an OUT refused (naming why), or a source file that cannot be read.
        aiayn.data.files.WriteFailed: (an OSError) the system refused a write to OUT.
    """
    return _convert(directory, out, "gpt2", force)


def convert_bert(directory: str | Path, out: str | Path, force: bool = False) -> Path:
    """Write a BERT directory as an aiayn one: OUT/model.safetensors, the tokenizer files
    and OUT/converted.json (last); OUT is protected and built as in `convert_gpt2`.

    Args:
        directory: the BERT directory, as `transformers` saves it.
        out: the aiayn directory to write.
        force: replace an OUT that exists and is not empty.

    Returns:
        The weights file written.

    Raises:
        FileNotFoundError, HFFormatError: as `load_bert`, or when no tokenizer
            (tokenizer.json or vocab.txt) is there.
        ValueError, aiayn.data.files.WriteFailed: as `convert_gpt2`.
    """
    return _convert(directory, out, "bert", force)
