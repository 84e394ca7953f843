"""Numba kernels of FedMC-ADMM's client and server steps (its Algorithm 1).

:func:`linearized_cols` runs a client's ``N`` linearized W-steps over its item columns (the
W-update of Algorithm 1); :func:`replace_and_accumulate` updates the server's running sum of
``W_i + Y_i / beta``; the consensus gap is the shared
:func:`~sklearn_fedmf._kernels.squared_distance`. They build on the
shared row kernels of :mod:`sklearn_fedmf._kernels` (Gram gathering, row gradients), whose
conventions they follow: C-contiguous factors, item factors passed transposed, sums whose
order does not depend on ``n_jobs`` or the backend.
``tests/test_kernels.py`` checks them against dense numpy oracles.
"""

from collections import namedtuple

import numpy as np

from ..._kernels import (
    _gram_buffers,
    _gram_of_gathered,
    _gram_pays,
    _inline,
    _jit,
    _prox_entry,
    _prox_grad_rows,
    _row_gradient,
    _row_gram,
    squared_distance,
)
from ._prefetch import prefetch

__all__ = ["linearized_cols", "squared_distance", "replace_and_accumulate", "group_update",
           "lazy_consensus", "GroupRatings", "ClientRows", "RoundSettings", "GroupOutput"]


# The arrays of the group kernels travel in named tuples (numba takes one as one argument and
# reads its fields at no cost); :func:`group_update` uses the names.
class GroupRatings(namedtuple("GroupRatings", "indptr data row_ptr entry_ptr loc E e_ptr")):
    """A group's ratings (CSR), its clients' rows and ratings, their explicit rows."""

    __slots__ = ()


class ClientRows(namedtuple("ClientRows", "W Y BW BY cached w_at hist coef maps h_at h_len "
                                          "from_v0 V0 H")):
    """The clients' explicit values, their combinations' values there (``BW``, ``BY`` at
    ``w_at`` when ``cached``, else empty and made from the maps: :func:`_combination_rows`),
    broadcasts, coefficients and maps."""

    __slots__ = ()


class RoundSettings(namedtuple("RoundSettings", "n_clients beta n_steps alpha_u l1_ratio "
                                                "positive biased exact eps")):
    """The scalars of a client's round (``exact``: Remark 4.1's W update)."""

    __slots__ = ()


class GroupOutput(namedtuple("GroupOutput", "U W Y BW BY at hist coef maps h_ptr D d_ptr")):
    """Where :func:`group_update` writes (``U_out``, ``W_out``, ..., ``out_at``, ...)."""

    __slots__ = ()


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


# ---- many small clients: lazy item-side states (``_fedmc_admm_batched``) -----------------
# A client's copies W_i, Y_i are held as explicit rows (its rated items) plus, for every other
# row, a combination sum_t c_t V^(h_t) of the broadcasts it received (the W loop and the dual
# step act on an unrated row as the same affine map for every such row). ``H`` stacks those
# broadcasts (m, n_items, r) and ``G[t, u] = H[t]^T H[u]`` their Gram blocks. A client
# also needs the values of its combinations on its explicit rows (``BW``, ``BY``): either
# held in the state (``cached``: the same affine map updates them, so no round reads ``H``;
# ``2 r`` float64 numbers per rating) or made when a round reads them, by the affine maps of
# the rounds it took part in (kept with its coefficients, four numbers each) from their
# start: the same arithmetic, in the same order, as updating them round by round
# (:func:`_combination_rows`; at 1 % of the clients per round a client took part in a round
# or two, but each round read is a random row of ``H``: the metric of every client costs
# several times the cached one, so the state keeps them when it has the memory).


_AHEAD = 8  # rows prefetched ahead (measured: 8 and 16 alike, 32 slower)


