"""FedMAvg under ``loss="implicit"``: model averaging for weighted matrix factorization.

The objective is :mod:`._implicit`'s, written as FedMAvg's weighted sum of the clients'
local objectives (:mod:`._fedmavg_protocol`, ``variant="wang_chang"``)::

    F(U, V) = sum_p omega_p F_p,   F_p = (1/omega_p) [f_p(U_p, V) + alpha_u/2 ||U_p||^2]
                                          + alpha_v/2 ||V||^2

with ``f_p`` the weighted loss of client ``p``'s users over every item. A round keeps the
paper's structure (Algorithm 1):

* every client (``participation="pcc"``) or only the sampled ones (``"pcp"``) take the U
  step against the broadcast ``V`` and ``V^T V``: the exact minimizer of ``F_p`` in
  ``U_p`` (:func:`~._implicit.implicit_user_factors`, the limit of the paper's ``Q1``
  proximal-gradient steps on this strongly convex quadratic);
* each sampled client takes ``Q2`` gradient steps on its copy ``W_p`` of ``V``, started at
  ``V``, on ``F_p`` (by default the paper's diminishing ``Q2^s = floor(q_hat / s) + 1``:
  many local steps move each copy towards its own client's minimizer, so a constant
  ``Q2 > 1`` makes the average stall at a point that is not the minimizer of ``F``, and
  the objective rises again once it is close; with one step late in the fit the average
  is a gradient step on ``F``). Its gradient in item row ``j`` is
  ``(1/omega_p) [(U_p^T U_p) w_j + sum_{t in p, j in I(t)} ((c_tj - 1) u_t.w_j - c_tj) u_t]
  + alpha_v w_j`` (:func:`~._implicit.implicit_item_gradient`): the all-items term is the
  client's own Gram, the rest costs its interactions. ``F_p`` is separable over the items,
  so each row takes its own step ``1 / (d_factor L_j)`` with the bound
  ``L_j = (lambda_max(U_p^T U_p) + trace(G1_jp)) / omega_p + alpha_v`` (``G1_jp = sum_t
  (c_tj - 1) u_t u_t^T``; the trace bounds its largest eigenvalue), which the rows of items
  the client never saw share;
* the client uploads ``W_p`` (``n_items x r``, the paper's message) and the server averages
  the copies with the weights ``omega_p`` (``aggregation``), then broadcasts ``V`` and
  ``V^T V``.

No client sends a row, a factor of a user or a list of items: only ``W_p``, as for ratings.
The W step needs no Gram exchange (``w_step`` does not apply). Client work: O(interactions
x r + n_items x r^2) per W step, the dense ``W_p`` being FedMAvg's upload.

Many small clients (one per user) run in groups (:mod:`sklearn_fedmf.engine._groups`). On an item
the client never saw, the gradient row is ``(scale U_p^T U_p + alpha_v I) w_j`` with the
common bound ``L_0 = scale lambda_max(U_p^T U_p) + alpha_v``, so its ``Q2`` steps map the
row ``v_j`` to ``v_j M_p^Q2``, ``M_p = I - (scale U_p^T U_p + alpha_v I) / (d_factor L_0)``
(``r x r``). The batched phases take the steps on the rated rows only (one compiled call
per group, :func:`~._implicit.rated_w_steps`) and send ``W_p`` as :class:`TransformedRows`
(``V M_p^Q2`` but for the rated rows; its bytes counted dense, as the paper's client sends
it); the server's average then costs the rated rows plus one ``V (sum_p w_p M_p^Q2)``.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from numba import njit

from ...engine._federation import FederatedProtocol
from ...engine._groups import BatchedPhases, LazyRows, user_rows_state, with_user_rows
from .._fedmgs._fedmgs_batched import group_start
from .._fedmgs._fedmgs_implicit import (
    client_metrics,
    combine_metrics,
    group_state,
    solve_active_users,
)
from .._implicit import implicit_item_gradient, implicit_user_factors, rated_w_steps
from ._fedmavg_protocol import EPS_LIPSCHITZ, client_weight, lambda_max
from ._fedmavg_protocol import server_init_uploads as average_init_uploads
from ._fedmavg_protocol import server_update as average_update
from ._fedmavg_round import round_phases

__all__ = ["TransformedRows", "make_implicit_protocol", "w_bounds", "w_steps"]


def _with_gram(broadcast):
    return {**broadcast, "VtV": broadcast["Vt"].T @ broadcast["Vt"]}


def init_server(rng, *, n_items, n_components, init_scale):
    """``V^0``: i.i.d. ``init_scale * Uniform[0, 1)``."""
    Vt = init_scale * rng.random((n_items, n_components))
    return {"Vt": Vt}, {"Vt": Vt}


def init_client(block, broadcast, rng, *, init_scale, client_weights):
    """Private ``U_p^0``; uploads its size (for ``omega``)."""
    U = init_scale * rng.random((block.n_rows, broadcast["Vt"].shape[1]))
    return {"U": U}, {"size": float(client_weight(block, client_weights))}


def server_init_uploads(server_state, uploads, *, n_clients, q2_first):
    state, broadcast = average_init_uploads(server_state, uploads, n_clients=n_clients,
                                            q2_first=q2_first)
    return state, _with_gram(broadcast)


def u_phase(state, block, broadcast, *, confidence, alpha_u, client_weights, cg_steps=None):
    """The U step (exact, or ``cg_steps`` conjugate-gradient steps from the current ``U``);
    keeps the broadcast for the W phase."""
    U = implicit_user_factors(block.X, broadcast["Vt"], broadcast["VtV"],
                              confidence=confidence, alpha_u=alpha_u,
                              out=None if cg_steps is None else state["U"].copy(),
                              cg_steps=cg_steps)
    omega = max(client_weight(block, client_weights), 1.0) / broadcast["total"]
    return {"U": U, "Vt": broadcast["Vt"], "q2": broadcast["q2"], "omega": omega}


def w_bounds(X, U, *, confidence, scale, alpha_v):
    """``L_j`` of each item row of ``F_p`` (module docstring)."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    weight = confidence * X.data * np.einsum("ea,ea->e", U[rows], U[rows])  # (c - 1)||u||^2
    trace = np.bincount(X.indices, weights=weight, minlength=X.shape[1])
    return scale * (lambda_max(U.T @ U) + trace) + alpha_v


