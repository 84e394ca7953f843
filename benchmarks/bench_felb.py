"""Felb, Felb-MU and the one-shot AggregatedBMF baselines on the paper's experiments.

Sections (``--only``):

- ``tiles``: ``make_binary_tiles(1000 x 200, 5 tiles, 5% XOR noise)`` over 10 clients, best of
  3 seeds: F1* (against the noise-free tiles), F1 and RMSD (against the data).

Methods: Felb, Felb-MU, and the one-shot ``AggregatedBMF`` federations (Algorithm 2) of Elbmf
(``agg-*``) and of the paper's cover-based baselines Asso, GreConD and MEBF with the Appendix
D settings (``asso-majority`` ...; majority vote, the paper's superscript v).
- ``noise``: the Q1 noise sweep (XOR noise 0 .. 50%, 10 clients x 500 rows, 500 columns,
  10 tiles, the paper's Section 4.1 setting).
- ``clients``: the Q2 client-count sweeps, scaled down from the paper's 2^16 rows (200
  columns, 5 tiles): scarcity (2^13 rows in all, n_i shrinks) and abundance (n_i = 500).
- ``ml-shape``: ``make_binary_ratings`` at the paper's MovieLens shape (162541 x 62423,
  density 0.002, skewed popularity, 20 taste groups) over 50 clients (~3250 users each),
  k = 20, beside the paper's MovieLens row; wall and CPU seconds and the peak resident
  memory of the process. ``--ml-syncs`` limits the synchronizations (the paper: 100): a sync
  costs the same throughout, so the table also extrapolates the CPU seconds of 100 syncs
  (the setup and first sync once, plus 99 times the median CPU seconds of the later syncs,
  measured by a callback; the clients run in threads of this process) and their wall time
  on 2 idle cores (the target: at most 10 minutes, 8 GB). A line per synchronization shows
  the training F1 and the seconds so far.
- ``movielens``: ml-latest-small binarized at rating >= 3.5 over 50 clients, k = 20, beside
  the paper's MovieLens numbers (a 162541 x 62423 release; the paper's "RMSD" is the sum of
  the 50 per-client RMSDs, printed here as ``rmsd_sum``).

Seconds are wall-clock per fit divided by the number of clients (the paper's s/C).

    python benchmarks/bench_felb.py --quick                   # smoke run, small sizes
    python benchmarks/bench_felb.py --only tiles noise
    python benchmarks/bench_felb.py --only movielens --methods felb-mu
    python benchmarks/bench_felb.py --only ml-shape --methods felb --ml-syncs 5

On 2 cores: tiles ~1 min, noise ~5 min, clients ~5 min, movielens ~3 min per method.
"""

import argparse
import resource
import time
from functools import partial

import numpy as np
from sklearn.preprocessing import binarize

from sklearn_fedmf.binary import AggregatedBMF, Felb
from sklearn_fedmf.datasets import load_movielens, make_binary_ratings, make_binary_tiles
from sklearn_fedmf.metrics import f1_boolean, rmsd, rmsd_sum_clients

METHODS = {
    "felb": lambda k, C, seed, T: Felb(k, n_clients=C, max_iter=T, random_state=seed),
    "felb-mu": lambda k, C, seed, T: Felb(k, n_clients=C, max_iter=T,
                                          solver_params={"update": "mu"}, random_state=seed),
    "agg-majority": lambda k, C, seed, T: AggregatedBMF(k, n_clients=C, local_iter=10 * T,
                                                        random_state=seed),
    "agg-round": lambda k, C, seed, T: AggregatedBMF(k, n_clients=C, local_iter=10 * T,
                                                     aggregation="round", random_state=seed),
    "agg-or": lambda k, C, seed, T: AggregatedBMF(k, n_clients=C, local_iter=10 * T,
                                                  aggregation="or", random_state=seed),
    # the paper's cover-based baselines, Appendix D settings, majority vote (superscript v)
    **{f"{name}-majority": partial(lambda name, k, C, seed, T: AggregatedBMF(
        k, n_clients=C, solver=name, random_state=seed), name)
       for name in ("asso", "grecond", "mebf")},
}
SYNTHETIC_DEFAULT = ["felb", "felb-mu", "agg-majority", "asso-majority", "grecond-majority",
                     "mebf-majority"]

# Felb paper, Tables 1 and 3, MovieLens row (Table 3's RMSD is the sum over the 50 clients)
PAPER_MOVIELENS = {"felb-mu": (0.193, 1.914), "felb": (0.163, 1.925),
                   "agg-majority": (0.000, 1.962), "zhang-majority": (0.017, 1.956)}


