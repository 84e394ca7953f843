"""The numba kernels (``sklearn_fedmf._kernels`` and FedMC-ADMM's
``sklearn_fedmf.completion._fedmc_admm._fedmc_admm_kernels``) against dense masked numpy oracles.

Every block has empty rows, empty columns and explicit zeros (observed ratings equal to 0,
which must count as observations). Tests use small float64 blocks, so dense oracles are cheap.
"""

import threading

import numpy as np
import pytest
import scipy.sparse as sp

import sklearn_fedmf._kernels as kernels
from sklearn_fedmf._kernels import (
    grad_cols,
    grad_rows,
    parallel_kernels,
    prox_grad_rows,
    ridge_fold_in,
    shifted_data_and_row_sums,
    squared_error,
    values_at,
)
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_kernels import (
    linearized_cols,
    replace_and_accumulate,
    squared_distance,
)

RTOL = 1e-10  # "exact": relative error


def _block(seed, n_rows=13, n_items=9, density=0.45, unsorted=False):
    """A CSR block and its dense (values, mask) twin, with the awkward cases built in."""
    rng = np.random.default_rng(seed)
    mask = rng.random((n_rows, n_items)) < density
    mask[[2, 7]] = False  # empty rows
    mask[:, [0, 5]] = False  # empty columns
    values = rng.normal(size=(n_rows, n_items))
    rows, cols = np.nonzero(mask)
    values[rows[::4], cols[::4]] = 0.0  # explicit zeros: observed, not missing
    values[~mask] = 0.0
    X = sp.csr_matrix((values[rows, cols], (rows, cols)), shape=mask.shape)
    assert X.nnz == mask.sum() and np.count_nonzero(X.data == 0) > 0
    if unsorted:  # the kernels must not rely on sorted column indices
        for t in range(n_rows):
            a, b = X.indptr[t], X.indptr[t + 1]
            perm = a + rng.permutation(b - a)
            X.indices[a:b], X.data[a:b] = X.indices[perm].copy(), X.data[perm].copy()
        X.has_sorted_indices = False
    return X, values, mask


def _factors(seed, n_rows, n_items, r=3):
    rng = np.random.default_rng(seed + 100)
    return rng.normal(size=(n_rows, r)), np.ascontiguousarray(rng.normal(size=(n_items, r)))


def _assert_close(actual, desired):
    err = np.linalg.norm(np.asarray(actual) - desired)
    assert err <= RTOL * max(np.linalg.norm(desired), 1e-300), err


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("unsorted", [False, True])
def test_grad_rows_matches_dense_oracle(seed, unsorted):
    X, M, mask = _block(seed, unsorted=unsorted)
    U, Wt = _factors(seed, *X.shape)
    E = mask * (U @ Wt.T - M)
    out = np.full_like(U, np.nan)  # every row, empty ones included, must be overwritten
    half_loss = grad_rows(X.indptr, X.indices, X.data, U, Wt, out)
    _assert_close(out, E @ Wt)
    _assert_close(half_loss, 0.5 * np.sum(E**2))
    assert np.all(out[[2, 7]] == 0.0)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("unsorted", [False, True])
def test_grad_cols_matches_dense_oracle(seed, unsorted):
    X, M, mask = _block(seed, unsorted=unsorted)
    U, Wt = _factors(seed, *X.shape)
    E = mask * (U @ Wt.T - M)
    out = np.full_like(Wt, np.nan)
    half_loss = grad_cols(X.indptr, X.indices, X.data, U, Wt, out)
    _assert_close(out, (U.T @ E).T)
    _assert_close(half_loss, 0.5 * np.sum(E**2))
    assert np.all(out[[0, 5]] == 0.0)  # empty item columns get a zero gradient


def test_explicit_zeros_are_observations():
    # A stored 0 rating must contribute a residual U.W - 0; dropping it would change the loss.
    X, M, mask = _block(3)
    U, Wt = _factors(3, *X.shape)
    dropped = X.copy()
    dropped.eliminate_zeros()
    full = squared_error(X.indptr, X.indices, X.data, U, Wt)
    partial = squared_error(dropped.indptr, dropped.indices, dropped.data, U, Wt)
    zero_entries = mask & (M == 0)
    _assert_close(full - partial, np.sum((U @ Wt.T)[zero_entries] ** 2))
    assert full - partial > 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_squared_error_matches_dense_oracle(seed):
    X, M, mask = _block(seed)
    U, Wt = _factors(seed, *X.shape)
    _assert_close(squared_error(X.indptr, X.indices, X.data, U, Wt),
                  np.sum((mask * (U @ Wt.T - M)) ** 2))


def test_squared_error_of_empty_block_is_zero():
    X = sp.csr_matrix((4, 6))
    U, Wt = _factors(0, 4, 6)
    assert squared_error(X.indptr, X.indices, X.data, U, Wt) == 0.0


@pytest.mark.parametrize("unsorted", [False, True])
def test_values_at_matches_dense_product(unsorted):
    X, _, _ = _block(4, unsorted=unsorted)
    U, Wt = _factors(4, *X.shape)
    out = np.full(X.nnz, np.nan)
    values_at(X.indptr, X.indices, U, Wt, out)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    _assert_close(out, (U @ Wt.T)[rows, X.indices])


