"""Default fit time beside Surprise's ``SVD()`` on two 1M-rating sets (issue 26, point 6).

    python benchmarks/bench_fit_time.py                      # both sets, median of 3 runs
    python benchmarks/bench_fit_time.py --runs 1 --estimators FedMGS --data 1m-full
    python benchmarks/bench_fit_time.py --with-off            # also early_stopping=False
    python benchmarks/bench_fit_time.py --with-one-thread     # also n_jobs=1
    python benchmarks/bench_fit_time.py --quick               # smoke run: 20,000 ratings
    python benchmarks/bench_fit_time.py --data ml-1m --movielens-dir DIR --estimators FedMGS

The sets (``--data``): ``netflix-1m`` is ``make_site_ratings("netflix-1m", random_state=0)``
(1,000,000 ratings, Netflix's titles and activity, half stars 0.5-5); ``1m-full`` is
``make_ratings(6040, 3706, 1000209, noise=0.5, random_state=0)``, MovieLens 1M's shape with
a rank-5 structure (``1m-0.5`` of ``bench_defaults.py`` before its 8-fold down-sampling).
``ml-1m`` is the real MovieLens 1M read from ``--movielens-dir`` (the folder holding its
``ratings.dat``; the repository does not ship it, and the set is left out with a note when no
folder is given). Each is split 80/20 at random over the ratings (seed 0) as in ``bench_accuracy.py
--all-defaults``. Each estimator runs with all its defaults (``random_state=0`` only) through
``RatingRegressor``; on 800,000 training ratings its default ``early_stopping="auto"`` is on.
``--with-off`` adds the same fit with ``early_stopping=False`` (every round, no hold-out);
``--with-one-thread`` adds it with ``n_jobs=1`` (the default ``n_jobs=None`` runs a fit of
this size on every core; the model is the same).

Each run fits Surprise ``BaselineOnly`` and ``SVD()`` and then every estimator on the same
split, so the ratio ``fit s / SVD s`` of one run compares fits made under the same load.
Columns: rounds run, kept round, median fit seconds over ``--runs`` runs, the ratio to
``SVD()`` of each run and their median, test RMSE (of the first run; every run is the same
model). Seconds depend on the machine and its load: compare within a run (the ratios).
"""

import argparse
import statistics
import time
import warnings

import numpy as np
from bench_accuracy import (
    REAL_1M,
    entrywise_split,
    load_real,
    movielens_folder,
    pairs,
    surprise_rows,
)

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.datasets import make_ratings, make_site_ratings

ESTIMATORS = {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec}
DATA = ("netflix-1m", "1m-full", REAL_1M)
PEERS = ("BaselineOnly", "SVD")


def load(name, quick, movielens_dir=None):
    """The rating matrix of one set (``quick``: 20,000 ratings of the same shape's kind; the
    real ``ml-1m``: one user in fifty)."""
    if name == REAL_1M:
        X = load_real(name, movielens_dir).X.tocsr()
        return X[::50] if quick else X
    if name == "netflix-1m":
        return make_site_ratings("netflix-1m", n_ratings=20_000 if quick else None,
                                 random_state=0).X
    down = 50 if quick else 1  # (--quick: 120 users, 20,004 ratings)
    return make_ratings(6040 // down, 3706, 1000209 // down, noise=0.5, random_state=0).X


def fit_seconds(cls, params, P_train, y_train):
    tic = time.perf_counter()
    fitted = RatingRegressor(cls(random_state=0, **params)).fit(P_train, y_train)
    return time.perf_counter() - tic, fitted


def run_set(name, estimators, runs, variants, quick, movielens_dir=None):
    X = load(name, quick, movielens_dir)
    train, test = entrywise_split(X)
    (P_train, y_train), (P_test, y_test) = pairs(train), pairs(test)
    print(f"\n{name}: {X.shape[0]} x {X.shape[1]}, {X.nnz} ratings, random 80/20 of the "
          f"ratings; median of {runs} fits, ratio to SVD() per run\n")
    header = (f"{'model':36s} {'early stop':>10s} {'rounds':>7s} {'kept':>5s} {'fit s':>8s} "
              f"{'/ SVD s per run':>18s} {'median':>6s} {'test RMSE':>10s}")
    print(header + "\n" + "-" * len(header), flush=True)
    rows = {}  # label -> [rounds, kept, seconds per run, RMSE]
    configs = [(n, p) for n in estimators for p in ({}, *variants)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # item columns without a training rating
        for _ in range(runs):  # each run: the peers, then every estimator (same load)
            for label, rmse, _, secs, _ in surprise_rows(list(PEERS), train, test):
                rows.setdefault(label, ["", "", [], rmse])[2].append(secs)
            for est, params in configs:
                secs, model = fit_seconds(ESTIMATORS[est], params, P_train, y_train)
                label = (est + (" (defaults)" if not params.get("n_jobs") else " (n_jobs=1)"),
                         "off" if params.get("early_stopping") is False else "auto")
                if label not in rows:
                    rmse = float(np.sqrt(np.mean((model.predict(P_test) - y_test) ** 2)))
                    inner = model.estimator_
                    rows[label] = [inner.n_iter_, inner.best_iteration_, [], rmse]
                rows[label][2].append(secs)
    svd = rows.get("Surprise SVD (centralized)")  # (without scikit-surprise: no ratio)
    for label, (rounds, kept, seconds, rmse) in rows.items():
        name, stop = label if isinstance(label, tuple) else (label, "")
        ratios = [s / v for s, v in zip(seconds, svd[2])] if svd else []
        ratio = " ".join(f"{r:5.2f}" for r in ratios)
        middle = f"{statistics.median(ratios):6.2f}" if ratios else f"{'':6s}"
        print(f"{name:36s} {stop:>10s} {rounds!s:>7s} {kept!s:>5s} "
              f"{statistics.median(seconds):8.1f} {ratio:>18s} {middle} {rmse:10.4f}",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--data", default=",".join(DATA), help=f"of {', '.join(DATA)}")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--with-one-thread", action="store_true",
                        help="also each estimator with n_jobs=1")
    parser.add_argument("--with-off", action="store_true",
                        help="also each estimator with early_stopping=False")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 20,000 ratings, one run")
    parser.add_argument("--movielens-dir", action="append", default=None,
                        help=f"folder of a MovieLens 1M copy (its ratings.dat): --data {REAL_1M}")
    args = parser.parse_args()
    names, data = ([n for n in text.split(",") if n] for text in (args.estimators, args.data))
    for given, known, option in ((names, ESTIMATORS, "--estimators"), (data, DATA, "--data")):
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise SystemExit(f"{option}: unknown {', '.join(unknown)}; known: "
                             f"{', '.join(known)}")
    if movielens_folder(REAL_1M, args.movielens_dir) is None:
        print(f"(no --movielens-dir holding ratings.dat: the real {REAL_1M} is left out)")
        data = [n for n in data if n != REAL_1M]
    variants = ([{"early_stopping": False}] if args.with_off else []) + (
        [{"n_jobs": 1}] if args.with_one_thread else [])
    for name in data:
        run_set(name, names, 1 if args.quick else args.runs, variants, args.quick,
                args.movielens_dir)


if __name__ == "__main__":
    main()
