"""Federated clustering: orthogonal NMF solved by FedMAvg or FedMGS."""

from ._federated_clustering import FederatedClustering

__all__ = ["FederatedClustering", "PAPER_SETTINGS"]

# Wang and Chang's settings, one parameter set away from the defaults (which are measured:
# benchmarks/bench_clustering.py --table digits, and the user guide's Clustering section): the
# random start, one run, and SNCP from rho = 1e-8 ||X||^2 / N (the paper's Section V-A and V-F).
# ``FederatedClustering(**PAPER_SETTINGS["FederatedClustering"])`` is the estimator of the
# paper's Table I (with its ``algorithm``, ``n_clients`` and ``clients_per_round``).
PAPER_SETTINGS = {
    "FederatedClustering": {"init": "random", "n_init": 1, "solver_params": {"rho0": 1e-8}},
}
