"""RFRec / RFRecF under ``loss="implicit"``: the local step against a dense reference over every
user-item pair (RFRec is gradient descent on the weighted ``F``), uploads with and without
privacy, ``n_jobs`` invariance and top-N quality against most-popular and the rating loss."""

import numpy as np
import pytest
from joblib import parallel_config

from sklearn_fedmf import RFRec
from sklearn_fedmf.completion._implicit import implicit_objective, implicit_user_factors
from sklearn_fedmf.completion._rfrec._rfrec import ItemMatrixUpload
from sklearn_fedmf.completion._rfrec._rfrec_implicit import implicit_client_grads
from sklearn_fedmf.privacy import LocalDP
from tests._implicit_reference import (
    dense_implicit_gradients,
    dense_implicit_objective,
    planted_interactions,
    popularity_scores,
    tiny,
    top_movies_leave_one_out,
)

CONFIDENCE = 2.5


def test_client_gradients_equal_dense():
    X, U, P = tiny(1)
    Vbar = np.random.default_rng(2).normal(size=P.shape)
    gU, gP = implicit_client_grads(X, X.indices, U, P, Vbar, confidence=CONFIDENCE,
                                   alpha_u=0.3, reg_v=0.2, reg=1.5, scale=1.0)
    dU, dP = dense_implicit_gradients(X, U, P, confidence=CONFIDENCE)
    np.testing.assert_allclose(gU, dU + 2 * 0.3 * U, rtol=1e-10)
    np.testing.assert_allclose(gP, dP + 2 * 0.2 * P + 1.5 * (P - Vbar), rtol=1e-10)
    # RFRecF's main update: grad f / (1 - p), no consensus term
    gU, gP = implicit_client_grads(X, X.indices, U, P, Vbar, confidence=CONFIDENCE,
                                   alpha_u=0.3, reg_v=0.2, reg=0.0, scale=2.0)
    np.testing.assert_allclose(gP, 2 * (dP + 2 * 0.2 * P), rtol=1e-10)


def model(**params):
    # (one client per user: the paper's setting)
    return RFRec(**{"n_components": 2, "learning_rate": 0.01, "alpha_u": 0.1, "alpha_v": 0.3,
                    "reg_consensus": 2.0, "n_clients": None, "loss": "implicit",
                    "random_state": 0, "solver_params": {"confidence": CONFIDENCE},
                    **params})


def dense_state(est):
    """``U``, every client's whole copy ``V_(c)`` and ``Vbar`` (one user per client)."""
    fed = est._federation
    V = np.stack([s["P"] for s in fed.client_states])
    assert all(len(s["cols"]) == est.n_features_in_ for s in fed.client_states)
    return est.user_factors_.copy(), V, fed.broadcast.simulation.Vbar.copy()


def test_rfrec_iteration_is_gradient_descent_on_the_dense_objective():
    X = tiny(3)[0]
    est = model(max_iter=2, warm_start=True).fit(X)
    U, V, Vbar = dense_state(est)
    est.set_params(max_iter=1).fit(X)
    U1, V1, Vbar1 = dense_state(est)
    lr, N = 0.01, X.shape[0]
    for c in range(N):  # client c holds user c
        dU, dV = dense_implicit_gradients(X[c], U[c:c + 1], V[c], confidence=CONFIDENCE)
        np.testing.assert_allclose(U1[c], U[c] - lr * (dU[0] + 2 * 0.1 * U[c]), rtol=1e-10)
        step = dV + 2 * (0.3 / N) * V[c] + 2.0 * (V[c] - Vbar)
        np.testing.assert_allclose(V1[c], V[c] - lr * step, rtol=1e-10)
    np.testing.assert_allclose(Vbar1, V1.mean(axis=0), rtol=1e-10)


def test_history_objective_is_the_dense_objective():
    X = tiny(4)[0]
    est = model(max_iter=3).fit(X)
    U, V, Vbar = dense_state(est)
    N = X.shape[0]
    fit = sum(2 * dense_implicit_objective(X[c], U[c:c + 1], V[c], confidence=CONFIDENCE)
              for c in range(N))  # (RFRec's F has no 1/2)
    want = (fit + 0.1 * np.sum(U * U) + (0.3 / N) * np.sum(V * V)
            + 2.0 * 0.5 * np.sum((V - Vbar) ** 2))
    np.testing.assert_allclose(est.history_[-1]["objective"], want, rtol=1e-10)
    # the Gram form of the shared module agrees with the loops
    np.testing.assert_allclose(
        implicit_objective(X[0], U[:1], V[0], confidence=CONFIDENCE, alpha_u=0, alpha_v=0),
        dense_implicit_objective(X[0], U[:1], V[0], confidence=CONFIDENCE), rtol=1e-10)


