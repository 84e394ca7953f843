"""The package's numba kernels compiled once per test run, shared out between xdist workers.

With a cold numba cache (a fresh clone: ``@njit(cache=True)`` writes to ``__pycache__``) the
first call of a kernel compiles it, and two workers that reach a kernel at about the same time
both compile it (the on-disk cache is read only when it is already there). Each worker therefore
starts (root ``conftest.py``, after its collection) by running tiny fits, one *family* of
kernels at a time, and claims a family before it runs it (an exclusive file creation), so
that the two workers compile different families side by side and then load each other's
from the cache. Worker ``gw0`` takes the families in the order below and the other workers
from the end, so that they meet in the middle. Nothing here asserts anything: a family that
no longer compiles a kernel the tests use only costs its fit, and a kernel that no family
reaches is compiled by its first test, as without this module. The fits are tiny, so the
warm-up costs about two seconds with a warm cache.
"""

import os
import warnings
from contextlib import contextmanager

import numpy as np
import scipy.sparse as sp


@contextmanager
def _grouped(on=True):
    """The engine's grouped clients (one-user clients in batched groups) from one client on."""
    from sklearn_fedmf.engine import _dispatch, _fit

    saved = _fit.GROUP_MIN_CLIENTS, _dispatch.MIN_PARALLEL_WORK
    _fit.GROUP_MIN_CLIENTS = 1 if on else saved[0]
    _dispatch.MIN_PARALLEL_WORK = 0
    try:
        yield
    finally:
        _fit.GROUP_MIN_CLIENTS, _dispatch.MIN_PARALLEL_WORK = saved


def _ratings(dtype=np.float64):
    from sklearn_fedmf.datasets import make_ratings

    return make_ratings(40, 15, 300, n_components=2, random_state=0).X.tocsr().astype(dtype)


def _interactions():
    rng = np.random.default_rng(0)
    mask = rng.random((40, 15)) < 0.3
    return sp.csr_matrix(np.where(mask, rng.integers(1, 6, mask.shape), 0).astype(float))


def _use(model, X, *, predict=False):
    """Fit per client, then in groups with one client per user; with ``predict``, every way to
    use the fit too (the fold-in and pair kernels, which the completion estimators of a loss
    share: a single family compiles them)."""
    evaluated = {} if model.get_params().get("loss") == "implicit" else {"eval_set": X}
    with _grouped(False):
        model.fit(X, **evaluated)
    if predict:
        model.inverse_transform(model.transform(X[:5]))
        model.predict(X[:5])
        model.score(X)
    with _grouped(True):
        model.fit(X, clients=np.arange(X.shape[0]), **evaluated)


def fedmc_admm():
    from sklearn_fedmf import FedMCADMM

    _use(FedMCADMM(n_components=2, n_clients=4, max_iter=2, random_state=0), _ratings(),
         predict=True)


def fedmc_admm_float32():
    from sklearn_fedmf import FedMCADMM

    FedMCADMM(n_components=1, n_clients=2, max_iter=2, random_state=0).fit(
        _ratings(np.float32))


def fedmavg():
    from sklearn_fedmf import FedMAvg

    _use(FedMAvg(n_components=2, n_clients=4, max_iter=2, random_state=0), _ratings())


def fedmavg_implicit():
    from sklearn_fedmf import FedMAvg

    _use(FedMAvg(loss="implicit", n_components=2, n_clients=4, max_iter=2, random_state=0,
                 solver_params={"dropout": 0.2}), _interactions(), predict=True)


def fedmgs():
    from sklearn_fedmf import FedMGS

    _use(FedMGS(n_components=2, n_clients=4, max_iter=2, random_state=0), _ratings())


def fedmgs_implicit():
    from sklearn_fedmf import FedMGS

    _use(FedMGS(loss="implicit", n_components=2, n_clients=4, max_iter=2, random_state=0),
         _interactions())


def rfrec():
    from sklearn_fedmf import RFRec

    _use(RFRec(n_components=2, n_clients=4, max_iter=2, random_state=0), _ratings())


def felb():
    from sklearn_fedmf import Felb
    from sklearn_fedmf.datasets import make_binary_tiles

    X = make_binary_tiles(40, 15, 3, random_state=0).X
    model = Felb(n_components=2, n_clients=4, max_iter=2, random_state=0).fit(X)
    model.inverse_transform(model.transform(X[:5]))


FAMILIES = [fedmc_admm, fedmavg_implicit, fedmgs, felb, rfrec, fedmgs_implicit, fedmavg,
            fedmc_admm_float32]


def warm_share(folder, worker, n_workers):
    """Run the families not yet claimed in ``folder`` (shared by the workers of one run),
    ``worker`` (0 to ``n_workers - 1``) from the start of the list if 0, else from the end."""
    families = FAMILIES if worker == 0 else FAMILIES[::-1]
    for family in families:
        try:
            os.close(os.open(os.path.join(folder, f"warm-{family.__name__}"),
                             os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue  # claimed by another worker
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            family()
