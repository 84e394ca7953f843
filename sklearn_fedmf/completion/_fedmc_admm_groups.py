"""FedMC-ADMM for many small clients: batched client phases on implicit item-side copies.

Each client of Algorithm 1 keeps dense ``n_items x r`` copies ``W_i`` and ``Y_i`` and the
server keeps ``Z_i = W_i + Y_i / beta`` for every client: ``O(p n r)`` memory, and per round
``O(n r)`` work per sampled client whatever its ratings. At one client per user that dwarfs
the ratings (6,040 clients at the ML-1M shape: 1.25 GB per array family).

The simulation here holds the same iterates in ``O(ratings)``: on an item ``j`` a client did
not rate, the W loop (P-15) and the dual step are an affine map of ``(W_ij, V_j, Y_ij)`` with
scalars that are the same for every such item (the ``k = 0`` closed form of
:func:`~._fedmc_admm_kernels.linearized_cols`; Remark 4.1's ``v - y / beta`` for the exact W
update). Starting from ``W_i^0 = V^0`` and ``Y_i^0 = 0`` there (the initial dual is a
gradient on the rated items only), every unrated row of ``W_i`` and ``Y_i`` is therefore
``sum_t c_t V^(k_t)`` over the broadcasts ``V^(k_t)`` the client received. A client keeps its
rated rows explicitly and two coefficients per round it took part in; the broadcasts are
kept once (:class:`FactorHistory`, ``O(rounds n r)``) with their Gram blocks, which give the
client's ``L_W = ||W_i^T W_i||_F`` and the consensus gap without any dense row. The server
keeps ``sum_i Z_i`` as ``sum_t C_t V^(k_t)`` plus the explicit rows' deviations.

The messages are still the paper's: a client sends its dense ``(W_i, Y_i)``, held as
:class:`ImplicitFactor` (``nbytes`` counts it dense, ``np.asarray`` rebuilds it), and the
broadcast's message is ``V^k`` (the history rides in its uncounted simulation part: every
client holds the broadcasts it received). ``tests/test_fedmc_admm_batched.py`` checks that
these phases give the per-client functions' states, messages and fits.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .. import _biases
from .._base import squared_error_of
from .._engine import Broadcast
from .._groups import BatchedPhases
from .._kernels import squared_error
from .._prox import elastic_net_value
from .._transport import client_generator
from ._fedmc_admm_kernels import (
    group_update,
    implicit_consensus,
    implicit_deviation,
    scatter_rows,
)

__all__ = ["FactorHistory", "ImplicitFactor", "make_batched", "server_init_implicit",
           "server_update_implicit", "unpack_broadcast"]


class FactorHistory:
    """The item factors ``V^k`` the server broadcast, stacked, and their Gram blocks.

    ``H[t]`` is the ``t``-th broadcast (``n_items x r``) and ``G[t, u] = H[t]^T H[u]``. The
    server appends each new ``V`` (between the client phases, never during one); clients
    only read.
    """

    def __init__(self, Vt):
        n, r = Vt.shape
        self.H = np.empty((4, n, r), dtype=Vt.dtype)
        self.G = np.empty((4, 4, r, r))
        self.m = 0
        self.append(Vt)

    def append(self, Vt):
        """Store ``Vt`` as the next broadcast; returns its index."""
        m = self.m
        if m == self.H.shape[0]:  # double the capacity (amortized O(n r) per round)
            H = np.empty((2 * m,) + self.H.shape[1:], dtype=self.H.dtype)
            H[:m] = self.H
            G = np.empty((2 * m, 2 * m) + self.G.shape[2:])
            G[:m, :m] = self.G[:m, :m]
            self.H, self.G = H, G
        self.H[m] = Vt
        cross = np.matmul(self.H[m].T[None], self.H[:m + 1]).astype(np.float64, copy=False)
        self.G[m, :m + 1] = cross
        self.G[:m + 1, m] = cross.transpose(0, 2, 1)
        self.m = m + 1
        return m

    def combine(self, hist, coef, dtype):
        """``sum_q coef[q] H[hist[q]]`` (zeros for an empty combination)."""
        out = np.zeros(self.H.shape[1:], dtype=dtype)
        for t, c in zip(hist.tolist(), coef.tolist()):
            out += c * self.H[t]
        return out


class ImplicitFactor:
    """A client's dense ``n_items x r`` item-side matrix (``W_i`` or ``Y_i``) held as its rows
    ``rows`` (``values``) and, elsewhere, ``sum_q coef[q] V^(hist[q])`` of ``history``.

    It is the message the paper's client sends: :attr:`nbytes` counts it dense and
    ``np.asarray`` rebuilds it.
    """

    __slots__ = ("rows", "values", "hist", "coef", "history", "shape")

    def __init__(self, rows, values, hist, coef, history, shape):
        self.rows, self.values, self.hist, self.coef = rows, values, hist, coef
        self.history, self.shape = history, (int(shape[0]), int(shape[1]))

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nbytes(self):
        n, r = self.shape
        return n * r * self.values.dtype.itemsize

    def toarray(self):
        if self.hist.size:
            out = self.history.combine(self.hist, self.coef, self.dtype)
        else:
            out = np.zeros(self.shape, dtype=self.dtype)
        out[self.rows] = self.values
        return out

    def __array__(self, dtype=None, copy=None):
        out = self.toarray()
        return out if dtype is None else out.astype(dtype, copy=False)


def unpack_broadcast(broadcast):
    """``(Vt, history, index)`` of a broadcast (history None for a plain ``Vt``)."""
    if isinstance(broadcast, Broadcast):
        history, index = broadcast.simulation
        return broadcast.message, history, index
    return broadcast, None, None


# ---- the clients' side: batched phases -----------------------------------------------------
def _explicit_rows(group):
    """Each client's rated items (its explicit rows) and, for each of its ratings, the
    position of the item among them: lists over the group's clients."""
    X, n = group.X, group.X.shape[1]
    entry_ptr = group.entry_ptr
    owner = np.repeat(np.arange(group.n_clients), np.diff(entry_ptr))
    keys, inverse = np.unique(owner * n + X.indices, return_inverse=True)
    e_ptr = np.searchsorted(keys, np.arange(group.n_clients + 1) * n)
    E = (keys % n).astype(np.int64)
    loc = (inverse - e_ptr[owner]).astype(np.int64)
    return (np.split(E, e_ptr[1:-1]), np.split(loc, entry_ptr[1:-1]))


