"""Configuration, the ground floor: one frozen dataclass per concern, validated on
construction, and what a configuration names.

    model.py      `ModelConfig`: the network of section 3 (and its descendants' presets)
    training.py   `TrainConfig`: section 5's recipe, the run's limits, precision, schedule
    decoding.py   the length penalty's form, early stopping, the largest beam and exponent
    fields.py     what every config shares: type checks, enum members, seeds, plain dicts
    plugins.py    the one plug-in registry, which checks the names a config gives
    devices.py    the device a command runs on (`--device`), and the machine's name
    recipes/      the training recipes that ship with aiayn (package data)
    moved.py      the module paths of earlier layouts, importable for one release

Every config name is importable from `aiayn.config` itself, as before the split.
"""

from aiayn.config.decoding import MAX_ALPHA, MAX_BEAM, EarlyStopping, LengthPenalty
from aiayn.config.fields import (
    SEED_MAX,
    EnumT,
    check_field_types,
    check_seed,
    config_fields,
    config_from_dict,
    config_to_dict,
    enum_member,
    plain,
)
from aiayn.config.model import POOLINGS, SUBLAYER_KINDS, Activation, ModelConfig, split_sublayer
from aiayn.config.training import LRSchedule, Precision, TrainConfig

__all__ = [
    "MAX_ALPHA",
    "MAX_BEAM",
    "POOLINGS",
    "SEED_MAX",
    "SUBLAYER_KINDS",
    "Activation",
    "EarlyStopping",
    "EnumT",
    "LRSchedule",
    "LengthPenalty",
    "ModelConfig",
    "Precision",
    "TrainConfig",
    "check_field_types",
    "check_seed",
    "config_fields",
    "config_from_dict",
    "config_to_dict",
    "enum_member",
    "plain",
    "split_sublayer",
]
