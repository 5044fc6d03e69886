"""Model shapes, one module each, built by name from `ModelConfig.architecture`.

    encoder_decoder   the paper's Transformer (`aiayn.models.encoder_decoder`)
    decoder_only      GPT (`aiayn.models.decoder_only`)
    encoder_only      BERT (`aiayn.models.encoder_only`)

`build_model(cfg)` builds the registered shape; each shape's spec (its frozen form,
user, CLI verb and default task) is in `SHAPES`; see `aiayn.models.registry`.
"""

from aiayn.models.registry import (
    SHAPES,
    ShapeSpec,
    build_model,
    register_model,
    register_shape,
    registered_models,
    shape_spec,
    spec_of,
)

__all__ = [
    "SHAPES",
    "ShapeSpec",
    "build_model",
    "register_model",
    "register_shape",
    "registered_models",
    "shape_spec",
    "spec_of",
]
