"""Federated matrix-completion estimators."""

from ._fedmavg import FedMAvg
from ._fedmc_admm import FedMCADMM
from ._fedmgs import FedMGS
from ._rfrec import RFRec

__all__ = ["FedMAvg", "FedMCADMM", "FedMGS", "RFRec"]
