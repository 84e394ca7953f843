"""RFRec / RFRecF under ``loss="implicit"``: the local steps on the weighted objective.

Client ``c``'s local loss becomes (spec section 1.3 with every item in the sum; ``c_ij``,
``p_ij`` as in :mod:`._implicit`, ``V_(c)`` kept item-major as ``P``, ``n_items x d``)::

    f_c = sum_{i in S_c} [ sum_{j = 1..m} c_ij (p_ij - u_i . v_(c)j)^2 + lambda_u ||u_i||^2 ]
          + (lambda_v / N) ||V_(c)||^2

and ``F = sum_c f_c + lambda psi`` is unchanged otherwise. With ``z_ij = u_i . v_(c)j`` and
``g_ij = (c_ij - 1) z_ij - c_ij`` on the stored entries (``G`` the sparse matrix of them), the
Gram identity of :mod:`._implicit` gives the exact gradients of spec section 1.5::

    grad_{u_i} F      = 2 [ (V_(c)^T V_(c)) u_i + sum_{j in O_i} g_ij v_(c)j ] + 2 lambda_u u_i
    grad_{V_(c)} F    = 2 [ P (U_c^T U_c) + G^T U_c ] + (2 lambda_v / N) P + lambda (P - Vbar)

The all-items terms are the ``d x d`` Grams of the client's own copy and of its own users:
nothing new travels, and the upload stays the paper's ``V_(c)``. Every column of ``V_(c)``
now has a data gradient (``P (U_c^T U_c)``), so a client's unrated columns no longer follow
the shared ones (spec section 8.2's representation): under ``loss="implicit"`` each client
keeps every column of its copy as its own, ``O(n_items d)`` per client, and the grouped phases
of :mod:`._rfrec_batched` are not used. Algorithm 1's local step, Algorithm 2's main update
(``grad f / (1 - p)``) and pull, the uploads, the privacy clipping and noise, and the server
are unchanged.

``learning_rate="auto"`` keeps its per-block steps ``AUTO_SAFETY / L`` with ``L`` the bound of
:func:`~._rfrec_protocol.auto_steps` summed over every pair: an unobserved pair weighs 1 with
target 0 (its ``|z|`` bounded by ``||u|| ||v||``), an observed one ``c`` with target 1.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .._fedmc_admm._fedmc_admm_implicit import confidences

__all__ = ["implicit_auto_steps", "implicit_client_grads", "preference_errors"]


def _weights(X, pair, U, P, c):
    """``G``: ``(c - 1) z - c`` at the stored entries (``z = u_i . v_(c)j``), as a sparse
    ``n_rows x n_cols`` matrix over the client's columns ``pair``."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    z = np.einsum("ij,ij->i", U[rows], P[pair])
    return sp.csr_matrix(((c - 1.0) * z - c, pair, X.indptr), shape=(X.shape[0], P.shape[0]))


def implicit_client_grads(X, pair, U, P, Vbar_cols, *, confidence, alpha_u, reg_v, reg,
                          scale):
    """``scale * grad (f_c) + reg * (P - Vbar)``, the weighted version of
    :func:`~._rfrec_kernels._client_grads` (RFRec's step: ``scale=1``; RFRecF's main update:
    ``reg=0``, ``scale = 1 / (1 - p)``). ``Vbar_cols`` is ``Vbar`` at the client's columns."""
    G = _weights(X, pair, U, P, confidences(X, confidence))
    gU = 2.0 * (U @ (P.T @ P) + G @ P) + 2.0 * alpha_u * U
    gP = 2.0 * (P @ (U.T @ U) + G.T @ U) + 2.0 * reg_v * P
    return scale * gU, scale * gP + reg * (P - Vbar_cols)


def implicit_auto_steps(X, pair, U, P, *, confidence, alpha_u, reg_v, reg, scale,
                        safety):
    """Per-user and per-column steps ``safety / L`` for the weighted objective (module doc)."""
    c = confidences(X, confidence)
    rows = np.repeat(np.arange(U.shape[0]), np.diff(X.indptr))
    u_norm = np.sqrt(np.einsum("ij,ij->i", U, U))
    v_norm = np.sqrt(np.einsum("ij,ij->i", P, P))
    z = np.einsum("ij,ij->i", U[rows], P[pair])
    cross = u_norm[rows] * v_norm[pair]
    # an observed pair's excess over the unobserved bound it replaces
    extra = np.abs(c - 1.0) * cross + c * np.abs(z - 1.0)
    L_u = (np.sum(v_norm**2) + 2.0 * u_norm * np.sum(v_norm)
           + np.bincount(rows, weights=(c - 1.0) * v_norm[pair] ** 2 + extra,
                         minlength=U.shape[0]))
    L_p = (np.sum(u_norm**2) + 2.0 * v_norm * np.sum(u_norm)
           + np.bincount(pair, weights=(c - 1.0) * u_norm[rows] ** 2 + extra,
                         minlength=P.shape[0]))
    L_u = 2.0 * scale * (L_u + alpha_u)
    L_p = 2.0 * scale * (L_p + reg_v) + reg
    return (safety / np.maximum(L_u, 1e-12))[:, None], (safety / np.maximum(L_p, 1e-12))[:, None]


def preference_errors(X, U, Vt):
    """``(sum (1 - z)^2, sum |1 - z|)`` of ``z = u . v`` at the stored entries (0 for None)."""
    if X is None or X.nnz == 0:
        return 0.0, 0.0
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    e = 1.0 - np.einsum("ij,ij->i", U[rows], Vt[X.indices])
    return float(e @ e), float(np.abs(e).sum())
