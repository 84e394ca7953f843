"""Implicit feedback (``loss="implicit"``): weighted matrix factorization over every pair.

Hu, Koren & Volinsky (2008). Every stored entry ``r_ui`` of ``X`` is an interaction: the
preference is ``p_ui = 1`` there and 0 at every other pair, the confidence ``c_ui = 1 +
confidence * r_ui`` there and 1 elsewhere. The objective is the family's penalty plus::

    f(U, V) = 1/2 sum_{u, i} c_ui (p_ui - u_u . v_i)^2          (every user-item pair)

No bias and no mean enter it (``biased`` and ``center`` are ignored); ``u_u . v_i`` is a
preference score, not a rating.

The Gram identity. Write ``s_ui = u_u . v_i``. At a pair without interaction the term is
``s_ui^2``; at an interaction it is ``c (1 - s)^2 = s^2 + [(c - 1) s^2 - 2 c s + c]``. So::

    sum_i c_ui (p_ui - s_ui)^2 = u_u^T (V^T V) u_u
                                 + sum_{i in I(u)} [(c_ui - 1) s_ui^2 - 2 c_ui s_ui + c_ui]

with ``V^T V`` the ``r x r`` Gram of the item factors (``Vt.T @ Vt`` in the code's
``(n_items, r)`` orientation) and ``I(u)`` the items ``u`` interacted with. Summed over the
users, ``sum_u u_u^T (V^T V) u_u = trace((U^T U)(V^T V))``. Hence every quantity the
federation needs costs O(interactions x r^2 + r^3), never O(users x items):

* a user's exact minimizer (the closed-form ALS step, :func:`implicit_user_factors`)::

      (V^T V + sum_{i in I(u)} (c_ui - 1) v_i v_i^T + alpha_u I) u_u = sum_{i in I(u)} c_ui v_i

* the gradient in an item row ``v_j`` of a client ``p``'s part of ``f``, with ``U_p`` its
  users' factors::

      (U_p^T U_p) v_j + sum_{t in p, j in I(t)} [(c_tj - 1) s_tj - c_tj] u_t

  that is ``(U_p^T U_p + G1_jp) v_j - G2_jp`` with the client's per-item aggregates
  ``G1_jp = sum_t (c_tj - 1) u_t u_t^T`` and ``G2_jp = sum_t c_tj u_t`` over its users who
  interacted with ``j`` (:func:`implicit_item_sums`): the all-items term is the client's
  Gram ``U_p^T U_p``, the same for every item.

The server broadcasts ``V^T V`` with ``V`` (``r x r`` more), so a client never sweeps every
item for its users' step.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np
from numba import njit
from sklearn.utils._param_validation import Interval, StrOptions

from .._kernels import read_only
from ..engine._groups import offsets

__all__ = ["CG_TINY", "IMPLICIT_ALPHA", "IMPLICIT_CONFIDENCE", "IMPLICIT_SOLVER_SETTINGS",
           "check_implicit_settings", "check_interactions", "group_item_sums",
           "implicit_cg_steps", "implicit_item_gradient", "implicit_item_sums",
           "implicit_objective", "implicit_rank", "implicit_user_factors", "packed_size",
           "rated_w_steps", "resolve_confidence", "spd_cg", "spd_solve", "unpack_gram"]

# A conjugate-gradient solve stops once its residual's squared norm is below this (implicit's
# ALS uses the same 1e-20).
CG_TINY = 1e-20

# The default ``solver_params["confidence"]``: ``"auto"`` is ``1 / mean strength`` (see
# resolve_confidence).
IMPLICIT_CONFIDENCE = "auto"
# The l2 strengths that ``"auto"`` means under ``loss="implicit"`` (measured likewise).
IMPLICIT_ALPHA = 1.0


# The ``solver_params`` keys of the row solves under ``loss="implicit"`` (FedMGS, FedMAvg):
# ``implicit_solver="cg"`` takes ``cg_steps`` conjugate-gradient steps per row from its current
# factor, ``"cholesky"`` the exact solve. The default here is exact; FedMGS's is CG, 4 steps
# in 5 rounds (ALS's HR@10 and NDCG@10 or better, within 0.005, in about its fit time on the
# ML-1M shape: its clients' per-item aggregates, O(interactions x r^2) a round, the paper's
# message, are the bulk of a round, so the rounds set the time).
IMPLICIT_SOLVER_SETTINGS: dict = {
    "implicit_solver": ("cholesky", [StrOptions({"cg", "cholesky"})]),
    "cg_steps": (3, [Interval(Integral, 1, None, closed="left")]),
}


def implicit_cg_steps(settings):
    """The ``cg_steps`` of a fit's settings, None under ``implicit_solver="cholesky"``."""
    return None if settings["implicit_solver"] == "cholesky" else int(settings["cg_steps"])


