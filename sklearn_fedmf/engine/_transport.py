"""Transports: how the engine reaches the clients.

The engine (:mod:`sklearn_fedmf.engine._federation`) owns the server side of a federation: sampling,
seeds, dropout, byte counts, ``history_``, callbacks, ``tol``, the failure policy and the
progress display. Everything that runs *on a client* goes through a transport, and the
engine never touches a client's data block or private state itself. :class:`LocalTransport`
(threads, joblib backends, Dask) holds the blocks and the client states in this process; a
remote transport (for example Flower) leaves both in the client processes, and the server
only ever sees the protocol's messages.

Interface (:class:`Transport`)
------------------------------
n_clients : int
    Number of clients, indexed ``0 .. n_clients - 1``. Fixed for the transport's life.

session(protocol) -> context manager
    The engine enters it around each of its calls
    (:func:`~sklearn_fedmf.engine._federation.initialize_federation`,
    :func:`~sklearn_fedmf.engine._federation.run_federation`,
    :func:`~sklearn_fedmf.engine._federation.evaluate`); ``run`` is only called inside. It must be
    re-entrant (a caller may hold one session open over several engine calls so that
    resources, e.g. data placed on workers, live as long as the fit). ``protocol`` is the
    :class:`~sklearn_fedmf.engine._federation.FederatedProtocol` of the fit: a local transport calls
    its client functions; a remote transport whose clients rebuild the protocol from the
    estimator's parameters may only check that it is the one they run (its client functions
    are the same in every call of a fit; server-side fields such as ``after_round`` may
    differ).

``run(phase, clients, broadcast, *, stream=None, selected=None, round_number=None) -> PhaseResult``
    Run one client phase on each client of ``clients`` and return what they sent.

    phase : {"init_client", "client_prepare", "client_update", "client_metrics"}
        The protocol function each client runs, with these arguments (``state`` is the
        client's private state, ``block`` its data, ``rng`` its generator)::

            init_client(block, broadcast, rng)                    -> (state, upload or None)
            client_prepare(state, block, broadcast, rng, selected) -> (state, stats or None)
            client_update(state, block, broadcast, rng, selected)  -> (state, upload or None)
            client_metrics(state, block, broadcast)                -> dict of additive sums

        ``client_metrics`` leaves the state unchanged; the others replace it.
    clients : list of int
        Ascending, without duplicates. ``init_client`` is run once on every client before any
        other phase.
    broadcast : object
        The server's message, the same for every client of the call (a
        :class:`~sklearn_fedmf.engine._federation.Broadcast` carries an uncounted simulation part
        too; deliver it whole).
    stream : tuple of int or None
        ``(entropy, kind, ...)``: client ``c`` draws from
        ``client_generator(stream, c)``, i.e. ``numpy.random.default_rng(
        SeedSequence(stream[0], spawn_key=(*stream[1:], c)))``. A remote client must build
        the same generator from the same tuple to draw what the simulation draws. None for
        ``client_metrics`` (no randomness).
    selected : collection of int or None
        The clients whose upload the server will use; each client's function receives
        ``selected = (c in selected)``. None means all of ``clients``.
    round_number : int or None
        The round (from 1) the call belongs to; None during initialization. For messages and
        logs only (what a client draws is fixed by ``stream``).

    Returns ``PhaseResult(messages, failures)``:

    messages : dict {client: message}
        For every client that completed, in ascending client order, including ``None``
        messages (a client that computed and sent nothing). A completed client's new state
        is kept by the transport (in its own memory, or the client's).
    failures : dict {client: exception}
        Every client of ``clients`` that did not complete, with the exception that stopped it:
        the one raised by the client code (a :class:`~sklearn_fedmf.exceptions.ClientDropout`
        for a simulated failure), or one the transport made (e.g. ``TimeoutError`` for a
        client that did not answer in time). A failed client keeps the state it had before
        the call. The engine decides what a failure means (``on_client_error``); a transport
        never raises for one client's failure.

    Ordering and determinism: the engine calls ``run`` sequentially (never two phases at
    once); within a call, clients may run in any order and in parallel, but each client's
    result depends only on its state, its block, ``broadcast`` and its generator, so it does
    not depend on the order. A transport raises
    (:class:`~sklearn_fedmf.exceptions.FederationError`) only when it cannot run the phase
    at all (e.g. a lost Dask worker that could not be recovered); it then leaves every client
    state as it was before the call. It never waits without bound.

Sequence of calls in a fit: ``run("init_client", all clients, stream=(entropy, 0))`` once
(:func:`~sklearn_fedmf.engine._federation.initialize_federation`); then in round ``k`` (from 0;
``round_number = k + 1``) of :func:`~sklearn_fedmf.engine._federation.run_federation`:
``run("client_prepare", ..., stream=(entropy, 5, k))`` if the protocol has that phase, then
``run("client_update", ..., stream=(entropy, 1, k))`` on the round's clients (those of the
prepare call minus its failures), then ``run("client_metrics", all clients)`` when the
round is evaluated (``eval_every``). The broadcast of a ``client_update`` call is the
message of ``server_prepare`` when the protocol has a prepare phase. What the engine does
with failures: ``init_client`` and ``client_metrics`` failures always raise
(:class:`~sklearn_fedmf.exceptions.ClientError`; a missing client would leave no state, or
a wrong objective); ``client_prepare`` / ``client_update`` failures follow
``on_client_error`` (``ClientDropout`` is counted, never raised).

client_states : list or None
    The clients' states, readable by the code that collects a fitted model in the same
    process (``LocalTransport`` only; None for a remote transport, whose client states never
    reach the server).

Secure aggregation (:mod:`sklearn_fedmf.engine._exchange`, :mod:`sklearn_fedmf.secure._rounds`)
-----------------------------------------------------------------------------------------------
What a client phase's messages become is the exchange's client side:
:func:`~sklearn_fedmf.engine._exchange.keep_on_clients`. When the session's protocol has ``secure``
set (``secure_aggregation=True``), it keeps every upload of ``client_update`` (and of
``init_client`` when the protocol's ``summable.init_client`` is set) on its client, in the
client's *secure slot*, and returns :data:`~sklearn_fedmf.secure._rounds.READY` in its
place. The fit's secure exchange then calls ``run`` with
the phases of :data:`SECURE_PHASES`; their ``broadcast`` is a
:class:`~sklearn_fedmf.secure._rounds.PerClient`, of which each client receives only its own
entry, and each client runs
``client_secure_phase(phase, client, slot, message, rng, protocol.summable)`` on its slot
(``rng``: ``client_generator(stream, client)``, or None without a stream). A failure leaves
the slot as it was. A transport that can time each client's step (CPU seconds, in the
client's task) returns them in ``PhaseResult.seconds`` (deployment costs in ``history_``).
``secure_slots`` is the dict of slots a local transport holds (None for a remote transport:
the slots stay in the client processes, like the states); the exchange keeps it across its
calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from ._dispatch import client_call, dispatch, resident_blocks, shared_thread_pools, workers_of
from ._exchange import SECURE_PHASES, client_exchange_phase, keep_on_clients

__all__ = ["Transport", "LocalTransport", "PhaseResult", "client_generator",
           "PHASES", "SECURE_PHASES"]

PHASES = ("init_client", "client_prepare", "client_update", "client_metrics")


class PhaseResult(NamedTuple):
    """What the clients of one ``Transport.run`` call sent, and who failed; for a secure
    phase, optionally each completed client's CPU seconds of its step (``{client: s}``,
    timed in its own task: :mod:`sklearn_fedmf.secure._costs`), None when not measured."""

    messages: dict
    failures: dict
    seconds: dict | None = None


def _rng(entropy, *key):
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=key))


class _LazyGenerator:
    """The ``numpy.random.Generator`` of ``_rng(entropy, *key)``, made on first use.

    Making one costs ~20 us: more than the whole local step of many clients, and most
    methods draw nothing after their initialization.
    """

    __slots__ = ("_entropy", "_key", "_generator")

    def __init__(self, entropy, *key):
        self._entropy, self._key, self._generator = entropy, key, None

    def __getattr__(self, name):  # only for what the slots do not hold: the Generator's API
        if name in _LazyGenerator.__slots__:  # an unset slot (e.g. while unpickling)
            raise AttributeError(name)
        if self._generator is None:
            self._generator = _rng(self._entropy, *self._key)
        return getattr(self._generator, name)


def client_generator(stream, client):
    """Client ``client``'s generator for the ``stream`` ``(entropy, kind, ...)`` of a phase:
    ``default_rng(SeedSequence(stream[0], spawn_key=(*stream[1:], client)))``, made lazily."""
    return _LazyGenerator(stream[0], *stream[1:], client)


class Transport(ABC):
    """Where the client phases run (see the module docstring for the contract)."""

    client_states = None
    secure_slots = None
    # whether it keeps the uploads and runs SECURE_PHASES (module docstring); a transport
    # that does not is refused by a fit with secure_aggregation=True
    runs_secure_phases = False

    @property
    @abstractmethod
    def n_clients(self) -> int:
        """Number of clients."""

    @abstractmethod
    def session(self, protocol):
        """A re-entrant context manager around engine calls (module docstring)."""

    @abstractmethod
    def run(self, phase, clients, broadcast, *, stream=None, selected=None,
            round_number=None) -> PhaseResult:
        """Run ``phase`` on ``clients`` (module docstring)."""

    def run_each(self, clients, broadcast, *, round_number=None) -> PhaseResult:
        """``client_metrics`` of each of ``clients``, every client its own message (early
        stopping's validation panel: each client's report reaches the exchange). A
        transport whose ``run`` returns a group's sums overrides it."""
        return self.run("client_metrics", clients, broadcast, round_number=round_number)


