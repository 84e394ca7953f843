"""Numba kernels of RFRec / RFRecF: the per-entry gradients and sums of a client's fit term,
the scatter of uploads into the server's average, and the fold-in through the sigmoid link."""

from collections import namedtuple

import numpy as np
from numba import njit

from ..._kernels import row_dot


@njit(cache=True, nogil=True)
def _residual(z, r, sigmoid, shift, span):
    """``(e, de^2/dz)`` of a rating ``r`` at the score ``z``: ``e = z - r``, or through the
    sigmoid link ``e = sigmoid(z) - (r + shift) / span``."""
    if sigmoid:
        sg = 1.0 / (1.0 + np.exp(-z))
        e = sg - (r + shift) / span
        return e, 2.0 * e * sg * (1.0 - sg)
    e = z - r
    return e, 2.0 * e


@njit(cache=True, nogil=True)
def _rating_error(z, r, sigmoid, shift, span):
    """The error of the score ``z`` on the rating scale (``r`` centred by ``shift``)."""
    if sigmoid:
        return span / (1.0 + np.exp(-z)) - shift - r
    return z - r


@njit(cache=True, nogil=True)
def _fit_grads(indptr, pair, data, U, P, sigmoid, shift, span, gU, gP):
    """Gradients of ``sum (r - link(u_i . p_q))^2`` over the stored entries; returns the sum.

    Entry ``s`` of row ``t`` uses the client's column ``P[pair[s]]``. The sigmoid link fits
    ``(r + shift) / span`` (ratings min-max scaled to [0, 1]) with ``sigmoid(u . v)``.
    """
    d = U.shape[1]
    gU[:, :] = 0.0
    gP[:, :] = 0.0
    loss = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            q = pair[s]
            z = row_dot(U, t, P, q)
            e, g = _residual(z, data[s], sigmoid, shift, span)
            loss += e * e
            for a in range(d):
                gU[t, a] += g * P[q, a]
                gP[q, a] += g * U[t, a]
    return loss



@njit(cache=True, nogil=True)
def _client_grads(indptr, pair, data, U, P, Vbar, cols, sigmoid, shift, span, alpha_u, reg_v,
                  reg, scale, gU, gP):
    """``scale * grad (fit + ridges) + reg * (P - Vbar[cols])``: RFRec's step (``scale=1``)
    or RFRecF's main update (``reg=0``, ``scale = 1 / (1 - p)``)."""
    _fit_grads(indptr, pair, data, U, P, sigmoid, shift, span, gU, gP)
    for t in range(U.shape[0]):
        for a in range(U.shape[1]):
            gU[t, a] = scale * (gU[t, a] + 2.0 * alpha_u * U[t, a])
    for q in range(P.shape[0]):
        j = cols[q]
        for a in range(P.shape[1]):
            gP[q, a] = scale * (gP[q, a] + 2.0 * reg_v * P[q, a]) + reg * (P[q, a] - Vbar[j, a])


@njit(cache=True, nogil=True)
def _client_sums(indptr, pair, data, U, P, W, Vbar, cols, sigmoid, shift, span):
    """One client's additive pieces of ``F`` on its rated columns and the errors of the
    federated model ``u . vbar``: ``(fit, psi_rated, sq_rated, sse, sum |e|)`` (a group of
    one client with no pending pull, :func:`_group_sums`)."""
    return _group_sums(indptr, data, np.array([0, U.shape[0]]), np.array([0, P.shape[0]]),
                       pair, cols, U, P, W, Vbar, np.zeros(1, dtype=np.bool_), 0.0, sigmoid,
                       shift, span)


@njit(cache=True, nogil=True)
def _errors_at(indptr, indices, data, U, Vbar, sigmoid, shift, span):
    """``(sum e^2, sum |e|)`` of the federated model ``u . vbar`` on the rating scale."""
    sse = ae = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            z = row_dot(U, t, Vbar, indices[s])
            e = _rating_error(z, data[s], sigmoid, shift, span)
            sse += e * e
            ae += abs(e)
    return sse, ae

@njit(cache=True, nogil=True)
def _scatter_delta(acc, cols, values, base):
    """``acc[cols] += values - base[cols]`` (``cols`` unique)."""
    for q in range(cols.shape[0]):
        j = cols[q]
        for a in range(acc.shape[1]):
            acc[j, a] += values[q, a] - base[j, a]