@_jit
def _combination_rows(Ec, hist, maps, from_v0, V0, H, BW, BY, beta):
    """``BW``, ``BY``: the values of a client's combinations (``W`` and ``Y``) on its explicit
    rows ``Ec``. They start as ``V0``'s rows and 0 (``from_v0``: its first broadcast is the
    start, ``W_i^0 = V^0``) or as 0 (a client whose copies were set explicitly); each later
    broadcast ``hist[q]`` carries the map ``maps[q] = (p, c_y, c_v, keep)`` of the round that
    received it: ``w <- p w - c_y y + c_v v`` and ``y <- y + beta w - beta v`` (``keep`` 1)
    or 0 (Remark 4.1's exact W update), with ``v`` the broadcast's row. Broadcast by
    broadcast over the rows (the rows' reads of one broadcast are independent: they overlap
    in memory, the next rows prefetched); each entry's chain is the same."""
    k, r = BW.shape
    for e in range(k):
        j = Ec[e]
        for a in range(r):
            BW[e, a] = np.float64(V0[j, a]) if from_v0 else 0.0
            BY[e, a] = 0.0
    for q in range(1 if from_v0 else 0, hist.size):
        p, c_y, c_v, keep = maps[q, 0], maps[q, 1], maps[q, 2], maps[q, 3]
        Hq = H[hist[q]]
        for e in range(min(_AHEAD, k)):
            prefetch(Hq, Ec[e], 0)
        for e in range(k):
            if e + _AHEAD < k:  # (a random row of a large history: asked for ahead)
                prefetch(Hq, Ec[e + _AHEAD], 0)
            j = Ec[e]
            for a in range(r):
                v = Hq[j, a]
                bw = p * BW[e, a] - c_y * BY[e, a] + c_v * v
                BW[e, a] = bw
                BY[e, a] = BY[e, a] + beta * bw - beta * v if keep != 0.0 else 0.0


@_jit
def _combination_gram(hist, coef, col, G, r, out):
    """``out[:r, :r] = M^T M`` (its leading ``r`` columns) of the combination ``M = sum_q
    coef[q, col] H[hist[q]]`` over all rows, from the Gram blocks; upper triangle only."""
    out[:r, :r] = 0.0
    for q in range(hist.size):  # G[u, t] = G[t, u]^T: each pair once
        cq = coef[q, col]
        Gq = G[hist[q], hist[q]]
        c = cq * cq
        for a in range(r):
            for b in range(a, r):
                out[a, b] += c * Gq[a, b]
        for q2 in range(q + 1, hist.size):
            c = cq * coef[q2, col]
            Gq = G[hist[q], hist[q2]]
            for a in range(r):
                for b in range(a, r):
                    out[a, b] += c * (Gq[a, b] + Gq[b, a])


@_jit
def _implicit_gram(Wc, BWc, hist, coef, col, G, out):
    """``out = W^T W`` of a whole ``n_items x r`` copy held implicitly: the Gram of its
    combination (coefficients ``coef[:, col]``) over all rows, minus the combination's rows
    ``BWc`` where the copy is explicit, plus the explicit values ``Wc``."""
    r = Wc.shape[1]
    _combination_gram(hist, coef, col, G, r, out)
    for e in range(Wc.shape[0]):
        for a in range(r):
            wa, ba = Wc[e, a], BWc[e, a]
            for b in range(a, r):
                out[a, b] += wa * Wc[e, b] - ba * BWc[e, b]
    for a in range(r):
        for b in range(a):
            out[a, b] = out[b, a]


@_inline
def _unrated_map(L, beta, n_steps):
    """``(keep, 1 / (L + beta), keep^N, sigma_N)`` of :func:`linearized_cols`'s ``k = 0``
    closed form ``w_N = keep^N w_0 + sigma_N c``, ``sigma_N = sum_{q<N} keep^q``."""
    keep, inv_denom = L / (L + beta), 1.0 / (L + beta)
    pow_last, sigma_last = 1.0, 0.0
    for _ in range(n_steps):
        pow_last, sigma_last = keep * pow_last, keep * sigma_last + 1.0
    return keep, inv_denom, pow_last, sigma_last


