"""Top-N quality of each completion estimator, ``loss="implicit"`` and ``loss="squared"``,
beside most-popular and ``implicit``'s ALS and BPR.

Leave-one-out, full ranking: one rating per user drawn at random
(``leave_one_out_split(random_state=seed)``) is held out, every item the user did not rate
in training is ranked, and the held-out item is the one relevant item (``--holdout latest``:
each user's latest rating instead, on the sets with timestamps). Data sets: the
embedded ml-latest-small (100,836 ratings, 610 users), MovieLens 100K (100,000 ratings,
943 users) and MovieLens 1M (1,000,209 ratings, 6,040 users; issue 27's set), both read from
``--movielens-dir`` (given once per folder: the one holding ``u.data`` is 100K, the one
holding ``ratings.dat`` is 1M; a set without its folder is skipped with a note; the
repository ships neither) and a ``make_ratings`` set (``--synthetic-ratings``,
100,000 by default on 2,000 users x 1,000 items; 1,000,000 on the ML-1M shape
6,040 x 3,706 with ``--synthetic-ratings 1000000``). Rows: the most popular
items; each completion estimator with its defaults through ``RatingRegressor`` under
``loss="implicit"`` (the ratings as the interactions' strengths) and under
``loss="squared"`` (``recommend``'s default ``min_support``, and each value of ``--sweep``);
``implicit``'s ``AlternatingLeastSquares(factors=64, regularization=0.05)`` and
``BayesianPersonalizedRanking(factors=64)`` (centralized, on the binary interactions) when
``implicit`` is installed (the ``bench`` extra). Prints HR, NDCG and recall at 10 and 20,
the catalog coverage at 10, the median number of training ratings of the items listed first
(support@1), the fit seconds and the megabytes a round moves (up + down, mean over the
rounds). With one relevant item per user, recall@k equals HR@k. ``--one-client-per-user``
fits the federated rows with every user its own client (cross-device). A last line per set
compares the best federated row (by HR@10) with ALS and most-popular.

``--implicit-solver cholesky,cg`` fits the ``loss="implicit"`` rows once per row solver
(``solver_params={"implicit_solver": ..., "cg_steps": --cg-steps}``; default: the
estimators' own), the row's name telling which. ``--playcounts FILE`` adds a play-count set
(set name ``playcounts``): a tab-separated file with a header and the columns user, item,
count (Last.fm hetrec 2011's ``user_artists.dat``: 1,892 users, 17,632 artists, 92,834
interactions; not in the repository), the counts as the strengths.

Threads: ``--threads N`` (default 1) gives ``implicit`` ``num_threads=N`` and the federated
estimators ``n_jobs=N``; BLAS runs on one thread for both (``implicit``'s advice), so the
fit times compare the same thread count.

    python benchmarks/bench_topn.py --quick   # one user in ten, 3 rounds (smoke run)
    python benchmarks/bench_topn.py           # ml-latest-small and the small synthetic set
    python benchmarks/bench_topn.py --movielens-dir DIR --synthetic-ratings 1000000 \
        --losses implicit --threads 2         # the issue's table (DIR: ml-100k's folder)
    python benchmarks/bench_topn.py --sets ml-1m --movielens-dir DIR1M --losses implicit \
        --estimators FedMGS,FedMAvg           # issue 27's targets on MovieLens 1M
    python benchmarks/bench_topn.py --synthetic-ratings 1000000 --sets synthetic \
        --estimators FedMGS,FedMAvg
    python benchmarks/bench_topn.py --sets movielens,ml-100k,playcounts --movielens-dir DIR \
        --playcounts user_artists.dat --losses implicit --estimators FedMGS \
        --implicit-solver cholesky,cg     # issue 38: the row solvers against ALS
"""

import argparse
import time
import warnings

import numpy as np
import pandas as pd
from bench_accuracy import REAL_SETS, load_real, movielens_folder
from threadpoolctl import threadpool_limits

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf._pairs import FactorModel, top_n
from sklearn_fedmf._rating_regressor import MIN_SUPPORT
from sklearn_fedmf.datasets import load_movielens, make_ratings, ratings_to_matrix
from sklearn_fedmf.exceptions import FedMFWarning
from sklearn_fedmf.metrics import catalog_coverage, hit_rate_at_k, ndcg_at_k, recall_at_k
from sklearn_fedmf.model_selection import leave_one_out_split

KS = (10, 20)


def most_popular(X, users):
    """Each user's unrated items by number of training ratings (ties to the smaller id)."""
    n_users, n_items = X.shape
    counts = np.diff(X.tocsc().indptr).astype(float)
    model = FactorModel(np.zeros((n_users, 1)), np.zeros((n_items, 1)), None, counts, 0.0)
    return top_n(model, users, max(KS), seen=X)[0]


ALS = "implicit ALS(factors=64)"


def implicit_models(quick, threads=1):
    try:
        from implicit.als import AlternatingLeastSquares
        from implicit.bpr import BayesianPersonalizedRanking
    except ImportError:
        return {}
    common = {"random_state": 0, "num_threads": threads,
              **({"iterations": 3} if quick else {})}
    return {
        ALS: lambda: AlternatingLeastSquares(factors=64, regularization=0.05, **common),
        "implicit BPR(factors=64)": lambda: BayesianPersonalizedRanking(factors=64, **common),
    }