@njit(cache=True, nogil=True)
def _sigmoid_fold_in(indptr, indices, data, Vt, alpha, shift, span, n_steps, out):
    """Row-wise ``argmin_u sum (y - sigmoid(u . v_j))^2 + alpha ||u||^2`` by damped
    Gauss-Newton from 0 (halving the step until the loss decreases)."""
    d = Vt.shape[1]
    H = np.empty((d, d))
    g = np.empty(d)
    for t in range(out.shape[0]):
        u = np.zeros(d)
        lo, hi = indptr[t], indptr[t + 1]
        for _ in range(n_steps):
            H[:, :] = 0.0
            g[:] = alpha * u
            loss = alpha * np.dot(u, u)
            for s in range(lo, hi):
                v = Vt[indices[s]]
                sg = 1.0 / (1.0 + np.exp(-np.dot(u, v)))
                e = sg - (data[s] + shift) / span
                loss += e * e
                w = sg * (1.0 - sg)
                for a in range(d):
                    g[a] += e * w * v[a]
                    for b in range(d):
                        H[a, b] += w * w * v[a] * v[b]
            for a in range(d):
                H[a, a] += alpha
            step = np.linalg.solve(H, g)
            rate = 1.0
            while rate > 1e-6:
                cand = u - rate * step
                new = alpha * np.dot(cand, cand)
                for s in range(lo, hi):
                    e = 1.0 / (1.0 + np.exp(-np.dot(cand, Vt[indices[s]])))
                    e -= (data[s] + shift) / span
                    new += e * e
                if new <= loss:
                    break
                rate *= 0.5
            if rate <= 1e-6:
                break
            u = cand
        out[t] = u


# ---- batched clients (_rfrec_batched): every active client of a group in one call ----
_STEP, _PULL, _NOTHING = 0, 1, 2  # what a client does to its rated columns in a round


@njit(cache=True, nogil=True)
def _pair_of(pair, s):
    """Entry ``s``'s pair; an empty ``pair`` means one pair per entry (one row per client)."""
    return s if pair.shape[0] == 0 else pair[s]


@njit(cache=True, nogil=True)
def _norm(A, r):
    acc = 0.0
    for a in range(A.shape[1]):
        acc += A[r, a] * A[r, a]
    return np.sqrt(acc)


@njit(cache=True, nogil=True, inline="always")  # (a call per coordinate costs more)
def _adam(x, g, m, v, rate, bias2):
    """One Adam step of one coordinate (``_rfrec_protocol._optimize``) with ``rate = lr /
    (1 - beta1^t)`` and ``bias2 = 1 - beta2^t``; returns the new ``(x, m, v)``."""
    m = 0.9 * m + (1 - 0.9) * g
    v = 0.999 * v + (1 - 0.999) * g * g
    return x - rate * m / (np.sqrt(v / bias2) + 1e-8), m, v


@njit(cache=True, nogil=True, inline="always")
def _descend(X, mX, vX, r, a, g, adam, lr, rate, bias2):
    """Step ``X[r, a]`` along its gradient ``g``: Adam's step (moments ``mX``, ``vX``) or
    plain gradient descent with step ``lr``."""
    if adam:
        X[r, a], mX[r, a], vX[r, a] = _adam(X[r, a], g, mX[r, a], vX[r, a], rate, bias2)
    else:
        X[r, a] = X[r, a] - lr * g

# The arrays and scalars of :func:`_group_update` travel in named tuples (numba takes one as
# one argument and reads its fields at no cost).
class GroupPairs(namedtuple("GroupPairs", "indptr data row_ptr pair_ptr pair cols")):
    """A group's ratings (CSR ``indptr``, ``data``), its clients' rows (``row_ptr``) and
    stacked rated columns (``pair_ptr``, ``pair``, ``cols``: ``_rfrec_batched``'s layout)."""

    __slots__ = ()


class StepSettings(namedtuple("StepSettings", "action pull_after eta sigmoid shift span alpha_u "
                                              "reg_v reg scale lr auto adam biased")):
    """The scalars of a round's client step (:func:`_group_update`)."""

    __slots__ = ()


class AdamMoments(namedtuple("AdamMoments", "t mU vU mP vP")):
    """Adam's step counts per client and moments stacked like ``U`` and ``P`` (empty arrays
    without Adam)."""

    __slots__ = ()


@njit(cache=True, nogil=True)
def _pull_rows(P, q0, q1, Vbar, cols, eta):
    """``P[q] <- P[q] - eta (P[q] - Vbar[cols[q]])`` for the rows ``q0:q1``."""
    for q in range(q0, q1):
        for a in range(P.shape[1]):
            P[q, a] = P[q, a] - eta * (P[q, a] - Vbar[cols[q], a])


