"""Metrics for federated matrix factorization: rating errors, top-N ranking, clustering and
binary scores."""

from ._binary import boolean_counts, f1_boolean, integrality_gap, rmsd, rmsd_sum_clients
from ._clustering import clustering_accuracy
from ._ranking import (
    average_precision_at_k,
    catalog_coverage,
    hit_rate_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
    sampled_rankings,
)
from ._regression import mae, rmse

__all__ = [
    "mae", "rmse",
    "hit_rate_at_k", "precision_at_k", "recall_at_k", "ndcg_at_k", "average_precision_at_k",
    "catalog_coverage", "sampled_rankings",
    "clustering_accuracy",
    "boolean_counts", "f1_boolean", "integrality_gap", "rmsd", "rmsd_sum_clients",
]
