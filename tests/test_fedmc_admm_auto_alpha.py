"""FedMCADMM's ``alpha_u="auto"``: a strength per rating, applied at the mean user."""

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose

from sklearn_fedmf import FedMCADMM
from sklearn_fedmf.completion._fedmc_admm_protocol import AUTO_ALPHA_U, auto_alpha_u
from sklearn_fedmf.flower._sites import make_site_protocol

from .conftest import low_rank_ratings

SMALL = dict(n_components=2, n_clients=4, max_iter=5, random_state=0,
             solver_params={"eval_every": 0})


@pytest.mark.parametrize("n_ratings, n_users", [(1, 1), (100_836, 610), (7, 1000), (10**8, 3)])
def test_auto_alpha_u_is_the_per_rating_strength_at_the_mean_user(n_ratings, n_users):
    plain = auto_alpha_u(n_ratings, n_users, weighted=False)
    assert plain == pytest.approx(AUTO_ALPHA_U * n_ratings / n_users)
    # scale-free in the federation's size: k times the users with the same ratings each
    assert auto_alpha_u(3 * n_ratings, 3 * n_users, weighted=False) == pytest.approx(plain)
    # and proportional to the ratings per user
    assert auto_alpha_u(2 * n_ratings, n_users, weighted=False) == pytest.approx(2 * plain)
    # the weighted penalty applies the same per-rating strength row by row
    assert auto_alpha_u(n_ratings, n_users, weighted=True) == AUTO_ALPHA_U


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.ConvergenceWarning")  # 5 rounds
def test_fit_resolves_auto_to_the_explicit_strength():
    X, Y, _ = low_rank_ratings(m=60, n=30)
    auto = FedMCADMM(**SMALL).fit(X)
    assert auto.alpha_u_ == pytest.approx(AUTO_ALPHA_U * X.nnz / X.shape[0])
    explicit = FedMCADMM(alpha_u=auto.alpha_u_, **SMALL).fit(X)
    assert explicit.alpha_u_ == auto.alpha_u_
    assert_allclose(auto.components_, explicit.components_)
    # fold-in (the ridge of transform and score) uses the resolved strength too
    assert_allclose(auto.transform(Y), explicit.transform(Y))
    assert FedMCADMM(regularization="weighted", **SMALL).fit(X).alpha_u_ == AUTO_ALPHA_U
    # the same users twice over: the same strength; half of each user's ratings: half of it
    assert FedMCADMM(**SMALL).fit(sp.vstack([X, X]).tocsr()).alpha_u_ == pytest.approx(
        auto.alpha_u_)
    keep = np.arange(X.nnz) % 2 == 0
    half = sp.csr_matrix((X.data[keep], X.indices[keep], np.r_[0, np.cumsum(
        np.add.reduceat(keep, X.indptr[:-1]))]), shape=X.shape)
    assert FedMCADMM(**SMALL).fit(half).alpha_u_ == pytest.approx(
        AUTO_ALPHA_U * half.nnz / X.shape[0])
    with pytest.raises(ValueError, match="alpha_u"):
        FedMCADMM(alpha_u="large", **SMALL).fit(X)


def test_auto_alpha_u_needs_only_the_server_aggregates():
    """A deployed server knows the users and ratings the sites report, not the ratings: it
    binds the same strength into the protocol as the simulated fit."""
    X, _, _ = low_rank_ratings(m=60, n=30)
    protocol = make_site_protocol(FedMCADMM(**SMALL), n_items=X.shape[1], n_clients=4,
                                  n_users=X.shape[0], mean=0.0, rating_range=(-3.0, 3.0),
                                  n_ratings=X.nnz)
    assert protocol.client_update.keywords["alpha_u"] == pytest.approx(
        AUTO_ALPHA_U * X.nnz / X.shape[0])


@pytest.mark.parametrize("density", [1.0, 0.6])
@pytest.mark.parametrize("clients_per_round", [None, 2])
def test_default_fit_of_a_dense_toy_does_not_oscillate(density, clients_per_round):
    """A weak penalty can make the training RMSE oscillate and grow (at ``alpha_u = alpha_v
    = 0.01`` it ends above 1.4 on the 0.6-dense toy, from 1.0). The default's RMSE never goes
    above its first round's, leaves its early transient (ADMM is not monotone: one bump of
    0.13 at round 10 with half the clients per round) and ends near the planted matrix."""
    rng = np.random.default_rng(0)
    M = rng.normal(size=(60, 2)) @ rng.normal(size=(2, 30))
    X = np.where(rng.random(M.shape) < density, M, np.nan)
    model = FedMCADMM(n_components=2, n_clients=4, clients_per_round=clients_per_round,
                      max_iter=100, random_state=0).fit(X)
    rmse = np.array([record["train_rmse"] for record in model.history_])
    assert rmse.max() <= rmse[0]
    late = rmse[20:]
    assert np.max(late[1:] - np.minimum.accumulate(late)[:-1]) < 0.02
    assert rmse[-1] < 0.05
