"""How FedMCADMM's default ``beta="auto"`` was chosen.

The paper gives no beta. Column ``j`` of a client's W step (P-15) has curvature
``(1/p) lambda_max(sum_t u_t u_t^T) <= (1/p) sum_t ||u_t||^2`` over the client's raters of
``j``, so a fixed number cannot suit data of every shape. ``beta="auto"`` is ``AUTO_BETA * b0``
with ``b0`` that bound at the start, averaged over the rated columns
(``sklearn_fedmf.completion._fedmc_admm._fedmc_admm_protocol.initial_curvature``:
the raters per rated column from ``ratings / (items p)``, the rows' squared norm from
``init_scale``, rank and the ones column of the biases). This script sweeps beta as a
multiple of ``b0`` on

- synthetic low-rank ratings, the tests' recovery recipe with the paper's settings (400 x 100,
  rank 2, 4 clients; full participation for 200 rounds and 2 of 4 clients for 400 rounds;
  3 seeds), reporting the worst test RMSE;
- the paper protocol (80/20, rank 5, 100 clients, 10 per round, 100 rounds) with the defaults
  on MovieLens latest-small (``ml``), on ``make_ratings`` at the ML-1M shape scaled down 8x in
  users (``1m-0.5``, as ``bench_defaults.py``) and at the full ML-1M shape (``1m-full``: 6040 x
  3706, 1,000,209 ratings, 60 users per client), reporting test RMSE (fold-in).

Measured (the numbers behind ``AUTO_BETA = 1``)::

     beta / b0  synthetic full  synthetic 2/4        ml    1m-0.5   1m-full
           0.3         1.4e-07        1.0e-07    0.8650    0.9010    0.6551
             1         5.3e-08        5.5e-08    0.8574    0.8578    0.6423
             3         4.5e-08        5.5e-08    0.8679    0.9459    0.7001

The best multiple is 1 on all three rating sets (b0 = 0.0106, 0.0116 and 0.0248: the ML-1M
shape has 2.2 ratings per client and item, the others fewer than one). The former ``b0``
(``rows per client * ||E[u u^T]||_F / p``, from the rows and ``init_scale`` only) grew 10x from
``ml`` to ``1m-full`` where this curvature grows 2.3x; at its ``0.3 b0`` the defaults' fits on the
ML-1M shapes stayed near the biases-only model.

    python benchmarks/bench_beta.py [--quick]
"""

import argparse
import sys
import warnings
from pathlib import Path

from sklearn_fedmf import FedMCADMM
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_protocol import initial_curvature
from sklearn_fedmf.datasets import load_movielens, make_ratings
from sklearn_fedmf.engine._fit import merge_params
from sklearn_fedmf.exceptions import UnobservedItemsWarning
from sklearn_fedmf.model_selection import train_test_split_ratings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.conftest import low_rank_ratings  # noqa: E402  (the tests' recipe, shared)


def _one_m(n_users, n_ratings):
    """``make_ratings`` at the ML-1M shape with ``n_users`` users, noise 0.5."""
    return make_ratings(n_users, 3706, n_ratings, noise=0.5, random_state=0).X


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UnobservedItemsWarning)
    multiples = [0.3, 1.0] if args.quick else [0.3, 1.0, 3.0]
    seeds = range(1 if args.quick else 3)
    scale = 0.1 if args.quick else 1.0

    Xs, Ys, _ = low_rank_ratings(m=400, n=100, r=2, density=0.5, seed=0)
    paper = PAPER_SETTINGS["FedMCADMM"]
    b0_syn = initial_curvature(Xs.nnz, Xs.shape[1], 4, 2, paper["solver_params"]["init_scale"],
                               False)
    sets = {"ml": load_movielens().X}
    if not args.quick:
        sets.update({"1m-0.5": _one_m(755, 125026), "1m-full": _one_m(6040, 1000209)})
    sets = {name: train_test_split_ratings(X, 0.2, random_state=0) for name, X in sets.items()}
    defaults = FedMCADMM()
    b0 = {name: initial_curvature(X.nnz, X.shape[1], 100, defaults.n_components,
                                  defaults._settings()["init_scale"], defaults.biased)
          for name, (X, _) in sets.items()}
    print(f"b0: synthetic {b0_syn:.4g}, "
          + ", ".join(f"{name} {value:.4g}" for name, value in b0.items()))
    print(f"{'beta / b0':>10}{'synthetic full':>16}{'synthetic 2/4':>15}"
          + "".join(f"{name:>10}" for name in sets))
    for mult in multiples:
        worst = []
        for cpr, rounds in ((None, 200), (2, 400)):
            rmse = [
                FedMCADMM(**merge_params(paper, dict(
                    n_components=2, n_clients=4, clients_per_round=cpr,
                    max_iter=int(rounds * scale), beta=mult * b0_syn, random_state=seed,
                    solver_params={"partition": "contiguous", "center": False},
                )))
                .fit(Xs, eval_set=Ys).history_[-1]["eval_rmse"]
                for seed in seeds
            ]
            worst.append(max(rmse))
        scores = []
        for name, (X, Y) in sets.items():
            model = FedMCADMM(
                n_components=5, n_clients=100, clients_per_round=10, max_iter=int(100 * scale),
                beta=mult * b0[name], random_state=0, solver_params={"eval_every": 0},
            ).fit(X)
            scores.append(-model.score(X, Y))
        print(f"{mult:>10g}{worst[0]:>16.1e}{worst[1]:>15.1e}"
              + "".join(f"{value:>10.4f}" for value in scores), flush=True)


if __name__ == "__main__":
    main()
