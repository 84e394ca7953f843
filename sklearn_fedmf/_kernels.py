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

__all__ = [
    "grad_rows",
    "grad_cols",
    "squared_error",
    "values_at",
    "ridge_fold_in",
    "prox_grad_rows",
    "linearized_cols",
    "squared_distance",
]

_jit = njit(cache=True, nogil=True, fastmath=False)
# Small helpers are inlined into the loops that call them (numba IR inlining): a call per
# entry or per step would otherwise cost more than the arithmetic.
_inline = njit(cache=True, nogil=True, inline="always")


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


@_inline
def _prox_entry(x, l1, shrink, positive):
    """Entrywise prox of the elastic net (``sklearn_fedmf._prox.prox_elastic_net``)."""
    if positive:
        z = x - l1
        z = z if z > 0.0 else 0.0
    elif l1 != 0.0:
        z = abs(x) - l1
        z = (1.0 if x > 0.0 else -1.0 if x < 0.0 else 0.0) * (z if z > 0.0 else 0.0)
    else:
        z = x
    return z / shrink


@_inline
def _gram_pays(nnz, r, n_steps):
    """Whether forming a row's ``r x r`` Gram once beats ``n_steps`` passes over its entries."""
    return nnz * (r * r + 2 * r) + n_steps * 2 * r * r < n_steps * 4 * r * nnz


@_inline
def _row_gram(indptr, indices, data, t, F, G, b):
    """``G = sum_j f_j f_j^T`` and ``b = sum_j m_tj f_j`` over the stored entries of row ``t``."""
    r = F.shape[1]
    G[:, :] = 0.0
    b[:] = 0.0
    for s in range(indptr[t], indptr[t + 1]):
        j = indices[s]
        for a in range(r):
            fa = F[j, a]
            b[a] += data[s] * fa
            for c in range(a, r):
                G[a, c] += fa * F[j, c]
    for a in range(r):
        for c in range(a):
            G[a, c] = G[c, a]


@_inline
def _row_gradient(indptr, indices, data, t, x, F, use_gram, G, b, g):
    """``g = sum_j (x . f_j - m_tj) f_j`` over row ``t``: from the Gram, or entry by entry."""
    r = F.shape[1]
    if use_gram:
        for a in range(r):
            acc = -b[a]
            for c in range(r):
                acc += G[a, c] * x[c]
            g[a] = acc
        return
    for a in range(r):
        g[a] = 0.0
    for s in range(indptr[t], indptr[t + 1]):
        j = indices[s]
        e = -data[s]
        for a in range(r):
            e += x[a] * F[j, a]
        for a in range(r):
            g[a] += e * F[j, a]


@_jit
def prox_grad_rows(indptr, indices, data, U, Wt, L, n_steps, l1, shrink, positive, out):
    """``n_steps`` proximal-gradient steps ``U <- prox(U - grad_U / L)`` with ``Wt`` fixed.

    Rows do not interact when ``Wt`` is fixed, so each row runs all its steps at once. Its
    gradient is ``G_t u - b_t`` with ``G_t = sum_j w_j w_j^T`` and ``b_t = sum_j m_tj w_j``;
    for rows with enough ratings these are formed once and each step costs ``O(r^2)``
    instead of a pass over the row's entries (the same iterates up to rounding).
    """
    r = U.shape[1]
    G = np.empty((r, r))
    b = np.empty(r)
    g = np.empty(r)
    u = np.empty(r)
    for t in range(U.shape[0]):
        use_gram = _gram_pays(indptr[t + 1] - indptr[t], r, n_steps)
        if use_gram:
            _row_gram(indptr, indices, data, t, Wt, G, b)
        for a in range(r):
            u[a] = U[t, a]
        for _ in range(n_steps):
            _row_gradient(indptr, indices, data, t, u, Wt, use_gram, G, b, g)
            for a in range(r):
                u[a] = _prox_entry(u[a] - g[a] / L, l1, shrink, positive)
        for a in range(r):
            out[t, a] = u[a]


@_jit
def linearized_cols(indptr, indices, data, U, Wt, target, L, beta, n_clients, n_steps, out,
                    out_prev):
    """FedMC-ADMM's W loop, one item column at a time (columns do not interact).

    ``indptr/indices/data`` are the client's block transposed (items x users, CSR). Each step
    is ``w <- (L w + target - h / p) / (L + beta)`` with ``h = U^T P_Omega(U w - m)`` for the
    column (from the column's Gram when that pays, as in :func:`prox_grad_rows`); ``L`` is
    already divided by ``p``. ``out_prev`` receives the last step's starting point.
    """
    r = U.shape[1]
    G = np.empty((r, r))
    b = np.empty(r)
    h = np.empty(r)
    w = np.empty(r)
    # Multiplying by inverses instead of dividing: this loop is division-bound otherwise.
    keep = L / (L + beta)
    inv_denom = 1.0 / (L + beta)
    inv_p = 1.0 / n_clients
    # A column no user of the client rated has h = 0: the steps are the affine map
    # w <- keep * w + c, whose k-fold composition is keep^k w + c (1 - keep^k) / (1 - keep).
    last, before = keep**n_steps, keep ** (n_steps - 1)
    sum_last = (1.0 - last) / (1.0 - keep) * inv_denom
    sum_before = (1.0 - before) / (1.0 - keep) * inv_denom
    for j in range(Wt.shape[0]):
        nnz = indptr[j + 1] - indptr[j]
        if nnz == 0:
            for a in range(r):
                out_prev[j, a] = before * Wt[j, a] + sum_before * target[j, a]
                out[j, a] = last * Wt[j, a] + sum_last * target[j, a]
            continue
        use_gram = _gram_pays(nnz, r, n_steps)
        if use_gram:
            _row_gram(indptr, indices, data, j, U, G, b)
        for a in range(r):
            w[a] = Wt[j, a]
        for step in range(n_steps):
            if step == n_steps - 1:
                for a in range(r):
                    out_prev[j, a] = w[a]
            _row_gradient(indptr, indices, data, j, w, U, use_gram, G, b, h)
            for a in range(r):
                w[a] = keep * w[a] + (target[j, a] - h[a] * inv_p) * inv_denom
        for a in range(r):
            out[j, a] = w[a]


@_jit
def squared_distance(A, B):
    """``||A - B||_F^2`` for two arrays of the same 2-D shape."""
    total = 0.0
    for i in range(A.shape[0]):
        for a in range(A.shape[1]):
            d = A[i, a] - B[i, a]
            total += d * d
    return total
