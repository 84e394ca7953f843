"""``biased=True``: user and item biases as fixed entries of the augmented factors
``[U, b_u, 1]`` and ``[V; 1; b_i]`` (``sklearn_fedmf._biases``).

Oracles: with the factor part held at zero (``init_scale=0`` starts it at the zero saddle,
where every gradient in it vanishes) each estimator converges to the closed-form regularized
bias baseline; the fixed entries are exactly 1 after every step; ``b_u`` is never uploaded;
``b_i`` is aggregated exactly as ``V``.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RFRec
from sklearn_fedmf._biases import init_item, init_user
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_protocol import u_loop, u_loop_biased


def small_ratings(n_users=24, n_items=10, density=0.6, seed=0):
    rng = np.random.default_rng(seed)
    bu, bi = rng.normal(size=n_users), rng.normal(size=n_items)
    M = 3.0 + bu[:, None] + bi[None, :] + 0.3 * rng.normal(size=(n_users, n_items))
    mask = rng.random(M.shape) < density
    mask[np.arange(n_users), np.arange(n_users) % n_items] = True
    return sp.csr_matrix((M[mask], np.nonzero(mask)), shape=M.shape)


def bias_baseline(X, lam_u, lam_i):
    """argmin 1/2 sum (x - mean - b_u - b_i)^2 + lam_u/2 ||b_u||^2 + lam_i/2 ||b_i||^2."""
    X = X.tocoo()
    n, m = X.shape
    A = sp.hstack([sp.csr_matrix((np.ones(X.nnz), (np.arange(X.nnz), X.row)), shape=(X.nnz, n)),
                   sp.csr_matrix((np.ones(X.nnz), (np.arange(X.nnz), X.col)), shape=(X.nnz, m))])
    reg = np.r_[np.full(n, lam_u), np.full(m, lam_i)]
    b = np.linalg.solve((A.T @ A).toarray() + np.diag(reg), A.T @ (X.data - X.data.mean()))
    return b[:n], b[n:]


def test_fedmcadmm_biases_alone_reach_the_closed_form():
    X = small_ratings()
    p, alpha_u, alpha_v = 3, 0.5, 0.2
    est = FedMCADMM(
        n_components=2, biased=True, beta=1.0, n_clients=p, alpha_u=alpha_u, alpha_v=alpha_v,
        max_iter=400, random_state=0, solver_params={"init_scale": 0.0, "eval_every": 0},
    ).fit(X)
    # F = (1/p) sum_i [f_i + R_i] + R(V): against the plain sum, alpha_v weighs p times more
    bu, bi = bias_baseline(X, alpha_u, p * alpha_v)
    assert np.abs(est.components_).max() == 0 and np.abs(est.user_factors_).max() == 0
    np.testing.assert_allclose(est.user_bias_, bu, atol=1e-5)
    np.testing.assert_allclose(est.item_bias_, bi, atol=1e-5)


def test_fedmcadmm_u_step_equals_projected_prox_gradient_and_keeps_ones():
    # The substitution of the fixed column is exact: the same iterates as projecting onto
    # {U[:, -1] = 1} after every prox-gradient step (one step at a time through u_loop).
    rng = np.random.default_rng(1)
    X = small_ratings(12, 8, seed=1)
    U = init_user(rng.random((12, 5)))
    Wt = init_item(rng.random((8, 5)))
    Wt[:, -1] = rng.normal(size=8)
    Wt[:, -2] += 0.1  # W_i is an unconstrained copy: its "1" row need not be 1
    fused = u_loop_biased(U, Wt, X, 7, 0.3, 0.0)
    # reference: the column b_i * 1 moved into the data, steps of 1/||[W,1]^T [W,1]||_F
    Xs = X.copy()
    Xs.data -= Wt[X.indices, -1]
    ref = U[:, :-1].copy()
    for _ in range(7):
        ref = u_loop(ref, np.ascontiguousarray(Wt[:, :-1]), Xs, 1, 0.3, 0.0, False)
    np.testing.assert_allclose(fused[:, :-1], ref, rtol=1e-12, atol=1e-12)
    assert np.all(fused[:, -1] == 1.0)


def test_fedmcadmm_fixed_entries_stay_exactly_one_and_b_u_is_never_uploaded():
    X = small_ratings(seed=2)
    seen = []

    def callback(k, info):
        seen.append(info["server_state"]["Vt"][:, -2].copy())
        for upload in info["uploads"].values():
            for array in upload.values():
                assert array.shape == (X.shape[1], 4)  # item-side only: [W, 1, b_i] (r=2)
        return False

    est = FedMCADMM(n_components=2, biased=True, n_clients=4, clients_per_round=2,
                    max_iter=15, callback=callback, random_state=0).fit(X)
    assert len(seen) == 15 and all(np.all(v == 1.0) for v in seen)
    for state in est._federation.client_states:
        assert np.all(state["U"][:, -1] == 1.0)
    # b_u, which lives only in the client states, differs from every item-side vector
    assert est.user_bias_.shape == (X.shape[0],) and np.abs(est.user_bias_).max() > 0


def test_fedmcadmm_b_i_is_aggregated_as_v():
    # Full participation: V^{k+1} = prox((1/p) sum_i (W_i + Y_i / beta)); its b_i column
    # comes out of the same average as the factor columns (ridge prox = 1 / (1 + alpha/(p b))).
    X = small_ratings(seed=3)
    p, beta, alpha_v = 3, 2.0, 0.3
    last = {}

    def callback(k, info):
        last["uploads"], last["Vt"] = info["uploads"], info["server_state"]["Vt"]

    FedMCADMM(n_components=2, biased=True, n_clients=p, beta=beta, alpha_v=alpha_v,
              max_iter=5, callback=callback, random_state=0).fit(X)
    mean = sum(u["W"] + u["Y"] / beta for u in last["uploads"].values()) / p
    expected = mean / (1 + alpha_v / (p * beta))
    np.testing.assert_allclose(last["Vt"][:, -1], expected[:, -1], rtol=1e-12)
    np.testing.assert_allclose(last["Vt"][:, :2], expected[:, :2], rtol=1e-12)


def test_biased_cold_start_predicts_item_bias_and_fold_in_uses_biases():
    X = small_ratings(seed=4)
    # (a tiny ridge: fold-in then minimizes the row's squared error, nearly)
    est = FedMCADMM(n_components=2, biased=True, n_clients=3, max_iter=50, alpha_u=1e-6,
                    alpha_v=1e-6, random_state=0).fit(X)
    cold = sp.csr_matrix((1, X.shape[1]))
    np.testing.assert_allclose(est.predict(cold)[0], est.mean_ + est.item_bias_)
    # fold-in of a training row solves [u, b_u] on the ratings minus b_i: its prediction
    # at the row's own entries is as good as the federated one (ridge-optimal given V)
    P = est.predict(X[:5])
    fed = est.user_factors_[:5] @ est.components_ + est.user_bias_[:5, None] \
        + est.item_bias_ + est.mean_
    obs = X[:5].toarray() != 0
    err_fold = np.sum((P - X[:5].toarray())[obs] ** 2)
    err_fed = np.sum((fed - X[:5].toarray())[obs] ** 2)
    assert err_fold <= err_fed + 1e-9
    with pytest.raises(ValueError, match="biased=True and positive=True"):
        FedMCADMM(biased=True, n_clients=3, solver_params={"positive": True}).fit(X)


# FedMAvg ("wang_chang") and FedMGS minimize sum_p [1/2 ||P(M_p - U_p V)||^2 + h(U_p)] + h(V).
# Full participation, so the iterations are exact (alternating) gradient steps. (FedMAvg's
# default d_factor=5 is the paper's margin for local drift; the bias columns' step bound is
# loose, so a shorter factor keeps the test fast: the fixed point does not depend on it.)
SUM_OF_SQUARES = {
    "FedMAvg": lambda eval_every, **kw: FedMAvg(
        n_clients=3, max_iter=600, **kw,
        solver_params={"init_scale": 0.0, "d_factor": 0.6, "eval_every": eval_every},
    ),
    "FedMGS": lambda eval_every, **kw: FedMGS(
        n_clients=3, max_iter=600, **kw,
        solver_params={"init_scale": 0.0, "eval_every": eval_every},
    ),
}


@pytest.mark.parametrize("name", list(SUM_OF_SQUARES))
def test_biases_alone_reach_the_closed_form(name):
    X = small_ratings(seed=5)
    est = SUM_OF_SQUARES[name](n_components=2, biased=True, alpha_u=0.5, alpha_v=0.2,
                               random_state=0, eval_every=0).fit(X)
    bu, bi = bias_baseline(X, 0.5, 0.2)
    assert np.abs(est.components_).max() == 0 and np.abs(est.user_factors_).max() == 0
    np.testing.assert_allclose(est.user_bias_, bu, atol=1e-4)
    np.testing.assert_allclose(est.item_bias_, bi, atol=1e-4)


def rfrec_bias_baseline(X, clients, alpha_u, alpha_v, lam):
    """RFRec's F restricted to biases, minimized in closed form: each client ``c`` has its
    copy ``b_(c)`` of the item biases; ``F = sum_c [sum_{i in c} (sum_j (r_ij - b_i -
    b_(c)j)^2 + alpha_u b_i^2) + alpha_v / N ||b_(c)||^2] + lam / 2 sum_c ||b_(c) - mean||^2``.
    Returns the user biases and the server's average of the copies."""
    X = X.tocoo()
    n, m = X.shape
    N = clients.max() + 1
    k = np.arange(X.nnz)
    A = sp.hstack([sp.csr_matrix((np.ones(X.nnz), (k, X.row)), shape=(X.nnz, n)),
                   sp.csr_matrix((np.ones(X.nnz), (k, clients[X.row] * m + X.col)),
                                 shape=(X.nnz, N * m))]).toarray()
    R = np.zeros((n + N * m, n + N * m))
    R[:n, :n] = alpha_u * np.eye(n)
    center = np.eye(N) - 1.0 / N  # sum_c ||b_c - mean||^2 = b^T (center kron I) b
    R[n:, n:] = alpha_v / N * np.eye(N * m) + lam / 2 * np.kron(center, np.eye(m))
    z = np.linalg.solve(A.T @ A + R, A.T @ (X.data - X.data.mean()))
    return z[:n], z[n:].reshape(N, m).mean(axis=0)


