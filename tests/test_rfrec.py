"""RFRec / RFRecF against exact oracles on toy problems.

The reference is an independent dense simulation: every client keeps its whole ``(m, d)``
copy ``V_(c)`` and the gradient of ``F`` is written out from the paper's objective (5).
``F`` is not convex (sign and rotation symmetries), so nothing here compares against a
unique optimum.
"""


import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import RFRec as _RFRec
from sklearn_fedmf.completion._rfrec._rfrec import ItemMatrixUpload, _coin, _pulled
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.engine._fit import route_solver_params
from sklearn_fedmf.privacy import LocalDP


def RFRec(*args, **params):  # noqa: N802  (the class, with the paper's objective)
    """RFRec on the paper's objective: its penalties, no biases (any explicit parameter wins).

    The spec's oracles (gradient steps on ``F``) are stated for it. ``PAPER_SETTINGS["RFRec"]``
    is the authors' Adam code with its sigmoid link and 200 clients, which they do not
    describe; the step, the clients and the link are each test's own. A case's solver keys
    (``optimizer``, ``variant``, ``center``, ...) may be given flat: they reach
    ``solver_params``."""
    return _RFRec(*args, **route_solver_params(
        _RFRec, {"alpha_u": 0.1, "alpha_v": 0.0, "biased": False, **params}))


# ---- toy data and the dense reference ------------------------------------------------------
def toy(n=8, m=6, d=2, density=0.5, seed=0):
    """Ratings of rank ``d`` on ``n`` users x ``m`` items; every row and column observed."""
    rng = np.random.default_rng(seed)
    R = rng.normal(size=(n, d)) @ rng.normal(size=(d, m)) + 3.0
    mask = rng.random((n, m)) < density
    mask[np.arange(n), np.arange(n) % m] = True
    mask[np.arange(m) % n, np.arange(m)] = True
    return R, mask


def to_csr(R, mask):
    return sp.csr_matrix((R[mask], np.nonzero(mask)), shape=R.shape)


def model(**params):
    # (one client per user: the paper's setting, which these oracles are written for)
    base = dict(n_components=2, learning_rate=0.01, center=False, alpha_u=0.1, random_state=0,
                n_clients=None)
    return RFRec(**{**base, **params})


def eta_of(est):
    settings = est._settings()
    if settings["variant"] == "rfrec":
        return None
    return settings["pull_eta"] or est.learning_rate * est.reg_consensus / settings["p"]


def read_state(est):
    """The dense state of the fitted federation: U, every copy V_(c), Vbar, Adam moments."""
    fed = est._federation
    bc = fed.broadcast.simulation
    states = fed.client_states
    V = np.repeat(bc.W[None], len(states), axis=0)
    adam = est._settings()["optimizer"] == "adam"
    if adam:
        mV = np.repeat(bc.W_opt["mW"][None], len(states), axis=0)
        vV = np.repeat(bc.W_opt["vW"][None], len(states), axis=0)
        mU, vU = np.zeros_like(est.user_factors_), np.zeros_like(est.user_factors_)
    for c, s in enumerate(states):
        V[c, s["cols"]] = _pulled(s, bc, eta_of(est))
        if adam:
            rows = np.flatnonzero(est.clients_ == c)
            mV[c, s["cols"]], vV[c, s["cols"]] = s["opt"]["mP"], s["opt"]["vP"]
            mU[rows], vU[rows] = s["opt"]["mU"], s["opt"]["vU"]
    opt = dict(t=states[0]["opt"]["t"], mU=mU, vU=vU, mV=mV, vV=vV) if adam else None
    return est.user_factors_.copy(), V, bc.Vbar.copy(), opt


def fit_grads(R, mask, groups, U, V, link, lo=0.0, span=1.0):
    """Gradients of sum_(i,j) (r_ij - link(u_i . v_(c)j))^2 and the loss (dense)."""
    Vu = V[groups]
    Z = np.einsum("id,ijd->ij", U, Vu)
    if link == "sigmoid":
        S = 1 / (1 + np.exp(-Z))
        E = mask * (S - (R - lo) / span)
        G = 2 * E * S * (1 - S)
    else:
        E = mask * (Z - R)
        G = 2 * E
    gU = np.einsum("ij,ijd->id", G, Vu)
    gV = np.stack([np.einsum("ij,id->jd", G[groups == c], U[groups == c])
                   for c in range(V.shape[0])])
    return gU, gV, float((E**2).sum())


