"""The federated engine: rounds, client sampling, failures, byte counts, history.

An algorithm is a :class:`FederatedProtocol`: a bundle of pure functions (bind their
hyperparameters with :func:`functools.partial`), no ``self`` and no global random state.
The engine owns the server side of everything else: seeds, sampling, dropout, the failure
policy, byte counts, history, callbacks, early stopping and progress. The client side (where
the client functions run, where blocks and client states live) is a transport
(:mod:`sklearn_fedmf.engine._transport`): :class:`~sklearn_fedmf.engine._transport.LocalTransport`
(threads, joblib backends, Dask) when the engine is given a list of client blocks, or any
:class:`~sklearn_fedmf.engine._transport.Transport` passed in its place.

Protocol functions
------------------
init_server(rng) -> (server_state, broadcast)
    Global state before round 1 and the first broadcast (e.g. ``V^0``).
init_client(block, broadcast, rng) -> (client_state, upload or None)
    Runs once per client; the upload (e.g. FedMC-ADMM's ``Y_i^0``) reaches ``server_init_uploads``.
server_init_uploads(server_state, uploads) -> (server_state, broadcast)
    Optional; receives ``{client: upload}`` of every client after ``init_client``.
client_update(client_state, block, broadcast, rng, selected) -> (client_state, upload or None)
    One round of local work. ``selected`` is False only for clients that compute without
    uploading (``Participation(computes="all")``, e.g. FedMAvg's partial client communication).
server_update(server_state, uploads, round) -> (server_state, broadcast)
    ``uploads`` maps client index -> upload for the clients whose update arrived, in
    ascending client order; it may be empty when every sampled client failed. With
    ``server_counts=True`` it is called as ``server_update(..., counts=counts)``, ``counts``
    mapping each of those clients to how often the round drew it (see ``sample_clients``).
client_prepare(client_state, block, broadcast, rng, selected) -> (client_state, stats or None)
    Optional first phase of a round, for a local update that needs a global quantity of
    the same round (e.g. FedMAvg's step size from every client's Gram matrix). The clients
    of the round run it first; their ``stats`` reach ``server_prepare``.
server_prepare(server_state, stats, round) -> (server_state, message)
    Optional; turns ``{client: stats}`` into the ``message`` that ``client_update`` then
    receives as its ``broadcast`` (a client keeps what it needs of the round's first
    broadcast in its state). Stats and message are counted like uploads and broadcasts.
client_metrics(client_state, block, broadcast) -> dict of additive sums
    Simulation diagnostics (losses, squared errors, counts); summed over clients.
combine_metrics(server_state, sums) -> dict
    Turns the summed diagnostics into the history record (``objective``, ``train_rmse``,
    ``eval_rmse``, ...).
after_round(server_state, broadcast, record) -> (server_state, broadcast, stop)
    Optional server step between rounds, after the round's server update and evaluation
    (e.g. FederatedClustering's SNCP penalty schedule): it may add keys to ``record``,
    change the state and the broadcast the next round starts from, and stop the fit.

A protocol may also carry :class:`~sklearn_fedmf.engine._groups.BatchedPhases` (``batched``): the
same client phases for a whole group of clients, which the estimators use when the clients
are many and small (one per user); see :mod:`sklearn_fedmf.engine._groups`.

A broadcast may be a :class:`Broadcast`: its ``message`` is what the paper's server sends
(counted in ``bytes_downloaded``; None when nothing is sent that round), its ``simulation``
part is state every client would derive itself (common randomness, replayed computations):
it reaches the clients but is never counted.

Every random draw comes from ``numpy.random.SeedSequence(entropy, spawn_key=(kind, round,
client))``, so results do not depend on ``n_jobs``, the joblib backend, the transport or the
order in which clients finish.

How a round's uploads reach the server is the fit's exchange
(:mod:`sklearn_fedmf.engine._exchange`), chosen once from ``protocol.secure``: the plain exchange,
or secure aggregation. A protocol whose server needs only sums of uploads declares it with
``summable`` (:class:`SummableUploads`); with ``secure`` set
(:class:`~sklearn_fedmf.secure.SecureAggregation`) the uploads stay on the clients and
each round's (and, when declared, the initial and the prepare phase's) exchange is one
secure sum: the four phases of SecAgg/SecAgg+ run as four transport calls
(:mod:`sklearn_fedmf.secure._rounds`), and ``summable.server_update`` receives the sums.
The clients that ``dropout`` drops take part in the key phases and go offline before
sending their masked input (their masks are removed through the shares). A round in which
fewer clients than the threshold remain at a phase has no sum: with
``on_client_error="skip"`` it is skipped (a ``ClientFailureWarning``, ``secure_failed`` in its
record), else a :class:`~sklearn_fedmf.exceptions.FederationError` is raised. The record of
a secure round also holds ``bytes_secure`` (``{phase: bytes}``, up and down, over its
clients) and ``bytes_secure_client`` (``{phase: the most bytes one client sent and
received}``), the phases being ``advertise_keys``, ``share_keys``, ``masked_input`` and
``unmasking``, and ``secure``: each party's seconds and bytes per exchange and phase
(:mod:`sklearn_fedmf.secure._costs`); ``bytes_uploaded`` and ``bytes_downloaded`` count
every phase. The callback's ``uploads`` are then the masked inputs, all the server saw of
the uploads.

Client failures: a client that raises :class:`~sklearn_fedmf.exceptions.ClientDropout`, or
that ``dropout`` drops, is a simulated failure (counted in ``n_failed``). Any other exception
raises :class:`~sklearn_fedmf.exceptions.ClientError` naming the client and the round
(``on_client_error="raise"``, the default), or with ``on_client_error="skip"`` the client
keeps its previous state, counts in ``n_failed``, and a
:class:`~sklearn_fedmf.exceptions.ClientFailureWarning` is raised once per call; a round in
which every sampled client failed raises :class:`~sklearn_fedmf.exceptions.FederationError`.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._message_size import Broadcast, nbytes
from ..exceptions import ClientDropout, ClientError, ClientFailureWarning, FederationError
from ._dispatch import resident_blocks
from ._early_stopping import EarlyStopping, _BestRound
from ._exchange import exchange_for
from ._panel import panel_reports
from ._round_progress import _Progress
from ._transport import (
    LocalTransport,
    Transport,
    _LazyGenerator,  # noqa: F401  (re-exported: the seeding rule's generator)
    _rng,
    as_transport,
)

__all__ = [
    "FederatedProtocol", "FederationState", "Participation", "Broadcast", "run_federation",
    "SummableUploads",
    "sample_clients", "EarlyStopping",
    "initialize_federation", "evaluate", "nbytes", "make_entropy", "resident_blocks",
    "LocalTransport", "Transport",
]

_INIT_CLIENT, _UPDATE_CLIENT, _SERVER_ROUND, _INIT_SERVER, _PARTITION = 0, 1, 2, 3, 4
_PREPARE_CLIENT = 5
_VALIDATION = 6


@dataclass(frozen=True)
class Participation:
    """Who takes part in a round besides the sampled clients, which compute and upload.

    Parameters
    ----------
    computes : {"sampled", "all"}, default="sampled"
        Which clients run ``client_prepare`` / ``client_update``. ``"all"``: the clients that
        were not sampled compute too, with ``selected=False``, and upload nothing (FedMAvg's
        partial client communication, RFRec's local steps).
    receives : {"sampled", "all"}, default="sampled"
        Which clients receive each broadcast (its bytes are counted once per recipient).
    dropped : {"offline", "upload_lost"}, default="offline"
        What a client that ``dropout`` drops does in that round: nothing (``"offline"``: it
        keeps its state), or computes like a client that was not sampled and loses its upload
        (``"upload_lost"``, RFRec's upload-loss model).
    server_update : {"on_uploads", "every_round"}, default="on_uploads"
        Whether ``server_update`` runs in a round where no upload arrived.
    """

    computes: str = "sampled"
    receives: str = "sampled"
    dropped: str = "offline"
    server_update: str = "on_uploads"

    def __post_init__(self):
        allowed = {"computes": ("sampled", "all"), "receives": ("sampled", "all"),
                   "dropped": ("offline", "upload_lost"),
                   "server_update": ("on_uploads", "every_round")}
        for name, options in allowed.items():
            if getattr(self, name) not in options:
                raise ValueError(f"Participation.{name} must be one of {options}, got "
                                 f"{getattr(self, name)!r}.")


@dataclass(frozen=True)
class SummableUploads:
    """How a protocol's server works from sums of uploads (declared by the protocol; see
    :mod:`sklearn_fedmf.secure._rounds`).

    Parameters
    ----------
    client : callable
        ``client(upload, weight) -> {name: array or number}``, run by the client on its
        round upload: the summands (``weight``: the server's weight for this client, None
        when ``weights`` is None).
    server_update : callable
        ``server_update(server_state, sums, n_summed, round_index) -> (server_state,
        broadcast)``: the round's server step from ``{name: sum}`` over ``n_summed`` clients.
    weights : callable or None
        ``weights(server_state, clients, counts) -> {client: weight}``: what each client of the
        round multiplies its upload by (sent with its routed shares); None: no weight.
    cumulative : bool
        The server needs every client's last value: clients send changes (module docstring).
    init_client, server_init : callable or None
        The same pair for the uploads of ``init_client``, summed over every client
        (``init_client(upload, broadcast) -> dict``, ``broadcast`` the one the client
        initialized from; ``server_init(server_state, sums, n) ->
        (server_state, broadcast)``). None: the initial uploads stay plain (the protocol then
        says why they may).
    prepare_client, server_prepare, prepare_cumulative : callable, callable, bool
        The same for the statistics of ``client_prepare`` (``prepare_client(stats, weight)
        -> dict``; ``server_prepare(server_state, sums, clients, round_index) ->
        (server_state, message)``, ``clients`` the senders in the sum). A prepare exchange
        below the threshold raises whatever ``on_client_error`` says (the round's update
        needs its message).
    report_keys : tuple
        Set by the engine in a fit with early stopping: the keys of ``client_metrics`` (a
        client's validation report) that the clients keep for one more secure sum per
        evaluation instead of sending them.
    reference : callable or None
        ``reference(server_state, weight) -> {name: array or number}``, the round's summands
        of a client that did not move (e.g. ``w V`` for ``w W_p``): with noise on the sum
        (``privacy=DistributedDP``) a client clips and noises its summands minus this, and
        the server adds the survivors' references back. None: the summands themselves.
    """

    client: Callable
    server_update: Callable
    weights: Callable | None = None
    cumulative: bool = False
    init_client: Callable | None = None
    server_init: Callable | None = None
    prepare_client: Callable | None = None
    server_prepare: Callable | None = None
    prepare_cumulative: bool = False
    report_keys: tuple = ()
    reference: Callable | None = None


@dataclass(frozen=True)
class FederatedProtocol:
    """The pure functions that define one federated algorithm (see the module docstring)."""

    init_server: Callable
    init_client: Callable
    client_update: Callable
    server_update: Callable
    client_metrics: Callable
    combine_metrics: Callable
    server_init_uploads: Callable | None = None
    client_prepare: Callable | None = None  # optional first phase of a round (module doc)
    server_prepare: Callable | None = None
    after_round: Callable | None = None  # optional server step between rounds (module doc)
    participation: Participation = Participation()
    progress_keys: tuple = ("objective", "train_rmse", "eval_rmse")  # shown by verbose
    server_counts: bool = False  # server_update receives counts= (draw multiplicities)
    batched: Any = None  # optional BatchedPhases: the client phases for a group of clients
    summable: Any = None  # SummableUploads: the server needs only sums (module doc)
    secure: Any = None  # SecureAggregation options: sum the uploads securely (module doc)


@dataclass
class FederationState:
    """Everything a fit needs to continue (``warm_start``).

    ``client_states`` is the local transport's list of client states (None when the clients
    hold them in their own processes).
    """

    server_state: Any
    client_states: list | None
    broadcast: Any
    n_rounds: int = 0
    history: list = field(default_factory=list)
    n_uploads: Any = None  # per client: round uploads the server received (privacy accounting)
    best_round: int | None = None  # early stopping: the best validated round (kept state)
    best_score: float | None = None  # its validation RMSE
    # early stopping's validation panel (its clients in the order they were added; None:
    # every client, or not yet drawn): fixed at the first evaluation, kept by a warm start
    panel: Any = None
    panel_count: float | None = None  # the panel's validation count (what the server knows)
    # the fit's exchange (_exchange.py), plain or secure, with its own state (secure slots,
    # running sums); a warm start continues it
    exchange: Any = None


def make_entropy(random_state):
    """Turn an sklearn ``random_state`` into an integer seed for SeedSequence."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(np.iinfo(np.int64).max))
    return int(random_state)


def partition_rng(entropy):
    """The generator that assigns rows to clients (``partition="random"``)."""
    return _rng(entropy, _PARTITION)


def validation_rng(entropy, client):
    """Client ``client``'s generator for choosing its held-out validation ratings."""
    return _rng(entropy, _VALIDATION, client)


def _check_policy(on_client_error):
    if on_client_error not in ("raise", "skip"):
        raise ValueError(f"on_client_error must be 'raise' or 'skip', got {on_client_error!r}.")


def _client_error(phase, client, exc, round_number):
    where = "initialization" if round_number is None else f"round {round_number}"
    return ClientError(
        f"Client {client} failed in {phase} ({where}): {type(exc).__name__}: {exc}",
        client=client, round=round_number,
    )


class _Failures:
    """The failure policy of one engine call: raise, or count and warn once."""

    def __init__(self, on_client_error, label):
        _check_policy(on_client_error)
        self.skip, self.label, self.warned = on_client_error == "skip", label, False

    def check(self, result, phase, round_number):
        """Raise for a real failure unless skipping; returns the number of failed clients and
        whether any was a real (not simulated) failure."""
        real = False
        for client, exc in result.failures.items():
            if isinstance(exc, ClientDropout):
                continue
            real = True
            if not self.skip:
                raise _client_error(phase, client, exc, round_number) from exc
            if not self.warned:
                self.warned = True
                # (stacklevel: past check, _round, run_federation and the fit skeleton)
                warnings.warn(
                    f"[{self.label}] {_client_error(phase, client, exc, round_number)}; "
                    "on_client_error='skip': the client keeps its previous state and the "
                    "federation goes on (failures are counted in history_'s n_failed).",
                    ClientFailureWarning, stacklevel=5,
                )
        return len(result.failures), real


def initialize_federation(protocol, clients, *, entropy, n_jobs=None):
    """Run ``init_server`` and every client's ``init_client``.

    ``clients`` is the list of client blocks (run by a
    :class:`~sklearn_fedmf.engine._transport.LocalTransport` with ``n_jobs`` workers) or a
    :class:`~sklearn_fedmf.engine._transport.Transport`. A client that fails here has no state to
    go on from: its error is raised whatever ``on_client_error`` says.

    Returns ``(state, (bytes_up, bytes_down))`` of this initial exchange.
    """
    transport = as_transport(clients, n_jobs=n_jobs)
    server_state, broadcast = protocol.init_server(_rng(entropy, _INIT_SERVER))
    with transport.session(protocol):
        result = transport.run("init_client", list(range(transport.n_clients)), broadcast,
                               stream=(entropy, _INIT_CLIENT))
    for client, exc in result.failures.items():
        if isinstance(exc, ClientDropout):
            raise FederationError(f"Client {client} dropped out during initialization; it "
                                  "has no state to continue from.") from exc
        raise _client_error("init_client", client, exc, None) from exc
    uploads = {c: u for c, u in result.messages.items() if u is not None}
    exchange = exchange_for(protocol)
    server_state, broadcast, init_bytes = exchange.start(
        protocol, transport, server_state, broadcast, uploads, entropy=entropy,
        failures=_Failures("raise", "initialization"))
    state = FederationState(server_state, transport.client_states, broadcast,
                            exchange=exchange)
    return state, init_bytes


def _n_sampled(clients_per_round, n_clients):
    if clients_per_round is None:
        return n_clients
    if isinstance(clients_per_round, float) and clients_per_round <= 1.0:
        return max(1, int(math.ceil(clients_per_round * n_clients)))
    n = int(clients_per_round)
    if n > n_clients:
        raise ValueError(
            f"clients_per_round={clients_per_round} is larger than the number of clients "
            f"({n_clients})."
        )
    return n


def sample_clients(rng, n_clients, n_sampled, sampling="uniform", weights=None):
    """The clients of one round: ``(clients, counts)``, distinct clients in ascending order and
    how often each was drawn.

    ``"uniform"``: ``n_sampled`` distinct clients uniformly without replacement (every count
    is 1). ``"weighted"``: ``n_sampled`` i.i.d. draws with probabilities proportional to
    ``weights`` (``omega``), with replacement: the multiset ``A^s`` of Wang & Chang's
    Algorithm 1, whose plain mean ``(1/m) sum_{a in A^s} W_a`` is unbiased for
    ``sum_p omega_p W_p``. A client drawn twice computes once; ``counts`` carries its
    multiplicity to the server.
    """
    if sampling == "uniform":
        clients = np.sort(rng.choice(n_clients, size=n_sampled, replace=False))
        return clients, np.ones(n_sampled, dtype=np.int64)
    draws = rng.choice(n_clients, size=n_sampled, replace=True, p=weights / weights.sum())
    return np.unique(draws, return_counts=True)


def _sampling_weights(sampling, weights, n_clients):
    if sampling not in ("uniform", "weighted"):
        raise ValueError(f'sampling must be "uniform" or "weighted", got {sampling!r}.')
    if sampling == "uniform":
        return None
    weights = np.asarray(weights if weights is not None else [], dtype=float)
    if (weights.shape != (n_clients,) or not np.all(np.isfinite(weights))
            or np.any(weights < 0) or weights.sum() <= 0):
        raise ValueError(
            'sampling="weighted" needs sampling_weights: one finite nonnegative weight per '
            "client, not all zero."
        )
    return weights


def run_federation(
    protocol,
    clients,
    *,
    max_iter,
    clients_per_round=None,
    entropy=0,
    n_jobs=None,
    tol=0.0,
    dropout=0.0,
    eval_every=1,
    callback=None,
    verbose=0,
    state=None,
    init_bytes=(0, 0),
    label="federation",
    on_client_error="raise",
    sampling="uniform",
    sampling_weights=None,
    early_stopping=None,
    report=None,
):
    """Run ``max_iter`` communication rounds of ``protocol`` on the ``clients``.

    Parameters
    ----------
    protocol : FederatedProtocol
    clients : list of ClientBlock or Transport
        The client blocks, one per client in client order (run in this process by a
        :class:`~sklearn_fedmf.engine._transport.LocalTransport`), or a transport that reaches the
        clients wherever they are.
    max_iter : int
        Rounds to run in this call (added to ``state.n_rounds`` when warm starting).
    clients_per_round : int, float in (0, 1] or None
        Clients drawn each round (see ``sampling``); None means all.
    entropy : int
        Root seed; round ``k`` and client ``i`` use ``SeedSequence(entropy, (kind, k, i))``.
    n_jobs : int or None
        Workers for the local updates (joblib; threads unless a backend is configured).
        Ignored when ``clients`` is a transport.
    tol : float
        Stop when the relative change of the objective between two evaluations is below
        ``tol`` (0 disables early stopping).
    dropout : float in [0, 1)
        Probability that a sampled client fails in a round (it then contributes nothing and
        keeps its state, or loses its upload: ``Participation.dropped``).
    eval_every : int
        Evaluate the diagnostics every ``eval_every`` rounds (and at the last round).
    callback : callable or None
        ``callback(round, info)`` after every round; returning True stops the fit. ``info``
        has keys ``server_state``, ``broadcast``, ``sampled`` (distinct clients), ``counts``
        (their draws), ``uploads``, ``record`` and ``stats`` (what ``client_prepare`` sent;
        empty without one).
    verbose : int
        0 silent, 1 a progress bar, 2 one line per round.
    state : FederationState
        Initialized (or warm) state from :func:`initialize_federation`.
    init_bytes : tuple of int
        Bytes (uploaded, downloaded) of the initial exchange; counted in the first round's
        record.
    label : str
        Name shown in progress output and warnings.
    on_client_error : {"raise", "skip"}
        What an exception in client code (other than ``ClientDropout``) does: raise a
        ``ClientError`` naming the client and the round, or skip the client for that round
        (module docstring).
    sampling : {"uniform", "weighted"}
        ``"uniform"``: distinct clients without replacement. ``"weighted"``: i.i.d. draws with
        replacement, probabilities proportional to ``sampling_weights`` (:func:`sample_clients`).
        A client drawn twice runs and uploads once (``bytes_uploaded``); the record's
        ``bytes_uploaded_draws`` counts its upload once per draw, the papers' convention.
    sampling_weights : array-like of shape (n_clients,) or None
        ``omega`` of weighted sampling (required then).
    early_stopping : EarlyStopping or None
        Federated validation: keep the best validated round's state, stop after
        ``n_iter_no_change`` evaluations without improvement, restore the best round at the
        end (``tol`` then applies to the validation RMSE, not to the objective). Needs the
        client states in this process (a local transport).
    report : Transport or None
        With ``early_stopping``, the same clients (sharing their states) with the caller's
        eval set as their held-out ratings: its ``eval_*`` diagnostics are recorded beside
        the validation's (a simulation diagnostic, as without early stopping).

    Returns
    -------
    state : FederationState
        With ``history`` extended by one record per round.
    """
    exchange = exchange_for(protocol, state.exchange)  # chosen once; a warm start's is kept
    transport = as_transport(clients, n_jobs=n_jobs, client_states=state.client_states,
                             secure_slots=exchange.slots)
    failures = _Failures(on_client_error, label)
    plain_protocol = protocol  # (the report transport's: its eval_* sums are diagnostics)
    protocol = exchange.begin(
        protocol, transport, entropy=entropy, failures=failures, label=label,
        keep_masked=callback is not None,
        report_keys=None if early_stopping is None else early_stopping.report_keys)
    state.exchange = exchange
    n_clients = transport.n_clients
    n_sampled = _n_sampled(clients_per_round, n_clients)
    omega = _sampling_weights(sampling, sampling_weights, n_clients)
    progress = _Progress(label, max_iter, verbose, protocol.progress_keys)
    previous_objective = _last_objective(state.history)
    keeper = None
    if early_stopping is not None:
        if state.client_states is None:
            raise ValueError(
                "early stopping keeps each client's state at the best round; the clients of "
                "this transport keep theirs in their own processes. Set early_stopping=False.")
        if not eval_every:
            raise ValueError("early stopping scores every evaluated round; eval_every=0 "
                             "evaluates none. Set eval_every >= 1 or early_stopping=False.")
        keeper, tol = _BestRound(early_stopping, state), 0.0  # (tol: the validation's)
    # (every client in every round: every client reports, as before the panel)
    panel = (early_stopping.panel if early_stopping is not None and n_sampled < n_clients
             else None)
    run = _Run(protocol, plain_protocol, transport, exchange, failures, entropy, n_sampled,
               sampling, omega, dropout, eval_every, callback, early_stopping, keeper, report,
               panel, progress, init_bytes, state.n_rounds, state.n_rounds + max_iter - 1)
    with transport.session(protocol), (report.session(plain_protocol) if report is not None
                                       else nullcontext()):
        for k in range(run.start_round, run.last_round + 1):
            record, seen = _round(run, state, k)
            patience_out, seen["validation_reports"] = _evaluation(run, state, k, record)
            stop = _keep_round(run, state, k, record, seen)
            stop, previous_objective = _objective_check(run, record, previous_objective, tol,
                                                        k, stop)
            if stop or patience_out:
                break
    progress.close(state.history[-1] if state.history else None)
    if keeper is not None:
        keeper.restore(state)
    return state


@dataclass
class _Run:
    """The settings of one :func:`run_federation` call, read by its round's steps."""

    protocol: Any
    plain_protocol: Any
    transport: Any
    exchange: Any
    failures: Any
    entropy: int
    n_sampled: int
    sampling: str
    omega: Any
    dropout: float
    eval_every: int
    callback: Any
    early_stopping: Any
    keeper: Any
    report: Any
    panel: Any  # early stopping's panel rule when the fit samples its clients, else None
    progress: Any
    init_bytes: tuple
    start_round: int
    last_round: int


def _draw(run, k):
    """Round ``k``'s clients: ``(sampled, counts, dropped, selected, members)``: the sampled
    clients and their draws, those that ``dropout`` drops, those whose uploads count, and
    those that compute."""
    n_clients = run.transport.n_clients
    server_rng = _rng(run.entropy, _SERVER_ROUND, k)
    sampled, counts = sample_clients(server_rng, n_clients, run.n_sampled, run.sampling,
                                     run.omega)
    failing = server_rng.random(len(sampled)) < run.dropout if run.dropout else []
    dropped = set(sampled[failing].tolist()) if run.dropout else set()
    selected = set(sampled.tolist()) - dropped  # the clients whose uploads count
    part = run.protocol.participation
    members = np.arange(n_clients) if part.computes == "all" else sampled
    if dropped and part.dropped == "offline":
        members = np.setdiff1d(members, sampled[failing], assume_unique=True)
    # (numpy, then one list: many clients per round are cheap)
    return sampled, counts, dropped, selected, members.tolist()


def _round(run, state, k):
    """Round ``k`` up to its record: the client phases, their exchanges and the server's
    steps (the exchange runs those). Returns ``(record, seen)``, ``seen`` what the server
    saw of the round for the callback."""
    tic = time.perf_counter()
    protocol, transport, exchange, failures = (run.protocol, run.transport, run.exchange,
                                               run.failures)
    sampled, counts, dropped, selected, members = _draw(run, k)
    exchange.begin_round()
    broadcast, stats, n_failed, real = state.broadcast, {}, len(dropped), False
    if protocol.client_prepare is not None:
        result = transport.run("client_prepare", members, broadcast,
                               stream=(run.entropy, _PREPARE_CLIENT, k), selected=selected,
                               round_number=k + 1)
        n, real = failures.check(result, "client_prepare", k + 1)
        n_failed += n
        stats = {c: s for c, s in result.messages.items() if s is not None}
        if result.failures:
            members = [c for c in members if c not in result.failures]
        broadcast, stats = exchange.prepare(protocol, transport, state, stats,
                                            dropped - set(result.failures), k)
    result = transport.run("client_update", members, broadcast,
                           stream=(run.entropy, _UPDATE_CLIENT, k), selected=selected,
                           round_number=k + 1)
    n, real_update = failures.check(result, "client_update", k + 1)
    n_failed, real = n_failed + n, real or real_update
    uploads = {c: result.messages[c] for c in sorted(selected)
               if result.messages.get(c) is not None}
    if real and not uploads and not any(c in result.messages for c in selected):
        raise FederationError(
            f"[{failures.label}] every sampled client failed in round {k + 1} "
            f"(clients {sorted(selected)}); see the ClientFailureWarning."
        )
    recipients = transport.n_clients if protocol.participation.receives == "all" else len(
        sampled)
    bytes_down = nbytes(state.broadcast) * recipients
    if protocol.client_prepare is not None:
        bytes_down += nbytes(broadcast) * recipients
    drawn = dict(zip(sampled.tolist(), counts.tolist()))
    uploads = exchange.update(protocol, transport, state, uploads,
                              dropped - set(result.failures), drawn, k)
    if state.n_uploads is None:
        state.n_uploads = np.zeros(transport.n_clients, dtype=np.int64)
    state.n_uploads[np.fromiter(uploads, np.int64, len(uploads))] += 1
    seconds = time.perf_counter() - tic
    first = k == run.start_round
    bytes_up, exchanged_down = exchange.round_bytes()
    record = {
        "round": k + 1,
        "n_sampled": run.n_sampled,
        "n_failed": n_failed,
        "bytes_uploaded": bytes_up + (run.init_bytes[0] if first else 0),
        "bytes_downloaded": bytes_down + exchanged_down + (run.init_bytes[1] if first else 0),
        "seconds": seconds,
        **exchange.round_entries(),
    }
    if run.sampling == "weighted":
        record["n_distinct"] = len(sampled)
        record["bytes_uploaded_draws"] = record["bytes_uploaded"] + sum(
            (drawn[c] - 1) * nbytes(u) for c, u in uploads.items())
    return record, {"sampled": sampled, "counts": counts, "uploads": uploads, "stats": stats}


def _evaluation(run, state, k, record):
    """Round ``k``'s evaluation (every ``eval_every`` rounds and the last) into ``record``;
    with early stopping the clients' validation reports reach the server through the
    exchange (their bytes counted) and the best round is kept. Returns ``(patience_out,
    reports)``, the reports as the server saw them (None without early stopping)."""
    if not run.eval_every or not ((k + 1) % run.eval_every == 0 or k == run.last_round):
        return False, None
    if run.keeper is None:
        record.update(_evaluate(run.protocol, state, run.transport, in_round=True))
        return False, None
    if run.panel is not None and not _panel_of_all(run, state):
        metrics, reports, (up, down) = _evaluate_panel(run, state)
    else:  # (every client reports: plain, the sums as before the panel, whatever its rule)
        metrics, reports, (up, down) = _evaluate(
            run.protocol, state, run.transport, in_round=True,
            reports=run.early_stopping.report_keys, exchange=run.exchange)
    record.update(metrics)
    record["bytes_uploaded"] += up
    record["bytes_downloaded"] += down
    patience_out = run.keeper.update(state, record, k + 1)
    if run.report is not None:  # (after the update, which renames eval_*)
        record.update({key: value for key, value in _evaluate(
            run.plain_protocol, state, run.report, in_round=True).items()
            if key.startswith("eval_")})
    return patience_out, reports


def _keep_round(run, state, k, record, seen):
    """The round's last steps: the exchange's records, ``after_round``, the history and
    the callback (``seen``: what the server saw). Returns whether either asks to stop."""
    run.exchange.close_round(record)
    stop, protocol = False, run.protocol
    if protocol.after_round is not None:
        state.server_state, state.broadcast, stop = protocol.after_round(
            state.server_state, state.broadcast, record)
        stop = bool(stop)
    state.history.append(record)
    state.n_rounds = k + 1
    run.progress.update(record)
    if run.callback is not None:
        info = {"server_state": state.server_state, "broadcast": state.broadcast, **seen,
                "record": record}
        if info["validation_reports"] is None:
            del info["validation_reports"]
        stop = bool(run.callback(k + 1, info)) or stop
    return stop


def _objective_check(run, record, previous, tol, k, stop):
    """Refuse a diverged objective; stop when it changed by at most ``tol`` (relative).
    Returns ``(stop, objective to compare the next one with)``."""
    objective = record.get("objective")
    if objective is None:
        return stop, previous
    if not np.isfinite(objective):
        run.progress.close(record)
        raise FloatingPointError(
            f"The objective became {objective} at round {k + 1}; the iterates "
            "diverged. Lower the step sizes or raise the regularization."
        )
    if tol and previous is not None and abs(previous - objective) <= tol * max(
            abs(previous), 1e-300):
        stop = True
    return stop, objective


def evaluate(protocol, state, clients, n_jobs=None):
    """Sum ``client_metrics`` over every client and combine them on the server.

    A client that fails here raises ``ClientError`` (a partial sum would be a wrong
    objective).
    """
    transport = as_transport(clients, n_jobs=n_jobs, client_states=state.client_states)
    with transport.session(protocol):
        return _evaluate(protocol, state, transport)


def _evaluate(protocol, state, transport, in_round=False, reports=None, exchange=None):
    """The combined metrics; with ``reports`` (two keys of ``client_metrics``) also each
    client's validation report as the ``exchange`` delivered it (plain: ``(sse, count)``
    keyed by client, by a group's first client for grouped clients, whose phase returns the
    group's sums; secure: their masked inputs, the sums from their secure sum) and its bytes
    ``(up, down)``."""
    round_number = state.n_rounds + 1 if in_round else (state.n_rounds or None)
    result, sums = _metrics_of_all(transport, state, round_number)
    if reports is None:
        return protocol.combine_metrics(state.server_state, sums)
    summed, seen, report_bytes = exchange.reports(protocol, transport, result.messages,
                                                  reports, round_number)
    sums.update(summed)
    return protocol.combine_metrics(state.server_state, sums), seen, report_bytes


def _metrics_of_all(transport, state, round_number):
    """``client_metrics`` of every client and their sums: ``(result, sums)``."""
    result = transport.run("client_metrics", list(range(transport.n_clients)), state.broadcast,
                           round_number=round_number)
    for client, exc in result.failures.items():
        raise _client_error("client_metrics", client, exc, round_number) from exc
    sums = {}
    for metrics in result.messages.values():  # client order: n_jobs-independent
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
    return result, sums


def _panel_of_all(run, state):
    """Whether the panel holds every client in a plain fit: the evaluation is then the one
    of every client (the same reports; the grouped simulation's batched sums, not one
    per-client call each). Under secure aggregation the panel's blocks stay sums of at most
    a round's clients."""
    return (state.panel is not None and len(state.panel) == run.transport.n_clients
            and not run.exchange.secure)


def _evaluate_panel(run, state):
    """:func:`_evaluate` of a fit whose validation is a panel of clients: the simulation's
    diagnostics over every client as before (uncounted), the validation report's keys summed
    over the panel only (:func:`~sklearn_fedmf.engine._panel.panel_reports`);
    ``validation_clients`` in the record."""
    round_number = state.n_rounds + 1
    _, sums = _metrics_of_all(run.transport, state, round_number)
    panel_sums, seen, report_bytes = panel_reports(run, state, round_number, _client_error)
    sums.update(panel_sums)
    metrics = run.protocol.combine_metrics(state.server_state, sums)
    return {**metrics, "validation_clients": len(state.panel)}, seen, report_bytes


def _last_objective(history):
    for record in reversed(history):
        if "objective" in record:
            return record["objective"]
    return None
