"""watch(): one line to monitor a model while it trains (results schema in `_results.py`)."""

from ._results import ACTIVATION_STATS, GRAD_STATS, WatchResults

__all__ = ["ACTIVATION_STATS", "GRAD_STATS", "WatchResults"]