def objective(R, mask, groups, U, V, reg, alpha_u, alpha_v):
    """The paper's F (5) with the identity link; Vbar is the mean of the copies."""
    N = V.shape[0]
    loss = fit_grads(R, mask, groups, U, V, "identity")[2]
    return (loss + alpha_u * (U**2).sum() + alpha_v / N * (V**2).sum()
            + reg * 0.5 * ((V - V.mean(0)) ** 2).sum())


def grad_F(R, mask, groups, U, V, reg, alpha_u, alpha_v, Vbar=None):
    """The exact gradient of F (psi part lambda (V_(c) - Vbar))."""
    N = V.shape[0]
    Vbar = V.mean(0) if Vbar is None else Vbar
    gU, gV, _ = fit_grads(R, mask, groups, U, V, "identity")
    return gU + 2 * alpha_u * U, gV + 2 * alpha_v / N * V + reg * (V - Vbar)


def adam(x, g, m, v, t, lr):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return x - lr / (1 - 0.9**t) * m / (np.sqrt(v / (1 - 0.999**t)) + 1e-8), m, v


def naive_rounds(est, R, mask, state, records, arrivals):
    """Continue the dense per-client simulation for ``len(records)`` rounds."""
    U, V, Vbar, opt = (x.copy() if isinstance(x, np.ndarray) else x for x in state)
    opt = None if opt is None else dict(opt)
    groups = est.clients_
    N, lr, reg, p = V.shape[0], est.learning_rate, est.reg_consensus, est._settings()["p"]
    lo, hi = est.rating_range_
    earlier = est.history_[: len(est.history_) - len(records)]
    prev = earlier[-1].get("coin", 0) if earlier else 0
    for rec, arrived in zip(records, arrivals):
        coin = (prev, rec.get("coin", 0))
        prev = coin[1]
        if est._settings()["variant"] == "rfrec":
            action = "step"
        elif est._settings()["schedule"] == "l2gd":
            action = "main" if coin[1] == 0 else ("pull" if coin[0] == 1 else "upload_pull")
        else:
            action = {(0, 0): "main", (1, 0): "pull", (0, 1): "upload", (1, 1): "idle"}[coin]
        if action in ("step", "main"):
            gU, gV, _ = fit_grads(R, mask, groups, U, V, est._settings()["link"], lo, hi - lo)
            gU = gU + 2 * est.alpha_u * U
            gV = gV + 2 * est.alpha_v / N * V
            if action == "step":
                gV = gV + reg * (V - Vbar)
            else:
                gU, gV = gU / (1 - p), gV / (1 - p)
            if opt is None:
                U, V = U - lr * gU, V - lr * gV
            else:
                opt["t"] += 1
                U, opt["mU"], opt["vU"] = adam(U, gU, opt["mU"], opt["vU"], opt["t"], lr)
                V, opt["mV"], opt["vV"] = adam(V, gV, opt["mV"], opt["vV"], opt["t"], lr)
        if action in ("step", "upload", "upload_pull") and arrived:
            Vbar = V[sorted(arrived)].mean(0)
        if action in ("pull", "upload_pull"):
            V = V - eta_of(est) * (V - Vbar)
    return U, V, Vbar


def run_and_log(est, X):
    """Fit with a callback that logs the clients whose upload arrived each round."""
    arrivals, uploads = [], []

    def log(k, info):
        arrivals.append(set(info["uploads"]))
        uploads.append(info["uploads"])

    est.set_params(callback=log).fit(X)
    return arrivals, uploads


