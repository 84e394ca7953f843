"""FedMC-ADMM under ``loss="implicit"``: Algorithm 1 on the weighted objective.

Client ``i``'s data term becomes (the paper's ``f_i`` keeps its 1/2; ``c_tj``, ``p_tj`` as in
:mod:`._implicit`, over **every** item ``j``)::

    f_i(U, W) = 1/2 sum_{t in rows of i} sum_{j = 1..n} c_tj (p_tj - u_t . w_j)^2

With ``z_tj = u_t . w_j``, ``O_t`` the stored items of row ``t`` and ``g_tj = (c_tj - 1) z_tj
- c_tj`` on them, the identity of :mod:`._implicit` gives (``W`` of shape ``r x n``, kept
transposed as ``Wt``)::

    grad_U f_i(U, W) = U (W W^T) + G W^T,        G = P_Omega_i(g)   (m_i x n, sparse)
    grad_V f_i(U, W) = (U^T U) W + U^T G

The all-items terms are ``r x r`` Grams: ``W_i W_i^T`` of the client's own copy (the U loop
linearizes at ``W_i``, not at the broadcast, so no ``V^T V`` has to travel) and ``U_i^T U_i``
of its own rows. A round costs ``O(N (nnz_i r + m_i r^2 + n r^2))`` and uploads what the paper
sends: ``(W_i, Y_i)``.

Algorithm 1 keeps its structure (spec section 2.2):

* U loop (P-14): ``U <- prox_{R_i / L_W}(U - grad_U f_i(U, W_i) / L_W)``. ``||W W^T||_F`` no
  longer bounds the curvature: row ``t``'s Hessian is ``W W^T + sum_{j in O_t} (c_tj - 1)
  w_j w_j^T``, so ``L_W = ||W_i W_i^T||_F + max_t sum_{j in O_t} (c_tj - 1) ||w_j||^2``.
* W loop (P-15): ``W <- ((L_U/p) W + beta V - grad_V f_i(U, W)/p - Y) / (L_U/p + beta)`` with
  ``L_U = ||U^T U||_F + max_j sum_{t: j in O_t} (c_tj - 1) ||u_t||^2``, the same bound on the
  columns. Remark 4.1's exact W update solves, per column, ``((U^T U + sum_t (c_tj - 1)
  u_t u_t^T) / p + beta I) w_j = (U^T C)_j / p + beta v_j - y_j`` (``C`` the confidences at
  the stored entries; an unrated column keeps the Gram term).
* Initial dual ``Y_i^0 = -(1/p) grad_V f_i(U_i^0, V^0)``, dual step and server (P-16)
  unchanged.

Every unrated column's W step now multiplies by ``U^T U``: the per-item scalar maps that
:mod:`._fedmc_admm_batched` relies on do not hold, so ``loss="implicit"`` runs one block per
client (dense ``W_i``, ``Y_i``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..._prox import elastic_net_value, item_counts, prox_elastic_net, row_alpha
from .._implicit import implicit_objective
from ._fedmc_admm_batched import unpack_broadcast
from ._fedmc_admm_kernels import squared_distance

# beta="auto" under loss="implicit" is AUTO_BETA_IMPLICIT times implicit_initial_curvature:
# measured on ml-latest-small (rank 20, 20 local steps, 10 clients), 1x and 3x let the
# objective rise again after about 15 rounds, 10x and 28x decrease it over 60 rounds
# (the user factors grow far beyond their start, and the curvature with them).
AUTO_BETA_IMPLICIT = 10.0

__all__ = ["AUTO_BETA_IMPLICIT", "confidences", "implicit_client_metrics",
           "implicit_client_update", "implicit_dual_start", "implicit_grad_u", "implicit_grad_v",
           "implicit_initial_curvature", "implicit_metrics", "implicit_u_loop",
           "implicit_w_exact", "implicit_w_loop"]


def confidences(X, confidence):
    """``c = 1 + confidence * r`` at the stored entries of the CSR ``X``, in their order."""
    return 1.0 + confidence * np.asarray(X.data, dtype=np.float64)


def _residual_weights(X, U, Wt, c):
    """``G``: ``(c - 1) z - c`` at the stored entries of ``X`` (``z = u_t . w_j``)."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    z = np.einsum("ij,ij->i", U[rows], Wt[X.indices])
    return sp.csr_matrix(((c - 1.0) * z - c, X.indices, X.indptr), shape=X.shape)


def implicit_grad_u(X, U, Wt, *, confidence):
    """``grad_U f_i(U, W) = U (W W^T) + G W^T`` (``f_i`` with its 1/2)."""
    G = _residual_weights(X, U, Wt, confidences(X, confidence))
    return U @ (Wt.T @ Wt) + G @ Wt


