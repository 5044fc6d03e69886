"""aiayn: the Transformer of "Attention Is All You Need" as a toolkit."""

from aiayn.config import Activation, AttentionKernel, ModelConfig
from aiayn.inference import freeze
from aiayn.model import EncoderOutput, Transformer
from aiayn.models import build_model

__all__ = [
    "Activation",
    "AttentionKernel",
    "EncoderOutput",
    "ModelConfig",
    "Transformer",
    "build_model",
    "freeze",
]
__version__ = "0.1.0"
