"""Felb, Felb-MU and AggregatedBMF: oracles from the Felb paper (Algorithm 1,
the Elb prox, Appendix B) and planted-tile recovery."""


import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import AggregatedBMF, Felb
from sklearn_fedmf.binary import _elb, _felb_protocol
from sklearn_fedmf.binary._aggregated import aggregate_boolean
from sklearn_fedmf.datasets import make_binary_tiles
from sklearn_fedmf.engine._client_data import split_clients
from sklearn_fedmf.exceptions import PrivacyWarning
from sklearn_fedmf.metrics import f1_boolean
from sklearn_fedmf.privacy import LocalDP, gaussian_sigma


def tiles(n=800, m=80, k=4, density=1.0, noise=0.0, seed=0):
    """Disjoint planted tiles (rows and columns cut at random into k + 1 groups, tile l =
    row group l x column group l), thinned to ``density``, then XOR noise; returns the data
    and the noise-free full tiles (the ground truth of F1*)."""
    data = make_binary_tiles(n, m, k, noise=noise, tile_density=density, overlap=False,
                             random_state=seed)
    return data.X, data.X_clean


def brute_force_prox(x, a, c, lo=0.0, hi=3.0, step=1e-5):
    y = np.arange(lo, hi + step / 2, step)
    obj = 0.5 * (y - x) ** 2 + np.minimum(a * np.abs(y) + 0.5 * c * y**2,
                                          a * np.abs(y - 1) + 0.5 * c * (y - 1) ** 2)
    return y[np.argmin(obj)], obj.min()


def prox_objective(y, x, a, c):
    return 0.5 * (y - x) ** 2 + min(a * abs(y) + 0.5 * c * y**2,
                                    a * abs(y - 1) + 0.5 * c * (y - 1) ** 2)


# ---- 1-3: the Elb prox ----------------------------------------------------------------------
def test_prox_matches_brute_force_grid():
    rng = np.random.default_rng(0)
    cases = [(x, 10 ** rng.uniform(-4, -0.5), 10 ** rng.uniform(-3, 3)) for x in
             rng.uniform(-1.5, 2.5, 60)]
    a, c = 0.05, 0.3
    cases += [(x, a, c) for x in (0, 1, a / 2, -a / 2, 1 + a / 2, 1 - a / 2, 0.5 - 1e-3,
                                  0.5 + 1e-3, 0.5)]
    for x, a, c in cases:
        y = float(_elb.prox_elb(x, a, c))
        y_grid, best = brute_force_prox(x, a, c)
        assert prox_objective(y, x, a, c) <= best + 1e-12
        if x != 0.5:
            assert abs(y - y_grid) <= 1e-5


def test_paper_formula_and_dead_zones():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.5, 2.5, 20000)
    a, c = 0.08, 0.7
    eq6 = np.where(x <= 0.5, (x - a * np.sign(x)) / (1 + c),
                   (x - a * np.sign(x - 1) + c) / (1 + c))
    np.testing.assert_array_equal(_elb.prox_elb(x, a, c, "paper"), eq6)
    np.testing.assert_array_equal(_elb.prox_elb(x, a, c, "paper_nonneg"), np.maximum(eq6, 0))
    outside = (np.abs(x) >= a) & (np.abs(x - 1) >= a)
    np.testing.assert_allclose(_elb.prox_elb(x, a, c, "exact")[outside], eq6[outside],
                               atol=1e-12, rtol=0)
    diff = np.abs(_elb.prox_elb(x, a, c, "paper_nonneg") - _elb.prox_elb(x, a, c))
    dead = ((x > -a) & (x < 0)) | ((x > 1 - a) & (x < 1 + a))
    assert diff[~dead].max() <= 1e-12
    assert diff[dead].max() <= a / (1 + c) + 1e-12 and diff[dead].max() > 0


def test_prox_symmetry_limit_and_sign():
    rng = np.random.default_rng(2)
    x = rng.uniform(-2, 3, 5000)
    x = x[np.abs(x - 0.5) > 1e-9]
    a, c = 0.03, 2.0
    np.testing.assert_allclose(_elb.prox_elb(1 - x, a, c, "exact"),
                               1 - _elb.prox_elb(x, a, c, "exact"), atol=1e-12)
    far = x[np.abs(x - 0.5) > 1e-6]
    np.testing.assert_allclose(_elb.prox_elb(far, a, 1e12), (far > 0.5).astype(float),
                               atol=1e-9)
    assert (_elb.prox_elb(x, a, c) >= 0).all()