def check_implicit_settings(estimator, ctx):
    """Refuse what ``loss="implicit"`` does not run: the weighted regularization, and
    ``eval_set`` (its RMSE is in rating units; rank held-out interactions with ``score``)."""
    if getattr(estimator, "regularization", "plain") != "plain":
        raise ValueError('loss="implicit" runs the plain penalties; set '
                         'regularization="plain".')
    if ctx.info.eval_X is not None:
        raise ValueError('eval_set is scored in rating units (RMSE), which loss="implicit" '
                         "does not predict; score held-out interactions with score(X, y).")


def implicit_rank(base, n_interactions, n_items):
    """The rank of ``n_components=None`` under ``loss="implicit"``: ``base`` at 100,000
    interactions, growing as the fifth root of their number in steps of 8 (32, 40 at 250,000,
    48 at 1M, 64 at 3.2M for ``base=32``), at least 8 and at most ``n_items``.

    More interactions support more factors before the extra ones fit noise. Measured with
    FedMGS (full ranking, one held-out interaction per user, HR@10): rank 32 beat 48 on
    ml-latest-small and MovieLens 100K (100,000 interactions each), 48 beat 32 on MovieLens 1M
    (0.246 against 0.227, where ``implicit``'s ALS with 64 factors has 0.244), and 40 matched
    ALS on a third of MovieLens 1M's users (340,000 interactions). The clients' summed
    interaction counts give ``n_interactions`` (the sums behind ``"auto"``'s confidence).

    Examples
    --------
    >>> from sklearn_fedmf.completion._implicit import implicit_rank
    >>> [implicit_rank(32, n, 3706) for n in (10_000, 100_000, 340_000, 1_000_000)]
    [24, 32, 40, 48]
    """
    steps = max(1, round(base / 8 * (n_interactions / 100_000) ** 0.2))
    return int(min(8 * steps, n_items))


def resolve_confidence(confidence, mean_strength):
    """The confidence scale of a fit: ``"auto"`` is one over the mean strength of the stored
    interactions, so that the mean interaction weighs ``c = 2`` whatever the strengths'
    unit (ones, 1-5 stars, counts: scaling every strength by ``k`` leaves the model
    unchanged). A client sends the sum and the count of its strengths, as for the ratings'
    mean. Measured with leave-one-out, full ranking (``benchmarks/bench_topn.py``): with
    star ratings as strengths, the former constant 1 (mean ``c`` about 4.5) gave FedMGS
    HR@10 0.300 and 0.295 on MovieLens 100K (two held-out draws), ``"auto"`` (0.28) 0.313
    and 0.308; 3 gave 0.285; on ml-latest-small all were within one standard error."""
    if confidence != "auto":
        return float(confidence)
    return 1.0 / mean_strength if mean_strength > 0 else 1.0


def check_interactions(X):
    """Refuse negative interaction strengths (a confidence must be at least 1)."""
    if X.nnz and X.data.min() < 0:
        raise ValueError(
            'loss="implicit" reads every stored entry of X as an interaction of strength '
            f"r >= 0 (confidence 1 + confidence * r); X has a negative value ({X.data.min():g})."
            " Pass counts, ratings or ones.")


@njit(cache=True, nogil=True, fastmath=True)
def spd_solve(A, b, L, out):
    """``out = A^{-1} b`` for a symmetric positive definite ``A`` by Cholesky (``L``: an
    ``r x r`` work buffer; ``A`` and ``b`` unchanged): a third of the LU's flops and no
    allocation, 4x faster than ``np.linalg.solve`` at ``r = 32``. A matrix that is not
    numerically positive definite (a zero strength on a singular Gram) falls back to
    ``np.linalg.solve``."""
    r = A.shape[0]
    for j in range(r):
        d = A[j, j]
        for k in range(j):
            d -= L[j, k] * L[j, k]
        if not d > 0.0:
            out[:] = np.linalg.solve(A, b)
            return
        d = np.sqrt(d)
        L[j, j] = d
        for i in range(j + 1, r):
            x = A[i, j]
            for k in range(j):
                x -= L[i, k] * L[j, k]
            L[i, j] = x / d
    for i in range(r):  # L y = b
        x = b[i]
        for k in range(i):
            x -= L[i, k] * out[k]
        out[i] = x / L[i, i]
    for i in range(r - 1, -1, -1):  # L^T x = y
        x = out[i]
        for k in range(i + 1, r):
            x -= L[k, i] * out[k]
        out[i] = x / L[i, i]


