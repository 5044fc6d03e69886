"""aiayn: the Transformer of "Attention Is All You Need" as a toolkit."""

from aiayn.config import Activation, ModelConfig, Positional
from aiayn.model import EncoderOutput, Transformer

__all__ = ["Activation", "EncoderOutput", "ModelConfig", "Positional", "Transformer"]
__version__ = "0.1.0"
