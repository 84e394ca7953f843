"""Entry-wise 5-fold cross-validation of each completion estimator on MovieLens.

Each estimator, with its defaults, wrapped in ``RatingRegressor`` and scored by
scikit-learn's own ``cross_validate`` over ``KFold(5, shuffle=True, random_state=0)`` of the
ratings of the embedded ml-latest-small (100,836 ratings): every fold holds out a fifth of
the ratings of users who stay in training, the protocol of the papers and of Surprise's
``cross_validate``. Prints the test RMSE (mean and standard deviation over the folds) and the
mean fit time; the global-mean predictor is the first row, and RFRec also runs with the
settings of its authors' code (Adam, sigmoid link), which ``fedmf`` uses.

    python benchmarks/bench_cv.py --quick   # 2 folds, 3 rounds, one in ten users (smoke run)
    python benchmarks/bench_cv.py           # the table of the README (a few minutes)
"""

import argparse
import warnings

import numpy as np
from sklearn.dummy import DummyRegressor
from sklearn.model_selection import KFold, cross_validate

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.datasets import load_movielens
from sklearn_fedmf.exceptions import FedMFWarning


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (seconds)")
    parser.add_argument("--n-jobs", type=int, default=1, help="cross_validate's n_jobs")
    args = parser.parse_args()
    frame = load_movielens(return_df=True).frame
    if args.quick:
        frame = frame[frame.userId % 10 == 0]
    X, y = frame[["userId", "movieId"]], frame["rating"].to_numpy()
    folds = 2 if args.quick else 5
    cv = KFold(folds, shuffle=True, random_state=0)
    quick = {"max_iter": 3} if args.quick else {}
    models = {
        "global mean": DummyRegressor(),
        "FedMCADMM": RatingRegressor(FedMCADMM(random_state=0, **quick)),
        "FedMAvg": RatingRegressor(FedMAvg(random_state=0, **quick)),
        "FedMGS": RatingRegressor(FedMGS(random_state=0, **quick)),
        "RFRec": RatingRegressor(RFRec(random_state=0, **quick)),
        # the RFRec authors' code settings, which `fedmf` uses (plain steps diverge here)
        "RFRec (Adam)": RatingRegressor(RFRec(
            learning_rate=0.1, reg_consensus=20.0, biased=False, random_state=0, **quick,
            solver_params={"optimizer": "adam", "link": "sigmoid"},
        )),
    }
    print(f"ml-latest-small{' (one user in ten)' if args.quick else ''}: {len(y):,} ratings, "
          f"{folds}-fold entry-wise cross_validate, estimator defaults (random_state=0)")
    print(f"{'estimator':<14}{'RMSE mean':>11}{'std':>8}{'fit s':>8}")
    for name, model in models.items():
        with warnings.catch_warnings():  # (--quick's 3 rounds do not converge)
            warnings.simplefilter("ignore", FedMFWarning)
            try:
                res = cross_validate(model, X, y, cv=cv, n_jobs=args.n_jobs,
                                     scoring="neg_root_mean_squared_error", error_score="raise")
            except FloatingPointError as exc:  # a default that diverges is a finding
                print(f"{name:<14}  raises FloatingPointError: {str(exc).splitlines()[0]}")
                continue
        rmse = -res["test_score"]
        print(f"{name:<14}{rmse.mean():>11.4f}{rmse.std():>8.4f}{np.mean(res['fit_time']):>8.1f}")


if __name__ == "__main__":
    main()
