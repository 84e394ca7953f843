"""FedMAvg's client phases for a whole group of clients (one client per user, cross-device).

The :class:`~sklearn_fedmf.engine._groups.BatchedPhases` of ``variant="wang_chang"`` and
``"fedmc_admm"``: the same federation as the per-client functions of
:mod:`~sklearn_fedmf.completion._fedmavg._fedmavg_protocol` (same draws, states and messages, to
rounding), with one compiled call per group
(:mod:`~sklearn_fedmf.completion._fedmavg._fedmavg_kernels`) and work proportional to the clients'
ratings:

* The U phase (11) runs every active client's rows in one call. Its step needs
  ``lambda_max(V V^T)``, the same for every client: it is computed once per call (with biases
  each row has its own bound from its rated items only).
* The W phase (13): on an item that client ``p`` did not rate the data gradient is 0, so with
  ``l1_ratio = 0`` each of the ``Q2`` steps maps the row ``v`` of ``V`` to
  ``(1 - ridge/d_p) v`` (``positive`` keeps it: ``max(s v, 0) = max(s, 0) v`` for ``v >= 0``).
  The upload ``W_p`` is then ``s_p V`` but for the rated rows, sent as
  :class:`~sklearn_fedmf.engine._groups.LazyRows` (bytes counted dense, as the paper's client
  sends them); the server's :func:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.weighted_sum`
  costs the rated rows. With an l1 part, or a negative ``V`` under ``positive``, the unrated rows
  are not a scaling of ``V``: those uploads are computed dense.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import _biases
from ..._kernels import read_only
from ...engine._groups import BatchedPhases, LazyRows, user_rows_state
from ...engine._transport import _rng
from .._auto_strengths import start_user_biases
from ._fedmavg_kernels import add_rows, partner_grams, rated_item_steps
from ._fedmavg_protocol import (
    EPS_LIPSCHITZ,
    client_metrics,
    prox_nonsmooth,
    random_user_factors,
    user_steps,
)
from ._fedmavg_round import w_step_size

__all__ = ["ItemRows", "make_batched"]


class ItemRows(LazyRows):
    """FedMAvg's lazy upload ``W_p``: ``scale * base`` with one scale per column (with
    biases each column block has its own step, and the column of ones stays 1), but for the
    rated rows. Its aggregation costs a compiled call over the rated rows."""

    __slots__ = ()

    def __init__(self, base, scale, rows, values):
        self.base, self.scale, self.rows, self.values = base, scale, rows, values
        self.shape = base.shape

    @property
    def nbytes(self):
        return self.shape[0] * self.shape[1] * self.values.dtype.itemsize

    def toarray(self):
        out = self.base * self.scale
        out[self.rows] = self.values
        return out

    def add_to(self, out, weight=1.0):
        add_rows(out, self.rows, self.values, self.base, self.scale, float(weight))
        return weight * self.scale


def _sizes(group, client_weights):
    """Each client's size for ``omega_p`` (its ratings or its rows)."""
    return np.diff(group.entry_ptr if client_weights == "entries" else group.row_ptr)


def _omega(group, client_weights, total):
    # a client without ratings has a zero gradient: any omega > 0 gives it the same steps
    return np.maximum(_sizes(group, client_weights), 1.0) / total


def _grams(U, group, clients, biased):
    """``U_p^T U_p`` of the item side's columns (``[U_p, 1]`` with biases) of ``clients``."""
    k = U.shape[1] - 1 if biased else U.shape[1]
    out = np.empty((len(clients), k, k))
    partner_grams(group.row_ptr, clients, U, biased, out)
    return out


def _u_phase(U, group, Vt, active, *, variant, c_factor, alpha_u, l1_ratio, positive,
             local_iter_u, client_weights, biased, weighted=False):
    """The U phase of the active clients, one call (their rows; the others unchanged)."""
    ridge = alpha_u * (1.0 - l1_ratio) if variant == "wang_chang" else 0.0
    if active.all():
        return user_steps(U, Vt, group.X, local_iter_u, c_factor, ridge, alpha_u, l1_ratio,
                          positive, biased)
    rows = np.flatnonzero(np.repeat(active, np.diff(group.row_ptr)))
    out = U.copy()
    out[rows] = user_steps(U[rows], Vt, group.X[rows], local_iter_u, c_factor, ridge, alpha_u,
                           l1_ratio, positive, biased)
    return out