@njit(cache=True, nogil=True)
def spd_cg(A, b, x, n_steps, res, p, Ap):
    """``n_steps`` conjugate-gradient steps on ``A x = b`` from ``x`` (in place; ``A``
    symmetric positive definite, ``res``, ``p``, ``Ap``: length-``r`` work buffers). In exact
    arithmetic the ``r``-th step is the solution; it stops early once the residual's squared
    norm is below ``CG_TINY``. Returns the steps taken. (Products by columns, ``A``'s rows
    by symmetry: contiguous loops without reductions, which vectorize without fastmath;
    four rows a pass, :func:`_add_combination`.)"""
    r = A.shape[0]
    for a in range(r):  # res = b - A x
        res[a] = b[a]
    _add_combination(A, x, r, r, res, -1.0)
    rs = 0.0
    for a in range(r):
        p[a] = res[a]
        rs += res[a] * res[a]
    for step in range(n_steps):
        if rs < CG_TINY:
            return step
        for a in range(r):
            Ap[a] = 0.0
        _add_combination(A, p, r, r, Ap)
        pAp = 0.0
        for a in range(r):
            pAp += p[a] * Ap[a]
        if not pAp > 0.0:
            return step
        rs = _cg_update(x, res, p, Ap, rs, pAp)
    return n_steps


@njit(cache=True, nogil=True)
def _cg_update(x, res, p, Ap, rs, pAp):
    """One conjugate-gradient update in place (the step along ``p``, the residual, the next
    direction); returns the new squared residual norm."""
    t = rs / pAp
    new = 0.0
    for a in range(x.shape[0]):
        x[a] += t * p[a]
        res[a] -= t * Ap[a]
        new += res[a] * res[a]
    for a in range(x.shape[0]):
        p[a] = res[a] + (new / rs) * p[a]
    return new


@njit(cache=True, nogil=True)
def _user_solve_kernel(indptr, indices, data, rows, Vt, VtV, confidence, alpha, out):
    # the rows ``rows`` only (a group's active clients); the others of ``out`` untouched.
    # A user's Gram part is one matrix product ``W^T V_u`` of its rated rows (BLAS: 2 to 3x
    # faster than rank-one updates at r = 32 to 48).
    r = Vt.shape[1]
    longest = 0
    for u in rows:
        longest = max(longest, indptr[u + 1] - indptr[u])
    V_u = np.empty((longest, r))
    W = np.empty((longest, r))
    L = np.empty((r, r))
    b = np.empty(r)
    for u in rows:
        n = indptr[u + 1] - indptr[u]
        b[:] = 0.0
        for t in range(n):
            s = indptr[u] + t
            v = Vt[indices[s]]
            c = 1.0 + confidence * data[s]
            for a in range(r):
                b[a] += c * v[a]
                V_u[t, a] = v[a]
                W[t, a] = (c - 1.0) * v[a]
        A = np.dot(W[:n].T, V_u[:n])
        for a in range(r):
            for e in range(a, r):  # exactly symmetric, as the triangle was
                A[a, e] += VtV[a, e]
                A[e, a] = A[a, e]
            A[a, a] += alpha[u]
        spd_solve(A, b, L, out[u])


@njit(cache=True, nogil=True)
def _user_cg_kernel(indptr, indices, data, rows, Vt, VtV, confidence, alpha, n_steps, out):
    # ``n_steps`` conjugate-gradient steps on each row's system from its current factor
    # (Takacs, Pilaszy & Tikk 2011), the matrix never formed: ``A p = (V^T V) p + alpha p +
    # sum_{i in I(u)} (c - 1) (v_i . p) v_i``, O(r^2 + |I(u)| r) a step instead of the
    # Cholesky's O(|I(u)| r^2 + r^3). The long loops run along contiguous rows without
    # reductions (the rated rows gathered both ways, V_u and V_u^T): they vectorize without
    # fastmath, whose reordered sums would follow the arrays' types and differ between a
    # worker's copies and the parent's (and the model with n_jobs).
    r = Vt.shape[1]
    longest = 0
    for u in rows:
        longest = max(longest, indptr[u + 1] - indptr[u])
    V_u, V_uT = np.empty((longest, r)), np.empty((r, longest))
    w, z = np.empty(longest), np.empty(longest)
    res, p, Ap = np.empty(r), np.empty(r), np.empty(r)
    for u in rows:
        x = out[u]
        n = indptr[u + 1] - indptr[u]
        if n == 0:  # (no interaction: the minimizer is 0)
            x[:] = 0.0
            continue
        for t in range(n):
            s = indptr[u] + t
            v = Vt[indices[s]]
            w[t] = confidence * data[s]  # c - 1
            for a in range(r):
                V_u[t, a] = v[a]
                V_uT[a, t] = v[a]
        # res = b - A x, with b = sum_t c_t v_t: -(V^T V + alpha I) x + sum_t (c_t - (c_t -
        # 1) v_t . x) v_t
        _apply(V_u, V_uT, w, VtV, alpha[u], x, n, z, res)
        for t in range(n):
            z[t] = 1.0 + w[t]
        for a in range(r):
            res[a] = -res[a]
        _add_combination(V_u, z, n, r, res)
        rs = 0.0
        for a in range(r):
            p[a] = res[a]
            rs += res[a] * res[a]
        for _ in range(n_steps):
            if rs < CG_TINY:
                break
            _apply(V_u, V_uT, w, VtV, alpha[u], p, n, z, Ap)
            pAp = 0.0
            for a in range(r):
                pAp += p[a] * Ap[a]
            if not pAp > 0.0:
                break
            rs = _cg_update(x, res, p, Ap, rs, pAp)