def w_steps(Wt, U, X, n_steps, d, *, confidence, scale, alpha_v):
    """``n_steps`` gradient steps on ``F_p`` in ``W`` (one step size per item row)."""
    for _ in range(n_steps):
        G = scale * implicit_item_gradient(X, U, Wt, confidence=confidence) + alpha_v * Wt
        Wt = Wt - G / d[:, None]
    return Wt


def w_phase(state, block, d_global, *, confidence, alpha_v, d_factor):
    """Q2 local steps from ``V``; the upload ``{"W": W_p}``."""
    U, scale = state["U"], 1.0 / state["omega"]
    d = d_factor * np.maximum(w_bounds(block.X, U, confidence=confidence, scale=scale,
                                       alpha_v=alpha_v), EPS_LIPSCHITZ)
    return {"W": w_steps(state["Vt"], U, block.X, state["q2"], d, confidence=confidence,
                         scale=scale, alpha_v=alpha_v)}


def kept_state(state):
    return {"U": state["U"]}


def server_update(server_state, uploads, round_index, counts=None, *, aggregation,
                  local_iter_v, q_hat):
    state, broadcast = average_update(server_state, uploads, round_index, counts,
                                      aggregation=aggregation, local_iter_v=local_iter_v,
                                      q_hat=q_hat)
    return state, _with_gram(broadcast)


# ---- the client phases for a group of clients (``_groups.BatchedPhases``) --------------------
class TransformedRows(LazyRows):
    """A client's ``W_p``: ``base @ transform`` (``transform`` ``r x r``: the steps on the
    items it never saw) but for the rated ``rows``. The server's weighted sum adds the
    rated rows' differences and, once for all such messages, ``base @ (sum_p w_p
    transform_p)`` (:func:`~sklearn_fedmf.completion._fedmavg._fedmavg_round.weighted_sum`)."""

    __slots__ = ()

    def __init__(self, base, transform, rows, values):
        self.base, self.scale, self.rows, self.values = base, transform, rows, values
        self.shape = base.shape

    def toarray(self):
        out = self.base @ self.scale
        out[self.rows] = self.values
        return out

    def add_to(self, out, weight=1.0):
        """``out += weight * (rated rows - base @ transform on them)``; returns ``weight *
        transform``, the coefficient (applied to ``base`` from the right) the caller adds
        once."""
        _add_transformed(out, self.rows, self.values, self.base, self.scale, float(weight))
        return weight * self.scale