def _ridge_oracle(M, mask, Wt, alpha):
    """Row-wise argmin 1/2 sum_j (m_tj - u.w_j)^2 + alpha/2 ||u||^2 by a dense (augmented) lstsq."""
    r = Wt.shape[1]
    out = np.zeros((M.shape[0], r))
    for t in range(M.shape[0]):
        obs = mask[t]
        if not obs.any():
            continue  # documented: rows without entries get 0
        A = np.vstack([Wt[obs], np.sqrt(alpha) * np.eye(r)])
        b = np.concatenate([M[t, obs], np.zeros(r)])
        out[t] = np.linalg.lstsq(A, b, rcond=None)[0]
    return out


@pytest.mark.parametrize("alpha", [1e-6, 0.3, 5.0])
def test_ridge_fold_in_matches_dense_ridge(alpha):
    X, M, mask = _block(5)
    _, Wt = _factors(5, *X.shape)
    out = np.full((X.shape[0], Wt.shape[1]), np.nan)
    ridge_fold_in(X.indptr, X.indices, X.data, Wt, alpha, out)
    _assert_close(out, _ridge_oracle(M, mask, Wt, alpha))
    assert np.all(out[[2, 7]] == 0.0)


def test_ridge_fold_in_without_penalty_is_least_squares():
    # alpha = 0 is documented for rows with >= r entries in general position (and empty rows).
    X, M, mask = _block(6, density=0.9)
    counts = mask.sum(axis=1)
    assert np.all((counts == 0) | (counts >= 3))
    _, Wt = _factors(6, *X.shape)
    out = np.full((X.shape[0], 3), np.nan)
    ridge_fold_in(X.indptr, X.indices, X.data, Wt, 0.0, out)
    _assert_close(out, _ridge_oracle(M, mask, Wt, 0.0))
    # Least squares: the residual of each row is orthogonal to its observed item factors.
    for t in np.flatnonzero(counts):
        obs = mask[t]
        resid = M[t, obs] - Wt[obs] @ out[t]
        assert np.linalg.norm(Wt[obs].T @ resid) <= 1e-9 * np.linalg.norm(M[t, obs])


@pytest.mark.parametrize("n_steps", [1, 2, 10])
@pytest.mark.parametrize("unsorted", [False, True])
def test_linearized_cols_matches_dense_iteration(n_steps, unsorted):
    # Items as rows: every count of raters from 0 to 12 occurs, so every path of the kernel
    # runs (closed form, k < r coordinates, Gram, entry by entry) and each k group holds
    # several columns, at r = 5.
    r, p, beta = 5, 4, 0.7
    rng = np.random.default_rng(n_steps)
    n_items, n_users = 39, 12
    mask = np.zeros((n_items, n_users), dtype=bool)
    for j in range(n_items):
        mask[j, rng.permutation(n_users)[: j % 13]] = True
    rows, cols = np.nonzero(mask)
    values = np.where(rng.random(rows.size) < 0.2, 0.0, rng.normal(size=rows.size))
    Xt = sp.csr_matrix((values, (rows, cols)), shape=mask.shape)
    assert Xt.nnz == mask.sum()
    if unsorted:
        for j in range(n_items):
            a, b = Xt.indptr[j], Xt.indptr[j + 1]
            perm = a + rng.permutation(b - a)
            Xt.indices[a:b], Xt.data[a:b] = Xt.indices[perm].copy(), Xt.data[perm].copy()
    M = np.zeros(mask.shape)
    M[rows, cols] = values
    U = rng.normal(size=(n_users, r))
    W0 = np.ascontiguousarray(rng.normal(size=(n_items, r)))
    target = rng.normal(size=(n_items, r))
    L = np.linalg.norm(U.T @ U) / p
    W, W_prev = W0.copy(), None
    for _ in range(n_steps):  # w <- (L w + target - h / p) / (L + beta), h = U^T P(U w - m)
        W_prev = W
        H = ((W @ U.T - M) * mask) @ U
        W = (L * W + target - H / p) / (L + beta)
    out, out_prev = np.full_like(W0, np.nan), np.full_like(W0, np.nan)
    linearized_cols(Xt.indptr, Xt.indices, Xt.data, U, W0, target, L, beta, p, n_steps, out,
                    out_prev)
    _assert_close(out, W)
    _assert_close(out_prev, W_prev)
    if n_steps == 1:  # the last step starts at the stored W: exactly
        np.testing.assert_array_equal(out_prev, W0)


def _varied_block(seed, n_rows, n_cols, max_k):
    """CSR rows holding 0, 1, ..., max_k entries (cycling), some of them explicit zeros."""
    rng = np.random.default_rng(seed)
    mask = np.zeros((n_rows, n_cols), dtype=bool)
    for t in range(n_rows):
        mask[t, rng.permutation(n_cols)[: t % (max_k + 1)]] = True
    rows, cols = np.nonzero(mask)
    values = np.where(rng.random(rows.size) < 0.2, 0.0, rng.normal(size=rows.size))
    X = sp.csr_matrix((values, (rows, cols)), shape=mask.shape)
    M = np.zeros(mask.shape)
    M[rows, cols] = values
    return X, M, mask


