"""Many small clients at once: client groups, batched client phases, lazy row messages.

At one client per user (cross-device: 6,040 clients at the ML-1M shape, 480,189 at the
Netflix shape) a client holds a handful of ratings, and calling a Python function per client
per round costs more than the client's arithmetic. A protocol may then offer
:class:`BatchedPhases`: the same client phases written for a :class:`ClientGroup`, a
contiguous range of clients whose rows are stacked in one CSR matrix, so that one compiled
call per group does the work of all its clients. The engine runs them through a
:class:`GroupedTransport`; the federation is the same (same
sampling, same seeds, same messages, same bytes), only the simulation is faster.

Contract of the batched phases (``i`` is a client's index in its group, ``group.start + i``
its client index):

``init_client(group, broadcast, stream) -> (group_state, uploads)``
``client_prepare(group_state, group, broadcast, stream, active, selected) -> (group_state, stats)``
``client_update(group_state, group, broadcast, stream, active, selected) -> (group_state, uploads)``
    ``active`` and ``selected`` are boolean arrays of length ``group.n_clients``: the clients
    that run the phase, and those among them whose message the server uses. Client ``c``
    draws from ``client_generator(stream, c)``, exactly as the per-client function does.
    ``uploads`` maps client index -> message for every active client whose per-client
    function returns a message (``init_client``: every client).
``client_metrics(group_state, group, broadcast) -> dict``
    The additive sums of ``client_metrics`` over all clients of the group.
``client_state(group_state, group, i) -> state``
    The per-client state of client ``i``, as the per-client functions hold it.
``with_client_states(group_state, group, states) -> group_state``
    A group state with the clients of ``states`` (``{i: state}``) replaced.

Every batched function gives the states and messages of the per-client function (to rounding
error), leaves inactive clients' states exactly unchanged, and never modifies its inputs
(it returns a new group state; unchanged arrays may be shared), except where a copy per
round would double the fit's memory (RFRec's per-(client, item) state, FedMC-ADMM's rated
rows in its linearized round): there the state is written in place by one compiled call that
raises nothing but ``MemoryError``, after every other allocation; and where a full
append-only pool (FedMC-ADMM's exact round) is compacted in place: the input state's layout
changes, its values do not, and only states older than it go stale. When a
batched call raises, the transport re-runs that group's clients one by one with the
per-client functions, so a failure names its client and ``on_client_error`` applies as
usual.

Completion estimators keep the stacked user factors of a group in ``group_state["U"]``, rows
in ``group.rows`` order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

from ._client_data import ClientBlock
from ._dispatch import client_call, dispatch, shared_thread_pools, workers_of
from ._exchange import SECURE_PHASES, keep_on_clients
from ._transport import PhaseResult, Transport, _run_clients, run_secure_phase

__all__ = ["BatchedPhases", "ClientGroup", "GroupStates", "GroupedTransport", "LazyRows",
           "make_groups", "user_rows_state", "with_user_rows"]


class ClientGroup(NamedTuple):
    """The training data of the clients ``start .. start + n_clients - 1``, rows stacked.

    Attributes
    ----------
    start : int
        Index of the group's first client.
    row_ptr : ndarray of shape (n_clients + 1,)
        Client ``i`` of the group owns the stacked rows ``row_ptr[i]:row_ptr[i + 1]``.
    rows : ndarray of shape (n_rows,)
        Global row index of each stacked row (each client's rows ascending).
    X : csr_matrix of shape (n_rows, n_items)
        The group's ratings, canonical.
    X_eval : csr_matrix or None
        Held-out ratings of the same rows.
    """

    start: int
    row_ptr: np.ndarray
    rows: np.ndarray
    X: sp.csr_matrix
    X_eval: sp.csr_matrix | None

    @property
    def n_clients(self):
        return len(self.row_ptr) - 1

    @property
    def stop(self):
        return self.start + self.n_clients

    @property
    def entry_ptr(self):
        """Client ``i``'s ratings are the stored entries ``entry_ptr[i]:entry_ptr[i + 1]``."""
        return self.X.indptr[self.row_ptr]

    @property
    def nnz(self):
        return int(self.X.indptr[-1])

    @property
    def n_rows(self):
        return self.X.shape[0]

    def block(self, i):
        """Client ``i``'s :class:`~sklearn_fedmf.engine._client_data.ClientBlock`, as
        :func:`~sklearn_fedmf.engine._client_data.split_clients` cuts it."""
        a, b = self.row_ptr[i], self.row_ptr[i + 1]
        Xi = self.X[a:b]
        Xi.has_canonical_format = True
        Ei = self.X_eval[a:b] if self.X_eval is not None else None
        Xt = Xi.T.tocsr()
        Xt.sort_indices()
        return ClientBlock(self.rows[a:b], Xi, Ei, Xt)


def offsets(sizes):
    """The pointer array of segments of ``sizes``: ``[0, s0, s0 + s1, ...]``."""
    ptr = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=ptr[1:])
    return ptr


