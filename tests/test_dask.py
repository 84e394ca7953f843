"""Scale-out on Dask: the estimators run unchanged under ``joblib.parallel_config(backend="dask")``
on a real ``LocalCluster`` (2 worker processes on loopback), reproduce the local ``n_jobs=1`` fit
bit for bit, and send each client's data block to the workers once per fit, not every round."""

import threading
import time

import numpy as np
import pytest
import scipy.sparse as sp
from joblib import parallel_config

distributed = pytest.importorskip(
    "distributed",
    reason="dask[distributed] is the optional 'dask' extra; the 'test' extra (and CI) install it",
)

from sklearn_fedmf import (  # noqa: E402
    AggregatedBMF,
    FederatedClustering,
    FedMAvg,
    FedMCADMM,
    FedMGS,
    Felb,
    RFRec,
)
from sklearn_fedmf.datasets import make_binary_tiles, make_ratings  # noqa: E402
from sklearn_fedmf.engine import _dispatch  # noqa: E402
from sklearn_fedmf.engine import _federation as _engine  # noqa: E402
from sklearn_fedmf.engine._client_data import ClientBlock  # noqa: E402
from sklearn_fedmf.exceptions import FederationError  # noqa: E402


@pytest.fixture(scope="module")
def dask_client():
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
        dashboard_address=None,
    ) as cluster, distributed.Client(cluster) as client:
        yield client


def _ratings():
    data = make_ratings(300, 80, 6000, n_components=3, random_state=0)
    X = data.X.tocsr()
    rng = np.random.default_rng(0)
    held = rng.random(X.nnz) < 0.2
    coo = X.tocoo()
    train = sp.csr_matrix((coo.data[~held], (coo.row[~held], coo.col[~held])), shape=X.shape)
    test = sp.csr_matrix((coo.data[held], (coo.row[held], coo.col[held])), shape=X.shape)
    return train, test


def _fitted_state(model):
    """Every public fitted attribute, and the history without its wall-clock seconds."""
    attrs = {k: v for k, v in vars(model).items()
             if k.endswith("_") and not k.startswith("_") and k != "history_"}
    history = [{k: v for k, v in r.items() if k != "seconds"}
               for r in getattr(model, "history_", [])]
    return attrs, history


def _assert_same_fit(a, b):
    attrs_a, hist_a = _fitted_state(a)
    attrs_b, hist_b = _fitted_state(b)
    assert attrs_a.keys() == attrs_b.keys()
    for key, value in attrs_a.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(value, attrs_b[key], err_msg=key)
        else:
            assert value == attrs_b[key], key
    assert hist_a == hist_b


def test_fedmcadmm_on_dask_reproduces_local_fit_and_scatters_blocks_once(dask_client,
                                                                         monkeypatch):
    X, X_test = _ratings()
    params = dict(n_components=3, n_clients=6, clients_per_round=4, max_iter=5, local_iter=3,
                  beta=0.1, alpha_u=0.1, random_state=0)
    local = FedMCADMM(n_jobs=1, **params).fit(X, eval_set=X_test)

    # Spy on what leaves the driver: every scatter, every dispatch and every task submitted.
    scattered, dispatched, submitted = [], [], []
    real_scatter, real_submit, real_run = (dask_client.scatter, dask_client.submit,
                                           _dispatch._run_on_dask)

    def scatter(data, *args, **kwargs):
        scattered.append(data)
        return real_scatter(data, *args, **kwargs)

    def submit(fn, *args, **kwargs):
        if fn is _dispatch._batch_call:
            submitted.append(args)
        return real_submit(fn, *args, **kwargs)

    def run_on_dask(*args):
        dispatched.append(args)
        return real_run(*args)

    def keep_block_keys(round_index, info):
        block_keys.update(f.key for f in _dispatch._placement.get().futures)

    block_keys = set()
    monkeypatch.setattr(dask_client, "scatter", scatter)
    monkeypatch.setattr(dask_client, "submit", submit)
    monkeypatch.setattr(_dispatch, "_run_on_dask", run_on_dask)
    dask_client.run(_clear_transfer_log)
    with distributed.get_task_stream(dask_client) as stream:
        with parallel_config(backend="dask"):
            remote = FedMCADMM(n_jobs=2, callback=keep_block_keys, **params)
            remote.fit(X, eval_set=X_test)
    remote.set_params(callback=None)

    _assert_same_fit(local, remote)
    assert remote.history_[-1]["eval_rmse"] < local.history_[0]["eval_rmse"]
    # The work ran on both worker processes, not in this one.
    workers = {t["worker"] for t in stream.data if t["key"].startswith("batch_of_")}
    assert len(workers) == 2

    # Blocks left the driver exactly once: one scatter per worker, all clients covered.
    sent_blocks = [b for data in scattered if isinstance(data, list)
                   for b in data if isinstance(b, ClientBlock)]
    assert len(sent_blocks) == 6
    assert len({id(b) for b in sent_blocks}) == 6
    # Init, 5 rounds and 5 evaluations dispatched tasks; none of them carries a block, each
    # task carries the keys of its clients' blocks instead.
    assert len(dispatched) == 11
    assert len(submitted) >= 11
    for _, _, _, blocks, _ in submitted:
        assert blocks and all(isinstance(b, distributed.Future) for b in blocks)
    assert not any(isinstance(a, ClientBlock) for args in submitted for a in _walk(args))
    # Tasks run where their blocks live: the workers exchanged broadcasts, and at most one
    # copy of the block data (when the scheduler moves a task to an idle worker), against
    # 11 copies of the dispatched blocks without residency.
    moved = sum(size for log in dask_client.run(_transfer_log).values()
                for entry in log for key, size in entry.items() if key in block_keys)
    assert len(block_keys) == 6
    assert moved <= sum(_engine.nbytes(list(b)) for b in sent_blocks)
    # The blocks are released from the cluster once the fit is over.
    assert not any(isinstance(x, ClientBlock)
                   for x in dask_client.run(_worker_data_types).values()
                   for x in x)


