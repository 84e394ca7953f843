"""pytest configuration shared by the test suite and the doctests of the package.

``python -m pytest`` collects ``tests/`` and the docstring examples of every module of
``sklearn_fedmf`` (``--doctest-modules`` in ``pyproject.toml``). A module that needs an
optional dependency which is not installed is left out of the doctests instead of breaking
the collection; its tests say themselves what they need.
"""

import importlib
from pathlib import Path

import pytest

OPTIONAL = {"cryptography", "dask", "distributed", "matplotlib", "flwr", "tqdm"}

# The package beside this file. Module names are taken relative to its parent, never from
# the folder names above it: a checkout may itself be called ``sklearn_fedmf``.
PACKAGE_DIR = Path(__file__).resolve().parent / "sklearn_fedmf"


def _module_name(path):
    """``sklearn_fedmf.a.b`` for ``<checkout>/sklearn_fedmf/a/b.py``, None outside the package."""
    try:
        relative = Path(path).resolve().relative_to(PACKAGE_DIR)
    except ValueError:
        return None
    return ".".join((PACKAGE_DIR.name, *relative.with_suffix("").parts)).removesuffix(".__init__")


def pytest_ignore_collect(collection_path, config):
    module = _module_name(collection_path) if collection_path.suffix == ".py" else None
    if module is None:
        return None
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in OPTIONAL:
            return True
        raise
    return None


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    """``np`` in every docstring example, as in scikit-learn's."""
    import numpy as np

    doctest_namespace["np"] = np


# The warm-up pays for itself when the selection uses most kernels (the fast set: about 2,400
# tests), not on a single module's tests (test_common.py, the largest: about 600).
WARM_UP_MIN_TESTS = 1000


def pytest_collection_finish(session):
    """In each of several xdist workers running a large selection: compile its share of the
    numba kernels first (``tests/_warm_kernels.py``), so that two workers do not compile the
    same ones."""
    workerinput = getattr(session.config, "workerinput", None)
    if (workerinput is None or workerinput["workercount"] < 2
            or session.config.option.collectonly or len(session.items) < WARM_UP_MIN_TESTS):
        return
    from tests._warm_kernels import warm_share

    folder = Path(session.config.option.basetemp).parent
    warm_share(folder, int(workerinput["workerid"].removeprefix("gw")), workerinput["workercount"])
