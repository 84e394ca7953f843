"""Federated clustering accuracy: the paper's synthetic data (Table I) and sklearn's digits.

Usage::

    python benchmarks/bench_clustering.py --table synthetic --case 1   # Case 1 split
    python benchmarks/bench_clustering.py --table synthetic --case 2   # Case 2 (Table I)
    python benchmarks/bench_clustering.py --case 2 --only FedMGS:10    # one row of it
    python benchmarks/bench_clustering.py --table digits               # 20 label-skewed clients
    python benchmarks/bench_clustering.py --table digits --seeds 5 --defaults-only
    python benchmarks/bench_clustering.py --table fedpalm              # Fig. 2b: FedPALM vs Q
    python benchmarks/bench_clustering.py --table secure --rounds 100  # plain vs secure sums
    python benchmarks/bench_clustering.py --quick                      # smoke run, small sizes

Synthetic data (the paper's Section V, as its reference code generates it): centers
``W ~ U[0,1]^{M x K}``, random cluster sizes, ``X = max(0, W H + E)`` with Gaussian ``E``
rescaled until the SNR ``10 log10(||W H||^2 / ||X - W H||^2)`` is -3 dB, then 3 % of the
samples replaced by outliers ``5 U[0,1]^M``; M = 2000, N = 10000, K = 20. Splits over P = 100
clients: Case 1 random and balanced, Case 2 one K-means cluster of the samples per
client (``partition_fedmf_cases``). Algorithms with the paper's settings
(``PAPER_SETTINGS``: random start, one run, rho0 = 1e-8; Q1 = 10; FedMAvg:
diminishing Q2 with Q_hat = 5, partial client communication; FedMGS: Q2 = 100), SNCP with the
reference code's forced increase and cap, at most ``--rounds`` rounds (the reference code:
2000 for FedMAvg, 1000 for FedMGS). K-means++ is sklearn's centralized ``KMeans(n_init=10)``;
Table I's ``KM`` row is the paper's distributed KM|| (its Section V-G). ACC in % (Hungarian
matching).

Digits: ``load_digits`` (1797 x 64, 10 classes) over 20 clients that each hold mostly two
digits (``partition_label_skew``), ACC of both algorithms beside centralized
``KMeans(n_init=10)`` of the same run, and their ratio. First the estimator's defaults
(``def`` rows: no knob but ``random_state``, all clients every round, ``--rounds`` rounds; the
ratio to KMeans of the same seed, mean and min over ``--seeds``; the target is 0.9).
Then tuned rows: like KMeans, the best of ``--n-init 10`` starts (lowest clustering cost);
``--rho0 1e-4``; FedMAvg with the paper's per-dataset knob ``--q-hat 100`` (with Q_hat = 5
its W steps, d = 5 L_W, are so short that SNCP raises rho before the centers settle).

FedPALM (Fig. 2b, Remark 1): the objective (2) per round at a fixed ``rho = 1e-8 ||X||^2 / N``
(no SNCP, so the curves compare one problem; one run) on the synthetic data
(``--fedpalm-size``, Case 2), FedPALM with ``Q = 2, 10, 20`` (``Q/2`` pairs of an H step and a
projected W step per client) beside
FedMAvg (``Q = 2``: ``Q1 = Q2 = 1``; and the paper's ``Q1 = 10``, ``Q_hat = 5``) and FedMGS
(``Q1 = 10``, ``Q2 = 100``). The paper: FedPALM "cannot perform well except for Q = 2".
"""

import argparse
import time
import warnings

import numpy as np
from sklearn.cluster import KMeans
from sklearn.datasets import load_digits

from sklearn_fedmf import FederatedClustering
from sklearn_fedmf.cluster import PAPER_SETTINGS
from sklearn_fedmf.datasets import partition_fedmf_cases, partition_label_skew
from sklearn_fedmf.metrics import clustering_accuracy

TABLE_I_SYN = {  # Case 2, P = 100, synthetic column (%)
    ("KM||", None): 69.4, ("BEL", None): 38.7, ("CAL", None): 63.6,
    ("FedMAvg", 10): 86.2, ("FedMAvg", 100): 85.5, ("FedMGS", 10): 88.4, ("FedMGS", 100): 87.7,
}