def run_secure_phase(slots, protocol, phase, clients, broadcast, stream):
    """A secure phase on ``clients`` whose ``slots`` this process holds (module docstring)."""
    generator = None if stream is None else partial(client_generator, stream)
    return PhaseResult(*client_exchange_phase(slots, protocol, phase, clients, broadcast,
                                              generator))


def _run_clients(items, fn, phase, broadcast, stream):
    """One task: several clients in a row. Returns ``(client, state, message, error)`` each.

    A client's exception is reported, not raised: the engine applies ``on_client_error``
    (raise with the client and round, or skip), and the other clients of the batch still
    finish, so which error is reported does not depend on how clients were batched.
    """
    out = []
    for client, state, block, selected in items:
        result, exc = client_call(_client_phase, phase, fn, client, state, block, broadcast,
                                  stream, selected)
        if exc is not None:
            out.append((client, state, None, exc))
            continue
        out.append((client, *result, None))
    return out


def _client_phase(phase, fn, client, state, block, broadcast, stream, selected):
    """One client's ``phase``: ``(new_state, message)``."""
    if phase == "client_metrics":
        return state, fn(state, block, broadcast)
    if phase == "init_client":
        return fn(block, broadcast, client_generator(stream, client))
    return fn(state, block, broadcast, client_generator(stream, client), selected)


