"""FedMGS under ``loss="implicit"``: gradient sharing for weighted matrix factorization.

The objective is :mod:`._implicit`'s, ``f(U, V) + alpha_u/2 ||U||^2 + alpha_v/2 ||V||^2``
over every user-item pair. As for ratings (:mod:`._fedmgs_protocol`) the gradient in an
item row is linear in it, so a client's data aggregates let the server rebuild it exactly at
any ``V``; only their content changes. For item ``j`` and client ``p``::

    grad_j f = sum_p [(U_p^T U_p + G1_jp) v_j - G2_jp]
    G1_jp = sum_{t in p, j in I(t)} (c_tj - 1) u_t u_t^T
    G2_jp = sum_{t in p, j in I(t)} c_tj u_t

(:func:`~._implicit.implicit_item_sums`). The all-items term is the client's Gram
``U_p^T U_p``, which FedMGS's message already holds (for the ratings' step size): the
message is the paper's, rows ``[G2_jp, triu(G1_jp)]`` on the items the client's users
interacted with (``G1_jp`` is symmetric: its upper triangle, ``r (r + 1) / 2`` numbers, is
all of it), plus the Gram, nothing more.

The server needs only the sums over the clients. For ratings it caches every client's
latest message; at the ranks implicit feedback needs (``r + r (r + 1) / 2`` numbers per
rated item, 560 at ``r = 32``) that cache is the size of every client's message together (0.4 GB for
ten clients of the embedded MovieLens at ``r = 32``) on one machine. So under
``"implicit"`` each client keeps the factors its last message was computed at (in its
state, on its side: ``U_sent``, its rows x ``r`` numbers, not the message) and a sampled
client sends the *change* of its aggregates since then, ``G(U_p) - G(U_sent)`` computed
entry by entry from the two factors; the server adds the changes
to its running sums (``n_items x (r + r (r + 1) / 2)`` and ``r x r``), in client order. A
client that was not sampled did not move, so the sums stay exact at every client's
factors as last sent, as the cache kept them. The same message size and the same
information as the paper's (the server could add the changes up per client); the running
sums drift by rounding only (about 1e-16 relative per round).

The first message. ``U_sent`` starts at zero, not at the random ``U_p^0``: the message at
setup is zero rows (the same bytes) and the first sampled round's change is the client's
aggregates themselves. ``U_p^0`` is only the start of its users' first step, and its
aggregates (Algorithm 2's ``G1^0``, ``G2^0``) cost a whole pass over the interactions (1 of
``max_iter + 1``, the bulk of a round) for nothing the server can use: with every client
sampled, round 1's changes cancel them (the same model, to rounding); with sampling, they
held a not-yet-sampled client at factors fitted to no item (the per-user fingerprint's
objective after round 1: about 1,060 instead of 11,200).

A round. The server broadcasts ``V`` and ``V^T V`` (``r x r``). Each sampled client takes
its users' exact step (the closed-form minimizer over every item,
:func:`~._implicit.implicit_user_factors`, the limit of the paper's ``Q1`` gradient steps on
this strongly convex quadratic) and sends its aggregates. The server's step uses the exact
gradient and, item by item, the exact curvature of the same aggregates, ``H_j = sum_p
(U_p^T U_p + G1_jp) + alpha_v I``: ``v_j <- v_j - H_j^{-1} (grad_j + alpha_v v_j) =
H_j^{-1} sum_p G2_jp``. On a quadratic this preconditioned gradient step is the exact
minimizer in ``V``, so ``local_iter_v`` more steps change nothing (the ratings' plain steps
``1/(d_factor L)`` would need hundreds of rounds on the ill-conditioned weighted objective).
With every client sampled a round is one sweep of Hu, Koren & Volinsky's ALS, whatever the
partition: the federated model is the centralized one.

Client work: O(interactions x r^2 + users x r^3); server work O(n_items x r^3). With
``cg_steps`` (``solver_params={"implicit_solver": "cg"}``) the users' and the items' exact
solves become that many conjugate-gradient steps from their current factors (Takacs,
Pilaszy & Tikk 2011): O(interactions x r x cg_steps) for the users, O(n_items x r^2 x
cg_steps) for the server; the messages do not change, and the clients' aggregates,
O(interactions x r^2), remain the bulk of a round. Each client writes its message into the
same memory every round (:class:`MessageMemory`: allocated afresh, its page faults were 40%
of the fit's CPU on the ML-1M shape).

Many small clients (one per user) run in groups (:mod:`sklearn_fedmf.engine._groups`): the batched
phases below solve a group's active users in one compiled call and build every sender's
change in another (:func:`~._implicit.group_item_sums`), with the per-client functions'
draws, states, messages and bytes (to rounding).
"""

