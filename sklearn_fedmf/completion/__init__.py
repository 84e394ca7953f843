"""Federated matrix-completion estimators."""

from ._fedmc_admm import FedMCADMM
from ._rfrec import RFRec

__all__ = ["FedMCADMM", "RFRec"]
