"""Kernels on the observed entries of a CSR rating block.

Each kernel fuses the sampled dense-dense product (the residual ``e = P_Omega(U W - M)`` at the
stored entries only) with the sparse-dense product that consumes it, in one pass over the
entries and without allocating an ``nnz x r`` gather. They are compiled with numba (``nogil``,
so joblib's threading backend runs clients truly in parallel; ``cache`` so the compilation is
paid once per machine). ``tests/test_kernels.py`` checks each against a dense numpy oracle;
``benchmarks/bench_fedmcadmm.py`` times them, inside the estimator, against a plain
numpy/scipy implementation of the same algorithm.

Reductions that LLVM may vectorize are compiled with ``fastmath={"reassoc", "contract"}``
(``_reduce``): their summation order then depends on the length only, not on the alignment of
the arrays, so results stay the same for any ``n_jobs`` and backend.

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
    "replace_and_accumulate",
    "gram_of_rows",
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
    """``||P_Omega(U Wt^T - M)||^2`` without any output array.

    Four entries at a time into four partial sums: one running sum makes every entry wait for
    the previous addition (the loop is latency-bound otherwise; 1.3x).
    """
    r = U.shape[1]
    l0 = l1 = l2 = l3 = 0.0
    for t in range(U.shape[0]):
        s, hi = indptr[t], indptr[t + 1]
        while s + 4 <= hi:
            j0, j1, j2, j3 = indices[s], indices[s + 1], indices[s + 2], indices[s + 3]
            e0, e1, e2, e3 = -data[s], -data[s + 1], -data[s + 2], -data[s + 3]
            for a in range(r):
                u = U[t, a]
                e0 += u * Wt[j0, a]
                e1 += u * Wt[j1, a]
                e2 += u * Wt[j2, a]
                e3 += u * Wt[j3, a]
            l0 += e0 * e0
            l1 += e1 * e1
            l2 += e2 * e2
            l3 += e3 * e3
            s += 4
        while s < hi:
            j, e = indices[s], -data[s]
            for a in range(r):
                e += U[t, a] * Wt[j, a]
            l0 += e * e
            s += 1
    return (l0 + l1) + (l2 + l3)


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


# Reassociating lets LLVM vectorize the reductions. The summation order then depends only on
# the length (no peeling for alignment: tested), so results stay the same for any n_jobs.
_reduce = njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})


@_reduce
def _gram_of_gathered(Bt, k, x, G, b):
    """``G = Bt[:, :k] Bt[:, :k]^T`` and ``b = Bt[:, :k] x[:k]`` as contiguous dot products."""
    r = Bt.shape[0]
    for a in range(r):
        Ba = Bt[a]
        acc = 0.0
        for s in range(k):
            acc += x[s] * Ba[s]
        b[a] = acc
        for c in range(a, r):
            Bc = Bt[c]
            acc = 0.0
            for s in range(k):
                acc += Ba[s] * Bc[s]
            G[a, c] = acc
            G[c, a] = acc


@_reduce
def gram_of_rows(F, G):
    """``G = F F^T`` for a C-contiguous ``(r, n)`` ``F``; returns ``||G||_F``."""
    r = F.shape[0]
    norm = 0.0
    for a in range(r):
        Fa = F[a]
        for c in range(a, r):
            Fc = F[c]
            acc = 0.0
            for j in range(F.shape[1]):
                acc += Fa[j] * Fc[j]
            G[a, c] = acc
            G[c, a] = acc
            norm += acc * acc if a == c else 2.0 * acc * acc
    return np.sqrt(norm)


@_inline
def _row_gram(indptr, indices, data, t, F, Bt, x, G, b):
    """``G = sum_j f_j f_j^T`` and ``b = sum_j m_tj f_j`` over the stored entries of row ``t``.

    The row's factors are gathered into the rows of ``Bt`` (``r x k``, at least ``k`` long)
    first: accumulating into ``G`` entry by entry is bound by the latency of its updates
    (2.3x slower).
    """
    lo, k = indptr[t], indptr[t + 1] - indptr[t]
    for s in range(k):
        j = indices[lo + s]
        x[s] = data[lo + s]
        for a in range(F.shape[1]):
            Bt[a, s] = F[j, a]
    _gram_of_gathered(Bt, k, x, G, b)


@_inline
def _gram_buffers(indptr, r, n_steps):
    """Gather buffers long enough for every row of ``indptr`` whose Gram pays."""
    longest = 0
    for t in range(len(indptr) - 1):
        k = indptr[t + 1] - indptr[t]
        if k > longest and _gram_pays(k, r, n_steps):
            longest = k
    return np.empty((r, longest)), np.empty(longest)


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
def prox_grad_rows(indptr, indices, data, U, Wt, L, n_steps, l1, shrink, positive, ridge, out):
    """``n_steps`` proximal-gradient steps ``U <- prox(U - (grad_U + ridge U) / L)``, ``Wt``
    fixed (``ridge``: a squared-l2 term taken in the gradient rather than in the prox).

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
    Bt, x = _gram_buffers(indptr, r, n_steps)
    for t in range(U.shape[0]):
        use_gram = _gram_pays(indptr[t + 1] - indptr[t], r, n_steps)
        if use_gram:
            _row_gram(indptr, indices, data, t, Wt, Bt, x, G, b)
        for a in range(r):
            u[a] = U[t, a]
        for _ in range(n_steps):
            _row_gradient(indptr, indices, data, t, u, Wt, use_gram, G, b, g)
            for a in range(r):
                u[a] = _prox_entry(u[a] - (g[a] + ridge * u[a]) / L, l1, shrink, positive)
        for a in range(r):
            out[t, a] = u[a]