# ---- 4: proximity ---------------------------------------------------------------------------
def test_proximity_prox_sequential_and_joint():
    for x, s, v in [(0.3, 0.5, 1.0), (1.7, 2.0, 0.0), (-0.4, 0.1, 1.0)]:
        y = np.arange(-3, 3, 1e-5)
        best = y[np.argmin(0.5 * (y - x) ** 2 + 0.5 * s * (y - v) ** 2)]
        assert abs(_elb.prox_proximity(x, s, v) - best) <= 1e-5
    # the joint prox minimizes 1/2 (y-x)^2 + Elb(y; a, c) + s/2 (y-v)^2 over y >= 0
    rng = np.random.default_rng(3)
    for x, v in zip(rng.uniform(-1, 2, 15), rng.integers(0, 2, 15)):
        a, c, s = 0.02, 0.4, 0.7
        y = np.arange(0, 3, 1e-5)
        obj = (0.5 * (y - x) ** 2 + np.minimum(a * y + 0.5 * c * y**2,
                                               a * np.abs(y - 1) + 0.5 * c * (y - 1) ** 2)
               + 0.5 * s * (y - v) ** 2)
        joint = _elb.prox_elb(_elb.prox_proximity(x, s, v), a / (1 + s), c / (1 + s))
        assert abs(joint - y[np.argmin(obj)]) <= 2e-5
    # v_step's sequential mode is the explicit two-step composition
    A, U, V, Vh = _small_problem(4)
    kw = dict(kappa=0.01, lam_t=0.3, beta=0.0, gamma=0.8)
    V_new, _ = _elb.v_step(V, V, U, A.T.tocsr(), Vh, **kw)
    Q = U.T @ U
    eta = 1 / np.linalg.norm(Q)
    X = V - eta * (Q @ V - (A.T @ U).T)
    expected = _elb.prox_proximity(_elb.prox_elb(X, eta * 0.01, eta * 0.3), eta * 0.8, Vh)
    np.testing.assert_allclose(V_new, expected, rtol=1e-13, atol=1e-15)


def _small_problem(seed, n=30, m=12, k=3):
    rng = np.random.default_rng(seed)
    A = sp.csr_matrix((rng.random((n, m)) < 0.3).astype(float))
    return A, rng.random((n, k)), rng.random((k, m)), (rng.random((k, m)) < 0.5).astype(float)


# ---- 5-7: gradients, MU identity, monotone descent --------------------------------------------
def test_gradients_match_finite_differences():
    A, U, V, _ = _small_problem(5)
    Ad = A.toarray()
    # with kappa = lam = 0 and the unconstrained prox, a step is U - eta * G exactly
    free = dict(kappa=0.0, lam_t=0.0, beta=0.0, prox_mode="exact")
    U_new, _ = _elb.u_step(U, U, V, A, **free)
    G_U = (U - U_new) * np.linalg.norm(V @ V.T)
    V_new, _ = _elb.v_step(V, V, U, A.T.tocsr(), None, gamma=0.0, **free)
    G_V = (V - V_new) * np.linalg.norm(U.T @ U)

    def loss(U_, V_):
        return 0.5 * np.sum((Ad - U_ @ V_) ** 2)

    h = 1e-6
    for grad, X, wrt in ((G_U, U, "U"), (G_V, V, "V")):
        fd = np.zeros_like(X)
        for idx in np.ndindex(X.shape):
            E = np.zeros_like(X)
            E[idx] = h
            args_p = (X + E, V) if wrt == "U" else (U, X + E)
            args_m = (X - E, V) if wrt == "U" else (U, X - E)
            fd[idx] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7)


def test_mu_identity():
    A, U, V, _ = _small_problem(6)
    free = dict(kappa=0.0, lam_t=0.0, beta=0.0, prox_mode="exact", update="mu")
    U_new, _ = _elb.u_step(U, U, V, A, **free)
    np.testing.assert_allclose(U_new, U * (A @ V.T) / (U @ V @ V.T), rtol=1e-12)
    V_new, _ = _elb.v_step(V, V, U_new, A.T.tocsr(), None, gamma=0.0, **free)
    np.testing.assert_allclose(V_new, V * (A.T @ U_new).T / (U_new.T @ U_new @ V), rtol=1e-12)


def test_mu_clamps_negative_extrapolation():
    A, U, V, _ = _small_problem(7)
    U[0, 0] = 0.0
    U_prev = U.copy()
    U_prev[0, 0] = 0.5  # extrapolation (1 + beta) * 0 - beta * 0.5 < 0
    U_new, _ = _elb.u_step(U, U_prev, V, A, kappa=1e-3, lam_t=0.1, beta=0.5, update="mu")
    assert np.isfinite(U_new).all() and (U_new >= 0).all() and U_new[0, 0] == 0.0