@njit(cache=True, nogil=True)
def _apply(V_u, V_uT, w, VtV, alpha, p, n, z, out):
    # out = (V^T V + alpha I) p + sum_t w_t (v_t . p) v_t, along contiguous rows (z: work)
    r = p.shape[0]
    for a in range(r):
        out[a] = alpha * p[a]
    _add_combination(VtV, p, r, r, out)  # (V^T V symmetric: row e is column e)
    for t in range(n):
        z[t] = 0.0
    _add_combination(V_uT, p, r, n, z)
    for t in range(n):
        z[t] = w[t] * z[t]
    _add_combination(V_u, z, n, r, out)


@njit(cache=True, nogil=True)
def _add_combination(M, coef, n_rows, n_cols, out, sign=1.0):
    # out[j] += coef[i] M[i, j] for i = 0, 1, ..., n_rows - 1 in turn: four rows per pass
    # over out (each entry's additions in the same order, the same bits as one row a pass,
    # with a quarter of out's loads and stores). ``sign=-1.0`` subtracts (exactly: ``o + m
    # (-c)`` is ``o - m c``)
    i = 0
    while i + 4 <= n_rows:
        c0, c1 = sign * coef[i], sign * coef[i + 1]
        c2, c3 = sign * coef[i + 2], sign * coef[i + 3]
        m0, m1, m2, m3 = M[i], M[i + 1], M[i + 2], M[i + 3]
        for j in range(n_cols):
            o = out[j]
            o += m0[j] * c0
            o += m1[j] * c1
            o += m2[j] * c2
            o += m3[j] * c3
            out[j] = o
        i += 4
    for rest in range(i, n_rows):
        ci, mi = sign * coef[rest], M[rest]
        for j in range(n_cols):
            out[j] += mi[j] * ci


def implicit_user_factors(X, Vt, VtV, *, confidence, alpha_u, rows=None, out=None,
                          cg_steps=None):
    """Each row's minimizer of its weighted loss plus ``alpha_u/2 ||u||^2``: exact (Cholesky)
    or ``cg_steps`` conjugate-gradient steps from the row's current factor.

    Parameters
    ----------
    X : csr_matrix of shape (n_rows, n_items)
        The rows' interactions (their strengths ``r``).
    Vt : ndarray of shape (n_items, r)
        The item factors.
    VtV : ndarray of shape (r, r)
        ``Vt.T @ Vt`` (what the server broadcasts).
    confidence : float
    alpha_u : float or ndarray of shape (n_rows,)
        The l2 strength (one per row for the weighted regularization); it must make each
        system positive definite, as ``VtV`` alone may not.
    rows : ndarray of int, default=None
        Solve these rows only (a group's active clients); None: every row.
    out : ndarray of shape (n_rows, r), default=None
        Where to write (in place; the rows not in ``rows`` are left as they are). With
        ``cg_steps``, its rows in ``rows`` are also the start (required).
    cg_steps : int, default=None
        None: the exact solve. An int: that many conjugate-gradient steps per row, warm-started
        from ``out`` (:func:`_user_cg_kernel`; the exact solve after ``r`` steps, to
        rounding). A row stops early once its residual's squared norm is below ``CG_TINY``.

    Returns
    -------
    U : ndarray of shape (n_rows, r)
        A row without interaction gets zeros.
    """
    n_rows = X.shape[0]
    alpha = np.broadcast_to(np.asarray(alpha_u, dtype=np.float64).ravel(), (n_rows,))
    if cg_steps is not None and out is None:
        raise ValueError("cg_steps needs out, the start of each row's steps.")
    out = np.empty((n_rows, Vt.shape[1])) if out is None else out
    rows = np.arange(n_rows) if rows is None else np.asarray(rows, dtype=np.int64)
    if rows.size and cg_steps is not None:
        _user_cg_kernel(X.indptr, X.indices, np.asarray(X.data, dtype=np.float64), rows,
                        np.ascontiguousarray(Vt, dtype=np.float64),
                        np.ascontiguousarray(VtV, dtype=np.float64), float(confidence),
                        read_only(alpha, np.float64), int(cg_steps), out)
    elif rows.size:
        _user_solve_kernel(X.indptr, X.indices, np.asarray(X.data, dtype=np.float64), rows,
                           np.ascontiguousarray(Vt, dtype=np.float64),
                           np.ascontiguousarray(VtV, dtype=np.float64), float(confidence),
                           read_only(alpha, np.float64), out)
    return out


