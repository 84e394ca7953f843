"""The federated engine: rounds, client sampling, parallel local updates, aggregation.

An algorithm is a :class:`FederatedProtocol`: a bundle of pure functions (bind their
hyperparameters with :func:`functools.partial`), no ``self`` and no global random state.
The engine owns everything else: seeds, sampling, joblib dispatch, failures, byte counts,
history, callbacks, early stopping and progress.

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
    uploading (``update_all=True``, e.g. FedMAvg's partial client communication).
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

Every random draw comes from ``numpy.random.SeedSequence(entropy, spawn_key=(kind, round,
client))``, so results do not depend on ``n_jobs``, the joblib backend or the order in which
clients finish.

Under joblib's Dask backend, :func:`resident_blocks` sends each client's data block to one
worker once; the engine's tasks then carry its key instead of the data (see that function).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
from joblib import effective_n_jobs

from ._dispatch import dispatch, engine_call, resident_blocks

__all__ = [
    "FederatedProtocol", "FederationState", "run_federation", "nbytes", "make_entropy",
    "resident_blocks", "sample_clients",
]

_INIT_CLIENT, _UPDATE_CLIENT, _SERVER_ROUND, _INIT_SERVER, _PARTITION = 0, 1, 2, 3, 4
_PREPARE_CLIENT = 5


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
    update_all: bool = False  # non-sampled clients also run client_update (no upload)
    broadcast_to_all: bool = False  # the broadcast reaches every client, not only the sampled
    client_prepare: Callable | None = None  # optional first phase of a round (module doc)
    server_prepare: Callable | None = None
    server_every_round: bool = False  # server_update runs even when no upload arrived
    dropout_mode: str = "offline"  # "upload_loss": a dropped client computes, its upload is lost
    server_counts: bool = False  # server_update receives counts= (draw multiplicities)


@dataclass
class FederationState:
    """Everything a fit needs to continue (``warm_start``)."""

    server_state: Any
    client_states: list
    broadcast: Any
    n_rounds: int = 0
    history: list = field(default_factory=list)


def make_entropy(random_state):
    """Turn an sklearn ``random_state`` into an integer seed for SeedSequence."""
    if random_state is None:
        return int(np.random.SeedSequence().entropy)
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max))
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(np.iinfo(np.int64).max))
    return int(random_state)


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


def partition_rng(entropy):
    """The generator that assigns rows to clients (``partition="random"``)."""
    return _rng(entropy, _PARTITION)


def nbytes(obj):
    """Size in bytes of what a message holds (arrays, sparse matrices, containers, scalars)."""
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if sp.issparse(obj):
        return obj.data.nbytes + obj.indices.nbytes + obj.indptr.nbytes
    if isinstance(obj, dict):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v) for v in obj)
    if isinstance(obj, (int, float, np.number, bool)):
        return 8
    if isinstance(getattr(obj, "nbytes", None), (int, np.integer)):
        return int(obj.nbytes)  # a message type that reports its own size
    raise TypeError(f"Cannot count the bytes of a message part of type {type(obj).__name__}.")


def _run_clients(items, fn, broadcast, entropy, round_index, with_selected, kind=_UPDATE_CLIENT):
    """Run one joblib task: several clients in a row. Failures are caught per client."""
    out = []
    for client, state, block, selected in items:
        rng = _LazyGenerator(entropy, kind, round_index, client)
        try:
            if with_selected:
                new_state, upload = fn(state, block, broadcast, rng, selected)
            else:
                new_state, upload = fn(block, broadcast, rng)
            out.append((client, new_state, upload, None))
        except Exception as exc:  # a failing client must not bring the federation down
            out.append((client, state, None, f"{type(exc).__name__}: {exc}"))
    return out


def _client_phase(fn, items, broadcast, kind, *, state, n_jobs, n_jobs_eff, weights, entropy, k,
                  verbose, label):
    """Run ``fn`` on the clients of ``items``; keep their new states.

    Returns ``({client: message}``, in ascending client order, ``failed clients)``.
    """
    if not items:
        return {}, []
    outcomes = dispatch(
        _run_clients, items, weights[[it[0] for it in items]], n_jobs, n_jobs_eff,
        fn, broadcast, entropy, k, True, kind,
    )
    messages, failed = {}, []
    for client, new_state, message, error in (o for part in outcomes for o in part):
        if error is not None:
            failed.append(client)
            if verbose >= 2:
                print(f"[{label}] round {k + 1}: client {client} failed: {error}",
                      file=sys.stderr)
            continue
        state.client_states[client] = new_state
        if message is not None:
            messages[client] = message
    return dict(sorted(messages.items())), failed


def _metrics_task(items, fn, broadcast):
    return [fn(state, block, broadcast) for _, state, block in items]


@engine_call
def initialize_federation(protocol, blocks, *, entropy, n_jobs=None):
    """Run ``init_server`` and every client's ``init_client``.

    Returns ``(state, (bytes_up, bytes_down))`` of this initial exchange.
    """
    server_state, broadcast = protocol.init_server(_rng(entropy, _INIT_SERVER))
    items = [(c, None, b, True) for c, b in enumerate(blocks)]
    weights = [b.nnz + 1 for b in blocks]

    def task(batch, bcast):
        out = []
        for client, _, block, _ in batch:
            state, upload = protocol.init_client(block, bcast, _rng(entropy, _INIT_CLIENT, client))
            out.append((client, state, upload))
        return out

    parts = dispatch(task, items, weights, n_jobs, effective_n_jobs(n_jobs), broadcast)
    results = [r for part in parts for r in part]
    results.sort(key=lambda r: r[0])
    client_states = [r[1] for r in results]
    uploads = {r[0]: r[2] for r in results if r[2] is not None}
    init_bytes = (sum(nbytes(u) for u in uploads.values()), nbytes(broadcast) * len(blocks))
    if protocol.server_init_uploads is not None:
        server_state, broadcast = protocol.server_init_uploads(server_state, uploads)
    return FederationState(server_state, client_states, broadcast), init_bytes


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


def _sampling_weights(sampling, weights, blocks):
    if sampling not in ("uniform", "weighted"):
        raise ValueError(f'sampling must be "uniform" or "weighted", got {sampling!r}.')
    if sampling == "uniform":
        return None
    if weights is None:  # omega_p = N_p / N, the paper's weights
        weights = [b.n_rows for b in blocks]
    weights = np.asarray(weights, dtype=float)
    if (weights.shape != (len(blocks),) or not np.all(np.isfinite(weights))
            or np.any(weights < 0) or weights.sum() <= 0):
        raise ValueError(
            "sampling_weights must hold one finite nonnegative weight per client, not all zero."
        )
    return weights


@engine_call
def run_federation(
    protocol,
    blocks,
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
    sampling="uniform",
    sampling_weights=None,
):
    """Run ``max_iter`` communication rounds of ``protocol`` on the client ``blocks``.

    Parameters
    ----------
    protocol : FederatedProtocol
    blocks : list of ClientBlock
        One per client, in client order.
    max_iter : int
        Rounds to run in this call (added to ``state.n_rounds`` when warm starting).
    clients_per_round : int, float in (0, 1] or None
        Clients drawn each round (see ``sampling``); None means all.
    entropy : int
        Root seed; round ``k`` and client ``i`` use ``SeedSequence(entropy, (kind, k, i))``.
    n_jobs : int or None
        Workers for the local updates (joblib; threads unless a backend is configured).
    tol : float
        Stop when the relative change of the objective between two evaluations is below
        ``tol`` (0 disables early stopping).
    dropout : float in [0, 1)
        Probability that a sampled client fails in a round (it then contributes nothing and
        keeps its state).
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
    sampling : {"uniform", "weighted"}
        ``"uniform"``: distinct clients without replacement. ``"weighted"``: i.i.d. draws with
        replacement, probabilities proportional to ``sampling_weights`` (:func:`sample_clients`).
        A client drawn twice runs and uploads once (``bytes_uploaded``); the record's
        ``bytes_uploaded_draws`` counts its upload once per draw, the papers' convention.
    sampling_weights : array-like of shape (n_clients,) or None
        ``omega`` of weighted sampling; None means proportional to the clients' rows.

    Returns
    -------
    state : FederationState
        With ``history`` extended by one record per round.
    """
    n_clients = len(blocks)
    n_sampled = _n_sampled(clients_per_round, n_clients)
    omega = _sampling_weights(sampling, sampling_weights, blocks)
    n_jobs_eff = effective_n_jobs(n_jobs)
    weights = np.array([b.nnz + b.n_rows for b in blocks], dtype=float)
    init_up, init_down = init_bytes
    progress = _Progress(label, max_iter, verbose)
    previous_objective = _last_objective(state.history)
    start_round = state.n_rounds

    for k in range(start_round, start_round + max_iter):
        tic = time.perf_counter()
        server_rng = _rng(entropy, _SERVER_ROUND, k)
        sampled, counts = sample_clients(server_rng, n_clients, n_sampled, sampling, omega)
        failing = server_rng.random(len(sampled)) < dropout if dropout else []
        dropped = set(sampled[failing].tolist()) if dropout else set()
        selected = set(sampled.tolist())
        run = range(n_clients) if protocol.update_all else sampled
        items = [
            (int(c), state.client_states[c], blocks[c],
             int(c) in selected and int(c) not in dropped)
            for c in run
            if int(c) not in dropped or protocol.dropout_mode == "upload_loss"
        ]
        phase = dict(state=state, n_jobs=n_jobs, n_jobs_eff=n_jobs_eff, weights=weights,
                     entropy=entropy, k=k, verbose=verbose, label=label)
        broadcast, stats, failed = state.broadcast, {}, []
        if protocol.client_prepare is not None:
            stats, failed = _client_phase(protocol.client_prepare, items, broadcast,
                                          _PREPARE_CLIENT, **phase)
            items = [(c, state.client_states[c], b, sel) for c, _, b, sel in items
                     if c not in failed]
            state.server_state, broadcast = protocol.server_prepare(state.server_state, stats, k)
        uploads, failed_update = _client_phase(protocol.client_update, items, broadcast,
                                               _UPDATE_CLIENT, **phase)
        uploads = {c: u for c, u in uploads.items() if c in selected}
        failures = len(dropped) + len(failed) + len(failed_update)
        recipients = n_clients if protocol.broadcast_to_all else len(sampled)
        bytes_down = nbytes(state.broadcast) * recipients
        bytes_up = sum(nbytes(u) for u in uploads.values())
        if protocol.client_prepare is not None:
            bytes_down += nbytes(broadcast) * recipients
            bytes_up += sum(nbytes(s) for s in stats.values())
        drawn = dict(zip(sampled.tolist(), counts.tolist()))
        if uploads or protocol.server_every_round:
            extra = {"counts": {c: drawn[c] for c in uploads}} if protocol.server_counts else {}
            state.server_state, state.broadcast = protocol.server_update(
                state.server_state, uploads, k, **extra
            )
        seconds = time.perf_counter() - tic

        record = {
            "round": k + 1,
            "n_sampled": n_sampled,
            "n_failed": failures,
            "bytes_uploaded": bytes_up + (init_up if k == start_round else 0),
            "bytes_downloaded": bytes_down + (init_down if k == start_round else 0),
            "seconds": seconds,
        }
        if sampling == "weighted":
            record["n_distinct"] = len(sampled)
            record["bytes_uploaded_draws"] = record["bytes_uploaded"] + sum(
                (drawn[c] - 1) * nbytes(u) for c, u in uploads.items())
        last = k == start_round + max_iter - 1
        if eval_every and ((k + 1) % eval_every == 0 or last):
            record.update(evaluate(protocol, state, blocks, n_jobs))
        state.history.append(record)
        state.n_rounds = k + 1
        progress.update(record)

        stop = False
        if callback is not None:
            info = {
                "server_state": state.server_state,
                "broadcast": state.broadcast,
                "sampled": sampled,
                "counts": counts,
                "uploads": uploads,
                "stats": stats,
                "record": record,
            }
            stop = bool(callback(k + 1, info))
        objective = record.get("objective")
        if objective is not None:
            if not np.isfinite(objective):
                progress.close()
                raise FloatingPointError(
                    f"The objective became {objective} at round {k + 1}; the iterates diverged. "
                    "Lower the step sizes or raise the regularization."
                )
            if (
                tol
                and previous_objective is not None
                and abs(previous_objective - objective)
                <= tol * max(abs(previous_objective), 1e-300)
            ):
                stop = True
            previous_objective = objective
        if stop:
            break
    progress.close()
    return state


@engine_call
def evaluate(protocol, state, blocks, n_jobs=None):
    """Sum ``client_metrics`` over every client and combine them on the server."""
    items = [(c, s, b) for c, (s, b) in enumerate(zip(state.client_states, blocks))]
    weights = np.array([b.nnz + 1 for b in blocks], dtype=float)
    parts = dispatch(
        _metrics_task, items, weights, n_jobs, effective_n_jobs(n_jobs),
        protocol.client_metrics, state.broadcast,
    )
    sums = {}
    for metrics in (m for part in parts for m in part):  # client order: n_jobs-independent
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
    return protocol.combine_metrics(state.server_state, sums)


def _last_objective(history):
    for record in reversed(history):
        if "objective" in record:
            return record["objective"]
    return None


class _Progress:
    """A dependency-free progress bar on stderr (verbose=1) or a line per round (verbose>=2)."""

    def __init__(self, label, total, verbose):
        self.label, self.total, self.verbose = label, total, verbose
        self.done, self.t0 = 0, time.perf_counter()

    def update(self, record):
        self.done += 1
        if not self.verbose:
            return
        extra = ""
        for key in ("objective", "train_rmse", "eval_rmse"):
            if key in record:
                extra += f" {key}={record[key]:.4g}"
        elapsed = time.perf_counter() - self.t0
        if self.verbose >= 2:
            print(f"[{self.label}] round {record['round']}{extra} ({elapsed:.1f}s)",
                  file=sys.stderr)
            return
        width = 30
        filled = int(width * self.done / max(self.total, 1))
        bar = "#" * filled + "-" * (width - filled)
        print(f"\r{self.label:>10} [{bar}] {self.done}/{self.total}{extra} {elapsed:.1f}s",
              end="", file=sys.stderr, flush=True)

    def close(self):
        if self.verbose == 1 and self.done:
            print(file=sys.stderr, flush=True)
