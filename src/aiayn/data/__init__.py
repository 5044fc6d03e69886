"""Everything between text on disk and a padded batch of ids."""

from aiayn.data.batch import Batch
from aiayn.data.batching import TokenBatcher
from aiayn.data.corpus import PreparedCorpus

__all__ = ["Batch", "PreparedCorpus", "TokenBatcher"]
