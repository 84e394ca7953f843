"""Federated completion beside the centralized peers of Surprise, on one split per data set.

    python benchmarks/bench_accuracy.py                       # MovieLens latest-small
    python benchmarks/bench_accuracy.py --data ml-users,1m-0.5,10m-0.5
    python benchmarks/bench_accuracy.py --data ml --estimators FedMGS --peers SVD,SVDpp
    python benchmarks/bench_accuracy.py --data 1m-1.0 --search regularization,alpha_u,biased
    python benchmarks/bench_accuracy.py --quick               # smoke run: 94 users, 6 rounds

The data sets are those of ``bench_defaults.py`` (``ml``, ``ml-users``, ``ml-items``,
``1m-0.5``, ``1m-1.0``, ``10m-0.5``, ``10m-1.0``; see its docstring), each with an 80/20
random split of each user's ratings. Each completion estimator runs with the protocol of
``bench_defaults.py`` (rank 5, 100 clients, 10 per round, 100 rounds): once with its
defaults, and once tuned by entry-wise cross-validation on the training part only:
``HalvingGridSearchCV`` through ``RatingRegressor``, 3 folds of the training ratings, rounds
as the resource (up to 100, factor 3), over the default search space's regularizations and
their strengths (``default_search_space(..., include=["regularization", "alpha_u",
"alpha_v"])``: 18 candidates, 9 for RFRec, which has one regularization; ``--search`` sets
the list, ``--grid`` runs every candidate for all rounds with ``GridSearchCV``); the best is
refitted on the whole training part. Beside them, Surprise's
``BaselineOnly``, ``SVD``, ``SVDpp`` and ``KNNBaseline`` (their defaults) fitted on the same
training ratings. Columns: test RMSE, MAE and the seconds of the final fit (the search's
seconds in the parameters column).
scikit-surprise is a benchmark-only extra (``pip install scikit-surprise``); without it the
script says so and prints the federated rows.
"""

import argparse
import time
import warnings

import numpy as np
from bench_defaults import ESTIMATORS, PROTOCOL, load
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.model_selection import GridSearchCV, HalvingGridSearchCV, KFold

from sklearn_fedmf import RatingRegressor
from sklearn_fedmf.model_selection import default_search_space, train_test_split_ratings

PEERS = ("BaselineOnly", "SVD", "SVDpp", "KNNBaseline")
SEARCHED = "regularization,alpha_u,alpha_v"


def errors(pred, X_test):
    """RMSE and MAE of a dense prediction matrix at the test entries."""
    rows = np.repeat(np.arange(X_test.shape[0]), np.diff(X_test.indptr))
    e = pred[rows, X_test.indices] - X_test.data
    return float(np.sqrt(np.mean(e**2))), float(np.mean(np.abs(e)))