# Below this many interactions an item's ``G1_j`` is added straight into the packed triangle
# (half the products, no buffer to clear and fold: a one-user client's every item).
SQUARE_FROM = 4


@njit(cache=True, nogil=True, fastmath=True)
def _item_sums_kernel(indptr, indices, data, U, U_old, items, confidence, G):
    # item-major (``indptr`` of X transposed), the aggregates at U less those at U_old in one
    # pass. From SQUARE_FROM interactions on, ``G1_j``'s change is the symmetric part of one
    # matrix product ``N = A^T B`` of the item's stacked rows ``a_t = (c - 1)(u + o)``, ``b_t =
    # u - o``: ``(N + N^T) / 2 = sum_t (c - 1)(u u^T - o o^T)`` (BLAS; half the flops of
    # ``[W; -W_old]^T [U; U_old]``), then its upper triangle is added to G's row.
    r = U.shape[1]
    longest = 0
    for q in range(items.shape[0]):
        longest = max(longest, indptr[items[q] + 1] - indptr[items[q]])
    A = np.empty((longest, r))
    B = np.empty((longest, r))
    M = np.empty((r, r))  # (written in place: no r x r allocation per item, 5% of the kernel)
    for q in range(items.shape[0]):
        j = items[q]
        n = indptr[j + 1] - indptr[j]
        for a in range(r):  # (every row written: G need not come zeroed)
            G[q, a] = 0.0
        if n < SQUARE_FROM:
            _add_packed_changes(indptr[j], indptr[j + 1], indices, data, U, U_old,
                                confidence, G[q])
            continue
        for t in range(n):
            s = indptr[j] + t
            u, o = U[indices[s]], U_old[indices[s]]
            c = 1.0 + confidence * data[s]
            for a in range(r):
                d = u[a] - o[a]
                G[q, a] += c * d
                A[t, a] = (c - 1.0) * (u[a] + o[a])
                B[t, a] = d
        np.dot(A[:n].T, B[:n], M)
        k = r
        for a in range(r):  # the upper triangle, row by row
            for e in range(a, r):
                G[q, k] = 0.5 * (M[a, e] + M[e, a])
                k += 1


@njit(cache=True, nogil=True, fastmath=True)
def _add_packed_changes(start, stop, indices, data, U, U_old, confidence, g):
    # the entries start:stop of an item (its users ``indices``) added straight into its
    # zeroed row ``g`` (from ``r``: written here), ``[c (u - o), triu((c - 1)(u u^T - o
    # o^T))]``. Each triangle row by slices from 0 (``g[k:k + m]``, ``u[a:]``): the loops
    # vectorize, 3x faster than by offset indices, the same arithmetic per entry.
    r = U.shape[1]
    g[r:] = 0.0
    for s in range(start, stop):
        u, o = U[indices[s]], U_old[indices[s]]
        c = 1.0 + confidence * data[s]
        k = r
        for a in range(r):
            g[a] += c * (u[a] - o[a])
            w, wo = (c - 1.0) * u[a], (c - 1.0) * o[a]
            m = r - a
            t, ua, oa = g[k:k + m], u[a:], o[a:]  # (row a of the upper triangle)
            for e in range(m):
                t[e] += w * ua[e] - wo * oa[e]
            k += m


def packed_size(r):
    """Numbers per row of a message: ``G2_j`` and the upper triangle of ``G1_j``."""
    return r + r * (r + 1) // 2


def unpack_gram(packed, r):
    """``(k, r, r)`` symmetric matrices from their packed upper triangles ``(k, r(r+1)/2)``
    (row by row, as :func:`implicit_item_sums` writes them)."""
    rows, cols = np.triu_indices(r)
    full = np.empty((packed.shape[0], r, r))
    full[:, rows, cols] = packed
    full[:, cols, rows] = packed
    return full


def implicit_item_sums(X, U, *, confidence, U_old=None, Xt=None, out=None):
    """A client's per-item aggregates on the items its users interacted with (given
    ``U_old``: their change from the aggregates at ``U_old``).

    ``Xt`` (``X`` transposed, CSR) and ``out`` (where to write ``G``, every row overwritten:
    a message's memory reused round after round) are for a caller that keeps them.

    Returns
    -------
    items : ndarray of shape (k,)
        The items (ascending).
    G : ndarray of shape (k, r + r (r + 1) / 2)
        Row ``q`` is ``[G2_j, triu(G1_j)]`` for ``j = items[q]``: ``G2_j = sum_t c_tj u_t``
        and the upper triangle, row by row, of the symmetric ``G1_j = sum_t (c_tj - 1) u_t
        u_t^T`` (:func:`unpack_gram` restores it).
    """
    Xt = X.T.tocsr() if Xt is None else Xt  # (items as rows: O(interactions))
    items = np.flatnonzero(np.diff(Xt.indptr))
    r = U.shape[1]
    G = np.empty((items.size, packed_size(r))) if out is None else out
    if X.nnz:
        U = np.ascontiguousarray(U, dtype=np.float64)
        # (a first message: the change from zeros)
        U_old = np.zeros_like(U) if U_old is None else np.ascontiguousarray(U_old,
                                                                            dtype=np.float64)
        _item_sums_kernel(Xt.indptr, Xt.indices, np.asarray(Xt.data, dtype=np.float64), U,
                          U_old, items, float(confidence), G)
    return items, G


