"""aiayn: the Transformer of "Attention Is All You Need" as a toolkit.

The package is layered; each layer imports only from the layers below it:

    cli         the `aiayn` command
    apps        translate, generate, fill, quickstart, serve, the explorer
    analysis    heads, pruning, attention maps
    training    the trainer, recipes, tasks, loss, optimiser, stopping
    inference   freeze (fast frozen models, int8), search, shortlists  |  io: checkpoints, Marian / Hugging Face readers
    models      one module per shape: encoder_decoder, decoder_only, encoder_only
    nn          the paper's blocks: attention, kernels, layers, positions, masks
    data        files on disk (atomic writes, line reading), corpora, tokenizers, batching
    config      the configs, the one plug-in registry, devices, the packaged recipes
"""

import enum
import functools
import warnings
from typing import Any

from aiayn.config import Activation, ModelConfig
from aiayn.config import moved as _moved
from aiayn.inference.frozen import freeze
from aiayn.io.export import export
from aiayn.models import build_model
from aiayn.models.encoder_decoder import EncoderOutput, Transformer

_moved.install()

__all__ = [
    "Activation",
    "EncoderOutput",
    "ModelConfig",
    "Transformer",
    "build_model",
    "export",
    "freeze",
]
__version__ = "0.1.0"


@functools.cache
def _attention_kernel() -> type[enum.Enum]:
    """The enum of the first three kernels' names that aiayn 0.1 exported."""
    names = {"SDPA": "sdpa", "EXPLICIT": "explicit", "SLIDING_WINDOW": "sliding_window"}
    return enum.Enum("AttentionKernel", names, type=str, module=__name__)


def __getattr__(name: str) -> Any:
    """`aiayn.AttentionKernel`, deprecated: kept for one release, with a warning."""
    if name == "AttentionKernel":
        warnings.warn(
            "aiayn.AttentionKernel is deprecated and will be removed in the next release: "
            "ModelConfig.attention takes any registered kernel's name (the strings "
            "aiayn.nn.kernels.KERNELS.names() lists), and a kernel declares what it "
            "supports (aiayn.nn.kernels.Kernel.capabilities)",
            DeprecationWarning,
            stacklevel=2,
        )
        return _attention_kernel()
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
