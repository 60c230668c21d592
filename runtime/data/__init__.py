"""Training data: the `Batch` every reader yields, and the readers."""

from runtime.data.batch import Batch

__all__ = ["Batch"]