# ---- oracles 1, 2, 4: F, its gradient, one RFRec round ------------------------------------
def test_reference_gradient_matches_finite_differences():
    R, mask = toy()
    rng = np.random.default_rng(1)
    groups = np.arange(8) % 3
    U, V = rng.normal(size=(8, 2)), rng.normal(size=(3, 6, 2))
    reg, au, av = 4.0, 0.3, 0.2
    gU, gV = grad_F(R, mask, groups, U, V, reg, au, av)
    h = 1e-6
    for X, G in ((U, gU), (V, gV)):
        for idx in [(0, 1), (5, 0)] if X.ndim == 2 else [(0, 2, 1), (2, 5, 0), (1, 0, 0)]:
            X[idx] += h
            up = objective(R, mask, groups, U, V, reg, au, av)
            X[idx] -= 2 * h
            down = objective(R, mask, groups, U, V, reg, au, av)
            X[idx] += h
            assert abs((up - down) / (2 * h) - G[idx]) < 1e-5


@pytest.mark.parametrize("n_clients", [None, 3])
def test_rfrec_round_is_a_gradient_step_on_F(n_clients):
    R, mask = toy()
    X = to_csr(R, mask)
    est = model(max_iter=1, alpha_v=0.3, reg_consensus=5.0, n_clients=n_clients,
                partition="contiguous", warm_start=True).fit(X)
    U, V, Vbar, _ = read_state(est)
    groups = est.clients_
    args = (R, mask, groups, U, V, 5.0, 0.1, 0.3)
    np.testing.assert_allclose(Vbar, V.mean(0), atol=1e-14)  # mean identity
    assert est.history_[-1]["objective"] == pytest.approx(objective(*args), rel=1e-12)
    gU, gV = grad_F(*args)
    est.fit(X)
    U2, V2, Vbar2, _ = read_state(est)
    np.testing.assert_allclose(U2, U - 0.01 * gU, atol=1e-14)
    np.testing.assert_allclose(V2, V - 0.01 * gV, atol=1e-14)
    np.testing.assert_allclose(Vbar2, V2.mean(0), atol=1e-14)
    # the fit gradients move Vbar: Vbar' = Vbar - (alpha / N) sum_c grad_V f_c
    fitV = gV - 5.0 * (V - V.mean(0))
    np.testing.assert_allclose(Vbar2, Vbar - 0.01 * fitV.mean(0), atol=1e-14)


def test_small_steps_never_increase_F():
    R, mask = toy()
    est = model(max_iter=150, learning_rate=0.01, reg_consensus=5.0).fit(to_csr(R, mask))
    F = np.array([r["objective"] for r in est.history_])
    assert np.all(np.diff(F) <= 1e-12 * F[:-1])
    assert F[-1] < 0.5 * F[0]


# ---- oracle 15: the sparse representation equals the dense per-client simulation ------------
CASES = {
    "rfrec-gd-groups": dict(n_clients=3, partition="contiguous", alpha_v=0.2),
    "rfrec-adam-sigmoid": dict(optimizer="adam", link="sigmoid", learning_rate=0.05),
    "rfrec-participation-dropout": dict(clients_per_round=0.5, dropout=0.3),
    "rfrecf-l2gd": dict(variant="rfrecf", p=0.4, learning_rate=0.02, alpha_v=0.1),
    "rfrecf-algorithm2-adam": dict(variant="rfrecf", schedule="algorithm2", optimizer="adam",
                                   learning_rate=0.05, p=0.5, n_clients=4),
}


@pytest.mark.parametrize("case", CASES)
def test_sparse_state_equals_dense_simulation(case):
    R, mask = toy(n=10, m=7)
    X = to_csr(R, mask)
    est = model(max_iter=2, warm_start=True, **CASES[case]).fit(X)
    start = read_state(est)
    est.set_params(max_iter=25)
    arrivals, _ = run_and_log(est, X)
    U, V, Vbar, _ = read_state(est)
    rU, rV, rVbar = naive_rounds(est, R, mask, start, est.history_[-25:], arrivals)
    np.testing.assert_allclose(U, rU, atol=1e-12)
    np.testing.assert_allclose(V, rV, atol=1e-12)
    np.testing.assert_allclose(Vbar, rVbar, atol=1e-12)
    if "dropout" in CASES[case]:
        n_arrived = [len(a) for a in arrivals]
        assert min(n_arrived) < 5 and all(n <= 5 for n in n_arrived)  # ceil(0.5 * 10) sampled


