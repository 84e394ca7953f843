"""Conjugate-gradient row solves under loss="implicit" (Takacs, Pilaszy & Tikk 2011):
convergence to the exact (Cholesky) solve, determinism of the CG fits, and the exact solve
kept behind ``solver_params={"implicit_solver": "cholesky"}``."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from joblib import parallel_config

from sklearn_fedmf import FedMAvg, FedMGS
from sklearn_fedmf.completion._fedmgs._fedmgs_implicit import server_solve, share
from sklearn_fedmf.completion._implicit import (
    implicit_objective,
    implicit_user_factors,
    packed_size,
    spd_cg,
    spd_solve,
)
from sklearn_fedmf.exceptions import FedMFWarning

CHOLESKY = {"implicit_solver": "cholesky"}
CG = {"implicit_solver": "cg", "cg_steps": 3}  # (the steps these tests were written at)


def spd_system(r, seed=0, condition=50.0):
    """An ``r x r`` symmetric positive definite matrix of the given condition number, a
    right-hand side and a start."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(r, r)))
    A = (Q * np.geomspace(1.0, condition, r)) @ Q.T
    return (A + A.T) / 2, rng.normal(size=r), rng.normal(size=r)


def interactions(seed=0, n_users=40, n_items=30, density=0.2):
    rng = np.random.default_rng(seed)
    mask = rng.random((n_users, n_items)) < density
    mask[np.arange(n_users), rng.integers(0, n_items, n_users)] = True  # a row each
    return sp.csr_matrix(np.where(mask, rng.integers(1, 6, mask.shape), 0).astype(float))


def assert_rows_close(got, want, rtol=1e-8):
    """Row by row, ``||got - want|| <= rtol ||want||`` (norm-wise: rounding costs CG's
    directions their exact conjugacy, so a tiny entry is only as accurate as its row)."""
    gap = np.linalg.norm(got - want, axis=1)
    assert np.all(gap <= rtol * np.linalg.norm(want, axis=1)), gap.max()


def cg(A, b, x0, n_steps):
    x = x0.copy()
    r = len(b)
    taken = spd_cg(A, b, x, n_steps, np.empty(r), np.empty(r), np.empty(r))
    return x, taken


@pytest.mark.parametrize("r", [5, 12])
def test_cg_error_decreases_and_reaches_the_cholesky_solve_at_r_steps(r):
    A, b, x0 = spd_system(r, seed=r)
    exact = np.empty(r)
    spd_solve(A, b, np.empty((r, r)), exact)
    errors, residuals = [], []
    for k in range(r + 1):
        x, _ = cg(A, b, x0, k)
        e = x - exact
        errors.append(float(e @ A @ e))  # the energy norm CG minimizes over its Krylov space
        residuals.append(float(np.linalg.norm(b - A @ x)))
    assert all(later < earlier for earlier, later in zip(errors, errors[1:]))
    assert residuals[-1] < 1e-8 * residuals[0]
    assert np.linalg.norm(cg(A, b, x0, r)[0] - exact) <= 1e-8 * np.linalg.norm(exact)
    # at the solution no step is taken
    assert cg(A, b, exact, 3)[1] <= 1


def test_user_cg_objective_decreases_with_the_steps_and_reaches_the_exact_rows():
    X = interactions(seed=1)
    r = 6
    rng = np.random.default_rng(2)
    Vt, U0 = rng.random((X.shape[1], r)), rng.random((X.shape[0], r))
    VtV = Vt.T @ Vt
    exact = implicit_user_factors(X, Vt, VtV, confidence=0.7, alpha_u=0.5)
    values = []
    for k in range(r + 1):
        U = implicit_user_factors(X, Vt, VtV, confidence=0.7, alpha_u=0.5, out=U0.copy(),
                                  cg_steps=k)
        values.append(implicit_objective(X, U, Vt, confidence=0.7, alpha_u=0.5, VtV=VtV))
    assert all(later < earlier for earlier, later in zip(values, values[1:]))
    assert_rows_close(U, exact)
    # rows: only those are stepped; a row without interaction is its minimizer, zero
    X = X.tolil()
    X[3] = 0
    X = X.tocsr()
    out = U0.copy()
    implicit_user_factors(X, Vt, VtV, confidence=0.7, alpha_u=0.5, out=out, cg_steps=2,
                          rows=np.array([1, 3]))
    np.testing.assert_array_equal(np.delete(out, [1, 3], axis=0),
                                  np.delete(U0, [1, 3], axis=0))
    np.testing.assert_array_equal(out[3], 0.0)
    with pytest.raises(ValueError, match="cg_steps needs out"):
        implicit_user_factors(X, Vt, VtV, confidence=0.7, alpha_u=0.5, cg_steps=2)


