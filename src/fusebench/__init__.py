"""fusebench: measure whether fusing image-text embedding models beats the best single model."""

__version__ = "0.1.0"
FUSED = "fused"  # the fused retriever's name in a run's record (model names may not take it)


class FusebenchError(ValueError):
    """A user-facing error: bad input, bad config. The message says what is wrong and what is valid."""
