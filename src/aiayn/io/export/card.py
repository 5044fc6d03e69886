"""README.md of an export: a model card with the Hugging Face Hub's metadata header."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from torch import nn

from aiayn.data.files import strict_json
from aiayn.io.checkpoint import find_in_run
from aiayn.io.export.configs import GenerationSettings
from aiayn.io.export.targets import (
    ARCHITECTURES,
    BERT,
    GPT2,
    LANGUAGE_MODELS,
    MARIAN,
    NEOX,
    PEGASUS,
    RESULTS_FILE,
    RUN_CONFIG_FILE,
)

log = logging.getLogger(__name__)


# ----- the model card ---------------------------------------------------------------


def _read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log.warning("%s is not readable JSON: the model card leaves it out", path)
        return None
    return value if isinstance(value, dict) else None


def _run_results(weights: Path | None) -> dict[str, Any] | None:
    """The quickstart's results.json for these weights: in their run, or in the folder
    holding the run (the quickstart's OUT), if it names weights of this run."""
    if weights is None:
        return None
    weights = weights.absolute()
    in_run = weights.parent.parent.name == "checkpoints"  # RUN/checkpoints/NAME/weights
    run = weights.parents[2] if in_run else weights.parent
    for place in (run, run.parent):
        results = _read_json(place / RESULTS_FILE)
        scored = Path(str((results or {}).get("weights", ""))).absolute()
        if results is not None and run in scored.parents:
            return results
    return None


def model_card(
    model: nn.Module,
    target: str,
    settings: GenerationSettings,
    weights: Path | None,
) -> str:
    """README.md: the Hub's metadata header, then the recipe, data, score and parameters."""
    cfg = model.cfg
    pipeline = {MARIAN: "translation", PEGASUS: "translation", GPT2: "text-generation"}
    pipeline[NEOX] = "text-generation"
    header = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {pipeline.get(target, 'fill-mask')}",
        "tags:",
        "- aiayn",
        f"- {target}",
    ]
    results = _run_results(weights)
    recipe = find_in_run(weights, RUN_CONFIG_FILE) if weights is not None else None
    parameters = model.num_parameters()
    body = [
        f"# {ARCHITECTURES[target]} exported from aiayn",
        "",
        f"A {cfg.architecture.replace('_', '-')} Transformer trained with aiayn, "
        f"exported as `{ARCHITECTURES[target]}` by "
        "`aiayn export`. It computes the same logits as the aiayn model (within 1e-4) "
        "and decodes the same tokens.",
        "",
        "## Parameters",
        "",
        f"{parameters:,} distinct parameters; d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"d_ff {cfg.d_ff}, layers {cfg.n_encoder_layers} + {cfg.n_decoder_layers} "
        f"(encoder + decoder), {cfg.vocab_size} pieces, positions {cfg.positional}, "
        f"{'pre' if cfg.norm_first else 'post'}-norm, {cfg.activation.value}.",
    ]
    if results is not None:
        model_index = results.get("bleu")
        if model_index is not None:
            header += [
                "model-index:",
                "- name: aiayn-export",
                "  results:",
                "  - task:",
                f"      type: {pipeline.get(target, 'fill-mask')}",
                "    dataset:",
                "      type: aiayn-prepared-corpus",
                "      name: the run's test split (its config.yaml's data.corpus)",
                "      split: test",
                "    metrics:",
                "    - type: bleu",
                f"      value: {model_index}",
                f"      name: test BLEU (sacrebleu, beam {results.get('beam')}, "
                f"alpha {results.get('alpha')})",
            ]
        body += ["", "## Results", "", "From the run's results.json:", "", "```json"]
        body += [strict_json(results, ensure_ascii=False).rstrip("\n"), "```"]
    if recipe is not None:
        body += ["", "## Recipe and data", "", f"The run's {RUN_CONFIG_FILE}:", "", "```yaml"]
        body += [recipe.read_text(encoding="utf-8").rstrip(), "```"]
    if target != BERT:
        body += [
            "",
            "## Generation",
            "",
            f"generation_config.json: beam {1 if target in LANGUAGE_MODELS else settings.beam}, "
            f"length penalty {settings.length_penalty} in transformers' form |Y|^alpha "
            "(aiayn's default is the paper's ((5 + |Y|) / 6)^alpha; the two rank long "
            "and short outputs differently), max_length "
            f"{settings.max_length or cfg.max_len}; pad and bos are never generated.",
        ]
    header.append("---")
    return "\n".join([*header, "", *body]) + "\n"
