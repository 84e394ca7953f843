"""Dense references for ``loss="implicit"`` (tests only): every user-item pair, by loops."""

import numpy as np


def dense_preference_confidence(X, confidence):
    """``(P, C)``: preference 1 at the stored entries of the sparse ``X`` and 0 elsewhere;
    confidence ``1 + confidence * r`` there and 1 elsewhere."""
    X = X.tocoo()
    P = np.zeros(X.shape)
    C = np.ones(X.shape)
    for t, j, r in zip(X.row, X.col, X.data):
        P[t, j] = 1.0
        C[t, j] = 1.0 + confidence * r
    return P, C


def dense_implicit_objective(X, U, Vt, *, confidence, alpha_u=0.0, alpha_v=0.0):
    """``sum_{u,i} c_ui (p_ui - u_u . v_i)^2 + alpha_u ||U||^2 + alpha_v ||V||^2``, one pair
    at a time."""
    P, C = dense_preference_confidence(X, confidence)
    total = 0.0
    for t in range(X.shape[0]):
        for j in range(X.shape[1]):
            total += C[t, j] * (P[t, j] - float(U[t] @ Vt[j])) ** 2
    return total + alpha_u * float(np.sum(U * U)) + alpha_v * float(np.sum(Vt * Vt))


def dense_implicit_gradients(X, U, Vt, *, confidence):
    """Gradients of the data term ``sum c (p - u . v)^2`` with respect to ``U`` and ``Vt``,
    one pair at a time."""
    P, C = dense_preference_confidence(X, confidence)
    gU, gV = np.zeros_like(U, dtype=float), np.zeros_like(Vt, dtype=float)
    for t in range(X.shape[0]):
        for j in range(X.shape[1]):
            e = float(U[t] @ Vt[j]) - P[t, j]
            gU[t] += 2.0 * C[t, j] * e * Vt[j]
            gV[j] += 2.0 * C[t, j] * e * U[t]
    return gU, gV
