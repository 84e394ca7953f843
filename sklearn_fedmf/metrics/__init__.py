"""Metrics for federated matrix factorization: rating errors, clustering and binary scores."""

from ._binary import boolean_counts, f1_boolean, integrality_gap, rmsd, rmsd_sum_clients
from ._clustering import clustering_accuracy
from ._regression import mae, rmse

__all__ = [
    "mae", "rmse",
    "clustering_accuracy",
    "boolean_counts", "f1_boolean", "integrality_gap", "rmsd", "rmsd_sum_clients",
]
