"""Everything between text on disk and a padded batch of ids."""

from aiayn.data.batch import Batch

__all__ = ["Batch"]