# ---- oracles 7 and 9: lambda -> 0 and lambda -> infinity ----------------------------------
def test_lambda_zero_gives_independent_local_models():
    R, mask = toy(n=6, m=6)
    R2 = R.copy()
    R2[3:] += np.random.default_rng(5).normal(size=R[3:].shape)  # other clients' ratings
    runs = []
    for Ri in (R, R2):
        est = model(reg_consensus=0.0, max_iter=30, simulate_uploads=True)
        runs.append((est, run_and_log(est, to_csr(Ri, mask))[1]))
    (a, ups_a), (b, ups_b) = runs
    np.testing.assert_array_equal(a.user_factors_[:3], b.user_factors_[:3])
    for c in range(3):  # client c's whole trajectory ignores the others' ratings
        for k in range(30):
            np.testing.assert_array_equal(ups_a[k][c], ups_b[k][c])
    assert np.abs(a.components_ - b.components_).max() > 1e-3  # Vbar changed: no influence
    for c in range(6):  # unrated columns never leave their initial value
        np.testing.assert_array_equal(ups_a[-1][c][~mask[c]], ups_a[0][c][~mask[c]])
        assert not np.allclose(ups_a[-1][c][mask[c]], ups_a[0][c][mask[c]])


def consensus_run(reg, n_iter):
    R, mask = toy(n=8, m=6)
    lr = 0.9 / (30 + reg)  # below 1 / (L + lambda); L is about 30 here
    est = model(reg_consensus=reg, alpha_v=1.0, learning_rate=lr, max_iter=n_iter, eval_every=0,
                n_clients=4, partition="contiguous").fit(to_csr(R, mask))
    U, V, Vbar, _ = read_state(est)
    groups = est.clients_
    # the centralized problem (1) at (U, Vbar): grad_V = -2 sum e u + 2 alpha_v Vbar
    gU, gV, _ = fit_grads(R, mask, np.zeros(8, int), U, Vbar[None], "identity")
    central = np.linalg.norm(gV[0] + 2 * 1.0 * Vbar)
    gap = max(np.linalg.norm(V[c] - Vbar) for c in range(4))
    stationarity = np.linalg.norm(np.concatenate([
        g.ravel() for g in grad_F(R, mask, groups, U, V, reg, 0.1, 1.0)]))
    return gap, central, stationarity


def test_consensus_gap_and_central_gradient_scale_like_one_over_lambda():
    (g1, c1, s1), (g2, c2, s2) = consensus_run(10.0, 2500), consensus_run(100.0, 6000)
    assert s1 < 1e-6 and s2 < 1e-6  # both runs are stationary points of F
    assert 5 < g1 / g2 < 20  # ~ 1 / lambda (6.3 here: the stationary point moves too)
    assert 5 < c1 / c2 < 20


# ---- oracle 11: what crosses the network ----------------------------------------------------
def test_uploads_hold_only_each_clients_item_matrix():
    R, mask = toy(n=6, m=5)
    X = to_csr(R, mask)
    m, d = 5, 2
    est = model(max_iter=1, warm_start=True).fit(X)
    before = read_state(est)
    est.set_params(max_iter=1)
    _, uploads = run_and_log(est, X)
    U, V, Vbar, _ = read_state(est)
    bc = est._federation.broadcast.simulation
    assert sorted(uploads[0]) == list(range(6))
    for c, up in uploads[0].items():
        assert isinstance(up, ItemMatrixUpload)
        assert set(vars(up)) == {"cols", "values", "n_items", "noise_scale"}
        assert up.values.shape == (mask[c].sum(), d)  # no user vector, no rating
        np.testing.assert_array_equal(up.toarray(bc.W), V[c])
        assert up.nbytes == m * d * 8
    assert not np.allclose(U, before[0])  # the user vectors moved but were never sent
    rec = est.history_[-1]
    assert rec["bytes_uploaded"] == 6 * m * d * 8 and rec["bytes_downloaded"] == 6 * m * d * 8
    # the dense debug mode sends the same matrices
    for optimizer in ("gd", "adam"):
        dense = model(max_iter=2, simulate_uploads=True, optimizer=optimizer)
        _, dense_uploads = run_and_log(dense, X)
        ref = model(max_iter=2, optimizer=optimizer)
        _, ref_uploads = run_and_log(ref, X)
        W = ref._federation.broadcast.simulation.W
        for c, V_c in dense_uploads[-1].items():
            assert isinstance(V_c, np.ndarray) and V_c.shape == (m, d)
            np.testing.assert_allclose(V_c, ref_uploads[-1][c].toarray(W), atol=1e-15)
        np.testing.assert_allclose(dense.components_, ref.components_, atol=1e-14)
        assert ref.comm_rounds_ == 4