def _step_sizes(U, group, senders, omega, d_global, *, variant, n_clients, d_factor, w_step,
                ridge, biased):
    """``w_phase``'s W steps of the clients ``senders``: ``d`` per client and free column
    (with biases one bound per column block, ``_biases.item_step_bounds``) and the factor of
    the data gradient per client."""
    kw = U.shape[1] - 1 if biased else U.shape[1]
    paper = variant == "fedmc_admm"
    scale = np.full(senders.size, 1.0 / n_clients) if paper else 1.0 / omega
    if not paper and w_step == "global":
        return np.ascontiguousarray(np.broadcast_to(d_global, (senders.size, kw))), scale
    grams = _grams(U, group, senders, biased)
    if not paper:
        grams = grams / omega[:, None, None]
    if biased:  # w_bound's block bounds, one client per row
        top = np.linalg.eigvalsh(grams[:, :-1, :-1])[:, -1] if kw > 1 else 0.0
        bound = np.maximum(_biases._block_bounds(top, grams[:, -1, -1], kw, 0.0),
                           EPS_LIPSCHITZ)
    else:
        bound = np.maximum(np.linalg.eigvalsh(grams)[:, -1], EPS_LIPSCHITZ)[:, None]
    if paper:  # (w_phase: plus the ridge where the bounds are per column block)
        d = d_factor * (bound + (ridge if biased else 0.0))
    else:
        d = w_step_size(d_factor * (bound + ridge), d_global, w_step, d_factor)
    return np.ascontiguousarray(np.broadcast_to(d, (senders.size, kw))), scale


def _dense_upload(Vt, d, q2, ridge, alpha_v, l1_ratio, positive, biased):
    """``W_p`` of a client where its unrated rows are not a scaling of ``V``: the zero-gradient
    steps of the per-client W phase, on every row (the rated ones are overwritten)."""
    W = _biases.free_item(Vt) if biased else Vt
    for _ in range(q2):
        W = prox_nonsmooth(W - (ridge * W) / d, 1.0 / d, alpha_v, l1_ratio, positive)
    return _biases.with_item(W) if biased else W


def _w_uploads(U, group, Vt, q2, omega, d_global, senders, *, variant, n_clients, d_factor,
               w_step, alpha_v, l1_ratio, positive, biased, weighted=False):
    """The W phase (13) of the clients ``senders`` (local indices; ``omega`` theirs): their
    uploads ``{client: {"W": W_p}}``."""
    if not senders.size:
        return {}
    ridge = alpha_v * (1.0 - l1_ratio)
    d, scale = _step_sizes(U, group, senders, omega, d_global, variant=variant,
                           n_clients=n_clients, d_factor=d_factor, w_step=w_step, ridge=ridge,
                           biased=biased)
    l1 = (1.0 / d) * (alpha_v * l1_ratio) * 1.0  # prox_nonsmooth's threshold, t = 1/d
    entry_ptr = group.entry_ptr
    n_entries = int((entry_ptr[senders + 1] - entry_ptr[senders]).sum())
    out_ptr = np.zeros(senders.size + 1, np.int64)
    items, values = np.empty(n_entries, np.int64), np.empty((n_entries, Vt.shape[1]))
    X = group.X
    rated_item_steps(X.indptr, X.indices, X.data, group.row_ptr, senders, U, Vt, biased,
                     read_only(d), np.ascontiguousarray(scale, dtype=float), q2, ridge, l1,
                     positive, out_ptr, items, values)
    free = _biases.free_item(Vt) if biased else Vt
    lazy = not (alpha_v * l1_ratio) and not (positive and (free < 0).any())
    step = 1.0 - ridge / d
    shrink = (np.maximum(step, 0.0) if positive else step) ** q2  # per client and free column
    if biased:  # (the column of ones is not stepped)
        shrink = _biases.with_item(shrink)
    uploads = {}
    for q, i in enumerate(senders.tolist()):
        rows, rated = items[out_ptr[q]:out_ptr[q + 1]], values[out_ptr[q]:out_ptr[q + 1]]
        if lazy:
            W = ItemRows(Vt, shrink[q], rows, rated)
        else:
            W = _dense_upload(Vt, d[q], q2, ridge, alpha_v, l1_ratio, positive, biased)
            W[rows] = rated
        uploads[group.start + i] = {"W": W}
    return uploads