def test_rfrec_biases_alone_reach_the_closed_form():
    X = small_ratings(seed=5)
    est = RFRec(
        n_components=2, biased=True, n_clients=3, alpha_u=0.5, alpha_v=0.2, reg_consensus=5.0,
        max_iter=800, random_state=0, solver_params={"init_std": 1e-300, "eval_every": 0},
    ).fit(X)
    bu, bi = rfrec_bias_baseline(X, est.clients_, 0.5, 0.2, 5.0)
    assert np.abs(est.components_).max() < 1e-250 and np.abs(est.user_factors_).max() < 1e-250
    np.testing.assert_allclose(est.user_bias_, bu, atol=1e-4)
    np.testing.assert_allclose(est.item_bias_, bi, atol=1e-4)


def _check_item_side(upload, n_items, n_rows_of_client):
    """Every array is item-side (n_items rows) or a Gram of [U_p, 1], never of b_u."""
    for key, array in upload.items():
        array = np.asarray(getattr(array, "values", array))
        if key == "gram":
            assert array[-1, -1] == n_rows_of_client  # sum of the ones column, not of b_u^2
        elif key != "size":
            assert array.shape[0] in (n_items, len(getattr(upload[key], "cols", ())))


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_b_u_is_never_uploaded_and_b_i_is_aggregated_as_v(cls):
    X = small_ratings(seed=6)
    est = cls(n_components=2, biased=True, n_clients=3, max_iter=4, random_state=0)
    seen = []

    def callback(k, info):
        seen.append((info["uploads"], info["server_state"]["Vt"].copy()))

    est.set_params(callback=callback).fit(X)
    sizes = np.bincount(est.clients_)
    for uploads, Vt in seen:
        for p, upload in uploads.items():
            if cls is FedMAvg:
                _check_item_side(upload, X.shape[1], sizes[p])
            else:  # per rated item, G1_j of [U_p, 1]: its ones entry counts the raters of j
                Xp = X[est.clients_ == p]
                np.testing.assert_array_equal(upload["items"], np.unique(Xp.indices))
                G1 = upload["G"][:, 3:].reshape(-1, 3, 3)
                np.testing.assert_array_equal(G1[:, -1, -1],
                                              np.bincount(Xp.indices)[upload["items"]])
                assert upload["gram"][-1, -1] == sizes[p]
        assert np.all(Vt[:, -2] == 1.0)
    if cls is FedMAvg:  # V = the weighted mean of the copies W_p, b_i column included
        uploads, Vt = seen[-1]
        w = np.array([X[est.clients_ == p].nnz for p in uploads], dtype=float)
        mean = sum(wi * u["W"] for wi, u in zip(w / w.sum(), uploads.values()))
        np.testing.assert_allclose(Vt[:, [0, 1, 3]], mean[:, [0, 1, 3]], rtol=1e-12)
    else:  # the server sums the clients' aggregates over [V, b_i] alike: G2_j has 3 entries
        assert all(u["G"].shape[1] == 3 + 3 * 3 for u in seen[-1][0].values())


