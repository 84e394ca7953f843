"""The server side: the sites as a transport of the engine, and the ``ServerApp``.

The server runs the engine unchanged (sampling, seeds, byte counts, ``history_``, callbacks,
``tol``, the failure policy) with :class:`FlowerTransport`, which sends each client phase to
the sites as Flower Messages. The server never holds a site's ratings or private state: it
knows each site's size and rating aggregates, and the protocol's messages.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from contextlib import contextmanager

import joblib
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from ..engine._exchange import READY, SECURE_PHASES
from ..engine._federation import Broadcast, make_entropy
from ..engine._fit import (
    check_params,
    collect_fit,
    fit_protocol,
    merge_params,
    route_solver_params,
    run_rounds,
    solver_keys,
)
from ..engine._transport import PhaseResult, Transport
from ..exceptions import ClientDropout, ClientError, FederationError
from ._client import HELLO, message_type
from ._codec import put, take
from ._sites import estimator_class, fit_context, travelling_params
from ._supernode import idle_waits

__all__ = ["FlowerTransport", "connect", "fit_on_grid", "server_app", "wire_bytes"]


@contextmanager
def _quick_object_retries(poll):
    """While a phase waits for its replies, retry a reply's objects after 5 ms, doubling up
    to ``poll`` s.

    The SuperLink hands out a reply as soon as its Message is stored, before the site has
    uploaded all its objects; Flower's ``HttpGrid.pull_messages`` then asks for a missing
    object again after 1 s (doubling up to 10 s), a second lost for most replies on a fast
    network. Flower 1.41 offers no setting for it: this swaps the function it calls for the
    same function with shorter waits, and restores it afterwards.
    """
    from flwr.superlink.grid import http_grid

    pull = http_grid.pull_objects
    http_grid.pull_objects = functools.partial(pull, initial_backoff=min(0.005, poll),
                                               backoff_cap=poll)
    try:
        yield
    finally:
        http_grid.pull_objects = pull


def _for_sites(broadcast):
    """What the sites receive of ``broadcast``: all of it, except the history of broadcasts
    that FedMC-ADMM's secure server attaches for grouped clients (one per user in this
    process), which a site, one client, never reads; it gets the message alone."""
    if isinstance(broadcast, Broadcast) and isinstance(broadcast.simulation, tuple):
        from ..completion._fedmc_admm._fedmc_admm_batched import FactorHistory

        if broadcast.simulation and isinstance(broadcast.simulation[0], FactorHistory):
            return broadcast.message
    return broadcast


def wire_bytes(message):
    """Bytes of a Message as Flower serializes it: its records, their arrays and its
    metadata (what a SuperNode receives or sends for it, before HTTP framing)."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())


