"""Scorers for the pair API (``RatingRegressor``)."""

import numpy as np

from .._docstrings import Substitution, pairs_example

__all__ = ["fold_in_rmse"]


@Substitution(pairs_example=pairs_example(0.7))
def fold_in_rmse(estimator, X, y):
    """Negative RMSE of a fitted ``RatingRegressor``, folding in users unseen in fit.

    A scorer (``scoring=fold_in_rmse`` in ``cross_validate`` or ``GridSearchCV``) for the
    users-held-out protocol: with ``GroupKFold`` over the user ids, each held-out user is
    folded in from ``estimator.fold_in_size`` of its pairs and rated on the others, as
    ``RatingRegressor.score`` does (which returns R^2). Users seen in fit are rated on all
    their pairs.

    Parameters
    ----------
    estimator : RatingRegressor
        Fitted.
    X : {array-like, DataFrame} of shape (n_pairs, n_columns)
        (user, item) id pairs.
    y : array-like of shape (n_pairs,)
        Their true ratings.

    Returns
    -------
    score : float
        ``-sqrt(mean squared error)`` over the scored pairs (greater is better).

    Examples
    --------
    %(pairs_example)s
    >>> from sklearn.model_selection import GroupKFold, cross_validate
    >>> from sklearn_fedmf.model_selection import fold_in_rmse
    >>> reg = RatingRegressor(FedMAvg(n_components=2, n_clients=3, random_state=0))
    >>> scores = cross_validate(reg, X, y, groups=users, cv=GroupKFold(4),
    ...                         scoring=fold_in_rmse)["test_score"]
    >>> bool((scores < 0).all())
    True
    """
    y_true, y_pred, keep = estimator._fold_in_predict(X, y)
    return -float(np.sqrt(np.mean((y_true[keep] - y_pred) ** 2)))
