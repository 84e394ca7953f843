"""Secure aggregation's cost: seconds and bytes per phase of one secure sum.

Usage::

    python benchmarks/bench_secure.py           # n = 10 and 100 clients, vectors of 10,000
    python benchmarks/bench_secure.py --quick   # smoke run: n = 5, 20, vectors of 1,000
    python benchmarks/bench_secure.py --estimators            # fits, plain against secure
    python benchmarks/bench_secure.py --estimators --ratings 1000000  # MovieLens-1M-shaped

Each client uploads a float vector of length ``d`` (standard normal); the default encoding
(``clip = 2^16``, ``scale_bits = 24``, 64-bit ring). Every phase of the protocol runs in this
process, one client after another (:func:`sklearn_fedmf.secure.secure_sum`), so "client s" is
the *mean* seconds of one client's step (in a deployment the clients run at once) and
"server s" the server's. Bytes are per client: what one client uploads and downloads in the
phase (at most, over clients). A second row per ``n`` drops 10% of the clients after the
key-sharing phase, which the server recovers through their shares (the unmasking phase then
recomputes their pairwise masks with every survivor). Each ``n`` runs SecAgg (every pair of
clients masks; "graph" ``all``) and SecAgg+ with ``2 ceil(log2 n)`` neighbours per client.
The sum's max error against the plain sum is printed beside the encoding's bound.

``--estimators``: one table per estimator that supports ``secure_aggregation=True``, each
fitted twice on ``make_site_ratings("netflix-1m", n_ratings=...)`` (the MovieLens-1M shape
scaled down; 20,000 ratings by default) with one client per user and 10% of the clients per
round: fit seconds plain and secure, the mean bytes per round (up and down, every phase)
and the max relative difference of the fitted factors. The issue's target is a secure fit
at most 3x the plain one at the full size.
"""

import argparse
import math
import time
import warnings

import numpy as np

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RFRec
from sklearn_fedmf.datasets import make_site_ratings
from sklearn_fedmf.secure import FixedPointEncoding, secure_sum
from sklearn_fedmf.secure._protocol import PHASES

# (estimator, parameters, the plain fit's extra parameters, fitted factor)
ESTIMATORS = {
    "FedMCADMM": (FedMCADMM, dict(local_iter=10), {}, "components_"),
    "FedMAvg": (FedMAvg, {}, {}, "components_"),
    "FedMGS": (FedMGS, {}, {}, "components_"),
    # secure aggregation sums dense uploads: the plain fit with the same dense uploads
    "RFRec": (RFRec, {}, {"solver_params": {"simulate_uploads": True}}, "components_"),
    "FedBaseline": (FedBaseline, {}, {}, "item_bias_"),
}


def fit_seconds(est, X, clients):
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, clients=clients)
    return time.perf_counter() - start


def bench_estimators(n_ratings, max_iter):
    X = make_site_ratings("netflix-1m", n_ratings=n_ratings, random_state=0).X
    clients = np.arange(X.shape[0])  # one client per user
    print(f"{X.shape[0]:,} users (one client each) x {X.shape[1]:,} items, {X.nnz:,} ratings, "
          f"10% of the clients per round, {max_iter} rounds")
    header = (f"{'estimator':<12} {'plain s':>8} {'secure s':>9} {'ratio':>6} "
              f"{'MB/round plain':>15} {'MB/round secure':>16} {'max rel diff':>13}")
    print(header)
    print("-" * len(header))
    for name, (cls, params, plain_extra, attribute) in ESTIMATORS.items():
        params = dict(params, n_clients=X.shape[0], clients_per_round=0.1, max_iter=max_iter,
                      random_state=0)
        plain = cls(**params, **plain_extra)
        secure = cls(**params, secure_aggregation=True)
        fit_seconds(cls(**dict(params, max_iter=1), **plain_extra), X, clients)  # (compiles)
        t_plain, t_secure = fit_seconds(plain, X, clients), fit_seconds(secure, X, clients)
        mb = [np.mean([r["bytes_uploaded"] + r["bytes_downloaded"] for r in e.history_]) / 1e6
              for e in (plain, secure)]
        a, b = getattr(plain, attribute), getattr(secure, attribute)
        diff = float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-300))
        print(f"{name:<12} {t_plain:>8.2f} {t_secure:>9.2f} {t_secure / t_plain:>6.1f} "
              f"{mb[0]:>15.2f} {mb[1]:>16.2f} {diff:>13.1e}")


def run(n, d, drop_fraction, neighbours, seed=0):
    rng = np.random.default_rng(seed)
    uploads = {c: rng.standard_normal(d) for c in range(n)}
    dropped = set(range(0, n, round(1 / drop_fraction))) if drop_fraction else set()
    start = time.perf_counter()
    result = secure_sum(uploads, neighbours=neighbours, seed=seed,
                        dropout={"masked_input": dropped})
    wall = time.perf_counter() - start
    plain = np.sum([uploads[c] for c in result.clients], axis=0)
    error = float(np.max(np.abs(result.sum - plain)))
    return result, wall, error, FixedPointEncoding().error_bound(len(result.clients))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small sizes")
    parser.add_argument("--length", type=int, default=None, help="vector length d")
    parser.add_argument("--estimators", action="store_true",
                        help="fit every supporting estimator plain and secure")
    parser.add_argument("--ratings", type=int, default=20_000,
                        help="ratings of the MovieLens-1M-shaped set (--estimators)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per fit (--estimators)")
    args = parser.parse_args()
    if args.estimators:
        bench_estimators(args.ratings, args.rounds)
        return
    sizes = (5, 20) if args.quick else (10, 100)
    d = args.length or (1_000 if args.quick else 10_000)
    print(f"secure sum of n float vectors of length {d} (plain upload: {8 * d:,} bytes)")
    header = (f"{'n':>4} {'graph':>5} {'dropped':>7} {'phase':<15} {'client s':>9} "
              f"{'server s':>9} {'up B/client':>12} {'down B/client':>14}")
    print(header)
    print("-" * len(header))
    for n in sizes:
        for neighbours, drop in ((None, 0.0), (None, 0.1), (2 * math.ceil(math.log2(n)), 0.1)):
            result, wall, error, bound = run(n, d, drop, neighbours)
            graph = "all" if neighbours is None else str(neighbours)
            n_dropped = n - len(result.clients)
            for phase in PHASES:
                clients_s, server_s = result.seconds[phase]
                n_active = max(len(result.bytes_uploaded[phase]), 1)
                up = max(result.bytes_uploaded[phase].values(), default=0)
                down = max(result.bytes_downloaded[phase].values(), default=0)
                print(f"{n:>4} {graph:>5} {n_dropped:>7} {phase:<15} "
                      f"{clients_s / n_active:>9.4f} {server_s:>9.4f} {up:>12,} {down:>14,}")
            print(f"{n:>4} {graph:>5} {n_dropped:>7} {'total (wall)':<15} {wall:>9.3f} s for "
                  f"all; max error {error:.2e} <= bound {bound:.2e}")


if __name__ == "__main__":
    main()