def make_synthetic(n_samples, n_features, n_clusters, *, snr_db=-3.0, outliers=0.03, seed=0):
    """The reference code's generator (the paper's Section V), samples as rows."""
    rng = np.random.default_rng(seed)
    W = rng.random((n_clusters, n_features))
    sizes = rng.uniform(0.5, 1.5, n_clusters)
    y = rng.choice(n_clusters, n_samples, p=sizes / sizes.sum())
    signal = W[y]
    E = rng.normal(size=signal.shape)
    target = (signal**2).sum() / 10 ** (snr_db / 10)
    scale = np.sqrt(target / (E**2).sum())
    for _ in range(100):  # the clipping at 0 shrinks the noise: rescale until exact
        X = np.maximum(signal + scale * E, 0.0)
        noise = ((X - signal) ** 2).sum()
        if abs(noise / target - 1) < 1e-12:
            break
        scale *= np.sqrt(target / noise)
    rows = rng.choice(n_samples, int(round(outliers * n_samples)), replace=False)
    X[rows] = 5.0 * rng.random((len(rows), n_features))
    return X, y


def run(algorithm, m, X, y, clients, rounds, seed, n_jobs, **params):
    model = FederatedClustering(
        len(np.unique(y)), algorithm=algorithm.lower(), clients_per_round=m, max_iter=rounds,
        random_state=seed, n_jobs=n_jobs, **params,
    )
    tic = time.perf_counter()
    model.fit(X, clients=clients)
    return {
        "acc": 100 * clustering_accuracy(y, model.labels_),
        "rounds": model.n_iter_,
        "seconds": time.perf_counter() - tic,
        "MB up": sum(r["bytes_uploaded"] for r in model.history_) / 1e6,
    }


def kmeans_acc(X, y, seed):
    tic = time.perf_counter()
    labels = KMeans(len(np.unique(y)), n_init=10, random_state=seed).fit(X).labels_
    return {"acc": 100 * clustering_accuracy(y, labels), "rounds": 0,
            "seconds": time.perf_counter() - tic, "MB up": 0.0}


def print_row(name, m, results, paper, digits=1):
    mean = {key: np.mean([r[key] for r in results]) for key in results[0]}
    sd = np.std([r["acc"] for r in results])
    m_text = "-" if m is None else str(m)
    paper_text = "-" if paper is None else f"{paper:.{digits}f}"
    print(f"{name:12s} {m_text:>4s} {mean['acc']:7.1f} ± {sd:4.1f} {paper_text:>9s} "
          f"{mean['rounds']:7.0f} {mean['seconds']:8.1f} {mean['MB up']:9.1f}", flush=True)


def synthetic_table(case, sizes, rounds, seeds, n_clients, ms, n_jobs, only=None):
    X, y = make_synthetic(*sizes, seed=0)
    clients = partition_fedmf_cases(n_clients=n_clients, case=case, X=X, method="kmeans",
                                    random_state=0) if case == 2 else \
        partition_fedmf_cases(y, n_clients=n_clients, case=1, random_state=0)
    counts = np.bincount(clients)
    print(f"synthetic M={sizes[1]} N={sizes[0]} K={sizes[2]}, Case {case}: {n_clients} "
          f"clients of {counts.min()}-{counts.max()} samples, {seeds} seed(s), "
          f"at most {rounds} rounds\n")
    header = f"{'method':12s} {'m':>4s} {'ACC %':>14s} {'Table I':>9s} {'rounds':>7s} " \
             f"{'seconds':>8s} {'MB up':>9s}"
    print(header + "\n" + "-" * len(header))
    for algorithm in ("FedMAvg", "FedMGS"):
        for m in ms:
            if only and f"{algorithm}:{m}" not in only:
                continue
            results = [run(algorithm, m, X, y, clients, rounds, s, n_jobs,
                           **PAPER_SETTINGS["FederatedClustering"]) for s in range(seeds)]
            paper = TABLE_I_SYN.get((algorithm, m)) if case == 2 else None
            print_row(algorithm, m, results, paper)
    if not only or "K-means++" in only:
        print_row("K-means++", None, [kmeans_acc(X, y, s) for s in range(seeds)], None)
    if case == 2 and not only:
        for name in ("KM||", "BEL", "CAL"):
            print(f"{name:12s} {'-':>4s} {'(not run)':>14s} {TABLE_I_SYN[(name, None)]:9.1f}")