@_jit
def linearized_cols(indptr, indices, data, U, Wt, target, L, beta, n_clients, n_steps, out,
                    out_prev):
    """FedMC-ADMM's W loop over the item columns (which do not interact).

    ``indptr/indices/data`` are the client's block transposed (items x users, CSR); ``Wt``,
    ``target``, ``out`` and ``out_prev`` must be C-contiguous. Each step
    is ``w <- (L w + target - h / p) / (L + beta)`` with ``h = U^T P_Omega(U w - m)`` for the
    column; ``L`` is already divided by ``p``. ``out_prev`` receives the last step's starting
    point. So a step is the affine map ``w <- keep w + c - gamma B^T B w``, with ``B`` the
    ``k x r`` factors of the column's ``k`` raters and ``c`` the data and target terms:

    * ``k = 0``: the closed form ``w_N = keep^N w_0 + sigma_N c``, ``sigma_t = sum_{q<t} keep^q``;
    * ``0 < k < r``: ``w_t = keep^t w_0 + sigma_t c - gamma B^T a_t``, where ``s_t = B w_t`` and
      ``a_t = sum_{q<t} keep^(t-1-q) s_q`` follow ``s <- (keep I - gamma B B^T) s + B c``,
      ``a <- keep a + s`` (``a_0 = 0``): ``O(k^2)`` a step instead of ``O(k r)``;
    * ``k >= r``: ``w <- (keep I - gamma B^T B) w + c`` from the Gram when that pays (as in
      :func:`prox_grad_rows`), else entry by entry.

    Most columns of a small client hold 1-3 ratings, and one column's steps form a chain of
    dependent operations too short to keep the core busy. So the steps run step-major over
    all the columns (their chains then overlap), on state packed once per call.
    """
    r = U.shape[1]
    n = Wt.shape[0]
    keep = L / (L + beta)
    inv_denom = 1.0 / (L + beta)
    inv_p = 1.0 / n_clients  # multiplying by inverses: the loops are division-bound otherwise
    gamma = inv_denom * inv_p
    # keep^N, keep^(N-1) and sigma_N, sigma_(N-1) by recursion (no 1 / (1 - keep)).
    pow_last, pow_before, sigma_last, sigma_before = 1.0, 1.0, 0.0, 0.0
    for _ in range(n_steps):
        pow_before, sigma_before = pow_last, sigma_last
        pow_last, sigma_last = keep * pow_last, keep * sigma_last + 1.0
    # Every column starts from the part of its solution that ignores its ratings, the closed
    # form w_t = keep^t w_0 + sigma_t t_j / (L + beta); the rated columns then correct it.
    # (Flat views: one long vectorized loop; all four arrays are C-contiguous.)
    w0, t0 = Wt.reshape(Wt.size), target.reshape(target.size)
    o, o_prev = out.reshape(out.size), out_prev.reshape(out_prev.size)
    c_last, c_before = sigma_last * inv_denom, sigma_before * inv_denom
    for i in range(w0.size):
        o_prev[i] = pow_before * w0[i] + c_before * t0[i]
        o[i] = pow_last * w0[i] + c_last * t0[i]
    # Pack the rated columns' state once, structure-of-arrays: few-rater columns grouped by
    # k, Gram columns in one group; entry (q, f) of a group at [start + q * count + f] for its
    # f-th column. The steps then run as long loops over a group's columns (vectorized, no
    # branch misses); column by column, the short varying trip counts cost more than the
    # arithmetic.
    count = np.zeros(r + 1, np.int64)  # count[r]: the Gram columns
    for j in range(n):
        k = indptr[j + 1] - indptr[j]
        if 0 < k < r:
            count[k] += 1
        elif k >= r and _gram_pays(k, r, n_steps):
            count[r] += 1
    vec_at, mat_at, col_at = (np.zeros(r + 2, np.int64), np.zeros(r + 2, np.int64),
                              np.zeros(r + 2, np.int64))
    for k in range(1, r + 1):
        vec_at[k + 1] = vec_at[k] + count[k] * k
        mat_at[k + 1] = mat_at[k] + count[k] * k * k
        col_at[k + 1] = col_at[k] + count[k]
    cols = np.empty(col_at[r + 1], np.int64)
    # S: s_t (few) or w_t (Gram); D: B c (few) or c (Gram); A: each column's step matrix.
    S, D, A = np.empty(vec_at[r + 1]), np.empty(vec_at[r + 1]), np.empty(mat_at[r + 1])
    acc, acc_prev = np.zeros(vec_at[r]), np.zeros(vec_at[r])
    T = np.empty(max(np.max(count * np.arange(r + 1)), 1))
    G, b, h, w = np.empty((r, r)), np.empty(r), np.empty(r), np.empty(r)
    Bt, x = _gram_buffers(indptr, r, n_steps)
    filled = np.zeros(r + 1, np.int64)
    for j in range(n):
        lo, k = indptr[j], indptr[j + 1] - indptr[j]
        if k == 0:
            continue
        use_gram = k >= r and _gram_pays(k, r, n_steps)
        if k >= r and not use_gram:  # a few steps over many ratings: entry by entry
            for a in range(r):
                w[a] = Wt[j, a]
            for step in range(n_steps):
                if step == n_steps - 1:
                    for a in range(r):
                        out_prev[j, a] = w[a]
                _row_gradient(indptr, indices, data, j, w, U, False, G, b, h)
                for a in range(r):
                    w[a] = keep * w[a] + (target[j, a] - h[a] * inv_p) * inv_denom
            for a in range(r):
                out[j, a] = w[a]
            continue
        g_k = r if use_gram else k  # the group, and the dimension its steps run in
        f, n_g = filled[g_k], count[g_k]
        filled[g_k] += 1
        cols[col_at[g_k] + f] = j
        v, m = vec_at[g_k] + f, mat_at[g_k] + f
        if use_gram:
            _row_gram(indptr, indices, data, j, U, Bt, x, G, b)
            for a in range(r):
                S[v + a * n_g] = Wt[j, a]
                D[v + a * n_g] = target[j, a] * inv_denom + gamma * b[a]
                for e in range(r):
                    A[m + (a * r + e) * n_g] = -gamma * G[a, e]
                A[m + (a * r + a) * n_g] += keep
            continue
        # G holds the raters' inner products K = B B^T; b their dot products with t_j.
        for q in range(k):
            iq = indices[lo + q]
            s, tq = 0.0, 0.0
            for a in range(r):
                s += U[iq, a] * Wt[j, a]
                tq += U[iq, a] * target[j, a]
            S[v + q * n_g], b[q] = s, tq
            for q2 in range(q + 1):
                i2 = indices[lo + q2]
                g = 0.0
                for a in range(r):
                    g += U[iq, a] * U[i2, a]
                G[q, q2] = g
                G[q2, q] = g
        for q in range(k):
            d = 0.0
            for q2 in range(k):
                d += G[q, q2] * data[lo + q2]
                A[m + (q * k + q2) * n_g] = -gamma * G[q, q2]
            A[m + (q * k + q) * n_g] += keep
            D[v + q * n_g] = b[q] * inv_denom + gamma * d  # B c, c = t_j/(L+beta) + gamma B^T x
    # Views with zero-based loop indices: an index `start + f` would keep numba's
    # negative-index wraparound in the loop and block its vectorization.
    for step in range(n_steps):
        last = step == n_steps - 1
        for k in range(1, r + 1):
            n_g, v0, m0 = count[k], vec_at[k], mat_at[k]
            Sg, Tg = S[v0:v0 + k * n_g], T[:k * n_g]
            for q in range(k):
                Tq, Dq = Tg[q * n_g:(q + 1) * n_g], D[v0 + q * n_g:v0 + (q + 1) * n_g]
                for f in range(n_g):
                    Tq[f] = Dq[f]
                for q2 in range(k):
                    Aq = A[m0 + (q * k + q2) * n_g:m0 + (q * k + q2 + 1) * n_g]
                    Sq = Sg[q2 * n_g:(q2 + 1) * n_g]
                    for f in range(n_g):
                        Tq[f] += Aq[f] * Sq[f]
            if k < r:
                accg, acc_prevg = acc[v0:v0 + k * n_g], acc_prev[v0:v0 + k * n_g]
                if last:
                    for i in range(k * n_g):
                        acc_prevg[i] = accg[i]
                for i in range(k * n_g):
                    accg[i] = keep * accg[i] + Sg[i]
            elif last:
                for f in range(n_g):
                    for a in range(r):
                        out_prev[cols[col_at[r] + f], a] = Sg[a * n_g + f]
            for i in range(k * n_g):
                Sg[i] = Tg[i]
    for f in range(count[r]):
        for a in range(r):
            out[cols[col_at[r] + f], a] = S[vec_at[r] + a * count[r] + f]
    # Few-rater columns: w_t = (the closed form above) + gamma sum_q (sigma_t x_q - a_t,q) u_q.
    for k in range(1, r):
        n_g = count[k]
        for f in range(n_g):
            j, v = cols[col_at[k] + f], vec_at[k] + f
            lo = indptr[j]
            for q in range(k):
                c_last = gamma * (sigma_last * data[lo + q] - acc[v + q * n_g])
                c_before = gamma * (sigma_before * data[lo + q] - acc_prev[v + q * n_g])
                iq = indices[lo + q]
                for a in range(r):
                    out[j, a] += c_last * U[iq, a]
                    out_prev[j, a] += c_before * U[iq, a]


@_reduce
def squared_distance(A, B):
    """``||A - B||_F^2`` for two C-contiguous arrays of the same 2-D shape."""
    a, b = A.reshape(A.size), B.reshape(B.size)
    total = 0.0
    for i in range(a.size):
        d = a[i] - b[i]
        total += d * d
    return total


@_jit
def replace_and_accumulate(Z_i, total, W, Y, beta):
    """``total += (W + Y / beta) - Z_i``, then ``Z_i = W + Y / beta``, in one pass.

    The FedMC-ADMM server's update of one client's term of its running sum; the numpy
    expression makes about twice as many passes over these ``n_items x r`` arrays, all of them
    C-contiguous.
    """
    z_i, t, w, y = Z_i.reshape(Z_i.size), total.reshape(total.size), W.reshape(W.size), \
        Y.reshape(Y.size)
    for k in range(z_i.size):
        z = w[k] + y[k] / beta
        t[k] += z - z_i[k]
        z_i[k] = z
