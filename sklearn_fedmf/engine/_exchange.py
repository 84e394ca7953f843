"""The exchange: how the uploads of a round become what the server receives.

The engine (:mod:`sklearn_fedmf.engine._federation`) never branches on secure aggregation: it asks
the fit's exchange, chosen once by :func:`exchange_for` from the protocol's ``secure`` options,
for every exchange of uploads and for what goes in the round's record.

:class:`PlainExchange`
    The server receives each client's upload (and sums it itself where it needs only sums).
:class:`SecureExchange`
    SecAgg+ (:mod:`sklearn_fedmf.secure._rounds`): the uploads that the protocol declares
    summable (:class:`~sklearn_fedmf.engine._federation.SummableUploads`) stay on the clients, and
    the server receives their sum from the four secure phases run through the transport.

Interface (what the engine calls, in this order)::

    start(protocol, transport, server_state, broadcast, uploads, *, entropy, failures)
        -> (server_state, broadcast, (bytes_up, bytes_down))  # initialize_federation
    begin(protocol, transport, *, entropy, failures, label, keep_masked, report_keys)
        -> protocol            # run_federation: checks; the protocol the clients run
    begin_round()
    prepare(protocol, transport, state, stats, dropped, k) -> (message, stats seen)
    update(protocol, transport, state, uploads, dropped, drawn, k) -> uploads seen
    round_bytes() -> (bytes_up, bytes_down); round_entries() -> dict (the record's keys)
    reports(protocol, transport, messages, keys, round_number, part=None)
        -> (sums, reports seen, (bytes_up, bytes_down))    # early stopping's validation
    close_round(record)                                  # e.g. the "secure" cost record

``prepare`` and ``update`` run the server's step too (``server_prepare``, ``server_update``,
or their ``summable`` forms on sums), so the round loop does not know which form ran. The
exchange keeps its per-fit state (secure slots, running sums, the start's costs) and lives
in :class:`~sklearn_fedmf.engine._federation.FederationState` across ``warm_start`` fits, which
cannot switch it.

Every secure sum of a fit goes through :meth:`SecureExchange._sum`, whose options are the
fit's :class:`~sklearn_fedmf.secure.SecureAggregation`: a variant of the sum (noise on the
sum, another encoding) is an option of that class read by the secure phases, or a subclass
that overrides ``_sum``; the round loop does not change. Outside the rounds (the biases
floor, FedBlend's statistics, clustering's starts) a secure sum is :func:`sum_securely`.

The client side of the exchange (what a transport calls): :func:`keep_on_clients` keeps the
uploads and reports a secure sum needs on the clients, :func:`client_exchange_phase` runs a
secure phase on the clients whose slots this process holds.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np

from .._message_size import nbytes
from ..exceptions import ClientDropout, ClientFailureWarning, FederationError
from ..secure._aggregate import secure_sum
from ..secure._costs import exchange_costs, round_costs, work_clock
from ..secure._crypto import load_primitives
from ..secure._encoding import FixedPointEncoding
from ..secure._protocol import PHASES
from ..secure._rounds import (
    READY,
    SECURE_PHASES,
    ExchangeResult,
    PerClient,
    SecureAggregation,
    SecureRoundFailed,
    client_ring_vector,
    client_secure_phase,
    commit_pending,
    decode_sum,
    report_encoding,
    run_secure_exchange,
)
from ._dispatch import client_call

__all__ = ["PlainExchange", "SecureExchange", "exchange_for", "secure_options",
           "sum_securely", "keep_on_clients", "client_exchange_phase", "holds_upload",
           "total_bytes", "READY", "SECURE_PHASES", "PerClient", "client_secure_phase",
           # (for the noise on the sum, privacy._distributed_dp: the ring and its options,
           # and the exchange's own functions for its measurement path)
           "FixedPointEncoding", "SecureAggregation", "SecureRoundFailed", "PHASES",
           "ExchangeResult", "client_ring_vector", "commit_pending", "decode_sum",
           "exchange_costs"]

_SECURE_CLIENT, _SECURE_SERVER = 6, 7  # seed kinds: round k's exchange uses k + 1 (0: init)


def secure_options(option):
    """The :class:`~sklearn_fedmf.secure.SecureAggregation` of ``secure_aggregation=option``
    (``True``: the defaults), or None for ``False``."""
    if option is False or option is None:
        return None
    return SecureAggregation() if option is True else option


def exchange_for(protocol, previous=None):
    """The exchange of a fit of ``protocol``: secure when ``protocol.secure`` holds options.
    ``previous``: the exchange of the fit a ``warm_start`` continues (its running sums and
    slots are kept; it cannot switch between plain and secure)."""
    secure = getattr(protocol, "secure", None)
    if previous is not None:
        if previous.secure != (secure is not None):
            raise ValueError("warm_start cannot switch secure_aggregation on or off: the "
                             "server's state is kept in another form; fit again without "
                             "warm_start.")
        if secure is not None:
            previous.options = secure
        return previous
    if secure is None:
        return PlainExchange()
    # (privacy._distributed_dp's measurement-only options name their own exchange)
    return getattr(secure, "_exchange_class", SecureExchange)(secure)


def total_bytes(per_phase):
    """All the bytes of ``{phase: {client: bytes}}``."""
    return sum(sum(v.values()) for v in per_phase.values())


def _plain_start(protocol, transport, server_state, broadcast, uploads):
    """The initial uploads in the clear: ``server_init_uploads`` on them, if declared."""
    init_bytes = (sum(map(nbytes, uploads.values())),
                  nbytes(broadcast) * transport.n_clients)
    if protocol.server_init_uploads is not None:
        server_state, broadcast = protocol.server_init_uploads(server_state, uploads)
    return server_state, broadcast, init_bytes


class PlainExchange:
    """The server receives the uploads as the clients sent them (module docstring)."""

    secure = False
    slots = None  # (a transport's secure slots: none)

    def begin(self, protocol, transport, **_):
        return protocol

    def start(self, protocol, transport, server_state, broadcast, uploads, *, entropy,
              failures):
        return _plain_start(protocol, transport, server_state, broadcast, uploads)

    def begin_round(self):
        self._up = 0

    def prepare(self, protocol, transport, state, stats, dropped, k):
        self._up += sum(nbytes(s) for s in stats.values())
        state.server_state, message = protocol.server_prepare(state.server_state, stats, k)
        return message, stats

    def update(self, protocol, transport, state, uploads, dropped, drawn, k):
        self._up += sum(map(nbytes, uploads.values()))  # (one per client)
        if uploads or protocol.participation.server_update == "every_round":
            extra = {"counts": {c: drawn[c] for c in uploads}} if protocol.server_counts else {}
            state.server_state, state.broadcast = protocol.server_update(
                state.server_state, uploads, k, **extra)
        return uploads

    def round_bytes(self):
        return self._up, 0

    def round_entries(self):
        return {}

    def reports(self, protocol, transport, messages, keys, round_number, part=None):
        """Each client's validation report ``(sse, count)`` (two numbers it sends)."""
        sse, count = keys
        seen = {c: (float(m[sse]), float(m[count])) for c, m in messages.items()}
        return {}, seen, (sum(nbytes(r) for r in seen.values()), 0)

    def close_round(self, record):
        pass