@_jit
def _one_rater_cols(u, lc, dat, Wc, target, L, beta, n_clients, n_steps, out):
    """:func:`linearized_cols` for a client of one row ``u`` (a column has 0 or 1 rating:
    ``dat[s]`` at column ``lc[s]``), with the same arithmetic as its ``k = 0`` and ``k = 1``
    cases, without its packing (one user per client: the common case)."""
    r, k = u.size, Wc.shape[0]
    keep, inv_denom, pow_last, sigma_last = _unrated_map(L, beta, n_steps)
    gamma = inv_denom * (1.0 / n_clients)
    c_last = sigma_last * inv_denom
    for e in range(k):
        for a in range(r):
            out[e, a] = pow_last * Wc[e, a] + c_last * target[e, a]
    K = 0.0
    for a in range(r):
        K += u[a] * u[a]
    A = -gamma * K + keep
    for s in range(lc.size):
        e, x = lc[s], dat[s]
        S, tq = 0.0, 0.0
        for a in range(r):
            S += u[a] * Wc[e, a]
            tq += u[a] * target[e, a]
        D = tq * inv_denom + gamma * (K * x)
        acc = 0.0
        for _ in range(n_steps):
            T = D + A * S
            acc = keep * acc + S
            S = T
        c = gamma * (sigma_last * x - acc)
        for a in range(r):
            out[e, a] += c * u[a]


@_jit
def _one_user(client, G, V, settings, buffers, out):
    """:func:`group_update`'s linearized round for a client of one row ``u`` whose explicit
    rows are exactly its ``k`` rated items (rating ``s`` on row ``s``, ``dat[s]``), fused into
    two passes over its rows (``Dn``: the term's deviations, as :func:`group_update`).
    ``client`` is ``(u, dat, Ec, Wc, Yc, BWc, BYc, hist, coef)`` (its slices of the group's
    arrays), ``buffers`` the caller's scratch arrays and ``out`` ``(u_out, Wn, Yn, BWn, BYn,
    Dn)``. ``u_out``'s columns past the free ones are left to the caller (the biases' fixed
    ones). Returns the W loop's ``L``.

    One gather serves both Grams of (a): the rated items are all the explicit rows, so the
    U loop's Gram (the one :func:`~sklearn_fedmf._kernels._prox_grad_rows` gathers, with the
    same arithmetic) is the explicit part of ``W_i^T W_i``. A column of one rater steps
    ``s <- D + A s``, ``acc <- keep acc + s`` (the ``k = 1`` case of
    :func:`linearized_cols`) with ``A`` and ``keep`` shared by the client's columns, so
    ``acc_N = alpha s_0 + delta D`` with two scalars that the same recursion gives once.
    """
    u, dat, Ec, Wc, Yc, BWc, BYc, hist, coef = client
    n_clients, beta, n_steps, alpha_u, l1_ratio, positive, biased, _, eps = settings
    Bt, x, GW, P, Q, b, g = buffers
    u_out, Wn, Yn, BWn, BYn, Dn = out
    k, r = Wc.shape
    free = r - 1 if biased else r
    positive = positive and not biased  # (the biases' U may be negative)
    # (a) U loop: the free columns' Gram and right side (ratings minus b_i with biases)
    for s in range(k):
        x[s] = dat[s] - Wc[s, r - 1] if free < r else dat[s]
        for a in range(free):
            Bt[a, s] = Wc[s, a]
    _gram_of_gathered(Bt[:free], k, x, P, b)
    for s in range(k):
        for a in range(free):
            Bt[a, s] = BWc[s, a]
    _gram_of_gathered(Bt[:free], k, x, Q, g)
    _combination_gram(hist, coef, 0, G, free, GW)
    total = 0.0
    for a in range(free):
        for c in range(free):
            w = GW[min(a, c), max(a, c)] + P[a, c] - Q[a, c]
            total += w * w
    L_W = max(np.sqrt(total), eps)
    step = 1.0 / L_W
    l1, shrink = step * alpha_u * l1_ratio, 1.0 + step * alpha_u * (1.0 - l1_ratio)
    for a in range(free):
        u_out[a] = u[a]
    for _ in range(n_steps):
        for a in range(free):
            acc = -b[a]
            for c in range(free):
                acc += P[a, c] * u_out[c]
            g[a] = acc
        for a in range(free):
            u_out[a] = _prox_entry(u_out[a] - (g[a] + 0.0 * u_out[a]) / L_W, l1, shrink,
                                   positive)
    for a in range(free, r):
        u_out[a] = u[a]  # (the caller's: 1 with biases)
    # (b) W loop, (c) dual step and the combinations' rows, one pass
    K = 0.0
    for a in range(r):
        for c in range(r):
            K += (u_out[a] * u_out[c]) ** 2
    L = max(np.sqrt(K), eps) / n_clients
    K = 0.0
    for a in range(r):
        K += u_out[a] * u_out[a]
    keep, inv_denom, pow_last, sigma_last = _unrated_map(L, beta, n_steps)
    gamma = inv_denom * (1.0 / n_clients)
    A = -gamma * K + keep
    s_a, acc_a, s_d, acc_d = 1.0, 0.0, 0.0, 0.0  # acc_N for (s_0, D) = (1, 0) and (0, 1)
    for _ in range(n_steps):
        acc_a, s_a = keep * acc_a + s_a, A * s_a
        acc_d, s_d = keep * acc_d + s_d, 1.0 + A * s_d
    c_last = sigma_last * inv_denom
    w_v = c_last * beta  # the combinations' coefficient of V (group_update's map)
    for e in range(k):
        j, xe = Ec[e], dat[e]
        s0, tq = 0.0, 0.0
        for a in range(r):
            t = beta * V[j, a] - Yc[e, a]
            g[a] = t
            s0 += u_out[a] * Wc[e, a]
            tq += u_out[a] * t
        D = tq * inv_denom + gamma * (K * xe)
        c = gamma * (sigma_last * xe - (acc_a * s0 + acc_d * D))
        for a in range(r):
            v = V[j, a]
            Wn[e, a] = pow_last * Wc[e, a] + c_last * g[a] + c * u_out[a]
            Yn[e, a] = Yc[e, a] + beta * (Wn[e, a] - v)  # (from W as stored: float32 data)
            bw = pow_last * BWc[e, a] - c_last * BYc[e, a] + w_v * v
            by = BYc[e, a] + beta * bw - beta * v
            BWn[e, a], BYn[e, a] = bw, by
            Dn[e, a] = (Wn[e, a] - bw) + (Yn[e, a] - by) / beta
    return L