def run(method, X, k, C, seed, T, n_jobs, truth=None):
    model = METHODS[method](k, C, seed, T).set_params(n_jobs=n_jobs)
    tic = time.perf_counter()
    model.fit(X)
    seconds = time.perf_counter() - tic
    factors = (model.user_factors_, model.components_)
    out = {"f1": f1_boolean(X, factors), "rmsd": rmsd(X, factors), "s_per_client": seconds / C,
           "rmsd_sum": rmsd_sum_clients(X, factors, model.clients_)}
    if truth is not None:
        out["f1_star"] = f1_boolean(truth, factors)
    return out


def row(cells, widths):
    return "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))


def table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print(row(header, widths))
    print(row(["-" * w for w in widths], widths))
    for r in rows:
        print(row(r, widths))
    print()


def fmt(x):
    return f"{x:.3f}"


def bench_tiles(args):
    n, m, k, T = (300, 80, 3, 30) if args.quick else (1000, 200, 5, 100)
    data = make_binary_tiles(n, m, k, noise=0.05, random_state=0)
    print(f"== tiles: {n} x {m}, {k} tiles, 5% XOR noise, 10 clients, best of "
          f"{args.seeds} seeds (by F1*) ==")
    rows = []
    for method in args.methods:
        runs = [run(method, data.X, k, 10, s, T, args.n_jobs, data.X_clean)
                for s in range(args.seeds)]
        best = max(runs, key=lambda r: r["f1_star"])
        rows.append([method, fmt(best["f1_star"]), fmt(best["f1"]), fmt(best["rmsd"]),
                     " ".join(fmt(r["f1_star"]) for r in runs),
                     f"{np.mean([r['s_per_client'] for r in runs]):.3f}"])
    table(["method", "best F1*", "F1", "RMSD", "F1* per seed", "s/C"], rows)


