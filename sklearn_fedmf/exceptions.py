"""Warnings and errors of sklearn_fedmf.

Every warning the package raises is of one of these classes, so a user can filter each on its
own (``warnings.filterwarnings("ignore", category=UnobservedItemsWarning)``). An estimator
raises each warning at most once per fit.
"""

from sklearn.exceptions import ConvergenceWarning as _SklearnConvergenceWarning

__all__ = [
    "FedMFWarning",
    "UnobservedItemsWarning",
    "DataWarning",
    "ConfigurationWarning",
    "ClientFailureWarning",
    "ConvergenceWarning",
    "DegenerateFitWarning",
    "PrivacyWarning",
    "ClientDropout",
    "ClientError",
    "FederationError",
]


class FedMFWarning(UserWarning):
    """Base class of every warning of sklearn_fedmf."""


class UnobservedItemsWarning(FedMFWarning):
    """Some item columns have no training rating: their predictions are uninformed."""


class DataWarning(FedMFWarning):
    """The input data looks unlike what the caller probably meant (for example a dense integer
    matrix that is mostly zeros while ``missing_values=np.nan``)."""


class ConfigurationWarning(FedMFWarning):
    """A combination of hyperparameters that the method accepts but that is likely to
    misbehave (for example RFRecF's pull strength above 1)."""


class ClientFailureWarning(FedMFWarning):
    """Clients failed during a fit run with ``on_client_error="skip"``; the fit went on
    without them."""


class ConvergenceWarning(_SklearnConvergenceWarning, FedMFWarning):
    """A fit ran all ``max_iter`` rounds without meeting ``tol``. The model is usable; more
    rounds (or a larger ``tol``) would change it. A subclass of scikit-learn's
    :class:`~sklearn.exceptions.ConvergenceWarning`, so scikit-learn's own filters for it
    apply."""


class DegenerateFitWarning(FedMFWarning):
    """A fit ended at a trivial solution: all-zero factors, a factor part that has collapsed
    next to the biases (the model is its biases alone), a frozen model, or an objective that
    did not decrease. Unlike :class:`ConvergenceWarning`, more rounds do not help: the
    settings (usually too strong a regularization) or the data are the cause."""


class PrivacyWarning(FedMFWarning):
    """A privacy budget is reported with a loose bound (for example basic composition when the
    ``privacy`` extra is not installed), or a noise setting gives no protection."""


class ClientDropout(Exception):  # noqa: N818  (a simulated event, not a bug)
    """Raised on purpose by a protocol's client function to simulate a failed client.

    The engine counts the client as failed in that round (``n_failed`` in ``history_``), as
    it does for ``dropout``; any other exception in client code propagates.
    """


class ClientError(RuntimeError):
    """An exception raised in client code, re-raised with the client index and the round."""

    def __init__(self, message, *, client=None, round=None):
        super().__init__(message)
        self.client = client
        self.round = round


class FederationError(RuntimeError):
    """The federation could not go on (for example a lost Dask worker that could not be
    recovered, or every sampled client of a round failed)."""