@_jit
def _frobenius(M, k):
    """``||M[:k, :k]||_F``."""
    total = 0.0
    for a in range(k):
        for b in range(k):
            total += M[a, b] * M[a, b]
    return np.sqrt(total)


@_jit
def group_update(ratings, clients, rows, U, V, G, kk, settings, out):
    """One FedMC-ADMM round (Algorithm 1, step 3) of each client of ``clients`` in a group.

    ``ratings`` is a :class:`GroupRatings`, ``rows`` a :class:`ClientRows`, ``settings`` a
    :class:`RoundSettings` and ``out`` a :class:`GroupOutput` (``U_out`` below is
    ``out.U``, ``W_out`` ``out.W``, and so on; ``out_at`` is ``out.at``, ``hout_ptr``
    ``out.h_ptr``).

    Client ``c = clients[a]`` owns the group rows ``row_ptr[c]:row_ptr[c + 1]`` (ratings
    ``entry_ptr[c]:entry_ptr[c + 1]``); its ``k`` explicit rows are ``E[e_ptr[c]:e_ptr[c +
    1]]`` with values ``W``, ``Y`` at ``w_at[c]:w_at[c] + k``; ``loc`` gives each of its
    ratings the position of its item in those rows (empty: the rating's own position among
    the client's); its implicit rows are ``sum_q coef[q, 0]
    H[hist[q]]`` (``W``) and ``sum_q coef[q, 1] H[hist[q]]`` (``Y``) over ``q`` in
    ``h_at[c]:h_at[c] + h_len[c]``, whose values on the explicit rows ``BW``, ``BY`` are made
    from the maps ``maps`` there (:func:`_combination_rows`). ``V = H[kk]`` is the broadcast.

    Writes the new ``U`` rows into ``U_out``, the new explicit rows into ``W_out``, ``Y_out``
    at ``out_at[a]`` onwards and the new broadcasts, coefficients and maps into ``hist_out``,
    ``coef_out``, ``maps_out`` at ``hout_ptr[a]`` onwards (the old entries, then one for
    ``kk``). The outputs may be the input arrays: at other
    rows, or at the client's own rows (``out_at[a] == w_at[c]``: a client reads each of its
    rows before it writes it, and the W loops step from a copy). ``D_out`` receives, from
    ``d_ptr[a]``, the deviations ``(W - BW) + (Y - BY) / beta`` of the new term ``Z_i =
    W_i + Y_i / beta`` from its combination on the explicit rows: what the server stores of
    it (:func:`~._fedmc_admm_server_kernels.replace_terms`), formed while the rows are at
    hand. The linearized round divides only by floored or positive numbers and calls no
    checked solver, so it raises nothing but ``MemoryError``.

    The explicit rows run the per-client kernels (:func:`u_loop` and :func:`linearized_cols`
    of the same arithmetic; :func:`_one_user` for a client of one row); every implicit row
    takes the ``k = 0`` closed form of :func:`linearized_cols`, ``w_N = keep^N w_0 + sigma_N
    (beta v - y) / (L + beta)``, or Remark 4.1's ``v - y / beta`` (``exact``), as a map of the
    coefficients and of ``BW``, ``BY``.
    """
    indptr, data, row_ptr, entry_ptr, loc, E, e_ptr = ratings
    W, Y, BW, BY, cached, w_at, hist, coef, maps, h_at, h_len, from_v0, V0, H = rows
    n_clients, beta, n_steps, alpha_u, l1_ratio, positive, biased, exact, eps = settings
    U_out, W_out, Y_out, BW_out, BY_out, out_at, hist_out, coef_out, maps_out, hout_ptr, D_out, \
        d_ptr = out
    r = U.shape[1]
    GW = np.empty((r, r))
    UU = np.empty((r, r))
    # per-call buffers, sized for the largest client (no allocation per client)
    m_max, k_max, s_max = 1, 1, 1
    for a in range(clients.size):
        c = clients[a]
        m_max = max(m_max, row_ptr[c + 1] - row_ptr[c])
        k_max = max(k_max, e_ptr[c + 1] - e_ptr[c])
        s_max = max(s_max, indptr[row_ptr[c + 1]] - indptr[row_ptr[c]])
    target = np.empty((k_max, r), W.dtype)
    ip = np.empty(m_max + 1, indptr.dtype)
    L_rows, l1_rows = np.empty((m_max, r)), np.empty((m_max, r))
    shrink_rows, ridge_rows = np.empty(m_max), np.zeros(m_max)
    free = r - 1 if biased else r
    if biased:
        dat = np.empty(s_max, data.dtype)
        Uf, outf = np.empty((m_max, r - 1), U.dtype), np.empty((m_max, r - 1), U.dtype)
        Wf = np.empty((k_max, r - 1), W.dtype)
        # contiguous steps and a run-time False (``positive``), and the transposed blocks
        # indexed as ``indptr`` below: the per-client calls' types (one compilation each)
        Lf_rows, l1f_rows = np.empty((m_max, r - 1)), np.empty((m_max, r - 1))
        no_sign = bool(0)
    if exact:
        gram, rhs = np.empty((k_max, r, r)), np.empty((k_max, r))
        g, x = np.empty((r, r)), np.empty(r)
    Bt, xg = np.empty((r, k_max)), np.empty(k_max)
    W_from = np.empty((k_max, r), W.dtype)  # the W loops' start (W_out may be W)
    ident = np.arange(s_max).astype(loc.dtype)  # (the positions when ``loc`` is empty)
    BWs, BYs = np.empty((k_max, r)), np.empty((k_max, r))  # (made: a client's combinations')
    P, Q, bg, gg = np.empty((r, r)), np.empty((r, r)), np.empty(r), np.empty(r)
    for a in range(clients.size):
        c = clients[a]
        r0, r1 = row_ptr[c], row_ptr[c + 1]
        m = r1 - r0
        s0, s1 = indptr[r0], indptr[r1]
        k = e_ptr[c + 1] - e_ptr[c]
        w0, h0, o0, d0 = w_at[c], h_at[c], out_at[a], d_ptr[a]
        Ec, Wc, Yc = E[e_ptr[c]:e_ptr[c + 1]], W[w0:w0 + k], Y[w0:w0 + k]
        hc, cc, mc = hist[h0:h0 + h_len[c]], coef[h0:h0 + h_len[c]], maps[h0:h0 + h_len[c]]
        if cached:  # (read, and their maps written at the output rows)
            BWc, BYc = BW[w0:w0 + k], BY[w0:w0 + k]
            BWn, BYn = BW_out[o0:o0 + k], BY_out[o0:o0 + k]
        else:  # (made, then mapped in place below: each read before written)
            BWc, BYc = BWs[:k], BYs[:k]
            _combination_rows(Ec, hc, mc, from_v0[c], V0, H, BWc, BYc, beta)
            BWn, BYn = BWc, BYc
        lc = loc[entry_ptr[c]:entry_ptr[c + 1]] if loc.size else ident[:s1 - s0]
        if m == 1 and not exact and s1 - s0 == k and _gram_pays(k, free, n_steps):
            L = _one_user((U[r0], data[s0:s1], Ec, Wc, Yc, BWc, BYc, hc, cc), G, V, settings,
                          (Bt, xg, GW, P, Q, bg, gg),
                          (U_out[r0], W_out[o0:o0 + k], Y_out[o0:o0 + k], BWn, BYn,
                           D_out[d0:d0 + k]))
            if biased:
                U_out[r0, r - 1] = 1.0
            _map_coefficients(hc, cc, mc, kk, L, beta, n_steps, exact, hist_out, coef_out,
                              maps_out, hout_ptr[a])
            continue
        for t in range(m + 1):
            ip[t] = indptr[r0 + t] - s0
        ipc = ip[:m + 1]
        # (a) U loop against the client's own W_i (L_W over all its rows).
        _implicit_gram(Wc, BWc, hc, cc, 0, G, GW)
        L_W = max(_frobenius(GW, free), eps)
        step = 1.0 / L_W
        l1, shrink = step * alpha_u * l1_ratio, 1.0 + step * alpha_u * (1.0 - l1_ratio)
        L_rows[:m, :] = L_W
        l1_rows[:m, :] = l1
        shrink_rows[:m] = shrink
        if biased:  # the free columns [U, b_u] against [W, 1], ratings minus b_i (_biases)
            for s in range(s1 - s0):
                dat[s] = data[s0 + s] - Wc[lc[s], r - 1]
            for t in range(m):
                for b in range(r - 1):
                    Uf[t, b] = U[r0 + t, b]
            for e in range(k):
                for b in range(r - 1):
                    Wf[e, b] = Wc[e, b]
            Lf_rows[:m, :] = L_W
            l1f_rows[:m, :] = l1
            _prox_grad_rows(ipc, lc, dat[:s1 - s0], Uf[:m], Wf[:k], Lf_rows[:m], n_steps,
                            l1f_rows[:m], shrink_rows[:m], no_sign, ridge_rows[:m], outf[:m])
            for t in range(m):
                for b in range(r - 1):
                    U_out[r0 + t, b] = outf[t, b]
                U_out[r0 + t, r - 1] = 1.0
        else:
            _prox_grad_rows(ipc, lc, data[s0:s1], U[r0:r1], Wc, L_rows[:m], n_steps,
                            l1_rows[:m], shrink_rows[:m], positive, ridge_rows[:m],
                            U_out[r0:r1])
        Uc = U_out[r0:r1]
        # (b) W loop on the explicit rows: the client's block transposed onto them.
        UU[:, :] = 0.0
        for t in range(m):
            for b in range(r):
                for d in range(r):
                    UU[b, d] += Uc[t, b] * Uc[t, d]
        L = max(_frobenius(UU, r), eps) / n_clients
        tc = target[:k]
        for e in range(k):
            for b in range(r):
                tc[e, b] = beta * V[Ec[e], b] - Yc[e, b]
        Wn = W_out[o0:o0 + k]
        Wp = W_from[:k]
        Wp[:, :] = Wc
        if exact:
            gram[:k] = 0.0
            rhs[:k] = 0.0
            for t in range(m):
                for s in range(ipc[t], ipc[t + 1]):
                    e = lc[s]
                    for b in range(r):
                        rhs[e, b] += data[s0 + s] * Uc[t, b]
                        for d in range(r):
                            gram[e, b, d] += Uc[t, b] * Uc[t, d]
            for e in range(k):
                for b in range(r):
                    for d in range(r):
                        g[b, d] = gram[e, b, d] / n_clients
                    g[b, b] += beta
                    x[b] = rhs[e, b] / n_clients + tc[e, b]
                w = np.linalg.solve(g, x)
                for b in range(r):
                    Wn[e, b] = w[b]
        elif m == 1:
            _one_rater_cols(Uc[0], lc, data[s0:s1], Wp, tc, L, beta, n_clients, n_steps, Wn)
        else:
            xt_ptr = np.zeros(k + 1, indptr.dtype)
            for s in range(s1 - s0):
                xt_ptr[lc[s] + 1] += 1
            for e in range(k):
                xt_ptr[e + 1] += xt_ptr[e]
            fill = xt_ptr[:k].copy()
            xt_ind = np.empty(s1 - s0, indptr.dtype)
            xt_dat = np.empty(s1 - s0, data.dtype)
            for t in range(m):  # rows ascending: each column's raters stay sorted
                for s in range(ipc[t], ipc[t + 1]):
                    e = lc[s]
                    xt_ind[fill[e]] = t
                    xt_dat[fill[e]] = data[s0 + s]
                    fill[e] += 1
            linearized_cols(xt_ptr, xt_ind, xt_dat, np.ascontiguousarray(Uc), Wp,
                            np.ascontiguousarray(tc), L, beta, n_clients, n_steps, Wn,
                            np.empty_like(Wn))
        # (c) dual step with the old V on the explicit rows
        for e in range(k):
            for b in range(r):
                Y_out[o0 + e, b] = Yc[e, b] + beta * (Wn[e, b] - V[Ec[e], b])
        # the implicit rows: the same steps as a map of the coefficients, and of their values
        # on the explicit rows (the coefficient map applied to BW, BY and V there)
        p_w, c_y, c_v = _map_coefficients(hc, cc, mc, kk, L, beta, n_steps, exact, hist_out,
                                          coef_out, maps_out, hout_ptr[a])
        for e in range(k):
            for b in range(r):
                v = V[Ec[e], b]
                bw = p_w * BWc[e, b] - c_y * BYc[e, b] + c_v * v
                by = 0.0 if exact else BYc[e, b] + beta * bw - beta * v
                BWn[e, b], BYn[e, b] = bw, by
                D_out[d0 + e, b] = (Wn[e, b] - bw) + (Y_out[o0 + e, b] - by) / beta


