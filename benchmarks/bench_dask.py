"""FedMC-ADMM on a Dask cluster against the same fit on local threads.

A ``LocalCluster`` of worker processes on loopback stands in for remote machines: each
client's data block is sent to one worker once per fit (``resident_blocks``), and each round
only the sampled clients' states, the broadcast and the uploads travel. The script checks that
both fits give the same model bit for bit and prints their times and what the cluster moved.

    python benchmarks/bench_dask.py --quick          # small matrix, seconds
    python benchmarks/bench_dask.py                  # ML-1M shape
    python benchmarks/bench_dask.py --shape netflix  # 480,189 x 17,770, 1e8 ratings, rank 13

Needs the optional extra: ``pip install "sklearn_fedmf[dask]"``.
"""

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from run_all import RANK, cached_matrix  # noqa: E402  (the same cached matrices)

from sklearn_fedmf._engine import nbytes  # noqa: E402


def fit(X, n_jobs, rounds, rank):
    from sklearn_fedmf import FedMCADMM
    from sklearn_fedmf.completion import PAPER_SETTINGS

    model = FedMCADMM(n_components=rank, n_clients=100, clients_per_round=10, local_iter=10,
                      max_iter=rounds, eval_every=25, random_state=0, n_jobs=n_jobs,
                      **PAPER_SETTINGS["FedMCADMM"])
    tic = time.perf_counter()
    model.fit(X)
    return model, time.perf_counter() - tic


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="ml1m", choices=sorted(RANK))
    parser.add_argument("--quick", action="store_true", help="tiny matrix and 5 rounds")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache-dir", default=Path(os.environ.get(
        "XDG_CACHE_HOME", Path.home() / ".cache")) / "sklearn_fedmf" / "benchmarks")
    args = parser.parse_args()
    import distributed
    from joblib import parallel_config

    X = cached_matrix(args.shape, args.quick, args.cache_dir)
    rounds = 5 if args.quick else args.rounds
    rank = RANK[args.shape]
    local, local_seconds = fit(X, args.workers, rounds, rank)
    with distributed.LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster, \
            distributed.Client(cluster):
        fit(X[:2000], args.workers, 1, rank)  # start the workers and compile their kernels
        with parallel_config(backend="dask"):
            remote, remote_seconds = fit(X, args.workers, rounds, rank)
    same = (np.array_equal(local.components_, remote.components_)
            and np.array_equal(local.user_factors_, remote.user_factors_))
    protocol = sum(r["bytes_uploaded"] + r["bytes_downloaded"] for r in remote.history_)
    # The driver simulates the clients: their states go to the workers and back each round.
    state = np.mean([nbytes(s) for s in remote._federation.client_states])
    print(f"FedMCADMM, {X.shape[0]} x {X.shape[1]}, {X.nnz:,} ratings, rank {rank}, 10 of 100 "
          f"clients, N = 10, {rounds} rounds; {args.workers} workers")
    print(f"{'where':<34}{'fit s':>8}{'same model':>12}")
    print(f"{f'threads, n_jobs={args.workers}':<34}{local_seconds:>8.1f}{'':>12}")
    print(f"{f'Dask LocalCluster, {args.workers} processes':<34}{remote_seconds:>8.1f}"
          f"{'yes' if same else 'NO':>12}")
    print(f"per round: the protocol's messages {protocol / rounds / 2**20:,.1f} MiB (history_); "
          f"the simulated clients' states, to the workers and back, "
          f"{2 * 10 * state / 2**20:,.1f} MiB; the data blocks went once, before round 1")
    if not same:
        sys.exit("the Dask fit differs from the local fit")


if __name__ == "__main__":
    main()
