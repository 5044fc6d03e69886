"""Export: a model trained with aiayn as a Hugging Face directory, or a CTranslate2 one.

    export_hf("runs/bible", "exports/bible-hf")                  # transformers loads it
    export_ctranslate2("runs/bible", "exports/bible-ct2", quantization="int8")
    export("runs/bible", "exports/bible-hf", to="hf")            # either, by name

Each model shape goes to the `transformers` architecture that computes the same
function, not an approximation of it (`hf_target` says which, or refuses by name):

    aiayn                                              transformers
    encoder-decoder, post-norm, sinusoidal positions   MarianMTModel
    encoder-decoder, pre-norm, sinusoidal positions    PegasusForConditionalGeneration
    decoder-only, learned positions, pre-norm (GPT)    GPT2LMHeadModel
    decoder-only, rotary positions, pre-norm           GPTNeoXForCausalLM (sequential
                                                       residual, rotary on all of each head)
    encoder-only, learned positions, post-norm (BERT)  BertForMaskedLM

Pre-norm encoder-decoders do not go to M2M100 (issue 33 suggested it): M2M100's
sinusoids have other frequencies, 10000^(-i / (D/2 - 1)) where the paper's are
10000^(-2i / D), computed in code and not stored, so no weight can correct them.
Pegasus is M2M100's structure (pre-norm, a final LayerNorm per stack, scaled
embeddings) with Marian's sinusoids, which are the paper's.

Marian and Pegasus lay the sinusoids out as halves (all sines, then all cosines)
where the paper, and aiayn's `sinusoidal` positions, interleave them. The export
permutes the d_model basis of every weight that reads or writes the residual
stream: embeddings and the output matrix by column, projections into the stream
(W^O, W2) by row and bias, projections out of it (W^Q, W^K, W^V, W1) by column,
LayerNorm weights and biases by entry. Every sub-layer commutes with a permutation
of its input's coordinates (a LayerNorm's mean and variance do not see the order),
so the exported model computes the same logits, to the last bit, in the other basis.

The directory holds config.json, model.safetensors, generation_config.json (beam,
length penalty, maximum length and the special ids; not for BERT), the tokenizer
files built from the run's sentencepiece model, and README.md, a model card with
the Hub's metadata header. An encoder-decoder's tokenizer is Marian's (source.spm,
target.spm, vocab.json: sentencepiece itself, which appends eos to a source sentence
as aiayn's batching does; `aiayn convert marian` reads them back). A language
model's is a fast tokenizer (tokenizer.json, which TGI and vLLM want), converted by
`transformers` from the sentencepiece model: exact for BPE models (aiayn's default),
nearly so for unigram ones (a warning says so); BERT's reads [CLS] ... eos [SEP], as
`aiayn fill` reads text.

What no target expresses exactly is refused with a one-line `ExportError` naming
the setting and the target, before anything is written; OUT is written under a
temporary name and renamed when whole (`aiayn.data.files.write_fresh_dir`).

Generation differs in one place no setting bridges: aiayn's length penalty is the
paper's ((5 + |Y|) / 6)^alpha, `transformers`' is |Y|^alpha. The export writes the
run's alpha for `transformers`' form, and says so in the model card; aiayn decodes
as `transformers` does with `LengthPenalty.HF` (`aiayn.inference.search`).

`transformers` (for the tokenizer conversion) and, for CTranslate2, `ctranslate2`
are imported only here, when an export runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from aiayn.io.export.configs import GenerationSettings
from aiayn.io.export.ct2 import export_ctranslate2
from aiayn.io.export.hf import export_hf
from aiayn.io.export.targets import (
    ARCHITECTURES,
    BERT,
    GPT2,
    MARIAN,
    NEOX,
    PEGASUS,
    QUANTIZATIONS,
    TARGETS,
    ExportError,
    hf_target,
)
from aiayn.io.export.tokenizers import fast_tokenizer_files
from aiayn.io.export.weights import halves_permutation


def export(
    run_or_model: str | Path | nn.Module,
    out: str | Path,
    to: str = "hf",
    **options: Any,
) -> Path:
    """`export_hf` (to="hf") or `export_ctranslate2` (to="ctranslate2").

    Raises:
        ValueError: an unknown target; otherwise as the function it calls.
    """
    if to == "hf":
        return export_hf(run_or_model, out, **options)
    if to == "ctranslate2":
        return export_ctranslate2(run_or_model, out, **options)
    raise ValueError(f"--to {to!r}: not one of {', '.join(TARGETS)}")


__all__ = [
    "ARCHITECTURES",
    "BERT",
    "GPT2",
    "MARIAN",
    "NEOX",
    "PEGASUS",
    "QUANTIZATIONS",
    "TARGETS",
    "ExportError",
    "GenerationSettings",
    "export",
    "export_ctranslate2",
    "export_hf",
    "fast_tokenizer_files",
    "halves_permutation",
    "hf_target",
]
