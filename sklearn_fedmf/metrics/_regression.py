"""Rating-prediction errors at the stored entries of a held-out matrix."""

import numpy as np

from .._docstrings import Substitution
from ..engine._client_data import check_ratings

# the two metrics take the same inputs: their description is written once
_INPUTS = Substitution(inputs=(
    "y_true : {array-like, sparse matrix} of shape (n_rows, n_items)\n"
    "    Held-out ratings (sparse: stored entries; dense: NaN is missing).\n"
    "y_pred : array-like of shape (n_rows, n_items)\n"
    "    Dense predictions, e.g. from ``estimator.predict``."))


def _residuals(y_true, y_pred):
    y_true = check_ratings(y_true, name="y_true")
    y_pred = np.asarray(y_pred, dtype=float)
    if y_pred.shape != y_true.shape:
        raise ValueError(f"y_pred has shape {y_pred.shape}, expected {y_true.shape}.")
    rows = np.repeat(np.arange(y_true.shape[0]), np.diff(y_true.indptr))
    if y_true.nnz == 0:
        raise ValueError("y_true has no stored rating to evaluate.")
    return y_pred[rows, y_true.indices] - y_true.data


@_INPUTS
def rmse(y_true, y_pred):
    """Root mean squared error at the observed entries of ``y_true``.

    Parameters
    ----------
    %(inputs)s

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.metrics import rmse
    >>> rmse([[1.0, np.nan], [3.0, 4.0]], [[2.0, 0.0], [3.0, 4.0]])
    0.5773502691896257
    """
    return float(np.sqrt(np.mean(_residuals(y_true, y_pred) ** 2)))


@_INPUTS
def mae(y_true, y_pred):
    """Mean absolute error at the observed entries of ``y_true`` (see :func:`rmse`).

    Parameters
    ----------
    %(inputs)s

    Examples
    --------
    >>> from sklearn_fedmf.metrics import mae
    >>> mae([[1.0, 2.0]], [[2.0, 4.0]])   # (1 + 2) / 2
    1.5
    """
    return float(np.mean(np.abs(_residuals(y_true, y_pred))))


__all__ = ["rmse", "mae"]