@njit(cache=True, nogil=True)
def _row_norms(A, r0, r1, out):
    """``out[r - r0] = ||A[r]||`` (each summed in order), four rows at a time: four
    independent sums keep the core busy where one waits on its additions."""
    r = r0
    while r + 4 <= r1:
        n0 = n1 = n2 = n3 = 0.0
        for a in range(A.shape[1]):
            x0, x1, x2, x3 = A[r, a], A[r + 1, a], A[r + 2, a], A[r + 3, a]
            n0 += x0 * x0
            n1 += x1 * x1
            n2 += x2 * x2
            n3 += x3 * x3
        out[r - r0], out[r - r0 + 1] = np.sqrt(n0), np.sqrt(n1)
        out[r - r0 + 2], out[r - r0 + 3] = np.sqrt(n2), np.sqrt(n3)
        r += 4
    for rest in range(r, r1):
        out[rest - r0] = _norm(A, rest)


@njit(cache=True, nogil=True)
def _scores4(U, r, P, qa, qb, qc, qd):
    """The four scores ``U[r] . P[q]`` (each summed in order, as ``row_dot``), together."""
    za = zb = zc = zd = 0.0
    for a in range(U.shape[1]):
        u = U[r, a]
        za += u * P[qa, a]
        zb += u * P[qb, a]
        zc += u * P[qc, a]
        zd += u * P[qd, a]
    return za, zb, zc, zd


@njit(cache=True, nogil=True)
def _group_update(pairs, U, P, Vbar, active, pending, settings, moments):
    """``client_update``'s state change for every active client of a group, in place
    (``pairs`` a :class:`GroupPairs`, ``settings`` a :class:`StepSettings`, ``moments``
    :class:`AdamMoments`).

    Client ``i`` owns the rows ``row_ptr[i]:row_ptr[i + 1]`` of ``U`` and the rated columns
    ``pair_ptr[i]:pair_ptr[i + 1]`` of ``P``; per client, the same arithmetic as the
    per-client functions: the pending pull, then (``action``) the gradient step of
    ``_client_grads`` with the ``auto_steps`` curvature steps (``auto``) or Adam, or a pull.
    ``pull_after``: the client's pull is left pending (l2gd's upload round). With ``auto``,
    ``lr`` is the safety factor of the curvature steps.

    Every client steps every round, so this is a pass over all the ratings: the scores of a
    row's entries are computed four at a time (independent sums, each in the per-client
    order, so the values are the same bits) and the plain step has no call per coordinate.
    """
    indptr, data, row_ptr, pair_ptr, pair, cols = pairs
    (action, pull_after, eta, sigmoid, shift, span, alpha_u, reg_v, reg, scale, lr, auto, adam,
     biased) = settings
    t, mU, vU, mP, vP = moments
    d = U.shape[1]
    max_rows = 0
    max_pairs = 0
    for i in range(active.shape[0]):
        max_rows = max(max_rows, row_ptr[i + 1] - row_ptr[i])
        max_pairs = max(max_pairs, pair_ptr[i + 1] - pair_ptr[i])
    gU = np.empty((max_rows, d))
    gP = np.empty((max_pairs, d))
    step_u = np.zeros(max_rows)
    step_p = np.zeros(max_pairs)
    u_norm = np.empty(max_rows)
    v_norm = np.empty(max_pairs)
    z4 = np.empty(4)
    data_curv = 2.0 * scale * (0.16 if sigmoid else 1.0)
    for i in range(active.shape[0]):
        if not active[i]:
            continue
        r0, r1, q0, q1 = row_ptr[i], row_ptr[i + 1], pair_ptr[i], pair_ptr[i + 1]
        if pending[i]:
            _pull_rows(P, q0, q1, Vbar, cols, eta)
        pending[i] = pull_after
        if action == _PULL:
            _pull_rows(P, q0, q1, Vbar, cols, eta)
        if action != _STEP:
            continue
        gU[: r1 - r0] = 0.0
        gP[: q1 - q0] = 0.0
        if auto:
            step_u[: r1 - r0] = 0.0
            step_p[: q1 - q0] = 0.0
            _row_norms(U, r0, r1, u_norm)
            _row_norms(P, q0, q1, v_norm)
        for r in range(r0, r1):
            s, s1 = indptr[r], indptr[r + 1]
            while s < s1:
                k = 4 if s + 4 <= s1 else 1
                if k == 4:
                    z4[0], z4[1], z4[2], z4[3] = _scores4(
                        U, r, P, _pair_of(pair, s), _pair_of(pair, s + 1),
                        _pair_of(pair, s + 2), _pair_of(pair, s + 3))
                else:
                    z4[0] = row_dot(U, r, P, _pair_of(pair, s))
                for c in range(s, s + k):
                    q = _pair_of(pair, c)
                    z = z4[c - s]
                    e, g = _residual(z, data[c], sigmoid, shift, span)
                    for a in range(d):
                        gU[r - r0, a] += g * P[q, a]
                        gP[q - q0, a] += g * U[r, a]
                    if auto:  # auto_steps' Gershgorin sums
                        res = 1.0 if sigmoid else abs(z - data[c])
                        cross = u_norm[r - r0] * v_norm[q - q0] + res
                        step_u[r - r0] += v_norm[q - q0] ** 2 + cross
                        step_p[q - q0] += u_norm[r - r0] ** 2 + cross
                s += k
        lr_u = lr
        lr_p = lr
        rate = bias2 = 1.0
        if adam:
            t[i] += 1
            rate = lr / (1 - 0.9 ** t[i])
            bias2 = 1 - 0.999 ** t[i]
        for r in range(r0, r1):
            if auto:
                lr_u = lr / max(data_curv * step_u[r - r0] + 2.0 * scale * alpha_u, 1e-12)
            for a in range(d):
                g = scale * (gU[r - r0, a] + 2.0 * alpha_u * U[r, a])
                _descend(U, mU, vU, r, a, g, adam, lr_u, rate, bias2)
            if biased:
                U[r, d - 1] = 1.0
        for q in range(q0, q1):
            if auto:
                lr_p = lr / max(data_curv * step_p[q - q0] + (2.0 * scale * reg_v + reg), 1e-12)
            j = cols[q]
            for a in range(d):
                g = scale * (gP[q - q0, a] + 2.0 * reg_v * P[q, a]) + reg * (P[q, a] - Vbar[j, a])
                _descend(P, mP, vP, q, a, g, adam, lr_p, rate, bias2)
            if biased:
                P[q, d - 2] = 1.0


