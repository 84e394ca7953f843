"""FedMGS's client phases for a group of clients (``_groups.BatchedPhases``).

At one client per user each round's sampled clients run as one compiled call per group
(:mod:`._fedmgs_kernels`); their aggregates go up on their rated items only, in the forms of
:func:`._fedmgs_protocol.share` (which calls :func:`group_share` for a single client), as views of
the call's arrays (the server's cache keeps such runs without a copy). The states, messages
and bytes are those of the per-client functions of :mod:`._fedmgs_protocol`.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import scipy.sparse as sp

from ... import _biases
from ..._kernels import read_only, row_tasks, split_rows
from ..._prox import row_alpha
from ...engine._groups import BatchedPhases, LazyRows, offsets, user_rows_state, with_user_rows
from ...engine._transport import client_generator
from .._auto_strengths import start_user_biases
from .._fedmavg._fedmavg_protocol import EPS_LIPSCHITZ, lambda_max
from ._fedmgs_kernels import client_items, group_user_steps, row_outers, row_totals, share_items
from ._fedmgs_kernels import group_share as share_kernel
from ._fedmgs_kernels import group_share_outer as share_outer_kernel

__all__ = ["batched_client_update", "batched_init_client", "client_state",
           "group_layout", "group_share", "make_batched", "unpack", "with_client_states"]


def unpack(broadcast, alpha_u, alpha_v=None):
    """``(Vt, alpha_u, alpha_v)``: with ``"auto"`` strengths the broadcast is ``{"Vt",
    "alpha"}`` and ``"auto"`` stands for the round's ``alpha``."""
    if not isinstance(broadcast, dict):
        return broadcast, alpha_u, alpha_v
    alpha = float(broadcast["alpha"][0])
    return (broadcast["Vt"], alpha if alpha_u == "auto" else alpha_u,
            alpha if alpha_v == "auto" else alpha_v)


# ---- the client phases for a group of clients (``_groups.BatchedPhases``) --------------------
def group_layout(group):
    """Each client's rated items, fixed by its data: ``items``, ``item_ptr``, ``slot`` (see
    :func:`._fedmgs_kernels.client_items`; with one row per client, its entries) and the
    client of each row."""
    X = group.X
    single = group.n_rows == group.n_clients  # (every client owns at least one row)
    if single:  # (views of the data's indices; pointers int64 as client_items gives them)
        items, item_ptr, slot = X.indices.view(), X.indptr.astype(np.int64), np.empty(0, np.int32)
    else:
        items, item_ptr, slot = client_items(X.indptr, X.indices, group.row_ptr, X.shape[1])
    owner = np.repeat(np.arange(group.n_clients), np.diff(group.row_ptr))
    layout = {"items": items, "item_ptr": item_ptr, "slot": slot, "single": single,
              "owner": owner}
    # read-only: fixed by the data (early stopping's snapshots share them), and one numba
    # signature (a flag per input) in either case
    for a in (items, item_ptr, slot, owner):
        a.flags.writeable = False
    if group.n_clients == 1 and not single:
        layout.update(_item_major(X))
    return layout


def _item_major(X):
    """One client's ratings item by item (for :func:`._fedmgs_kernels.share_items`): item
    ``q`` of its rated items (ascending) has the raters ``col_rows[col_ptr[q]:col_ptr[q +
    1]]``, ascending, and their stored entries ``col_entries`` (read-only: fixed by the
    data)."""
    positions = sp.csr_matrix((np.arange(X.nnz, dtype=np.int64), X.indices, X.indptr),
                              shape=X.shape).tocsc()  # (rows ascend within each column)
    rated = np.diff(positions.indptr) > 0
    col_ptr = np.concatenate([[0], positions.indptr[1:][rated]]).astype(np.int64)
    layout = {"col_ptr": col_ptr, "col_rows": positions.indices.astype(np.int64),
              "col_entries": positions.data}
    for a in layout.values():
        a.flags.writeable = False
    return layout


