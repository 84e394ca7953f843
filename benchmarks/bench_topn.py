"""Top-N quality of each completion estimator's ``recommend`` beside most-popular and implicit.

The embedded ml-latest-small (100,836 ratings, 610 users), leave-one-out: one rating per
user drawn at random (``leave_one_out_split(random_state=0)``) is held out, every item the
user did not rate in training is ranked (full ranking), and the held-out item is the one
relevant item. Rows: the most popular items; each completion estimator with its defaults
through ``RatingRegressor.recommend``, with ``min_support=0`` (ranked by predicted rating
alone) and with ``recommend``'s default ``min_support``; ``implicit``'s
``AlternatingLeastSquares(factors=64)`` and ``BayesianPersonalizedRanking(factors=64)``
(centralized, trained on the binary interactions) when ``implicit`` is installed (the
``bench`` extra). Prints HR, NDCG and recall at 10 and 20, the catalog coverage of the lists
at 10, the median number of training ratings of the items listed first (support@1) and
the fit seconds. With one relevant item per user, recall@k equals HR@k.

``--sweep`` adds rows for several ``min_support`` values (how the default was chosen).

    python benchmarks/bench_topn.py --quick   # one user in ten, 3 rounds (smoke run)
    python benchmarks/bench_topn.py           # the table of the user guide (a few minutes)
"""

import argparse
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf._pairs import FactorModel, top_n
from sklearn_fedmf._rating_regressor import MIN_SUPPORT
from sklearn_fedmf.datasets import load_movielens, ratings_to_matrix
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


def implicit_models(quick):
    try:
        from implicit.als import AlternatingLeastSquares
        from implicit.bpr import BayesianPersonalizedRanking
    except ImportError:
        return {}
    iterations = {"iterations": 3} if quick else {}
    return {
        "implicit ALS(factors=64)": lambda: AlternatingLeastSquares(
            factors=64, random_state=0, **iterations),
        "implicit BPR(factors=64)": lambda: BayesianPersonalizedRanking(
            factors=64, random_state=0, **iterations),
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (seconds)")
    parser.add_argument("--sweep", default="", help="extra min_support values, e.g. 5,50,100")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out ratings")
    args = parser.parse_args()
    frame = load_movielens(return_df=True).frame[["userId", "movieId", "rating"]]
    if args.quick:
        frame = frame[frame.userId % 10 == 0]
    train, test = leave_one_out_split(frame, random_state=args.seed)
    X, user_ids, item_ids = ratings_to_matrix(train)
    test_users = test.userId.to_numpy()
    rows = np.searchsorted(user_ids, test_users)
    truth = test.movieId.to_numpy()
    quick = {"max_iter": 3} if args.quick else {}
    supports = sorted({0, MIN_SUPPORT, *(int(s) for s in args.sweep.split(",") if s)})

    print(f"ml-latest-small{' (one user in ten)' if args.quick else ''}: {len(train):,} "
          f"training ratings, {len(test)} users with one held-out rating (random, seed "
          f"{args.seed}), "
          f"full ranking over {X.shape[1]:,} items; recommend's default min_support="
          f"{MIN_SUPPORT}")
    header = ("model", *(f"{m}@{k}" for k in KS for m in ("HR", "NDCG", "recall")),
              "cov@10", "support@1", "fit s")
    support_of = dict(zip(item_ids, np.diff(X.tocsc().indptr)))
    print(f"{header[0]:<34}" + "".join(f"{h:>10}" for h in header[1:]))

    def report(name, lists, seconds):
        values = []
        for k in KS:
            values += [f(truth, lists, k=k) for f in (hit_rate_at_k, ndcg_at_k, recall_at_k)]
        values.append(catalog_coverage(lists, item_ids, k=10))
        values.append(np.median([support_of[row[0]] for row in lists]))
        cells = [f"{v:>10.3f}" for v in values[:-1]] + [f"{values[-1]:>10.0f}"]
        fit = "-" if seconds is None else f"{seconds:.1f}"
        print(f"{name:<34}" + "".join(cells) + f"{fit:>10}", flush=True)

    report("most popular", item_ids[most_popular(X, rows)], None)
    estimators = {"FedMCADMM": FedMCADMM, "FedMAvg": FedMAvg, "FedMGS": FedMGS, "RFRec": RFRec}
    for name, cls in estimators.items():
        reg = RatingRegressor(cls(random_state=0, **quick))
        with warnings.catch_warnings():  # (--quick's 3 rounds do not converge)
            warnings.simplefilter("ignore", FedMFWarning)
            start = time.perf_counter()
            reg.fit(train[["userId", "movieId"]], train.rating.to_numpy())
            seconds = time.perf_counter() - start
        for support in supports:
            lists, _ = reg.recommend(test_users, n=max(KS), min_support=support)
            report(f"{name} (min_support={support})", lists, seconds)
    for name, make in implicit_models(args.quick).items():
        ids, seconds = fit_implicit(make, X, rows)
        report(name, item_ids[ids], seconds)


if __name__ == "__main__":
    main()
