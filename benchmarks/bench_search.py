"""Tuning over ``default_search_space`` against the defaults, on real ratings (issue 37).

    python benchmarks/bench_search.py --ratings ml-100k:/path/u.data
    python benchmarks/bench_search.py --estimators FedMGS --n-iter 8 --quick

Protocol of the issue: the 80/20 random split of ``bench_sites.py`` (seed 0); on the
training part, ``RandomizedSearchCV(RatingRegressor(Estimator(random_state=0)),
default_search_space(Estimator, kind="distributions"), n_iter=8, cv=KFold(3, shuffle=True,
random_state=0), scoring="neg_root_mean_squared_error", random_state=0)`` (each name prefixed
``estimator__``), the best refitted on the whole training part; then the test RMSE of the
refitted best beside the defaults' (``Estimator(random_state=0)`` fitted on the same training
part). Printed per estimator: both test RMSEs, their difference, whether the best is the
defaults, the best's CV RMSE and the defaults' CV RMSE when the search drew them (``-``
otherwise), the folds' spread and the search's seconds.
"""

import argparse
import os
import time
import warnings

from bench_sites import load, rmse
from sklearn.model_selection import KFold, RandomizedSearchCV

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.model_selection import default_search_space

ESTIMATORS = {"FedMGS": FedMGS, "FedMAvg": FedMAvg, "FedMCADMM": FedMCADMM, "RFRec": RFRec,
              "FedBaseline": FedBaseline}


def prefixed(space):
    subs = space if isinstance(space, list) else [space]
    return [{f"estimator__{k}": v for k, v in sub.items()} for sub in subs]


def is_defaults(params, cls):
    defaults = cls().get_params()
    return all(defaults.get(k.removeprefix("estimator__")) == v for k, v in params.items())


def run(name, cls, data, n_iter):
    X_tr, y_tr, X_te, y_te = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tic = time.perf_counter()
        default = RatingRegressor(cls(random_state=0)).fit(X_tr, y_tr)
        default_seconds = time.perf_counter() - tic
        search = RandomizedSearchCV(
            RatingRegressor(cls(random_state=0)),
            prefixed(default_search_space(cls, kind="distributions")), n_iter=n_iter,
            cv=KFold(3, shuffle=True, random_state=0), scoring="neg_root_mean_squared_error",
            random_state=0, n_jobs=1, error_score="raise")
        tic = time.perf_counter()
        search.fit(X_tr, y_tr)
        seconds = time.perf_counter() - tic
    d, t = rmse(default.predict(X_te), y_te), rmse(search.predict(X_te), y_te)
    res = search.cv_results_
    drawn = [i for i, p in enumerate(res["params"]) if is_defaults(p, cls)]
    cv_default = "-" if not drawn else f"{-res['mean_test_score'][drawn[0]]:.4f}"
    best = search.best_index_
    print(f"| {name} | {d:.4f} | {t:.4f} | {t - d:+.4f} | {is_defaults(search.best_params_, cls)}"
          f" | {-res['mean_test_score'][best]:.4f} ± {res['std_test_score'][best]:.4f} "
          f"| {cv_default} ({len(drawn)}x) | {default_seconds:.1f} | {seconds:.0f} |",
          flush=True)
    shown = {k.removeprefix("estimator__"): (round(v, 4) if isinstance(v, float) else v)
             for k, v in search.best_params_.items()}
    print(f"|   best: {shown} | | | | | | | | |", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratings", default="small",
                        help="NAME:PATH[;TEST] of a local rating file, or 'small'")
    parser.add_argument("--estimators", default="FedMGS,FedMAvg,FedMCADMM,RFRec")
    parser.add_argument("--n-iter", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="a fifth of the ratings")
    args = parser.parse_args()
    X_tr, y_tr, X_te, y_te, _ = load(args.ratings)
    if args.quick:
        X_tr, y_tr, X_te, y_te = X_tr[::5], y_tr[::5], X_te[::5], y_te[::5]
    print(f"{args.ratings.split(':')[0]}: {len(y_tr)} training, {len(y_te)} test ratings; "
          f"{args.n_iter} candidates, 3-fold; load average {os.getloadavg()[0]:.1f}\n")
    print("| estimator | defaults test RMSE | tuned test RMSE | tuned - defaults | best is "
          "defaults | best CV RMSE ± std | defaults' CV RMSE (draws) | defaults fit s | "
          "search s |\n|---|---|---|---|---|---|---|---|---|")
    for name in args.estimators.split(","):
        run(name, ESTIMATORS[name], (X_tr, y_tr, X_te, y_te), args.n_iter)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
