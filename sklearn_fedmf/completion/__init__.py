"""Federated matrix-completion estimators."""

from ._fedmc_admm import FedMCADMM

__all__ = ["FedMCADMM"]