class SecureExchange:
    """SecAgg+ over the transport (module docstring): ``options`` is the fit's
    :class:`~sklearn_fedmf.secure.SecureAggregation`."""

    secure = True

    def __init__(self, options):
        load_primitives()  # (the secure extra: its clear error before any client's work)
        self.options = options
        self.slots = None  # the local transport's secure slots (kept across calls)
        self.running = None  # the server's running ring sum of a cumulative exchange
        self.prepare_running = None  # the same for the prepare phase's statistics
        self.start_costs = None  # the start's exchange costs, for the next round's record
        self._call = None  # (entropy, failures, label, keep_masked) of the running call
        self.begin_round()

    # ---- a fit's call ------------------------------------------------------------------
    def check(self, protocol, transport):
        """The protocol and the transport must allow secure sums."""
        if not transport.runs_secure_phases:
            raise ValueError(f"secure_aggregation=True: the transport "
                             f"{type(transport).__name__} does not run the "
                             "secure-aggregation phases.")
        if protocol.summable is None:
            raise ValueError("secure_aggregation=True: this algorithm's server needs more "
                             "than the sum of a round's uploads.")
        if protocol.client_prepare is not None and protocol.summable.server_prepare is None:
            raise ValueError("secure_aggregation=True: the statistics of this prepare phase "
                             "are not summable; choose a setting without one.")

    def begin(self, protocol, transport, *, entropy, failures, label, keep_masked=True,
              report_keys=None):
        """Checks, binds the call's seeds and failure policy; the protocol whose clients
        keep their validation reports (``report_keys``) for a secure sum."""
        self.check(protocol, transport)
        self.slots = transport.secure_slots if self.slots is None else self.slots
        self._call = (entropy, failures, label, keep_masked)
        summable = protocol.summable
        if report_keys is not None:
            summable = replace(summable, report_keys=tuple(report_keys))
            protocol = replace(protocol, summable=summable)
        if summable.cumulative or summable.prepare_cumulative:
            n = transport.n_clients
            self.options.encoding_for(n).check_clients(n)  # (the running sums)
            if self.running is None and summable.cumulative:
                self.running = {}
        return protocol

    def _sum(self, transport, clients, dropped, key, round_number, exchange, **kwargs):
        """One secure sum over the transport (:func:`run_secure_exchange`): the clients' keys
        from their ``SeedSequence(entropy, (6, *key, client))``, the server's graph from
        ``(7, *key)`` (``key``: ``(0,)`` at the start, ``(k + 1,)`` for round ``k``'s
        uploads, ``(k + 1, 1)`` for its prepare phase, ``(k + 1, 2)`` for its reports and
        ``(k + 1, 2, j)`` for block ``j`` of a validation panel's); the failure policy
        applied to every phase."""
        entropy, failures = self._call[:2]

        def check(result, phase):
            failures.check(result, phase, round_number)  # (raises unless skipping)
            self._failed.update(c for c, exc in result.failures.items()
                                if not isinstance(exc, ClientDropout))

        return run_secure_exchange(
            transport, clients, dropped, options=self.options,
            stream=(entropy, _SECURE_CLIENT, *key),
            server_rng=np.random.default_rng(np.random.SeedSequence(
                entropy, spawn_key=(_SECURE_SERVER, *key))),
            exchange=exchange, check=check, round_number=round_number, **kwargs)

    # ---- the start -----------------------------------------------------------------------
    def start(self, protocol, transport, server_state, broadcast, uploads, *, entropy,
              failures):
        """The initial uploads' secure sum when the protocol declares them summable (else
        they stay plain: :class:`SummableUploads`)."""
        self.check(protocol, transport)
        self.slots = transport.secure_slots
        summable = protocol.summable
        if summable.init_client is None:
            return _plain_start(protocol, transport, server_state, broadcast, uploads)
        init_up = sum(nbytes(u) for u in uploads.values())
        init_down = nbytes(broadcast) * transport.n_clients
        self.running = {} if summable.cumulative else None
        self._call = (entropy, failures, "initialization", False)
        with transport.session(protocol):
            outcome = self._sum(transport, sorted(uploads), (), (0,), None, "init",
                                running=self.running)
        server_state, broadcast = summable.server_init(server_state, outcome.sums,
                                                       len(outcome.survivors))
        self.start_costs = outcome.costs
        return server_state, broadcast, (init_up + total_bytes(outcome.bytes_up),
                                         init_down + total_bytes(outcome.bytes_down))

    # ---- a round -------------------------------------------------------------------------
    def begin_round(self):
        self._exchanges, self._entries, self._failed = [], {}, set()

    def prepare(self, protocol, transport, state, stats, dropped, k):
        """The secure sum of round ``k``'s held prepare ``stats`` and ``server_prepare`` on
        it: ``(message, masked stats)``. Below the threshold it raises (``on_client_error``
        cannot skip it: the round's update needs the message)."""
        summable = protocol.summable
        running = None
        if summable.prepare_cumulative:
            if self.prepare_running is None:
                self.prepare_running = {}
            running = self.prepare_running
        try:
            outcome = self._sum(transport, list(stats), sorted(dropped), (k + 1, 1), k + 1,
                                "prepare", running=running)
        except SecureRoundFailed as exc:
            raise FederationError(f"[{self._call[2]}] round {k + 1}, prepare phase: "
                                  f"{exc}") from exc
        self._exchanges.append(outcome)
        state.server_state, message = summable.server_prepare(state.server_state, outcome.sums,
                                                              outcome.survivors, k)
        return message, outcome.masked

    def update(self, protocol, transport, state, uploads, dropped, drawn, k):
        """The secure sum of round ``k``'s held ``uploads`` and ``summable.server_update`` on
        it; the masked inputs (all the server saw; None each unless ``keep_masked``). A
        round below the threshold is skipped with ``on_client_error="skip"``
        (``secure_failed`` in its record), else it raises."""
        summable = protocol.summable
        outcome = None
        if uploads:
            clients = list(uploads)
            weights = None
            if summable.weights is not None:
                weights = summable.weights(state.server_state, clients,
                                           {c: drawn.get(c, 1) for c in clients})
            _, failures, label, keep_masked = self._call
            try:
                outcome = self._sum(
                    transport, clients, sorted(dropped), (k + 1,), k + 1, "update",
                    weights=weights, running=self.running if summable.cumulative else None,
                    keep_masked=keep_masked,
                    # (noise on the sum: the clients noise their update from the reference)
                    reference=None if summable.reference is None or self.options.noise is None
                    else (summable.reference, state.server_state))
            except SecureRoundFailed as exc:
                if not failures.skip:
                    raise FederationError(f"[{label}] round {k + 1}: {exc}") from exc
                warnings.warn(f"[{label}] round {k + 1}: {exc} on_client_error='skip': the "
                              "round is skipped (history_'s secure_failed).",
                              ClientFailureWarning, stacklevel=5)
                self._entries["secure_failed"] = True
        if outcome is not None:
            self._exchanges.append(outcome)
            state.server_state, state.broadcast = summable.server_update(
                state.server_state, outcome.sums, len(outcome.survivors), k)
            return outcome.masked
        if protocol.participation.server_update == "every_round":  # (runs without a sum)
            state.server_state, state.broadcast = summable.server_update(
                state.server_state, None, 0, k)
        return {}

    def round_bytes(self):
        """Every phase of the round's secure exchanges (masked inputs included)."""
        return (sum(total_bytes(e.bytes_up) for e in self._exchanges),
                sum(total_bytes(e.bytes_down) for e in self._exchanges))

    def round_entries(self):
        """``secure_failed`` (a skipped round), ``bytes_secure`` (``{phase: bytes up and
        down over the clients}``) and ``bytes_secure_client`` (``{phase: the most one
        client sent and received}``) of the round's prepare and update exchanges."""
        per_client = {p: {} for p in PHASES}
        for outcome in self._exchanges:
            for phase in PHASES:
                both = per_client[phase]
                for side in (outcome.bytes_up, outcome.bytes_down):
                    for c, b in side[phase].items():
                        both[c] = both.get(c, 0) + b
        return {**self._entries,
                "bytes_secure": {p: int(sum(v.values())) for p, v in per_client.items()},
                "bytes_secure_client": {p: int(max(v.values(), default=0))
                                        for p, v in per_client.items()}}

    def reports(self, protocol, transport, messages, keys, round_number, part=None):
        """The secure sum of the validation reports the clients kept from their
        ``client_metrics``: ``(sums, masked reports, bytes)``; ``part``: the block of a
        validation panel (its own seeds), None for every client. Below the threshold it
        raises (the round's validation needs every report)."""
        key = (round_number, 2) if part is None else (round_number, 2, part)
        try:
            outcome = self._sum(transport, sorted(messages), (), key,
                                round_number, "report",
                                encoding=report_encoding(transport.n_clients))
        except SecureRoundFailed as exc:
            raise FederationError(f"round {round_number}, validation reports: {exc}") from exc
        self._exchanges.append(outcome)
        return outcome.sums, outcome.masked, (total_bytes(outcome.bytes_up),
                                              total_bytes(outcome.bytes_down))

    def close_round(self, record):
        """What each party computed and sent (:mod:`sklearn_fedmf.secure._costs`), and the
        clients whose secure phases failed (skipped: ``on_client_error="skip"``) in
        ``n_failed``."""
        record["n_failed"] += len(self._failed)
        record["secure"] = round_costs([e.costs for e in self._exchanges],
                                       start=self.start_costs)
        self.start_costs = None
        self.begin_round()  # (a fit keeps its exchange: not the round's masked inputs)