@pytest.mark.parametrize("n_steps", [1, 10])
@pytest.mark.parametrize("l1, shrink, positive", [(0.0, 1.3, False), (0.05, 1.0, False),
                                                  (0.02, 1.1, True)])
def test_prox_grad_rows_matches_dense_iteration(n_steps, l1, shrink, positive):
    # Rows with 0 to 40 entries at r = 5: both the entry-by-entry and the Gram path run.
    r, L = 5, 30.0
    X, M, mask = _varied_block(n_steps, 82, 45, 40)
    rng = np.random.default_rng(3)
    U0, Wt = rng.normal(size=(X.shape[0], r)), np.ascontiguousarray(rng.normal(size=(45, r)))
    U = U0.copy()
    for _ in range(n_steps):
        Z = U - ((U @ Wt.T - M) * mask) @ Wt / L
        if positive:
            Z = np.maximum(Z - l1, 0.0)
        else:
            Z = np.sign(Z) * np.maximum(np.abs(Z) - l1, 0.0)
        U = Z / shrink
    out = np.full_like(U0, np.nan)
    prox_grad_rows(X.indptr, X.indices, X.data, U0, Wt, L, n_steps, l1, shrink, positive, 0.0,
                   out)
    _assert_close(out, U)
    # a ridge term in the gradient: U <- prox(U - (grad + ridge U) / L)
    U, ridge = U0.copy(), 0.7
    for _ in range(n_steps):
        Z = U - (((U @ Wt.T - M) * mask) @ Wt + ridge * U) / L
        Z = np.maximum(Z - l1, 0.0) if positive else np.sign(Z) * np.maximum(np.abs(Z) - l1, 0)
        U = Z / shrink
    prox_grad_rows(X.indptr, X.indices, X.data, U0, Wt, L, n_steps, l1, shrink, positive, ridge,
                   out)
    _assert_close(out, U)


@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (3706, 5)])
def test_squared_distance_matches_numpy(shape):
    rng = np.random.default_rng(sum(shape))
    A, B = rng.normal(size=shape), rng.normal(size=shape)
    _assert_close(squared_distance(A, B), np.sum((A - B) ** 2))
    assert squared_distance(A, A) == 0.0


def test_replace_and_accumulate_matches_numpy():
    # The server's running sum: total += (W + Y / beta) - Z_i, then Z_i = W + Y / beta.
    rng = np.random.default_rng(3)
    Z_i, total, W, Y = (rng.normal(size=(37, 4)) for _ in range(4))
    beta = 0.7
    expected_total, expected_z = total + (W + Y / beta) - Z_i, W + Y / beta
    replace_and_accumulate(Z_i, total, W, Y, beta)
    _assert_close(total, expected_total)
    _assert_close(Z_i, expected_z)


# ---- rows split over threads (_kernels.split_rows): the same bits for any thread count ----
def test_split_row_kernels_give_the_serial_bits(monkeypatch):
    """``prox_grad_rows`` and ``shifted_data_and_row_sums`` inside ``parallel_kernels(2)``
    (rows in pieces, this thread and a pool's) give exactly the values of one piece."""
    X, _, _ = _block(3, n_rows=700, n_items=60, density=0.3)
    U, Wt = _factors(4, 700, 60)
    L = np.full(U.shape, 40.0)
    shift, weight = Wt[:, 0].copy(), Wt[:, 1].copy()

    def run():
        out = np.empty_like(U)
        prox_grad_rows(X.indptr, X.indices, X.data, U, Wt, L, 7, 0.01, 1.0, False, 0.3, out)
        return (out, *shifted_data_and_row_sums(X.indptr, X.indices, X.data, shift, weight))

    serial = run()
    pieces = []
    original = kernels._prox_grad_range

    def counting(lo, hi, *args):
        pieces.append((lo, hi))
        return original(lo, hi, *args)

    monkeypatch.setattr(kernels, "_prox_grad_range", counting)
    with parallel_kernels(2) as granted:
        assert granted == 2
        threaded = run()
    assert len(pieces) == 8 and sorted(pieces)[0][0] == 0 and sorted(pieces)[-1][1] == 700
    for a, b in zip(serial, threaded):
        np.testing.assert_array_equal(a, b)


def test_parallel_kernels_has_one_owner_per_process():
    """Another thread asking while a fit holds the kernels' threads gets one thread; the
    owner's nested request keeps its threads; one thread is off."""
    seen = []

    def probe():
        with parallel_kernels(2) as granted:
            seen.append(granted)

    with parallel_kernels(2) as outer:
        worker = threading.Thread(target=probe)
        worker.start()
        worker.join()
        with parallel_kernels(2) as inner:
            assert outer == inner == 2 and seen == [1]
    with parallel_kernels(1) as off:
        assert off == 1
    probe()  # (released: the next owner gets it)
    assert seen == [1, 2]