def init_group(group, Vt, stream, *, n_clients, init_scale, dual_init, positive, biased):
    """Batched ``init_client``: ``U_i^0`` from each client's own generator, ``W_i^0 = V^0``
    (coefficient 1 on broadcast 0), ``Y_i^0`` explicit on the rated items (0 elsewhere)."""
    X = group.X
    dtype = X.dtype
    Vt = Vt.astype(dtype, copy=False)
    r = Vt.shape[1]
    sizes = np.diff(group.row_ptr)
    U = np.concatenate([(init_scale * client_generator(stream, group.start + i).random(
        (sizes[i], r))).astype(dtype, copy=False) for i in range(group.n_clients)])
    if positive:
        U = np.maximum(U, 0.0)
    if biased:
        _biases.init_user(U)
    E, loc = _explicit_rows(group)
    if dual_init == "paper":  # -(1/p) grad_V f_i on the rated items, entries in row order
        rows = np.repeat(np.arange(group.n_rows), np.diff(X.indptr))
        resid = np.einsum("sa,sa->s", U[rows], Vt[X.indices]) - X.data
        e_ptr = np.cumsum([0] + [e.size for e in E])
        owner = np.repeat(np.arange(group.n_clients), np.diff(group.entry_ptr))
        at = e_ptr[owner] + np.concatenate(loc)
        grad = np.stack([np.bincount(at, resid * U[rows, a], minlength=e_ptr[-1])
                         for a in range(r)], axis=1).astype(dtype, copy=False)
        Y = np.split(grad / -n_clients, e_ptr[1:-1])
    else:
        Y = [np.zeros((e.size, r), dtype=dtype) for e in E]
    state = {"U": U, "E": E, "loc": loc, "W": [Vt[e] for e in E], "Y": Y,
             "hist": [np.zeros(1, np.int64)] * group.n_clients,
             "coef": [np.array([[1.0, 0.0]])] * group.n_clients, "V0": Vt, "history": None}
    empty = np.zeros(0, np.int64)
    uploads = {group.start + i: {"Y": ImplicitFactor(E[i], Y[i], empty, np.zeros(0), None,
                                                     Vt.shape)}
               for i in range(group.n_clients)}
    return state, uploads