@njit(cache=True, nogil=True, fastmath=True)
def _add_transformed(out, rows, values, base, T, weight):
    # (one compiled call a message: the numpy form cost 60 us at a hundred rows)
    r = T.shape[0]
    for q in range(rows.shape[0]):
        j = rows[q]
        for e in range(r):
            out[j, e] += weight * values[q, e]
        for b in range(r):
            w = -weight * base[j, b]
            for e in range(r):
                out[j, e] += w * T[b, e]


def _client_sizes(group, client_weights):
    """Each client's size in the group: its interactions or its users (``client_weights``)."""
    return np.diff(group.entry_ptr if client_weights == "entries" else group.row_ptr)


def batched_init_client(group, broadcast, stream, *, init_scale, client_weights):
    """:func:`init_client` of every client of the group (each from its own generator)."""
    state = group_state(group, group_start(group, stream, broadcast["Vt"].shape[1], init_scale))
    return state, {group.start + i: {"size": float(size)} for i, size in
                   enumerate(_client_sizes(group, client_weights).tolist())}


def batched_client_update(state, group, broadcast, stream, active, selected, *, confidence,
                          alpha_u, alpha_v, d_factor, client_weights, cg_steps=None):
    """:func:`client_update` of the group's active clients: one solve call for their users;
    the senders' W steps on their rated rows in one call, the others in closed form."""
    U = solve_active_users(state, group, broadcast, active, confidence=confidence,
                           alpha_u=alpha_u, cg_steps=cg_steps)
    new = {**state, "U": U}
    senders = np.flatnonzero(active & selected)
    if not senders.size:
        return new, {}
    sizes = _client_sizes(group, client_weights)
    scale = broadcast["total"] / np.maximum(sizes[senders], 1.0)  # 1 / omega_p
    Vt = broadcast["Vt"]
    q2 = broadcast["q2"]
    items, item_ptr = state["items"], state["item_ptr"]
    out_ptr, values, transforms = rated_w_steps(
        group.X, group.row_ptr, senders, U, Vt, scale, confidence=confidence,
        alpha_v=alpha_v, d_factor=d_factor, eps=EPS_LIPSCHITZ, n_steps=q2, item_ptr=item_ptr,
        slot=state["slot"], single=state["single"], items=items)
    return new, {group.start + i: {"W": TransformedRows(
        Vt, transforms[q], items[item_ptr[i]:item_ptr[i + 1]], values[out_ptr[q]:out_ptr[q + 1]])}
        for q, i in enumerate(senders.tolist())}


def make_implicit_protocol(*, n_items, n_clients, n_components, local_iter_v, q_hat,
                           q2_first, participation, aggregation, d_factor, client_weights,
                           alpha_u, alpha_v, confidence, init_scale, cg_steps=None):
    """FedMAvg's protocol under ``loss="implicit"`` (many clients run in groups); ``cg_steps``:
    the users' solves by that many conjugate-gradient steps, None: exact."""
    metrics = partial(client_metrics, confidence=confidence, alpha_u=alpha_u)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items, n_components=n_components,
                            init_scale=init_scale),
        init_client=partial(init_client, init_scale=init_scale, client_weights=client_weights),
        server_init_uploads=partial(server_init_uploads, n_clients=n_clients,
                                    q2_first=q2_first),
        **round_phases(
            participation=participation, prepared=False,
            local_phase=partial(u_phase, confidence=confidence, alpha_u=alpha_u,
                                client_weights=client_weights, cg_steps=cg_steps),
            w_phase=partial(w_phase, confidence=confidence, alpha_v=alpha_v,
                            d_factor=d_factor),
            keep=kept_state, gram=None, server_prepare=None,
            server_update=partial(server_update, aggregation=aggregation,
                                  local_iter_v=local_iter_v, q_hat=q_hat)),
        client_metrics=metrics,
        combine_metrics=partial(combine_metrics, alpha_v=alpha_v),
        batched=BatchedPhases(
            init_client=partial(batched_init_client, init_scale=init_scale,
                                client_weights=client_weights),
            client_update=partial(batched_client_update, confidence=confidence,
                                  alpha_u=alpha_u, alpha_v=alpha_v, d_factor=d_factor,
                                  client_weights=client_weights, cg_steps=cg_steps),
            client_metrics=metrics,  # (a group's stacked rows sum as one client's)
            client_state=user_rows_state, with_client_states=with_user_rows),
    )
