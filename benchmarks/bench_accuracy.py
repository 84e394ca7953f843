"""Federated completion beside the centralized peers of Surprise, on one split.

    python benchmarks/bench_accuracy.py            # MovieLens latest-small (~15 minutes)
    python benchmarks/bench_accuracy.py --quick    # smoke run: 150 users, 5 rounds, no SVD++

MovieLens latest-small, 80/20 random split of each user's ratings. Each completion estimator
with its defaults (rank 5, 100 clients, 10 per round, 100 rounds, every other parameter at
its default), and tuned on a holdout of the training part only (the grid of
``bench_defaults.py``), beside Surprise's ``BaselineOnly``, ``SVD``, ``SVDpp`` and
``KNNBaseline`` (their defaults) fitted on the same training ratings: test RMSE, MAE and fit
seconds. scikit-surprise is a benchmark-only extra (``pip install scikit-surprise``); without
it the script says so and prints the federated rows.
"""

import argparse
import time
import warnings

import numpy as np
from bench_defaults import ESTIMATORS, PROTOCOL, candidates

from sklearn_fedmf.datasets import load_movielens
from sklearn_fedmf.model_selection import train_test_split_ratings


def errors(pred, X_test):
    """RMSE and MAE of a dense prediction matrix at the test entries."""
    rows = np.repeat(np.arange(X_test.shape[0]), np.diff(X_test.indptr))
    e = pred[rows, X_test.indices] - X_test.data
    return float(np.sqrt(np.mean(e**2))), float(np.mean(np.abs(e)))


def federated_rows(X_train, X_test, rounds):
    X_fit, X_val = train_test_split_ratings(X_train, 0.2, random_state=1)
    protocol = dict(PROTOCOL, max_iter=rounds)
    for name, cls in ESTIMATORS.items():
        scores = [(-cls(**protocol, **p).fit(X_fit).score(X_fit, X_val), k)
                  for k, p in enumerate(candidates(name))]
        best = candidates(name)[min(scores)[1]]
        for label, params in (("defaults", {}), ("tuned", best)):
            tic = time.perf_counter()
            model = cls(**protocol, **params).fit(X_train)
            seconds = time.perf_counter() - tic
            yield f"{name} ({label})", *errors(model.predict(X_train), X_test), seconds, params


def surprise_rows(X_train, X_test, quick=False):
    try:
        import pandas as pd
        from surprise import SVD, BaselineOnly, Dataset, KNNBaseline, Reader, SVDpp
    except ImportError:
        print("\nscikit-surprise is not installed (pip install scikit-surprise): the "
              "centralized peers are left out.")
        return
    coo = X_train.tocoo()
    df = pd.DataFrame({"u": coo.row, "i": coo.col, "r": coo.data})
    lo, hi = float(X_train.data.min()), float(X_train.data.max())
    trainset = Dataset.load_from_df(df, Reader(rating_scale=(lo, hi))).build_full_trainset()
    test = X_test.tocoo()
    testset = list(zip(test.row.tolist(), test.col.tolist(), test.data.tolist()))
    peers = {"BaselineOnly": lambda: BaselineOnly(verbose=False), "SVD": lambda: SVD(
        random_state=0), "SVDpp": lambda: SVDpp(random_state=0),
        "KNNBaseline": lambda: KNNBaseline(verbose=False)}
    if quick:  # (SVD++ takes a minute even on the smoke data)
        del peers["SVDpp"]
    for name, make in peers.items():
        algo = make()
        tic = time.perf_counter()
        algo.fit(trainset)
        seconds = time.perf_counter() - tic
        est = np.array([p.est for p in algo.test(testset)])
        e = est - test.data
        yield (f"Surprise {name} (centralized)", float(np.sqrt(np.mean(e**2))),
               float(np.mean(np.abs(e))), seconds, {})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (150 users, 5 rounds)")
    args = parser.parse_args()
    X = load_movielens().X.tocsr()
    rounds = PROTOCOL["max_iter"]
    if args.quick:
        X, rounds = X[:150], 5
        X = X[:, np.diff(X.tocsc().indptr) > 0]
        PROTOCOL.update(n_clients=20, clients_per_round=5)
    X_train, X_test = train_test_split_ratings(X, 0.2, random_state=0)
    print(f"MovieLens latest-small {X.shape[0]} x {X.shape[1]}, 80/20 split; federated: "
          f"rank 5, {PROTOCOL['n_clients']} clients, {PROTOCOL['clients_per_round']} per "
          f"round, {rounds} rounds\n")
    header = f"{'model':40s} {'RMSE':>7s} {'MAE':>7s} {'fit s':>7s}  parameters"
    print(header + "\n" + "-" * len(header), flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # empty item columns of the --quick subset
        rows = list(federated_rows(X_train, X_test, rounds))
        for row in rows:
            print_row(*row)
        for row in surprise_rows(X_train, X_test, args.quick):
            print_row(*row)


def print_row(name, rmse, mae, seconds, params):
    text = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in params.items())
    print(f"{name:40s} {rmse:7.4f} {mae:7.4f} {seconds:7.1f}  {text}", flush=True)


if __name__ == "__main__":
    main()
