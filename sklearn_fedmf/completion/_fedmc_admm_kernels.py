"""Numba kernels of FedMC-ADMM's client and server steps (its Algorithm 1).

:func:`linearized_cols` runs a client's ``N`` linearized W-steps over its item columns (the
W-update of Algorithm 1); :func:`replace_and_accumulate` updates the server's running sum of
``W_i + Y_i / beta``; :func:`squared_distance` measures the consensus gap. They build on the
shared row kernels of :mod:`sklearn_fedmf._kernels` (Gram gathering, row gradients), whose
conventions they follow: C-contiguous factors, item factors passed transposed, reductions
compiled with ``_reduce`` so that results do not depend on ``n_jobs`` or the backend.
``tests/test_kernels.py`` checks them against dense numpy oracles.
"""

import numpy as np

from .._kernels import _gram_buffers, _gram_pays, _jit, _reduce, _row_gradient, _row_gram

__all__ = ["linearized_cols", "squared_distance", "replace_and_accumulate"]


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
      :func:`sklearn_fedmf._kernels.prox_grad_rows`), else entry by entry.

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
