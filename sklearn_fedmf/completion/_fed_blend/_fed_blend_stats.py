"""The blend's statistics and its ridge solve: pure functions on numpy arrays.

A client ``c`` holds its validation ratings ``r`` (minus the training mean) and the members'
predictions ``P`` at them (minus the same mean), one column per member. With the design
``D = [1, P]`` (and, with activity weights, ``[z, z P]`` too, ``z`` its users' centred log
rating counts) it sends ``D^T D``, ``D^T r``, ``r^T r`` and its count: sums over its ratings,
so the server's totals are sums of the clients' (a secure sum covers them). The server solves

    min_theta  (1/N) ||r - D theta||^2 + final_alpha ||theta_P - 1/K||^2
               + final_alpha ||theta_zP||^2

(the intercepts are not penalized; the members' weights shrink toward the plain average of
the ``K`` members, as the Netflix Prize blends' ridge did toward a fixed blend).
"""

from __future__ import annotations

import numpy as np

__all__ = ["blend_design", "blend_penalty", "blend_sse", "client_blend_stats", "member_sse",
           "solve_blend", "stats_vector", "unpack_stats", "GCV_GRID"]


def blend_design(P, z=None):
    """The design ``[1, P]``, or ``[1, P, z, z P]`` with the users' activity ``z``."""
    ones = np.ones((P.shape[0], 1))
    if z is None:
        return np.hstack([ones, P])
    z = np.asarray(z, dtype=np.float64)[:, None]
    return np.hstack([ones, P, z, z * P])


def client_blend_stats(P, r, z=None):
    """One client's upload: ``{"gram": D^T D, "cross": D^T r, "ss": [r^T r], "count": [n]}``
    over its validation ratings (``P`` and ``r`` minus the training mean)."""
    D = blend_design(P, z)
    return {"gram": D.T @ D, "cross": D.T @ r, "ss": np.array([float(r @ r)]),
            "count": np.array([float(r.shape[0])])}


def stats_vector(stats):
    """A client's statistics as one flat vector (what a secure sum adds)."""
    return np.concatenate([stats["gram"].ravel(), stats["cross"], stats["ss"]])


def unpack_stats(vector, n_columns):
    """The inverse of :func:`stats_vector`: ``(gram, cross, ss)``."""
    k2 = n_columns * n_columns
    return (vector[:k2].reshape(n_columns, n_columns), vector[k2:k2 + n_columns],
            float(vector[k2 + n_columns]))


def blend_penalty(n_members, activity, target=None, free_slope=True):
    """``(diagonal, target)`` of the ridge penalty over the design's columns: the members'
    weights toward ``target`` (default ``1/K`` each), the members' activity slopes toward 0,
    the intercept free, and the intercept's activity slope free (``free_slope``) or toward
    0."""
    diag = np.concatenate([[0.0], np.ones(n_members)])
    prior = np.full(n_members, 1.0 / n_members) if target is None else np.asarray(target)
    target = np.concatenate([[0.0], prior])
    if activity:
        diag = np.concatenate([diag, [0.0 if free_slope else 1.0], np.ones(n_members)])
        target = np.concatenate([target, np.zeros(n_members + 1)])
    return diag, target


# the strengths generalized cross-validation tries, over the validation count (0: none; inf:
# the prior alone)
GCV_GRID = np.concatenate([[0.0], np.geomspace(1e-4, 10.0, 16), [np.inf]])


def _ridge(gram, cross, n, alpha, diag, target):
    if np.isinf(alpha):  # (the penalized columns at their target, the free ones fitted)
        free = diag == 0
        coef = target.astype(np.float64).copy()
        rhs = cross[free] - gram[np.ix_(free, ~free)] @ coef[~free]
        coef[free] = np.linalg.lstsq(gram[np.ix_(free, free)] / n, rhs / n, rcond=None)[0]
        return coef, float(free.sum())
    A = (gram + np.diag(alpha * diag)) / n
    b = (cross + alpha * diag * target) / n
    # (lstsq: a member identical to another, or a client-free column, leaves A singular)
    coef = np.linalg.lstsq(A, b, rcond=None)[0]
    return coef, float(np.trace(np.linalg.lstsq(A, gram / n, rcond=None)[0]))


def solve_blend(gram, cross, count, *, alpha, n_members, activity, target="mean", ss=None,
                info=False, free_slope=True, min_alpha=0.0):
    """The ridge coefficients over the design's columns from the summed statistics.

    ``target="mean"`` shrinks the members' weights toward ``1/K``; ``"best"`` toward 1 on
    the member of lowest validation error and 0 on the others. ``alpha="gcv"`` picks the
    strength on :data:`GCV_GRID` (times the count) by generalized cross-validation,
    ``RSS / (n (1 - df / n)^2)`` with ``df`` the trace of the ridge's hat matrix: both from
    the sums (``ss`` needed). ``info``: also return ``{"alpha", "df"}``."""
    n = max(float(count), 1.0)  # (both sides over the count: the same solution, scaled to 1)
    prior = None
    if target == "best":
        prior = np.zeros(n_members)
        prior[int(np.argmin(member_sse(gram, cross, 0.0, n_members)))] = 1.0
    elif target == "soft":
        sse = member_sse(gram, cross, ss, n_members)
        sigma2 = max(sse.min() / n, 1e-300)
        prior = np.exp(-(sse - sse.min()) / (2 * sigma2))
        prior /= prior.sum()
    diag, goal = blend_penalty(n_members, activity, prior, free_slope)
    if alpha == "gcv":
        best = None
        for a in np.maximum(GCV_GRID * n, min_alpha):
            coef, df = _ridge(gram, cross, n, a, diag, goal)
            rss = max(blend_sse(gram, cross, ss, coef), 0.0)
            gcv = rss / n / max(1.0 - df / n, 1e-12) ** 2
            if best is None or gcv < best[0]:
                best = (gcv, coef, a, df)
        _, coef, alpha, df = best
    else:
        coef, df = _ridge(gram, cross, n, alpha, diag, goal)
    return (coef, {"alpha": alpha, "df": df}) if info else coef


def member_sse(gram, cross, ss, n_members):
    """Each member's squared-error sum on the validation ratings, from the statistics: the
    member's column ``k`` of ``D`` gives ``r^T r - 2 p_k^T r + p_k^T p_k``."""
    idx = np.arange(1, n_members + 1)
    return ss - 2 * cross[idx] + gram[idx, idx]


def blend_sse(gram, cross, ss, coef):
    """The blend's squared-error sum on the validation ratings: ``||r - D theta||^2``."""
    return float(ss - 2 * coef @ cross + coef @ gram @ coef)
