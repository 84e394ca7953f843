"""sklearn_fedmf: federated matrix factorization and completion as scikit-learn estimators."""

from ._rating_regressor import RatingRegressor
from .binary import AggregatedBMF, Felb
from .cluster import FederatedClustering
from .completion import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RFRec

__version__ = "0.1.0"

__all__ = [
    "AggregatedBMF", "FedBaseline", "FedMAvg", "FedMCADMM", "FedMGS", "FederatedClustering",
    "Felb", "RFRec", "RatingRegressor",
    "__version__",
]