@njit(cache=True, nogil=True, fastmath=True)
def _group_item_sums_kernel(indptr, indices, data, row_ptr, clients, U, U_old, confidence,
                            item_ptr, slot, single, out_ptr, G, grams):
    # client-major: client ``clients[q]``'s rows ``[G2_j, triu(G1_j)]`` (their changes from
    # ``U_old``) go to ``G[out_ptr[q]:out_ptr[q + 1]]`` in the order of its items; an entry's
    # row is its slot among them (``single``: one row per client, its entries are its items)
    r = U.shape[1]
    d = np.empty(r)
    for q in range(clients.shape[0]):
        i = clients[q]
        G[out_ptr[q]:out_ptr[q + 1]] = 0.0
        grams[q] = 0.0
        first = indptr[row_ptr[i]]
        for t in range(row_ptr[i], row_ptr[i + 1]):
            u, o = U[t], U_old[t]
            for a in range(r):
                for e in range(r):
                    grams[q, a, e] += u[a] * u[e] - o[a] * o[e]
            for a in range(r):
                d[a] = u[a] - o[a]
            for s in range(indptr[t], indptr[t + 1]):
                g = G[out_ptr[q] + (s - first if single else slot[s])]
                c = 1.0 + confidence * data[s]
                k = r
                for a in range(r):
                    g[a] += c * d[a]
                    ua, oa = (c - 1.0) * u[a], (c - 1.0) * o[a]
                    m = r - a  # (the upper triangle, row by row, by slices from 0: they
                    tri, u_a, o_a = g[k:k + m], u[a:], o[a:]  # vectorize)
                    for e in range(m):
                        tri[e] += ua * u_a[e] - oa * o_a[e]
                    k += m


def group_item_sums(X, row_ptr, clients, U, U_old, *, confidence, item_ptr, slot, single):
    """:func:`implicit_item_sums` (the change from ``U_old``, zeros for a first message) of
    several clients of a group in one call, and their Grams' changes.

    Parameters
    ----------
    X : csr_matrix of shape (n_rows, n_items)
        The group's interactions, rows stacked by client (``row_ptr``).
    row_ptr : ndarray of shape (n_clients + 1,)
    clients : ndarray of int
        The clients (indices in the group) that share.
    U, U_old : ndarray of shape (n_rows, r)
    confidence : float
    item_ptr, slot, single
        Each client's items, as :func:`._fedmgs_batched.group_layout` gives them.

    Returns
    -------
    out_ptr : ndarray of shape (len(clients) + 1,)
        Client ``clients[q]``'s rows are ``G[out_ptr[q]:out_ptr[q + 1]]``.
    G : ndarray of shape (out_ptr[-1], r + r (r + 1) / 2)
    grams : ndarray of shape (len(clients), r, r)
        ``U_p^T U_p - U_old_p^T U_old_p``.
    """
    out_ptr = offsets(item_ptr[clients + 1] - item_ptr[clients])
    r = U.shape[1]
    G, grams = np.empty((out_ptr[-1], packed_size(r))), np.empty((len(clients), r, r))
    _group_item_sums_kernel(X.indptr, X.indices, np.asarray(X.data, dtype=np.float64),
                            np.asarray(row_ptr, dtype=np.int64),
                            np.asarray(clients, dtype=np.int64),
                            np.ascontiguousarray(U, dtype=np.float64),
                            np.ascontiguousarray(U_old, dtype=np.float64), float(confidence),
                            item_ptr, slot, bool(single), out_ptr, G, grams)
    return out_ptr, G, grams


