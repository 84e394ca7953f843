"""pytest configuration shared by the test suite and the doctests of the package.

``python -m pytest`` collects ``tests/`` and the docstring examples of every module of
``sklearn_fedmf`` (``--doctest-modules`` in ``pyproject.toml``). A module that needs an
optional dependency which is not installed is left out of the doctests instead of breaking
the collection; its tests say themselves what they need.
"""

import importlib

import pytest

OPTIONAL = {"cryptography", "dask", "distributed", "matplotlib", "flwr", "tqdm"}


def pytest_ignore_collect(collection_path, config):
    if collection_path.suffix != ".py" or "sklearn_fedmf" not in collection_path.parts:
        return None
    parts = collection_path.parts[collection_path.parts.index("sklearn_fedmf"):]
    module = ".".join(parts).removesuffix(".py").removesuffix(".__init__")
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
