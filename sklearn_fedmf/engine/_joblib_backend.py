"""Which joblib backend is active: the package's only use of joblib's private API.

The engine chooses how to run a round's client tasks from the backend a
``joblib.parallel_config`` block selected (see :mod:`sklearn_fedmf.engine._dispatch`): its own
thread pool under the threading backend (joblib's result loop polls every 10 ms, more than a
whole round of a small problem), and resident client blocks under Dask. joblib has no public
way to ask for the active backend, so the two names it keeps private are imported here and
nowhere else; if a joblib release moves them, this module is the one to change (the tests of
``tests/test_backends.py`` and ``tests/test_dask.py`` fail first).
"""

import sys

import numba
from joblib import cpu_count, effective_n_jobs
from joblib._parallel_backends import ThreadingBackend  # private: no public equivalent
from joblib.parallel import (  # private: see fit_workers
    _backend,
    default_parallel_config,
    get_active_backend,  # not exported by joblib's __init__
)

__all__ = ["uses_threads", "dask_client", "fit_workers"]


def uses_threads():
    """Whether the active backend is joblib's threading backend (threads when none is set)."""
    return isinstance(get_active_backend(prefer="threads")[0], ThreadingBackend)


def dask_client():
    """The ``distributed.Client`` of an active joblib Dask backend, else None."""
    dask_backend = sys.modules.get("joblib._dask")  # loaded only once a Dask backend is used
    if dask_backend is None:
        return None
    backend, _ = get_active_backend()
    return backend.client if isinstance(backend, dask_backend.DaskDistributedBackend) else None


def fit_workers(n_jobs):
    """How many workers a fit's clients and kernels use for its ``n_jobs``: joblib's
    ``effective_n_jobs``, except for ``n_jobs=None`` outside any joblib setting (no
    ``parallel_config`` or ``parallel_backend`` block, not inside a joblib worker): then
    numba's thread count, at most the physical cores, as scikit-learn's OpenMP estimators
    use every core by default. numba's count is the machine's unless ``NUMBA_NUM_THREADS``
    or ``numba.set_num_threads`` lowers it; joblib lowers it in its worker processes
    (``GridSearchCV(n_jobs=...)``), so that nested fits do not oversubscribe the cores."""
    configured = getattr(_backend, "config", default_parallel_config) is not \
        default_parallel_config  # (joblib's own test of an active setting)
    if n_jobs is None and not configured:
        return max(1, min(numba.get_num_threads(), cpu_count(only_physical_cores=True)))
    return effective_n_jobs(n_jobs)
