"""FedMC-ADMM under ``loss="implicit"``: the weighted objective's gradients and steps against
a dense reference over every user-item pair, the privacy contract, ``n_jobs`` invariance and
top-N quality against most-popular and the rating loss."""

import numpy as np
import pytest
from joblib import parallel_config

from sklearn_fedmf import FedMCADMM
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_implicit import (
    implicit_grad_u,
    implicit_grad_v,
    implicit_w_exact,
)
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_protocol import (
    EPS_LIPSCHITZ,
    client_update,
    init_client,
)
from sklearn_fedmf.completion._implicit import implicit_objective, implicit_user_factors
from sklearn_fedmf.engine._client_data import ClientBlock
from tests._implicit_reference import (
    dense_implicit_gradients,
    dense_implicit_objective,
    dense_preference_confidence,
    planted_interactions,
    popularity_scores,
    tiny,
    top_movies_leave_one_out,
)

CONFIDENCE = 2.5


def test_gram_objective_equals_dense_sum_over_every_pair():
    X, U, Vt = tiny()
    got = implicit_objective(X, U, Vt, confidence=CONFIDENCE, alpha_u=0.3, alpha_v=0.7)
    want = dense_implicit_objective(X, U, Vt, confidence=CONFIDENCE, alpha_u=0.3, alpha_v=0.7)
    np.testing.assert_allclose(got, want, rtol=1e-10)


def test_client_gradients_equal_dense():
    # f_i carries the paper's 1/2: its gradients are half the dense sum's
    X, U, Wt = tiny(1)
    gU, gV = dense_implicit_gradients(X, U, Wt, confidence=CONFIDENCE)
    np.testing.assert_allclose(implicit_grad_u(X, U, Wt, confidence=CONFIDENCE), gU / 2,
                               rtol=1e-10)
    np.testing.assert_allclose(implicit_grad_v(X, U, Wt, confidence=CONFIDENCE), gV / 2,
                               rtol=1e-10)


def _dense_round(X, U, Wt, Vt, Yt, *, p, beta, alpha_u):
    """One round of Algorithm 1 with N = 1 on the dense weighted objective: (P-14) with the
    squared-l2 prox, (P-15), the dual step; the constants from the dense Hessian bounds."""
    P, C = dense_preference_confidence(X, CONFIDENCE)
    L_W = np.linalg.norm(Wt.T @ Wt) + max(
        sum((C[t, j] - 1) * Wt[j] @ Wt[j] for j in range(X.shape[1])) for t in range(len(U)))
    gU = dense_implicit_gradients(X, U, Wt, confidence=CONFIDENCE)[0] / 2
    U1 = (U - gU / L_W) / (1 + alpha_u / L_W)
    L_U = np.linalg.norm(U1.T @ U1) + max(
        sum((C[t, j] - 1) * U1[t] @ U1[t] for t in range(len(U))) for j in range(X.shape[1]))
    gV = dense_implicit_gradients(X, U1, Wt, confidence=CONFIDENCE)[1] / 2
    W1 = ((L_U / p) * Wt + beta * Vt - gV / p - Yt) / (L_U / p + beta)
    return U1, W1, Yt + beta * (W1 - Vt)


def test_one_round_equals_dense_steps():
    X, U, Wt = tiny(2)
    rng = np.random.default_rng(3)
    Vt, Yt = rng.normal(size=Wt.shape), rng.normal(size=Wt.shape)
    p, beta, alpha_u = 3, 0.7, 0.4
    block = ClientBlock(np.arange(X.shape[0]), X, None)
    state, upload = client_update(
        {"U": U, "Wt": Wt, "Yt": Yt}, block, Vt, None, True, n_clients=p, beta=beta,
        local_iter=1, alpha_u=alpha_u, l1_ratio=0.0, positive=False, w_update="linearized",
        confidence=CONFIDENCE)
    U1, W1, Y1 = _dense_round(X, U, Wt, Vt, Yt, p=p, beta=beta, alpha_u=alpha_u)
    np.testing.assert_allclose(state["U"], U1, rtol=1e-10)
    np.testing.assert_allclose(state["Wt"], W1, rtol=1e-10)
    np.testing.assert_allclose(upload["Y"], Y1, rtol=1e-10)
    assert EPS_LIPSCHITZ < 1e-6  # (the floor is not what set the constants here)


def test_exact_w_update_is_the_minimizer():
    # Remark 4.1 on the weighted objective: the gradient of the W subproblem vanishes
    X, U, _ = tiny(4)
    rng = np.random.default_rng(5)
    Vt, Yt = rng.normal(size=(5, 2)), rng.normal(size=(5, 2))
    p, beta = 3, 0.7
    W = implicit_w_exact(U, Vt, Yt, X, beta, p, confidence=CONFIDENCE)
    gV = dense_implicit_gradients(X, U, W, confidence=CONFIDENCE)[1] / 2
    np.testing.assert_allclose(gV / p + Yt + beta * (W - Vt), 0, atol=1e-10)