@njit(cache=True, nogil=True)
def _group_sums(indptr, data, row_ptr, pair_ptr, pair, cols, U, P, W, Vbar, pending, eta,
                sigmoid, shift, span):
    """``_client_sums`` summed over the clients of a group, each client's columns pulled
    first when its pull is pending (``_rfrec_protocol._pulled``).

    With one row per client (``pair`` empty: column ``s`` is entry ``s``'s) and no pending
    pull, an entry's fit and errors and its column's ``psi`` and ``sq`` terms are summed in
    one pass (each sum in the same order as the two passes of the general case, so the same
    bits; the five sums overlap instead of waiting on one another)."""
    d = U.shape[1]
    fit = sse = ae = psi = sq = 0.0
    p = np.empty(d)
    for i in range(row_ptr.shape[0] - 1):
        if pair.shape[0] == 0 and row_ptr[i + 1] - row_ptr[i] == 1 and not pending[i]:
            r = row_ptr[i]
            for s in range(indptr[r], indptr[r + 1]):
                j = cols[s]
                z = zbar = 0.0
                for a in range(d):
                    pa, va, wa = P[s, a], Vbar[j, a], W[j, a]
                    z += U[r, a] * pa
                    zbar += U[r, a] * va
                    psi += (pa - va) ** 2 - (wa - va) ** 2
                    sq += pa ** 2 - wa ** 2
                e = _residual(z, data[s], sigmoid, shift, span)[0]
                ebar = _rating_error(zbar, data[s], sigmoid, shift, span)
                fit += e * e
                sse += ebar * ebar
                ae += abs(ebar)
            continue
        for r in range(row_ptr[i], row_ptr[i + 1]):
            for s in range(indptr[r], indptr[r + 1]):
                q = _pair_of(pair, s)
                j = cols[q]
                z = 0.0
                zbar = 0.0
                for a in range(d):
                    pa = P[q, a]
                    if pending[i]:
                        pa = pa - eta * (pa - Vbar[j, a])
                    z += U[r, a] * pa
                    zbar += U[r, a] * Vbar[j, a]
                e = _residual(z, data[s], sigmoid, shift, span)[0]
                ebar = _rating_error(zbar, data[s], sigmoid, shift, span)
                fit += e * e
                sse += ebar * ebar
                ae += abs(ebar)
        for q in range(pair_ptr[i], pair_ptr[i + 1]):
            j = cols[q]
            for a in range(d):
                p[a] = P[q, a]
                if pending[i]:
                    p[a] = p[a] - eta * (p[a] - Vbar[j, a])
                psi += (p[a] - Vbar[j, a]) ** 2 - (W[j, a] - Vbar[j, a]) ** 2
                sq += p[a] ** 2 - W[j, a] ** 2
    return fit, psi, sq, sse, ae