def _walk(obj):
    yield obj
    if isinstance(obj, (list, tuple)) and not isinstance(obj, ClientBlock):
        for x in obj:
            yield from _walk(x)


def _clear_transfer_log(dask_worker):
    dask_worker.transfer_incoming_log.clear()


def _transfer_log(dask_worker):
    return [entry["keys"] for entry in dask_worker.transfer_incoming_log]


def _worker_data_types(dask_worker):
    return [type(v) for v in dask_worker.data.values()]


def _binary():
    return make_binary_tiles(120, 60, 3, noise=0.02, random_state=0).X


@pytest.mark.parametrize(
    "make, data",
    [
        (lambda: FedMAvg(n_components=3, n_clients=6, clients_per_round=4, max_iter=4,
                         random_state=0), _ratings),
        (lambda: FedMGS(n_components=3, n_clients=6, clients_per_round=4, max_iter=4,
                        random_state=0), _ratings),
        (lambda: RFRec(n_components=3, n_clients=6, clients_per_round=4, max_iter=4,
                       random_state=0), _ratings),
        (lambda: FedMGS(loss="implicit", n_components=3, n_clients=6, clients_per_round=4,
                        max_iter=4, random_state=0), _ratings),
        (lambda: FedMAvg(loss="implicit", n_components=3, n_clients=6, clients_per_round=4,
                         max_iter=4, random_state=0), _ratings),
        (lambda: Felb(n_components=3, n_clients=4, max_iter=4, random_state=0), _binary),
        (lambda: AggregatedBMF(n_components=3, n_clients=4, random_state=0), _binary),
        (lambda: FederatedClustering(n_clusters=3, n_clients=4, max_iter=4, random_state=0),
         _binary),
    ],
    ids=["FedMAvg", "FedMGS", "RFRec", "FedMGS-implicit", "FedMAvg-implicit", "Felb",
         "AggregatedBMF", "FederatedClustering"],
)
def test_estimators_run_unchanged_on_dask(dask_client, make, data):
    X = data()
    X = X[0] if isinstance(X, tuple) else X
    local = make().set_params(n_jobs=1).fit(X)
    with parallel_config(backend="dask"):
        remote = make().set_params(n_jobs=2).fit(X)
    _assert_same_fit(local, remote)


def _exit_soon(delay):
    import os
    import threading

    threading.Timer(delay, os._exit, (1,)).start()  # the process ends, as on a crashed node


def kill_worker(client, address, deadline=15.0):
    """End the worker process at ``address`` and wait (bounded) until the scheduler saw it."""
    client.run(_exit_soon, 0.01, workers=[address])
    stop = time.monotonic() + deadline
    while address in client.ncores():
        assert time.monotonic() < stop, f"worker {address} did not go away"
        time.sleep(0.02)


# Last in the module: it kills a worker of the shared cluster (its nanny starts a new one).
@pytest.mark.slow  # waits for the nanny's new worker process (about 10 CPU seconds)
def test_a_lost_worker_is_recovered_exactly_or_reported(dask_client):
    # A worker process ends mid-fit (between rounds 3 and 4). The fit must either give exactly
    # the fault-free model (the lost blocks are scattered again and the lost work re-run) or
    # stop with a FederationError naming the worker and the round; never a different model,
    # never a hang (the fit runs in a thread with a deadline).
    X, _ = _ratings()
    params = dict(n_components=3, n_clients=8, clients_per_round=6, max_iter=8, local_iter=3,
                  random_state=0)
    reference = FedMCADMM(n_jobs=1, **params).fit(X)
    victim = sorted(dask_client.ncores())[-1]
    outcome = {}

    def kill_after_round_3(round_index, info):
        if round_index == 3:
            kill_worker(dask_client, victim)

    def fit():
        try:
            with parallel_config(backend="dask"):
                outcome["model"] = FedMCADMM(n_jobs=2, callback=kill_after_round_3,
                                             **params).fit(X)
        except FederationError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the fit hung after losing a worker"
    assert outcome, "the fit raised something other than FederationError"
    if "error" in outcome:
        message = str(outcome["error"])
        assert victim in message and "round" in message
    else:
        _assert_same_fit(reference, outcome["model"].set_params(callback=None))
