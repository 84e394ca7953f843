"""FedMGS for matrix completion: Wang and Chang's Algorithm 2 on a masked loss, the clients
sharing per-item data aggregates from which the server rebuilds the exact gradient."""


import numpy as np
import pytest

import sklearn_fedmf._kernels as kernels
import sklearn_fedmf.completion._fedmgs._fedmgs_batched as fedmgs_batched
import sklearn_fedmf.completion._fedmgs._fedmgs_protocol as fedmgs
from sklearn_fedmf import FedMGS as _FedMGS
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.engine._federation import nbytes

from .conftest import cached_aggregates, low_rank_ratings, paper
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
        return state, fedmgs.share(state["U"], block.X)

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


def test_server_steps_use_the_exact_gradient_at_every_clients_factors(ratings):
    """Partial participation: the sampled clients refresh their cached aggregates, the
    others' stay as sent, and the server's Q2 steps are proximal-gradient steps with the
    exact masked gradient at all clients' current factors (eq. (32), item by item)."""
    X, _, _ = ratings
    n_items, r, a_v = X.shape[1], 2, 0.3
    log = []

    def cached(state):  # the server's cache, as dense per-client aggregates
        return np.stack([cached_aggregates(state["segments"], p, n_items)
                         for p in range(4)])

    model = small(clients_per_round=2, max_iter=6, alpha_v=a_v, local_iter_v=3,
                  callback=lambda k, info: log.append({
                      "sampled": info["sampled"], "cache": cached(info["server_state"]),
                      "V": info["server_state"]["Vt"].T.copy(),
                      "uploads": info["uploads"]})).fit(X)
    for prev, cur in zip(log, log[1:]):
        for p in range(4):
            if p in cur["sampled"]:
                upload = cur["uploads"][p]
                expected = np.zeros((n_items, r + r * r))
                expected[upload["items"]] = upload["G"]
                np.testing.assert_array_equal(cur["cache"][p], expected)
            else:
                np.testing.assert_array_equal(cur["cache"][p], prev["cache"][p])
    M, mask = masked(X)
    U, V = model.user_factors_, log[-2]["V"]  # (every client's current factors)
    d = 0.501 * (lam_max(U.T @ U) + a_v)
    for _ in range(3):
        V = V - (U.T @ (mask * (U @ V - M)) + a_v * V) / d
    np.testing.assert_allclose(log[-1]["V"], V, rtol=1e-10)


def test_privacy_contract_uploads_hold_the_per_item_aggregates(ratings):
    """A sampled client sends, for each item its users rated, ``G2_j = sum_t x_tj u_t`` and
    ``G1_j = sum_t u_t u_t^T`` (its masked (29)), and its Gram; nobody else sends."""
    X, _, _ = ratings
    n_items, r, P, m = X.shape[1], 2, 4, 2
    log = []
    model = small(clients_per_round=m, max_iter=5,
                  callback=lambda k, info: log.append(info)).fit(X)
    rated = [np.unique(X[model.clients_ == p].indices) for p in range(P)]

    def size(p):  # the rated items (int32 indices), r + r^2 numbers per item, the Gram
        return len(rated[p]) * (4 + (r + r * r) * 8) + r * r * 8

    for k, info in enumerate(log):
        assert set(info["uploads"]) == set(info["sampled"].tolist())  # PCP: nobody else
        for p, upload in info["uploads"].items():
            assert set(upload) == {"items", "G", "gram"}
            np.testing.assert_array_equal(upload["items"], rated[p])
            assert upload["G"].shape == (len(rated[p]), r + r * r)
        sent = sum(size(p) for p in info["uploads"])
        assert sum(nbytes(u) for u in info["uploads"].values()) == sent
        # every client's initial aggregates (G1^0, G2^0) are counted once, in round 1
        once = sum(size(p) for p in range(P)) if k == 0 else 0
        assert model.history_[k]["bytes_uploaded"] == sent + once
        # the broadcast V reaches the sampled clients only
        assert model.history_[k]["bytes_downloaded"] == m * n_items * r * 8 + (
            P * n_items * r * 8 if k == 0 else 0)
    # the message is the client's data aggregates at its current factors
    M, mask = masked(X)
    for p, upload in log[-1]["uploads"].items():
        rows = model.clients_ == p
        U, Mp, Wp = model.user_factors_[rows], M[rows], mask[rows]
        items = upload["items"]
        np.testing.assert_allclose(upload["G"][:, :r], (Wp * Mp).T[items] @ U, rtol=1e-12)
        G1 = np.einsum("tj,ta,tc->jac", Wp[:, items], U, U).reshape(len(items), r * r)
        np.testing.assert_allclose(upload["G"][:, r:], G1, rtol=1e-12)
        np.testing.assert_allclose(upload["gram"], U.T @ U, rtol=1e-12)


