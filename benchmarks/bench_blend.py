"""FedBlend against each of its members, every one with its defaults, through RatingRegressor.

    python benchmarks/bench_blend.py                      # ml-latest-small (embedded)
    python benchmarks/bench_blend.py --data small,100k:/work/data/ml-100k/u.data --refit
    python benchmarks/bench_blend.py --data 1m-shape      # make_ratings(6040, 3706, 1e6)
    python benchmarks/bench_blend.py --data 1m-shape --final-alpha 10   # and the old rule
    python benchmarks/bench_blend.py --quick              # smoke run (tests/test_benchmarks.py)

Protocol (issue 37): an 80/20 random split of the ratings (``train_test_split``, seed 0),
pairs of the test part whose user or item is not in the training part dropped; each member
``RatingRegressor(Member())`` and ``RatingRegressor(FedBlend())`` fitted on the training
pairs, scored by RMSE on the test pairs; fit seconds of each (one untimed warm-up fit on a
small set first, so no row pays the compilation). ``--refit`` adds the other ``refit``.
The last lines print the blend's weights (at average activity) and its fit time over its
slowest member's. A MovieLens file is ``100k:PATH`` (``u.data``; lines are split on
whitespace, so a stray trailing tab is harmless); ``1m-shape`` is the synthetic ML-1M shape.
"""

import argparse
import time
import warnings

import numpy as np

from sklearn_fedmf import FedBlend, RatingRegressor
from sklearn_fedmf.completion._fed_blend._fed_blend import default_members
from sklearn_fedmf.datasets import load_movielens, make_ratings


def load(name):
    """``(users, items, ratings)`` of a data set."""
    if name == "small":
        X = load_movielens().X.tocoo()
    elif name == "1m-shape":
        X = make_ratings(6040, 3706, 1_000_000, random_state=0).X.tocoo()
    elif name.startswith("100k:"):
        a = np.array([line.split()[:3] for line in open(name[5:]) if line.strip()],
                     dtype=float)
        return a[:, 0].astype(int), a[:, 1].astype(int), a[:, 2]
    else:
        raise SystemExit(f"unknown data set {name!r}")
    return X.row, X.col, X.data


def split(users, items, ratings, seed=0):
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(ratings))
    train, test = train_test_split(idx, test_size=0.2, random_state=seed)
    known = np.isin(users[test], users[train]) & np.isin(items[test], items[train])
    test = test[known]
    pairs = np.column_stack([users, items])
    return pairs[train], ratings[train], pairs[test], ratings[test]


def run(estimator, data):
    X_tr, y_tr, X_te, y_te = data
    start = time.perf_counter()
    reg = RatingRegressor(estimator).fit(X_tr, y_tr)
    seconds = time.perf_counter() - start
    rmse = float(np.sqrt(np.mean((reg.predict(X_te) - y_te) ** 2)))
    return rmse, seconds, reg.estimator_


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="small")
    parser.add_argument("--refit", action="store_true")
    parser.add_argument("--final-alpha", type=float, default=None,
                        help="also FedBlend(final_alpha=VALUE) (the rule before 'auto': 10)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: a fifth of ml-latest-small's ratings")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    warm = split(*load("small"))
    warm = (warm[0][:20000], warm[1][:20000], warm[2][:2000], warm[3][:2000])
    run(FedBlend(random_state=0), warm)  # compile every kernel once
    for name in args.data.split(","):
        data = split(*load(name))
        if args.quick:
            data = tuple(a[: len(a) // 5] for a in data)
        print(f"\n{name}: {len(data[1])} training ratings, {len(data[3])} test ratings")
        print(f"{'model':<22}{'test RMSE':>10}{'fit s':>9}")
        times = {}
        for member, est in default_members():
            rmse, seconds, _ = run(est.set_params(random_state=0), data)
            times[member] = seconds
            print(f"{member:<22}{rmse:>10.4f}{seconds:>9.1f}")
        variants = [("FedBlend()", FedBlend(random_state=0))]
        if args.refit:  # the other choice of refit
            other = not FedBlend().refit
            variants.append((f"FedBlend(refit={other})", FedBlend(refit=other, random_state=0)))
        if args.final_alpha is not None:
            variants.append((f"FedBlend(final_alpha={args.final_alpha:g})",
                             FedBlend(final_alpha=args.final_alpha, random_state=0)))
        for label, est in variants:
            rmse, seconds, blend = run(est, data)
            print(f"{label:<22}{rmse:>10.4f}{seconds:>9.1f}")
            weights = ", ".join(f"{k} {w:+.3f}" for k, w in zip(blend.named_estimators_,
                                                               blend.weights_))
            slow = max(times, key=times.get)
            print(f"    weights: {weights}; intercept {blend.intercept_:+.4f}")
            print(f"    validation RMSE {blend.validation_rmse_:.4f} (members: " + ", ".join(
                f"{k} {v:.4f}" for k, v in blend.member_validation_rmse_.items()) + ")")
            print(f"    fit time / slowest member ({slow}): {seconds / times[slow]:.2f}")


if __name__ == "__main__":
    main()
