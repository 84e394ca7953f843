"""Default fit time beside Surprise's ``SVD()`` on a MovieLens-1M-shaped set (issue 26, point 6).

    python benchmarks/bench_fit_time.py                      # netflix-1m, median of 3 runs
    python benchmarks/bench_fit_time.py --runs 1 --estimators FedMGS
    python benchmarks/bench_fit_time.py --with-off            # also early_stopping=False
    python benchmarks/bench_fit_time.py --quick               # smoke run: 20,000 ratings

The data is ``make_site_ratings("netflix-1m", random_state=0)`` (1,000,000 ratings, Netflix's
titles and activity), split 80/20 at random over the ratings (seed 0) as in
``bench_accuracy.py --all-defaults``. Each estimator runs with all its defaults
(``random_state=0`` only) through ``RatingRegressor``; on 800,000 training ratings its
default ``early_stopping="auto"`` is on, so each client holds out 10% of its ratings, the fit
stops after 10 rounds without a better validation RMSE and keeps its best round.
``--with-off`` adds the same fit with ``early_stopping=False`` (every round, no hold-out).
Columns: rounds run, kept round, median fit seconds over ``--runs`` runs, test RMSE (of the
first run; every run is the same model). Seconds depend on the machine and its load: compare
rows of one run only.
"""

import argparse
import statistics
import time
import warnings

import numpy as np
from bench_accuracy import entrywise_split, pairs, surprise_rows

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.datasets import make_site_ratings

ESTIMATORS = {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec}


def federated_row(cls, params, train, test, runs):
    (P_train, y_train), (P_test, y_test) = pairs(train), pairs(test)
    seconds, model = [], None
    for _ in range(runs):
        tic = time.perf_counter()
        fitted = RatingRegressor(cls(random_state=0, **params)).fit(P_train, y_train)
        seconds.append(time.perf_counter() - tic)
        model = model or fitted
    rmse = float(np.sqrt(np.mean((model.predict(P_test) - y_test) ** 2)))
    inner = model.estimator_
    return inner.n_iter_, inner.best_iteration_, statistics.median(seconds), rmse


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--estimators", default="FedMGS,RFRec")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--with-off", action="store_true",
                        help="also each estimator with early_stopping=False")
    parser.add_argument("--quick", action="store_true", help="smoke run: 20,000 ratings")
    args = parser.parse_args()
    names = [n for n in args.estimators.split(",") if n]
    unknown = sorted(set(names) - set(ESTIMATORS))
    if unknown:
        raise SystemExit(f"--estimators: unknown {', '.join(unknown)}; known: "
                         f"{', '.join(ESTIMATORS)}")
    X = make_site_ratings("netflix-1m", n_ratings=20_000 if args.quick else None,
                          random_state=0).X
    train, test = entrywise_split(X)
    print(f"netflix-1m shape: {X.shape[0]} x {X.shape[1]}, {X.nnz} ratings, random 80/20 of "
          f"the ratings; median of {args.runs} fits\n")
    header = (f"{'model':28s} {'early stop':>10s} {'rounds':>7s} {'kept':>5s} {'fit s':>8s} "
              f"{'test RMSE':>10s}")
    print(header + "\n" + "-" * len(header), flush=True)
    svd = [row for _ in range(args.runs) for row in surprise_rows(["SVD"], train, test)]
    if svd:  # (without scikit-surprise: the federated rows only)
        label, rmse = svd[0][:2]
        print(f"{label:28s} {'':>10s} {'':>7s} {'':>5s} "
              f"{statistics.median(row[3] for row in svd):8.1f} {rmse:10.4f}", flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # item columns without a training rating
        for name in names:
            for params in ({}, {"early_stopping": False}) if args.with_off else ({},):
                rounds, kept, secs, rmse = federated_row(ESTIMATORS[name], params, train,
                                                         test, args.runs)
                label = "off" if params else "auto"
                print(f"{name + ' (defaults)':28s} {label:>10s} {rounds:7d} {kept:5d} "
                      f"{secs:8.1f} {rmse:10.4f}", flush=True)


if __name__ == "__main__":
    main()
