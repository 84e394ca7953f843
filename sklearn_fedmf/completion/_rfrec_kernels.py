"""Numba kernels of RFRec / RFRecF: the per-entry gradients and sums of a client's fit term,
the scatter of uploads into the server's average, and the fold-in through the sigmoid link."""

import numpy as np
from numba import njit


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
            z = 0.0
            for a in range(d):
                z += U[t, a] * P[q, a]
            if sigmoid:
                sg = 1.0 / (1.0 + np.exp(-z))
                e = sg - (data[s] + shift) / span
                g = 2.0 * e * sg * (1.0 - sg)
            else:
                e = z - data[s]
                g = 2.0 * e
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
    federated model ``u . vbar``: ``(fit, psi_rated, sq_rated, sse, sum |e|)``."""
    d = U.shape[1]
    fit = sse = ae = psi = sq = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            q, j = pair[s], cols[pair[s]]
            z = 0.0
            zbar = 0.0
            for a in range(d):
                z += U[t, a] * P[q, a]
                zbar += U[t, a] * Vbar[j, a]
            if sigmoid:
                e = 1.0 / (1.0 + np.exp(-z)) - (data[s] + shift) / span
                ebar = span / (1.0 + np.exp(-zbar)) - shift - data[s]
            else:
                e = z - data[s]
                ebar = zbar - data[s]
            fit += e * e
            sse += ebar * ebar
            ae += abs(ebar)
    for q in range(P.shape[0]):
        j = cols[q]
        for a in range(d):
            psi += (P[q, a] - Vbar[j, a]) ** 2 - (W[j, a] - Vbar[j, a]) ** 2
            sq += P[q, a] ** 2 - W[j, a] ** 2
    return fit, psi, sq, sse, ae



@njit(cache=True, nogil=True)
def _errors_at(indptr, indices, data, U, Vbar, sigmoid, shift, span):
    """``(sum e^2, sum |e|)`` of the federated model ``u . vbar`` on the rating scale."""
    sse = ae = 0.0
    for t in range(U.shape[0]):
        for s in range(indptr[t], indptr[t + 1]):
            z = 0.0
            for a in range(U.shape[1]):
                z += U[t, a] * Vbar[indices[s], a]
            if sigmoid:
                e = span / (1.0 + np.exp(-z)) - shift - data[s]
            else:
                e = z - data[s]
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
