"""The engine's dispatch: results do not depend on the backend, and the default thread path
does not go through joblib's result loop (which polls every 10 ms: more than a small round)."""

import threading
from contextlib import nullcontext

import numpy as np
import pytest
from joblib import parallel_config

from sklearn_fedmf import FedMCADMM, FedMGS
from sklearn_fedmf.engine import _client_data as _data
from sklearn_fedmf.engine import _dispatch, _fit, _transport
from sklearn_fedmf.engine import _federation as _engine
from sklearn_fedmf.engine._client_data import check_ratings, split_clients
from sklearn_fedmf.engine._joblib_backend import fit_workers


def _problem():
    rng = np.random.default_rng(3)
    M = rng.normal(size=(150, 3)) @ rng.normal(size=(3, 60))
    return np.where(rng.random(M.shape) < 0.4, M, np.nan)


PARAMS = dict(n_components=3, n_clients=6, clients_per_round=4, max_iter=4, local_iter=3,
              random_state=0)


def _strip(history):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


@pytest.mark.parametrize("backend", [None, "threading", "loky"])
def test_backends_reproduce_the_sequential_fit(backend):
    X = _problem()
    ref = FedMCADMM(n_jobs=1, **PARAMS).fit(X)
    with parallel_config(backend=backend) if backend else nullcontext():
        par = FedMCADMM(n_jobs=2, **PARAMS).fit(X)
    np.testing.assert_array_equal(par.components_, ref.components_)
    np.testing.assert_array_equal(par.user_factors_, ref.user_factors_)
    assert _strip(par.history_) == _strip(ref.history_)


def test_default_threads_bypass_joblib_parallel(monkeypatch):
    class NoParallel:
        def __init__(self, *args, **kwargs):
            raise AssertionError("the default thread path must not build a joblib Parallel")

    threads, running, peak, lock = set(), [0], [0], threading.Lock()
    real = _transport._run_clients

    def recording(items, *args):
        with lock:
            threads.add(threading.get_ident())
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        try:
            return real(items, *args)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(_dispatch, "Parallel", NoParallel)
    monkeypatch.setattr(_transport, "_run_clients", recording)
    FedMCADMM(n_jobs=2, **PARAMS).fit(_problem())
    assert threads and threading.get_ident() not in threads  # the clients ran on pool threads
    assert peak[0] <= 2  # never more batches at once than n_jobs


def test_n_jobs_none_uses_the_cores_unless_joblib_or_numba_says_fewer():
    import numba
    from joblib import cpu_count

    cores = max(1, min(numba.get_num_threads(), cpu_count(only_physical_cores=True)))
    assert fit_workers(None) == cores
    assert fit_workers(1) == 1 and fit_workers(3) == 3
    with parallel_config(n_jobs=1):  # a joblib setting decides, as for any joblib user
        assert fit_workers(None) == 1
    with parallel_config(backend="threading", n_jobs=3):
        assert fit_workers(None) == 3
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        assert fit_workers(None) == 1
    finally:
        numba.set_num_threads(before)


def test_default_n_jobs_threads_only_large_fits_and_gives_the_same_model(monkeypatch):
    X = check_ratings(_problem())
    model = FedMGS(n_components=3, n_clients=6, max_iter=3, random_state=0)
    assert model._fit_n_jobs(X) is None  # below THREADED_MIN_RATINGS: the calling thread
    assert FedMGS(n_jobs=1)._fit_n_jobs(X) == 1
    monkeypatch.setattr(_fit, "THREADED_MIN_RATINGS", X.nnz)
    assert model._fit_n_jobs(X) == fit_workers(None)
    monkeypatch.setattr(_dispatch, "MIN_PARALLEL_WORK", 0)  # (dispatch even these rounds)
    threaded = model.fit(X)
    ref = FedMGS(n_components=3, n_clients=6, max_iter=3, random_state=0, n_jobs=1).fit(X)
    np.testing.assert_array_equal(threaded.components_, ref.components_)
    np.testing.assert_array_equal(threaded.user_factors_, ref.user_factors_)
    assert _strip(threaded.history_) == _strip(ref.history_)


def test_one_thread_pool_per_engine_call(monkeypatch):
    # Starting a pool costs 0.3 ms, a sizable part of a small round: the rounds (and the
    # evaluations) of one run_federation call share one pool.
    made = []

    class CountingPool(_dispatch.ThreadPoolExecutor):
        def __init__(self, *args, **kwargs):
            made.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(_dispatch, "ThreadPoolExecutor", CountingPool)
    model = FedMCADMM(n_jobs=2, **{**PARAMS, "max_iter": 12}).fit(_problem())
    assert model.n_iter_ == 12
    assert 1 <= len(made) <= 2  # initialize_federation, run_federation
    assert all(pool._shutdown for pool in made)  # and none is left running


def test_blocks_cut_on_threads_are_the_blocks_cut_in_order(monkeypatch):
    X = check_ratings(_problem())
    codes = np.random.default_rng(0).integers(0, 7, X.shape[0])
    eval_X = X.copy()
    eval_X.data += 1.0
    serial = split_clients(X, codes, 7, eval_X)
    monkeypatch.setattr(_data, "PARALLEL_SPLIT_NNZ", 0)
    threaded = split_clients(X, codes, 7, eval_X, workers=2)
    assert len(threaded) == len(serial) == 7
    for a, b in zip(serial, threaded):
        np.testing.assert_array_equal(a.rows, b.rows)
        for m, n in ((a.X, b.X), (a.Xt, b.Xt), (a.X_eval, b.X_eval)):
            assert m.shape == n.shape and (m != n).nnz == 0
            np.testing.assert_array_equal(m.indptr, n.indptr)


def test_client_generators_are_made_on_first_use_and_draw_the_keyed_stream():
    lazy = _engine._LazyGenerator(7, _engine._UPDATE_CLIENT, 3, 11)
    assert lazy._generator is None  # nothing built until a client draws
    eager = _engine._rng(7, _engine._UPDATE_CLIENT, 3, 11)
    np.testing.assert_array_equal(lazy.random(5), eager.random(5))
    np.testing.assert_array_equal(lazy.normal(size=(2, 3)), eager.normal(size=(2, 3)))
    assert lazy.integers(1000) == eager.integers(1000)
