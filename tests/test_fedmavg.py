"""FedMAvg for matrix completion: Wang and Chang's Algorithm 1 on a masked loss, and the
baseline as the FedMC-ADMM paper restates it (its Section 5.2)."""


import numpy as np
import pytest

from sklearn_fedmf import FedMAvg as _FedMAvg
from sklearn_fedmf import FedMGS as _FedMGS
from sklearn_fedmf.completion._fedmavg import _fedmavg_round as _fedmavg_protocol
from sklearn_fedmf.completion._fedmavg._fedmavg_protocol import server_prepare
from sklearn_fedmf.completion._fedmavg._fedmavg_round import q2_schedule
from sklearn_fedmf.engine._federation import nbytes

from .conftest import low_rank_ratings, paper

# The spec's oracles hold for the papers' settings (conftest.paper).

FedMAvg = paper(_FedMAvg)

FedMGS = paper(_FedMGS)


def small(**params):
    defaults = dict(n_components=2, n_clients=4, max_iter=30, random_state=0, center=False)
    return FedMAvg(**{**defaults, **params})


def masked(X):
    """Dense ratings and the mask of stored entries of a CSR matrix (tiny sizes only)."""
    mask = np.zeros(X.shape, bool)
    mask[np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), X.indices] = True
    return X.toarray(), mask


def lam_max(S):
    return np.linalg.eigvalsh(S)[-1]


# ---- schedule (Algorithm 1's diminishing Q2) -----------------------------------------------
def test_diminishing_q2_schedule_and_lemma_7(ratings):
    X, _, _ = ratings
    assert [q2_schedule(s, None, 5) for s in range(1, 9)] == [6, 3, 2, 2, 2, 1, 1, 1]
    assert [q2_schedule(s, 4, 5) for s in (1, 9)] == [4, 4]
    for q_hat in range(2, 30):
        q = np.array([q2_schedule(s, None, q_hat) for s in range(1, 10 * q_hat)])
        c1 = q * (q - 1) * (2 * q - 1)
        assert (c1[q_hat:] == 0).all()
        assert c1.sum() <= 3 * q_hat**3 + 6 * q_hat**2 - 3 * q_hat + q_hat * np.log(q_hat)
    # the server announces Q2^{s+1} with V^{s+1}
    seen = []
    small(max_iter=7, callback=lambda k, info: seen.append(info["broadcast"]["q2"])).fit(X)
    assert seen == [q2_schedule(s, None, 5) for s in range(2, 9)]


# ---- exact reductions (Algorithm 1; the FedMC-ADMM paper's Section 5.2) ---------------------
@pytest.mark.parametrize("w_step", ["global", "local"])
def test_one_client_and_one_step_is_centralized_alternating_gradient(ratings, w_step):
    X, _, _ = ratings
    a_u, a_v = 0.1, 0.2
    params = dict(n_clients=1, local_iter_u=1, local_iter_v=1, alpha_u=a_u, alpha_v=a_v,
                  w_step=w_step)
    one, two = small(max_iter=1, **params).fit(X), small(max_iter=2, **params).fit(X)
    M, mask = masked(X)
    U, V = one.user_factors_, one.components_
    c = 0.51 * (lam_max(V @ V.T) + a_u)
    U = U - ((mask * (U @ V - M)) @ V.T + a_u * U) / c
    d = 5.0 * (lam_max(U.T @ U) + a_v)
    V = V - (U.T @ (mask * (U @ V - M)) + a_v * V) / d
    np.testing.assert_allclose(two.user_factors_, U, rtol=1e-10)
    np.testing.assert_allclose(two.components_, V, rtol=1e-10)


def test_fedmc_admm_variant_is_the_restatement(ratings):
    """The FedMC-ADMM paper's Section 5.2: all clients update U (c = 1/2 lambda_max(V V^T), no
    1/p), the sampled ones run Q2 = 10 W steps from V^k (data gradient / p,
    d_i = 5 lambda_max(U_i^T U_i)), and V^{k+1} is the plain mean over S_k."""
    X, _, _ = ratings
    lam, gam, p = 0.05, 0.1, 4
    sampled = []
    params = dict(variant="fedmc_admm", clients_per_round=2, alpha_u=lam, alpha_v=gam)
    one = small(max_iter=1, **params).fit(X)
    two = small(max_iter=2, callback=lambda k, info: sampled.append(info["sampled"]),
                **params).fit(X)
    M, mask = masked(X)
    U, V = one.user_factors_.copy(), one.components_
    c = 0.5 * lam_max(V @ V.T)
    for _ in range(10):
        U = U - ((mask * (U @ V - M)) @ V.T + lam * U) / c
    copies = []
    for i in sampled[1]:
        rows = two.clients_ == i
        Ui, Mi, mi = U[rows], M[rows], mask[rows]
        d = 5.0 * lam_max(Ui.T @ Ui)
        W = V.copy()
        for _ in range(10):
            W = W - (Ui.T @ (mi * (Ui @ W - Mi)) / p + gam * W) / d
        copies.append(W)
    np.testing.assert_allclose(two.user_factors_, U, rtol=1e-10)
    np.testing.assert_allclose(two.components_, np.mean(copies, axis=0), rtol=1e-10)
    f = two.history_[-1]["objective"]
    expected = (0.5 * (mask * (U @ two.components_ - M)) ** 2).sum() + 0.5 * lam * (U**2).sum()
    expected = expected / p + 0.5 * gam * (two.components_**2).sum()
    assert f == pytest.approx(expected, rel=1e-10)