@njit(cache=True, nogil=True, fastmath=True)
def _rated_w_steps_kernel(indptr, indices, data, row_ptr, clients, U, Vt, scale,
                          confidence, alpha_v, d_factor, eps, n_steps, item_ptr, slot, single,
                          items, out_ptr, values, transforms):
    # client clients[q]'s rated rows of W_p (FedMAvg's W steps on them, from V) go to
    # values[out_ptr[q]:out_ptr[q + 1]], in the order of its items; its unrated rows' map
    # M_p^n_steps to transforms[q]
    r = U.shape[1]
    for q in range(clients.shape[0]):
        i = clients[q]
        lo, hi = out_ptr[q], out_ptr[q + 1]
        k = hi - lo
        W = values[lo:hi]
        for a in range(k):
            W[a] = Vt[items[item_ptr[i] + a]]
        # a client of m < r/2 users: U_p^T U_p has rank m, w (U_p^T U_p) = sum_t (w.u_t) u_t
        # costs 2 m r a row instead of r^2, and its nonzero spectrum is U_p U_p^T's (m x m)
        m = row_ptr[i + 1] - row_ptr[i]
        low_rank = 2 * m < r
        Up = U[row_ptr[i]:row_ptr[i + 1]]
        gram = np.empty((0, 0))  # (U_p^T U_p, formed only at full rank)
        if low_rank:
            K = np.dot(Up, Up.T)
            lam = np.linalg.eigvalsh(K)[-1] if m else 0.0
        else:
            gram = np.dot(Up.T, Up)
            lam = np.linalg.eigvalsh(gram)[-1] if r else 0.0
        trace = np.zeros(k)
        first = indptr[row_ptr[i]]
        for t in range(row_ptr[i], row_ptr[i + 1]):
            norm2 = 0.0
            for a in range(r):
                norm2 += U[t, a] * U[t, a]
            for s in range(indptr[t], indptr[t + 1]):
                trace[s - first if single else slot[s]] += confidence * data[s] * norm2
        d = np.empty(k)
        for a in range(k):  # w_bounds's L_j, floored, times d_factor
            d[a] = d_factor * max(scale[q] * (lam + trace[a]) + alpha_v, eps)
        # the unrated rows: one step is w <- w - (scale w gram + alpha_v w) / d_0, d_0 the
        # bound without data (trace 0), taken on the identity as w_steps takes a row
        d0 = d_factor * max(scale[q] * lam + alpha_v, eps)
        if low_rank:  # M^n = c I + U_p^T B U_p: M (c I + U^T B U) = beta c I + U^T (beta B -
            # gamma c I - gamma K B) U, with M = beta I - gamma U^T U (m x m work a step)
            beta, gamma = 1.0 - alpha_v / d0, scale[q] / d0
            c_id, B = 1.0, np.zeros((m, m))
            for _ in range(n_steps):
                B = beta * B - gamma * np.dot(K, B) - gamma * c_id * np.eye(m)
                c_id *= beta
            transforms[q] = np.dot(Up.T, np.dot(B, Up)) + c_id * np.eye(r)
        else:
            T = np.eye(r)
            for _ in range(n_steps):
                T = T - (scale[q] * np.dot(T, gram) + alpha_v * T) / d0
            transforms[q] = T
        grad = np.empty((k, r))
        for _ in range(n_steps):
            for a in range(k):  # scale (U_p^T U_p) w_j + alpha_v w_j
                for e in range(r):
                    grad[a, e] = alpha_v * W[a, e]
                if low_rank:
                    for t in range(row_ptr[i], row_ptr[i + 1]):
                        z = 0.0
                        for e in range(r):
                            z += W[a, e] * U[t, e]
                        z *= scale[q]
                        for e in range(r):
                            grad[a, e] += z * U[t, e]
                    continue
                for b in range(r):  # (row-major: the inner loop vectorizes)
                    wb = scale[q] * W[a, b]
                    for e in range(r):
                        grad[a, e] += wb * gram[b, e]
            for t in range(row_ptr[i], row_ptr[i + 1]):
                for s in range(indptr[t], indptr[t + 1]):
                    a = s - first if single else slot[s]
                    c = 1.0 + confidence * data[s]
                    score = 0.0
                    for e in range(r):
                        score += U[t, e] * W[a, e]
                    coef = scale[q] * ((c - 1.0) * score - c)
                    for e in range(r):
                        grad[a, e] += coef * U[t, e]
            for a in range(k):
                for e in range(r):
                    W[a, e] -= grad[a, e] / d[a]


def rated_w_steps(X, row_ptr, clients, U, Vt, scale, *, confidence, alpha_v, d_factor,
                  eps, n_steps, item_ptr, slot, single, items):
    """FedMAvg's ``n_steps`` local W steps (:mod:`._fedmavg_implicit`) from ``V`` on the rated
    rows of several clients of a group in one call (each row its own step ``1 / (d_factor
    max(L_j, eps))``); the rows of the items a client never saw are the closed form
    ``V M_p^n_steps``: only ``M_p^n_steps`` is formed.

    Returns
    -------
    out_ptr : ndarray of shape (len(clients) + 1,)
    values : ndarray of shape (out_ptr[-1], r)
        Client ``clients[q]``'s rows of ``W_p`` on its items are ``values[out_ptr[q]:out_ptr[q
        + 1]]``.
    transforms : ndarray of shape (len(clients), r, r)
        ``M_p^n_steps``: its rows of the items it never saw are ``V M_p^n_steps``.
    """
    out_ptr = offsets(item_ptr[clients + 1] - item_ptr[clients])
    values = np.empty((out_ptr[-1], Vt.shape[1]))
    transforms = np.empty((len(clients), Vt.shape[1], Vt.shape[1]))
    _rated_w_steps_kernel(X.indptr, X.indices, np.asarray(X.data, dtype=np.float64),
                          np.asarray(row_ptr, dtype=np.int64),
                          np.asarray(clients, dtype=np.int64),
                          np.ascontiguousarray(U, dtype=np.float64),
                          np.ascontiguousarray(Vt, dtype=np.float64),
                          np.ascontiguousarray(scale, dtype=np.float64), float(confidence),
                          float(alpha_v), float(d_factor), float(eps), int(n_steps),
                          read_only(item_ptr, np.int64),
                          slot, bool(single), items, out_ptr, values, transforms)
    return out_ptr, values, transforms


