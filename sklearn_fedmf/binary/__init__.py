"""Federated Boolean (binary) matrix factorization: Felb, Felb-MU and one-shot baselines,
and the centralized cover-based baselines Asso, GreConD and MEBF."""

from ._aggregated import AggregatedBMF
from ._cover import MEBF, Asso, GreConD
from ._felb import Felb

__all__ = ["AggregatedBMF", "Asso", "Felb", "GreConD", "MEBF"]