def _gather(lists, index):
    """The concatenation of ``lists[i]`` over ``index`` and its pointer array."""
    parts = [lists[i] for i in index]
    ptr = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=ptr[1:])
    return np.concatenate(parts), ptr


def update_group(gs, group, broadcast, stream, active, selected, *, n_clients, beta, local_iter,
                 alpha_u, l1_ratio, positive, w_update, biased, eps):
    """Batched ``client_update``: one compiled call for the group's active clients
    (:func:`~._fedmc_admm_kernels.group_update`); uploads ``(W_i, Y_i)`` as
    :class:`ImplicitFactor` (``eps``: the floor of ``L_W`` and ``L_U``)."""
    Vt, history, kk = unpack_broadcast(broadcast)
    if history is None:
        raise ValueError("The batched FedMC-ADMM phases need the server's broadcast history "
                         "(server_init_uploads of implicit uploads).")
    act = np.flatnonzero(active)
    X = group.X
    E, e_ptr = _gather(gs["E"], act)
    loc, loc_ptr = _gather(gs["loc"], act)
    W, _ = _gather(gs["W"], act)
    Y, _ = _gather(gs["Y"], act)
    hist, h_ptr = _gather(gs["hist"], act)
    coef, _ = _gather(gs["coef"], act)
    U_out = gs["U"].copy()
    W_out, Y_out = np.empty_like(W), np.empty_like(Y)
    coef_out = np.empty((coef.shape[0] + act.size, 2))
    group_update(X.indptr, X.data, group.row_ptr, act, loc, loc_ptr, E, e_ptr, W, Y, hist,
                 coef, h_ptr, gs["U"], Vt, history.H, history.G, kk, n_clients, beta,
                 local_iter, alpha_u, l1_ratio, positive, biased, w_update == "exact",
                 eps, U_out, W_out, Y_out, coef_out)
    # each client's coefficients: its old entries, then broadcast kk (one vectorized pass)
    hist_out = np.empty(coef_out.shape[0], dtype=np.int64)
    new_at = h_ptr[1:] + np.arange(act.size)
    hist_out[np.setdiff1d(np.arange(hist_out.size), new_at, assume_unique=True)] = hist
    hist_out[new_at] = kk
    state = dict(gs, U=U_out, history=history)
    for key in ("W", "Y", "hist", "coef"):
        state[key] = list(gs[key])
    shape = Vt.shape
    uploads = {}
    rows = e_ptr.tolist()
    bounds = (h_ptr + np.arange(act.size + 1)).tolist()
    for a, (i, sends) in enumerate(zip(act.tolist(), selected[act].tolist())):
        e0, e1 = rows[a], rows[a + 1]
        Wi, Yi = W_out[e0:e1].copy(), Y_out[e0:e1].copy()  # a round's block is not kept alive
        hi, ci = hist_out[bounds[a]:bounds[a + 1]], coef_out[bounds[a]:bounds[a + 1]]
        state["W"][i], state["Y"][i], state["hist"][i], state["coef"][i] = Wi, Yi, hi, ci
        if sends:
            Ei = gs["E"][i]
            uploads[group.start + i] = {
                "W": ImplicitFactor(Ei, Wi, hi, ci[:, 0], history, shape),
                "Y": ImplicitFactor(Ei, Yi, hi, ci[:, 1], history, shape)}
    return state, uploads


def metrics_group(gs, group, broadcast, *, alpha_u, l1_ratio, biased):
    """Batched ``client_metrics``: the sums of the group's clients."""
    Vt, history, kk = unpack_broadcast(broadcast)
    U, X = gs["U"], group.X
    sse = squared_error(X.indptr, X.indices, X.data, U, Vt)
    everyone = np.arange(group.n_clients)
    if history is None:  # before any server update: materialize (W_i^0 = V^0)
        consensus = sum(float(np.sum((np.asarray(state_of(gs, group, i)["Wt"]) - Vt) ** 2))
                        for i in everyone)
    else:
        E, e_ptr = _gather(gs["E"], everyone)
        W, _ = _gather(gs["W"], everyone)
        hist, h_ptr = _gather(gs["hist"], everyone)
        coef, _ = _gather(gs["coef"], everyone)
        consensus = implicit_consensus(E, e_ptr, W, hist, np.ascontiguousarray(coef[:, 0]),
                                       h_ptr, Vt, history.H, history.G, kk)
    return {
        "loss": 0.5 * sse + elastic_net_value(_biases.free_user(U) if biased else U, alpha_u,
                                              l1_ratio),
        "sse": sse,
        "n": X.nnz,
        "sse_eval": squared_error_of(group.X_eval, U, Vt),
        "n_eval": 0 if group.X_eval is None else group.X_eval.nnz,
        "consensus": consensus,
    }