WEIGHTED = {
    "FedMCADMM": lambda **kw: FedMCADMM(
        beta=1.0, n_clients=3, max_iter=400, **kw,
        solver_params={"init_scale": 0.0, "eval_every": 0},
    ),
    # (weaker per-row ridges than the plain test's: more rounds to reach 1e-4)
    "FedMAvg": lambda **kw: FedMAvg(
        n_clients=3, max_iter=800, **kw,
        solver_params={"init_scale": 0.0, "d_factor": 0.6, "eval_every": 0},
    ),
    "FedMGS": lambda **kw: FedMGS(
        n_clients=3, max_iter=1000, **kw, solver_params={"init_scale": 0.0, "eval_every": 0},
    ),
}


@pytest.mark.parametrize("name", list(WEIGHTED))
def test_weighted_biases_alone_reach_the_closed_form(name):
    """regularization="weighted" is ALS-WR's weighted lambda: each user's and each item's
    penalty times its number of ratings. FedMC-ADMM's ``R(V)`` is then inside the ``1/p``, so
    one per-rating strength means the same in every estimator (no factor ``p``)."""
    X = small_ratings(seed=5)
    est = WEIGHTED[name](n_components=2, biased=True, alpha_u=0.05, alpha_v=0.02,
                         regularization="weighted", random_state=0).fit(X)
    n_u, n_i = np.diff(X.indptr), np.bincount(X.indices, minlength=X.shape[1])
    bu, bi = bias_baseline(X, 0.05 * n_u, 0.02 * n_i)
    bu_plain, _ = bias_baseline(X, 0.05, 0.02)
    assert np.abs(bu - bu_plain).max() > 1e-2  # (the weights matter on this case)
    np.testing.assert_allclose(est.user_bias_, bu, atol=1e-4)
    np.testing.assert_allclose(est.item_bias_, bi, atol=1e-4)
    # fold-in solves the same weighted ridge for [u, b_u] (on the centred ratings)
    Xc = X.tocsr(copy=True)
    Xc.data -= est.mean_
    np.testing.assert_allclose(est._augmented(Xc)[0][:, -2], bu, atol=1e-4)


