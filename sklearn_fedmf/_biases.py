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

__all__ = [
    "n_factors", "init_user", "init_item", "fix_user", "fix_item", "user_step_view",
    "item_step_view", "free_user", "free_item", "with_user", "with_item", "item_partner",
    "row_groups",
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


def row_groups(X, Vt, ridge=0.0):
    """Rows grouped by a per-row Lipschitz bound of their prox-gradient step, for the
    biased user steps: yields ``(rows, L)`` with ``L`` a power of two above every grouped
    row's ``trace(sum_{j in Omega_t} w_j w_j^T) + ridge`` (which bounds its largest
    eigenvalue).

    Why: the global bound ``lambda_max(W^T W)`` over all items counts the fixed column of
    ones fully (``n_items``), while a user only rates ``n_t`` items; with it, the factor
    columns would step ``n_items / n_t`` times too short. Rows do not interact in a user
    step, so each may take its own step; grouping keeps one compiled call per group.
    """
    counts = np.diff(X.indptr)
    rows = np.repeat(np.arange(X.shape[0]), counts)
    trace = np.bincount(rows, weights=np.einsum("ij,ij->i", Vt, Vt)[X.indices],
                        minlength=X.shape[0]) + ridge
    level = np.ceil(np.log2(np.maximum(trace, 1e-12)))
    for value in np.unique(level):
        yield np.flatnonzero(level == value), float(2.0**value)


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