# ---- the BatchedPhases contract (sklearn_fedmf.engine._groups)
# ------------------------------------
def init_group(group, broadcast, stream, *, init_scale, positive, client_weights, send_gram,
               biased, user_shrinkage=None):
    """Every client's private ``U_p^0`` from its own generator; uploads as ``init_client``."""
    k = broadcast["Vt"].shape[1]
    # (the eager generator: the lazy one's wrapper costs a fifth more, at every client)
    U = np.concatenate([
        random_user_factors(m, k, _rng(*stream, group.start + i), init_scale, positive, biased)
        for i, m in enumerate(np.diff(group.row_ptr).tolist())])
    if biased:  # (row by row: the same as each client's own start)
        start_user_biases(U, group.X, broadcast["Vt"], user_shrinkage)
    sizes = _sizes(group, client_weights).tolist()
    uploads = {group.start + i: {"size": float(size)} for i, size in enumerate(sizes)}
    if send_gram:
        for i, gram in enumerate(_grams(U, group, np.arange(group.n_clients), biased)):
            uploads[group.start + i]["gram"] = gram
    return {"U": U}, uploads


def prepare_group(group_state, group, broadcast, stream, active, selected, *, u_params):
    """``client_prepare`` of the active clients: the U phase, then each sends its Gram."""
    U = _u_phase(group_state["U"], group, broadcast["Vt"], active, **u_params)
    clients = np.flatnonzero(active)
    grams = _grams(U, group, clients, u_params["biased"])
    omega = np.full(group.n_clients, np.nan)
    omega[clients] = _omega(group, u_params["client_weights"], broadcast["total"])[clients]
    state = {"U": U, "Vt": broadcast["Vt"], "q2": broadcast["q2"], "omega": omega,
             "ready": active.copy()}
    return state, {group.start + i: {"gram": grams[q]} for q, i in enumerate(clients.tolist())}


def update_group(group_state, group, broadcast, stream, active, selected, *, prepared,
                 u_params, w_params):
    """``client_update``: (the U phase unless prepared, then) the selected clients' W phase."""
    if prepared:
        U, Vt, q2 = group_state["U"], group_state["Vt"], group_state["q2"]
        omega, d_global = group_state["omega"], broadcast["d"]
    else:
        Vt, q2, d_global = broadcast["Vt"], broadcast["q2"], None
        U = _u_phase(group_state["U"], group, Vt, active, **u_params)
        omega = _omega(group, u_params["client_weights"], broadcast["total"])
    senders = np.flatnonzero(active & selected)
    return {"U": U}, _w_uploads(U, group, Vt, q2, omega[senders], d_global, senders,
                                **w_params)


def client_state(group_state, group, i):
    """Client ``i``'s state as the per-client functions hold it."""
    state = user_rows_state(group_state, group, i)
    if "ready" in group_state and group_state["ready"][i]:  # between prepare and update
        state.update(Vt=group_state["Vt"], q2=group_state["q2"],
                     omega=float(group_state["omega"][i]))
    return state


def with_client_states(group_state, group, states):
    """The group state with the per-client ``states`` of some clients put in."""
    new = dict(group_state, U=group_state["U"].copy())
    prepared = [s for s in states.values() if "Vt" in s]
    if prepared and "ready" not in new:
        new.update(Vt=prepared[0]["Vt"], q2=prepared[0]["q2"],
                   omega=np.full(group.n_clients, np.nan),
                   ready=np.zeros(group.n_clients, dtype=bool))
    elif "ready" in new:
        new.update(omega=new["omega"].copy(), ready=new["ready"].copy())
    for i, state in states.items():
        new["U"][group.row_ptr[i]:group.row_ptr[i + 1]] = state["U"]
        if "ready" in new:
            new["ready"][i] = "Vt" in state
            if "Vt" in state:
                new["omega"][i] = state["omega"]
    return new


def make_batched(*, prepared, u_params, w_params, init_params, alpha_u, l1_ratio, biased):
    """The :class:`~sklearn_fedmf.engine._groups.BatchedPhases` of a FedMAvg protocol (the
    parameters of :func:`~sklearn_fedmf.completion._fedmavg._fedmavg.make_protocol`; never with the
    weighted regularization, whose per-item ridges make no common scale of the unrated rows)."""
    return BatchedPhases(
        init_client=partial(init_group, **init_params, biased=biased),
        client_prepare=partial(prepare_group, u_params=u_params) if prepared else None,
        client_update=partial(update_group, prepared=prepared, u_params=u_params,
                              w_params=w_params),
        # (a group has the X, X_eval and nnz of a client block: the sums come out at once)
        client_metrics=partial(client_metrics, alpha_u=alpha_u, l1_ratio=l1_ratio,
                               biased=biased),
        client_state=client_state,
        with_client_states=with_client_states,
    )