def implicit_grad_v(X, U, Wt, *, confidence):
    """``grad_V f_i(U, W)``, transposed: ``Wt (U^T U) + G^T U`` (``n x r``)."""
    G = _residual_weights(X, U, Wt, confidences(X, confidence))
    return Wt @ (U.T @ U) + G.T @ U


def _lipschitz_u(X, Wt, c, eps):
    """``L_W``: ``||W W^T||_F`` plus the largest row's ``sum (c - 1) ||w_j||^2``."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    weights = (c - 1.0) * np.einsum("ij,ij->i", Wt[X.indices], Wt[X.indices])
    extra = np.bincount(rows, weights=weights, minlength=X.shape[0])
    return max(np.linalg.norm(Wt.T @ Wt) + (extra.max() if extra.size else 0.0), eps)


def _lipschitz_w(X, U, c, eps):
    """``L_U``: ``||U^T U||_F`` plus the largest column's ``sum (c - 1) ||u_t||^2``."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    weights = (c - 1.0) * np.einsum("ij,ij->i", U[rows], U[rows])
    extra = np.bincount(X.indices, weights=weights, minlength=X.shape[1])
    return max(np.linalg.norm(U.T @ U) + (extra.max() if extra.size else 0.0), eps)


def _fixed_side(X, F, c):
    """With the other factor ``F`` fixed, the observed part of the gradient is affine:
    ``G F = A x - b`` per row ``x`` of the moving factor, ``A = sum (c - 1) f f^T`` and
    ``b = sum c f`` over the row's stored entries (``X`` has the moving factor's rows; ``F``
    is indexed by its columns). Computed once per loop: a step then costs ``O(rows r^2)``."""
    r = F.shape[1]
    outer = (F[:, :, None] * F[:, None, :]).reshape(F.shape[0], r * r)
    A = sp.csr_matrix((c - 1.0, X.indices, X.indptr), shape=X.shape) @ outer
    b = sp.csr_matrix((c, X.indices, X.indptr), shape=X.shape) @ F
    return np.asarray(A).reshape(-1, r, r), np.asarray(b)


def implicit_u_loop(U, Wt, X, n_steps, alpha_u, l1_ratio, positive, *, confidence, eps):
    """``n_steps`` proximal-gradient steps (P-14) on the weighted objective, against the
    client's own ``W_i``."""
    c = confidences(X, confidence)
    L_W = _lipschitz_u(X, Wt, c, eps)
    gram = Wt.T @ Wt  # the all-items term, fixed through the loop
    A, b = _fixed_side(X, Wt, c)
    for _ in range(n_steps):
        grad = U @ gram + np.einsum("tab,tb->ta", A, U) - b
        U = prox_elastic_net(U - grad / L_W, 1.0 / L_W, alpha_u, l1_ratio, positive)
    return U.astype(Wt.dtype, copy=False)


def implicit_w_loop(U, Wt, Vt, Yt, X, n_steps, beta, n_clients, *, confidence, eps):
    """``n_steps`` linearized W steps (P-15) on the weighted objective, from the stored
    ``W_i``; also returns ``L_U``."""
    c = confidences(X, confidence)
    L_U = _lipschitz_w(X, U, c, eps)
    gram = U.T @ U
    # the confidences with items as rows (c >= 1: no entry vanishes in the transpose)
    Ct = sp.csr_matrix((c, X.indices, X.indptr), shape=X.shape).T.tocsr()
    cols = np.flatnonzero(np.diff(Ct.indptr))  # only the rated columns carry A and b
    Ct = Ct[cols]
    A, b = _fixed_side(Ct, U, Ct.data)
    a = L_U / n_clients
    anchor = beta * Vt - Yt
    for _ in range(n_steps):
        grad = Wt @ gram
        grad[cols] += np.einsum("tab,tb->ta", A, Wt[cols]) - b
        Wt = (a * Wt + anchor - grad / n_clients) / (a + beta)
    return Wt.astype(Vt.dtype, copy=False), L_U


def implicit_w_exact(U, Vt, Yt, X, beta, n_clients, *, confidence):
    """Remark 4.1 on the weighted objective: one ``r x r`` solve per item column."""
    r = U.shape[1]
    c = confidences(X, confidence)
    weighted = sp.csr_matrix((c - 1.0, X.indices, X.indptr), shape=X.shape)
    outer = (U[:, :, None] * U[:, None, :]).reshape(U.shape[0], r * r)
    gram = (np.asarray(weighted.T @ outer).reshape(-1, r, r) + U.T @ U) / n_clients
    gram += beta * np.eye(r)
    C = sp.csr_matrix((c, X.indices, X.indptr), shape=X.shape)
    rhs = np.asarray(C.T @ U) / n_clients + beta * Vt - Yt
    return np.linalg.solve(gram, rhs[:, :, None])[:, :, 0].astype(Vt.dtype, copy=False)


