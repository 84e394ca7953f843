"""Metrics for federated matrix factorization: rating errors, clustering and binary scores."""

from ._regression import mae, rmse

__all__ = ["mae", "rmse"]