@pytest.mark.parametrize("schedule", ["l2gd", "algorithm2"])
def test_rfrecf_communicates_only_on_coin_changes(schedule):
    R, mask = toy(n=6, m=5)
    est = model(variant="rfrecf", schedule=schedule, p=0.5, max_iter=60)
    arrivals, _ = run_and_log(est, to_csr(R, mask))
    coins = np.array([0] + [r["coin"] for r in est.history_])
    ups = (coins[:-1] == 0) & (coins[1:] == 1)
    assert [bool(a) for a in arrivals] == ups.tolist()
    transitions = int((coins[:-1] != coins[1:]).sum())
    expected = 2 * int(ups.sum()) if schedule == "l2gd" else transitions
    assert est.comm_rounds_ == expected
    down = np.array([r["bytes_downloaded"] for r in est.history_[1:]]) > 0
    if schedule == "l2gd":  # Vbar travels in the round after each upload round
        assert down.tolist() == ups[:-1].tolist()
    else:  # ... at each 1 -> 0 transition
        assert down.tolist() == ((coins[1:-1] == 1) & (coins[2:] == 0)).tolist()


def test_coin_frequency_and_communication_rate():
    flips = np.array([_coin(7, k, 0.3) for k in range(4000)])
    assert abs(flips.mean() - 0.3) < 0.03
    rate = ((flips[:-1] == 0) & (flips[1:] == 1)).mean() * 2
    assert abs(rate - 2 * 0.3 * 0.7) < 0.04  # Lemma 3.9


# ---- oracle 13: privacy ---------------------------------------------------------------------
def test_privacy_plumbing():
    R, mask = toy(n=20, m=40, d=2, density=0.3)
    X = to_csr(R, mask)
    clean = model(max_iter=5).fit(X)
    big = model(max_iter=5, privacy=LocalDP(clip=1e6, noise=0.0)).fit(X)
    np.testing.assert_array_equal(big.components_, clean.components_)
    clipped = model(max_iter=5, privacy=LocalDP(clip=0.004, noise=0.0), simulate_uploads=True)
    _, uploads = run_and_log(clipped, X)
    assert all(np.abs(u).max() <= 0.004 for r in uploads for u in r.values())
    assert np.abs(clipped.components_).max() <= 0.004 * (1 + 1e-12)  # a mean of clipped
    s, n = 0.05, 20
    for simulate in (False, True):
        noisy = model(max_iter=1, privacy=LocalDP(clip=1e6, noise=s), simulate_uploads=simulate,
                      n_components=10).fit(X)
        ref = model(max_iter=1, n_components=10).fit(X)
        noise = (noisy.components_ - ref.components_).ravel()  # 400 entries
        assert abs(noise.mean()) < 4 * np.sqrt(2 * s**2 / n / noise.size)
        assert noise.var() == pytest.approx(2 * s**2 / n, rel=0.25)
        assert noisy.epsilon_ == pytest.approx(2 * 1e6 / s)
    assert clean.epsilon_ is None


# ---- engine plumbing: determinism, dropout, divergence --------------------------------------
def test_results_do_not_depend_on_n_jobs():
    R, mask = toy(n=12, m=8)
    X = to_csr(R, mask)
    params = dict(variant="rfrecf", optimizer="adam", learning_rate=0.05, p=0.5, max_iter=20,
                  clients_per_round=0.7, dropout=0.2, privacy=LocalDP(clip=1.0, noise=0.01))
    a, b = model(n_jobs=1, **params).fit(X), model(n_jobs=2, **params).fit(X)
    np.testing.assert_array_equal(a.components_, b.components_)
    np.testing.assert_array_equal(a.user_factors_, b.user_factors_)
    assert [r["n_failed"] for r in a.history_] == [r["n_failed"] for r in b.history_]
    assert sum(r["n_failed"] for r in a.history_) > 0