@pytest.mark.parametrize("solver_params", [{}, {"variant": "rfrecf"}, {"optimizer": "adam"}])
def test_fit_decreases_the_weighted_objective(solver_params):
    X = planted_interactions()
    est = model(n_clients=4, learning_rate="auto", max_iter=40,
                solver_params={"confidence": CONFIDENCE, **solver_params}).fit(X)
    objective = [h["objective"] for h in est.history_]
    assert objective[-1] < 0.8 * objective[0]
    # no biases, no mean: preference scores, fold-in by the exact weighted solve
    assert est.mean_ == 0.0 and not est._biased
    np.testing.assert_allclose(
        est.transform(X[:4]),
        implicit_user_factors(X[:4], est.components_.T, est.components_ @ est.components_.T,
                              confidence=CONFIDENCE, alpha_u=0.1))


def test_sigmoid_link_is_refused():
    with pytest.raises(ValueError, match="needs link=\"identity\""):
        model(biased=False, solver_params={"link": "sigmoid"}).fit(tiny()[0])


@pytest.mark.parametrize("privacy", [None, LocalDP(clip=0.05, noise=0.0)])
def test_uploads_hold_no_client_rows_or_factors(privacy):
    X = planted_interactions()
    uploads = []
    est = model(n_clients=4, max_iter=3, privacy=privacy,
                callback=lambda k, info: uploads.append(info["uploads"])).fit(X)
    n_items, d = X.shape[1], 2
    for k, round_uploads in enumerate(uploads):
        assert sorted(round_uploads) == [0, 1, 2, 3]
        for c, up in round_uploads.items():
            assert isinstance(up, ItemMatrixUpload)
            assert set(vars(up)) == {"cols", "values", "n_items", "noise_scale"}
            # the paper's V_(c), every column: no user vector, no interaction row
            assert up.values.shape == (n_items, d) and up.nbytes == n_items * d * 8
            U = est.user_factors_[est.clients_ == c]
            assert not np.shares_memory(up.values, U)
            if privacy is not None:
                assert np.abs(up.values).max() <= 0.05
        assert est.history_[k]["bytes_uploaded"] == 4 * n_items * d * 8


@pytest.mark.parametrize("backend", ["threading", "loky"])
def test_same_model_for_any_n_jobs_and_backend(backend):
    X = planted_interactions()
    reference = model(n_clients=4, max_iter=5, n_jobs=1).fit(X)
    with parallel_config(backend=backend):
        other = model(n_clients=4, max_iter=5, n_jobs=2).fit(X)
    np.testing.assert_array_equal(reference.components_, other.components_)
    np.testing.assert_array_equal(reference.user_factors_, other.user_factors_)


def test_implicit_beats_most_popular_and_the_rating_loss():
    train, hr = top_movies_leave_one_out()
    popularity = popularity_scores(train)
    params = dict(n_components=8, n_clients=10, random_state=0,
                  solver_params={"optimizer": "adam"})
    implicit = RFRec(loss="implicit", **params).fit(train)
    squared = RFRec(**params).fit(train)
    hr_implicit = hr(implicit.user_factors_ @ implicit.components_)
    # (the user's bias does not reorder its list)
    hr_squared = hr(squared.user_factors_ @ squared.components_ + squared.item_bias_)
    assert hr_implicit > hr(popularity)
    assert hr_implicit > hr_squared


def test_state_beyond_memory_is_refused_before_the_first_round(monkeypatch):
    from sklearn_fedmf.completion._fedmc_admm import _fedmc_admm

    monkeypatch.setattr(_fedmc_admm, "_available_memory", lambda: 10_000)
    X = planted_interactions()  # 80 clients x 40 items x 2 factors x 8 bytes = 51,200 bytes
    with pytest.raises(MemoryError, match="51200 bytes"):
        model(max_iter=1).fit(X)
    model(n_clients=4, max_iter=1).fit(X)  # 2,560 bytes fit