def _dense(gs, key, column, i):
    hist, coef = gs["hist"][i], gs["coef"][i][:, column]
    values = gs[key][i]
    if gs["history"] is not None:
        out = gs["history"].combine(hist, coef, values.dtype)
    else:  # only broadcast 0 so far
        out = np.zeros(gs["V0"].shape, dtype=values.dtype)
        for c in coef.tolist():
            out += c * gs["V0"]
    out[gs["E"][i]] = values
    return out


def state_of(gs, group, i):
    """Client ``i``'s per-client state ``{"U", "Wt", "Yt"}``, made dense."""
    a, b = group.row_ptr[i], group.row_ptr[i + 1]
    return {"U": gs["U"][a:b].copy(), "Wt": _dense(gs, "W", 0, i),
            "Yt": _dense(gs, "Y", 1, i)}


def with_states(gs, group, states):
    """The group state with the per-client ``states`` of some clients: their copies are held
    explicitly on every item (no implicit rows)."""
    state = dict(gs, U=gs["U"].copy())
    for key in ("E", "loc", "W", "Y", "hist", "coef"):
        state[key] = list(gs[key])
    n = gs["V0"].shape[0]
    for i, s in states.items():
        a, b = group.row_ptr[i], group.row_ptr[i + 1]
        state["U"][a:b] = s["U"]
        lo, hi = group.X.indptr[a], group.X.indptr[b]
        state["E"][i] = np.arange(n, dtype=np.int64)
        state["loc"][i] = group.X.indices[lo:hi].astype(np.int64)
        state["W"][i], state["Y"][i] = np.asarray(s["Wt"]), np.asarray(s["Yt"])
        state["hist"][i], state["coef"][i] = np.zeros(0, np.int64), np.zeros((0, 2))
    return state


def make_batched(*, n_clients, init_scale, dual_init, positive, biased, beta, local_iter,
                 alpha_u, l1_ratio, w_update, eps):
    """The :class:`~sklearn_fedmf._groups.BatchedPhases` of FedMC-ADMM."""
    return BatchedPhases(
        init_client=partial(init_group, n_clients=n_clients, init_scale=init_scale,
                            dual_init=dual_init, positive=positive, biased=biased),
        client_update=partial(update_group, n_clients=n_clients, beta=beta,
                              local_iter=local_iter, alpha_u=alpha_u, l1_ratio=l1_ratio,
                              positive=positive, w_update=w_update, biased=biased, eps=eps),
        client_metrics=partial(metrics_group, alpha_u=alpha_u, l1_ratio=l1_ratio,
                               biased=biased),
        client_state=state_of,
        with_client_states=with_states,
    )


# ---- the server's side ---------------------------------------------------------------------
def _dense_parts(upload, n_items):
    """A dense upload (a client run alone) as an implicit one explicit on every row."""
    hist = np.zeros(0, np.int64)
    return tuple(ImplicitFactor(np.arange(n_items, dtype=np.int64), np.asarray(upload[key]),
                                hist, np.zeros(0), None, (n_items, upload[key].shape[1]))
                 for key in ("W", "Y"))


def _store(server_state, clients, W, Y, beta):
    """Replace the clients' terms ``Z_i = W_i + Y_i / beta`` of the server's sum (messages
    ``W``, ``Y`` in client order); returns them concatenated as ``(rows, D, hist, coef)``
    with ``D`` the explicit rows' deviations from the implicit combination."""
    everyone = range(len(clients))
    rows, e_ptr = _gather([w.rows for w in W], everyone)
    Z = (_gather([w.values for w in W], everyone)[0]
         + _gather([y.values for y in Y], everyone)[0] / beta)
    hist, h_ptr = _gather([w.hist for w in W], everyone)
    coef = (_gather([w.coef for w in W], everyone)[0]
            + _gather([y.coef for y in Y], everyone)[0] / beta)
    return _store_concatenated(server_state, clients, rows, e_ptr, Z, hist, h_ptr, coef)


