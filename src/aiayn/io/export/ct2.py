"""`export_ctranslate2`: a run written as a CTranslate2 directory, through CTranslate2's
own converter (see `aiayn.io.export`)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from aiayn.data.files import write_atomic, write_fresh_dir
from aiayn.data.tokenizer import TOKENIZER_FILE
from aiayn.io.export.card import model_card
from aiayn.io.export.configs import GenerationSettings
from aiayn.io.export.hf import export_hf, load_for_export
from aiayn.io.export.targets import (
    BERT,
    GPT2,
    MARIAN,
    NEOX,
    PEGASUS,
    QUANTIZATIONS,
    WEIGHTS,
    ExportError,
    hf_target,
)

log = logging.getLogger(__name__)


def _ct2_converter(directory: Path, target: str) -> Any:
    """CTranslate2's `TransformersConverter` for an exported directory, with its own
    loaders corrected where they assume a convention of the original checkpoints
    that an aiayn export does not follow:

    - GPT-NeoX's loader reads transformers 4's names (embed_out, rotary_pct) and
      leaves the rotary base at 10000 whatever the config says.
    - GPT-2's and GPT-NeoX's loaders set no layer_norm_epsilon, so CTranslate2 would
      run their LayerNorms with its default 1e-5 whatever the config says.
    - Marian's loader drops the last row of the vocabulary (opus-mt's pad, which
      `transformers` appends) and starts the decoder from a zero vector (opus-mt's pad
      embedding); Pegasus's starts it from pad. An aiayn model's vocabulary is whole and
      its decoder starts from bos, the export's decoder_start_token_id.
    """
    import numpy as np
    import transformers
    from ctranslate2.converters import TransformersConverter
    from ctranslate2.converters.transformers import (
        BartLoader,
        GPT2Loader,
        GPTNeoXLoader,
        MarianMTLoader,
        PegasusLoader,
    )

    def decoder_start(config: Any, model: Any, tokenizer: Any) -> None:
        BartLoader.set_config(None, config, model, tokenizer)
        bos = model.config.bos_token_id  # a Marian tokenizer names no bos token
        config.bos_token = tokenizer.convert_ids_to_tokens(bos)

    class Marian(MarianMTLoader):
        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return BartLoader.get_model_spec(self, model)  # the whole vocabulary

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            decoder_start(config, model, tokenizer)

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            BartLoader.set_decoder(self, spec, decoder)  # from the bos embedding

        def get_vocabulary(self, model: Any, tokenizer: Any) -> list[str]:
            return BartLoader.get_vocabulary(self, model, tokenizer)

    class Pegasus(PegasusLoader):
        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = True
            model.config.normalize_embedding = False
            return super().get_model_spec(model)

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            decoder_start(config, model, tokenizer)

    class NeoX(GPTNeoXLoader):
        def get_model_spec(self, model: Any) -> Any:  # transformers 5 names embed_out lm_head
            model.embed_out = model.lm_head
            model.config.rotary_pct = 1.0  # transformers 5: rope_parameters; always whole here
            spec = super().get_model_spec(model)
            base = np.float32(model.config.rope_parameters["rope_theta"])  # not read upstream
            for layer in spec.decoder.layer:
                layer.self_attention.rotary_base = base
            return spec

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            super().set_config(config, model, tokenizer)
            config.layer_norm_epsilon = model.config.layer_norm_eps

    class GPT(GPT2Loader):
        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            super().set_config(config, model, tokenizer)
            config.layer_norm_epsilon = model.config.layer_norm_epsilon

    loader = {MARIAN: Marian, PEGASUS: Pegasus, GPT2: GPT, NEOX: NeoX}[target]()

    class Converter(TransformersConverter):
        def _load(self) -> Any:
            with torch.no_grad():
                model_class = getattr(transformers, loader.architecture_name)
                model = model_class.from_pretrained(str(directory)).eval()
                tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
                return loader(model, tokenizer)

    return Converter(str(directory))


def export_ctranslate2(
    run_or_model: str | Path | nn.Module,
    out: str | Path,
    *,
    quantization: str | None = None,
    spm: str | Path | None = None,
    generation: GenerationSettings | None = None,
    force: bool = False,
) -> Path:
    """Write a run's model as a CTranslate2 directory (`ctranslate2.Translator` for an
    encoder-decoder, `ctranslate2.Generator` for a decoder-only model).

    The model is exported to Hugging Face first (`export_hf`, in a temporary
    directory), then converted by CTranslate2's own `TransformersConverter`. The
    tokenizer files, the model card and the run's sentencepiece model (spm.model,
    which turns text into the pieces CTranslate2 reads) are copied beside
    CTranslate2's files.

    Args:
        run_or_model, spm, generation, force: as `export_hf`.
        out: the directory to write.
        quantization: int8, int8_float32 or bfloat16 weights; None keeps float32.

    Returns:
        OUT.

    Raises:
        ExportError: as `export_hf`; an encoder-only model (CTranslate2 runs BERT
            without its masked-LM head); ctranslate2 not installed.
        ValueError: an unknown quantization, or an OUT refused.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"--quantization {quantization!r}: not one of {', '.join(QUANTIZATIONS)}")
    model, weights, spm_path = load_for_export(run_or_model, spm)
    target = hf_target(model.cfg)
    if target == BERT:
        raise ExportError(
            "architecture=encoder_only: CTranslate2 runs BERT as an encoder without its "
            "masked-LM head, so it cannot fill masks; export it with --to hf"
        )
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise ExportError(
            "exporting to CTranslate2 needs ctranslate2: pip install ctranslate2"
        ) from None
    out = Path(out)

    def fill(tmp_out: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="aiayn-export-") as tmp:
            hf_dir = Path(tmp) / "hf"
            export_hf(model, hf_dir, spm=spm_path, generation=generation)
            if weights is not None:  # the card names the run's results
                card = model_card(model, target, generation or GenerationSettings(), weights)
                write_atomic(hf_dir / "README.md", card)
            converter = _ct2_converter(hf_dir, target)
            converter.convert(str(tmp_out), quantization=quantization, force=True)
            write_atomic(tmp_out / TOKENIZER_FILE, spm_path.read_bytes())  # pieces from text
            for path in hf_dir.iterdir():
                if path.name not in (WEIGHTS, "config.json") and not (tmp_out / path.name).exists():
                    write_atomic(tmp_out / path.name, path.read_bytes())

    write_fresh_dir([weights, spm_path], out, fill, force)  # never the run, as `export_hf`
    log.info("exported %s to CTranslate2 (%s) in %s", weights or "the model", quantization, out)
    return out