def test_initial_dual_is_the_weighted_gradient():
    X, _, Vt = tiny(6)
    block = ClientBlock(np.arange(X.shape[0]), X, None)
    state, upload = init_client(block, Vt, np.random.default_rng(0), n_clients=4,
                                init_scale=0.5, dual_init="paper", positive=False,
                                confidence=CONFIDENCE)
    gV = dense_implicit_gradients(X, state["U"], Vt, confidence=CONFIDENCE)[1] / 2
    np.testing.assert_allclose(upload["Y"], -gV / 4, rtol=1e-10)


def test_user_closed_form_minimizes_the_dense_objective():
    X, _, Vt = tiny(7)
    U = implicit_user_factors(X, Vt, Vt.T @ Vt, confidence=CONFIDENCE, alpha_u=0.5)
    gU = dense_implicit_gradients(X, U, Vt, confidence=CONFIDENCE)[0]
    np.testing.assert_allclose(gU + 2 * 0.5 * U, 0, atol=1e-10)


def small(**params):
    return FedMCADMM(**{"n_components": 2, "n_clients": 4, "max_iter": 15, "local_iter": 5,
                        "loss": "implicit", "random_state": 0, **params})


def test_history_objective_is_the_dense_objective():
    X = planted_interactions()
    model = small(alpha_u=0.3, alpha_v=0.2).fit(X)
    U, Vt = model.user_factors_, model.components_.T
    p = model.n_clients_
    want = (dense_implicit_objective(X, U, Vt, confidence=model.confidence_) / p  # (f_i: 1/2)
            + 0.5 * 0.3 * np.sum(U * U) / p + 0.5 * 0.2 * np.sum(Vt * Vt))
    np.testing.assert_allclose(model.history_[-1]["objective"], want, rtol=1e-10)
    assert model.history_[-1]["objective"] < model.history_[1]["objective"]


def test_no_biases_no_mean_no_clip_under_implicit():
    X = planted_interactions()
    model = small(biased=True, clip=True).fit(X)
    assert not hasattr(model, "item_bias_") or model.item_bias_ is None
    assert model.mean_ == 0.0
    assert model.components_.shape == (2, X.shape[1])
    scores = model.predict(X[:5])
    # preference scores, not ratings clipped to [1, 5]
    assert scores.max() < 1.5 and scores.min() < 1.0
    np.testing.assert_allclose(
        model.transform(X[:5]),
        implicit_user_factors(X[:5], model.components_.T,
                              model.components_ @ model.components_.T,
                              confidence=model.confidence_, alpha_u=model.alpha_u_))


def test_negative_strengths_are_refused():
    X = planted_interactions()
    X.data[0] = -1.0
    with pytest.raises(ValueError, match="negative value"):
        small().fit(X)


def test_uploads_hold_no_client_rows_or_factors():
    X = planted_interactions()
    log = []
    model = small(clients_per_round=2, callback=lambda k, info: log.append(info["uploads"]))
    model.fit(X)
    n_items, r = X.shape[1], 2
    for k, uploads in enumerate(log):
        assert len(uploads) == 2
        for upload in uploads.values():
            assert set(upload) == {"W", "Y"}  # the paper's message, nothing more
            assert all(np.shape(a) == (n_items, r) for a in upload.values())
        if k:
            assert model.history_[k]["bytes_uploaded"] == 2 * 2 * n_items * r * 8
    for uploads in log:
        for c, upload in uploads.items():
            U = model.user_factors_[model.clients_ == c]
            rows = X[model.clients_ == c].toarray()
            for a in upload.values():
                assert not np.shares_memory(U, a) and np.shape(a) != U.shape
                assert np.shape(a) != rows.shape


@pytest.mark.parametrize("backend", ["threading", "loky"])
def test_same_model_for_any_n_jobs_and_backend(backend):
    X = planted_interactions()
    reference = small(clients_per_round=2, n_jobs=1).fit(X)
    with parallel_config(backend=backend):
        other = small(clients_per_round=2, n_jobs=2).fit(X)
    np.testing.assert_array_equal(reference.components_, other.components_)
    np.testing.assert_array_equal(reference.user_factors_, other.user_factors_)


def test_many_clients_run_one_block_each():
    # (the grouped phases hold W_i implicitly through scalar maps that the Gram term breaks)
    X = planted_interactions(m=510, n=12, seed=1)
    model = small(max_iter=2, local_iter=2).fit(X, clients=np.arange(X.shape[0]))
    assert model.n_clients_ == 510
    assert np.isfinite(model.history_[-1]["objective"])


def test_implicit_beats_most_popular_and_the_rating_loss():
    train, hr = top_movies_leave_one_out()
    popularity = popularity_scores(train)
    params = dict(n_components=8, n_clients=10, max_iter=30, local_iter=20, random_state=0)
    implicit = FedMCADMM(loss="implicit", **params).fit(train)
    squared = FedMCADMM(**params).fit(train)
    hr_implicit = hr(implicit.user_factors_ @ implicit.components_)
    # (the user's bias does not reorder its list)
    hr_squared = hr(squared.user_factors_ @ squared.components_ + squared.item_bias_)
    hr_popular = hr(popularity)
    assert hr_implicit > hr_popular
    assert hr_implicit > hr_squared