def segments(starts, sizes):
    """Indices of the concatenated ranges ``starts[a]:starts[a] + sizes[a]`` and their
    pointer array (one vectorized pass, no Python loop over the ranges)."""
    ptr = offsets(sizes)
    return np.arange(ptr[-1], dtype=np.int64) + np.repeat(starts - ptr[:-1], sizes), ptr


def user_rows_state(group_state, group, i, keys=("U",)):
    """Client ``i``'s ``{key: its rows of the group's stacked array}`` for each of ``keys``
    (copies): the per-client state of a protocol whose clients keep only row-stacked arrays
    (``U``; FedMGS's implicit clients also ``U_sent``) between rounds."""
    a, b = group.row_ptr[i], group.row_ptr[i + 1]
    return {key: group_state[key][a:b].copy() for key in keys}


def with_user_rows(group_state, group, states, keys=("U",)):
    """A copy of the group state with the ``keys`` rows of the clients of ``states`` put in."""
    stacked = {key: group_state[key].copy() for key in keys}
    for i, state in states.items():
        a, b = group.row_ptr[i], group.row_ptr[i + 1]
        for key in keys:
            stacked[key][a:b] = state[key]
    return {**group_state, **stacked}


def make_groups(X, codes, n_clients, X_eval=None, n_groups=16):
    """Stack the clients' rows into at most ``n_groups`` contiguous groups of similar work
    (ratings plus rows), raising on empty clients as
    :func:`~sklearn_fedmf.engine._client_data.split_clients` does."""
    counts = np.bincount(codes, minlength=n_clients)
    if (counts == 0).any():
        empty = np.flatnonzero(counts == 0)[:5].tolist()
        raise ValueError(f"Clients {empty} own no rows; every client needs at least one row.")
    order = np.argsort(codes, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    work = np.cumsum(np.bincount(codes, weights=np.diff(X.indptr), minlength=n_clients)
                     + counts)
    n_groups = max(1, min(int(n_groups), n_clients))
    cuts = np.searchsorted(work, work[-1] * np.arange(1, n_groups) / n_groups, side="right")
    edges = np.unique(np.concatenate([[0], cuts, [n_clients]]))
    groups = []
    for a, b in zip(edges[:-1], edges[1:]):
        rows = order[bounds[a]:bounds[b]]
        Xg = _rows_of(X, rows)
        Eg = _rows_of(X_eval, rows) if X_eval is not None else None
        groups.append(ClientGroup(int(a), bounds[a:b + 1] - bounds[a], rows, Xg, Eg))
    return groups


def _rows_of(X, rows):
    """``X[rows]``, sharing ``X``'s buffers when ``rows`` is a contiguous ascending run (one
    client per user in row order: the groups then cost no second copy of the ratings)."""
    if rows.size and rows[-1] - rows[0] == rows.size - 1 and np.all(np.diff(rows) == 1):
        r0, r1 = int(rows[0]), int(rows[-1]) + 1
        s0, s1 = X.indptr[r0], X.indptr[r1]
        Xg = sp.csr_matrix((r1 - r0, X.shape[1]), dtype=X.dtype)  # (the constructor copies)
        Xg.data, Xg.indices = X.data[s0:s1], X.indices[s0:s1]
        Xg.indptr = (X.indptr[r0:r1 + 1] - s0).astype(X.indices.dtype, copy=False)
    else:
        Xg = X[rows]
    Xg.has_canonical_format = True
    return Xg


@dataclass(frozen=True)
class BatchedPhases:
    """A protocol's client phases for a whole :class:`ClientGroup` (module docstring)."""

    init_client: Callable
    client_update: Callable
    client_metrics: Callable
    client_state: Callable
    with_client_states: Callable
    client_prepare: Callable | None = None


class LazyRows:
    """A dense ``(n_rows, k)`` message held as ``scale * base`` with some rows replaced.

    A client that rated few items changes few rows of an item-side matrix: every other row of
    its message is the same closed form of the broadcast ``base`` (e.g. the ridge shrinkage
    ``(1 - ridge/d)^Q2`` of FedMAvg's local steps; 0 for a gradient). The simulation sends
    ``rows`` and ``values``; the server holds ``base``. The message is still the paper's dense
    matrix: :attr:`nbytes` counts it dense and ``np.asarray`` rebuilds it.

    Parameters
    ----------
    base : ndarray of shape (n_rows, k) or None
        The matrix the receiver holds (None when ``scale`` is 0).
    scale : float
    rows : ndarray of int, ascending
    values : ndarray of shape (len(rows), k)
    """

    __slots__ = ("base", "scale", "rows", "values", "shape")

    def __init__(self, base, scale, rows, values, shape=None):
        self.base, self.scale, self.rows, self.values = base, float(scale), rows, values
        self.shape = tuple(shape if shape is not None else base.shape)

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nbytes(self):
        """The dense message's size: what the paper's client sends."""
        return math.prod(self.shape) * self.values.dtype.itemsize  # (np.prod: 6 us a message)

    def toarray(self):
        if self.scale:
            out = self.scale * self.base
        else:
            out = np.zeros(self.shape, dtype=self.values.dtype)
        out[self.rows] = self.values
        return out

    def __array__(self, dtype=None, copy=None):
        out = self.toarray()
        return out if dtype is None else out.astype(dtype, copy=False)

    def add_to(self, out, weight=1.0):
        """``out += weight * (rows of this message that differ from scale * base)``; returns
        ``weight * scale``, the coefficient of ``base`` the caller adds once for all messages
        (an aggregate over many clients then costs their rated rows, not ``n_rows`` each)."""
        if self.scale:
            out[self.rows] += weight * (self.values - self.scale * self.base[self.rows])
        else:
            out[self.rows] += weight * self.values
        return weight * self.scale


class GroupStates(Sequence):
    """The clients' states of a :class:`GroupedTransport`, read per client.

    ``group_states`` holds one state per group (updated in place by the transport); indexing
    gives client ``c``'s per-client state through ``BatchedPhases.client_state``.
    """

    def __init__(self, groups, group_states, batched):
        self.groups, self.group_states, self.batched = groups, group_states, batched
        self._starts = np.array([g.start for g in groups])

    def __len__(self):
        return self.groups[-1].stop if self.groups else 0

    def __getitem__(self, client):
        if isinstance(client, slice):
            return [self[c] for c in range(*client.indices(len(self)))]
        client = int(client)
        if not 0 <= client < len(self):
            raise IndexError(client)
        g = int(np.searchsorted(self._starts, client, side="right")) - 1
        group = self.groups[g]
        return self.batched.client_state(self.group_states[g], group, client - group.start)


def _metrics_each(items, fn, broadcast):
    """One task: ``client_metrics`` of single clients ``(client, state, block)`` with the
    per-client function. Returns ``(client, message, error)`` each."""
    return [(client, *client_call(fn, state, block, broadcast)) for client, state, block in items]


def _run_group(items, phase, batched, fn, broadcast, stream):
    """One task: the batched ``phase`` on each group of ``items``; a group whose batched call
    raises is re-run client by client (module docstring). Returns ``(g, new_state, messages,
    failures)`` per group."""
    out = []
    for g, group, state, active, selected in items:
        result, exc = client_call(_group_phase, phase, batched, group, state, broadcast,
                                  stream, active, selected)
        if exc is not None:  # the per-client re-run names the failing client for the engine;
            # with no failing client, exc is raised again
            out.append((g, *_one_by_one(exc, group, state, active, selected, phase, batched,
                                        fn, broadcast, stream)))
            continue
        out.append((g, *result, {}))
    return out


def _group_phase(phase, batched, group, state, broadcast, stream, active, selected):
    """One group's ``phase`` through its batched functions: ``(new_state, messages)``."""
    if phase == "init_client":
        return batched.init_client(group, broadcast, stream)
    if phase == "client_metrics":
        return state, {group.start: batched.client_metrics(state, group, broadcast)}
    return getattr(batched, phase)(state, group, broadcast, stream, active, selected)


def _one_by_one(exc, group, state, active, selected, phase, batched, fn, broadcast, stream):
    """Re-run a group's active clients with the per-client functions after its batched call
    raised ``exc``: the failures then name their clients. ``exc`` is raised again when every
    client succeeds alone (a fault of the batched code, not of a client)."""
    local = np.flatnonzero(active)
    items = [(group.start + i,
              None if phase == "init_client" else batched.client_state(state, group, i),
              group.block(i), bool(selected[i])) for i in local]
    results = _run_clients(items, fn, phase, broadcast, stream)
    failures = {c: e for c, _, _, e in results if e is not None}
    if not failures:
        raise exc
    if phase == "init_client":  # the engine raises for any failed initialization
        return state, {}, failures
    done = {c - group.start: s for c, s, _, e in results if e is None}
    messages = {c: m for c, _, m, e in results if e is None}
    if phase == "client_metrics":
        return state, {}, failures
    return batched.with_client_states(state, group, done), messages, failures


class GroupedTransport(Transport):
    """The clients in this process, run a group at a time through the protocol's
    :class:`BatchedPhases` (threads or any joblib backend but Dask, where the engine keeps
    one block per client: :class:`~sklearn_fedmf.engine._transport.LocalTransport`).

    Parameters
    ----------
    groups : list of ClientGroup
        Contiguous, in client order, covering every client (:func:`make_groups`).
    n_jobs : int or None
        Workers for the client phases.
    client_states : GroupStates or None
        The states to continue from (warm start); None before ``init_client``.
    workers : int or None
        What ``n_jobs`` means, resolved by a fit; None: at each session.
    """

    def __init__(self, groups, *, n_jobs=None, client_states=None, secure_slots=None,
                 workers=None):
        self.groups, self.n_jobs, self.workers = groups, n_jobs, workers
        self.secure_slots = {} if secure_slots is None else secure_slots
        self.runs_secure_phases = True
        self._group_states = (client_states.group_states if client_states is not None
                              else [None] * len(groups))
        self._starts = np.array([g.start for g in groups])
        self._work = np.array([g.nnz + g.n_rows for g in groups], dtype=float)
        self._protocol, self._workers = None, 1
        self._blocks = {}  # the per-client blocks run_each has cut

    @property
    def n_clients(self):
        return self.groups[-1].stop

    @property
    def client_states(self):
        if self._protocol is None and all(s is None for s in self._group_states):
            return None
        return GroupStates(self.groups, self._group_states, self._batched)

    @contextmanager
    def session(self, protocol):
        if protocol.batched is None:
            raise ValueError("GroupedTransport needs a protocol with batched client phases.")
        outer = self._protocol, self._workers
        self._protocol = protocol
        self._workers = self.workers if self.workers is not None else workers_of(self.n_jobs)
        self._batched = protocol.batched
        try:
            with shared_thread_pools():
                yield self
        finally:
            self._protocol, self._workers = outer

    def run(self, phase, clients, broadcast, *, stream=None, selected=None, round_number=None):
        if phase in SECURE_PHASES:  # one client at a time: each has its own keys and message
            return run_secure_phase(self.secure_slots, self._protocol, phase, list(clients),
                                    broadcast, stream)
        clients = np.asarray(clients, dtype=np.int64)
        messages, failures = {}, {}
        if not clients.size:
            return PhaseResult(messages, failures)
        n = self.n_clients
        active = np.zeros(n, dtype=bool)
        active[clients] = True
        if selected is None:
            chosen = active
        else:
            chosen = np.zeros(n, dtype=bool)
            chosen[np.fromiter(selected, dtype=np.int64, count=len(selected))] = True
        touched = np.unique(np.searchsorted(self._starts, clients, side="right") - 1)
        items = []
        for g in touched.tolist():
            group = self.groups[g]
            a, b = group.start, group.stop
            items.append((g, group, self._group_states[g], active[a:b], chosen[a:b] & active[a:b]))
        where = "initialization" if round_number is None else f"round {round_number}"
        parts = dispatch(_run_group, items, self._work[touched], self._workers, phase,
                         self._batched, getattr(self._protocol, phase), broadcast, stream,
                         context=f"{phase} ({where})")
        if phase != "client_metrics":
            messages = dict.fromkeys(clients.tolist())  # the contract: None for silent clients
        for g, new_state, group_messages, group_failures in (o for p in parts for o in p):
            if phase != "client_metrics":
                self._group_states[g] = new_state
            messages.update(group_messages)
            for client in group_failures:
                messages.pop(client, None)
            failures.update(group_failures)
        keep_on_clients(self._protocol, phase, self.secure_slots, messages, broadcast)
        return PhaseResult(messages, failures)

    def run_each(self, clients, broadcast, *, round_number=None):
        """``client_metrics`` of each of ``clients`` (ascending) with the per-client function
        on its state read from its group's (``run`` returns each group's sums): early
        stopping's validation panel, whose clients each send their own report."""
        fn, batched = self._protocol.client_metrics, self._batched
        items = []
        for client in clients:
            g = int(np.searchsorted(self._starts, client, side="right")) - 1
            group, i = self.groups[g], client - self.groups[g].start
            block = self._blocks.get(client)
            if block is None:  # (cut once: a panel asks the same clients at every evaluation)
                block = self._blocks[client] = group.block(i)
            items.append((client, batched.client_state(self._group_states[g], group, i),
                          block))
        messages, failures = {}, {}
        if not items:
            return PhaseResult(messages, failures)
        where = "initialization" if round_number is None else f"round {round_number}"
        weights = np.array([b.nnz + 1 for _, _, b in items], dtype=float)
        parts = dispatch(_metrics_each, items, weights, self._workers, fn, broadcast,
                         context=f"client_metrics ({where})")
        for client, message, error in (o for part in parts for o in part):
            if error is not None:
                failures[client] = error
            else:
                messages[client] = message
        keep_on_clients(self._protocol, "client_metrics", self.secure_slots, messages,
                        broadcast)
        return PhaseResult(messages, failures)