def _store_concatenated(server_state, clients, rows, e_ptr, Z, hist, h_ptr, coef):
    history, store = server_state["history"], server_state["store"]
    D = np.empty(Z.shape)
    implicit_deviation(rows, e_ptr, Z, hist, coef, h_ptr, history.H, D)
    e_ptr, h_ptr = e_ptr.tolist(), h_ptr.tolist()
    for a, c in enumerate(clients):
        e0, e1, q0, q1 = e_ptr[a], e_ptr[a + 1], h_ptr[a], h_ptr[a + 1]
        store[c] = (rows[e0:e1], D[e0:e1], hist[q0:q1], coef[q0:q1])
    return rows, D, hist, coef


def _set_sum(server_state, rows, D, hist, coef):
    """The server's sum from all clients' terms (given concatenated): exact."""
    history = server_state["history"]
    R = np.zeros(history.H.shape[1:])
    scatter_rows(R, rows, D, 1.0)
    server_state["R"] = R
    server_state["C"] = np.bincount(hist, weights=coef, minlength=history.m)
    server_state["since_exact"] = 0


def _resum(server_state):
    """The server's sum from every client's stored term, exactly (bounds the drift)."""
    store = server_state["store"]
    _set_sum(server_state, *(np.concatenate([s[f] for s in store]) for f in range(4)))


def _total(server_state):
    history, C = server_state["history"], server_state["C"]
    m = history.m
    C = np.concatenate([C, np.zeros(m - C.size)]) if C.size < m else C
    server_state["C"] = C
    n, r = history.H.shape[1:]
    return server_state["R"] + (C[:m] @ history.H[:m].reshape(m, n * r)).reshape(n, r)


def server_init_implicit(Vt, uploads, *, beta, n_clients):
    """``server_init_uploads`` for implicit ``Y_i^0``: ``Z_i^0 = V^0 + Y_i^0 / beta`` of
    every client as rows and a coefficient, and the broadcast ``V^0`` with the history."""
    history = FactorHistory(Vt)
    server_state = {"Vt": Vt, "Z": None, "history": history, "store": [None] * n_clients}
    clients = sorted(uploads)
    Y = [uploads[c]["Y"] for c in clients]  # 0 off the rated rows, W_i^0 = V^0 everywhere
    rows, e_ptr = _gather([y.rows for y in Y], range(len(Y)))
    Z = Vt[rows] + _gather([y.values for y in Y], range(len(Y)))[0] / beta
    h_ptr = np.arange(len(Y) + 1, dtype=np.int64)
    _set_sum(server_state, *_store_concatenated(
        server_state, clients, rows, e_ptr, Z, np.zeros(len(Y), np.int64), h_ptr,
        np.ones(len(Y))))
    return server_state, Broadcast(Vt, (history, 0))


def server_update_implicit(server_state, uploads, round_index, *, beta, resum_every):
    """The sum of (P-16) over all clients, replacing the terms of the clients that sent
    ``uploads`` (their rated rows and coefficients: ``O(ratings)``), exact every
    ``resum_every`` rounds. Returns ``sum_i Z_i``."""
    n_items = server_state["history"].H.shape[1]
    clients = list(uploads)
    if clients:
        store = server_state["store"]
        old = [store[c] for c in clients]
        W, Y = [], []
        for c in clients:
            w, y = uploads[c]["W"], uploads[c]["Y"]
            if not isinstance(w, ImplicitFactor):
                w, y = _dense_parts(uploads[c], n_items)
            W.append(w)
            Y.append(y)
        rows, D, hist, coef = _store(server_state, clients, W, Y, beta)
    server_state["since_exact"] += 1
    if server_state["since_exact"] >= resum_every:
        _resum(server_state)
    elif clients:
        R = server_state["R"]
        scatter_rows(R, np.concatenate([o[0] for o in old]),
                     np.concatenate([o[1] for o in old]), -1.0)
        scatter_rows(R, rows, D, 1.0)
        m = server_state["history"].m
        C = server_state["C"]
        C = np.concatenate([C, np.zeros(m - C.size)]) if C.size < m else C
        np.subtract.at(C, np.concatenate([o[2] for o in old]),
                       np.concatenate([o[3] for o in old]))
        np.add.at(C, hist, coef)
        server_state["C"] = C
    return _total(server_state)
