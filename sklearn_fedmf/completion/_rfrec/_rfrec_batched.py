"""RFRec's client phases for a group of clients
(:class:`~sklearn_fedmf.engine._groups.BatchedPhases`): the per-client functions of
:mod:`._rfrec_protocol`, every client of a group in one compiled call (:mod:`._rfrec_kernels`).

Many clients (one per user): from ``sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS`` clients on, the
clients run in groups (:mod:`sklearn_fedmf.engine._groups`): a group's states are stacked (its
users' vectors, one row of ``P`` per rated (client, item) pair, Adam's moments alike) and each round
is one compiled call per group, which updates the stacked arrays in place. Memory is then
``(n_users + nnz) * d`` numbers (three times that with Adam) plus the data, with nothing per
client; the model is the per-client simulation's (``tests/test_rfrec_batched.py``).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from ... import _biases
from ...engine._groups import BatchedPhases
from ...engine._transport import client_generator
from ._rfrec_kernels import (
    _NOTHING,
    _PULL,
    _STEP,
    AdamMoments,
    GroupPairs,
    StepSettings,
    _group_sums,
    _group_update,
)
from ._rfrec_protocol import AUTO_SAFETY, _action, _metrics, _upload

__all__ = ["make_batched"]


# ---- batched clients: a whole ClientGroup per call (_groups.BatchedPhases) ---------------
# A group state stacks its clients' per-client states: ``U`` (rows in ``group.rows`` order),
# ``P`` (the rated columns, client after client, each client's ascending as ``np.unique``
# gives them), ``cols`` (their items), ``pair`` (each stored entry's row of ``P``; empty when
# every client has one row, so that entry ``s`` is pair ``s``), ``pair_ptr`` (client ``i``'s
# pairs are ``pair_ptr[i]:pair_ptr[i + 1]``), ``pending`` and ``opt`` (Adam's ``t`` per
# client and the moments stacked like ``U`` and ``P``). Memory is ``O((n_rows + nnz) d)``
# for the group, with no object per client.
#
# client_update changes the group's arrays in place: RFRec's state is the clients' rated
# columns, ``nnz * d`` numbers, and a fresh copy per round would double the memory of the
# fit. The contract's guarantee holds as far as the state update goes: its allocations precede
# the one compiled call that writes, which cannot raise, so only a failure while the uploads
# are built afterwards (out of memory) could leave a group stepped. An upload's ``values``
# are a read-only view of the client's rows of ``P`` (a copy per round would hold the whole
# ``P`` twice more while the engine keeps the previous round's uploads):
# they are the upload during its round, server update and callback; a callback that keeps
# uploads across rounds copies them.
_ACTION_CODE = {"step": _STEP, "main": _STEP, "pull": _PULL}


def _group_layout(group):
    """``(cols, pair, pair_ptr)`` of a group's stacked rated columns (see above)."""
    X = group.X
    owner = np.repeat(np.arange(group.n_clients, dtype=np.int64), np.diff(group.entry_ptr))
    keys = owner * X.shape[1] + X.indices
    if np.all(keys[1:] > keys[:-1]):  # one row per client: a pair per entry
        return X.indices, np.empty(0, dtype=np.intp), group.entry_ptr.astype(np.intp)
    uniq, inverse = np.unique(keys, return_inverse=True)
    pair_ptr = np.searchsorted(uniq, np.arange(group.n_clients + 1) * X.shape[1])
    return ((uniq % X.shape[1]).astype(X.indices.dtype), inverse.astype(np.intp).ravel(),
            pair_ptr.astype(np.intp))


def init_client_batched(group, broadcast, stream, *, init_std, optimizer, biased=False):
    """:func:`init_client` for every client of ``group``; each client draws its ``u_i`` from
    its own generator, as alone."""
    bc = broadcast.simulation
    d = bc.Vbar.shape[1]
    U = np.empty((group.n_rows, d))
    row_ptr = group.row_ptr
    for i in range(group.n_clients):  # (the per-client streams: a generator each)
        rng = client_generator(stream, group.start + i)
        U[row_ptr[i]:row_ptr[i + 1]] = init_std * rng.standard_normal(
            (row_ptr[i + 1] - row_ptr[i], d))
    if biased:
        _biases.init_user(U)
    cols, pair, pair_ptr = _group_layout(group)
    P = bc.Vbar[cols]
    opt = None
    if optimizer == "adam":
        opt = {"t": np.zeros(group.n_clients, dtype=np.int64), "mU": np.zeros_like(U),
               "vU": np.zeros_like(U), "mP": np.zeros_like(P), "vP": np.zeros_like(P)}
    state = {"U": U, "P": P, "opt": opt, "cols": cols, "pair": pair, "pair_ptr": pair_ptr,
             "pending": np.zeros(group.n_clients, dtype=bool)}
    return state, {}