def fit_implicit(make, X, users):
    binary = X.copy()
    binary.data[:] = 1.0
    with threadpool_limits(1, "blas"):  # implicit's advice: its own threads, BLAS on one
        model = make()
        start = time.perf_counter()
        model.fit(binary, show_progress=False)
        seconds = time.perf_counter() - start
    ids, _ = model.recommend(users, binary[users], N=max(KS), filter_already_liked_items=True)
    return ids, seconds


def synthetic_frame(n_ratings, seed):
    """A ``make_ratings`` set as (userId, movieId, rating): the ML-1M shape at 1M ratings."""
    shape = (6040, 3706) if n_ratings >= 500_000 else (2000, 1000)
    X = make_ratings(*shape, n_ratings, random_state=seed).X.tocoo()
    return pd.DataFrame({"userId": X.row, "movieId": X.col, "rating": X.data})


def megabytes_per_round(history):
    moved = [h["bytes_uploaded"] + h["bytes_downloaded"] for h in history]
    return float(np.mean(moved)) / 1e6


def run_set(label, frame, args):
    if args.quick:
        frame = frame[frame.userId % 10 == 0]
    latest = args.holdout == "latest" and "timestamp" in frame
    train, test = leave_one_out_split(frame, timestamp_col="timestamp" if latest else None,
                                      random_state=args.seed)
    X, user_ids, item_ids = ratings_to_matrix(train)
    test_users = test.userId.to_numpy()
    rows = np.searchsorted(user_ids, test_users)
    truth = test.movieId.to_numpy()
    quick = {"max_iter": 3} if args.quick else {}
    losses = args.losses.split(",")
    supports = sorted({MIN_SUPPORT, *(int(s) for s in args.sweep.split(",") if s)})
    # (cross-device: each user its own client; else the estimators' default n_clients)
    clients = train.userId.to_numpy() if args.one_client_per_user else None

    print(f"\n{label}{' (one user in ten)' if args.quick else ''}: {len(train):,} training "
          f"ratings, {len(test)} users with one held-out rating "
          f"({'the latest' if latest else f'random, seed {args.seed}'}), "
          f"full ranking over {X.shape[1]:,} items; recommend's default min_support="
          f"{MIN_SUPPORT}{'; one client per user' if args.one_client_per_user else ''}")
    header = ("model", *(f"{m}@{k}" for k in KS for m in ("HR", "NDCG", "recall")),
              "cov@10", "support@1", "fit s", "MB/round")
    support_of = dict(zip(item_ids, np.diff(X.tocsc().indptr)))
    print(f"{header[0]:<40}" + "".join(f"{h:>10}" for h in header[1:]))

    results = {}

    def report(name, lists, seconds, mb=None):
        values = []
        for k in KS:
            values += [f(truth, lists, k=k) for f in (hit_rate_at_k, ndcg_at_k, recall_at_k)]
        results[name] = (values[0], values[1], seconds)
        values.append(catalog_coverage(lists, item_ids, k=10))
        cells = [f"{v:>10.3f}" for v in values]
        first = [support_of[row[0]] for row in lists if row[0] is not None]
        cells.append(f"{np.median(first):>10.0f}")
        cells.append(f"{'-' if seconds is None else f'{seconds:.1f}':>10}")
        cells.append(f"{'-' if mb is None else f'{mb:.2f}':>10}")
        print(f"{name:<40}" + "".join(cells), flush=True)

    report("most popular", item_ids[most_popular(X, rows)], None)
    estimators = {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec}
    for name, cls in estimators.items():
        if args.estimators and name not in args.estimators.split(","):
            continue
        has_loss = "loss" in cls().get_params()  # (an estimator without implicit training)
        for loss in [loss for loss in (("implicit", "squared") if has_loss else ("squared",))
                     if loss in losses]:
            for solver, params in row_solvers(cls, loss, args):
                reg = RatingRegressor(cls(random_state=0, n_jobs=args.threads,
                                          **({"loss": loss} if has_loss else {}), **quick,
                                          **({"solver_params": params} if params else {})))
                with warnings.catch_warnings(), threadpool_limits(1, "blas"):
                    warnings.simplefilter("ignore", FedMFWarning)  # (--quick: no convergence)
                    start = time.perf_counter()
                    reg.fit(train[["userId", "movieId"]], train.rating.to_numpy(),
                            clients=clients)
                    seconds = time.perf_counter() - start
                mb = megabytes_per_round(reg.estimator_.history_)
                for support in supports:
                    lists, _ = reg.recommend(test_users, n=max(KS), min_support=support)
                    report(f"{name} ({loss}{solver}, min_support={support})", lists, seconds,
                           mb)
    for name, make in implicit_models(args.quick, args.threads).items():
        ids, seconds = fit_implicit(make, X, rows)
        report(name, item_ids[ids], seconds)
    summarize(results)