def test_server_cg_reaches_the_exact_item_solve():
    X = interactions(seed=3)
    r = 5
    rng = np.random.default_rng(4)
    U, Vt = rng.normal(size=(X.shape[0], r)), rng.normal(size=(X.shape[1], r))
    sums, grams = np.zeros((X.shape[1], packed_size(r))), np.zeros((r, r))
    for rows in np.array_split(np.arange(X.shape[0]), 3):  # three clients
        msg = share(U[rows], X[rows], confidence=1.1)
        sums[msg["items"]] += msg["G"]
        grams += msg["gram"]
    exact = server_solve(sums, grams, 0.4)
    start = Vt.copy()
    few = server_solve(sums, grams, 0.4, Vt=Vt, cg_steps=2)
    np.testing.assert_array_equal(Vt, start)  # (the current V is not changed)
    assert not np.allclose(few, exact, rtol=1e-6)
    assert_rows_close(server_solve(sums, grams, 0.4, Vt=Vt, cg_steps=r), exact)


def fit(cls, X, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        return cls(loss="implicit", random_state=0, **params).fit(X)


@pytest.mark.parametrize("cls", [FedMGS, FedMAvg])
def test_cg_fit_does_not_depend_on_n_jobs_and_differs_from_the_exact_one(cls):
    # rank 8 with 2 steps: the CG rows are not the exact ones (the test could fail)
    X = interactions(seed=5, n_users=60)
    params = dict(n_components=8, n_clients=5, max_iter=4, clients_per_round=3,
                  solver_params={"implicit_solver": "cg", "cg_steps": 2})
    one = fit(cls, X, **params)
    two = fit(cls, X, **params, n_jobs=2)
    np.testing.assert_array_equal(one.components_, two.components_)
    np.testing.assert_array_equal(one.user_factors_, two.user_factors_)
    exact = fit(cls, X, **{**params, "solver_params": CHOLESKY})
    assert not np.allclose(one.components_, exact.components_, rtol=1e-4)
    # the same messages: the same bytes each round, up and down
    for key in ("bytes_uploaded", "bytes_downloaded"):
        assert [h[key] for h in one.history_] == [h[key] for h in exact.history_]


def test_cg_fit_is_the_same_on_worker_processes():
    # loky pickles the blocks and broadcasts to processes: their arrays are copies (read-only
    # there, of another alignment), the model must not move
    X = interactions(seed=5, n_users=60)
    params = dict(n_components=8, n_clients=4, max_iter=3, solver_params=CG)
    one = fit(FedMGS, X, **params)
    with parallel_config(backend="loky"):
        two = fit(FedMGS, X, **params, n_jobs=2)
    np.testing.assert_array_equal(one.components_, two.components_)
    np.testing.assert_array_equal(one.user_factors_, two.user_factors_)


def test_cg_fit_per_user_is_deterministic_and_close_to_the_exact_fit():
    # one client per user (the grouped phases): n_jobs does not change the model, the
    # objective decreases every round, and after 8 rounds it is within 1% of the exact fit's
    X = interactions(seed=6, n_users=80, n_items=40)
    clients = np.arange(X.shape[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        models = [FedMGS(loss="implicit", n_components=8, max_iter=8, random_state=0,
                         n_jobs=n_jobs, solver_params=solver).fit(X, clients=clients)
                  for n_jobs, solver in ((1, CG), (2, CG), (1, CHOLESKY))]
    np.testing.assert_array_equal(models[0].components_, models[1].components_)
    cg_end, exact_end = (m.history_[-1]["objective"] for m in (models[0], models[2]))
    assert exact_end <= cg_end <= 1.01 * exact_end
    objectives = [h["objective"] for h in models[0].history_]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objectives, objectives[1:]))
