"""User and item biases as fixed entries of augmented factors (``biased=True``).

The prediction ``mean + b_u + b_i + u . v`` is the inner product of the augmented factors::

    U_aug = [U, b_u, 1]   (n_users, r + 2)        Vt_aug = [Vt, 1, b_i]   (n_items, r + 2)

The fixed entries (the last column of ``U_aug``, the second to last of ``Vt_aug``) enter the
regularizers as indicator functions ``iota_{x = 1}``; their proximal operator is the
projection that sets them back to 1, and a regularizer that is separable over the entries
keeps a separable prox. So every algorithm runs unchanged on rank ``r + 2``: ``b_u`` is a
column of the private user factor and stays on its client, ``b_i`` is a column of the item
factor and travels and is aggregated exactly as the item factors are.

A proximal-gradient loop with a fixed entry is the same loop on the free entries after the
fixed one's contribution is moved into the data (the substitution ``x = 1`` is exact):
:func:`user_step_view` and :func:`item_step_view` give those views, so the fused kernels,
which run many steps at once, need no projection inside.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ._kernels import shifted_data_and_row_sums

__all__ = [
    "item_biases", "user_biases",
    "n_factors", "init_user", "init_item", "random_item_factor", "fix_user", "fix_item",
    "user_step_view", "item_step_view", "free_user", "free_item", "with_user", "with_item",
    "item_partner", "user_step_bounds", "item_step_bounds", "user_step_view_and_bounds",
]

# positions in the augmented factors
B_U, ONE_U = -2, -1  # U_aug = [U, b_u, 1]
ONE_V, B_I = -2, -1  # Vt_aug = [Vt, 1, b_i]


def n_factors(n_components, biased):
    """Columns of the factors the solver runs on."""
    return n_components + 2 if biased else n_components


def init_user(U):
    """Zero biases and the fixed column of ones, in place."""
    U[:, B_U] = 0.0
    U[:, ONE_U] = 1.0
    return U


def init_item(Vt):
    Vt[:, ONE_V] = 1.0
    Vt[:, B_I] = 0.0
    return Vt


def random_item_factor(rng, n_items, n_components, init_scale, biased):
    """``V^0`` transposed, ``(n_items, n_factors)``: i.i.d. ``init_scale * Uniform[0, 1)``
    (the papers' initialization), ``[V^0; 1; 0]`` with biases."""
    Vt = init_scale * rng.random((n_items, n_factors(n_components, biased)))
    return init_item(Vt) if biased else Vt


def fix_user(U):
    """The projection onto ``{U_aug[:, -1] = 1}`` (prox of the indicator), in place."""
    U[:, ONE_U] = 1.0
    return U


def fix_item(Vt):
    """The projection onto ``{Vt_aug[:, -2] = 1}``, in place."""
    Vt[:, ONE_V] = 1.0
    return Vt


def _shifted(X, values):
    out = X.copy()
    out.data -= values
    return out


def user_step_view(X, Vt):
    """For a step on ``U_aug`` with ``Vt_aug`` fixed: the ratings minus ``b_i`` and the item
    columns ``[Vt, 1]`` that the free user entries ``[U, b_u]`` multiply."""
    return _shifted(X, Vt[X.indices, B_I]), np.ascontiguousarray(Vt[:, :ONE_U])


def item_step_view(X, U):
    """For a step on ``Vt_aug`` with ``U_aug`` fixed: the ratings minus ``b_u`` and the user
    columns ``[U, 1]`` that the free item entries ``[Vt, b_i]`` multiply."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    return _shifted(X, U[rows, B_U]), item_partner(U)


# Weight of the block bounds below: the factor columns' bound is (1 + 1/TAU) times the plain
# model's, the bias column's (1 + TAU) times its own curvature. The factor columns carry the
# model and converge slowly; a bias converges in a few steps even at a 5 times shorter step.
TAU = 8.0


def _block_bounds(L_factors, L_bias, n_columns, ridge):
    """``[(1 + 1/TAU) L_factors + ridge] * (n_columns - 1) + [(1 + TAU) L_bias + ridge]`` per
    row (``L_factors``, ``L_bias``, ``ridge``: scalars or one value per row)."""
    L_factors, L_bias, ridge = (np.asarray(a, dtype=np.float64) for a in (L_factors, L_bias,
                                                                            ridge))
    n = max(L_factors.size, L_bias.size, ridge.size)
    bounds = np.empty((n, n_columns))
    bounds[:, :-1] = ((1.0 + 1.0 / TAU) * L_factors + ridge).reshape(-1, 1)
    bounds[:, -1] = (1.0 + TAU) * L_bias + ridge
    return bounds


def user_step_bounds(X, Vt, ridge=0.0):
    """Per-row, per-column Lipschitz bounds of a user step on ``[U, b_u]`` against ``[V; 1]``
    (``Vt`` here holds the columns ``[Vt, 1]``): for row ``t`` with ``n_t`` ratings,
    ``(1 + 1/TAU) sum_{j in Omega_t} ||v_j||^2 + ridge_t`` for the factor columns and
    ``(1 + TAU) n_t + ridge_t`` for ``b_u``. Rows do not interact in a user step, so each may
    take its own step; within a row see :func:`item_step_bounds` (the trace bounds the
    factor block's largest eigenvalue). ``ridge`` is a scalar or one value per row.
    """
    counts = np.diff(X.indptr)
    rows = np.repeat(np.arange(X.shape[0]), counts)
    trace = np.bincount(rows, weights=np.einsum("ij,ij->i", Vt[:, :-1], Vt[:, :-1])[X.indices],
                        minlength=X.shape[0])
    return _block_bounds(trace, counts, Vt.shape[1], ridge)


def user_step_view_and_bounds(X, Vt, ridge=0.0):
    """``(X_view, Vt_view, bounds)``: :func:`user_step_view` and :func:`user_step_bounds` of
    that view in one pass over ``X``'s entries (the same values; the view shares ``X``'s
    index arrays)."""
    free = np.ascontiguousarray(Vt[:, :ONE_U])
    norms2 = np.einsum("ij,ij->i", free[:, :-1], free[:, :-1])
    data, trace = shifted_data_and_row_sums(X.indptr, X.indices, X.data,
                                            np.ascontiguousarray(Vt[:, B_I]), norms2)
    view = sp.csr_matrix((data, X.indices, X.indptr), shape=X.shape)
    return view, free, _block_bounds(trace, np.diff(X.indptr), free.shape[1], ridge)


def item_step_bounds(gram, ridge=0.0):
    """Per-column Lipschitz bounds of an item step on ``[V; b_i]`` from the Gram of the user
    columns ``[U, 1]`` it multiplies: ``(1 + 1/TAU) lambda_max(U^T U) + ridge`` for the factor
    columns and ``(1 + TAU) n + ridge`` for ``b_i``, with ``n`` the ones' entry of the Gram
    (the rows: a bound on every item's number of ratings ``n_j``).

    Why: item ``j``'s Hessian is ``H_j = [[A_j, a_j], [a_j^T, n_j]]`` with ``A_j = sum u u^T``
    and ``a_j = sum u`` over its raters. For ``x = [y; z]``, ``2 z a_j.y <= TAU n_j z^2 +
    (a_j.y)^2 / (TAU n_j)`` and ``(a_j.y)^2 <= n_j y^T A_j y`` (Cauchy-Schwarz), so
    ``H_j <= diag((1 + 1/TAU) A_j, (1 + TAU) n_j)`` and ``A_j <= U^T U``: each block may step
    by its own bound. The single bound ``lambda_max(H)`` counts the ones column (all rows)
    and would shrink the factor steps by about ``n / lambda_max(U^T U)``. (Per-item bounds
    ``n_j`` would be tighter; they failed, measured, when FedMGS's server summed stale
    gradients, and are untried since it holds every item's exact Gram.)
    """
    L_factors = float(np.linalg.eigvalsh(gram[:-1, :-1])[-1]) if gram.shape[0] > 1 else 0.0
    return _block_bounds(L_factors, gram[-1, -1], gram.shape[0], ridge)[0]


def item_partner(U):
    """The columns ``[U, 1]`` of ``U_aug`` that the free item entries multiply (without
    ``b_u``: what a client may aggregate for the item side, e.g. its Gram)."""
    return np.ascontiguousarray(np.delete(U, U.shape[1] + B_U, axis=1))


def free_user(U):
    """The free columns ``[U, b_u]`` of ``U_aug``."""
    return np.ascontiguousarray(U[:, :ONE_U])


def free_item(Vt):
    """The free columns ``[Vt, b_i]`` of ``Vt_aug``."""
    return np.ascontiguousarray(np.delete(Vt, Vt.shape[1] + ONE_V, axis=1))


def with_user(free):
    """``U_aug`` from its free columns."""
    return np.hstack([free, np.ones((free.shape[0], 1), dtype=free.dtype)])


def with_item(free):
    """``Vt_aug`` from its free columns."""
    ones = np.ones((free.shape[0], 1), dtype=free.dtype)
    return np.hstack([free[:, :-1], ones, free[:, -1:]])


# ---- the closed-form shrunk biases (BaselineOnly's ALS steps) ----------------------------
def _shrunk_mean(sums, counts, reg):
    """``sums / (reg + counts)``, 0 where ``reg + counts`` is 0 (no rating and no penalty)."""
    denom = reg + counts
    return np.divide(sums, denom, out=np.zeros(sums.shape), where=denom > 0)


def user_biases(X, item_bias, alpha_u):
    """Each row's ``b_u = sum_i (x_ui - b_i) / (alpha_u + n_u)`` on the centred CSR ``X``
    (a row without ratings gets 0): the exact minimizer in ``b_u`` with ``b_i`` fixed."""
    counts = np.diff(X.indptr)
    rows = np.repeat(np.arange(X.shape[0]), counts)
    deviations = np.bincount(rows, weights=X.data - item_bias[X.indices], minlength=X.shape[0])
    return _shrunk_mean(deviations, counts, alpha_u)


def item_biases(sums, counts, alpha_v):
    """``b_i = sum_u (x_ui - b_u) / (alpha_v + n_i)`` from the server's sums and counts."""
    return _shrunk_mean(sums, counts, alpha_v)
