"""sklearn_fedmf: federated matrix factorization and completion as scikit-learn estimators."""

import importlib

__version__ = "0.1.0"

# The estimators are imported on first use (PEP 562), so that ``import sklearn_fedmf`` and the
# ``fedmf --help`` of the command line stay fast: they import scikit-learn and numba.
_LAZY = {
    "AggregatedBMF": ".binary",
    "FedBaseline": ".completion",
    "FedBlend": ".completion",
    "FedMAvg": ".completion",
    "FedMCADMM": ".completion",
    "FedMGS": ".completion",
    "FederatedClustering": ".cluster",
    "Felb": ".binary",
    "RFRec": ".completion",
    "RatingRegressor": "._rating_regressor",
}

__all__ = [*sorted(_LAZY), "__version__"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value  # later lookups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})