def test_dropout_loses_uploads_only():
    R, mask = toy(n=10, m=6)
    est = model(max_iter=10, dropout=0.5)
    arrivals, _ = run_and_log(est, to_csr(R, mask))
    failed = [r["n_failed"] for r in est.history_]
    assert [10 - len(a) for a in arrivals] == failed and sum(failed) > 10
    assert all(r["bytes_uploaded"] == len(a) * 6 * 2 * 8
               for r, a in zip(est.history_[1:], arrivals[1:]))


# The iterates are meant to blow up here; numpy's overflow warnings on the way are expected.
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("eval_every", [1, 0])
def test_divergence_raises_and_names_learning_rate(eval_every):
    R, mask = toy()
    with pytest.raises(FloatingPointError, match="Lower learning_rate"):
        model(learning_rate=0.2, max_iter=50, eval_every=eval_every).fit(to_csr(R, mask))


def test_one_client_per_user_and_sigmoid_predicts_in_range():
    R, mask = toy(n=9, m=6)
    X = to_csr(R, mask)
    est = model(link="sigmoid", optimizer="adam", learning_rate=0.05, max_iter=200).fit(X)
    assert est.n_clients_ == 9  # n_clients=None: the paper's one client per user
    assert RFRec(n_components=2, max_iter=1).fit(np.vstack([R] * 2)).n_clients_ == 10  # default
    P = est.predict(X)
    lo, hi = est.rating_range_
    assert P.min() >= lo and P.max() <= hi
    assert est.score(X) > -np.std(R[mask])  # better than the mean on its own training data
    grouped = model(n_clients=3, max_iter=5).fit(X)
    assert grouped.n_clients_ == 3 and grouped.history_[-1]["bytes_uploaded"] == 3 * 6 * 2 * 8


@pytest.mark.filterwarnings("ignore:.*item column")  # sparse random data
# (RFRecF's F swings with its coin, which the degenerate-fit check reads as no descent)
@pytest.mark.filterwarnings("ignore:.*did not decrease")
@pytest.mark.slow  # ten data sets of up to 400 users, 40 rounds each
@pytest.mark.parametrize("variant", ["rfrec", "rfrecf"])
def test_auto_learning_rate_never_diverges_across_scales(variant):
    # Ten data sets from 30 to 400 users, 1 to 180 ratings per user on average and
    # rating scales from 0.01 to 1000: a fixed step good for one diverges on another, the
    # per-block curvature step of learning_rate="auto" must fit every one of them.
    rng = np.random.default_rng(0)
    for k in range(10):
        n_users, n_items = int(rng.integers(30, 400)), int(rng.integers(10, 200))
        density = rng.uniform(0.05, 0.9)
        X = make_ratings(n_users, n_items, max(n_users, int(density * n_users * n_items)),
                         n_components=3, rating_scale=None, noise=0.1, random_state=k).X
        scale = 10.0 ** (k % 6 - 2)
        X.data *= scale
        # (the ridge is not scale-free: alpha_u follows the ratings so that it stays weak)
        est = RFRec(
            n_components=3, n_clients=n_users // 3, alpha_u=0.01 * scale, max_iter=40,
            random_state=0, solver_params={"variant": variant, "center": k % 2 == 0},
        ).fit(X)
        rmse = [r["train_rmse"] for r in est.history_]
        assert np.all(np.isfinite(est.components_)) and np.all(np.isfinite(rmse))
        # better than the first round and than the constant the factors start from (0, or
        # the mean when centred). (RFRecF's F swings with its coin: psi grows on local
        # steps, so the training error is the quantity compared here.)
        baseline = np.std(X.data) if est._settings()["center"] else np.sqrt(np.mean(X.data**2))
        assert rmse[-1] < min(rmse[0], baseline), (k, rmse[-1], baseline)