@pytest.mark.parametrize("clients_per_round, local_iter_v", [(None, 1), (2, 1), (2, 5)])
def test_recovers_an_exactly_low_rank_matrix(clients_per_round, local_iter_v):
    X, Y, _ = low_rank_ratings(m=200, n=50, seed=2)
    model = FedMGS(
        n_components=2, n_clients=4, clients_per_round=clients_per_round,
        local_iter_v=local_iter_v, max_iter=300, random_state=0, solver_params={"center": False},
    ).fit(X, eval_set=Y)
    assert model.history_[-1]["eval_rmse"] < 0.05


@pytest.mark.parametrize("grouped", [False, True])
def test_one_client_per_user_at_low_participation_descends(grouped, monkeypatch):
    """Issue 15: with 2 % of one-user clients per round, every round is a descent step of
    block coordinate descent (the sampled users' rows, then V with the exact gradient at
    every client's factors), so the objective never increases. A server that summed the
    clients' last gradients, computed at old V, went up by a factor of 40 here."""
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1 if grouped else 10**9)
    X = make_ratings(400, 60, 8000, noise=0.5, random_state=0).X
    model = _FedMGS(clients_per_round=0.02, max_iter=60, alpha_u=10.0, alpha_v=10.0,
                    random_state=0).fit(X, clients=np.arange(400))  # (a fixed objective)
    objective = np.array([h["objective"] for h in model.history_])
    assert np.all(np.diff(objective) <= 1e-10 * objective[:-1])
    assert objective[-1] < 0.6 * objective[0]


# ---- alpha_u = alpha_v = "auto": the server's noise rule -------------------------------------
def rule(X, U, Vt, cap, n_components):
    """The rule from the data and the factors directly: ``min(cap, AUTO_C sigma^2 sqrt(r N /
    q))`` with ``sigma^2`` the residual per rating and ``q`` the sum of ``(u.v)^2``."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    fitted = np.einsum("ij,ij->i", U[rows], Vt[X.indices])
    n = X.nnz
    rss = np.sum((X.data - fitted) ** 2)
    q = np.sum(np.einsum("ij,ij->i", U[rows, :n_components], Vt[X.indices, :n_components]) ** 2)
    return min(cap, fedmgs.AUTO_C * rss / n * np.sqrt(n_components * n / q))


def test_auto_strength_is_computed_from_the_messages_and_scales_with_the_ratings():
    """The server's rule needs only the aggregates and the sums of squares: from them it
    gets the residual and the low-rank part's size exactly, and scaling the ratings by ``c``
    (factors by ``sqrt(c)``) scales the strength by ``c``, as the penalty's units require."""
    rng = np.random.default_rng(0)
    X = make_ratings(40, 30, 500, noise=0.5, rating_scale=None, random_state=1).X
    U, Vt = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))

    def server_value(c, cap):
        upload = fedmgs.share(np.sqrt(c) * U, c * X, sum_squares=True)
        total = np.zeros((30, 3 + 9))
        total[upload["items"]] = upload["G"]
        assert upload["ss"] == pytest.approx(c * c * np.sum(X.data ** 2), rel=1e-12)
        return fedmgs.auto_alpha(np.sqrt(c) * Vt, total, upload["ss"], X.nnz, 3, cap)

    below = server_value(1.0, np.inf)
    assert below == pytest.approx(rule(X, U, Vt, np.inf, 3), rel=1e-10)
    assert server_value(4.0, np.inf) == pytest.approx(4.0 * below, rel=1e-10)
    assert server_value(4.0, 4.0 * below / 2) == pytest.approx(4.0 * below / 2, rel=1e-12)
    # no low-rank part (zero factors): the cap
    assert fedmgs.auto_alpha(0.0 * Vt, np.zeros((30, 12)), 1.0, X.nnz, 3, 7.0) == 7.0


def test_auto_strength_follows_the_noise_and_is_the_rule_at_the_fitted_model():
    """With biases the fitted ``alpha_u_`` is the rule at the final model (every client's
    factors, the server's ``V``) with its cap ``AUTO_MAX`` times the centred ratings' root
    mean square; the same low-rank ratings with less noise get a weaker penalty."""
    fits = {}
    for noise in (0.2, 1.0):
        X = make_ratings(300, 80, 9000, noise=noise, random_state=0).X
        model = _FedMGS(n_clients=10, max_iter=40, random_state=0).fit(X)
        fits[noise] = model.alpha_u_
        assert model.alpha_v_ == model.alpha_u_
        Xc = X.copy()
        Xc.data -= model.mean_
        U = np.hstack([model.user_factors_, model.user_bias_[:, None], np.ones((300, 1))])
        Vt = np.hstack([model.components_.T, np.ones((80, 1)), model.item_bias_[:, None]])
        cap = fedmgs.AUTO_MAX * np.sqrt(np.mean(Xc.data ** 2))
        assert model.alpha_u_ == pytest.approx(rule(Xc, U, Vt, cap, 5), rel=1e-8)
    assert fits[0.2] < 0.5 * fits[1.0]