def digits_table(rounds, seeds, n_jobs, quick, ms, q_hat, defaults_only=False, n_init=10,
                 rho0=1e-4):
    X, y = load_digits(return_X_y=True)
    if quick:
        X, y = X[:400], y[:400]
    clients = partition_label_skew(y, 20, classes_per_client=2, random_state=0)
    held = [len(np.unique(y[clients == c])) for c in range(20)]
    print(f"\ndigits {X.shape[0]} x {X.shape[1]}, 20 clients holding {min(held)}-{max(held)} "
          f"digits each, {seeds} seed(s), at most {rounds} rounds"
          + ("" if defaults_only else f"; tuned rows: n_init={n_init}, rho0={rho0}, FedMAvg "
                                      f"q_hat={q_hat}") + "\n")
    header = f"{'method':12s} {'m':>4s} {'ACC %':>14s} {'/ KMeans':>9s} {'rounds':>7s} " \
             f"{'seconds':>8s} {'MB up':>9s}"
    print(header + "\n" + "-" * len(header))
    reference = [kmeans_acc(X, y, s) for s in range(seeds)]
    base = np.mean([r["acc"] for r in reference])
    print_row("KMeans", None, reference, 1.0, digits=2)
    for algorithm in ("FedMGS", "FedMAvg"):  # the estimator as a user builds it: no knobs
        results = [run(algorithm, None, X, y, clients, rounds, s, n_jobs) for s in range(seeds)]
        ratios = [r["acc"] / k["acc"] for r, k in zip(results, reference)]
        print_row(f"{algorithm} def", 20, results, np.mean(ratios), digits=2)
        print(f"{'':12s} {'':>4s} ratio to KMeans of the same seed: mean {np.mean(ratios):.3f}"
              f", min {np.min(ratios):.3f}", flush=True)
    if defaults_only:
        return
    for algorithm, own in (("FedMGS", {}), ("FedMAvg", {"q_hat": q_hat})):
        solver = {"rho0": rho0, **own}
        for m in ms:
            results = [run(algorithm, m, X, y, clients, rounds, s, n_jobs, n_init=n_init,
                           solver_params=solver) for s in range(seeds)]
            print_row(algorithm, m or 20, results, np.mean([r["acc"] for r in results]) / base,
                      digits=2)


def fedpalm_table(sizes, rounds, n_clients, m, n_jobs, marks):
    """Fig. 2b: objective per round of FedPALM at several Q beside FedMAvg and FedMGS."""
    X, y = make_synthetic(*sizes, seed=0)
    clients = partition_fedmf_cases(n_clients=n_clients, case=2, X=X, method="kmeans",
                                    random_state=0)
    print(f"\nFig. 2b: synthetic M={sizes[1]} N={sizes[0]} K={sizes[2]}, Case 2, "
          f"{n_clients} clients, m={m}, fixed rho (no SNCP); objective (2) after round\n")
    marks = [r for r in marks if r <= rounds]
    header = f"{'method':22s}" + "".join(f"{r:>11d}" for r in marks) + f"{'ACC %':>8s}"
    print(header + "\n" + "-" * len(header))
    fedmavg = dict(algorithm="fedmavg")
    rows = [("FedMAvg Q=2 (1+1)", dict(fedmavg, local_iter_u=1, local_iter_v=1), {}),
            ("FedMAvg Q1=10 Qhat=5", dict(fedmavg, local_iter_u=10), {"q_hat": 5})]
    rows += [(f"FedPALM Q={2 * pairs}", dict(fedmavg, local_iter_u=pairs),
              {"variant": "fedpalm"}) for pairs in (1, 5, 10)]
    rows.append(("FedMGS Q1=10 Q2=100", dict(algorithm="fedmgs", local_iter_u=10,
                                              local_iter_v=100), {}))
    for name, params, solver in rows:
        model = FederatedClustering(sizes[2], clients_per_round=m, max_iter=rounds, tol=0.0,
                                    n_init=1, random_state=0, n_jobs=n_jobs, **params,
                                    solver_params={"sncp": False, "rho0": 1e-8, **solver})
        model.fit(X, clients=clients)
        objective = [model.history_[r - 1]["objective"] for r in marks]
        acc = 100 * clustering_accuracy(y, model.labels_)
        print(f"{name:22s}" + "".join(f"{f:11.5g}" for f in objective) + f"{acc:8.1f}",
              flush=True)


