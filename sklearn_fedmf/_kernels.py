"""Kernels on the observed entries of a CSR rating block.

Each kernel fuses the sampled dense-dense product (the residual ``e = P_Omega(U W - M)`` at the
stored entries only) with the sparse-dense product that consumes it, in one pass over the
entries and without allocating an ``nnz x r`` gather. They are compiled with numba (``nogil``,
so joblib's threading backend runs clients truly in parallel; ``cache`` so the compilation is
paid once per machine). ``benchmarks/bench_kernels.py`` measures them against the numpy/scipy
formulation, which the tests use as the oracle.

Factor layout: ``U`` is ``(m_i, r)``; the item factor is passed transposed, ``Wt`` of shape
``(n_items, r)``, C-contiguous, so that an entry's item row is a contiguous read.
"""

import numpy as np
from numba import njit

__all__ = ["grad_rows", "grad_cols", "squared_error", "values_at", "ridge_fold_in"]

_jit = njit(cache=True, nogil=True, fastmath=False)


@_jit
def grad_rows(indptr, indices, data, U, Wt, out):
    """``out = P_Omega(U Wt^T - M) Wt``; returns ``1/2 ||P_Omega(U Wt^T - M)||^2``."""
    r = U.shape[1]
    loss = 0.0
    for t in range(U.shape[0]):
        for a in range(r):
            out[t, a] = 0.0
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            e = -data[s]
            for a in range(r):
                e += U[t, a] * Wt[j, a]
            loss += e * e
            for a in range(r):
                out[t, a] += e * Wt[j, a]
    return 0.5 * loss


@_jit
def grad_cols(indptr, indices, data, U, Wt, out):
    """``out = (U^T P_Omega(U Wt^T - M))^T`` (items x r); returns the half squared error."""
    r = U.shape[1]
    out[:, :] = 0.0
    loss = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            e = -data[s]
            for a in range(r):
                e += U[t, a] * Wt[j, a]
            loss += e * e
            for a in range(r):
                out[j, a] += e * U[t, a]
    return 0.5 * loss


@_jit
def squared_error(indptr, indices, data, U, Wt):
    """``||P_Omega(U Wt^T - M)||^2`` without any output array."""
    r = U.shape[1]
    loss = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            e = -data[s]
            for a in range(r):
                e += U[t, a] * Wt[j, a]
            loss += e * e
    return loss


@_jit
def values_at(indptr, indices, U, Wt, out):
    """``out[s] = U[row(s)] . Wt[col(s)]`` for every stored entry ``s``."""
    r = U.shape[1]
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            v = 0.0
            for a in range(r):
                v += U[t, a] * Wt[j, a]
            out[s] = v


@_jit
def ridge_fold_in(indptr, indices, data, Wt, alpha, out):
    """Row-wise ridge: ``out[t] = argmin_u 1/2 sum_j (m_tj - u.w_j)^2 + alpha/2 ||u||^2``.

    Rows without entries get 0. ``alpha`` must be > 0 or every row must have >= r entries in
    general position (otherwise the least-squares solution is used via lstsq).
    """
    r = Wt.shape[1]
    G = np.empty((r, r))
    b = np.empty(r)
    for t in range(out.shape[0]):
        G[:, :] = 0.0
        b[:] = 0.0
        for s in range(indptr[t], indptr[t + 1]):
            j = indices[s]
            for a in range(r):
                b[a] += data[s] * Wt[j, a]
                for c in range(r):
                    G[a, c] += Wt[j, a] * Wt[j, c]
        for a in range(r):
            G[a, a] += alpha
        if indptr[t + 1] == indptr[t]:
            out[t, :] = 0.0
        elif alpha > 0.0:
            out[t, :] = np.linalg.solve(G, b)
        else:
            out[t, :] = np.linalg.lstsq(G, b)[0]
