"""sklearn_fedmf: federated matrix factorization and completion as scikit-learn estimators."""

from .binary import AggregatedBMF, Felb
from .completion import FedMCADMM, RFRec

__version__ = "0.1.0"

__all__ = ["AggregatedBMF", "FedMCADMM", "Felb", "RFRec", "__version__"]