def pairs(X):
    """The (user, item) pairs and ratings of a CSR matrix: RatingRegressor's long format."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    return np.column_stack([rows, X.indices]), X.data


def tune(cls, protocol, X_train, rounds, searched, halving):
    """The best parameters of the entry-wise 3-fold search on the training part, and its
    seconds."""
    include = [k for k in searched if k in cls().get_params()]  # (RFRec: one regularization)
    space = default_search_space(cls, include=include)
    space = space if isinstance(space, list) else [space]
    grid = [{f"estimator__{k}": v for k, v in sub.items()} for sub in space]
    common = dict(cv=KFold(3, shuffle=True, random_state=0), refit=False, n_jobs=1,
                  scoring="neg_root_mean_squared_error", error_score="raise")
    if halving:
        search = HalvingGridSearchCV(
            RatingRegressor(cls(**protocol)), grid, resource="estimator__max_iter",
            max_resources=rounds, min_resources="exhaust", factor=3, **common)
    else:  # every candidate at every round
        search = GridSearchCV(RatingRegressor(cls(**protocol)), grid, **common)
    tic = time.perf_counter()
    search.fit(*pairs(X_train))
    best = {k: search.best_params_[f"estimator__{k}"] for k in include}
    return best, time.perf_counter() - tic


def federated_rows(names, X_train, X_test, rounds, searched, halving):
    protocol = dict(PROTOCOL, max_iter=rounds)
    for name in names:
        cls = ESTIMATORS[name]
        best, search_seconds = tune(cls, protocol, X_train, rounds, searched, halving)
        for label, params in (("defaults", {}), ("tuned", best)):
            tic = time.perf_counter()
            model = cls(**{**protocol, **params}).fit(X_train)
            seconds = time.perf_counter() - tic
            if label == "tuned":
                params = {**params, "search s": round(search_seconds)}
            yield f"{name} ({label})", *errors(model.predict(X_train), X_test), seconds, params


def surprise_rows(names, X_train, X_test):
    try:
        import pandas as pd
        import surprise
    except ImportError:
        print("\nscikit-surprise is not installed (pip install scikit-surprise): the "
              "centralized peers are left out.")
        return
    coo = X_train.tocoo()
    df = pd.DataFrame({"u": coo.row, "i": coo.col, "r": coo.data})
    lo, hi = float(X_train.data.min()), float(X_train.data.max())
    reader = surprise.Reader(rating_scale=(lo, hi))
    trainset = surprise.Dataset.load_from_df(df, reader).build_full_trainset()
    test = X_test.tocoo()
    testset = list(zip(test.row.tolist(), test.col.tolist(), test.data.tolist()))
    peers = {"BaselineOnly": lambda: surprise.BaselineOnly(verbose=False),
             "SVD": lambda: surprise.SVD(random_state=0),
             "SVDpp": lambda: surprise.SVDpp(random_state=0),
             "KNNBaseline": lambda: surprise.KNNBaseline(verbose=False)}
    for name in names:
        algo = peers[name]()
        tic = time.perf_counter()
        algo.fit(trainset)
        seconds = time.perf_counter() - tic
        est = np.array([p.est for p in algo.test(testset)])
        e = est - test.data
        yield (f"Surprise {name} (centralized)", float(np.sqrt(np.mean(e**2))),
               float(np.mean(np.abs(e))), seconds, {})


def names_of(text, known, option):
    names = [n for n in text.split(",") if n]
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"{option}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run (1m-0.5 at 94 users, 20 clients, 6 rounds, no SVD++)")
    parser.add_argument("--data", default="ml", help="data sets of bench_defaults.py")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="Surprise peers (an empty string: none)")
    parser.add_argument("--search", default=SEARCHED,
                        help="parameters of default_search_space searched (its 'include')")
    parser.add_argument("--grid", action="store_true",
                        help="GridSearchCV (every candidate for all rounds), not halving")
    parser.add_argument("--rounds", type=int, default=PROTOCOL["max_iter"],
                        help="rounds of every federated fit (the search's largest resource)")
    args = parser.parse_args()
    estimators = names_of(args.estimators, ESTIMATORS, "--estimators")
    peers = names_of(args.peers, PEERS, "--peers")
    data_names = ["1m-0.5"] if args.quick else args.data.split(",")
    rounds = args.rounds
    if args.quick:  # (SVD++ takes a minute even on the smoke data)
        rounds, peers = 6, [p for p in peers if p != "SVDpp"]
        PROTOCOL.update(n_clients=20, clients_per_round=5)
    for data_name in data_names:
        X = load(data_name, quick=args.quick)
        X_train, X_test = train_test_split_ratings(X, 0.2, random_state=0)
        print(f"\n{data_name}: {X.shape[0]} x {X.shape[1]}, {X.nnz} ratings, 80/20 split; "
              f"federated: rank {PROTOCOL['n_components']}, {PROTOCOL['n_clients']} clients, "
              f"{PROTOCOL['clients_per_round']} per round, {rounds} rounds\n")
        header = f"{'model':40s} {'RMSE':>7s} {'MAE':>7s} {'fit s':>7s}  parameters"
        print(header + "\n" + "-" * len(header), flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # empty item columns of the subsets and folds
            for row in federated_rows(estimators, X_train, X_test, rounds,
                                      args.search.split(","), not args.grid):
                print_row(*row)
        for row in surprise_rows(peers, X_train, X_test):
            print_row(*row)


def print_row(name, rmse, mae, seconds, params):
    text = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in params.items())
    print(f"{name:40s} {rmse:7.4f} {mae:7.4f} {seconds:7.1f}  {text}", flush=True)


if __name__ == "__main__":
    main()
