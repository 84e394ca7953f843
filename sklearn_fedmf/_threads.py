"""One thread in a native thread pool (BLAS or OpenMP), through one cached controller.

``threadpoolctl.threadpool_limits`` looks up the loaded libraries at each call by reading
``/proc/self/maps`` on Linux, which numba's compiled kernels make long: 3 to 4 ms a call,
once per fit and per k-FED seeding. The controller looks them up once, at the first call
(after the package's imports, which load every BLAS and OpenMP library it uses), as
scikit-learn does for its own limits.
"""

from functools import lru_cache

from threadpoolctl import ThreadpoolController


@lru_cache(maxsize=1)
def _controller():
    return ThreadpoolController()


def one_thread(user_api):
    """Context manager: the ``user_api`` (``"blas"`` or ``"openmp"``) libraries run one
    thread inside it, as ``threadpool_limits(limits=1, user_api=user_api)``."""
    return _controller().limit(limits=1, user_api=user_api)
