"""Federated Boolean (binary) matrix factorization: Felb, Felb-MU and one-shot baselines."""

from ._aggregated import AggregatedBMF
from ._felb import Felb

__all__ = ["AggregatedBMF", "Felb"]