class FlowerTransport(Transport):
    """The engine's clients are the SuperNodes connected to ``grid``, one site per client.

    On creation it waits (up to ``wait`` seconds) for ``min_nodes`` SuperNodes and asks each
    for its client index (node config ``partition-id``, which must be ``0 .. n - 1``), its
    number of rows and items, and the count, sum, sum of squares, minimum and maximum of its
    ratings: the aggregates from which the server derives ``mean_``, ``rating_range_``,
    ``n_users_`` and RFRec's ``rating_scale_``.

    :meth:`run` sends one Message per client (type ``MESSAGE_TYPES[phase]``, or
    ``OTHER_PHASE`` with the phase's name for any other phase of the engine) carrying the
    broadcast, the random stream and whether the client is selected, and returns the replies
    in ascending client order. A client whose reply is an error, or that does not reply
    within ``timeout`` seconds, is a failure (:class:`~sklearn_fedmf.exceptions.ClientError`
    or ``TimeoutError``); the engine applies its failure policy to it as to a simulated
    client.

    Secure aggregation (``secure_aggregation=True``): each site keeps its upload and its
    secure slot (keys, shares, the encoding it last sent) in its ``Context.state`` and runs
    the protocol's phases (:mod:`sklearn_fedmf.secure._rounds`), each as an ``OTHER_PHASE``
    Message holding that site's own entry of the server's message; its keys and seeds come
    from its OS. The server receives public keys, ciphertexts, masked vectors and shares,
    never an upload. A site that does not reply in time after the key phase is a dropout
    (:class:`~sklearn_fedmf.exceptions.ClientDropout`, whatever ``on_client_error`` says):
    the protocol removes its masks through the other sites' shares; below the threshold the
    round fails as in the simulation (``on_client_error`` decides).

    Attributes
    ----------
    wire : dict
        Serialized bytes of the Messages per round, ``{round: {"uploaded", "downloaded",
        "eval_uploaded", "eval_downloaded"}}`` (round 0: the initial exchange; ``eval_*``:
        the diagnostics of ``client_metrics``, which ``history_`` does not count).
    """

    client_states = None  # they live on the sites
    runs_secure_phases = True  # the secure slots live on the sites too (see _client)

    def __init__(self, grid: Grid, *, min_nodes, timeout=120.0, wait=120.0, poll=0.1):
        self.grid, self.timeout, self.poll = grid, float(timeout), float(poll)
        self.setup = self.protocol = None  # set by fit_on_grid
        self.wire, self._round, self._seq, self._accepted = {}, 0, {}, {}
        deadline = time.monotonic() + wait
        while len(nodes := sorted(grid.get_node_ids())) < min_nodes:
            if time.monotonic() > deadline:
                raise FederationError(
                    f"Only {len(nodes)} of {min_nodes} SuperNodes connected in {wait:g} s.")
            time.sleep(0.5)
        replies, lost = self._send({n: RecordDict() for n in nodes}, HELLO, dict(zip(nodes, nodes)),
                                   "hello")
        if lost:
            raise FederationError(f"SuperNodes {sorted(lost)} did not answer the hello message.")
        hello = {node: dict(reply["hello"]) for node, reply in replies.items()}
        clients = sorted(int(h["client"]) for h in hello.values())
        if clients != list(range(len(nodes))):
            raise FederationError(f"The sites' partition-id values must be 0 .. {len(nodes) - 1},"
                                  f" one per SuperNode; got {clients}.")
        self.node_of = {int(h["client"]): node for node, h in hello.items()}
        self.sites = [hello[self.node_of[c]] for c in range(len(nodes))]
        n_items = {int(h["n_items"]) for h in self.sites}
        if len(n_items) != 1:
            raise FederationError(f"The sites disagree on the number of items: {n_items}.")
        self.n_items = n_items.pop()

    @property
    def n_clients(self):
        return len(self.sites)

    def aggregates(self):
        """``n_users``, ``mean``, ``rating_range``, ``n_ratings`` and ``sum_squares`` of all
        ratings, from each site's rows, rating count, sum, sum of squares, minimum and
        maximum."""
        rated = [h for h in self.sites if int(h["count"])]
        if not rated:
            raise FederationError("The sites hold no rating; there is nothing to fit.")
        return dict(
            n_users=sum(int(h["n_rows"]) for h in self.sites),
            mean=sum(float(h["sum"]) for h in rated) / sum(int(h["count"]) for h in rated),
            rating_range=(min(float(h["min"]) for h in rated),
                          max(float(h["max"]) for h in rated)),
            n_ratings=sum(int(h["count"]) for h in rated),
            sum_squares=sum(float(h.get("sum_squares", 0.0)) for h in rated),
        )

    @contextmanager
    def session(self, protocol):
        # the sites run the protocol they rebuild from ``setup``: it must be this one
        if self.setup is None or protocol is not self.protocol:
            raise RuntimeError("FlowerTransport serves the protocol of its setup only (see "
                               "fit_on_grid).")
        yield self

    def run(self, phase, clients, broadcast, *, stream=None, selected=None, round_number=None):
        self._round = 0 if round_number is None else int(round_number)
        secure = phase in SECURE_PHASES
        shared = RecordDict()  # encoded once, the same records in every client's Message
        if not secure:  # (a secure phase's message differs per client; its keys come from
            put(shared, "broadcast", _for_sites(broadcast))  # the site's OS, not a stream)
            put(shared, "stream", stream)
        if phase == "init_client":
            put(shared, "setup", self.setup)
        contents = {}
        # secure phases keep their slot beside the state, which they do not change
        stateful = phase != "client_metrics" and not secure
        for c in clients:
            # ``seq`` numbers a client's stateful Messages; ``accepted`` is the last one whose
            # reply the engine got: the site drops any later state (see _client)
            info = {"name": phase, "selected": selected is None or c in selected,
                    "accepted": self._accepted.get(c, 0)}
            if stateful:
                self._seq[c] = info["seq"] = self._seq.get(c, 0) + 1
            contents[c] = RecordDict({**shared, "phase": ConfigRecord(info)})
            if secure:  # each site receives its own entry only
                put(contents[c], "broadcast", broadcast.messages[c])
        replies, failures = self._send(contents, message_type(phase), self.node_of,
                                       "eval" if phase == "client_metrics" else "")
        if stateful:
            self._accepted.update((c, self._seq[c]) for c in replies)
        messages = {c: take(reply, "message") for c, reply in replies.items()}
        held = [c for c, reply in replies.items() if "held" in reply]
        if held:  # uploads the sites hold for the secure sum: the server learns they are ready
            messages.update(dict.fromkeys(held, READY))
        if secure and phase != SECURE_PHASES[0]:
            for c, exc in failures.items():
                if isinstance(exc, TimeoutError):  # after the keys: a dropout (class doc)
                    failures[c] = ClientDropout(
                        f"Site {c} did not reply to {phase} within {self.timeout:g} s: a "
                        "dropout of the secure sum, its masks removed through the shares.")
        return PhaseResult(messages, failures)

    def _send(self, contents, kind, node_of, tag):
        """Send ``{key: content}`` to ``node_of[key]``; return ``({key: reply content},
        {key: exception})`` in ascending key order."""
        messages = {key: Message(content, node_of[key], kind,
                                 group_id=str(self._round))
                    for key, content in contents.items()}
        wire = self.wire.setdefault(self._round, dict.fromkeys(
            ("uploaded", "downloaded", "eval_uploaded", "eval_downloaded"), 0))
        prefix = f"{tag}_" if tag == "eval" else ""
        if tag != "hello":
            wire[prefix + "downloaded"] += sum(wire_bytes(m) for m in messages.values())
        with _quick_object_retries(self.poll):
            return self._push_and_pull(messages, wire, tag, prefix)

    def _push_and_pull(self, messages, wire, tag, prefix):
        # push, then pull at most every ``poll`` seconds (Grid.send_and_receive: every 3 s)
        replies, failures = {}, {}
        ids = list(self.grid.push_messages(list(messages.values())))
        pending = {}
        for key, message_id in zip(messages, ids):
            if message_id:
                pending[message_id] = key
            else:
                failures[key] = FederationError(f"The Message to site {key} could not be "
                                                "pushed to the SuperLink.")
        deadline, waits = time.monotonic() + self.timeout, idle_waits(self.poll)
        while pending:
            for reply in self.grid.pull_messages(list(pending)):
                key = pending.pop(reply.metadata.reply_to_message_id, None)
                if key is None:
                    continue
                if reply.has_error():
                    failures[key] = ClientError(
                        f"Site {key} replied with an error: {reply.error.reason}", client=key)
                    continue
                if tag != "hello":
                    wire[prefix + "uploaded"] += wire_bytes(reply)
                replies[key] = reply.content
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(next(waits))
        for key in pending.values():
            failures[key] = TimeoutError(f"Site {key} did not reply within "
                                         f"{self.timeout:g} s.")
        return dict(sorted(replies.items())), dict(sorted(failures.items()))