def sum_securely(values, option, *, seed, n_clients=None):
    """One secure sum of ``{client: vector}`` outside a fit's rounds (the biases floor,
    FedBlend's statistics, clustering's starts), every phase run in this process
    (:func:`~sklearn_fedmf.secure.secure_sum`), with the fit's ``secure_aggregation``
    ``option`` (True or its options) for ``n_clients`` clients (default: ``len(values)``).
    Returns the :class:`~sklearn_fedmf.secure.SecureSumResult`."""
    options = secure_options(option)
    n = len(values) if n_clients is None else n_clients
    return secure_sum(values, encoding=options.encoding_for(n), neighbours=options.degree(n),
                      seed=seed)


# ---- the client side (what a transport calls) -------------------------------------------
def holds_upload(protocol, phase):
    """Whether the uploads of ``phase`` stay on the clients for a secure sum."""
    if getattr(protocol, "secure", None) is None:
        return False
    summable = protocol.summable
    return phase == "client_update" or (phase == "init_client"
                                        and summable.init_client is not None) or (
        phase == "client_prepare" and summable.prepare_client is not None)


def keep_on_clients(protocol, phase, slots, messages, broadcast):
    """What the engine receives of a client phase's ``messages``: a secure sum's uploads are
    kept in the clients' secure ``slots`` (with the ``broadcast`` they answer) and replaced
    by :data:`READY`; under secure early stopping the validation reports (the keys
    ``protocol.summable.report_keys`` of ``client_metrics``) are kept too. Changes
    ``messages`` in place and returns it."""
    if holds_upload(protocol, phase):
        for client, message in messages.items():
            if message is not None:
                slots[client] = {**slots.get(client, {}), "upload": message,
                                 "broadcast": broadcast}
                messages[client] = READY
    elif phase == "client_metrics" and getattr(protocol, "secure", None) is not None:
        keys = getattr(protocol.summable, "report_keys", ())
        for client, message in (messages.items() if keys else ()):
            slots[client] = {**slots.get(client, {}), "report": {k: message[k] for k in keys}}
            messages[client] = {k: v for k, v in message.items() if k not in keys}
    return messages


def client_exchange_phase(slots, protocol, phase, clients, broadcast, generator):
    """A secure phase on ``clients`` whose slots this process holds: ``(messages, failures,
    seconds)`` for the transport's ``PhaseResult`` (``generator(client)``: the client's
    generator, or None without a stream)."""
    if not isinstance(broadcast, PerClient):
        raise TypeError(f"The message of {phase} must be a PerClient.")
    messages, failures, seconds = {}, {}, {}
    clock = work_clock  # (the client's computation, not the machine's load)
    for client in clients:
        rng = None if generator is None else generator(client)
        tic = clock()
        result, exc = client_call(client_secure_phase, phase, client, slots.get(client),
                                  broadcast.messages[client], rng, protocol.summable)
        if exc is not None:
            failures[client] = exc
            continue
        slot, reply = result
        seconds[client] = clock() - tic
        slots[client] = slot
        messages[client] = reply
    return messages, failures, seconds
