"""Federated clustering: orthogonal NMF solved by FedMAvg or FedMGS."""

from ._federated_clustering import FederatedClustering

__all__ = ["FederatedClustering"]
