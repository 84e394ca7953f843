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
           "solve_blend", "stats_vector", "unpack_stats"]


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


def blend_penalty(n_members, activity):
    """``(diagonal, target)`` of the ridge penalty over the design's columns: the members'
    weights toward ``1/K``, the activity slopes toward 0, the intercepts free."""
    diag = np.concatenate([[0.0], np.ones(n_members)])
    target = np.concatenate([[0.0], np.full(n_members, 1.0 / n_members)])
    if activity:
        diag = np.concatenate([diag, [0.0], np.ones(n_members)])
        target = np.concatenate([target, np.zeros(n_members + 1)])
    return diag, target


def solve_blend(gram, cross, count, *, alpha, n_members, activity):
    """The ridge coefficients over the design's columns from the summed statistics."""
    diag, target = blend_penalty(n_members, activity)
    n = max(float(count), 1.0)  # (both sides over the count: the same solution, scaled to 1)
    A = (gram + np.diag(alpha * diag)) / n
    b = (cross + alpha * diag * target) / n
    # (lstsq: a member identical to another, or a client-free column, leaves A singular)
    return np.linalg.lstsq(A, b, rcond=None)[0]


def member_sse(gram, cross, ss, n_members):
    """Each member's squared-error sum on the validation ratings, from the statistics: the
    member's column ``k`` of ``D`` gives ``r^T r - 2 p_k^T r + p_k^T p_k``."""
    idx = np.arange(1, n_members + 1)
    return ss - 2 * cross[idx] + gram[idx, idx]


def blend_sse(gram, cross, ss, coef):
    """The blend's squared-error sum on the validation ratings: ``||r - D theta||^2``."""
    return float(ss - 2 * coef @ cross + coef @ gram @ coef)
