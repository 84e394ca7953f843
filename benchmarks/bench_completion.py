"""FedMAvg and FedMGS beside FedMCADMM on MovieLens latest-small (the FedMC-ADMM protocol).

Usage::

    python benchmarks/bench_completion.py             # 3 seeds, 100 rounds
    python benchmarks/bench_completion.py --quick     # smoke run: 1 seed, 5 rounds
    python benchmarks/bench_completion.py --beta 0.03 --seeds 5

Protocol (the FedMC-ADMM paper's Section 5): each user's ratings split 80/20
(``train_test_split_ratings``, seeded), rank 5, 100 clients of random users, 10 sampled per
round (uniformly, without replacement), 100 rounds, ``alpha_u = alpha_v = 1e-6``, ratings
centred by the training mean.
``test RMSE`` is measured with the federated factors of the last round (the papers' curves);
``fold-in`` re-solves each user's factors with the final item factor (``score``). ``MB up``
and ``MB down`` are the engine's byte counts over the whole run (one-time uploads included).

Methods: FedMCADMM (``beta`` given on the command line; 0.01 was the best of 0.001-1 for
the federated test RMSE), FedMAvg as Wang & Chang wrote it (diminishing Q2, Q_hat = 5, step
factors 0.51 / 5, the global W step), FedMAvg as restated in the FedMC-ADMM paper
(``variant="fedmc_admm"``: Q1 = Q2 = 10, ``d_i = 5 lambda_max(U_i^T U_i)``, 1/p scalings), and
FedMGS (one server step per round with fresh client gradients).
"""

import argparse
import time
import warnings

import numpy as np

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.datasets import load_movielens
from sklearn_fedmf.engine._fit import merge_params
from sklearn_fedmf.exceptions import UnobservedItemsWarning
from sklearn_fedmf.model_selection import train_test_split_ratings


def methods(beta, rounds):
    common = dict(n_components=5, n_clients=100, clients_per_round=10, max_iter=rounds)
    return {
        f"FedMCADMM (beta={beta:g})": lambda: FedMCADMM(beta=beta, **common,
                                                        **PAPER_SETTINGS["FedMCADMM"]),
        "FedMAvg (Wang & Chang)": lambda: FedMAvg(**common, **PAPER_SETTINGS["FedMAvg"]),
        "FedMAvg (FedMC-ADMM paper)": lambda: FedMAvg(**merge_params(
            common, PAPER_SETTINGS["FedMAvg"], {"solver_params": {"variant": "fedmc_admm"}})),
        "FedMGS": lambda: FedMGS(**common, **PAPER_SETTINGS["FedMGS"]),
    }


def run(make, X_train, X_test, seed):
    model = make().set_params(random_state=seed)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnobservedItemsWarning)  # movies with no training rating
        model.fit(X_train, eval_set=X_test)
    seconds = time.perf_counter() - tic
    history = model.history_
    return {
        "test": history[-1]["eval_rmse"],
        "train": history[-1]["train_rmse"],
        "fold-in": -model.score(X_train, X_test),
        "seconds": seconds,
        "MB up": sum(r["bytes_uploaded"] for r in history) / 1e6,
        "MB down": sum(r["bytes_downloaded"] for r in history) / 1e6,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 5 rounds")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--beta", type=float, default=0.01, help="FedMCADMM's penalty")
    args = parser.parse_args()
    seeds, rounds = (1, 5) if args.quick else (args.seeds, args.rounds)

    X = load_movielens().X
    print(f"ml-latest-small: {X.shape[0]} users x {X.shape[1]} movies, {X.nnz} ratings; "
          f"80/20 per user, rank 5, 100 clients, 10 per round, {rounds} rounds, "
          f"{seeds} seed(s)\n")
    header = f"{'method':28s} {'test RMSE':>17s} {'fold-in':>8s} {'train':>8s} " \
             f"{'seconds':>8s} {'MB up':>8s} {'MB down':>8s}"
    print(header)
    print("-" * len(header))
    for name, make in methods(args.beta, rounds).items():
        rows = []
        for seed in range(seeds):
            X_train, X_test = train_test_split_ratings(X, 0.2, random_state=seed)
            rows.append(run(make, X_train, X_test, seed))
        mean = {key: np.mean([r[key] for r in rows]) for key in rows[0]}
        sd = np.std([r["test"] for r in rows])
        print(f"{name:28s} {mean['test']:8.4f} ± {sd:6.4f} {mean['fold-in']:8.4f} "
              f"{mean['train']:8.4f} {mean['seconds']:8.1f} {mean['MB up']:8.1f} "
              f"{mean['MB down']:8.1f}", flush=True)


if __name__ == "__main__":
    main()
