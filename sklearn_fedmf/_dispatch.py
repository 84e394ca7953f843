"""Where the engine's client tasks run: batching, threads, joblib backends and Dask placement.

:func:`dispatch` runs a task on batches of clients and returns the results in batch order,
so nothing downstream depends on which worker ran what or when it finished:

* one batch runs in the calling thread;
* by default (or under joblib's threading backend) batches go to one thread pool per engine
  call (:func:`engine_call`): joblib's result loop polls every 10 ms, more than a whole
  round of a small problem;
* any other joblib backend gets them through ``sklearn.utils.parallel.Parallel``;
* under :func:`resident_blocks` (Dask) each client block lives on one worker for the whole
  fit and tasks carry its key instead of the data.
"""

from __future__ import annotations

import functools
import inspect
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from sklearn import config_context, get_config
from sklearn.utils.parallel import Parallel, delayed

from ._joblib_backend import dask_client, uses_threads

__all__ = ["dispatch", "resident_blocks", "engine_call"]

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


def dispatch(task, items, weights, n_jobs, n_jobs_eff, *args):
    """Run ``task(batch, *args)`` on batches of ``items`` (tuples ``(client, state, block,
    ...)``); results in batch order.

    A single batch runs in this thread. Several run on a thread pool by default (or under
    joblib's threading backend), else through joblib with the configured backend. Inside
    :func:`resident_blocks` (Dask) the items carry the key of their block on the cluster
    instead of the block, and batches follow the blocks' home workers.
    """
    placement = _placement.get()
    homes = None if placement is None else placement.home[[it[0] for it in items]]
    own_threads = placement is None and uses_threads()
    # A task on our own pool costs ~25 us: one per client while the clients are few (a round's
    # sample; best balance), else ~2 per worker as for joblib, whose tasks cost more.
    few = own_threads and len(items) <= 8 * n_jobs_eff
    batches = _batches(items, n_jobs_eff, weights, homes, per_worker=8 if few else 2)
    if len(batches) == 1:
        return [task(batches[0], *args)]
    if placement is not None:
        batches = [[(it[0], it[1], placement.futures[it[0]], *it[3:]) for it in b]
                   for b in batches]
        parts = Parallel(n_jobs=n_jobs)(delayed(_aligned_call)(task, b, *args) for b in batches)
        return _aligned(parts)
    if own_threads:
        # Our own threads: joblib's result loop polls every 10 ms, more than a whole round of
        # a small problem (measured: 13 ms per call against 0.07 ms on a running pool).
        config = get_config()  # thread-local in scikit-learn: hand it over as Parallel does

        def run(batch):
            with config_context(**config):
                return task(batch, *args)

        with _thread_pool(min(n_jobs_eff, len(batches))) as pool:
            return list(pool.map(run, batches))
    return Parallel(n_jobs=n_jobs, prefer="threads")(delayed(task)(b, *args) for b in batches)


# One thread pool for a whole engine call (a fit): starting one per round costs 0.3 ms.
_pools: ContextVar[dict | None] = ContextVar("sklearn_fedmf_pools", default=None)


@contextmanager
def _shared_thread_pools():
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


def _aligned_call(task, *args):
    return task(*_aligned(args))


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
@dataclass(frozen=True)
class _Placement:
    blocks: list  # the driver's blocks (identity tells which fit the placement serves)
    futures: list  # one dask Future per client
    home: np.ndarray  # index of the worker holding each client's block


_placement: ContextVar[_Placement | None] = ContextVar("sklearn_fedmf_placement", default=None)


@contextmanager
def resident_blocks(blocks):
    """Keep the client ``blocks`` on the Dask workers for the body of the ``with``.

    Under ``joblib.parallel_config(backend="dask")`` each block is sent once to one worker
    (its home; clients are assigned contiguously, balanced by stored entries and worker
    cores); the engine calls inside the ``with`` (:func:`initialize_federation`,
    :func:`run_federation`, :func:`evaluate`) then pass its key, not the data, and never mix
    two homes in one task, so the scheduler runs each task where its data already is. Only
    client states, broadcasts and uploads cross the network each round. A nested call with
    the same blocks reuses the outer placement; with any other backend this does nothing.
    The blocks are released from the cluster when the ``with`` ends.
    """
    current = _placement.get()
    client = dask_client()
    cores = {} if client is None else client.ncores()
    if not cores or (current is not None and _same_blocks(current.blocks, blocks)):
        yield  # not on Dask, no worker yet (joblib waits for one), or already resident
        return
    workers = sorted(cores)
    share = np.cumsum([cores[w] for w in workers], dtype=float)
    cum = np.cumsum([_weight(b) for b in blocks], dtype=float)
    home = np.searchsorted(share / share[-1], (cum - 0.5 * np.diff(cum, prepend=0)) / cum[-1])
    home = np.minimum(home, len(workers) - 1)
    futures = [None] * len(blocks)
    for w, address in enumerate(workers):
        mine = np.flatnonzero(home == w)
        if mine.size:
            sent = client.scatter([blocks[c] for c in mine], workers=[address], hash=False)
            for c, future in zip(mine, sent):  # realigned once, where the block lives
                futures[c] = client.submit(_aligned, future, workers=[address], pure=False)
    token = _placement.set(_Placement(list(blocks), futures, home))
    try:
        yield
    finally:
        _placement.reset(token)
        client.cancel(futures)


def engine_call(fn):
    """Decorate an engine entry point: ``fn`` runs inside :func:`resident_blocks` of its
    ``blocks`` argument, and its dispatches share one thread pool."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with resident_blocks(signature.bind(*args, **kwargs).arguments["blocks"]), \
                _shared_thread_pools():
            return fn(*args, **kwargs)

    return wrapper


def _same_blocks(a, b):
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _weight(block):
    return getattr(block, "nnz", 0) + getattr(block, "n_rows", 0) + 1
