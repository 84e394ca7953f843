"""sklearn_fedmf: federated matrix factorization and completion as scikit-learn estimators."""

from .completion import FedMCADMM, RFRec

__version__ = "0.1.0"

__all__ = ["FedMCADMM", "RFRec", "__version__"]
