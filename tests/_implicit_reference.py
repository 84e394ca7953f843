"""Dense references of ``loss="implicit"`` (tests only): every user-item pair, in loops."""

import numpy as np


def dense_parts(X):
    """``(P, C)`` over every pair: preference 1 at a stored entry, confidence strength ``r``
    there (0 elsewhere)."""
    X = X.tocsr()
    P = np.zeros(X.shape)
    R = np.zeros(X.shape)
    for u in range(X.shape[0]):
        for s in range(X.indptr[u], X.indptr[u + 1]):
            P[u, X.indices[s]] = 1.0
            R[u, X.indices[s]] = X.data[s]
    return P, R


def dense_implicit_objective(X, U, Vt, *, confidence, alpha_u=0.0, alpha_v=0.0):
    """``1/2 sum_{u,i} c_ui (p_ui - u.v_i)^2 + alpha_u/2 ||U||^2 + alpha_v/2 ||V||^2``."""
    P, R = dense_parts(X)
    total = 0.0
    for u in range(P.shape[0]):
        for i in range(P.shape[1]):
            c = 1.0 + confidence * R[u, i]
            total += c * (P[u, i] - U[u] @ Vt[i]) ** 2
    return 0.5 * total + 0.5 * alpha_u * np.sum(U ** 2) + 0.5 * alpha_v * np.sum(Vt ** 2)


def dense_item_gradient(X, U, Vt, *, confidence):
    """The gradient in ``Vt`` of the data term, pair by pair."""
    P, R = dense_parts(X)
    G = np.zeros_like(Vt)
    for u in range(P.shape[0]):
        for i in range(P.shape[1]):
            c = 1.0 + confidence * R[u, i]
            G[i] += c * (U[u] @ Vt[i] - P[u, i]) * U[u]
    return G


def dense_user_gradient(X, U, Vt, *, confidence):
    """The gradient in ``U`` of the data term, pair by pair."""
    P, R = dense_parts(X)
    G = np.zeros_like(U)
    for u in range(P.shape[0]):
        for i in range(P.shape[1]):
            c = 1.0 + confidence * R[u, i]
            G[u] += c * (U[u] @ Vt[i] - P[u, i]) * Vt[i]
    return G


def dense_user_factors(X, Vt, *, confidence, alpha_u):
    """Each row's minimizer from the dense normal equations ``(V^T C_u V + alpha I) u =
    V^T C_u p_u``."""
    P, R = dense_parts(X)
    r = Vt.shape[1]
    U = np.zeros((P.shape[0], r))
    for u in range(P.shape[0]):
        C = np.diag(1.0 + confidence * R[u])
        U[u] = np.linalg.solve(Vt.T @ C @ Vt + alpha_u * np.eye(r), Vt.T @ C @ P[u])
    return U


def dense_preference_confidence(X, confidence):
    """``(P, C)``: preference 1 at the stored entries of the sparse ``X`` and 0 elsewhere;
    confidence ``1 + confidence * r`` there and 1 elsewhere."""
    P, R = dense_parts(X)
    return P, 1.0 + confidence * R


def dense_implicit_gradients(X, U, Vt, *, confidence):
    """Gradients of ``sum c (p - u . v)^2`` (no 1/2) in ``U`` and ``Vt``, pair by pair."""
    return (2.0 * dense_user_gradient(X, U, Vt, confidence=confidence),
            2.0 * dense_item_gradient(X, U, Vt, confidence=confidence))