def secure_table(rounds, n_jobs):
    """Digits over 20 label-skewed clients, half of them per round, a random start and
    ``n_init=2``: each setting fitted plain and with ``secure_aggregation=True``; seconds,
    bytes per round (up and down, every phase), the largest relative difference of the
    centers and the ACC of both."""
    X, y = load_digits(return_X_y=True)
    clients = partition_label_skew(y, 20, classes_per_client=2, random_state=0)
    settings = {"FedMGS": dict(algorithm="fedmgs"),
                "FedMAvg local": dict(algorithm="fedmavg", solver_params={"w_step": "local"}),
                "K-means": dict(algorithm="fedmavg",
                                solver_params={"w_step": "local", "h_constraint": "onehot"})}
    print(f"digits {X.shape[0]} x {X.shape[1]}, 20 clients (2 digits each), 10 per round, "
          f"{rounds} rounds, init='random', n_init=2")
    header = (f"{'setting':<14} {'plain s':>8} {'secure s':>9} {'ratio':>6} {'KB/round plain':>15}"
              f" {'KB/round secure':>16} {'max rel diff':>13} {'ACC plain':>10} {'ACC secure':>11}")
    print(header)
    print("-" * len(header))
    for name, params in settings.items():
        fits, seconds = [], []
        for secure in (False, True):
            est = FederatedClustering(n_clusters=10, n_clients=20, clients_per_round=10,
                                      max_iter=rounds, init="random", n_init=2, random_state=0,
                                      n_jobs=n_jobs, secure_aggregation=secure, **params)
            start = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fits.append(est.fit(X, clients=clients))
            seconds.append(time.perf_counter() - start)
        kb = [np.mean([r["bytes_uploaded"] + r["bytes_downloaded"] for r in e.history_]) / 1e3
              for e in fits]
        a, b = fits[0].cluster_centers_, fits[1].cluster_centers_
        diff = float(np.max(np.abs(a - b)) / np.max(np.abs(a)))
        acc = [100 * clustering_accuracy(y, e.labels_) for e in fits]
        print(f"{name:<14} {seconds[0]:>8.2f} {seconds[1]:>9.2f} {seconds[1] / seconds[0]:>6.1f}"
              f" {kb[0]:>15.1f} {kb[1]:>16.1f} {diff:>13.1e} {acc[0]:>10.1f} {acc[1]:>11.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=["synthetic", "digits", "fedpalm", "secure"],
                        default="synthetic")
    parser.add_argument("--case", type=int, choices=[1, 2], default=2)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--n-jobs", type=int, default=1)
    parser.add_argument("--only", nargs="+", default=None,
                        help="synthetic: rows to run, e.g. FedMAvg:10 FedMGS:100 K-means++ "
                             "(a full table takes ~30 min on 2 cores)")
    parser.add_argument("--n-init", type=int, default=10, help="digits: starts per fit")
    parser.add_argument("--rho0", type=float, default=1e-4, help="digits: initial penalty")
    parser.add_argument("--q-hat", type=int, default=100, help="digits: FedMAvg's Q_hat")
    parser.add_argument("--m", type=int, nargs="+", default=[20, 10],
                        help="digits: clients per round (20 = all)")
    parser.add_argument("--fedpalm-size", type=int, nargs=4, default=[2000, 200, 10, 20],
                        metavar=("N", "M", "K", "P"), help="fedpalm: samples, features, "
                        "clusters, clients")
    parser.add_argument("--defaults-only", action="store_true",
                        help="digits: only KMeans and the estimator's defaults")
    parser.add_argument("--quick", action="store_true", help="small sizes, few rounds, all")
    args = parser.parse_args()
    if args.quick:
        for case in (1, 2):
            synthetic_table(case, (600, 100, 5), 50, 1, 20, (5, 20), args.n_jobs)
            print()
        digits_table(50, 1, args.n_jobs, True, (None, 10), 5)
        fedpalm_table((400, 50, 4), 20, 8, 4, args.n_jobs, (1, 5, 20))
    elif args.table == "secure":
        secure_table(args.rounds, args.n_jobs)
    elif args.table == "fedpalm":
        n, m_features, k, p = args.fedpalm_size
        fedpalm_table((n, m_features, k), args.rounds, p, p // 2, args.n_jobs,
                      (1, 10, 50, 100, 200, 500, 1000))
    elif args.table == "synthetic":
        synthetic_table(args.case, (10000, 2000, 20), args.rounds, args.seeds, 100, (10, 100),
                        args.n_jobs, args.only)
    else:
        digits_table(args.rounds, args.seeds, args.n_jobs, False,
                     [None if m == 20 else m for m in args.m], args.q_hat,
                     defaults_only=args.defaults_only, n_init=args.n_init, rho0=args.rho0)


if __name__ == "__main__":
    main()
