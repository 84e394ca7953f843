"""One thread in a native thread pool (BLAS or OpenMP), through a cached controller.

``threadpoolctl.threadpool_limits`` looks up the loaded libraries at each call by reading
``/proc/self/maps`` on Linux, which numba's compiled kernels make long: 3 to 4 ms a call,
once per fit and per k-FED seeding. The controller looks them up once, as scikit-learn does
for its own limits, and again after any import (a native library is loaded by the import of
an extension module, e.g. numba's OpenMP threading layer at its first parallel kernel), so
that it limits the same libraries as ``threadpool_limits``.
"""

import sys

from threadpoolctl import ThreadpoolController

_cached = (None, None)  # (len(sys.modules) when made, the controller)


def _controller():
    global _cached
    n_modules = len(sys.modules)
    if _cached[0] != n_modules:
        _cached = (n_modules, ThreadpoolController())
    return _cached[1]


def one_thread(user_api):
    """Context manager: the ``user_api`` (``"blas"`` or ``"openmp"``) libraries run one
    thread inside it, as ``threadpool_limits(limits=1, user_api=user_api)``."""
    return _controller().limit(limits=1, user_api=user_api)
