"""Federated completion beside the centralized peers of Surprise, on one split per data set.

    python benchmarks/bench_accuracy.py                       # MovieLens latest-small
    python benchmarks/bench_accuracy.py --data ml-users,1m-0.5,10m-0.5
    python benchmarks/bench_accuracy.py --data ml --estimators FedMGS --peers SVD,SVDpp
    python benchmarks/bench_accuracy.py --data 1m-1.0 --search regularization,alpha_u,biased
    python benchmarks/bench_accuracy.py --quick               # smoke run: 94 users, 6 rounds
    python benchmarks/bench_accuracy.py --all-defaults        # the defaults table (below)
    python benchmarks/bench_accuracy.py --all-defaults --quick
    python benchmarks/bench_accuracy.py --all-defaults --movielens-dir DIR  # adds ml-100k
    python benchmarks/bench_accuracy.py --all-defaults --data ml-1m --movielens-dir DIR1M

``--all-defaults``: the table of the tuning guide. On every data set of ``bench_defaults.py``
(MovieLens and its subsets, the ``make_ratings`` shapes and the site-like sets of
``make_site_ratings``; ``--data`` picks), a random 80/20 split of the *ratings* (entry-wise,
seed 0: a user may have none in training and gets the fallback), every completion estimator
and variant with **all its defaults** (``random_state=0`` only) through ``RatingRegressor``,
beside the global mean and Surprise's ``BaselineOnly`` and ``SVD()``; test RMSE, then the fit
seconds. ``role`` says whether the defaults were chosen on the set (``CHOSEN_ON``, or
``AUTO_CHOSEN_ON`` for the ``"auto"`` strengths) or it only confirms them. ``ml-100k`` and
``ml-1m`` are the real MovieLens 100K (``u.data``) and 1M (``ratings.dat``) read from
``--movielens-dir`` (given once per folder), local copies that the repository does not ship:
confirmation sets, in the table only when a folder holding them is given.

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
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from bench_defaults import AUTO_CHOSEN_ON, CHOSEN_ON, ESTIMATORS, PROTOCOL, load
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.model_selection import GridSearchCV, HalvingGridSearchCV, KFold, train_test_split

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.datasets import load_movielens
from sklearn_fedmf.model_selection import default_search_space, train_test_split_ratings

PEERS = ("BaselineOnly", "SVD", "SVDpp", "KNNBaseline")
# every completion estimator and variant, all defaults (--all-defaults)
DEFAULT_MODELS = {"FedMCADMM": (FedMCADMM, {}), "FedMAvg": (FedMAvg, {}),
                  "FedMAvg-admm": (FedMAvg, {"solver_params": {"variant": "fedmc_admm"}}),
                  "FedMGS": (FedMGS, {}),
                  "RFRec": (RFRec, {}), "RFRecF": (RFRec, {"solver_params": {"variant": "rfrecf"}})}
ALL_DATA = ("ml,ml-users,ml-items,1m-0.5,1m-1.0,100k-0.8,filmtrust,douban,epinions,"
            "netflix-100k")
SEARCHED = "regularization,alpha_u,alpha_v"
REAL_100K = "ml-100k"  # MovieLens 100K from --movielens-dir (never committed)
REAL_1M = "ml-1m"  # MovieLens 1M from --movielens-dir (never committed)
# the real releases read from --movielens-dir: set name -> (load_movielens variant, file)
REAL_SETS = {REAL_100K: ("100k", "u.data"), REAL_1M: ("1m", "ratings.dat")}


def movielens_folder(name, folders):
    """The folder of ``folders`` (``--movielens-dir``, given once per release) that holds the
    real MovieLens release ``name`` (``ml-100k``: ``u.data``; ``ml-1m``: ``ratings.dat``), or
    None."""
    file = REAL_SETS[name][1]
    return next((f for f in folders or () if (Path(f) / file).is_file()), None)


def load_real(name, folders, return_df=False):
    """The real MovieLens release ``name`` from ``--movielens-dir``; a clear exit without it."""
    folder = movielens_folder(name, folders)
    if folder is None:
        variant, file = REAL_SETS[name]
        raise SystemExit(f"{name} reads MovieLens {variant.upper()} from --movielens-dir DIR "
                         f"(a folder holding its {file}); it is not in the repository.")
    return load_movielens(REAL_SETS[name][0], path=folder, return_df=return_df)


def load_set(name, quick=False, movielens_dir=None):
    """A data set of ``bench_defaults.py``, or a real MovieLens release (``ml-100k``,
    ``ml-1m``) from the folders ``movielens_dir``."""
    if name not in REAL_SETS:
        return load(name, quick=quick)
    return load_real(name, movielens_dir).X.tocsr()


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


def entrywise_split(X, seed=0):
    """A random 80/20 split of the ratings (not of each user's): train and test CSR matrices
    of ``X``'s shape."""
    coo = X.tocoo()
    keep = train_test_split(np.arange(coo.nnz), test_size=0.2, random_state=seed)
    return [sp.csr_matrix((coo.data[k], (coo.row[k], coo.col[k])), shape=X.shape)
            for k in keep]


def defaults_row(X, models, quick):
    """Test RMSE and fit seconds of the global mean, BaselineOnly, SVD and every model."""
    X_train, X_test = entrywise_split(X)
    (P_train, y_train), (P_test, y_test) = pairs(X_train), pairs(X_test)
    rmse, seconds = {"mean": float(np.sqrt(np.mean((y_test - y_train.mean()) ** 2)))}, {}
    for name, score, _, secs, _ in surprise_rows(["BaselineOnly", "SVD"], X_train, X_test):
        key = name.split()[1]
        rmse[key], seconds[key] = score, secs
    for name, (cls, params) in models.items():
        params = {**params, "random_state": 0, **({"max_iter": 5} if quick else {})}
        tic = time.perf_counter()
        try:
            model = RatingRegressor(cls(**params)).fit(P_train, y_train)
        except FloatingPointError:  # (a diverged fit is a result of the table, not a crash)
            rmse[name], seconds[name] = float("nan"), time.perf_counter() - tic
            continue
        seconds[name] = time.perf_counter() - tic
        rmse[name] = float(np.sqrt(np.mean((model.predict(P_test) - y_test) ** 2)))
    return rmse, seconds


def all_defaults(data_names, models, quick, movielens_dir=None):
    columns = ["mean", "BaselineOnly", "SVD", *models]
    print(f"every estimator with all its defaults (random_state=0), RatingRegressor, random "
          f"80/20 of the ratings; test RMSE{' (--quick: 5 rounds)' if quick else ''}\n")
    header = f"{'data':13s} {'role':8s} {'ratings':>8s} " + " ".join(f"{c:>12s}" for c in columns)
    print(header + "\n" + "-" * len(header), flush=True)
    times = []
    for data_name in data_names:
        X = load_set(data_name, quick=quick, movielens_dir=movielens_dir)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # empty item columns of the subsets
            rmse, seconds = defaults_row(X, models, quick)
        role = "chosen" if data_name in CHOSEN_ON + AUTO_CHOSEN_ON else "confirm"
        print(f"{data_name:13s} {role:8s} {X.nnz:8d} "
              + " ".join(f"{rmse.get(c, float('nan')):12.4f}" for c in columns), flush=True)
        times.append((data_name, seconds))
    print("\nfit seconds (same runs)\n" + header.replace("role    ", "        ")
          .replace(f"{'mean':>12s}", " " * 12))
    for data_name, seconds in times:
        print(f"{data_name:13s} {'':8s} {'':8s} {'':12s} "
              + " ".join(f"{seconds.get(c, float('nan')):12.1f}" for c in columns[1:]))


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
    parser.add_argument("--data", default=None,
                        help="data sets of bench_defaults.py (default: ml; with "
                             f"--all-defaults: {ALL_DATA})")
    parser.add_argument("--all-defaults", action="store_true",
                        help="the defaults table: every estimator with all defaults beside "
                             "the global mean, BaselineOnly and SVD")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS))
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="Surprise peers (an empty string: none)")
    parser.add_argument("--search", default=SEARCHED,
                        help="parameters of default_search_space searched (its 'include')")
    parser.add_argument("--grid", action="store_true",
                        help="GridSearchCV (every candidate for all rounds), not halving")
    parser.add_argument("--rounds", type=int, default=PROTOCOL["max_iter"],
                        help="rounds of every federated fit (the search's largest resource)")
    parser.add_argument("--movielens-dir", action="append", default=None,
                        help=f"folder of a MovieLens 100K copy (u.data: --data {REAL_100K}) "
                             f"or 1M copy (ratings.dat: --data {REAL_1M}), once per folder; "
                             "with --all-defaults each found release is a row of its own")
    args = parser.parse_args()
    found = [n for n in REAL_SETS if movielens_folder(n, args.movielens_dir)]
    for name in sorted(set(REAL_SETS) - set(found)):
        print(f"(no --movielens-dir holding {REAL_SETS[name][1]}: the real {name} is left out)")
    if args.all_defaults:
        data = args.data or ("filmtrust" if args.quick else ",".join([ALL_DATA, *found]))
        models = {k: DEFAULT_MODELS[k] for k in names_of(
            args.estimators if args.estimators != ",".join(ESTIMATORS) else
            ",".join(DEFAULT_MODELS), DEFAULT_MODELS, "--estimators")}
        return all_defaults(data.split(","), models, args.quick, args.movielens_dir)
    args.data = args.data or "ml"
    estimators = names_of(args.estimators, ESTIMATORS, "--estimators")
    peers = names_of(args.peers, PEERS, "--peers")
    data_names = ["1m-0.5"] if args.quick else args.data.split(",")
    rounds = args.rounds
    if args.quick:  # (SVD++ takes a minute even on the smoke data)
        rounds, peers = 6, [p for p in peers if p != "SVDpp"]
        PROTOCOL.update(n_clients=20, clients_per_round=5)
    for data_name in data_names:
        X = load_set(data_name, quick=args.quick, movielens_dir=args.movielens_dir)
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