@_jit
def _map_coefficients(hc, cc, mc, kk, L, beta, n_steps, exact, hist_out, coef_out, maps_out,
                      q0):
    """A client's new broadcasts and coefficients at ``q0`` of ``hist_out``, ``coef_out``:
    the W steps and the dual step on an implicit row, as a map of the old ones ``hc``,
    ``cc``, with one more for the broadcast ``kk``; ``maps_out`` takes the old maps ``mc``
    and this one's (:func:`_combination_rows`). Returns the map's ``(p, c_y, c_v)``: a
    combination ``w`` of ``W_i`` becomes ``p w - c_y y + c_v v``."""
    n_old = hc.size
    for q in range(n_old):
        hist_out[q0 + q] = hc[q]
        for b in range(4):
            maps_out[q0 + q, b] = mc[q, b]
    hist_out[q0 + n_old] = kk
    if exact:  # Remark 4.1: w = v - y / beta, then y = y + beta (w - v) = 0
        for q in range(n_old):
            coef_out[q0 + q, 0] = -cc[q, 1] / beta
            coef_out[q0 + q, 1] = 0.0
        coef_out[q0 + n_old, 0] = 1.0
        coef_out[q0 + n_old, 1] = 0.0
        p, c_y, c_v = 0.0, 1.0 / beta, 1.0
        maps_out[q0 + n_old, 0], maps_out[q0 + n_old, 1] = p, c_y
        maps_out[q0 + n_old, 2], maps_out[q0 + n_old, 3] = c_v, 0.0
        return p, c_y, c_v
    _, inv_denom, pow_last, sigma_last = _unrated_map(L, beta, n_steps)
    c_last = sigma_last * inv_denom
    for q in range(n_old):
        w = pow_last * cc[q, 0] - c_last * cc[q, 1]
        coef_out[q0 + q, 0] = w
        coef_out[q0 + q, 1] = cc[q, 1] + beta * w
    w = c_last * beta
    coef_out[q0 + n_old, 0] = w
    coef_out[q0 + n_old, 1] = beta * (w - 1.0)
    maps_out[q0 + n_old, 0], maps_out[q0 + n_old, 1] = pow_last, c_last
    maps_out[q0 + n_old, 2], maps_out[q0 + n_old, 3] = w, 1.0
    return pow_last, c_last, w


