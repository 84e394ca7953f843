"""RFRec's personal predictions ``link(u_i . v_(c)j)`` with each client's own item matrix."""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import RFRec
from sklearn_fedmf.engine._fit import merge_params


def ratings(n=12, m=8, seed=0):
    rng = np.random.default_rng(seed)
    R = rng.normal(size=(n, 2)) @ rng.normal(size=(2, m)) + 3.0
    mask = rng.random((n, m)) < 0.5
    mask[np.arange(n), np.arange(n) % m] = True
    return R, mask


@pytest.mark.parametrize("params", [{}, {"n_clients": 4, "learning_rate": 0.05, "solver_params": {
    "link": "sigmoid", "optimizer": "adam"}}])
def test_personal_predictions_use_each_clients_uploaded_copy(params):
    """With every client sampled, the last round's dense uploads are the final copies V_(c):
    the personal prediction of user i is link(u_i . V_(c(i)) j) for every item j."""
    R, mask = ratings()
    X = sp.csr_matrix((R[mask], np.nonzero(mask)), shape=R.shape)
    last = {}
    params = merge_params({"learning_rate": 0.01, "biased": False, "n_clients": None}, params,
                          {"solver_params": {"simulate_uploads": True,
                                             "predict_with": "personal"}})
    est = RFRec(
        n_components=2, reg_consensus=1.0, max_iter=15, random_state=0,
        callback=lambda k, info: last.update(info["uploads"]), **params,
    ).fit(X)
    codes = np.unique(est.clients_, return_inverse=True)[1]
    # (the copies are on the scale the fit ran on: the ratings over rating_scale_)
    s = est.rating_scale_
    scores = s * np.stack([est.user_factors_[i] / np.sqrt(s) @ last[codes[i]].T
                           for i in range(R.shape[0])])
    expected = est._to_ratings(scores)
    np.testing.assert_allclose(est.predict(X), expected, rtol=1e-12, atol=1e-12)
    # the personal copies differ from Vbar, so the two predictions differ
    globals_ = est._to_ratings(est.user_factors_ @ est.components_)
    assert np.abs(expected - globals_).max() > 1e-6
    # score at held-out entries: RMSE of those predictions
    Y = sp.csr_matrix((R[~mask] + 0.1, np.nonzero(~mask)), shape=R.shape)
    rmse = np.sqrt(np.mean((expected[~mask] - Y.data) ** 2))
    assert est.score(X, Y) == pytest.approx(-rmse, rel=1e-12)


def test_personal_models_fit_their_own_ratings_better_than_the_average():
    """lambda = 0: each user's own copy fits its ratings, Vbar averages unrelated models."""
    R, mask = ratings(seed=1)
    X = sp.csr_matrix((R[mask], np.nonzero(mask)), shape=R.shape)
    est = RFRec(
        n_components=2, learning_rate=0.02, reg_consensus=0.0, alpha_u=0.01, max_iter=300,
        random_state=0, n_clients=None,  # (a user per client: each copy is one user's model)
        solver_params={"center": False, "eval_every": 0},
    ).fit(X)
    train_personal = -est.set_params(solver_params={"center": False, "eval_every": 0,
                                                    "predict_with": "personal"}).score(X)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    federated = est.user_factors_ @ est.components_
    train_global = np.sqrt(np.mean((federated[rows, X.indices] - X.data) ** 2))
    assert train_personal < 0.5 * train_global


def test_personal_predictions_need_the_training_rows():
    R, mask = ratings()
    X = sp.csr_matrix((R[mask], np.nonzero(mask)), shape=R.shape)
    est = RFRec(
        n_components=2, learning_rate=0.01, max_iter=3, random_state=0, n_clients=None,
        solver_params={"predict_with": "personal"},
    ).fit(X)
    with pytest.raises(ValueError, match="training users only"):
        est.predict(X[:5])