def _entry_scores(X, U, Vt):
    """``u_t . v_j`` at each stored entry of ``X`` (CSR order)."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    return np.einsum("ea,ea->e", U[rows], Vt[X.indices])


@njit(cache=True, nogil=True)
def _data_term(c, s):
    return (c - 1.0) * s * s - 2.0 * c * s + c


@njit(cache=True, nogil=True)
def _data_term_kernel(indptr, indices, data, U, Vt, confidence):
    # sum over the stored entries of (c - 1) s^2 - 2 c s + c, s = u_t . v_j (no fastmath, as
    # _user_cg_kernel: the same sum in every worker); no (entries x r)
    # gathers (their einsum was a fifth of a fit's time under FedMGS's per-round objective).
    # A row's scores four at a time: four independent chains (one was a latency-bound
    # chain of r additions per entry), each summed in the same order: the same bits, twice
    # as fast.
    total = 0.0
    r = U.shape[1]
    for t in range(indptr.shape[0] - 1):
        u = U[t]
        k, end = indptr[t], indptr[t + 1]
        while k + 4 <= end:
            v0, v1 = Vt[indices[k]], Vt[indices[k + 1]]
            v2, v3 = Vt[indices[k + 2]], Vt[indices[k + 3]]
            s0 = s1 = s2 = s3 = 0.0
            for a in range(r):
                ua = u[a]
                s0 += ua * v0[a]
                s1 += ua * v1[a]
                s2 += ua * v2[a]
                s3 += ua * v3[a]
            total += _data_term(1.0 + confidence * data[k], s0)
            total += _data_term(1.0 + confidence * data[k + 1], s1)
            total += _data_term(1.0 + confidence * data[k + 2], s2)
            total += _data_term(1.0 + confidence * data[k + 3], s3)
            k += 4
        for rest in range(k, end):
            v = Vt[indices[rest]]
            s = 0.0
            for a in range(r):
                s += u[a] * v[a]
            total += _data_term(1.0 + confidence * data[rest], s)
    return total


def implicit_item_gradient(X, U, Vt, *, confidence):
    """The gradient in ``Vt`` of ``f`` on the rows of ``X`` (a client's part), in O(entries
    x r + n_items x r^2): ``Vt (U^T U) + C^T U`` with ``C`` the sparse coefficients
    ``(c - 1) s - c`` at the interactions (module docstring)."""
    s = _entry_scores(X, U, Vt)
    c = 1.0 + confidence * X.data
    coef = X.copy()
    coef.data = (c - 1.0) * s - c
    return Vt @ (U.T @ U) + np.asarray(coef.T @ U)


def implicit_objective(X, U, Vt, *, confidence, alpha_u=0.0, alpha_v=0.0, VtV=None):
    """``f(U, V) + alpha_u/2 ||U||^2 + alpha_v/2 ||V||^2`` in the Gram form (module
    docstring): O(interactions x r + (n_users + n_items) x r^2).

    Parameters
    ----------
    X : csr_matrix of shape (n_users, n_items)
        The interactions.
    U : ndarray of shape (n_users, r)
    Vt : ndarray of shape (n_items, r)
    confidence : float
    alpha_u, alpha_v : float, default=0.0
    VtV : ndarray of shape (r, r), default=None
        ``Vt.T @ Vt`` when already known.

    Returns
    -------
    value : float
    """
    VtV = Vt.T @ Vt if VtV is None else VtV
    data = _data_term_kernel(X.indptr, X.indices, np.asarray(X.data, dtype=np.float64),
                             np.ascontiguousarray(U, dtype=np.float64),
                             np.ascontiguousarray(Vt, dtype=np.float64), float(confidence))
    gram = float(np.sum((U.T @ U) * VtV))
    return 0.5 * (gram + data) + 0.5 * alpha_u * float(np.sum(U * U)) \
        + 0.5 * alpha_v * float(np.sum(Vt * Vt))