def implicit_metrics(U, Vt, block, *, confidence, alpha_u, l1_ratio, alpha_v, weighted):
    """One client's additive diagnostics at the global ``V`` under ``loss="implicit"``: its
    loss (``f_i + R_i``, with the weighted regularization's share of the item penalty) and
    the squared errors of the preference (1) at its stored and held-out entries."""
    X = block.X
    loss = implicit_objective(X, U, Vt, confidence=confidence, alpha_u=0.0, alpha_v=0.0)
    loss += elastic_net_value(U, row_alpha(alpha_u, X, weighted), l1_ratio)
    if weighted:
        loss += elastic_net_value(Vt, alpha_v * item_counts(X), l1_ratio)
    return {"loss": loss, "sse": _preference_sse(X, U, Vt), "n": X.nnz,
            "sse_eval": _preference_sse(block.X_eval, U, Vt),
            "n_eval": 0 if block.X_eval is None else block.X_eval.nnz}


def _preference_sse(X, U, Vt):
    """``sum (1 - u_t . v_j)^2`` over the stored entries of ``X`` (0 for None)."""
    if X is None or X.nnz == 0:
        return 0.0
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    z = np.einsum("ij,ij->i", U[rows], Vt[X.indices])
    return float(np.sum((1.0 - z) ** 2))


def implicit_initial_curvature(X, n_clients, n_components, init_scale, confidence):
    """``b0`` of ``beta="auto"`` on the weighted objective: the W step's curvature at an item
    column of a typical client, at the start, ``(1/p) (U^T U + sum_t (c_tj - 1) u_t u_t^T)``
    bounded by its trace: ``(1/p) E||u^0||^2 (m / p + sum_t (c_tj - 1))`` with ``m / p``
    rows per client, ``E||u^0||^2 = r init_scale^2 / 3`` and the confidences' excess
    ``confidence * sum(r) / (n p)`` per item and client (aggregates: the clients' row
    counts and value sums)."""
    n_rows, n_items = X.shape
    row = n_components * init_scale**2 / 3
    excess = confidence * float(np.sum(X.data)) / (n_items * n_clients)
    return row * (n_rows / n_clients + excess) / n_clients


# ---- FedMC-ADMM's phases under loss="implicit" (bound by _fedmc_admm_protocol's
# make_implicit_protocol) ----------------------------------------------------------------------
def implicit_dual_start(X, U, Vt, n_clients, *, confidence):
    """``Y_i^0 = -(1/p) grad_V f_i(U_i^0, V^0)`` on the weighted objective (``dual_init=
    "paper"``), in ``X``'s dtype."""
    return (implicit_grad_v(X, U, Vt, confidence=confidence) / -n_clients).astype(
        X.dtype, copy=False)


def implicit_client_update(state, block, Vt, rng, selected, *, n_clients, beta, local_iter,
                           alpha_u, l1_ratio, positive, w_update, eps, weighted=False,
                           confidence):
    """One active round of client ``i`` (Algorithm 1, step 3) on the weighted objective (no
    biases); uploads ``(W_i, Y_i)``. ``eps``: the floor of the steps' Lipschitz bounds."""
    Vt = unpack_broadcast(Vt)[0]
    X = block.X
    alpha_u = row_alpha(alpha_u, X, weighted)
    U = implicit_u_loop(state["U"], state["Wt"], X, local_iter, alpha_u, l1_ratio, positive,
                        confidence=confidence, eps=eps)
    if w_update == "linearized":
        Wt = implicit_w_loop(U, state["Wt"], Vt, state["Yt"], X, local_iter, beta, n_clients,
                             confidence=confidence, eps=eps)[0]
    else:
        Wt = implicit_w_exact(U, Vt, state["Yt"], X, beta, n_clients, confidence=confidence)
    Yt = state["Yt"] + beta * (Wt - Vt)  # dual step with the OLD global V^k (Lemma 4.5)
    return {"U": U, "Wt": Wt, "Yt": Yt}, {"W": Wt, "Y": Yt}


def implicit_client_metrics(state, block, Vt, *, alpha_u, l1_ratio, alpha_v=0.0,
                            weighted=False, confidence):
    """Additive diagnostics of one client at the global ``V`` (:func:`implicit_metrics`)
    and its consensus gap."""
    Vt = unpack_broadcast(Vt)[0]
    return {**implicit_metrics(state["U"], Vt, block, confidence=confidence,
                               alpha_u=alpha_u, l1_ratio=l1_ratio, alpha_v=alpha_v,
                               weighted=weighted),
            "consensus": squared_distance(state["Wt"], Vt)}