def objective(A, U, V, kappa, lam):
    return (0.5 * _elb.loss_terms(A, U, V) + _elb.elb_value(U, kappa, lam)
            + _elb.elb_value(V, kappa, lam))


@pytest.mark.parametrize("update, prox_mode, proximity, beta, gamma, update_v, m", [
    ("palm", "exact_nonneg", "sequential", 0.0, 0.0, True, 30),
    ("palm", "exact", "joint", 0.4, 0.7, True, 30),
    ("palm", "paper_nonneg", "sequential", 0.3, 0.5, True, 30),
    ("mu", "paper", "sequential", 0.2, 0.3, True, 30),
    ("mu", "exact_nonneg", "joint", 0.0, 0.9, True, 30),
    ("palm", "exact_nonneg", "sequential", 0.5, 0.0, False, 30),
    # more columns than a tile of the compiled V block, the last tile narrower
    ("palm", "exact_nonneg", "sequential", 0.3, 0.6, True, 2 * _elb._TILE + 37),
    ("mu", "exact", "joint", 0.2, 0.4, True, _elb._TILE + 1),
])
def test_local_steps_compose_u_and_v_steps(update, prox_mode, proximity, beta, gamma,
                                            update_v, m):
    # The compiled local_steps against the step-by-step composition of u_step and v_step,
    # with the growing lambda schedule.
    rng = np.random.default_rng(5)
    A = sp.csr_matrix((rng.random((40, m)) < 0.3).astype(float))
    At = A.T.tocsr()
    U0, U1 = rng.random((40, 4)), rng.random((40, 4))
    V0, V1, Vh = rng.random((4, m)), rng.random((4, m)), rng.random((4, m))
    schedule = dict(lam=0.05, growth=1.3, lam_max=2.0, rate_unit="sync", sync_every=3)
    step = dict(kappa=2e-3, beta=beta, update=update, prox_mode=prox_mode, step_scale=0.9)
    U, U_prev, V, V_prev = U1, U0, V1, V0
    for t in range(2, 9):
        lam_t = _elb.lam_at(t // 3, 0.05, 1.3, 2.0)
        U, U_prev = _elb.u_step(U, U_prev, V, A, lam_t=lam_t, **step)
        if update_v:
            V, V_prev = _elb.v_step(V, V_prev, U, At, Vh, lam_t=lam_t, gamma=gamma,
                                    proximity=proximity, **step)
    inputs = [X.copy() for X in (U1, U0, V1, V0, Vh)]
    got = _elb.local_steps(U1, U0, V1, V0, A, At if update_v else None, Vh, t0=2, n_steps=7,
                           update_v=update_v, gamma=gamma, proximity=proximity, **schedule,
                           **step)
    for mine, theirs in zip(got, (U, U_prev, V, V_prev)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    # the compiled steps write into buffers of their own, never into their inputs
    for before, after in zip(inputs, (U1, U0, V1, V0, Vh)):
        np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("update, prox_mode, proximity", [
    ("palm", "exact_nonneg", "sequential"), ("palm", "exact", "joint"),
    ("palm", "paper", "sequential"), ("mu", "paper_nonneg", "joint"),
])
def test_local_steps_keep_zero_columns_exactly_zero(update, prox_mode, proximity):
    # The columns without data whose V, V_prev and Vh are all 0 must stay exactly 0 in the
    # compiled V block, and every other column must match the step-by-step composition.
    # Zero columns of every kind: no data and all 0, with data, zero in V only, zero in Vh
    # only, across more than one tile.
    rng = np.random.default_rng(12)
    m = _elb._TILE + 90
    dense = (rng.random((40, m)) < 0.3) & (rng.random(m) < 0.4)  # 60% of columns empty
    A = sp.csr_matrix(dense.astype(float))
    At = A.T.tocsr()
    U = rng.random((40, 3))
    V, V_prev, Vh = (rng.random((3, m)) for _ in range(3))
    zero = rng.random(m) < 0.7
    V[:, zero] = V_prev[:, zero] = 0.0
    Vh[:, zero & (rng.random(m) < 0.8)] = 0.0
    step = dict(kappa=1e-3, beta=0.2, update=update, prox_mode=prox_mode, step_scale=1.0)
    expected = [U, U, V, V_prev]
    for t in range(6):
        lam_t = _elb.lam_at(t, 0.1, 1.05, 1e12)
        expected[:2] = _elb.u_step(*expected[:2], expected[2], A, lam_t=lam_t, **step)
        expected[2:] = _elb.v_step(*expected[2:], expected[0], At, Vh, lam_t=lam_t, gamma=0.8,
                                   proximity=proximity, **step)
    got = _elb.local_steps(U, U, V, V_prev, A, At, Vh, t0=0, n_steps=6, lam=0.1, growth=1.05,
                           lam_max=1e12, rate_unit="local", sync_every=10, gamma=0.8,
                           proximity=proximity, **step)
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    stays_zero = ~dense.any(0) & zero & ~Vh.any(0)
    assert stays_zero.sum() > 20
    assert not got[2][:, stays_zero].any()


@pytest.mark.parametrize("n_steps", [1, 2, 5])
def test_local_steps_from_a_sync_leave_the_shared_vh_alone(n_steps):
    # At a sync every client starts from V_i = V_i_prev = Vh, one shared array: the compiled
    # steps (which recycle their iterate buffers) match the step-by-step composition and
    # leave Vh as it was.
    rng = np.random.default_rng(11)
    A = sp.csr_matrix((rng.random((30, 50)) < 0.3).astype(float))
    At = A.T.tocsr()
    U, Vh = rng.random((30, 3)), rng.random((3, 50))
    Vh_before = Vh.copy()
    step = dict(kappa=1e-3, beta=0.2, update="palm", prox_mode="exact_nonneg", step_scale=1.0)
    expected = [U, U, Vh, Vh]
    for t in range(n_steps):
        lam_t = _elb.lam_at(t, 0.1, 1.05, 1e12)
        expected[:2] = _elb.u_step(*expected[:2], expected[2], A, lam_t=lam_t, **step)
        expected[2:] = _elb.v_step(*expected[2:], expected[0], At, Vh, lam_t=lam_t, gamma=1.0,
                                   **step)
    got = _elb.local_steps(U, U, Vh, Vh, A, At, Vh, t0=0, n_steps=n_steps, lam=0.1,
                           growth=1.05, lam_max=1e12, rate_unit="local", sync_every=10,
                           gamma=1.0, **step)
    for mine, theirs in zip(got, expected):
        np.testing.assert_allclose(mine, theirs, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(Vh, Vh_before)


def test_monotone_descent_restricted_setting():
    # gamma = 0, constant lambda, beta = 0, Lipschitz steps, no sync: F never increases
    rng = np.random.default_rng(8)
    A = sp.csr_matrix((rng.random((300, 60)) < 0.25).astype(float))
    At = A.T.tocsr()
    U, V = rng.random((300, 5)), rng.random((5, 60))
    kw = dict(kappa=1e-3, lam_t=0.1, beta=0.0)
    values = [objective(A, U, V, 1e-3, 0.1)]
    for _ in range(150):
        U, _ = _elb.u_step(U, U, V, A, **kw)
        values.append(objective(A, U, V, 1e-3, 0.1))
        V, _ = _elb.v_step(V, V, U, At, None, gamma=0.0, **kw)
        values.append(objective(A, U, V, 1e-3, 0.1))
    increases = np.diff(values) - 1e-9 * np.abs(values[:-1])
    assert (increases <= 0).all()
    assert values[-1] < 0.9 * values[0]


def test_loss_terms_matches_dense():
    A, U, V, _ = _small_problem(9)
    assert _elb.loss_terms(A, U, V) == pytest.approx(np.sum((A.toarray() - U @ V) ** 2))


@pytest.mark.parametrize("order_x, order_y", [("C", "C"), ("F", "F"), ("C", "F"), ("F", "C")])
def test_squared_distance_and_elb_value_in_any_memory_order(order_x, order_y):
    # Felb holds its k x m factors in Fortran order: the one-pass ||X - Y||^2 and the Elb
    # value must read either layout, mixed too, and agree with numpy
    rng = np.random.default_rng(3)
    X, Y = rng.random((3, 1001)) * 1.5, rng.random((3, 1001))
    Xo, Yo = np.asarray(X, order=order_x), np.asarray(Y, order=order_y)
    assert _elb.squared_distance(Xo, Yo) == pytest.approx(np.sum((X - Y) ** 2), rel=1e-12)
    d = X.ravel() - 1.0
    expected = np.minimum(1e-3 * np.abs(X.ravel()) + 0.05 * X.ravel() ** 2,
                          1e-3 * np.abs(d) + 0.05 * d**2).sum()
    assert _elb.elb_value(Xo, 1e-3, 0.1) == pytest.approx(expected, rel=1e-12)


def test_local_steps_same_values_for_c_and_fortran_factors():
    # The compiled steps work on V item-major (the memory of a Fortran-ordered k x m V,
    # read without a copy); C-ordered inputs are transposed in: the same iterates either way,
    # and V comes back in Fortran order
    rng = np.random.default_rng(4)
    A = sp.csr_matrix((rng.random((30, 300)) < 0.2).astype(float))
    U, V, Vh = rng.random((30, 4)), rng.random((4, 300)), rng.random((4, 300))
    kw = dict(t0=0, n_steps=4, lam=0.1, growth=1.05, lam_max=1e12, rate_unit="local",
              sync_every=10, kappa=1e-3, beta=0.1, gamma=0.5)
    c = _elb.local_steps(U, U, V, V, A, A.T.tocsr(), Vh, **kw)
    f = _elb.local_steps(U, U, np.asfortranarray(V), np.asfortranarray(V), A, A.T.tocsr(),
                         np.asfortranarray(Vh), **kw)
    for got_c, got_f in zip(c, f):
        np.testing.assert_array_equal(got_c, got_f)
    assert c[2].flags.f_contiguous and c[2].shape == (4, 300)


# ---- 8-10: the estimator --------------------------------------------------------------------
def test_outputs_are_exactly_boolean():
    X, _ = tiles(120, 30, 3, density=0.9, noise=0.05, seed=1)
    model = Felb(n_components=3, n_clients=3, max_iter=20, random_state=0).fit(X)
    assert model.components_.dtype == bool and model.components_.shape == (3, 30)
    assert model.user_factors_.dtype == bool
    U = model.transform(X)
    assert U.dtype == bool and U.shape == (120, 3)
    Ui, Vi = U.astype(int), model.components_.astype(int)
    or_of_ands = np.array([[any(Ui[a, lab] and Vi[lab, b] for lab in range(3))
                            for b in range(30)] for a in range(120)])
    np.testing.assert_array_equal(model.predict(X), or_of_ands)
    np.testing.assert_array_equal(model.inverse_transform(U), np.minimum(1, Ui @ Vi) == 1)
    assert model.score(X) == pytest.approx(f1_boolean(X, model.predict(X)))


def test_boolean_convergence_with_default_schedule():
    X, _ = tiles(160, 40, 3, density=0.9, noise=0.05, seed=2)
    model = Felb(n_components=3, n_clients=4, random_state=0).fit(X)  # T * b = 1000 steps
    gap = _elb.integrality_gap_values
    assert gap(model.components_relaxed_).max() <= 1e-6
    assert gap(model.user_factors_relaxed_).max() <= 1e-6
    lam = [r["lambda_t"] for r in model.history_]
    assert np.all(np.diff(lam) >= 0) and lam[0] == pytest.approx(0.1 * 1.05**9)
    assert lam[-1] == 1e12  # 0.1 * 1.05**999 is capped at lam_max
    assert model.history_[-1]["integrality_gap_v_max"] <= 1e-6


@pytest.mark.parametrize("update", ["palm", "mu"])
@pytest.mark.parametrize("density, noise, f1_star, f1_data", [(1.0, 0.0, 0.95, 0.95),
                                                              (0.9, 0.1, 0.90, None)])
def test_planted_tile_recovery_best_of_five_seeds(update, density, noise, f1_star, f1_data):
    # single seeds fail ~25% of the time (Felb), so assert the best of 5
    X, truth = tiles(800, 80, 4, density=density, noise=noise, seed=3)
    best = (0.0, 0.0)
    for seed in range(5):
        model = Felb(n_components=4, n_clients=4, solver_params={"update": update},
                     random_state=seed).fit(X)
        factors = (model.user_factors_, model.components_)
        best = max(best, (f1_boolean(truth, factors), f1_boolean(X, factors)))
        if best[0] >= f1_star and (f1_data is None or best[1] >= f1_data):
            break
    assert best[0] >= f1_star
    if f1_data is not None:
        assert best[1] >= f1_data


# ---- 11: transmission audit -----------------------------------------------------------------
def test_transmission_audit():
    X, _ = tiles(90, 24, 3, density=0.9, noise=0.05, seed=4)
    sizes = {0: 25, 1: 30, 2: 35}  # no client size equals k = 3 or m = 24
    clients = np.repeat([0, 1, 2], [25, 30, 35])
    log = []

    def audit(round_index, info):
        log.append((round_index, info["uploads"], info["broadcast"]))

    T = 6
    model = Felb(n_components=3, max_iter=T, sync_every=4, callback=audit, random_state=0)
    model.fit(X, clients=clients)
    assert len(log) == T
    for _, uploads, broadcast in log:
        assert sorted(uploads) == [0, 1, 2]
        for c, payload in uploads.items():
            assert isinstance(payload, np.ndarray) and payload.shape == (3, 24)
            assert sizes[c] not in payload.shape
            assert not np.shares_memory(payload, model.user_factors_relaxed_)
        assert set(broadcast) == {"Vh", "t"} and broadcast["Vh"].shape == (3, 24)
    # bytes: exactly C k m float64 up per sync; (Vh, t) down to every client, and the
    # first round also counts the initial broadcast of Vh^0
    down = 3 * (3 * 24 * 8 + 8)
    assert all(r["bytes_uploaded"] == 3 * 3 * 24 * 8 for r in model.history_)
    assert [r["bytes_downloaded"] for r in model.history_] == [2 * down] + [down] * (T - 1)


def _one_client(n=40, m=3000, k=4, seed=5):
    A, _ = tiles(n, m, k, density=0.9, noise=0.05, seed=seed)
    block = split_clients(A, np.zeros(n, dtype=np.intp), 1)[0]
    rng = np.random.default_rng(seed)
    state = {"U": rng.random((n, k)), "U_prev": None, "V": rng.random((k, m))}
    state["U_prev"] = state["U"]
    return block, state, {"Vh": rng.random((k, m)), "t": 7}


def _update(block, state, broadcast, privacy, seed=0, **overrides):
    params = dict(sync_every=3,
                  schedule=dict(lam=0.1, growth=1.05, lam_max=1e12, rate_unit="local"),
                  step=dict(kappa=1e-3, beta=1e-3, gamma=1.0, update="palm",
                            prox_mode="exact_nonneg", proximity="sequential", step_scale=1.0),
                  privacy=privacy)
    params.update(overrides)
    return _felb_protocol.client_update(state, block, broadcast, np.random.default_rng(seed), True,
                               **params)


def test_upload_is_a_fresh_k_by_m_matrix_and_dp_noise_is_as_specified():
    block, state, broadcast = _one_client()
    off = dict(mechanism=None, clip=None, scale=None)
    new_state, upload = _update(block, state, broadcast, off)
    np.testing.assert_array_equal(upload, new_state["V"])
    for private in (block.X.data, new_state["U"], new_state["U_prev"], new_state["V"]):
        assert not np.shares_memory(upload, private)
    sigma = gaussian_sigma(0.5, 0.05, 1.5)  # the paper's calibration, spec 8.12
    dp = dict(mechanism="gaussian", clip=1.5, scale=sigma)
    dp_state, noisy = _update(block, state, broadcast, dp)
    np.testing.assert_array_equal(dp_state["V"], new_state["V"])  # noise never stays local
    residual = noisy - np.minimum(dp_state["V"], 1.5)
    assert abs(residual.std() / sigma - 1) < 0.03  # 12000 draws
    assert abs(residual.mean()) < 0.05 * residual.std()


def test_clients_restart_from_the_broadcast():
    # after a sync V_i equals Vh: the stale local copy has no influence on the next round
    block, state, broadcast = _one_client(m=50)
    off = dict(mechanism=None, clip=None, scale=None)
    other = dict(state, V=np.zeros_like(state["V"]))
    a, up_a = _update(block, state, broadcast, off)
    b, up_b = _update(block, other, broadcast, off)
    np.testing.assert_array_equal(up_a, up_b)
    np.testing.assert_array_equal(a["U"], b["U"])


# ---- 13: server aggregation -----------------------------------------------------------------
@pytest.mark.parametrize("server_step", [1.0, "1/C"])
def test_server_prox_of_the_mean(server_step):
    rng = np.random.default_rng(6)
    uploads = {c: rng.random((3, 20)) * 1.2 for c in range(5)}
    schedule = dict(lam=0.1, growth=1.05, lam_max=1e12, rate_unit="local")
    kw = dict(sync_every=10, n_clients=5, server_step=server_step, kappa=1e-3,
              schedule=schedule, prox_mode="exact_nonneg")
    state, bcast = _felb_protocol.server_update({"Vh": None, "t": 30, "lam": 0.1}, uploads, 3, **kw)
    eta = 0.2 if server_step == "1/C" else 1.0
    lam_t = 0.1 * 1.05**39  # lambda of the last local step of the round
    mean = sum(uploads[c] for c in range(5)) / 5
    assert bcast["t"] == 40 and state["lam"] == pytest.approx(lam_t, rel=1e-12)
    expected = _elb.prox_elb(mean, eta * 1e-3, eta * state["lam"])
    np.testing.assert_array_equal(bcast["Vh"], expected)
    shuffled = {c: uploads[c] for c in (3, 1, 4, 0, 2)}
    np.testing.assert_array_equal(_felb_protocol.server_update({"Vh": None, "t": 30}, shuffled, 3,
                                                      **kw)[1]["Vh"], bcast["Vh"])


# ---- 14: baseline aggregations ----------------------------------------------------------------
def test_baseline_aggregations_hand_example():
    # C = 4 clients, column sums 0, 1, 2, 3, 4
    V = np.array([[[0, 1, 1, 1, 1]], [[0, 0, 1, 1, 1]], [[0, 0, 0, 1, 1]], [[0, 0, 0, 0, 1]]])
    assert V.sum(axis=0).tolist() == [[0, 1, 2, 3, 4]]
    assert aggregate_boolean(V, "majority").astype(int).tolist() == [[0, 0, 1, 1, 1]]
    assert aggregate_boolean(V, "round").astype(int).tolist() == [[0, 0, 0, 1, 1]]
    assert aggregate_boolean(V, "or").astype(int).tolist() == [[0, 1, 1, 1, 1]]


def test_aggregated_bmf_one_shot():
    X, truth = tiles(200, 30, 1, density=1.0, noise=0.0, seed=7)
    log = []
    model = AggregatedBMF(n_components=1, n_clients=4, random_state=0,
                          callback=lambda r, info: log.append(info["uploads"])).fit(X)
    assert model.n_iter_ == 1 and len(log) == 1
    assert all(u.dtype == bool and u.shape == (1, 30) for u in log[0].values())
    assert f1_boolean(truth, (model.user_factors_, model.components_)) == 1.0
    dp = AggregatedBMF(n_components=1, n_clients=4, privacy=LocalDP("bernoulli", epsilon=0.5),
                       random_state=0, callback=lambda r, info: log.append(info["uploads"]))
    dp.fit(X)
    flips = sum(int((log[1][c] != log[0][c]).sum()) for c in range(4))
    assert 0 < flips and dp.noise_scale_ == pytest.approx(1 / (1 + np.e**0.5))
    spent = dp.privacy_spent_  # one pure release per client: exactly epsilon at delta = 0
    assert spent["n_releases"].tolist() == [1] * 4 and spent["delta"].tolist() == [0.0] * 4
    np.testing.assert_allclose(spent["epsilon"], 0.5)


# ---- 12 and 16: privacy accounting, determinism, input contract -------------------------------
def test_privacy_spent_reports_per_release_and_composition():
    X, _ = tiles(60, 20, 2, seed=8)
    model = Felb(n_components=2, n_clients=3, max_iter=4, sync_every=2,
                 privacy=LocalDP("laplace", epsilon=0.5, clip=1.5), random_state=0).fit(X)
    spent = model.privacy_spent_
    assert model.noise_scale_ == pytest.approx(1.5 / 0.5)
    assert spent["client"].tolist() == [0, 1, 2] and spent["n_releases"].tolist() == [4] * 3
    np.testing.assert_allclose(spent["epsilon_basic"], 4 * 0.5)
    assert np.all(spent["epsilon"] <= spent["epsilon_basic"] + 1e-9)
    assert Felb(n_components=2, n_clients=3, max_iter=2).fit(X).privacy_spent_ is None
    with pytest.warns(PrivacyWarning, match="without clipping"):
        Felb(n_components=2, n_clients=3, max_iter=1,
             privacy=LocalDP("gaussian", epsilon=0.5)).fit(X)


@pytest.mark.parametrize("params", [dict(solver_params={"update": "palm"}), dict(
    solver_params={"update": "mu"},
    privacy=LocalDP("gaussian", epsilon=0.5, delta=0.05, clip=1.5))])
def test_n_jobs_invariance(params):
    X, _ = tiles(120, 30, 3, density=0.9, noise=0.05, seed=9)
    fits = [Felb(n_components=3, n_clients=6, max_iter=8, random_state=0, n_jobs=n_jobs,
                 **params).fit(X) for n_jobs in (1, 2)]
    np.testing.assert_array_equal(fits[0].components_relaxed_, fits[1].components_relaxed_)
    np.testing.assert_array_equal(fits[0].user_factors_relaxed_, fits[1].user_factors_relaxed_)
    agg = [AggregatedBMF(n_components=3, n_clients=6, local_iter=50, random_state=0,
                         n_jobs=n_jobs).fit(X) for n_jobs in (1, 2)]
    np.testing.assert_array_equal(agg[0].components_, agg[1].components_)


def test_sparse_and_dense_inputs_agree():
    X, _ = tiles(100, 25, 2, density=0.9, noise=0.05, seed=10)
    kw = dict(n_components=2, n_clients=3, max_iter=10, random_state=0)
    a = Felb(**kw).fit(X)
    for other in (X.toarray().astype(bool), sp.csc_matrix(X), sp.coo_array(X)):
        b = Felb(**kw).fit(other)
        np.testing.assert_allclose(a.components_relaxed_, b.components_relaxed_, atol=1e-10)
        np.testing.assert_allclose(a.user_factors_relaxed_, b.user_factors_relaxed_,
                                   atol=1e-10)


def test_binary_input_contract():
    X, _ = tiles(40, 10, 2, seed=11)
    with pytest.raises(ValueError, match="binary"):
        Felb(n_clients=2, n_components=2).fit(X.toarray() * 2)
    ratings = X.toarray() * 4.0  # a rating matrix binarized at rating >= 3.5
    a = Felb(n_components=2, n_clients=2, max_iter=3, random_state=0, binarize=3.25)
    b = Felb(n_components=2, n_clients=2, max_iter=3, random_state=0)
    np.testing.assert_array_equal(a.fit(ratings).components_, b.fit(X).components_)
    with pytest.raises(ValueError, match="n_clients"):
        Felb(n_clients=50).fit(X)
    clients = np.arange(40) % 4
    assert Felb(n_components=2, max_iter=2).fit(X, clients=clients).n_clients_ == 4


@pytest.mark.parametrize("mode", _elb.PROX_MODES)
@pytest.mark.parametrize("update", ["palm", "mu"])
@pytest.mark.parametrize("proximity", ["sequential", "joint"])
def test_fused_step_matches_numpy_composition(mode, update, proximity):
    A, U, V, Vh = _small_problem(11)
    V_prev = V + 0.01
    kw = dict(kappa=0.02, lam_t=0.4, beta=0.1, update=update, prox_mode=mode)
    Vbar = V + 0.1 * (V - V_prev)
    Vbar = np.maximum(Vbar, 0) if update == "mu" else Vbar
    Q = U.T @ U
    G = Q @ Vbar - (A.T @ U).T
    eta = Vbar / (Q @ Vbar) if update == "mu" else 1 / np.linalg.norm(Q)
    X, s = Vbar - eta * G, eta * 0.7
    if proximity == "joint":
        expected = _elb.prox_elb((X + s * Vh) / (1 + s), eta * 0.02 / (1 + s),
                                 eta * 0.4 / (1 + s), mode)
    else:
        expected = _elb.prox_proximity(_elb.prox_elb(X, eta * 0.02, eta * 0.4, mode), s, Vh)
    V_new, _ = _elb.v_step(V, V_prev, U, A.T.tocsr(), Vh, gamma=0.7, proximity=proximity, **kw)
    np.testing.assert_allclose(V_new, expected, rtol=1e-12, atol=1e-14)


# ---- solver_params ------------------------------------------------------------------------
def test_solver_params_reach_the_steps_and_the_fold_in():
    # the same model from the same constants, spelled as solver_params: a key changes the
    # fit (and transform, which folds in with them), a key at its default changes nothing
    X, _ = tiles(60, 20, 2, density=0.9, noise=0.05, seed=2)
    kw = dict(n_components=2, n_clients=3, max_iter=4, sync_every=3, random_state=0)
    plain = Felb(**kw).fit(X)
    same = Felb(**kw, solver_params={"kappa": 1e-3, "update": "palm"}).fit(X)
    np.testing.assert_array_equal(plain.components_relaxed_, same.components_relaxed_)
    other = Felb(**kw, solver_params={"inertia": 0.3}).fit(X)
    assert not np.array_equal(plain.components_relaxed_, other.components_relaxed_)
    # AggregatedBMF: Elbmf's keys set the fold-in whatever the solver; a cover option of
    # another solver is refused
    agg = AggregatedBMF(n_components=2, n_clients=3, solver="grecond", random_state=0)
    assert agg.fit(X)._fold_in_params()["kappa"] == 0.01
    agg.set_params(solver_params={"kappa": 0.5})
    assert agg._fold_in_params()["kappa"] == 0.5
    with pytest.raises(ValueError, match="'cover' do not apply to solver='asso'"):
        agg.set_params(solver="asso", solver_params={"cover": 0.9}).fit(X)