def bench_noise(args):
    n_per, m, k, T = (100, 100, 4, 30) if args.quick else (500, 500, 10, 100)
    levels = (0.0, 0.25, 0.5) if args.quick else (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    print(f"== Q1 noise sweep: 10 clients x {n_per} rows, {m} columns, {k} tiles; mean of "
          f"{args.seeds} seeds ==")
    rows = []
    for noise in levels:
        data = make_binary_tiles(10 * n_per, m, k, noise=noise, random_state=1)
        for method in args.methods:
            runs = [run(method, data.X, k, 10, s, T, args.n_jobs, data.X_clean)
                    for s in range(args.seeds)]
            rows.append([f"{noise:.1f}", method] + [
                fmt(np.mean([r[key] for r in runs])) for key in ("f1_star", "f1", "rmsd",
                                                                  "s_per_client")])
    table(["noise", "method", "F1*", "F1", "RMSD", "s/C"], rows)


def bench_clients(args):
    m, k, T = (100, 4, 20) if args.quick else (200, 5, 100)
    n_total = 2**10 if args.quick else 2**13
    scarce = (4, 16) if args.quick else (4, 16, 64, 256)
    abundant = (4, 8) if args.quick else (4, 16, 64)
    n_per = 100 if args.quick else 500
    print(f"== Q2 client counts: {m} columns, {k} tiles, 5% XOR noise, one seed ==")
    rows = []
    for regime, counts in (("scarcity", scarce), ("abundance", abundant)):
        for C in counts:
            n = n_total if regime == "scarcity" else C * n_per
            data = make_binary_tiles(n, m, k, noise=0.05, random_state=2)
            for method in args.methods:
                r = run(method, data.X, k, C, 0, T, args.n_jobs, data.X_clean)
                rows.append([regime, C, n // C, method, fmt(r["f1_star"]), fmt(r["rmsd"]),
                             f"{r['s_per_client']:.4f}"])
    table(["regime", "C", "n_i", "method", "F1*", "RMSD", "s/C"], rows)


def bench_movielens(args):
    ml = load_movielens()
    X = binarize(ml.X, threshold=3.25).tocsr()  # ratings >= 3.5 (half-star steps)
    X.eliminate_zeros()
    C, k, T = args.ml_clients, 20, 100
    if args.quick:
        X, C, T = X[:100].tocsr(), 10, 5
    density = X.nnz / np.prod(X.shape)
    print(f"== MovieLens latest-small >= 3.5: {X.shape[0]} x {X.shape[1]}, density "
          f"{density:.4f}, {C} clients, k = {k}, T = {T} syncs x 10 steps ==")
    print(f"   an empty reconstruction scores F1 = 0, RMSD = {np.sqrt(density):.3f}, "
          f"rmsd_sum ~ {C * np.sqrt(density):.3f}; the paper's release has density 0.0015, "
          "so its empty rmsd_sum is 1.96")
    rows = []
    for method in args.methods:
        r = run(method, X, k, C, 0, T, args.n_jobs)
        paper = PAPER_MOVIELENS.get(method, (float("nan"),) * 2)
        rows.append([method, fmt(r["f1"]), fmt(r["rmsd"]), fmt(r["rmsd_sum"]), fmt(paper[0]),
                     fmt(paper[1]), f"{r['s_per_client']:.2f}"])
    table(["method", "F1", "RMSD", "rmsd_sum", "paper F1", "paper rmsd_sum", "s/C"], rows)


def bench_ml_shape(args):
    shape = (1625, 6242) if args.quick else (162541, 62423)
    C, k, T = (10, 20, 2) if args.quick else (50, 20, args.ml_syncs)
    tic = time.perf_counter()
    X = make_binary_ratings(*shape, 0.002, random_state=0).X
    print(f"== make_binary_ratings {shape[0]} x {shape[1]}, density "
          f"{X.nnz / np.prod(shape):.4f} ({X.nnz} ones, generated in "
          f"{time.perf_counter() - tic:.0f} s), {C} clients, k = {k}, {T} syncs x 10 steps ==")
    rows = []
    for method in args.methods:
        model = METHODS[method](k, C, 0, T).set_params(n_jobs=args.n_jobs)
        marks = []  # CPU seconds (this process and its threads) at the end of each sync
        wall, cpu0 = time.perf_counter(), time.process_time()
        if method.startswith("felb"):  # a line per sync: a long fit shows how far it got
            def mark(k, info, marks=marks, start=wall, cpu0=cpu0):
                marks.append(time.process_time())
                print(f"   sync {k}: F1 {info['record']['f1']:.3f}, CPU {marks[-1] - cpu0:.0f} s,"
                      f" wall {time.perf_counter() - start:.0f} s", flush=True)
            model.set_params(callback=mark)
        model.fit(X)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu0
        peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        factors = (model.user_factors_, model.components_)
        paper = PAPER_MOVIELENS.get(method, (float("nan"),) * 2)
        cpu_100 = cpu
        if marks:  # the setup and first sync once, then the median later sync 100 times over
            per_sync = np.median(np.diff(marks)) if len(marks) > 1 else marks[0] - cpu0
            cpu_100 = (marks[0] - cpu0) + (100 - 1) * per_sync + (cpu0 + cpu - marks[-1])
        rows.append([method, fmt(f1_boolean(X, factors)), fmt(rmsd(X, factors)),
                     fmt(rmsd_sum_clients(X, factors, model.clients_)), fmt(paper[0]),
                     fmt(paper[1]), len(marks) or "-", f"{wall:.0f}", f"{cpu:.0f}",
                     f"{cpu_100:.0f}", f"{cpu_100 / 2 / 60:.1f}", f"{peak_gb:.2f}"])
    table(["method", "F1", "RMSD", "rmsd_sum", "paper F1", "paper rmsd_sum", "syncs", "wall s",
           "CPU s", "CPU s/100 syncs", "min on 2 cores", "peak GB"], rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run on small sizes")
    parser.add_argument("--only", nargs="+", default=["tiles", "noise", "clients", "movielens"],
                        choices=["tiles", "noise", "clients", "movielens", "ml-shape"])
    parser.add_argument("--ml-syncs", type=int, default=100,
                        help="ml-shape: synchronizations to run (the paper: 100)")
    parser.add_argument("--methods", nargs="+", default=None, choices=sorted(METHODS))
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--ml-clients", type=int, default=50,
                        help="clients of the MovieLens run (the paper's setting is 50)")
    args = parser.parse_args()
    for section in args.only:
        section_args = argparse.Namespace(**vars(args))
        if args.methods is None:
            section_args.methods = (list(METHODS) if section == "tiles" else
                                    SYNTHETIC_DEFAULT if section in ("noise", "clients") else
                                    ["felb"] if section == "ml-shape" else
                                    ["felb", "felb-mu", "agg-majority"])
        if args.seeds is None:
            section_args.seeds = 3 if section == "tiles" and not args.quick else 1
        globals()[f"bench_{section.replace('-', '_')}"](section_args)


if __name__ == "__main__":
    main()
