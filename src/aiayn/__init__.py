"""aiayn: the Transformer of "Attention Is All You Need" as a toolkit.

The package is layered; each layer imports only from the layers below it:

    cli         the `aiayn` command
    apps        translate, generate, fill, quickstart, serve, the explorer
    analysis    heads, pruning, attention maps
    training    the trainer, recipes, tasks, loss, optimiser, stopping
    inference   freeze (fast frozen models, int8), search, shortlists  |  io: checkpoints, Marian / Hugging Face readers
    models      one module per shape: encoder_decoder, decoder_only, encoder_only
    nn          the paper's blocks: attention, kernels, layers, positions, masks
    data        corpora, tokenizers, batching
    config, files, plugins   configs, atomic files, the one plug-in registry
"""

from aiayn import _moved
from aiayn.config import Activation, AttentionKernel, ModelConfig
from aiayn.inference.frozen import freeze
from aiayn.io.export import export
from aiayn.models import build_model
from aiayn.models.encoder_decoder import EncoderOutput, Transformer

_moved.install()

__all__ = [
    "Activation",
    "AttentionKernel",
    "EncoderOutput",
    "ModelConfig",
    "Transformer",
    "build_model",
    "export",
    "freeze",
]
__version__ = "0.1.0"
