"""FedBaseline, the federated biases-only model, beside Surprise's BaselineOnly on MovieLens.

On the embedded ml-latest-small, 80/20 split of the ratings (``train_test_split_ratings(X,
0.2, random_state=0)``), two tables:

1. test RMSE (clipped predictions, fold-in of the training rows as ``score`` does) of the
   global mean, Surprise ``BaselineOnly(bsl_options={"method": "als"})`` with its defaults
   (10 epochs, reg_u 15, reg_i 10; when scikit-surprise is installed) and ``FedBaseline()``
   with 10 clients and with one client per user, with rounds, MB uploaded and fit seconds;
2. partial participation, one client per user and 10 % of them per round: the test RMSE
   (unclipped, ``history_``'s ``eval_rmse``) by round of FedBaseline's server, which keeps the
   running sums of every client's latest contribution, beside a server that sets ``b_i`` from
   the round's uploads alone (``b_i = sum_S / (alpha_v + n_i^S)`` over the sampled users;
   items none of them rated keep their bias), written here in numpy.

    python benchmarks/bench_fed_baseline.py --quick   # one user in five, fewer rounds
    python benchmarks/bench_fed_baseline.py           # the tables (seconds)
"""

import argparse
import time
import warnings

import numpy as np

from sklearn_fedmf import FedBaseline
from sklearn_fedmf.completion._fed_baseline._fed_baseline_protocol import item_biases, user_biases
from sklearn_fedmf.datasets import load_movielens
from sklearn_fedmf.exceptions import FedMFWarning
from sklearn_fedmf.model_selection import train_test_split_ratings


def rmse(pred, y):
    return float(np.sqrt(np.mean((pred - y) ** 2)))


def surprise_baseline(train, test):
    """Surprise's BaselineOnly (ALS, its defaults): test RMSE and fit seconds, or None."""
    try:
        import pandas as pd
        import surprise
    except ImportError:
        return None
    coo, tcoo = train.tocoo(), test.tocoo()
    data = surprise.Dataset.load_from_df(
        pd.DataFrame({"u": coo.row, "i": coo.col, "r": coo.data}),
        surprise.Reader(rating_scale=(float(coo.data.min()), float(coo.data.max()))))
    trainset = data.build_full_trainset()
    tic = time.perf_counter()
    algo = surprise.BaselineOnly(bsl_options={"method": "als"}, verbose=False).fit(trainset)
    seconds = time.perf_counter() - tic
    pred = np.array([algo.predict(u, i).est for u, i in zip(tcoo.row, tcoo.col)])
    return rmse(pred, tcoo.data), seconds


def sampled_only(train, test, rounds, fraction, alpha_u=15.0, alpha_v=10.0, seed=0):
    """The alternative server (module docstring): test RMSE after each of ``rounds``."""
    rng = np.random.default_rng(seed)
    mean = train.data.mean()
    X = train.copy()
    X.data -= mean
    n_users, n_items = X.shape
    rows = np.repeat(np.arange(n_users), np.diff(X.indptr))
    b_u = np.zeros(n_users)
    b_i = item_biases(np.bincount(X.indices, weights=X.data, minlength=n_items),
                      np.bincount(X.indices, minlength=n_items), alpha_v)
    trows = np.repeat(np.arange(n_users), np.diff(test.indptr))
    out = []
    for _ in range(rounds):
        users = rng.choice(n_users, size=max(1, int(np.ceil(fraction * n_users))),
                           replace=False)
        b_u[users] = user_biases(X[users], b_i, alpha_u)
        mask = np.isin(rows, users)
        cols = X.indices[mask]
        counts = np.bincount(cols, minlength=n_items)
        sums = np.bincount(cols, weights=X.data[mask] - b_u[rows[mask]], minlength=n_items)
        rated = counts > 0
        b_i[rated] = item_biases(sums, counts, alpha_v)[rated]
        out.append(rmse(mean + b_u[trows] + b_i[test.indices], test.data))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run")
    args = parser.parse_args()
    X = load_movielens().X
    if args.quick:
        X = X[::5]
    train, test = train_test_split_ratings(X, 0.2, random_state=0)
    tcoo = test.tocoo()
    print(f"ml-latest-small{' (one user in five)' if args.quick else ''}, 80/20 split of the "
          f"ratings: {train.nnz:,} train, {test.nnz:,} test")
    print(f"{'model':<42}{'test RMSE':>10}{'rounds':>8}{'MB up':>8}{'fit s':>7}")
    print(f"{'global mean':<42}{rmse(train.data.mean(), tcoo.data):>10.4f}")
    found = surprise_baseline(train, test)
    if found is None:
        print("Surprise BaselineOnly: scikit-surprise is not installed")
    else:
        print(f"{'Surprise BaselineOnly (als, defaults)':<42}{found[0]:>10.4f}{10:>8}"
              f"{'':>8}{found[1]:>7.2f}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)  # (items with no training rating)
        FedBaseline(max_iter=1).fit(train[:20])  # compiles the diagnostics' kernel: not timed
    for label, params in [("FedBaseline(), 10 clients", {}),
                          ("FedBaseline(), one client per user", {"n_clients": train.shape[0]})]:
        tic = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FedMFWarning)  # (items with no training rating)
            model = FedBaseline(random_state=0, **params).fit(train)
        seconds = time.perf_counter() - tic
        up = sum(r["bytes_uploaded"] for r in model.history_) / 1e6
        print(f"{label:<42}{-model.score(train, test):>10.4f}{model.n_iter_:>8}{up:>8.2f}"
              f"{seconds:>7.2f}")

    rounds = 40 if args.quick else 100
    marks = [r for r in (5, 10, 20, 40, 60, 100) if r <= rounds]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        model = FedBaseline(n_clients=train.shape[0], clients_per_round=0.1, max_iter=rounds,
                            clip=False, random_state=0).fit(train, eval_set=test)
        full = FedBaseline(n_clients=train.shape[0], max_iter=rounds, clip=False,
                           random_state=0).fit(train, eval_set=test)
    running = [r["eval_rmse"] for r in model.history_]
    alone = sampled_only(train, test, rounds, 0.1, model.alpha_u_, model.alpha_v_)
    print()
    print("one client per user, 10 % per round: test RMSE (unclipped) by round")
    print(f"{'server':<42}" + "".join(f"{f'r{r}':>8}" for r in marks))
    for label, curve in [("every client each round", [r["eval_rmse"] for r in full.history_]),
                         ("running sums of the latest uploads", running),
                         ("the round's uploads alone", alone)]:
        print(f"{label:<42}" + "".join(f"{curve[r - 1]:>8.4f}" for r in marks))


if __name__ == "__main__":
    main()
