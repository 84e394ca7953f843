"""The Elb regularizer, its proximal operators and the local iPALM / MU steps (pure functions).

Notation of the Felb paper (Section 3): a client holds a binary ``A`` (n_i x m, CSR with unit
data) and
fits ``A ~ U V`` with the scaled objective of its Section 3.1::

    F(U, V; Vh) = 1/2 ||A - U V||_F^2 + R'(U) + R'(V) + (gamma/2) ||V - Vh||_F^2
    R'(X)       = sum_x min{kappa |x| + lam/2 x^2,  kappa |x - 1| + lam/2 (x - 1)^2}  (x >= 0)

The update formulas (paper eqs. 6-8, Algorithm 1) are exact proximal-gradient steps for ``F``.
``A`` is never densified: every product is CSR x dense or k x k.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._kernels import squared_distance

__all__ = [
    "PROX_MODES",
    "elb_value",
    "integrality_gap_values",
    "lam_at",
    "local_steps",
    "loss_terms",
    "prox_elb",
    "prox_proximity",
    "squared_distance",
    "transposed_block",
    "u_step",
    "v_step",
]

PROX_MODES = ("exact_nonneg", "exact", "paper", "paper_nonneg")
EPS_LIPSCHITZ = 1e-4  # floor of ||Gram||_F (as in the authors' code)
EPS_MU = 1e-12  # floor of the MU denominators (Felb-MU)


def prox_elb(X, a, c, mode="exact_nonneg"):
    """Elementwise prox of the Elb regularizer with L1 weight ``a`` and quadratic weight ``c``.

    ``exact_nonneg`` (default) is ``argmin_{y >= 0} 1/2 (y - x)^2 + min{a|y| + c/2 y^2,
    a|y - 1| + c/2 (y - 1)^2}``; the 0-branch wins iff ``x <= 1/2``. ``exact`` drops the
    constraint ``y >= 0``. ``paper`` is the paper's eq. 6, which omits the soft-threshold dead
    zones, and ``paper_nonneg`` clamps it at 0 as the authors' code does. ``a`` and ``c`` may
    be arrays (Felb-MU's per-entry steps).
    """
    X = np.asarray(X, dtype=float)
    low = X <= 0.5
    if mode in ("exact_nonneg", "exact"):
        if mode == "exact_nonneg":
            zero = np.maximum(X - a, 0.0)
        else:
            zero = np.sign(X) * np.maximum(np.abs(X) - a, 0.0)
        one_dev = X - 1.0
        one = 1.0 + np.sign(one_dev) * np.maximum(np.abs(one_dev) - a, 0.0) / (1.0 + c)
        return np.where(low, zero / (1.0 + c), one)
    if mode in ("paper", "paper_nonneg"):
        zero = (X - a * np.sign(X)) / (1.0 + c)
        one = (X - a * np.sign(X - 1.0) + c) / (1.0 + c)
        out = np.where(low, zero, one)
        return np.maximum(out, 0.0) if mode == "paper_nonneg" else out
    raise ValueError(f"Unknown prox mode {mode!r}; expected one of {PROX_MODES}.")


def prox_proximity(X, s, Vh):
    """``(X + s Vh) / (1 + s)``: the prox of ``(s/2) ||. - Vh||^2`` (paper eq. 7)."""
    return (X + s * Vh) / (1.0 + s)


def elb_value(X, kappa, lam):
    """``R'(X)`` (halved quadratic weight, Section 3.1); 0 exactly on Boolean matrices."""
    X = np.asarray(X, dtype=float)
    return float(_elb_sum(X.ravel(order="K"), float(kappa), float(lam)))  # (no copy if F)


@njit(cache=True, nogil=True)
def _elb_sum(x, kappa, lam):
    """:func:`elb_value` in one pass (the fits evaluate it on ``k x m`` every round)."""
    total = 0.0
    for v in x:
        d = v - 1.0
        total += min(kappa * abs(v) + 0.5 * lam * v * v, kappa * abs(d) + 0.5 * lam * d * d)
    return total


def integrality_gap_values(X):
    """``min(|x|, |1 - x|)`` per entry."""
    X = np.asarray(X, dtype=float)
    return np.minimum(np.abs(X), np.abs(1.0 - X))


def transposed_block(block):
    """``A^T`` as CSR: the one cut once per fit with the block, else made here."""
    Xt = getattr(block, "Xt", None)
    return Xt if Xt is not None else block.X.T.tocsr()


def lam_at(t, lam, growth, lam_max):
    """``min(lam * growth**t, lam_max)`` without overflowing for large ``t``."""
    if growth == 1.0 or lam == 0.0:
        return min(lam, lam_max)
    log_value = math.log(lam) + t * math.log(growth)
    return lam_max if log_value >= math.log(lam_max) else math.exp(log_value)


def loss_terms(A, U, V, AVt=None):
    """``||A - U V||_F^2`` for a binary CSR ``A`` without forming ``U V``."""
    if AVt is None:  # (compiled: scipy's product with the strided V.T took twice as long)
        AVt = _rows_times(A.indptr, A.indices, np.asarray(A.data, dtype=np.float64),
                          np.ascontiguousarray(V.T, dtype=np.float64))
    fit = A.nnz - 2.0 * float(np.vdot(U, AVt)) + float(np.vdot(U.T @ U, V @ V.T))
    return max(fit, 0.0)


_MODE_CODE = {mode: i for i, mode in enumerate(PROX_MODES)}


@njit(cache=True, nogil=True)
def _prox_scalar(x, a, c, mode):
    if mode >= 2:  # paper's eq. 6, optionally clamped at 0
        y = x - a * np.sign(x) if x <= 0.5 else x - a * np.sign(x - 1.0) + c
        y /= 1.0 + c
        return max(y, 0.0) if mode == 3 else y
    if x <= 0.5:
        y = max(x - a, 0.0) if mode == 0 else np.sign(x) * max(abs(x) - a, 0.0)
        return y / (1.0 + c)
    d = x - 1.0
    return 1.0 + np.sign(d) * max(abs(d) - a, 0.0) / (1.0 + c)


@njit(cache=True, nogil=True, inline="always")
def _step_entry(xb, xg, b, vh, eta0, mu, kappa, lam, gamma, joint, mode):
    """One entry of the fused gradient step, Elb prox and proximity pull (see _step_kernel)."""
    eta = xb / max(xg, EPS_MU) if mu else eta0
    x = xb - eta * (xg - b)
    a, c = eta * kappa, eta * lam
    if gamma > 0.0:
        s = eta * gamma
        if joint:
            return _prox_scalar((x + s * vh) / (1.0 + s), a / (1.0 + s), c / (1.0 + s), mode)
        return (_prox_scalar(x, a, c, mode) + s * vh) / (1.0 + s)
    return _prox_scalar(x, a, c, mode)


@njit(cache=True, nogil=True)
def _palm_constants(eta0, kappa, lam, gamma, joint, mode):
    """The loop constants of :func:`_palm_entry`: with one step ``eta0`` for every entry (PALM)
    the thresholds and the pulls are the same everywhere. A pull that does not apply is 0,
    which leaves the value unchanged exactly."""
    a, c = eta0 * kappa, eta0 * lam
    s = eta0 * gamma
    s_joint = s if joint else 0.0
    s_seq = 0.0 if joint else s
    if s_joint:
        a, c = a / (1.0 + s), c / (1.0 + s)
    return a, c, s_joint, s_seq, 1.0 if mode == 1 else 0.0


@njit(cache=True, nogil=True, inline="always")
def _palm_entry(xb, xg, b, vh, eta0, a, c, s_joint, s_seq, signed):
    """:func:`_step_entry` for PALM with the exact prox (modes 0 and 1), without branches so
    that the loops over it vectorize (the per-entry prox was most of a V step). Bit for bit
    the same values: ``max(d - a, 0) + min(d + a, 0)`` is ``sign(d) max(|d| - a, 0)``."""
    x = xb - eta0 * (xg - b)
    x = (x + s_joint * vh) / (1.0 + s_joint)
    low = (max(x - a, 0.0) + signed * min(x + a, 0.0)) / (1.0 + c)
    d = x - 1.0
    high = 1.0 + (max(d - a, 0.0) + min(d + a, 0.0)) / (1.0 + c)
    y = low if x <= 0.5 else high
    return (y + s_seq * vh) / (1.0 + s_seq)


@njit(cache=True, nogil=True)
def _step_kernel(Xbar, XG, B, eta0, mu, kappa, lam, gamma, Vh, joint, mode, out):
    """Fused gradient step, Elb prox and proximity pull in one pass over the entries.

    The gradient is ``XG - B`` (``Xbar Gram - A V^T`` or ``Gram Xbar - U^T A``); ``eta = eta0``
    (PALM) or ``Xbar / max(XG, eps)`` per entry (MU). ``gamma = 0`` skips the proximity
    (``Vh`` is then unused). ``B`` may be a transposed view.
    """
    if not mu and mode <= 1:
        a, c, s_joint, s_seq, signed = _palm_constants(eta0, kappa, lam, gamma, joint, mode)
        for i in range(Xbar.shape[0]):
            for j in range(Xbar.shape[1]):
                out[i, j] = _palm_entry(Xbar[i, j], XG[i, j], B[i, j], Vh[i, j], eta0, a, c,
                                        s_joint, s_seq, signed)
        return out
    for i in range(Xbar.shape[0]):
        for j in range(Xbar.shape[1]):
            out[i, j] = _step_entry(Xbar[i, j], XG[i, j], B[i, j], Vh[i, j], eta0, mu, kappa,
                                    lam, gamma, joint, mode)
    return out


@njit(cache=True, nogil=True)
def _extrapolate_kernel(X, X_prev, beta, clamp, out):
    for i in range(X.shape[0]):
        for j in range(X.shape[1]):
            y = X[i, j] + beta * (X[i, j] - X_prev[i, j])
            out[i, j] = max(y, 0.0) if clamp else y
    return out


def _extrapolate(X, X_prev, beta, mu):
    """``X + beta (X - X_prev)``; clamped at 0 for MU, where a negative extrapolation would
    make the step negative and blow up."""
    if not beta and not mu:
        return X
    return _extrapolate_kernel(X, X_prev, float(beta), mu, np.empty_like(X))


def _prox_step(Xbar, XG, B, gram, *, kappa, lam_t, update, prox_mode, step_scale, gamma=0.0,
               Vh=None, proximity="sequential"):
    mu = update == "mu"
    eta0 = 0.0 if mu else step_scale / max(np.linalg.norm(gram), EPS_LIPSCHITZ)
    if not gamma or Vh is None:
        gamma, Vh = 0.0, Xbar
    return _step_kernel(Xbar, XG, B, eta0, mu, float(kappa), float(lam_t), float(gamma),
                        np.asarray(Vh, dtype=np.float64), proximity == "joint",
                        _MODE_CODE[prox_mode], np.empty_like(Xbar))


def u_step(U, U_prev, V, A, *, kappa, lam_t, beta, update="palm", prox_mode="exact_nonneg",
           step_scale=1.0):
    """One inertial proximal step on ``U`` (Algorithm 1's local iPALM step; Felb-MU's steps);
    returns ``(U_new, U)``.

    PALM: ``eta = step_scale / max(||V V^T||_F, 1e-4)``; MU: ``eta = Ubar / (Ubar V V^T)``.
    """
    Ubar = _extrapolate(U, U_prev, beta, update == "mu")
    S = V @ V.T
    return _prox_step(Ubar, Ubar @ S, A @ V.T, S, kappa=kappa, lam_t=lam_t, update=update,
                      prox_mode=prox_mode, step_scale=step_scale), U


def v_step(V, V_prev, U, At, Vh, *, kappa, lam_t, beta, gamma, update="palm",
           prox_mode="exact_nonneg", proximity="sequential", step_scale=1.0):
    """One inertial proximal step on ``V`` with the pull towards ``Vh``; returns ``(V_new, V)``.

    ``At`` is ``A.T`` as CSR (``U^T A`` is computed as ``(A^T U)^T``). ``proximity`` is the
    paper's ``"sequential"`` Elb prox then proximity prox, or the exact ``"joint"`` prox.
    """
    Vbar = _extrapolate(V, V_prev, beta, update == "mu")
    Q = U.T @ U
    return _prox_step(Vbar, Q @ Vbar, (At @ U).T, Q, kappa=kappa, lam_t=lam_t, update=update,
                      prox_mode=prox_mode, step_scale=step_scale, gamma=gamma, Vh=Vh,
                      proximity=proximity), V


def local_steps(U, U_prev, V, V_prev, A, At, Vh, *, t0, n_steps, update_v=True, kappa, beta,
                update="palm", prox_mode="exact_nonneg", step_scale=1.0, gamma=0.0,
                proximity="sequential", **schedule):
    """``n_steps`` Gauss-Seidel iPALM steps (U block then V block with the new U).

    ``schedule`` is the keyword group of the quadratic weight, every key required:
    ``lam, growth, lam_max, rate_unit, sync_every`` (:func:`lam_schedule`); the weight of
    step ``t = t0 + s`` is ``lam_t = min(lam * growth**e, lam_max)`` with ``e = t``
    (``rate_unit="local"``) or ``t // sync_every`` (``"sync"``).
    ``update_v=False`` runs U-only steps (fold-in against a fixed ``V``); ``At`` (``A.T`` as
    CSR) is then not needed. The steps are :func:`u_step` and :func:`v_step`, fused into one
    compiled loop: called step by step, their small products left a client's update mostly
    Python overhead, which held the GIL and kept ``n_jobs=2`` from going faster.

    The returned ``V`` and ``V_prev`` are ``k x m`` arrays in Fortran order (item-major
    memory, the layout the compiled V block works in); a ``V`` or ``Vh`` given in that order
    is used without a copy.
    """
    lam_ts = lam_schedule(t0, n_steps, **schedule)
    if not update_v:
        At = A[:0].T.tocsr()  # unused; an empty stand-in for the compiled signature
    if Vh is None or not gamma:
        Vh, gamma = V, 0.0
    f64 = np.float64

    def items_major(F):  # F^T C-contiguous: a view of a Fortran-ordered F
        return np.ascontiguousarray(np.asarray(F, dtype=f64).T)

    U, U_prev, Vt, Vt_prev = _fused_local_steps(
        A.indptr, A.indices, np.asarray(A.data, dtype=f64), At.indptr, At.indices,
        np.asarray(At.data, dtype=f64), np.ascontiguousarray(U, dtype=f64),
        np.ascontiguousarray(U_prev, dtype=f64), items_major(V), items_major(V_prev),
        items_major(Vh), lam_ts, update_v, float(kappa), float(beta), update == "mu",
        _MODE_CODE[prox_mode], float(step_scale), float(gamma), proximity == "joint",
    )
    return U, U_prev, Vt.T, Vt_prev.T


def lam_schedule(t0, n_steps, *, lam, growth, lam_max, rate_unit, sync_every):
    """The quadratic weights ``lam_t`` of steps ``t0 .. t0 + n_steps - 1``
    (:func:`local_steps`)."""
    return np.array([lam_at(t if rate_unit == "local" else t // sync_every, lam, growth,
                            lam_max) for t in range(t0, t0 + n_steps)], dtype=np.float64)


# Items per tile of the V block: its buffers (a few 256 x k arrays) stay in the L1/L2 cache.
_TILE = 256


@njit(cache=True, nogil=True)
def _gram_norm(F):
    """``F^T F`` (BLAS) and its Frobenius norm."""
    G = np.dot(F.T, F)
    return G, np.sqrt(np.sum(G * G))


@njit(cache=True, nogil=True)
def _rows_times(indptr, indices, data, Ft):
    """``A F^T`` for a CSR ``A``, given ``F^T`` C-contiguous."""
    r = Ft.shape[1]
    out = np.zeros((indptr.shape[0] - 1, r))
    for i in range(out.shape[0]):
        for p in range(indptr[i], indptr[i + 1]):
            j, x = indices[p], data[p]
            for a in range(r):
                out[i, a] += x * Ft[j, a]
    return out


@njit(cache=True, nogil=True)
def _fused_local_steps(A_indptr, A_indices, A_data, At_indptr, At_indices, At_data, U, U_prev,
                       Vt, Vt_prev, Vht, lam_ts, update_v, kappa, beta, mu, mode, step_scale,
                       gamma, joint):
    """:func:`local_steps` compiled: per step, :func:`u_step` then :func:`v_step`.

    The item factor is held item-major (``Vt = V^T``, ``m x k``, C-contiguous): an item's
    ``k`` values, its row of ``U^T A`` and its contribution to ``A V^T`` are each one
    contiguous row, so every pass over the V block reads and writes memory in order (the
    ``k x m`` layout took a strided gather and two transposes per tile, about a third of a
    step). The V block is the bulk of the work (``m x k`` per step, against ``n_i x k`` for
    U) and is bound by memory traffic more than by arithmetic, so it runs tile by tile over
    the items: each tile is extrapolated, multiplied by ``U^T U``, gathered from ``A^T``,
    stepped and written once, and the next U step's ``V V^T`` and ``A V^T`` are accumulated
    from the written tile in the same pass (``A V^T`` scattered into the client's small
    ``n_i x k`` array instead of gathered from all of ``V``). ``A`` is read only for the
    first ``A V^T``. An item without data whose ``V``, ``V_prev`` and ``Vh`` are 0 stays
    exactly 0 (zero gradient, ``prox(0) = 0``, no pull). The values are those of
    :func:`u_step` and :func:`v_step` up to the order of floating-point sums.
    """
    m, r = U.shape
    n = Vt.shape[0]
    Bu = _rows_times(A_indptr, A_indices, A_data, Vt)  # A V^T
    S, norm_s = _gram_norm(Vt)  # V V^T
    tile = min(_TILE, max(n, 1))
    Vb, XG, B = np.empty((tile, r)), np.empty((tile, r)), np.empty((tile, r))
    S_tile = np.empty((r, r))
    extrapolate = beta != 0.0 or mu
    # Step s writes its iterates into buffer s % 2, which from s = 2 on holds the previous
    # iterate: a tile of it is read (extrapolation) before the same tile is written. The
    # inputs are never written (V and V_prev are the shared Vh at a sync). Fresh arrays every
    # step cost page faults and cache misses (a few per cent of a step).
    ubufs, Ubar_buf = (np.empty_like(U), np.empty_like(U)), np.empty_like(U)
    vbufs = (np.empty_like(Vt), np.empty_like(Vt)) if update_v else (Vt, Vt)
    palm = not mu and mode <= 1
    for s in range(lam_ts.shape[0]):
        lam_t = lam_ts[s]
        # U block: gradient Ubar (V V^T) - A V^T at the extrapolated point
        Ubar = _extrapolate_kernel(U, U_prev, beta, mu, Ubar_buf) if extrapolate else U
        XGu = np.dot(Ubar, S)
        eta0 = 0.0 if mu else step_scale / max(norm_s, EPS_LIPSCHITZ)
        # (a run-time False: a literal one compiled _step_kernel a second time)
        U_new = _step_kernel(Ubar, XGu, Bu, eta0, mu, kappa, lam_t, 0.0, Ubar, bool(0), mode,
                             ubufs[s % 2])
        U_prev, U = U, U_new
        if not update_v:
            continue
        # V block with the new U: gradient Vbar (U^T U) - (U^T A)^T, pulled towards Vh
        Q, norm_q = _gram_norm(U)
        eta0 = 0.0 if mu else step_scale / max(norm_q, EPS_LIPSCHITZ)
        ca, cc, s_joint, s_seq, signed = _palm_constants(eta0, kappa, lam_t, gamma, joint, mode)
        Vt_new = vbufs[s % 2]
        S[:] = 0.0
        Bu[:] = 0.0  # (read by this step's U block; it owns the array since _rows_times)
        more = s + 1 < lam_ts.shape[0]  # (the last step needs no next V V^T, A V^T)
        for j0 in range(0, n, tile):
            w = min(tile, n - j0)
            Vbw, XGw, Bw, Vn = Vb[:w], XG[:w], B[:w], Vt_new[j0 : j0 + w]
            # (the elementwise passes run over the tile's rows as one flat run, which
            # compiles to vector loops)
            vb, xg, b, vn = Vbw.reshape(-1), XGw.reshape(-1), Bw.reshape(-1), Vn.reshape(-1)
            v0, vp, vh = (Vt[j0 : j0 + w].reshape(-1), Vt_prev[j0 : j0 + w].reshape(-1),
                          Vht[j0 : j0 + w].reshape(-1))
            if extrapolate:
                for i in range(vb.shape[0]):
                    v = v0[i] + beta * (v0[i] - vp[i])
                    vb[i] = max(v, 0.0) if mu else v
            else:
                vb[:] = v0
            np.dot(Vbw, Q, XGw)  # (Q is symmetric: the rows of (Q Vbar)^T)
            for jj in range(w):  # U^T A, item by item, into the rows of B
                for a in range(r):
                    Bw[jj, a] = 0.0
                for p in range(At_indptr[j0 + jj], At_indptr[j0 + jj + 1]):
                    x, row = At_data[p], At_indices[p]
                    for a in range(r):
                        Bw[jj, a] += x * U[row, a]
            if palm:
                for i in range(vn.shape[0]):
                    vn[i] = _palm_entry(vb[i], xg[i], b[i], vh[i], eta0, ca, cc, s_joint, s_seq,
                                        signed)
            else:
                for i in range(vn.shape[0]):
                    vn[i] = _step_entry(vb[i], xg[i], b[i], vh[i], eta0, mu, kappa, lam_t, gamma,
                                        joint, mode)
            if not more:
                continue
            np.dot(Vn.T, Vn, S_tile)
            S += S_tile
            for jj in range(w):  # the next A V^T, scattered into the rows (in item order)
                for p in range(At_indptr[j0 + jj], At_indptr[j0 + jj + 1]):
                    x, row = At_data[p], At_indices[p]
                    for a in range(r):
                        Bu[row, a] += x * Vn[jj, a]
        norm_s = np.sqrt(np.sum(S * S))
        Vt_prev, Vt = Vt, Vt_new
    return U, U_prev, Vt, Vt_prev
