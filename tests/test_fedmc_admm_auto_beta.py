"""FedMCADMM's ``beta="auto"``: the curvature it scales with, and fits on several shapes."""

import numpy as np
import pytest

from sklearn_fedmf import FedMCADMM
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_protocol import AUTO_BETA, initial_curvature
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.engine._fit import merge_params
from sklearn_fedmf.model_selection import train_test_split_ratings

from .conftest import low_rank_ratings


@pytest.mark.parametrize("n_ratings, n_items, n_clients, r, scale, biased", [
    (3000, 500, 20, 5, 0.1, True),     # most rated columns of a client: one rater
    (40000, 200, 10, 3, 1.0, False),   # ~20 raters per rated column
    (8000, 400, 10, 4, 0.5, True),     # ~2 raters: the Poisson correction matters
])
def test_initial_curvature_is_the_mean_rated_column_curvature(n_ratings, n_items, n_clients,
                                                              r, scale, biased):
    """Monte Carlo oracle: ratings spread at random over (client, item) cells, rows drawn as
    the initialization draws them; ``b0`` is the mean over the rated cells of
    ``(1/p) sum_{raters} ||u_t^0||^2`` (the bound on the W step's column curvature)."""
    rng = np.random.default_rng(0)
    values = []
    for _ in range(4):
        counts = rng.multinomial(n_ratings, np.full(n_items * n_clients, 1 / (n_items * n_clients)))
        U = scale * rng.random((n_ratings, r))
        norms = np.sum(U**2, axis=1) + (1.0 if biased else 0.0)  # + the ones column
        sums = np.add.reduceat(norms, np.concatenate([[0], np.cumsum(counts[counts > 0])[:-1]]))
        values.append(np.mean(sums) / n_clients)
    expected = initial_curvature(n_ratings, n_items, n_clients, r, scale, biased)
    assert np.mean(values) == pytest.approx(expected, rel=0.03)


def test_initial_curvature_limits():
    row = 5 * 0.1**2 / 3 + 1.0
    # sparse clients: a rated column has one rater
    assert initial_curvature(10, 10**6, 100, 5, 0.1, True) == pytest.approx(row / 100, rel=1e-4)
    # dense clients: lambda raters, whatever the rows per client
    assert initial_curvature(10**7, 100, 10, 5, 0.1, True) == pytest.approx(10**4 * row / 10)
    # more clients: fewer raters per column and a smaller 1/p
    assert (initial_curvature(10**5, 1000, 200, 5, 0.1, True)
            < initial_curvature(10**5, 1000, 100, 5, 0.1, True))


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.ConvergenceWarning")  # 2 rounds
def test_auto_beta_is_scaled_by_the_training_ratings():
    X, _, _ = low_rank_ratings(m=60, n=30)
    model = FedMCADMM(n_clients=6, max_iter=2, random_state=0).fit(X)
    assert model.beta_ == pytest.approx(AUTO_BETA * initial_curvature(
        X.nnz, X.shape[1], 6, model.n_components, model._settings()["init_scale"], True))
    # with biases the ones column gives a curvature even at init_scale=0; without, it raises
    assert FedMCADMM(n_clients=6, max_iter=2, solver_params={"init_scale": 0.0}).fit(X).beta_ > 0
    with pytest.raises(ValueError, match="explicit beta"):
        FedMCADMM(n_clients=6, max_iter=2, biased=False, solver_params={"init_scale": 0.0}).fit(X)


# (the biases-only reference may end a tiny bit above its first round's objective)
@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("n_users, n_items, n_ratings, n_clients", [
    (200, 600, 10000, 20),   # few users per client, most items unrated by a client
    (400, 150, 24000, 10),   # many raters per item in every client
])
def test_defaults_fit_several_shapes_at_partial_participation(n_users, n_items, n_ratings,
                                                              n_clients):
    """The paper's protocol at 10-20 % participation: the defaults' fit beats the biases-only
    model fitted the same way (``init_scale=0``: the factors stay at the zero saddle) by a clear
    margin, stays finite and its training error falls."""
    X = make_ratings(n_users, n_items, n_ratings, n_components=3, noise=0.5,
                     random_state=0).X
    X_train, X_test = train_test_split_ratings(X, 0.2, random_state=0)
    params = dict(n_clients=n_clients, clients_per_round=0.2, max_iter=30, random_state=0)
    model = FedMCADMM(**params, solver_params={"eval_every": 10}).fit(X_train)
    biases_only = FedMCADMM(**params, solver_params={"init_scale": 0.0, "eval_every": 10}).fit(
        X_train)
    rmse = -model.score(X_train, X_test)
    train = [h["train_rmse"] for h in model.history_ if "train_rmse" in h]
    assert np.all(np.isfinite(train)) and train[-1] < train[0]
    assert rmse < -biases_only.score(X_train, X_test) - 0.1  # (old defaults: 0.002 on the first)


def test_paper_settings_with_auto_beta_recover_a_low_rank_matrix():
    """The spec's recovery recipe (400 x 100, rank 2, 4 clients, 2 sampled per round,
    lambda = 1e-6, no biases, the paper's Uniform[0, 1) start) with ``beta="auto"``."""
    X, Y, _ = low_rank_ratings(m=400, n=100, r=2, density=0.5, seed=0)
    model = FedMCADMM(**merge_params(PAPER_SETTINGS["FedMCADMM"], dict(
        n_components=2, n_clients=4, clients_per_round=2, max_iter=400, random_state=0, clip=False,
        solver_params={"partition": "contiguous", "center": False, "eval_every": 0},
    ))).fit(X)
    assert -model.score(X, Y) < 1e-3