from __future__ import annotations

import mmap
import weakref
from functools import partial

import numpy as np
from numba import njit

from ...engine._federation import FederatedProtocol
from ...engine._groups import BatchedPhases, user_rows_state, with_user_rows
from .._implicit import (
    group_item_sums,
    implicit_item_sums,
    implicit_objective,
    implicit_user_factors,
    packed_size,
    spd_cg,
    spd_solve,
)
from . import _fedmgs_round as rounds
from ._fedmgs_batched import group_layout, group_start

__all__ = ["MessageMemory", "OneUserChange", "group_state", "make_implicit_protocol", "share",
           "server_solve", "solve_active_users"]

# What a client keeps between rounds, row by row: its factors and those of its last message.
ROW_KEYS = ("U", "U_sent")


def init_server(rng, *, n_items, n_components, init_scale):
    """``V^0``: i.i.d. ``init_scale * Uniform[0, 1)``; the broadcast adds ``V^T V``."""
    Vt = init_scale * rng.random((n_items, n_components))
    return {"Vt": Vt}, _broadcast(Vt)


def _broadcast(Vt):
    return {"Vt": Vt, "VtV": Vt.T @ Vt}


def mapped_zeros(shape):
    """A float64 array of zeros in its own anonymous memory mapping: small pages, on Linux
    all mapped by the call (``MAP_POPULATE``; elsewhere as they are first written). (numpy
    asks the kernel for huge pages from 4 MB on; with the kernel's default
    ``defrag=madvise`` each such fault may compact memory first: on the loaded machine of
    issue 38, 0.5 s of system time for a fit's 290 MB of messages, against 0.2 s in small
    pages. Populated in one pass rather than a fault a page: 0.19 s instead of 0.30 s for
    Last.fm's 258 MB of messages and sums, measured in the same run.)"""
    size = int(np.prod(shape))
    return np.frombuffer(mmap.mmap(-1, max(8 * size, 1), **_POPULATE), dtype=np.float64,
                         count=size).reshape(shape)


