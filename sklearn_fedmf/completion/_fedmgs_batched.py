"""FedMGS's client phases for a group of clients (``_groups.BatchedPhases``) and the compact
message of a one-user client with biases (:class:`OuterRows`).

At one client per user each round's sampled clients run as one compiled call per group
(:mod:`._fedmgs_kernels`); their gradients go up on their rated items only, as
:class:`~sklearn_fedmf._groups.ImplicitRows` or :class:`OuterRows`, both the paper's dense
message (counted dense, rebuilt by ``np.asarray``). The states, messages and bytes are those of
the per-client functions of :mod:`._fedmgs`.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _biases
from .._groups import ImplicitRows
from .._prox import row_alpha
from .._transport import client_generator
from ._fedmavg import EPS_LIPSCHITZ, lambda_max
from ._fedmgs_kernels import client_items, group_user_steps
from ._fedmgs_kernels import group_share as share_kernel
from ._fedmgs_kernels import group_share_outer as share_outer_kernel

__all__ = ["OuterRows", "batched_client_update", "batched_init_client", "client_state",
           "group_layout", "group_share", "with_client_states"]

# ---- the messages ---------------------------------------------------------------------------
class OuterRows:
    """The gradient of a one-user client with biases, held as ``e a^T`` on its rated items.

    With one user, row ``j`` of the gradient in ``[V; b_i]`` is ``e_j a`` with ``e_j`` the
    residual at item ``j`` and ``a = [u, 1]``: its last column is ``e`` and the last row of
    the Gram ``a a^T`` the client sends beside it is ``a``, both exactly (products with the
    fixed 1). So ``rows``, ``e`` and ``a`` hold what the paper's message holds, nothing more,
    in ``k + r`` numbers instead of ``k r``. The message is the dense matrix: :attr:`nbytes`
    counts it dense and ``np.asarray`` rebuilds it bit for bit (each entry is the one product
    ``e_j a_c`` that :func:`._fedmgs.share` computes).
    """

    __slots__ = ("rows", "e", "a", "shape")

    def __init__(self, rows, e, a, shape):
        self.rows, self.e, self.a, self.shape = rows, e, a, tuple(shape)

    dtype = np.dtype(np.float64)

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.dtype.itemsize

    def toarray(self):
        out = np.zeros(self.shape)
        out[self.rows] = np.multiply.outer(self.e, self.a)
        return out

    def __array__(self, dtype=None, copy=None):
        out = self.toarray()
        return out if dtype is None else out.astype(dtype, copy=False)



# ---- the client phases for a group of clients (``_groups.BatchedPhases``) --------------------
def group_layout(group):
    """Each client's rated items, fixed by its data: ``items``, ``item_ptr``, ``slot`` (see
    :func:`._fedmgs_kernels.client_items`; with one row per client, its entries) and the
    client of each row."""
    X = group.X
    single = group.n_rows == group.n_clients  # (every client owns at least one row)
    if single:
        items, item_ptr, slot = X.indices, X.indptr, np.empty(0, dtype=np.int32)
    else:
        items, item_ptr, slot = client_items(X.indptr, X.indices, group.row_ptr, X.shape[1])
    owner = np.repeat(np.arange(group.n_clients), np.diff(group.row_ptr))
    return {"items": items, "item_ptr": item_ptr, "slot": slot, "single": single,
            "owner": owner}


def group_share(state, group, Vt, clients, biased):
    """:func:`._fedmgs.share` of the group's ``clients`` (local indices) in one call; each gradient
    goes up on its rated items only: as :class:`OuterRows` for one-user clients with biases,
    else as :class:`ImplicitRows` (both counted as the dense matrix)."""
    U, X = state["U"], group.X
    n_f = Vt.shape[1]
    if biased:  # A = [U, 1], ratings minus b_u, against [V; b_i] (as share's views)
        cols = np.r_[np.arange(n_f - 2), n_f - 1]
        shift_col, Wf = n_f + _biases.B_U, _biases.free_item(Vt)
    else:
        cols, shift_col, Wf = np.arange(n_f), -1, np.ascontiguousarray(Vt)
    items, item_ptr = state["items"], state["item_ptr"]
    out_ptr = np.zeros(len(clients) + 1, dtype=np.int64)
    np.cumsum(item_ptr[clients + 1] - item_ptr[clients], out=out_ptr[1:])
    grams = np.empty((len(clients), len(cols), len(cols)))
    shape = (Vt.shape[0], len(cols))
    if biased and state["single"]:
        e, a = np.empty(out_ptr[-1]), np.empty((len(clients), len(cols)))
        share_outer_kernel(X.indptr, X.indices, X.data, clients, U, cols, shift_col, Wf,
                           out_ptr, e, a, grams)
        return {group.start + i: {"grad": OuterRows(items[item_ptr[i]:item_ptr[i + 1]],
                                                    e[out_ptr[q]:out_ptr[q + 1]], a[q], shape),
                                  "gram": grams[q]}
                for q, i in enumerate(clients.tolist())}
    values = np.empty((out_ptr[-1], len(cols)))
    share_kernel(X.indptr, X.indices, X.data, group.row_ptr, clients, U, cols, shift_col, Wf,
                 item_ptr, state["slot"], state["single"], out_ptr, values, grams)
    return {group.start + i: {"grad": ImplicitRows(None, 0.0, items[item_ptr[i]:item_ptr[i + 1]],
                                                   values[out_ptr[q]:out_ptr[q + 1]], shape),
                              "gram": grams[q]}
            for q, i in enumerate(clients.tolist())}


def batched_init_client(group, Vt, stream, *, init_scale, positive, biased=False,
                        weighted=False):
    """:func:`._fedmgs.init_client` of every client of the group (each from its own generator)."""
    n_f, ptr = Vt.shape[1], group.row_ptr
    U = np.empty((group.n_rows, n_f))
    for i in range(group.n_clients):
        U[ptr[i]:ptr[i + 1]] = init_scale * client_generator(stream, group.start + i).random(
            (ptr[i + 1] - ptr[i], n_f))
    if positive:
        np.maximum(U, 0.0, out=U)
    if biased:
        _biases.init_user(U)
    state = {"U": U, **group_layout(group)}
    uploads = group_share(state, group, Vt, np.arange(group.n_clients), biased)
    if weighted:  # each client's ratings per item, on the items it rated
        items, item_ptr, X = state["items"], state["item_ptr"], group.X
        if state["single"]:
            counts = np.ones(len(items))
        else:
            client_of_entry = state["owner"][np.repeat(np.arange(group.n_rows),
                                                       np.diff(X.indptr))]
            counts = np.bincount(item_ptr[client_of_entry] + state["slot"],
                                 minlength=len(items)).astype(np.float64)
        for i in range(group.n_clients):
            a, b = item_ptr[i], item_ptr[i + 1]
            uploads[group.start + i]["counts"] = ImplicitRows(None, 0.0, items[a:b],
                                                              counts[a:b], (X.shape[1],))
    return state, uploads


def batched_client_update(state, group, Vt, stream, active, selected, *, local_iter_u,
                          c_factor, alpha_u, l1_ratio, positive, biased=False, weighted=False):
    """:func:`._fedmgs.client_update` of the group's active clients: one call for all their rows.

    The step's Lipschitz bounds need ``V`` only: ``lambda_max(V^T V)``, or with biases each
    item's ``||v_j||^2`` for the per-row bounds of ``_biases.user_step_bounds``, are formed
    once per call, not once per client."""
    X = group.X
    alpha = np.broadcast_to(row_alpha(alpha_u, X, weighted), (group.n_rows,))
    if biased:
        W = np.ascontiguousarray(Vt[:, :_biases.ONE_U])
        shift = np.ascontiguousarray(Vt[:, _biases.B_I])
        norms2, lam = np.einsum("ij,ij->i", W[:, :-1], W[:, :-1]), 0.0
    else:
        W, shift = np.ascontiguousarray(Vt), np.zeros(Vt.shape[0])
        norms2, lam = shift, lambda_max(Vt.T @ Vt)
    U = state["U"].copy()
    group_user_steps(X.indptr, X.indices, X.data, np.flatnonzero(active[state["owner"]]), W,
                     shift, norms2, biased, lam, c_factor, np.ascontiguousarray(alpha), l1_ratio,
                     local_iter_u, positive, EPS_LIPSCHITZ, _biases.TAU, U)
    state = {**state, "U": U}
    return state, group_share(state, group, Vt, np.flatnonzero(active & selected), biased)


def client_state(state, group, i):
    return {"U": state["U"][group.row_ptr[i]:group.row_ptr[i + 1]].copy()}


def with_client_states(state, group, states):
    U = state["U"].copy()
    for i, s in states.items():
        U[group.row_ptr[i]:group.row_ptr[i + 1]] = s["U"]
    return {**state, "U": U}