def test_weighted_fedmavg_with_q2_one_equals_fedmgs(ratings):
    """Full participation, weighted average (8), Q2 = 1, the same d factor, the global step
    (FedMGS's; the default guard would shorten it here)."""
    X, _, _ = ratings
    params = dict(alpha_u=0.1, alpha_v=0.2, max_iter=15)
    mavg = small(local_iter_v=1, d_factor=0.501, aggregation="weighted", w_step="global",
                 **params).fit(X)
    mgs = FedMGS(
        n_components=2, n_clients=4, random_state=0, **params, solver_params={"center": False},
    ).fit(X)
    np.testing.assert_allclose(mavg.components_, mgs.components_, rtol=1e-10)
    np.testing.assert_allclose(mavg.user_factors_, mgs.user_factors_, rtol=1e-10)


# ---- protocol ------------------------------------------------------------------------------
@pytest.mark.parametrize("participation, all_move", [("pcc", True), ("pcp", False)])
def test_who_moves(ratings, participation, all_move):
    X, _, _ = ratings
    sampled = []
    params = dict(participation=participation, clients_per_round=2)
    one = small(max_iter=1, **params).fit(X)
    two = small(max_iter=2, callback=lambda k, info: sampled.append(info["sampled"]),
                **params).fit(X)
    for client in range(4):
        rows = two.clients_ == client
        moved = not np.array_equal(one.user_factors_[rows], two.user_factors_[rows])
        assert moved == (all_move or client in sampled[1])


@pytest.mark.parametrize("w_step", ["global", "local"])
def test_privacy_contract_uploads_hold_only_the_local_model(ratings, w_step):
    X, _, _ = ratings
    n_items, r, P, m = X.shape[1], 2, 4, 2
    log = []
    model = small(clients_per_round=m, w_step=w_step, max_iter=6,
                  callback=lambda k, info: log.append(info)).fit(X)
    for k, info in enumerate(log):
        assert set(info["uploads"]) == set(info["sampled"].tolist())
        for upload in info["uploads"].values():
            assert set(upload) == {"W"} and upload["W"].shape == (n_items, r)
        sent = sum(nbytes(u) for u in info["uploads"].values())
        assert sent == m * n_items * r * 8  # the paper's m M K floats
        if w_step == "global":  # the step needs every client's r x r Gram (PCC: all compute)
            assert set(info["stats"]) == set(range(P))
            assert all(set(s) == {"gram"} and s["gram"].shape == (r, r)
                       for s in info["stats"].values())
            sent += P * r * r * 8
        else:
            assert info["stats"] == {}
        # round 1 adds the one-time client sizes (and Grams for the global step)
        once = P * 8 + (P * r * r * 8 if w_step == "global" else 0)
        assert model.history_[k]["bytes_uploaded"] == sent + (once if k == 0 else 0)
        # the broadcast reaches every client (PCC): V, Q2 and the total size
        assert model.history_[k]["bytes_downloaded"] >= P * n_items * r * 8
    for info in log:  # no user factor and no rating block ever goes up
        for message in list(info["uploads"].values()) + list(info["stats"].values()):
            for array in message.values():
                assert array.shape in ((n_items, r), (r, r))


# ---- behaviour ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "params",
    [{}, {"clients_per_round": 2}, {"variant": "fedmc_admm"}, {"w_step": "guarded"}],
)
def test_recovers_an_exactly_low_rank_matrix(params):
    """FedMAvg recovers the synthetic low-rank matrix."""
    X, Y, _ = low_rank_ratings(m=200, n=50, seed=2)
    model = FedMAvg(
        n_components=2, n_clients=4, max_iter=300, random_state=0, **params,
        solver_params={"center": False},
    ).fit(X, eval_set=Y)
    assert model.history_[-1]["eval_rmse"] < 0.05  # predicting 0 gives about 1
    assert model.history_[-1]["objective"] < 1e-2 * model.history_[0]["objective"]


def test_fedmc_admm_variant_rejects_a_global_step(ratings):
    X, _, _ = ratings
    with pytest.raises(ValueError, match="its own local step"):
        small(variant="fedmc_admm", w_step="global").fit(X)


def test_server_prepare_stores_the_grams_a_chunk_at_a_time(monkeypatch):
    # the stacked assignment runs in chunks (one stack of 480,189 Grams is a 0.75 GB
    # temporary); every chunk boundary must land each Gram on its client
    rng = np.random.default_rng(0)
    grams = rng.random((11, 3, 3))
    sent = {c: {"gram": rng.random((3, 3))} for c in [7, 2, 9, 0, 5, 10, 3]}
    expected = grams.copy()
    for c, stat in sent.items():
        expected[c] = stat["gram"]
    outs = []
    for chunk in (3, 4096):
        monkeypatch.setattr(_fedmavg_protocol, "_GRAM_CHUNK", chunk)
        state = {"grams": grams.copy()}
        state, message = server_prepare(state, sent, 0, d_factor=1.2, alpha_v=0.5,
                                        l1_ratio=0.0)
        np.testing.assert_array_equal(state["grams"], expected)
        outs.append(message["d"])
    top = np.linalg.eigvalsh(expected.sum(axis=0))[-1]
    np.testing.assert_allclose(outs, [1.2 * (top + 0.5)] * 2, rtol=1e-12)