def test_auto_strength_is_recorded_in_history():
    """Each evaluated round of ``history_`` records the strength the server sent with its
    ``V`` (the last one is ``alpha_u_``); fixed strengths record none."""
    X = make_ratings(300, 80, 9000, noise=0.2, random_state=0).X
    model = _FedMGS(n_clients=10, max_iter=6, random_state=0,
                    solver_params={"eval_every": 1}).fit(X)
    alphas = [record["alpha"] for record in model.history_]
    assert len(alphas) == 6 and alphas[-1] == model.alpha_u_
    assert len(set(alphas)) > 1  # it moves with the model
    fixed = _FedMGS(
        n_clients=10, max_iter=2, alpha_u=10.0, alpha_v=10.0, random_state=0,
        solver_params={"eval_every": 1},
    ).fit(X)
    assert all("alpha" not in record for record in fixed.history_)


def test_auto_strength_messages():
    """``"auto"`` adds one number to a client's message, ``S = sum (x_tj - b_u)^2`` over its
    ratings (the compact form of a one-user client holds its ``x_tj`` already), and the
    round's strength to the broadcast; the papers' fixed strengths send neither."""
    X = make_ratings(60, 20, 600, noise=0.5, random_state=0).X
    log = []
    model = _FedMGS(n_components=2, n_clients=4, clients_per_round=2, max_iter=3,
                    random_state=0, callback=lambda k, info: log.append(info)).fit(X)
    for info in log:
        for upload in info["uploads"].values():
            assert set(upload) == {"items", "G", "gram", "ss"}
        assert set(info["broadcast"]) == {"Vt", "alpha"}
        assert info["broadcast"]["alpha"][0] == info["server_state"]["alpha"]
    rows = np.repeat(np.arange(60), np.diff(X.indptr))
    shifted = X.data - model.mean_ - model.user_bias_[rows]
    for p, upload in log[-1]["uploads"].items():
        assert upload["ss"] == pytest.approx(np.sum(shifted[model.clients_[rows] == p] ** 2))
    n_items, r = 20, 2 + 2
    assert model.history_[-1]["bytes_downloaded"] == 2 * (n_items * r * 8 + 8)
    log.clear()
    paper(_FedMGS)(n_components=2, n_clients=4, clients_per_round=2, max_iter=2,
                   random_state=0, callback=lambda k, info: log.append(info)).fit(X)
    assert all(set(u) == {"items", "G", "gram"} for u in log[-1]["uploads"].values())
    assert isinstance(log[-1]["broadcast"], np.ndarray)
    log.clear()  # one-user clients with biases: the compact form, no extra number
    _FedMGS(n_components=2, clients_per_round=0.1, max_iter=2, random_state=0,
            callback=lambda k, info: log.append(info)).fit(X, clients=np.arange(60))
    assert all(set(u) == {"items", "x", "a"} for u in log[-1]["uploads"].values())


def test_auto_strength_with_weighted_penalties_and_warm_start():
    X = make_ratings(60, 20, 600, noise=0.5, random_state=0).X
    model = _FedMGS(n_components=2, n_clients=4, max_iter=3, regularization="weighted",
                    random_state=0).fit(X)
    assert (model.alpha_u_, model.alpha_v_) == (fedmgs.AUTO_WEIGHTED, fedmgs.AUTO_WEIGHTED)
    model = _FedMGS(n_components=2, n_clients=4, max_iter=3, alpha_u=1.0, alpha_v=1.0,
                    warm_start=True, random_state=0).fit(X)
    with pytest.raises(ValueError, match="warm_start cannot switch"):
        model.set_params(alpha_u="auto", alpha_v="auto").fit(X)


def test_a_one_batch_round_splits_its_kernels_over_n_jobs_threads_with_the_same_bits(
        monkeypatch):
    """A round run in the fit's own thread (one client here) splits the user steps and
    FedMGS's item-by-item share over the ``n_jobs`` threads: ``n_jobs=1`` and ``n_jobs=2``
    give the same model and history, bit for bit."""
    X = make_ratings(300, 300, 15_000, noise=0.5, random_state=0).X
    split = []
    original = kernels.split_rows

    def recording(kernel, n_rows, *args):
        if kernels.row_tasks(n_rows) > 1:
            split.append(kernel.__name__)
        return original(kernel, n_rows, *args)

    for module in (kernels, fedmgs_batched):
        monkeypatch.setattr(module, "split_rows", recording)
    one, two = (_FedMGS(n_clients=1, max_iter=6, random_state=0, n_jobs=n_jobs).fit(X)
                for n_jobs in (1, 2))
    assert {"_prox_grad_range", "share_items", "row_outers"} <= set(split)
    np.testing.assert_array_equal(one.components_, two.components_)
    np.testing.assert_array_equal(one.user_factors_, two.user_factors_)
    drop = ("seconds",)
    assert ([{k: v for k, v in r.items() if k not in drop} for r in one.history_]
            == [{k: v for k, v in r.items() if k not in drop} for r in two.history_])