def connect(estimator, grid, *, min_nodes=2, timeout=120.0, wait=120.0):
    """The sites of ``grid`` as a transport for ``estimator``'s protocol.

    Waits for the sites, derives the federation's aggregates from their hello replies and
    builds the protocol (as every site will, from the setup its init Message carries).
    Returns ``(transport, protocol, ctx)``: the engine's arguments.
    """
    check_params(estimator)
    transport = FlowerTransport(grid, min_nodes=min_nodes, timeout=timeout, wait=wait)
    entropy = make_entropy(estimator.random_state)
    agg = dict(transport.aggregates(), n_items=transport.n_items,
               n_clients=transport.n_clients)
    ctx = fit_context(estimator, **agg, entropy=entropy)
    # (with secure_aggregation=True, the protocol that sums the uploads securely)
    transport.protocol = protocol = fit_protocol(estimator, ctx)
    transport.setup = dict(estimator=type(estimator).__name__,
                           params=travelling_params(estimator), entropy=entropy, **agg)
    return transport, protocol, ctx


def fit_on_grid(estimator, grid, *, min_nodes=2, timeout=120.0, wait=120.0):
    """Fit ``estimator`` on the sites connected to a Flower ``grid``.

    The engine runs here exactly as in ``estimator.fit``, with the sites as its clients.
    Afterwards the estimator holds what a server can hold: ``components_``, ``history_``,
    ``n_iter_``, ``n_clients_``, ``mean_`` and ``rating_range_`` (from the sites'
    aggregates) and ``message_bytes_`` (the Messages' serialized bytes per round, beside
    ``history_``'s count of the protocol's payload). ``user_factors_`` is not set: the user
    factors stay on the sites.

    Returns
    -------
    estimator : the fitted estimator
    """
    transport, protocol, ctx = connect(estimator, grid, min_nodes=min_nodes, timeout=timeout,
                                       wait=wait)
    state = run_rounds(estimator, protocol, transport, ctx)
    # the fitted attributes, from a server that holds no block and no client state
    collect_fit(estimator, dataclasses.replace(state, client_states=[]), [], ctx)
    for name in ("user_factors_", "user_factors_relaxed_"):  # they stay on the sites
        estimator.__dict__.pop(name, None)
    init = transport.wire.get(0, {})
    estimator.message_bytes_ = [
        {"round": r["round"], **{key: value + (init.get(key, 0) if i == 0 else 0)
                                 for key, value in transport.wire.get(r["round"], {}).items()}}
        for i, r in enumerate(estimator.history_)
    ]
    return estimator


