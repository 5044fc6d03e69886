"""Marian / opus-mt checkpoints, as `transformers` saves them, run by aiayn's own engine.

A Marian model is the paper's Transformer with a few documented differences, each
mapped to a `ModelConfig` field rather than a special case in the layers:

    Marian (config.json)                 aiayn
    sinusoids, sines then cosines        positional = "sinusoidal_halves"
    final_logits_bias                    output_bias = True
    decoder_start_token_id (the pad id)  bos_id = pad_id
    scale_embedding                      scale_embeddings
    activation_function (often swish)    activation
    one or two embedding matrices        tie_embeddings
    lm_head equal to the target one      tie_output

The two ties are read from the weights: `transformers` versions disagree on what
`share_encoder_decoder_embeddings` and `tie_word_embeddings` tie (in 5.x the latter
also unties the encoder's and decoder's embeddings from each other).

Tokenization differs too: a source and a target sentencepiece model split text
into pieces, and `vocab.json` (shared by both sides) maps pieces to ids.

So does generation: `MarianGeneration` reads the directory's settings and
`MarianGeneration.decode_config` expresses `transformers`' beam and greedy search
in a `DecodeConfig` (see `aiayn.inference.search`), so that the outputs are the same.

`convert_marian` writes an aiayn directory: `model.safetensors` (an aiayn
checkpoint), the three tokenization files, and `marian.json` with the generation
settings. `marian.json` is what marks the directory as Marian-tokenized for
`Translator.load` and `aiayn translate`.

Nothing here imports `transformers`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from safetensors.torch import load_file

from aiayn.config import (
    MAX_ALPHA,
    MAX_BEAM,
    Activation,
    EarlyStopping,
    LengthPenalty,
    ModelConfig,
)
from aiayn.data.files import write_atomic, write_fresh_dir
from aiayn.io.checkpoint import WEIGHTS_FILE, save_model
from aiayn.io.hf_config import (
    MAX_POSITIONS,
    ConfigFields,
    check_shapes,
    checked_tensor,
    read_json_object,
)
from aiayn.models.encoder_decoder import Transformer

log = logging.getLogger(__name__)

_ACTIVATIONS = {"relu": Activation.RELU, "gelu": Activation.GELU, "swish": Activation.SWISH}
_ACTIVATIONS["silu"] = Activation.SWISH

# Config fields of older or related (BART-family) configs that change the network in
# ways this mapping does not cover, with the value that is safe to accept.
_REFUSED_UNLESS = {
    "normalize_before": False,
    "add_bias_logits": False,
    "normalize_embedding": False,
    "add_final_layer_norm": False,
    "layernorm_embedding": False,
    "static_position_embeddings": None,  # None or True: both mean fixed sinusoids
    "separate_vocabs": False,
}


# Generation settings of `transformers` that change outputs in ways our search does
# not reproduce, with the values that leave them off (older configs list them all).
_GENERATION_REFUSED_UNLESS: dict[str, tuple[Any, ...]] = {
    "do_sample": (False, None),
    "num_beam_groups": (1, None),
    "diversity_penalty": (0.0, None),
    "repetition_penalty": (1.0, None),
    "encoder_repetition_penalty": (1.0, None),
    "no_repeat_ngram_size": (0, None),
    "encoder_no_repeat_ngram_size": (0, None),
    "min_length": (0, None),
    "min_new_tokens": (0, None),
    "max_new_tokens": (None,),
    "forced_bos_token_id": (None,),
    "exponential_decay_length_penalty": (None,),
    "suppress_tokens": (None, []),
    "begin_suppress_tokens": (None, []),
    "sequence_bias": (None, {}),
    "constraints": (None, []),
    "force_words_ids": (None, []),
}

_WORD_BOUNDARY = "\u2581"  # sentencepiece's word-start mark
CONVERTED_FILE = "marian.json"  # marks a converted directory; holds the generation settings
TOKENIZATION_FILES = ("source.spm", "target.spm", "vocab.json")


class MarianFormatError(ValueError):
    """A Marian directory that cannot be converted faithfully."""


def read_marian_config(directory: Path) -> dict[str, Any]:
    """DIRECTORY/config.json's fields.

    Raises:
        FileNotFoundError: no config.json.
        MarianFormatError: not UTF-8 JSON, or not an object.
    """
    path = directory / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"no config.json in {directory}: not a Marian model directory")
    return read_json_object(path, MarianFormatError)


def marian_model_config(hf: dict[str, Any]) -> ModelConfig:
    """Translate a Marian `config.json` into a `ModelConfig`, refusing what it cannot map.

    Raises:
        MarianFormatError: naming the field that has no faithful mapping.
    """

    def refuse(field: str, why: str) -> MarianFormatError:
        return MarianFormatError(f"Marian config field {field}={hf.get(field)!r}: {why}")

    fields = ConfigFields(hf, "Marian config.json", MarianFormatError)

    if hf.get("model_type", "marian") != "marian":
        raise refuse("model_type", "only Marian models are supported")
    for field, accepted in _REFUSED_UNLESS.items():
        value = hf.get(field, accepted)
        if value != accepted and not (field == "static_position_embeddings" and value is True):
            raise refuse(field, "not covered by the conversion")
    for encoder_field, decoder_field in [
        ("encoder_attention_heads", "decoder_attention_heads"),
        ("encoder_ffn_dim", "decoder_ffn_dim"),
    ]:
        if fields.int(encoder_field) != fields.int(decoder_field):
            raise refuse(decoder_field, f"differs from {encoder_field}={hf[encoder_field]!r}")
    vocab_size = fields.int("vocab_size")
    if fields.int("decoder_vocab_size", vocab_size) != vocab_size:
        raise refuse("decoder_vocab_size", f"differs from vocab_size={vocab_size}")
    activation = _ACTIVATIONS.get(hf.get("activation_function", "swish"))
    if activation is None:
        raise refuse("activation_function", f"supported: {', '.join(_ACTIVATIONS)}")
    scale_embedding = hf.get("scale_embedding", False)
    if not isinstance(scale_embedding, bool):
        raise refuse("scale_embedding", "must be true or false")
    pad_id = fields.int("pad_token_id", low=0, high=vocab_size - 1)
    try:
        return ModelConfig(
            vocab_size=vocab_size,
            d_model=fields.int("d_model"),
            n_heads=fields.int("encoder_attention_heads"),
            d_ff=fields.int("encoder_ffn_dim"),
            n_layers=fields.int("encoder_layers"),
            n_encoder_layers=fields.int("encoder_layers"),
            n_decoder_layers=fields.int("decoder_layers"),
            dropout=fields.probability("dropout", 0.1),
            attention_dropout=fields.probability("attention_dropout", 0.0),
            activation=activation,
            positional="sinusoidal_halves",
            max_len=fields.int("max_position_embeddings", 512, high=MAX_POSITIONS),
            norm_first=False,
            tie_embeddings=True,  # both ties are settled from the weights (module docstring)
            tie_output=True,
            output_bias=True,
            scale_embeddings=scale_embedding,
            pad_id=pad_id,
            bos_id=fields.int("decoder_start_token_id", pad_id, low=0, high=vocab_size - 1),
            eos_id=fields.int("eos_token_id", low=0, high=vocab_size - 1),
        )
    except ValueError as err:  # a combination out of range (d_model not divisible by heads)
        raise MarianFormatError(f"Marian config.json has no valid aiayn mapping: {err}") from None


def read_weights(directory: Path) -> dict[str, torch.Tensor]:
    safetensors_file = directory / "model.safetensors"
    torch_file = directory / "pytorch_model.bin"
    try:
        if safetensors_file.is_file():
            return load_file(str(safetensors_file))
        if torch_file.is_file():
            return torch.load(torch_file, map_location="cpu", weights_only=True)
    except Exception as err:  # corrupt files raise many kinds of errors
        raise MarianFormatError(f"cannot read the weights in {directory}: {err}") from None
    raise FileNotFoundError(f"no model.safetensors or pytorch_model.bin in {directory}")


def embedding_ties(weights: dict[str, torch.Tensor]) -> tuple[bool, bool]:
    """(source embedding is the target's, output projection is the target embedding).

    `save_pretrained` stores a tied matrix once, under one of its names, so a
    missing name means tied and two stored copies are compared.
    """
    shared = weights.get("model.shared.weight")
    source = weights.get("model.encoder.embed_tokens.weight", shared)
    target = weights.get("model.decoder.embed_tokens.weight", shared)
    if source is None or target is None:
        raise MarianFormatError("the weights hold no embedding matrix (model.shared.weight)")
    output = weights.get("lm_head.weight", target)
    return torch.equal(source, target), torch.equal(output, target)


_TIES_AND_POSITIONS = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",  # compared by `embedding_ties`
    "model.encoder.embed_positions.weight",  # sinusoids older versions store, recomputed
    "model.decoder.embed_positions.weight",
)


def convert_state_dict(
    weights: dict[str, torch.Tensor], cfg: ModelConfig, where: Path = Path("the weights")
) -> dict[str, torch.Tensor]:
    """Rename Marian's tensors to aiayn's (every one accounted for).

    Raises:
        MarianFormatError: a tensor is missing, not floating point, not finite, or
            left over (the conversion would drop it silently).
    """
    used: set[str] = set(_TIES_AND_POSITIONS)

    def first(*names: str) -> torch.Tensor:
        for name in names:
            if name in weights:
                used.add(name)
                return checked_tensor(name, weights[name], where, MarianFormatError)
        raise MarianFormatError(f"the weights have none of {', '.join(names)}")

    shared = ("model.shared.weight",)
    source_embedding = first("model.encoder.embed_tokens.weight", *shared)
    target_embedding = first("model.decoder.embed_tokens.weight", *shared)
    if cfg.tie_embeddings:
        target_embedding = source_embedding
    out = {
        "encoder.embedding.tokens.weight": source_embedding,
        "decoder.embedding.tokens.weight": target_embedding,
        "output_bias": first("final_logits_bias").reshape(-1),
    }
    if not cfg.tie_output:
        out["output_proj.weight"] = first("lm_head.weight")
    linear = {"q_proj", "k_proj", "v_proj", "out_proj"}

    def copy(ours: str, theirs: str) -> None:
        for kind in ("weight", "bias"):
            out[f"{ours}.{kind}"] = first(f"{theirs}.{kind}")

    for i in range(cfg.n_encoder_layers):
        ours, theirs = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
        for name in linear:
            copy(f"{ours}.self_attn.{name}", f"{theirs}.self_attn.{name}")
        copy(f"{ours}.attn_residual.norm", f"{theirs}.self_attn_layer_norm")
        copy(f"{ours}.feed_forward.linear1", f"{theirs}.fc1")
        copy(f"{ours}.feed_forward.linear2", f"{theirs}.fc2")
        copy(f"{ours}.ff_residual.norm", f"{theirs}.final_layer_norm")
    for i in range(cfg.n_decoder_layers):
        ours, theirs = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
        for name in linear:
            copy(f"{ours}.self_attn.{name}", f"{theirs}.self_attn.{name}")
            copy(f"{ours}.cross_attn.{name}", f"{theirs}.encoder_attn.{name}")
        copy(f"{ours}.self_residual.norm", f"{theirs}.self_attn_layer_norm")
        copy(f"{ours}.cross_residual.norm", f"{theirs}.encoder_attn_layer_norm")
        copy(f"{ours}.feed_forward.linear1", f"{theirs}.fc1")
        copy(f"{ours}.feed_forward.linear2", f"{theirs}.fc2")
        copy(f"{ours}.ff_residual.norm", f"{theirs}.final_layer_norm")
    left = sorted(set(weights) - used)
    if left:
        shown = ", ".join(left[:5]) + (" ..." if len(left) > 5 else "")
        raise MarianFormatError(f"{where} has tensors the conversion does not map: {shown}")
    return out


def load_marian_model(directory: str | Path) -> Transformer:
    """Build an aiayn `Transformer` holding a Marian checkpoint's weights.

    Raises:
        FileNotFoundError: if config.json or the weights are missing.
        MarianFormatError: if the config has no faithful mapping or a tensor is missing.
    """
    directory = Path(directory)
    cfg = marian_model_config(read_marian_config(directory))
    weights = read_weights(directory)
    tie_embeddings, tie_output = embedding_ties(weights)
    cfg = dataclasses.replace(cfg, tie_embeddings=tie_embeddings, tie_output=tie_output)
    state = convert_state_dict(weights, cfg, directory)
    check_shapes(lambda: Transformer(cfg), state, directory, MarianFormatError)
    model = Transformer(cfg)
    model.load_state_dict(state, strict=True)
    return model.eval()


class MarianTokenizer:
    """Marian's tokenization: sentencepiece pieces mapped to ids through `vocab.json`.

    An `aiayn.data.tokenizer.Tokenizer`: `encode` returns ids without eos (batching
    appends it), `decode` drops special tokens. `files` are the files that make the
    vocabulary (what `aiayn.data.shortlist.vocabulary_digest` hashes).
    """

    def __init__(self, directory: str | Path) -> None:
        directory = Path(directory)
        for name in TOKENIZATION_FILES:
            if not (directory / name).is_file():
                raise FileNotFoundError(f"no {name} in {directory}: not a Marian model directory")
        self.source, self.target = (_sentencepiece(directory / n) for n in TOKENIZATION_FILES[:2])
        self.piece_to_id = _vocabulary(directory / "vocab.json")
        self._piece_of_id = {i: piece for piece, i in self.piece_to_id.items()}
        self.pad_id = self.piece_to_id["<pad>"]
        self.eos_id = self.piece_to_id["</s>"]
        self.unk_id = self.piece_to_id["<unk>"]
        self.bos_id = self.pad_id  # Marian's decoder starts from the pad token
        self.path = directory
        self.files = tuple(directory / name for name in TOKENIZATION_FILES)

    @property
    def vocab_size(self) -> int:
        return max(self._piece_of_id) + 1

    def pieces(self, text: str) -> list[str]:
        """Source pieces; a leading language code such as >>fra<< stays one piece."""
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        return code + self.source.EncodeAsPieces(text)

    def encode(self, text: str) -> list[int]:
        return [self.piece_to_id.get(piece, self.unk_id) for piece in self.pieces(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Target text, as `transformers`' `decode(ids, skip_special_tokens=True)`.

        Special tokens (pad, eos, unk) are dropped; a piece the target model lacks
        keeps its text, its word-boundary marks turned into spaces.
        """
        specials = {self.pad_id, self.eos_id, self.unk_id}
        pieces = [self._piece_of_id[i] for i in ids if i not in specials and i in self._piece_of_id]
        return self.target.DecodePieces(pieces).replace(_WORD_BOUNDARY, " ").strip()

    def id_to_piece(self, token_id: int) -> str:
        """The vocab.json piece of one id (of either side; pad is "<pad>", eos "</s>").

        Raises:
            ValueError: vocab.json has no piece with this id.
        """
        if token_id not in self._piece_of_id:
            raise ValueError(f"id {token_id} has no piece in {self.path / 'vocab.json'}")
        return self._piece_of_id[token_id]


def _sentencepiece(path: Path) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as err:
        raise MarianFormatError(f"{path} is not a sentencepiece model: {err}") from None


def _vocabulary(path: Path) -> dict[str, int]:
    """vocab.json: pieces to distinct integer ids, with <pad>, </s> and <unk>.

    Raises:
        MarianFormatError: naming the file and the first entry that is not so.
    """
    vocabulary = read_json_object(path, MarianFormatError)
    seen: dict[int, str] = {}
    for piece, token_id in vocabulary.items():
        if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
            raise MarianFormatError(
                f"{path}: piece {piece!r} has id {token_id!r}; ids must be integers >= 0"
            )
        if token_id in seen:
            raise MarianFormatError(
                f"{path}: id {token_id} is given to {seen[token_id]!r} and {piece!r}"
            )
        seen[token_id] = piece
    for piece in ("<pad>", "</s>", "<unk>"):
        if piece not in vocabulary:
            raise MarianFormatError(f"{path} has no {piece} piece")
    return vocabulary


DEFAULT_NEW_TOKENS = 20
"""What `transformers` 5 generates, at most, for a model that sets no max_length."""


@dataclass(frozen=True)
class MarianGeneration:
    """Search settings a Marian directory asks for (generation_config.json / config.json).

    Attributes, in `transformers`' terms:
        beam: num_beams (1: greedy search).
        max_length: the longest output counting the decoder start token.
        length_penalty: finished beams score sum log-prob / length ** length_penalty,
            length counting the generated tokens, eos included.
        bad_word_ids: single tokens never generated (the pad id among them).
        early_stopping: early_stopping, as an `EarlyStopping`.
        forced_eos: forced_eos_token_id is the eos id: at max_length - 1 eos is
            forced, with log-probability 0.
        renormalize: renormalize_logits.
    """

    beam: int = 4
    max_length: int = 512
    length_penalty: float = 1.0
    bad_word_ids: tuple[int, ...] = ()
    early_stopping: EarlyStopping = EarlyStopping.HEURISTIC
    forced_eos: bool = True
    renormalize: bool = False

    def __post_init__(self) -> None:
        try:
            early_stopping = EarlyStopping(self.early_stopping)
        except ValueError:
            raise MarianFormatError(
                f"early_stopping {self.early_stopping!r}: not one of "
                + ", ".join(member.value for member in EarlyStopping)
            ) from None
        object.__setattr__(self, "early_stopping", early_stopping)
        object.__setattr__(self, "bad_word_ids", tuple(int(i) for i in self.bad_word_ids))

    def search_settings(self) -> dict[str, Any]:
        """The `aiayn.inference.search.DecodeConfig` fields that search as `transformers`'
        `generate` does (`DecodeConfig(**settings)`)."""
        return {
            "beam": self.beam,
            "alpha": self.length_penalty,
            "extra_len": None,  # transformers limits only by max_length
            "max_output_len": self.max_length - 1,  # max_length counts the start token
            "length_penalty": LengthPenalty.HF,  # |Y|^alpha
            "early_stopping": self.early_stopping,
            "banned_ids": self.bad_word_ids,
            "renormalize": self.renormalize,
            "free_forced_eos": self.forced_eos,
        }


def _early_stopping(value: bool | str | None) -> EarlyStopping:
    if value is True:
        return EarlyStopping.EXACT  # the same n-best as waiting for K finished
    if value == "never":
        return EarlyStopping.NEVER
    if value in (False, None):
        return EarlyStopping.HEURISTIC
    raise MarianFormatError(f"generation field early_stopping={value!r}: not True, False or never")


def marian_generation(directory: str | Path) -> MarianGeneration:
    """Read the directory's generation defaults; the pad id is never generated.

    Raises:
        MarianFormatError: naming a generation setting our search does not reproduce.
    """
    directory = Path(directory)
    values = read_marian_config(directory)
    generation_file = directory / "generation_config.json"
    if generation_file.is_file():
        values = {**values, **read_json_object(generation_file, MarianFormatError)}
    fields = ConfigFields(values, "Marian generation settings", MarianFormatError)
    for field, accepted in _GENERATION_REFUSED_UNLESS.items():
        if values.get(field) not in accepted:
            raise MarianFormatError(
                f"generation field {field}={values[field]!r}: not supported by aiayn's search"
            )
    eos_id = fields.int("eos_token_id", low=0)
    bad = {fields.int("pad_token_id", low=0)}
    bad_words = values.get("bad_words_ids") or []
    if not isinstance(bad_words, list) or not all(
        isinstance(word, list) and all(isinstance(i, int) and i >= 0 for i in word)
        for word in bad_words
    ):
        raise MarianFormatError(
            f"generation field bad_words_ids={bad_words!r}: must be lists of token ids"
        )
    for word in bad_words:
        if len(word) == 1:
            bad.add(word[0])
        else:
            log.warning("ignoring a multi-token bad word %s: only single tokens are banned", word)
    bad.discard(eos_id)  # transformers never bans eos either
    forced_eos = values.get("forced_eos_token_id")
    if forced_eos not in (None, eos_id):
        raise MarianFormatError(
            f"generation field forced_eos_token_id={forced_eos!r}: not the eos id {eos_id}"
        )
    if forced_eos is None:
        log.warning(
            "%s sets no forced_eos_token_id: transformers would end outputs at max_length "
            "without eos, aiayn ends them with eos",
            directory,
        )
    length_penalty = values.get("length_penalty")
    if isinstance(length_penalty, int | float) and length_penalty < 0:
        raise MarianFormatError(
            f"generation field length_penalty={length_penalty!r}: negative values are not supported"
        )
    length_penalty = fields.float("length_penalty", 1.0, 0.0, MAX_ALPHA)
    return MarianGeneration(
        beam=fields.int("num_beams", 1, high=MAX_BEAM),
        # transformers 5 without a max_length: 20 new tokens after the decoder start
        max_length=fields.int("max_length", DEFAULT_NEW_TOKENS + 1, low=2, high=MAX_POSITIONS),
        length_penalty=length_penalty,
        bad_word_ids=tuple(sorted(bad)),
        early_stopping=_early_stopping(values.get("early_stopping")),
        forced_eos=forced_eos is not None,
        renormalize=bool(values.get("renormalize_logits")),
    )


def convert_marian(
    directory: str | Path, out: str | Path, int8: bool = False, force: bool = False
) -> Path:
    """Write a Marian directory as an aiayn one that `aiayn translate` reads.

    OUT gets `model.safetensors` (an aiayn checkpoint), `source.spm`, `target.spm`,
    `vocab.json` and `marian.json` (the generation settings; it marks the directory
    as Marian-tokenized). With `int8`, the weights int8 inference multiplies in int8
    are stored so (`save_model`'s `int8`), and `Translator.load` runs the directory
    in int8 by default.

    OUT must not exist or be empty (unless `force`: then it is replaced whole), and
    is never the source directory, inside it or holding it. It is built under a
    temporary name and renamed when whole, so a directory that cannot be converted,
    or a full disk, leaves OUT as it was (`aiayn.data.files.write_fresh_dir`).

    Args:
        directory: the Marian directory, as `transformers` saves it.
        out: the aiayn directory to write.
        int8: store the int8 products' weights as int8.
        force: replace an OUT that exists and is not empty.

    Returns:
        The weights file written.

    Raises:
        FileNotFoundError, MarianFormatError: as `load_marian_model`, or for a
            missing tokenization file.
        ValueError: an OUT refused (naming why), or a source file that cannot be read.
        aiayn.data.files.WriteFailed: (an OSError) the system refused a write to OUT.
    """
    directory, out = Path(directory), Path(out)
    write_fresh_dir(directory, out, lambda tmp: _write_converted(directory, tmp, int8), force)
    return out / WEIGHTS_FILE


def _write_converted(directory: Path, out: Path, int8: bool) -> None:
    """`convert_marian`'s work, into the fresh directory `out`."""
    model = load_marian_model(directory)
    generation = marian_generation(directory)
    tokenizer = MarianTokenizer(directory)  # the three tokenization files are there and sound
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise MarianFormatError(
            f"{directory / 'vocab.json'} has ids up to {tokenizer.vocab_size - 1}, but "
            f"config.json's vocab_size is {model.cfg.vocab_size}"
        )
    for name in TOKENIZATION_FILES:
        write_atomic(out / name, (directory / name).read_bytes())
    settings = {"format": "aiayn-marian", "version": 1, "source": str(directory.resolve())}
    settings["generation"] = dataclasses.asdict(generation)
    settings["dtype"] = "int8" if int8 else "float32"
    save_model(model, out / WEIGHTS_FILE, int8=int8)
    # last: a complete directory is marked
    write_atomic(out / CONVERTED_FILE, json.dumps(settings, indent=2) + "\n")


def read_converted_generation(directory: str | Path) -> MarianGeneration:
    """The generation settings `convert_marian` wrote to DIRECTORY/marian.json.

    Raises:
        MarianFormatError: if the file is not valid.
    """
    path = Path(directory) / CONVERTED_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
        return MarianGeneration(**settings["generation"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise MarianFormatError(
            f"{path} is not a valid aiayn Marian settings file: {err}"
        ) from None
