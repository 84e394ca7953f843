"""FedMC-ADMM on the embedded MovieLens latest-small: paper protocol and a tuned model.

80/20 holdout of the observed ratings (seed 0). Rows of the table:

- the global-mean baseline (predict the training mean everywhere);
- FedMCADMM under the paper's protocol (rank 5, 100 clients, 10 per round, N = 10,
  100 rounds), test RMSE with the federated factors of the last round (``history_``) and by
  fold-in (``score``);
- the model picked by GridSearchCV over the papers' five hyperparameters (lambda = alpha_u,
  beta, N = local_iter, p = n_clients, rank) with row-wise 3-fold CV on the training matrix
  (held-out entries of the held-out rows score each candidate), refit on all training rows.

    python benchmarks/bench_movielens.py           # full grid (a few minutes on 2 cores)
    python benchmarks/bench_movielens.py --quick   # smoke run
"""

import argparse
import time
import warnings

import numpy as np
from sklearn.model_selection import GridSearchCV, KFold

from sklearn_fedmf import FedMCADMM
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.datasets import load_movielens
from sklearn_fedmf.exceptions import UnobservedItemsWarning
from sklearn_fedmf.model_selection import train_test_split_ratings


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small grid, few rounds")
    parser.add_argument("--n-jobs", type=int, default=2, help="parallel CV fits")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UnobservedItemsWarning)  # items rated only in the test split
    rounds = 10 if args.quick else 100

    X, X_test = train_test_split_ratings(load_movielens().X, 0.2, random_state=0)
    rows = [("global mean", float(np.sqrt(np.mean((X_test.data - X.data.mean()) ** 2))),
             float("nan"), 0.0, {})]

    paper = dict(n_components=5, n_clients=100, clients_per_round=10,
                 max_iter=rounds, random_state=0, **PAPER_SETTINGS["FedMCADMM"])
    tic = time.perf_counter()
    model = FedMCADMM(**paper).fit(X, eval_set=X_test)
    rows.append(("FedMCADMM, paper protocol", model.history_[-1]["eval_rmse"],
                 -model.score(X, X_test), time.perf_counter() - tic,
                 {"beta": model.beta}))

    grid = {
        "alpha_u": [0.3, 3.0],
        "beta": [0.01, 0.1],
        "local_iter": [5, 10],
        "n_clients": [10, 100],
        "n_components": [5, 10],
    }
    if args.quick:
        grid = {"alpha_u": [1.0], "beta": [0.01, 0.1], "local_iter": [5], "n_clients": [10],
                "n_components": [5]}
    base = FedMCADMM(clients_per_round=10, max_iter=rounds, random_state=0,
                     **PAPER_SETTINGS["FedMCADMM"])
    tic = time.perf_counter()
    search = GridSearchCV(base, grid, cv=KFold(3, shuffle=True, random_state=0),
                          n_jobs=args.n_jobs).fit(X, X_test)
    best = search.best_estimator_
    best.set_params(solver_params={**best.solver_params, "eval_every": 1}).fit(
        X, eval_set=X_test)
    rows.append(("FedMCADMM, GridSearchCV-tuned", best.history_[-1]["eval_rmse"],
                 -best.score(X, X_test), time.perf_counter() - tic, search.best_params_))

    print(f"MovieLens latest-small, {X.shape[0]} users x {X.shape[1]} items, "
          f"{X.nnz} training / {X_test.nnz} test ratings (80/20, seed 0), {rounds} rounds")
    print(f"{'model':<32}{'test RMSE (federated U)':>25}{'test RMSE (fold-in)':>21}"
          f"{'seconds':>9}  parameters")
    for name, fed, fold, seconds, params in rows:
        print(f"{name:<32}{fed:>25.4f}{fold:>21.4f}{seconds:>9.1f}  {params}")


if __name__ == "__main__":
    main()
