"""Where the engine's client tasks run: batching, threads, joblib backends and Dask placement.

:func:`dispatch` runs a task on batches of clients and returns the results in batch order,
so nothing downstream depends on which worker ran what or when it finished:

* one batch runs in the calling thread;
* by default (or under joblib's threading backend) batches go to one thread pool per
  transport session (:func:`shared_thread_pools`): joblib's result loop polls every 10 ms,
  more than a whole round of a small problem;
* any other joblib backend gets them through ``sklearn.utils.parallel.Parallel``;
* under :func:`resident_blocks` (Dask) each client block lives on one worker for the whole
  fit and tasks carry its key instead of the data.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from joblib import effective_n_jobs
from sklearn import config_context, get_config
from sklearn.utils.parallel import Parallel, delayed

from ..exceptions import FederationError
from ._joblib_backend import dask_client, uses_threads

__all__ = ["client_call", "dispatch", "resident_blocks", "shared_thread_pools", "workers_of"]


def client_call(fn, *args):
    """``(fn(*args), None)``, or ``(None, exc)`` when the client code raised ``exc``.

    The one place the engine catches what client code raises (anything: a client's data, a
    user's callable, a transport). Nothing is lost: the exception goes back to the engine,
    whose failure policy (``on_client_error``) raises it as a
    :class:`~sklearn_fedmf.exceptions.ClientError` naming the client, phase and round, chained
    to it, or counts the client as failed (``"skip"``, with a warning)."""
    try:
        return fn(*args), None
    except Exception as exc:  # returned to the failure policy, never dropped
        return None, exc


def workers_of(n_jobs):
    """How many workers ``n_jobs`` means under the active joblib backend (joblib's
    ``effective_n_jobs``): the package's one computation of it, made once per fit
    (:attr:`~sklearn_fedmf.engine._fit.FitContext.workers`) and by a transport made without
    ``workers``, once per session."""
    return effective_n_jobs(n_jobs)

# Below this much work (stored ratings plus rows) in a round, dispatching to workers costs
# more than it saves; results do not depend on it (tests set it to 0 to exercise the workers).
MIN_PARALLEL_WORK = 20_000


def _batches(items, n_jobs, weights, homes=None, per_worker=2):
    """Split ``items`` into contiguous batches of similar total weight, ``per_worker`` per
    worker (more batches balance better, each costs a dispatch).

    With ``homes`` (the worker holding each item's block), a batch never spans two homes.
    """
    n_batches = min(len(items), per_worker * n_jobs) if n_jobs > 1 else 1
    if n_batches <= 1 or np.sum(weights) < MIN_PARALLEL_WORK:
        return [items]
    cum = np.cumsum(weights, dtype=float)
    cuts = np.searchsorted(cum, cum[-1] * np.arange(1, n_batches) / n_batches)
    if homes is not None:
        cuts = np.concatenate([cuts, np.flatnonzero(np.diff(homes)) + 1])
    edges = np.unique(np.concatenate([[0], cuts, [len(items)]]))
    return [items[a:b] for a, b in zip(edges[:-1], edges[1:]) if b > a]


def dispatch(task, items, weights, workers, *args, context="a client phase"):
    """Run ``task(batch, *args)`` on batches of ``items`` (tuples ``(client, state, block,
    ...)``) with ``workers`` workers (:func:`workers_of`); results in batch order.

    A single batch runs in this thread. Several run on a thread pool by default (or under
    joblib's threading backend), else through joblib with the configured backend. Inside
    :func:`resident_blocks` (Dask) the items carry the key of their block on the cluster
    instead of the block, batches follow the blocks' home workers, and a lost worker is
    recovered from or reported (:func:`_run_on_dask`); ``context`` names the work in that
    report.
    """
    placement = _placement.get()
    homes = None if placement is None else placement.home[[it[0] for it in items]]
    own_threads = placement is None and uses_threads()
    # A task on our own pool costs ~25 us: one per client while the clients are few (a round's
    # sample; best balance), else ~2 per worker as for joblib, whose tasks cost more.
    few = own_threads and len(items) <= 8 * workers
    batches = _batches(items, workers, weights, homes, per_worker=8 if few else 2)
    if len(batches) == 1:
        return [task(batches[0], *args)]
    if placement is not None:
        return _run_on_dask(placement, task, batches, args, context)
    if own_threads:
        # Our own threads: joblib's result loop polls every 10 ms, more than a whole round of
        # a small problem (measured: 13 ms per call against 0.07 ms on a running pool).
        config = get_config()  # thread-local in scikit-learn: hand it over as Parallel does

        def run(batch):
            with config_context(**config):
                return task(batch, *args)

        with _thread_pool(min(workers, len(batches))) as pool:
            return list(pool.map(run, batches))
    return Parallel(n_jobs=workers, prefer="threads")(delayed(task)(b, *args) for b in batches)


# One thread pool for a whole engine call (a fit): starting one per round costs 0.3 ms.
_pools: ContextVar[dict | None] = ContextVar("sklearn_fedmf_pools", default=None)


@contextmanager
def shared_thread_pools():
    """Let the dispatches inside the ``with`` share their thread pools (made on first use)."""
    if _pools.get() is not None:
        yield
        return
    pools = {}
    token = _pools.set(pools)
    try:
        yield
    finally:
        _pools.reset(token)
        for pool in pools.values():
            pool.shutdown()


@contextmanager
def _thread_pool(n_workers):
    pools = _pools.get()
    if pools is None:
        with ThreadPoolExecutor(n_workers) as pool:
            yield pool
        return
    if n_workers not in pools:
        pools[n_workers] = ThreadPoolExecutor(n_workers)
    yield pools[n_workers]


def _batch_call(task, meta, states, blocks, args):
    """A Dask task: rebuild the batch's items from their parts and run ``task`` on them."""
    items = [(m[0], s, b, *m[1:]) for m, s, b in zip(meta, states, blocks)]
    return task(*_aligned((items, *args)))


def _aligned(obj):
    """``obj`` with every array that arrived unaligned copied to fresh memory.

    Dask cuts arrays out of one network buffer at any byte offset; numpy and BLAS kernels
    round differently on such arrays, which would break bit-identical results.
    """
    if isinstance(obj, np.ndarray):
        return obj.copy(order="K") if obj.ctypes.data % 16 else obj
    if sp.issparse(obj):
        for name in ("data", "indices", "indptr", "row", "col"):
            if isinstance(getattr(obj, name, None), np.ndarray):
                setattr(obj, name, _aligned(getattr(obj, name)))  # a received copy: ours
        return obj
    if type(obj) is dict:
        return {k: _aligned(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_aligned(v) for v in obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a NamedTuple such as a block
        return type(obj)(*(_aligned(v) for v in obj))
    return obj


# ---- client data resident on Dask workers -----------------------------------------------------
# A lost worker takes the blocks that live on it. The driver holds every client state and only
# keeps a batch's results once the batch has finished, so a phase can be re-run exactly: the
# blocks are scattered again to the workers still there and the unfinished batches resubmitted.
_POLL_SECONDS = 0.5  # how often a wait checks that the blocks' workers are still there
_RECOVERIES = 3  # lost-worker recoveries per dispatch before giving up
_WORKER_WAIT_SECONDS = 30.0  # how long to wait for a worker when none is left
_SCATTER_TIMEOUT_SECONDS = _RESULT_TIMEOUT_SECONDS = 120.0
_NOTICE_SECONDS = 5.0  # how long the scheduler may take to see that a worker is gone
_TIMEOUTS = (TimeoutError, asyncio.TimeoutError)  # one class from Python 3.11 on


@dataclass
class _Placement:
    blocks: list  # the driver's blocks (identity tells which fit the placement serves)
    futures: list  # one dask Future per client
    home: np.ndarray  # index of the worker holding each client's block
    workers: list  # the workers' addresses, in ``home`` order
    client: object  # the distributed.Client


_placement: ContextVar[_Placement | None] = ContextVar("sklearn_fedmf_placement", default=None)


def _place(client, blocks, cores):
    """Scatter each block to one worker (contiguous runs of clients, balanced by stored
    entries and worker cores). Returns ``(futures, home, workers)``."""
    workers = sorted(cores)
    share = np.cumsum([cores[w] for w in workers], dtype=float)
    cum = np.cumsum([_weight(b) for b in blocks], dtype=float)
    home = np.searchsorted(share / share[-1], (cum - 0.5 * np.diff(cum, prepend=0)) / cum[-1])
    home = np.minimum(home, len(workers) - 1)
    futures = [None] * len(blocks)
    for w, address in enumerate(workers):
        mine = np.flatnonzero(home == w)
        if mine.size:
            sent = client.scatter([blocks[c] for c in mine], workers=[address], hash=False,
                                  timeout=_SCATTER_TIMEOUT_SECONDS)
            for c, future in zip(mine, sent):  # realigned once, where the block lives
                futures[c] = client.submit(_aligned, future, workers=[address],
                                           allow_other_workers=True, pure=False)
    return futures, home, workers


@contextmanager
def resident_blocks(blocks):
    """Keep the client ``blocks`` on the Dask workers for the body of the ``with``.

    Under ``joblib.parallel_config(backend="dask")`` each block is sent once to one worker
    (its home; clients are assigned contiguously, balanced by stored entries and worker
    cores); the engine calls inside the ``with`` (through
    :class:`~sklearn_fedmf.engine._transport.LocalTransport`) then pass its key, not the data, and
    never mix two homes in one task, so the scheduler runs each task where its data already
    is. Only client states, broadcasts and uploads cross the network each round. If a worker
    is lost, the blocks are scattered again to the workers left and the unfinished work is
    re-run (the same result), or a ``FederationError`` names the lost worker. A nested call
    with the same blocks reuses the outer placement; with any other backend this does nothing.
    The blocks are released from the cluster when the ``with`` ends.
    """
    current = _placement.get()
    client = dask_client()
    cores = {} if client is None else client.ncores()
    if not cores or (current is not None and _same_blocks(current.blocks, blocks)):
        yield  # not on Dask, no worker yet (joblib waits for one), or already resident
        return
    placement = _Placement(list(blocks), *_place(client, blocks, cores), client)
    token = _placement.set(placement)
    try:
        yield
    finally:
        _placement.reset(token)
        client.cancel(placement.futures)


def _replace_lost_blocks(placement, lost, context):
    """Scatter every block again over the workers there now (after ``lost`` went away)."""
    client, waited = placement.client, 0.0
    cores = client.ncores()
    while not cores and waited < _WORKER_WAIT_SECONDS:  # a nanny may be restarting one
        time.sleep(_POLL_SECONDS)
        waited += _POLL_SECONDS
        cores = client.ncores()
    if not cores:
        raise FederationError(
            f"Lost Dask worker(s) {', '.join(sorted(lost))} during {context}, and no worker "
            f"came back within {_WORKER_WAIT_SECONDS:.0f} s."
        )
    client.cancel(placement.futures)
    placement.futures, placement.home, placement.workers = _place(client, placement.blocks,
                                                                  cores)


def _lost_workers(placement, wait=0.0):
    """The placement's workers the scheduler no longer knows; with ``wait``, give it that
    long to notice (a connection to a dying worker can break before the scheduler sees it)."""
    stop = time.monotonic() + wait
    while True:
        alive = set(placement.client.ncores())
        lost = {w for w in placement.workers if w not in alive}
        if lost or time.monotonic() >= stop:
            return lost
        time.sleep(_POLL_SECONDS / 5)


def _wait_bounded(placement, futures):
    """Wait for ``futures`` until all are done, or until a worker holding blocks is gone
    (then the unfinished ones will never finish as they should)."""
    from distributed import wait

    while True:
        try:
            wait(futures, timeout=_POLL_SECONDS)
            return set()
        except _TIMEOUTS:
            lost = _lost_workers(placement)
            if lost:
                return lost


def _run_on_dask(placement, task, batches, args, context):
    """Run the batches on the workers holding their blocks; recover from a lost worker.

    Only finished batches are kept; after a loss the blocks are placed again and the other
    batches resubmitted, so the results are exactly those of a run without the loss. After
    ``_RECOVERIES`` losses in one dispatch, or without any worker left, a ``FederationError``
    names the lost workers and ``context``.
    """
    from distributed import CancelledError
    from distributed.scheduler import KilledWorker

    loss = (CancelledError, OSError, *_TIMEOUTS, KilledWorker)  # what a lost worker raises
    client = placement.client
    results, pending, lost_all = [None] * len(batches), list(range(len(batches))), set()
    for attempt in range(_RECOVERIES + 1):
        try:
            shared = client.scatter([args], hash=False, timeout=_SCATTER_TIMEOUT_SECONDS)[0]
            futures = []
            for i in pending:
                batch = batches[i]
                home = placement.workers[placement.home[batch[0][0]]]
                states = client.scatter([[it[1] for it in batch]], workers=[home], hash=False,
                                        timeout=_SCATTER_TIMEOUT_SECONDS)[0]
                futures.append(client.submit(
                    _batch_call, task, [(it[0], *it[3:]) for it in batch], states,
                    [placement.futures[it[0]] for it in batch], shared,
                    key=f"batch_of_clients-{uuid.uuid4().hex}", pure=False,
                    workers=[home], allow_other_workers=True,  # where its blocks live
                ))
            lost = _wait_bounded(placement, futures)
        except (*loss, KeyError):  # a scatter to a worker going (or gone: the scheduler's
            # KeyError for an unknown worker) is retried like a lost batch
            futures, lost = [], _lost_workers(placement, wait=_NOTICE_SECONDS)
        still = []
        for i, future in zip(pending, futures):
            if future.status == "finished":
                try:
                    results[i] = future.result(timeout=_RESULT_TIMEOUT_SECONDS)
                    continue
                except loss:  # the result went with its worker before it was fetched
                    pass
            elif (future.status == "error" and not isinstance(future.exception(), loss)
                  and not lost and not _lost_workers(placement)):
                future.result()  # a genuine error of the task itself (not client code): raise
            still.append(i)
        still += pending[len(futures):]
        client.cancel([f for f in futures if f.status != "finished"])
        if not still:
            return _aligned(results)
        lost_all |= lost | _lost_workers(placement)
        if attempt < _RECOVERIES:
            try:
                _replace_lost_blocks(placement, lost_all, context)
            except loss:  # another worker went while the blocks were sent: the next attempt
                lost_all |= _lost_workers(placement, wait=_NOTICE_SECONDS)
        pending = still
    raise FederationError(
        f"Lost Dask worker(s) {', '.join(sorted(lost_all)) or '(unknown)'} during {context}; "
        f"the work could not be completed after {_RECOVERIES} re-scatters of the blocks."
    )


def _same_blocks(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _weight(block):
    return getattr(block, "nnz", 0) + getattr(block, "n_rows", 0) + 1