def client_update_batched(gs, group, broadcast, stream, active, selected, *, variant,
                          schedule, alpha_u, simulate, step, privacy, link):
    """:func:`client_update` for the ``active`` clients of ``group`` in one compiled call;
    the uploads of the ``selected`` ones (a Python step per upload only). ``step``,
    ``privacy`` and ``link`` are the keyword groups of :func:`make_batched`."""
    lr, reg, reg_v, p, eta = (step[key] for key in ("lr", "reg", "reg_v", "p", "eta"))
    link, shift, span = link["link"], link["shift"], link["span"]
    bc = broadcast.simulation
    X, opt = group.X, gs["opt"]
    action = _action(variant, schedule, bc.coin)
    stepping = action == "step"  # else RFRecF's main update: grad f / (1 - p), no psi
    none_u, none_p = (np.empty((0, gs["U"].shape[1])),) * 2
    _group_update(GroupPairs(X.indptr, X.data, group.row_ptr, gs["pair_ptr"], gs["pair"],
                             gs["cols"]),
                  gs["U"], gs["P"], bc.Vbar, np.ascontiguousarray(active), gs["pending"],
                  StepSettings(_ACTION_CODE.get(action, _NOTHING), action == "upload_pull",
                               0.0 if eta is None else eta, link == "sigmoid", shift, span,
                               alpha_u, reg_v, reg if stepping else 0.0,
                               1.0 if stepping or p is None else 1 / (1 - p),
                               AUTO_SAFETY if lr is None else lr, lr is None, opt is not None,
                               step["biased"]),
                  AdamMoments(np.zeros(0, dtype=np.int64), none_u, none_u, none_p, none_p)
                  if opt is None else AdamMoments(opt["t"], opt["mU"], opt["vU"], opt["mP"],
                                                  opt["vP"]))
    if action not in ("step", "upload", "upload_pull"):
        return gs, {}
    uploads = {}
    ptr = gs["pair_ptr"]
    for i in np.flatnonzero(active & selected).tolist():
        cols, P = gs["cols"][ptr[i]:ptr[i + 1]], gs["P"][ptr[i]:ptr[i + 1]]
        if not (privacy["clip_delta"] or simulate):  # (those make new arrays)
            P = P.view()
            P.flags.writeable = False
        uploads[group.start + i] = _upload(
            bc, cols, P,
            client_generator(stream, group.start + i), action, simulate=simulate, **step,
            **privacy)
    return gs, uploads


def client_metrics_batched(gs, group, broadcast, *, alpha_u, eta, link, shift, span,
                           biased=False):
    """:func:`client_metrics` summed over the clients of ``group``."""
    bc = broadcast.simulation
    X, U, sigmoid = group.X, gs["U"], link == "sigmoid"
    fit, psi, sq, sse, ae = _group_sums(X.indptr, X.data, group.row_ptr, gs["pair_ptr"],
                                        gs["pair"], gs["cols"], U, gs["P"], bc.W, bc.Vbar,
                                        gs["pending"], 0.0 if eta is None else eta, sigmoid,
                                        shift, span)
    return _metrics(fit, psi, sq, sse, ae, U, X, group.X_eval, bc.Vbar, alpha_u=alpha_u,
                    sigmoid=sigmoid, shift=shift, span=span, biased=biased)


def _slices(gs, group, i):
    ptr = gs["pair_ptr"]
    return (slice(group.row_ptr[i], group.row_ptr[i + 1]), slice(ptr[i], ptr[i + 1]),
            slice(group.entry_ptr[i], group.entry_ptr[i + 1]))


def client_state_batched(gs, group, i):
    """Client ``i``'s state as :func:`init_client` and :func:`client_update` hold it."""
    rows, pairs, entries = _slices(gs, group, i)
    opt = gs["opt"]
    if opt is not None:
        opt = {"t": int(opt["t"][i]), "mU": opt["mU"][rows].copy(),
               "vU": opt["vU"][rows].copy(), "mP": opt["mP"][pairs].copy(),
               "vP": opt["vP"][pairs].copy()}
    pair = (np.arange(pairs.stop - pairs.start, dtype=np.intp) if not len(gs["pair"])
            else gs["pair"][entries] - pairs.start)
    return {"U": gs["U"][rows].copy(), "P": gs["P"][pairs].copy(), "opt": opt,
            "cols": gs["cols"][pairs].copy(), "pair": pair, "pending": bool(gs["pending"][i])}


def with_client_states_batched(gs, group, states):
    """The group state with the clients of ``states`` (``{i: state}``) written in (in place,
    as :func:`client_update_batched`)."""
    opt = gs["opt"]
    for i, state in states.items():
        rows, pairs, _ = _slices(gs, group, i)
        gs["U"][rows], gs["P"][pairs] = state["U"], state["P"]
        gs["pending"][i] = state["pending"]
        if opt is not None:
            opt["t"][i] = state["opt"]["t"]
            for key, where in (("mU", rows), ("vU", rows), ("mP", pairs), ("vP", pairs)):
                opt[key][where] = state["opt"][key]
    return gs


def make_batched(*, init_std, optimizer, biased, variant, schedule, alpha_u, eta, simulate,
                 step, privacy, link):
    """RFRec's :class:`~sklearn_fedmf.engine._groups.BatchedPhases`: ``step``, ``privacy`` and
    ``link`` are the keyword groups :func:`._rfrec.make_protocol` binds to the per-client
    phases."""
    return BatchedPhases(
        init_client=partial(init_client_batched, init_std=init_std, optimizer=optimizer,
                            biased=biased),
        client_update=partial(client_update_batched, variant=variant, schedule=schedule,
                              alpha_u=alpha_u, simulate=simulate, step=step, privacy=privacy,
                              link=link),
        client_metrics=partial(client_metrics_batched, alpha_u=alpha_u, eta=eta,
                               biased=biased, **link),
        client_state=client_state_batched,
        with_client_states=with_client_states_batched,
    )
