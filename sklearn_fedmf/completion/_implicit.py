"""Weighted matrix factorization for implicit feedback (``loss="implicit"``).

Hu, Koren & Volinsky (2008): over **every** user-item pair, the preference ``p_ui`` is 1
where the user interacted (a stored entry of ``X``, whatever its value) and 0 elsewhere; the
confidence is ``c_ui = 1 + confidence * r_ui`` on stored entries and 1 elsewhere. The data
term is ``sum_{u,i} c_ui (p_ui - u_u . v_i)^2``.

The unobserved pairs enter through a Gram matrix. With ``z_ui = u_u . v_i`` and ``O_u`` the
stored items of row ``u``, an unobserved pair contributes ``z_ui^2`` and a stored one
``c_ui (1 - z_ui)^2 = [(c_ui - 1) z_ui^2 - 2 c_ui z_ui + c_ui] + z_ui^2``, so::

    sum_i c_ui (p_ui - z_ui)^2
        = sum_{i in O_u} [(c_ui - 1) z_ui^2 - 2 c_ui z_ui + c_ui] + u_u^T (V^T V) u_u

with ``V^T V = Vt^T Vt`` the ``r x r`` Gram of the item factors. The row's gradient is
``2 [(V^T V) u_u + sum_{i in O_u} ((c_ui - 1) z_ui - c_ui) v_i]`` and, symmetrically, an
item's gradient over a block of rows ``U`` is
``2 [(U^T U) v_i + sum_{u: i in O_u} ((c_ui - 1) z_ui - c_ui) u_u]``: every computation costs
``O(nnz r^2 + r^3)``, never a dense users x items matrix.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["implicit_objective", "implicit_user_factors"]


def implicit_objective(X, U, Vt, *, confidence, alpha_u, alpha_v):
    """``sum_{u,i} c_ui (p_ui - u_u . v_i)^2 + alpha_u ||U||^2 + alpha_v ||V||^2`` in Gram form.

    Parameters
    ----------
    X : csr_matrix of shape (n_rows, n_items)
        Interactions of a client's rows (or of the whole matrix): stored entries are
        ``p = 1``, their values the ``r_ui`` of the confidences.
    U : ndarray of shape (n_rows, r)
        The rows' factors.
    Vt : ndarray of shape (n_items, r)
        The item factors, transposed.
    confidence : float
        The confidence scale.
    alpha_u, alpha_v : float
        Ridge strengths (0 for the data term alone).

    Returns
    -------
    value : float
    """
    X = sp.csr_matrix(X)
    U = np.asarray(U, dtype=np.float64)
    Vt = np.asarray(Vt, dtype=np.float64)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    z = np.einsum("ij,ij->i", U[rows], Vt[X.indices])
    c = 1.0 + confidence * np.asarray(X.data, dtype=np.float64)
    observed = float(np.sum((c - 1.0) * z * z - 2.0 * c * z + c))
    gram = float(np.einsum("ij,jk,ik->", U, Vt.T @ Vt, U))
    return (observed + gram + alpha_u * float(np.vdot(U, U))
            + alpha_v * float(np.vdot(Vt, Vt)))


def implicit_user_factors(X, Vt, VtV, *, confidence, alpha_u):
    """The rows' exact minimizers ``argmin_u sum_i c_ui (p_ui - u . v_i)^2 + alpha_u ||u||^2``.

    Row ``u`` solves ``(V^T V + sum_{i in O_u} (c_ui - 1) v_i v_i^T + alpha_u I) u =
    sum_{i in O_u} c_ui v_i``: ``O(|O_u| r^2 + r^3)`` with the broadcast Gram ``VtV``.

    Parameters
    ----------
    X : csr_matrix of shape (n_rows, n_items)
        The rows' interactions.
    Vt : ndarray of shape (n_items, r)
        The item factors, transposed.
    VtV : ndarray of shape (r, r)
        ``Vt.T @ Vt``.
    confidence : float
        The confidence scale.
    alpha_u : float
        Ridge strength of the rows' factors.

    Returns
    -------
    U : ndarray of shape (n_rows, r)
    """
    X = sp.csr_matrix(X)
    Vt = np.asarray(Vt, dtype=np.float64)
    r = Vt.shape[1]
    base = np.asarray(VtV, dtype=np.float64) + alpha_u * np.eye(r)
    c = 1.0 + confidence * np.asarray(X.data, dtype=np.float64)
    U = np.zeros((X.shape[0], r))
    for t in range(X.shape[0]):
        lo, hi = X.indptr[t], X.indptr[t + 1]
        V_o, c_o = Vt[X.indices[lo:hi]], c[lo:hi]
        A = base + (V_o.T * (c_o - 1.0)) @ V_o
        if not A.any():  # no Gram, no interaction, no ridge: the zero row
            continue
        U[t] = np.linalg.lstsq(A, V_o.T @ c_o, rcond=None)[0] if alpha_u == 0 else \
            np.linalg.solve(A, V_o.T @ c_o)
    return U