def test_block_step_bounds_majorize_every_row_hessian():
    """The per-column bounds of the biased steps are a diagonal that majorizes each item's
    (and each user's) Hessian: ``diag(bounds) - H_j`` is positive semidefinite."""
    from sklearn_fedmf._biases import item_step_bounds, user_step_bounds

    rng = np.random.default_rng(0)
    X = small_ratings(n_users=30, n_items=12, density=0.4, seed=3)
    U1 = np.hstack([0.1 + 0.2 * rng.random((30, 3)), np.ones((30, 1))])  # [U, 1], offset
    Xc = X.tocsc()
    bounds = item_step_bounds(U1.T @ U1, ridge=0.0)
    for j in range(12):
        A = U1[Xc.indices[Xc.indptr[j]:Xc.indptr[j + 1]]]
        assert np.linalg.eigvalsh(np.diag(bounds) - A.T @ A)[0] >= -1e-9
    V1 = np.hstack([rng.normal(size=(12, 3)), np.ones((12, 1))])  # [V, 1]
    per_row = user_step_bounds(X, V1, ridge=0.0)
    for t in range(30):
        B = V1[X.indices[X.indptr[t]:X.indptr[t + 1]]]
        assert np.linalg.eigvalsh(np.diag(per_row[t]) - B.T @ B)[0] >= -1e-9
    # ... and with factors small beside the ones (as in a fit), the factor columns' bound is far
    # below the single bound, which counts the column of ones once per row
    assert bounds[0] < 0.5 * np.linalg.eigvalsh(U1.T @ U1)[-1]


def test_per_row_strengths_in_the_kernel_equal_row_by_row_calls():
    """prox_grad_rows with one step, l1 and ridge per row (the weighted regularization) is the
    scalar kernel applied to each row alone; a step per entry that repeats the row's is the
    same."""
    from sklearn_fedmf._kernels import prox_grad_rows

    rng = np.random.default_rng(1)
    X = small_ratings(n_users=8, n_items=6, seed=2)
    U, Wt = rng.normal(size=(8, 3)), rng.normal(size=(6, 3))
    L, l1, ridge = 20.0 + 10 * rng.random(8), 0.01 * rng.random(8), rng.random(8)
    out, out_entry = np.empty_like(U), np.empty_like(U)
    prox_grad_rows(X.indptr, X.indices, X.data, U, Wt, L, 5, l1, 1.0, False, ridge, out)
    prox_grad_rows(X.indptr, X.indices, X.data, U, Wt, np.repeat(L[:, None], 3, axis=1), 5,
                   np.repeat(l1[:, None], 3, axis=1), 1.0, False, ridge, out_entry)
    np.testing.assert_array_equal(out, out_entry)
    for t in range(8):
        row, one = X[t], np.empty((1, 3))
        prox_grad_rows(row.indptr, row.indices, row.data, U[t:t + 1], Wt, L[t], 5, l1[t], 1.0,
                       False, ridge[t], one)
        np.testing.assert_allclose(out[t], one[0], rtol=1e-12, atol=1e-14)
