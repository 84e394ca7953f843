"""FedMGS for matrix completion: gradient sharing with fresh client gradients per server step
(Wang and Chang's Algorithm 2 on a masked loss; its Remark 2 covers the full-observation
loss only)."""


import numpy as np
import pytest
from joblib import parallel_config

import sklearn_fedmf.completion._fedmgs as fedmgs
from sklearn_fedmf import FedMGS as _FedMGS
from sklearn_fedmf._engine import nbytes

from .conftest import low_rank_ratings, paper
from .test_fedmavg import lam_max, masked

# The spec's oracles hold for the papers' settings (conftest.paper).

FedMGS = paper(_FedMGS)


def small(**params):
    defaults = dict(n_components=2, n_clients=4, max_iter=30, random_state=0, center=False)
    return FedMGS(**{**defaults, **params})


def test_with_all_clients_the_partition_does_not_matter(ratings, monkeypatch):
    """Algorithm 2 for the masked loss: the server step uses the sum of the clients'
    gradients, which is the global gradient however the rows are split."""
    X, _, _ = ratings
    U0 = np.random.default_rng(5).random((X.shape[0], 2))
    original = fedmgs.init_client

    def same_start(block, Vt, rng, **kw):  # U^0 of a row must not depend on its client
        state, _ = original(block, Vt, rng, **kw)
        state["U"] = U0[block.rows].copy()
        return state, fedmgs.share(state["U"], Vt, block.X)

    monkeypatch.setattr(fedmgs, "init_client", same_start)
    fits = [small(alpha_u=0.1, alpha_v=0.1, **split).fit(X) for split in (
        dict(n_clients=1), dict(n_clients=5), dict(n_clients=3, partition="contiguous"))]
    for other in fits[1:]:
        np.testing.assert_allclose(other.components_, fits[0].components_, rtol=1e-10)
        np.testing.assert_allclose(other.user_factors_, fits[0].user_factors_, rtol=1e-10)


def test_one_client_and_one_step_is_centralized_alternating_gradient(ratings):
    X, _, _ = ratings
    a_u, a_v = 0.1, 0.2
    params = dict(n_clients=1, local_iter_u=1, alpha_u=a_u, alpha_v=a_v)
    one, two = small(max_iter=1, **params).fit(X), small(max_iter=2, **params).fit(X)
    M, mask = masked(X)
    U, V = one.user_factors_, one.components_
    U = U - ((mask * (U @ V - M)) @ V.T + a_u * U) / (0.51 * (lam_max(V @ V.T) + a_u))
    V = V - (U.T @ (mask * (U @ V - M)) + a_v * V) / (0.501 * (lam_max(U.T @ U) + a_v))
    np.testing.assert_allclose(two.user_factors_, U, rtol=1e-10)
    np.testing.assert_allclose(two.components_, V, rtol=1e-10)


def test_server_step_uses_every_clients_latest_gradient(ratings):
    """Sampled clients refresh their cached gradient; the others' entries stay as sent."""
    X, _, _ = ratings
    log = []

    def cached(state):  # the server's cache, as the dense gradients the clients sent
        shape = state["grad_sum"].shape
        return np.stack([fedmgs.cached_gradient(state["segments"], p, shape)
                         for p in range(4)])

    small(clients_per_round=2, max_iter=6, alpha_v=0.3,
          callback=lambda k, info: log.append({
              "sampled": info["sampled"], "grads": cached(info["server_state"]),
              "grams": np.concatenate([s["grams"] for s in info["server_state"]["segments"]]),
              "V": info["server_state"]["Vt"].copy(),
              "uploads": info["uploads"]})).fit(X)
    for prev, cur in zip(log, log[1:]):
        for p in range(4):
            if p in cur["sampled"]:
                np.testing.assert_array_equal(cur["grads"][p], cur["uploads"][p]["grad"])
            else:
                np.testing.assert_array_equal(cur["grads"][p], prev["grads"][p])
        d = 0.501 * (lam_max(cur["grams"].sum(axis=0)) + 0.3)
        expected = prev["V"] - (cur["grads"].sum(axis=0) + 0.3 * prev["V"]) / d
        np.testing.assert_allclose(cur["V"], expected, rtol=1e-12)


def test_privacy_contract_uploads_hold_a_gradient_and_a_gram(ratings):
    X, _, _ = ratings
    n_items, r, P, m = X.shape[1], 2, 4, 2
    log = []
    model = small(clients_per_round=m, max_iter=5,
                  callback=lambda k, info: log.append(info)).fit(X)
    per_client = (n_items * r + r * r) * 8
    for k, info in enumerate(log):
        assert set(info["uploads"]) == set(info["sampled"].tolist())  # PCP: nobody else
        for upload in info["uploads"].values():
            assert set(upload) == {"grad", "gram"}
            assert upload["grad"].shape == (n_items, r) and upload["gram"].shape == (r, r)
        assert sum(nbytes(u) for u in info["uploads"].values()) == m * per_client
        # every client's initial gradient (for G1^0, G2^0) is counted once, in round 1
        once = P * per_client if k == 0 else 0
        assert model.history_[k]["bytes_uploaded"] == m * per_client + once
        # the broadcast V reaches the sampled clients only
        assert model.history_[k]["bytes_downloaded"] == m * n_items * r * 8 + (
            P * n_items * r * 8 if k == 0 else 0)
    # what a gradient reveals: its nonzero rows are the items the client's users rated
    client_rows = model.clients_ == 0
    rated = np.unique(X[client_rows].indices)
    sent = next(info["uploads"][0]["grad"] for info in log if 0 in info["uploads"])
    np.testing.assert_array_equal(np.flatnonzero(np.abs(sent).sum(axis=1)), rated)


def test_same_model_for_any_n_jobs(ratings):
    X, _, _ = ratings
    ref = small(clients_per_round=2, n_jobs=1).fit(X)
    with parallel_config(backend="threading"):
        par = small(clients_per_round=2, n_jobs=2).fit(X)
    np.testing.assert_array_equal(ref.components_, par.components_)
    np.testing.assert_array_equal(ref.user_factors_, par.user_factors_)


@pytest.mark.parametrize("clients_per_round", [None, 2])
def test_recovers_an_exactly_low_rank_matrix(clients_per_round):
    X, Y, _ = low_rank_ratings(m=200, n=50, seed=2)
    model = FedMGS(n_components=2, n_clients=4, clients_per_round=clients_per_round,
                   max_iter=300, center=False, random_state=0).fit(X, eval_set=Y)
    assert model.history_[-1]["eval_rmse"] < 0.05