def server_app(estimator=None):
    """A Flower ``ServerApp`` that fits an estimator on the connected sites.

    Parameters
    ----------
    estimator : estimator instance, default=None
        The estimator to fit (its parameters travel to the sites). When None, the run
        config's ``estimator`` key names the class (default ``"FedMCADMM"``).

    Run config keys: any parameter of the estimator, by its own name (overrides
    ``estimator``'s); ``output``: where the fitted estimator is written with joblib
    (default ``model.joblib``); ``min-nodes``: SuperNodes to wait for (default 2);
    ``node-wait``: seconds to wait for them (default 120); ``round-timeout``: seconds a phase
    waits for its replies before the missing sites count as failed (default 120).

    Returns
    -------
    app : flwr.serverapp.ServerApp

    Examples
    --------
    The server module of a Flower app (``[tool.flwr.app.components] serverapp``):

    >>> from sklearn_fedmf import FedMCADMM
    >>> from sklearn_fedmf.flower import server_app
    >>> app = server_app(FedMCADMM(n_components=5, max_iter=20, random_state=0))
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        config = dict(context.run_config)
        if estimator is None:
            base = estimator_class(str(config.get("estimator", "FedMCADMM")))()
        else:
            base = estimator
        cls = type(base)
        params = base.get_params(deep=False)
        # a key named like a parameter sets it; like a solver_params key, that key
        given = {k: v for k, v in config.items() if k in params or k in solver_keys(cls)}
        params = route_solver_params(cls, merge_params(params, given))
        fitted = fit_on_grid(cls(**params), grid,
                             min_nodes=int(config.get("min-nodes", 2)),
                             timeout=float(config.get("round-timeout", 120)),
                             wait=float(config.get("node-wait", 120)))
        joblib.dump(fitted, str(config.get("output", "model.joblib")))

    return app
