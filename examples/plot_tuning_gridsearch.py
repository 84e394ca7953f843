"""Tuning a federated estimator with scikit-learn's GridSearchCV.

FedMC-ADMM has the same hyperparameters as its paper: ``alpha_u`` (lambda), ``beta``,
``local_iter`` (N), ``n_clients`` (p) and ``n_components`` (the rank). ``GridSearchCV`` tunes
them like those of any other estimator. The rows of the matrix are users, so ``KFold`` holds
out whole users. Each candidate is fit on the training ratings of the other users.
``score(X, y)`` then folds the held-out users in from their training ratings ``X`` and
returns minus the RMSE on their held-out ratings ``y``. The figure is a heat map of the
cross-validated RMSE over ``beta`` and ``alpha_u``.

Run ``python examples/plot_tuning_gridsearch.py [--quick] [--out DIR]``.
"""

import argparse
import os
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.model_selection import GridSearchCV, KFold  # noqa: E402

from sklearn_fedmf import FedMCADMM  # noqa: E402
from sklearn_fedmf.datasets import load_movielens, make_ratings  # noqa: E402
from sklearn_fedmf.exceptions import UnobservedItemsWarning  # noqa: E402
from sklearn_fedmf.model_selection import train_test_split_ratings  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("FEDMF_QUICK")),
                        help="small synthetic data, 2 x 2 grid, 5 rounds (also FEDMF_QUICK=1)")
    parser.add_argument("--out", default="fedmf-out/examples", help="folder of the figure")
    args = parser.parse_args()

    if args.quick:
        X, name = make_ratings(300, 80, 6000, random_state=0).X, "synthetic 300 x 80"
        grid = {"beta": [0.1, 1.0], "alpha_u": [1.0, 10.0]}
        base = FedMCADMM(n_clients=20, clients_per_round=5, max_iter=5, random_state=0)
    else:
        X, name = load_movielens().X, "MovieLens latest-small"
        grid = {"beta": [0.003, 0.01, 0.1, 1.0], "alpha_u": [1e-6, 1.0, 10.0, 30.0]}
        base = FedMCADMM(n_clients=100, clients_per_round=10, max_iter=50, random_state=0)
    X_train, X_test = train_test_split_ratings(X, test_size=0.2, random_state=0)
    search = GridSearchCV(base, {**grid, "local_iter": [10], "n_components": [5]},
                          cv=KFold(3, shuffle=True, random_state=0), n_jobs=1 if args.quick else 2)
    with warnings.catch_warnings():  # items without training ratings in some folds
        warnings.simplefilter("ignore", UnobservedItemsWarning)
        search.fit(X_train, X_test)  # y = held-out ratings of the same users

    betas, alphas = grid["beta"], grid["alpha_u"]
    rmse = np.empty((len(alphas), len(betas)))
    for params, score in zip(search.cv_results_["params"], search.cv_results_["mean_test_score"]):
        rmse[alphas.index(params["alpha_u"]), betas.index(params["beta"])] = -score
    print(f"best: {search.best_params_}, CV RMSE {-search.best_score_:.4f}")

    fig, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    image = ax.imshow(rmse, cmap="viridis_r", origin="lower")
    middle = (rmse.min() + rmse.max()) / 2
    for (i, j), value in np.ndenumerate(rmse):  # dark text on the light (low-RMSE) cells
        ax.text(j, i, f"{value:.3f}", ha="center", va="center",
                color="k" if value < middle else "w")
    ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
    ax.set_yticks(range(len(alphas)), [f"{a:g}" for a in alphas])
    ax.set(xlabel="beta (ADMM penalty)", ylabel="alpha_u (lambda)",
           title=f"FedMC-ADMM, 3-fold CV over users\n{name}, {base.max_iter} rounds")
    fig.colorbar(image, label="cross-validated test RMSE (lower is better)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "tuning_gridsearch.png", dpi=110)
    print(f"wrote {out / 'tuning_gridsearch.png'}")


if __name__ == "__main__":
    main()
