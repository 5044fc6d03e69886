"""Model shapes, one module each, built by name from `ModelConfig.architecture`.

    encoder_decoder   the paper's Transformer (`aiayn.models.encoder_decoder`)
    decoder_only      GPT (`aiayn.models.decoder_only`)
    encoder_only      BERT (`aiayn.models.encoder_only`)

`build_model(cfg)` builds the registered shape; each shape's spec (its default task,
and the frozen form, user and CLI verb that the layers above add with `add_to_shape`)
is in `SHAPES`; see `aiayn.models.registry`.
"""

from aiayn.models.registry import (
    SHAPES,
    ShapeSpec,
    add_to_shape,
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
    "add_to_shape",
    "build_model",
    "register_model",
    "register_shape",
    "registered_models",
    "shape_spec",
    "spec_of",
]
