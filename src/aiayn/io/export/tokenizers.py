"""The tokenizer files of an export, built from the run's sentencepiece model."""

from __future__ import annotations

import json
import logging
import tempfile
from pathlib import Path

from aiayn.data.files import strict_json, write_atomic
from aiayn.data.lm import CLS, MASK, SEP
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.io.export.targets import BERT, ExportError

log = logging.getLogger(__name__)


# ----- tokenizer files ----------------------------------------------------------


def marian_tokenizer_files(
    spm_path: Path, out: Path, tokenizer: SentencePieceTokenizer, max_len: int
) -> None:
    """source.spm, target.spm (both the run's shared model) and vocab.json (piece -> id)."""
    data = spm_path.read_bytes()
    write_atomic(out / "source.spm", data)
    write_atomic(out / "target.spm", data)
    vocab = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    write_atomic(out / "vocab.json", strict_json(vocab, ensure_ascii=False, indent=1))
    settings = {
        "tokenizer_class": "MarianTokenizer",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": max_len,
        "separate_vocabs": False,
    }
    write_atomic(out / "tokenizer_config.json", strict_json(settings))


def fast_tokenizer_files(
    spm_path: Path, out: Path, tokenizer: SentencePieceTokenizer, target: str, max_len: int
) -> None:
    """Write OUT/tokenizer.json and OUT/tokenizer_config.json: a `PreTrainedTokenizerFast`
    converted from the sentencepiece model, which `AutoTokenizer` loads whatever
    config.json's model type.

    Args:
        spm_path: the sentencepiece model.
        out: the directory to write into.
        tokenizer: the same model, loaded.
        target: the model type (BERT's tokenizer reads [CLS] ... eos [SEP]).
        max_len: the model's longest input (model_max_length).

    Raises:
        ExportError: transformers missing or too old, or a BERT model without
            [CLS], [SEP] and [MASK] pieces.
    """
    try:
        from tokenizers.processors import TemplateProcessing
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf
    except ImportError as err:
        raise ExportError(
            f"exporting to Hugging Face needs transformers and protobuf ({err.name} is "
            "missing): pip install 'aiayn[test]'"
        ) from None
    if not hasattr(SpmConverter, "build_tokenizer_from_spm_proto"):
        raise ExportError(
            "exporting a sentencepiece tokenizer needs transformers 5 or later "
            "(SpmConverter.build_tokenizer_from_spm_proto); upgrade transformers"
        )
    proto = import_protobuf().ModelProto.FromString(spm_path.read_bytes())
    vocab = {tokenizer.id_to_piece(i): i for i in range(tokenizer.vocab_size)}
    if proto.trainer_spec.model_type == proto.trainer_spec.UNIGRAM:  # pieces with their scores
        log.warning(
            "%s is a unigram model: its conversion to tokenizer.json segments a few inputs "
            "otherwise than sentencepiece does (see benchmarks/check_tokenizer_export.py); "
            "the bpe models aiayn trains by default convert exactly",
            spm_path,
        )
        pieces = [(piece.piece, piece.score) for piece in proto.pieces]
        backend = SpmConverter.build_tokenizer_from_spm_proto(proto, pieces)
    else:  # BPE: merges ranked by piece score
        backend = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    piece = tokenizer.id_to_piece
    specials: dict[str, str] = {
        "pad_token": piece(tokenizer.pad_id),
        "eos_token": piece(tokenizer.eos_id),
        "bos_token": piece(tokenizer.bos_id),
        "unk_token": piece(tokenizer.unk_id),
    }
    eos = (specials["eos_token"], tokenizer.eos_id)
    if target == BERT:  # [CLS] text eos [SEP], as `aiayn fill` reads text
        ids = {p: vocab[p] for p in (CLS, SEP, MASK) if p in vocab}
        if len(ids) < 3:
            raise ExportError(
                f"{spm_path} has no {', '.join(p for p in (CLS, SEP, MASK) if p not in ids)} "
                "piece: BertForMaskedLM's tokenizer needs [CLS], [SEP] and [MASK]"
            )
        end = "" if tokenizer.eos_id == ids[SEP] else f" {eos[0]}"
        backend.post_processor = TemplateProcessing(
            single=f"{CLS} $A{end} {SEP}",
            special_tokens=[(CLS, ids[CLS]), (SEP, ids[SEP]), eos],
        )
        specials |= {"cls_token": CLS, "sep_token": SEP, "mask_token": MASK}
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=max_len, **specials)
    with tempfile.TemporaryDirectory() as tmp:
        fast.save_pretrained(tmp)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            data = (Path(tmp) / name).read_text(encoding="utf-8")
            if name == "tokenizer_config.json":  # whatever the model type, this class
                settings = json.loads(data) | {"tokenizer_class": "PreTrainedTokenizerFast"}
                data = strict_json(settings, ensure_ascii=False)
            write_atomic(out / name, data)