class LocalTransport(Transport):
    """The clients in this process: threads, any joblib backend, or Dask workers.

    Holds the client data ``blocks`` (one per client, in client order) and the client states.
    Phases run on batches of clients (:func:`~sklearn_fedmf.engine._dispatch.dispatch`): in the
    calling thread for small work, on a thread pool by default, through joblib under another
    backend; under Dask each block lives on one worker for the whole session
    (:func:`~sklearn_fedmf.engine._dispatch.resident_blocks`).

    Parameters
    ----------
    blocks : list
        Each client's data block (with ``nnz`` and ``n_rows`` for load balancing).
    n_jobs : int or None
        Workers for the client phases.
    client_states : list or None
        The states to continue from (warm start); None before ``init_client``. The list is
        updated in place.
    workers : int or None
        What ``n_jobs`` means, resolved by a fit
        (:attr:`~sklearn_fedmf.engine._fit.FitContext.workers`); None: resolved at each session
        (:func:`~sklearn_fedmf.engine._dispatch.workers_of`).
    """

    def __init__(self, blocks, *, n_jobs=None, client_states=None, secure_slots=None,
                 workers=None):
        self.blocks = blocks
        self.n_jobs, self.workers = n_jobs, workers
        self.secure_slots = {} if secure_slots is None else secure_slots
        self.runs_secure_phases = True
        self.client_states = [None] * len(blocks) if client_states is None else client_states
        self._protocol, self._workers = None, 1
        nnz = np.array([getattr(b, "nnz", 0) for b in blocks], dtype=float)
        rows = np.array([getattr(b, "n_rows", 0) for b in blocks], dtype=float)
        self._weights = {"update": nnz + rows, "other": nnz + 1}

    @property
    def n_clients(self):
        return len(self.blocks)

    @contextmanager
    def session(self, protocol):
        outer = self._protocol, self._workers
        # a fit's workers, else those of the backend active for this session
        self._protocol = protocol
        self._workers = self.workers if self.workers is not None else workers_of(self.n_jobs)
        try:
            with resident_blocks(self.blocks), shared_thread_pools():
                yield self
        finally:
            self._protocol, self._workers = outer

    def run(self, phase, clients, broadcast, *, stream=None, selected=None, round_number=None):
        if phase in SECURE_PHASES:  # (the exchange's phases: _exchange.py)
            return run_secure_phase(self.secure_slots, self._protocol, phase, clients,
                                    broadcast, stream)
        fn = getattr(self._protocol, phase)
        states = self.client_states
        items = [(c, states[c], self.blocks[c], selected is None or c in selected)
                 for c in clients]
        messages, failures = {}, {}
        if not items:
            return PhaseResult(messages, failures)
        weights = self._weights["update" if phase in ("client_prepare", "client_update")
                                else "other"][list(clients)]
        where = "initialization" if round_number is None else f"round {round_number}"
        parts = dispatch(_run_clients, items, weights, self._workers, fn, phase,
                         broadcast, stream, context=f"{phase} ({where})")
        keep = phase != "client_metrics"
        # batches are contiguous runs of the ascending clients: results come in client order
        for client, new_state, message, error in (o for part in parts for o in part):
            if error is not None:
                failures[client] = error
                continue
            if keep:
                states[client] = new_state
            messages[client] = message
        keep_on_clients(self._protocol, phase, self.secure_slots, messages, broadcast)
        return PhaseResult(messages, failures)


def as_transport(clients: Any, *, n_jobs=None, client_states=None,
                 secure_slots=None) -> Transport:
    """``clients`` if it is a :class:`Transport`, else a :class:`LocalTransport` of the list
    of blocks ``clients`` (``secure_slots``: the slots a previous call left, if any)."""
    if isinstance(clients, Transport):
        if secure_slots is not None and clients.secure_slots is not None:
            clients.secure_slots = secure_slots
        return clients
    return LocalTransport(clients, n_jobs=n_jobs, client_states=client_states,
                          secure_slots=secure_slots)