@_jit
def lazy_consensus(e_ptr, w_at, W, BW, E, hist, coef, h_ptr, V, G, kk, lazy):
    """``sum_i ||W_i - V||_F^2`` over clients held lazily (:func:`group_update`), with
    ``V = H[kk]``: per client the combination ``sum_q coef[q] H[hist[q]] - V`` over all rows
    (from the Gram blocks), corrected on its explicit rows (where the combination is
    ``BW``: held from ``w_at[a]`` on, or with ``BW`` empty made by :func:`_combination_rows`
    from ``lazy``, ``(maps, from_v0, V0, H, beta)``, the maps aligned with ``hist``). Client
    ``a``'s explicit rows ``E[e_ptr[a]:e_ptr[a + 1]]`` have their values from ``w_at[a]`` on
    in ``W`` (read where the state holds them: no gathered copy)."""
    maps, from_v0, V0, H, beta = lazy
    r = W.shape[1]
    cached = BW.shape[0] > 0 or e_ptr[-1] == 0
    k_max = 1
    if not cached:
        for a in range(e_ptr.size - 1):
            k_max = max(k_max, e_ptr[a + 1] - e_ptr[a])
    BWs, BYs = np.empty((k_max, r)), np.empty((k_max, r))
    total = 0.0
    for a in range(e_ptr.size - 1):
        e0, e1 = e_ptr[a], e_ptr[a + 1]
        w0 = w_at[a] - e0
        q0, q1 = h_ptr[a], h_ptr[a + 1]
        n_q = q1 - q0 + 1
        hc = np.empty(n_q, np.int64)
        cc = np.empty(n_q)
        hc[:n_q - 1], cc[:n_q - 1] = hist[q0:q1], coef[q0:q1]
        hc[n_q - 1], cc[n_q - 1] = kk, -1.0
        quad = 0.0
        for q in range(n_q):
            for q2 in range(n_q):
                tr = 0.0
                for b in range(r):
                    tr += G[hc[q], hc[q2], b, b]
                quad += cc[q] * cc[q2] * tr
        if cached:
            Bc = BW[w0 + e0:w0 + e1]
        else:
            Bc = BWs[:e1 - e0]
            _combination_rows(E[e0:e1], hist[q0:q1], maps[q0:q1], from_v0[a], V0, H, Bc,
                              BYs[:e1 - e0], beta)
        for e in range(e0, e1):
            j = E[e]
            for b in range(r):
                d = W[w0 + e, b] - V[j, b]
                total += d * d
                d = Bc[e - e0, b] - V[j, b]
                quad -= d * d
        total += quad
    return total