def row_solvers(cls, loss, args):
    """``(label, solver_params)`` of each ``--implicit-solver`` for an implicit row (the
    estimator's default alone otherwise)."""
    if loss != "implicit" or not args.implicit_solver or \
            "implicit_solver" not in cls._solver_params:
        return [("", None)]
    rows = []
    for solver in args.implicit_solver.split(","):
        label = f", cg {args.cg_steps}" if solver == "cg" else f", {solver}"
        rows.append((label, {"implicit_solver": solver, "cg_steps": args.cg_steps}))
    return rows


def playcount_frame(path):
    """A play-count file (a header, then user, item, count; tab-separated) as (userId,
    movieId, rating), the counts as the strengths."""
    frame = pd.read_csv(path, sep="\t")
    frame.columns = ["userId", "movieId", "rating", *frame.columns[3:]]
    return frame[["userId", "movieId", "rating"]]


def ratio(a, b):
    """``a / b``, nan when ``b`` is 0 (a small set where the reference hits no user)."""
    return a / b if b else float("nan")


def summarize(results):
    """The best federated row by HR@10 against most-popular and ALS (HR, NDCG, fit time)."""
    federated = {k: v for k, v in results.items() if "(" in k and not k.startswith("implicit")}
    if not federated:
        return
    best = max(federated, key=lambda k: federated[k][0])
    hr, ndcg, seconds = federated[best]
    pop_hr, pop_ndcg, _ = results["most popular"]
    line = (f"best federated: {best}: HR@10 {ratio(hr, pop_hr):.2f}x and NDCG@10 "
            f"{ratio(ndcg, pop_ndcg):.2f}x most-popular")
    if ALS in results:
        als_hr, als_ndcg, als_seconds = results[ALS]
        line += (f"; {ratio(hr, als_hr):.2f}x ALS's HR@10, {ratio(ndcg, als_ndcg):.2f}x its "
                 f"NDCG@10, {ratio(seconds, als_seconds):.1f}x its fit time")
    print(line, flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (seconds)")
    parser.add_argument("--sweep", default="", help="extra min_support values, e.g. 0,5,50")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out ratings")
    parser.add_argument("--sets", default="movielens,ml-100k,ml-1m,playcounts,synthetic",
                        help="comma-separated: movielens (ml-latest-small), ml-100k, ml-1m, "
                             "playcounts (--playcounts), synthetic")
    parser.add_argument("--movielens-dir", action="append", default=None,
                        help="a folder of MovieLens 100K (its u.data: ml-100k) or 1M (its "
                             "ratings.dat: ml-1m); once per folder")
    parser.add_argument("--holdout", choices=("random", "latest"), default="random",
                        help="the held-out rating of each user: one at random (seeded) or "
                             "the latest (sets with timestamps; the synthetic set: random)")
    parser.add_argument("--losses", default="implicit,squared",
                        help="comma-separated losses of the federated rows")
    parser.add_argument("--threads", type=int, default=1,
                        help="implicit's num_threads and the estimators' n_jobs (BLAS: 1)")
    parser.add_argument("--estimators", default="",
                        help="comma-separated subset, e.g. FedMGS,FedMAvg (default: all)")
    parser.add_argument("--one-client-per-user", action="store_true",
                        help="every user its own client (default: the estimators' n_clients)")
    parser.add_argument("--implicit-solver", default="",
                        help="comma-separated row solvers of the implicit rows: cg, cholesky "
                             "(default: the estimators' own)")
    parser.add_argument("--cg-steps", type=int, default=3,
                        help="conjugate-gradient steps per row with --implicit-solver cg")
    parser.add_argument("--playcounts", default=None,
                        help="a play-count file (user, item, count; tab-separated, a header), "
                             "e.g. Last.fm hetrec 2011's user_artists.dat: set playcounts")
    parser.add_argument("--synthetic-ratings", type=int, default=100_000,
                        help="ratings of the make_ratings set (1000000: the ML-1M shape)")
    args = parser.parse_args()
    sets = args.sets.split(",")
    if "movielens" in sets:
        frame = load_movielens(return_df=True).frame[["userId", "movieId", "rating",
                                                      "timestamp"]]
        run_set("ml-latest-small", frame, args)
    for name in [n for n in REAL_SETS if n in sets]:
        if movielens_folder(name, args.movielens_dir) is None:
            print(f"\n{name}: skipped (pass --movielens-dir DIR, the folder holding "
                  f"{REAL_SETS[name][1]})")
        else:
            frame = load_real(name, args.movielens_dir, return_df=True).frame
            run_set(name, frame[["userId", "movieId", "rating", "timestamp"]], args)
    if "playcounts" in sets:
        if args.playcounts is None:
            print("\nplaycounts: skipped (pass --playcounts FILE)")
        else:
            run_set(f"play counts ({args.playcounts})", playcount_frame(args.playcounts), args)
    if "synthetic" in sets:
        frame = synthetic_frame(args.synthetic_ratings, args.seed)
        run_set(f"make_ratings ({args.synthetic_ratings:,} ratings)", frame, args)


if __name__ == "__main__":
    main()