# (private: the pages of this process alone, as numpy's own)
_POPULATE = ({"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE}
             if hasattr(mmap, "MAP_POPULATE") else {})


class MessageMemory:
    """The memory of the clients' messages in one fit, reused round after round.

    A client's ``G`` is ``k x (r + r (r + 1) / 2)`` numbers (29 MB for a tenth of the ML-1M
    shape at ``r = 48``), written in full each round and read once by the server. Allocated
    afresh, its pages were faulted in every round: on the 2-core machine of issue 38 that
    system time was 40% of the default fit's CPU (``implicit``'s ALS, next to it, touches a
    few MB). So each client writes its rows into the same array every round (and keeps its
    interactions by item): the message is the same, bit for bit, and it is valid until the
    client's next round (a callback that keeps uploads keeps copies). Kept by the fit's
    protocol, keyed by the client's data matrix (held weakly); a copy of it (a protocol sent
    to worker processes) starts empty.
    """

    def __init__(self):
        self._clients = {}

    def __reduce__(self):
        return (MessageMemory, ())

    def of(self, X, r):
        """``(Xt, G)``: ``X`` transposed (CSR) and the array for its message's rows."""
        entry = self._clients.get(id(X))
        if entry is None or entry[0]() is not X or entry[2].shape[1] != packed_size(r):
            Xt = X.T.tocsr()
            G = mapped_zeros((int(np.count_nonzero(np.diff(Xt.indptr))), packed_size(r)))
            entry = self._clients[id(X)] = (weakref.ref(X), Xt, G)
        return entry[1], entry[2]


def share(U, X, *, confidence, U_old=None, memory=None):
    """A client's message ``{"items", "G", "gram"}``: its aggregates on the items its users
    interacted with (row ``[G2_j, triu(G1_j)]``) and ``U_p^T U_p``, or with ``U_old`` their
    changes since the message at ``U_old``; ``G`` written into ``memory``'s array for ``X``
    (a :class:`MessageMemory`) if given."""
    Xt, out = (None, None) if memory is None else memory.of(X, U.shape[1])
    items, G = implicit_item_sums(X, U, confidence=confidence, U_old=U_old, Xt=Xt, out=out)
    gram = U.T @ U if U_old is None else U.T @ U - U_old.T @ U_old
    return {"items": items, "G": G, "gram": gram}


def zero_message(X, r):
    """A client's first message: zero rows on the items its users interacted with (the
    paper's rows, the same bytes) and a zero Gram."""
    items = np.flatnonzero(np.diff(X.tocsc().indptr))
    return {"items": items, "G": np.zeros((items.size, packed_size(r))),
            "gram": np.zeros((r, r))}


def init_client(block, broadcast, rng, *, init_scale, confidence):
    """Private ``U_p^0`` (i.i.d. ``init_scale * Uniform[0, 1)``, the start of its users'
    first step) and its first message, zero: its base ``U_sent`` is zero until it is first
    sampled, so that message sends its aggregates themselves (module docstring)."""
    U = init_scale * rng.random((block.n_rows, broadcast["Vt"].shape[1]))
    return {"U": U, "U_sent": np.zeros_like(U)}, zero_message(block.X, U.shape[1])


def u_phase(state, block, broadcast, *, confidence, alpha_u, cg_steps=None):
    """The users' step against the broadcast ``V`` and ``V^T V``: exact, or ``cg_steps``
    conjugate-gradient steps from their current factors."""
    U = implicit_user_factors(block.X, broadcast["Vt"], broadcast["VtV"],
                              confidence=confidence, alpha_u=alpha_u,
                              out=None if cg_steps is None else state["U"].copy(),
                              cg_steps=cg_steps)
    return {**state, "U": U}


def change(state, block, broadcast, *, confidence, memory=None):
    """The change of the client's message since its last one (whose factors it replaces)."""
    message = share(state["U"], block.X, confidence=confidence, U_old=state["U_sent"],
                    memory=memory)
    state["U_sent"] = state["U"]  # (the client's own new state, made by this round's u_phase)
    return message


def client_update(state, block, broadcast, rng, selected, *, confidence, alpha_u,
                  cg_steps=None, memory=None):
    """FedMGS's client round (:func:`sklearn_fedmf.completion._fedmgs._fedmgs_round.client_update`):
    the users' step, then the change of the aggregates (in ``memory``, a
    :class:`MessageMemory`, if given)."""
    return rounds.client_update(
        state, block, broadcast, rng, selected,
        local_phase=partial(u_phase, confidence=confidence, alpha_u=alpha_u,
                            cg_steps=cg_steps),
        share=partial(change, confidence=confidence, memory=memory))


@njit(cache=True, nogil=True)
def _add_rows(sums, items, G):
    # (row views: the loop over a row vectorizes; by 2-D index it ran 1.7x slower)
    for q in range(items.shape[0]):
        row, g = sums[items[q]], G[q]
        for a in range(g.shape[0]):
            row[a] += g[a]


@njit(cache=True, nogil=True, fastmath=True)
def _add_one_user(sums, items, c, u, o):
    # OneUserChange's rows, added without forming them: [c_j (u - o), (c_j - 1) triu(D)]
    r = u.shape[0]
    D = np.empty(sums.shape[1] - r)
    k = 0
    for a in range(r):
        for e in range(a, r):
            D[k] = u[a] * u[e] - o[a] * o[e]
            k += 1
    for q in range(items.shape[0]):
        row = sums[items[q]]
        cq = c[q]
        for a in range(r):
            row[a] += cq * (u[a] - o[a])
        w = cq - 1.0
        for k in range(D.shape[0]):
            row[r + k] += w * D[k]


class OneUserChange:
    """The ``G`` of a one-user client's change message, held as what it is made of.

    A client of one user ``t`` sends, on each item ``j`` it interacted with, ``G2_j = c_tj
    (u - u_sent)`` and ``G1_j = (c_tj - 1) (u u^T - u_sent u_sent^T)``: the same two factors
    on every row. The simulation keeps ``c``, ``u`` and ``u_sent``, which the rows determine
    when ``c_tj > 1``: with ``d = u - u_sent = G2_j / c_tj``, ``G1_j / (c_tj - 1) + d d^T =
    u d^T + d u^T`` gives ``u``. The server adds the rows without forming them
    (:func:`add_messages`): at one client per user the ``r + r (r + 1) / 2`` numbers per
    interaction, written by the clients and read again by the server, were most of the
    fit's time. The message is still the paper's dense rows: :attr:`nbytes` counts them
    and ``np.asarray`` builds them.
    """

    __slots__ = ("c", "u", "o")

    def __init__(self, c, u, o):
        self.c, self.u, self.o = c, u, o

    @property
    def shape(self):
        return (self.c.shape[0], packed_size(self.u.shape[0]))

    @property
    def dtype(self):
        return self.u.dtype

    @property
    def nbytes(self):
        """The dense rows' size: what the paper's client sends."""
        return self.shape[0] * self.shape[1] * self.u.dtype.itemsize

    def toarray(self):
        rows, cols = np.triu_indices(self.u.shape[0])
        D = np.outer(self.u, self.u)[rows, cols] - np.outer(self.o, self.o)[rows, cols]
        return np.hstack([self.c[:, None] * (self.u - self.o),
                          (self.c - 1.0)[:, None] * D])

    def __array__(self, dtype=None, copy=None):
        out = self.toarray()
        return out if dtype is None else out.astype(dtype, copy=False)


def add_messages(sums, grams, uploads):
    """Add the uploads' changes to the running sums, in place, in client order."""
    for client in sorted(uploads):
        message = uploads[client]
        G = message["G"]
        if isinstance(G, OneUserChange):
            _add_one_user(sums, message["items"], G.c, G.u, G.o)
        else:
            _add_rows(sums, message["items"], G)
        grams += message["gram"]


def server_init_uploads(server_state, uploads, *, n_clients):
    """The sums of every client's first message (zero: nothing to add); broadcast ``V`` and
    ``V^T V``."""
    Vt = server_state["Vt"]
    r = Vt.shape[1]
    # (the sums in small pages, as the messages: mapped_zeros)
    sums, grams = mapped_zeros((Vt.shape[0], packed_size(r))), np.zeros((r, r))
    return {"Vt": Vt, "sums": sums, "grams": grams}, _broadcast(Vt)


@njit(cache=True, nogil=True)
def _solve_items(total, base, out):
    """``out[j] = (base + G1_j)^{-1} G2_j``, each ``G1_j`` unpacked from its row of ``total``
    (one ``r x r`` system at a time: no ``n_items x r x r`` temporary)."""
    r = base.shape[0]
    H, L = np.empty((r, r)), np.empty((r, r))
    for j in range(total.shape[0]):
        _curvature(total[j], base, H)
        spd_solve(H, total[j, :r], L, out[j])


@njit(cache=True, nogil=True)
def _curvature(row, base, H):
    """``H = base + G1_j``, ``G1_j`` unpacked from its upper triangle after ``G2_j`` in
    ``row``. (The upper rows by slices, then each lower row gathered from its column:
    contiguous stores, 1.6x faster than writing both halves entry by entry.)"""
    r = base.shape[0]
    k = r
    for a in range(r):
        m = r - a
        upper, base_a, packed = H[a, a:], base[a, a:], row[k:k + m]
        for e in range(m):
            upper[e] = base_a[e] + packed[e]
        k += m
    for e in range(1, r):
        lower = H[e]
        for a in range(e):
            lower[a] = H[a, e]


@njit(cache=True, nogil=True)
def _cg_items(total, base, n_steps, out):
    """:func:`_solve_items` by ``n_steps`` conjugate-gradient steps from ``out`` (in place):
    ``2 r^2`` flops a step against the Cholesky's ``r^3 / 3``."""
    r = base.shape[0]
    H = np.empty((r, r))
    res, p, Ap = np.empty(r), np.empty(r), np.empty(r)
    for j in range(total.shape[0]):
        _curvature(total[j], base, H)
        spd_cg(H, total[j, :r], out[j], n_steps, res, p, Ap)


def server_solve(total, grams, alpha_v, *, Vt=None, cg_steps=None):
    """``V`` minimizing the objective given the summed aggregates ``total`` (rows
    ``[G2_j, triu(G1_j)]``) and Grams ``grams``: ``v_j = H_j^{-1} G2_j`` (module docstring);
    with ``cg_steps``, that many conjugate-gradient steps on each item from its row of
    ``Vt`` (the current ``V``, not changed) instead."""
    r = grams.shape[0]
    base = np.ascontiguousarray(grams + alpha_v * np.eye(r))
    if cg_steps is not None:
        out = np.array(Vt, dtype=np.float64, order="C")
        _cg_items(total, base, int(cg_steps), out)
        return out
    out = np.empty((total.shape[0], r))
    _solve_items(total, base, out)
    return out


def server_update(server_state, uploads, round_index, *, alpha_v, cg_steps=None):
    """FedMGS's server step (:func:`sklearn_fedmf.completion._fedmgs._fedmgs_round.server_step`):
    add the uploaders' changes (:func:`fold_changes`), then the step in ``V``
    (:func:`implicit_step`)."""
    return rounds.server_step(server_state, uploads, round_index, fold=fold_changes,
                              step=partial(implicit_step, alpha_v=alpha_v, cg_steps=cg_steps))


def fold_changes(server_state, uploads, round_index):
    """``(state, sums, grams)``: the running sums with the uploaders' changes added (in
    place, in client order)."""
    add_messages(server_state["sums"], server_state["grams"], uploads)
    return server_state, server_state["sums"], server_state["grams"]


def implicit_step(server_state, total, grams, *, alpha_v, cg_steps=None):
    """The implicit loss's step in ``V`` from the sums: exact, or ``cg_steps``
    conjugate-gradient steps per item from the current ``V`` (:func:`server_solve`)."""
    Vt = server_solve(total, grams, alpha_v, Vt=server_state["Vt"], cg_steps=cg_steps)
    return {**server_state, "Vt": Vt}, _broadcast(Vt)


def client_metrics(state, block, broadcast, *, confidence, alpha_u):
    """A client's part of the objective (Gram form, without the item penalty)."""
    return {"loss": implicit_objective(block.X, state["U"], broadcast["Vt"],
                                       confidence=confidence, alpha_u=alpha_u,
                                       VtV=broadcast["VtV"]),
            "n": block.nnz}


def combine_metrics(server_state, sums, *, alpha_v):
    """The objective: the clients' parts plus ``alpha_v/2 ||V||^2``."""
    Vt = server_state["Vt"]
    return {"objective": sums["loss"] + 0.5 * alpha_v * float(np.sum(Vt * Vt))}


# ---- the client phases for a group of clients (``_groups.BatchedPhases``) --------------------
def _group_messages(state, group, clients, U_old, confidence):
    """The messages of the group's ``clients`` (local indices): their aggregates' changes
    from ``U_old`` (zeros: the first message), as views of one call's arrays (one-user
    clients: :class:`OneUserChange`)."""
    items, item_ptr = state["items"], state["item_ptr"]
    if state["single"]:  # (row i is client i's user)
        U, c = state["U"], 1.0 + confidence * np.asarray(group.X.data, dtype=np.float64)
        u, o = U[clients], U_old[clients]
        grams = np.einsum("qa,qb->qab", u, u) - np.einsum("qa,qb->qab", o, o)
        return {group.start + i: {"items": items[item_ptr[i]:item_ptr[i + 1]],
                                  "G": OneUserChange(c[item_ptr[i]:item_ptr[i + 1]], u[q],
                                                     o[q]),
                                  "gram": grams[q]}
                for q, i in enumerate(clients.tolist())}
    out_ptr, G, grams = group_item_sums(group.X, group.row_ptr, clients, state["U"], U_old,
                                        confidence=confidence, item_ptr=item_ptr,
                                        slot=state["slot"], single=state["single"])
    return {group.start + i: {"items": items[item_ptr[i]:item_ptr[i + 1]],
                              "G": G[out_ptr[q]:out_ptr[q + 1]], "gram": grams[q]}
            for q, i in enumerate(clients.tolist())}


def group_state(group, U, **rows):
    """A group's state under implicit feedback: its stacked ``U`` (and ``rows``, more
    row-stacked arrays) and its clients' items (:func:`._fedmgs_batched.group_layout`; the
    items as int64, as :func:`~._implicit.implicit_item_sums` gives them: the same bytes on
    the wire)."""
    layout = group_layout(group)
    return {"U": U, **rows, **layout, "items": layout["items"].astype(np.int64)}


def solve_active_users(state, group, broadcast, active, *, confidence, alpha_u,
                       cg_steps=None):
    """The group's ``U`` with the users of its ``active`` clients solved (one compiled call;
    the other rows as they were; ``cg_steps``: conjugate-gradient steps from them)."""
    U = state["U"].copy()
    implicit_user_factors(group.X, broadcast["Vt"], broadcast["VtV"], confidence=confidence,
                          alpha_u=alpha_u, rows=np.flatnonzero(active[state["owner"]]), out=U,
                          cg_steps=cg_steps)
    return U


def batched_init_client(group, broadcast, stream, *, init_scale, confidence):
    """:func:`init_client` of every client of the group (each from its own generator)."""
    U = group_start(group, stream, broadcast["Vt"].shape[1], init_scale)
    zero = np.zeros_like(U)
    state = group_state(group, U, U_sent=zero)
    if state["single"]:  # (zero rows held as their factors, zero and zero)
        return state, _group_messages({**state, "U": zero}, group,
                                      np.arange(group.n_clients), zero, confidence)
    items, item_ptr, r = state["items"], state["item_ptr"], U.shape[1]
    G = np.zeros((item_ptr[-1], packed_size(r)))
    return state, {group.start + i: {"items": items[item_ptr[i]:item_ptr[i + 1]],
                                     "G": G[item_ptr[i]:item_ptr[i + 1]],
                                     "gram": np.zeros((r, r))}
                   for i in range(group.n_clients)}


def batched_client_update(state, group, broadcast, stream, active, selected, *, confidence,
                          alpha_u, cg_steps=None):
    """:func:`client_update` of the group's active clients: one solve call for their users,
    one call for the senders' changes."""
    U = solve_active_users(state, group, broadcast, active, confidence=confidence,
                           alpha_u=alpha_u, cg_steps=cg_steps)
    senders = np.flatnonzero(active & selected)
    new = {**state, "U": U}
    messages = _group_messages(new, group, senders, state["U_sent"], confidence)
    sent_rows = np.flatnonzero((active & selected)[state["owner"]])
    if sent_rows.size:
        U_sent = state["U_sent"].copy()
        U_sent[sent_rows] = U[sent_rows]
        new["U_sent"] = U_sent
    return new, messages


# a client's state out of its group's, and back (the rows of ROW_KEYS)
client_state = partial(user_rows_state, keys=ROW_KEYS)
with_client_states = partial(with_user_rows, keys=ROW_KEYS)


def make_implicit_protocol(*, n_items, n_clients, n_components, alpha_u, alpha_v, confidence,
                           init_scale, cg_steps=None):
    """FedMGS's protocol under ``loss="implicit"`` (many clients run in groups); ``cg_steps``:
    the users' and the server's items' solves by that many conjugate-gradient steps, None:
    exact."""
    metrics = partial(client_metrics, confidence=confidence, alpha_u=alpha_u)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items, n_components=n_components,
                            init_scale=init_scale),
        init_client=partial(init_client, init_scale=init_scale, confidence=confidence),
        server_init_uploads=partial(server_init_uploads, n_clients=n_clients),
        client_update=partial(client_update, confidence=confidence, alpha_u=alpha_u,
                              cg_steps=cg_steps, memory=MessageMemory()),
        server_update=partial(server_update, alpha_v=alpha_v, cg_steps=cg_steps),
        client_metrics=metrics,
        combine_metrics=partial(combine_metrics, alpha_v=alpha_v),
        # (client_metrics sums over a group's stacked rows as over one client's)
        batched=BatchedPhases(
            init_client=partial(batched_init_client, init_scale=init_scale,
                                confidence=confidence),
            client_update=partial(batched_client_update, confidence=confidence,
                                  alpha_u=alpha_u, cg_steps=cg_steps),
            client_metrics=metrics,
            client_state=client_state, with_client_states=with_client_states),
    )