def group_share(state, group, clients, biased, sum_squares=False):
    """:func:`._fedmgs_protocol.share` of the group's ``clients`` (local indices) in one call: each
    client's per-item aggregates on its rated items (views of the call's arrays), in the
    compact form ``{"items", "x", "a"}`` for one-user clients with biases; ``sum_squares``:
    the rows form also holds ``"ss"``, the sum of the squared ratings minus ``b_u``."""
    U, X = state["U"], group.X
    n_f = U.shape[1]
    if biased:  # a_t = [u_t, 1], ratings minus b_u (as _biases.item_step_view)
        cols, shift_col = np.r_[np.arange(n_f - 2), n_f - 1], n_f + _biases.B_U
    else:
        cols, shift_col = np.arange(n_f), -1
    r = len(cols)
    items, item_ptr = state["items"], state["item_ptr"]
    out_ptr = offsets(item_ptr[clients + 1] - item_ptr[clients])
    if biased and state["single"]:
        x, a = np.empty(out_ptr[-1]), np.empty((len(clients), r))
        share_outer_kernel(X.indptr, X.indices, X.data, clients, U, cols, shift_col, out_ptr,
                           x, a)
        return {group.start + i: {"items": items[item_ptr[i]:item_ptr[i + 1]],
                                  "x": x[out_ptr[q]:out_ptr[q + 1]], "a": a[q]}
                for q, i in enumerate(clients.tolist())}
    G, grams = np.empty((out_ptr[-1], r + r * r)), np.empty((len(clients), r, r))
    ss = np.empty(len(clients))
    # one client of many users, its items split over threads: item by item (the same sums;
    # in one piece the row-major kernel below is 1.2-1.4x faster, measured)
    if "col_ptr" in state and len(clients) == 1 and row_tasks(len(items)) > 1:
        return {group.start: _share_item_major(state, X, U, cols, shift_col, G, sum_squares)}
    # (read-only views: a layout that came through a copy, e.g. Flower's, is writeable)
    share_kernel(X.indptr, X.indices, X.data, group.row_ptr, clients, U, cols, shift_col,
                 read_only(item_ptr), read_only(state["slot"]), state["single"], out_ptr, G,
                 grams, ss)
    uploads = {group.start + i: {"items": items[item_ptr[i]:item_ptr[i + 1]],
                                 "G": G[out_ptr[q]:out_ptr[q + 1]], "gram": grams[q]}
               for q, i in enumerate(clients.tolist())}
    if sum_squares:  # (the kernel sums over the sending clients' entries only)
        for q, i in enumerate(clients.tolist()):
            uploads[group.start + i]["ss"] = ss[q]
    return uploads


def _share_item_major(state, X, U, cols, shift_col, G, sum_squares):
    """The upload of a one-client group of several rows by :func:`share_items` (the same
    values as :func:`group_share`'s kernel: each sum adds the same products in the same
    order); the Gram and the sum of squares are the same sums in row order."""
    r = len(cols)
    outers = np.empty((X.shape[0], r * (r + 1) // 2))
    split_rows(row_outers, X.shape[0], U, cols, outers)
    split_rows(share_items, G.shape[0], state["col_ptr"], state["col_rows"],
               state["col_entries"], X.data, U, cols, shift_col, outers, G)
    gram = np.empty((r, r))
    ss = row_totals(X.indptr, X.data, U, shift_col, outers, gram)
    upload = {"items": state["items"], "G": G, "gram": gram}
    if sum_squares:
        upload["ss"] = ss
    return upload


def group_start(group, stream, n_components, init_scale):
    """The group's rows of ``U`` at the start: each client's ``init_scale * U(0, 1)`` draws
    from its own generator, as the per-client ``init_client`` draws them."""
    ptr = group.row_ptr
    U = np.empty((group.n_rows, n_components))
    for i in range(group.n_clients):
        U[ptr[i]:ptr[i + 1]] = init_scale * client_generator(stream, group.start + i).random(
            (ptr[i + 1] - ptr[i], n_components))
    return U


def batched_init_client(group, Vt, stream, *, init_scale, positive, biased=False,
                        weighted=False, sum_squares=False, user_shrinkage=None):
    """:func:`._fedmgs_protocol.init_client` of every client of the group (each from its own
    generator)."""
    U = group_start(group, stream, Vt.shape[1], init_scale)
    if positive:
        np.maximum(U, 0.0, out=U)
    if biased:  # (row by row: the same as each client's own start)
        start_user_biases(_biases.init_user(U), group.X, Vt, user_shrinkage)
    state = {"U": U, **group_layout(group)}
    uploads = group_share(state, group, np.arange(group.n_clients), biased, sum_squares)
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
            uploads[group.start + i]["counts"] = LazyRows(None, 0.0, items[a:b],
                                                              counts[a:b], (X.shape[1],))
    return state, uploads


def batched_client_update(state, group, broadcast, stream, active, selected, *, local_iter_u,
                          c_factor, alpha_u, l1_ratio, positive, biased=False, weighted=False):
    """:func:`._fedmgs_protocol.client_update` of the group's active clients: one call for all
    their rows.

    The step's Lipschitz bounds need ``V`` only: ``lambda_max(V^T V)``, or with biases each
    item's ``||v_j||^2`` for the per-row bounds of ``_biases.user_step_bounds``, are formed
    once per call, not once per client."""
    Vt, alpha_u, _ = unpack(broadcast, alpha_u)
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
                     shift, norms2, biased, lam, c_factor, read_only(alpha), l1_ratio,
                     local_iter_u, positive, EPS_LIPSCHITZ, _biases.TAU, U)
    state = {**state, "U": U}
    return state, group_share(state, group, np.flatnonzero(active & selected), biased,
                              isinstance(broadcast, dict))


# a FedMGS client keeps only U between rounds
client_state = user_rows_state
with_client_states = with_user_rows


def make_batched(*, init, update, client_metrics):
    """FedMGS's :class:`~sklearn_fedmf.engine._groups.BatchedPhases`: ``init`` and ``update`` are
    the keyword arguments :func:`._fedmgs_protocol.make_protocol` binds to the per-client phases;
    ``client_metrics`` sums over a group's stacked rows as over one client's."""
    return BatchedPhases(
        init_client=partial(batched_init_client, **init),
        client_update=partial(batched_client_update, **update),
        client_metrics=client_metrics,
        client_state=client_state, with_client_states=with_client_states)
