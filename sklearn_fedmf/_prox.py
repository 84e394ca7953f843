"""Proximal operators of the regularizers shared by the estimators.

The regularizer of a factor ``Z`` is sklearn's elastic net (as in ``NMF``)::

    h(Z) = alpha * l1_ratio * ||Z||_1 + 0.5 * alpha * (1 - l1_ratio) * ||Z||_F^2

optionally with the constraint ``Z >= 0`` (``positive=True``). With the weighted
regularization (ALS-WR's weighted lambda) ``alpha`` is one strength per row: the row's
number of ratings times the per-rating strength (:func:`row_alpha`, :func:`item_counts`).
Its prox with parameter ``t`` is entrywise: ``S(X, t*alpha*l1_ratio) / (1 + t*alpha*(1 -
l1_ratio))``, with ``S`` the soft-threshold (replaced by ``max(X - tau, 0)`` under
nonnegativity).
"""

import numpy as np

__all__ = ["soft_threshold", "prox_elastic_net", "elastic_net_value", "row_alpha", "item_counts"]


def soft_threshold(X, tau):
    """``sign(X) * max(|X| - tau, 0)``, the prox of ``tau * ||.||_1``.

    Examples
    --------
    >>> from sklearn_fedmf._prox import soft_threshold
    >>> soft_threshold([3.0, -3.0, 0.5, -0.5, 1.0, 0.0], 1.0).tolist()
    [2.0, -2.0, 0.0, 0.0, 0.0, 0.0]
    """
    if np.any(np.asarray(tau) < 0):
        raise ValueError(f"The soft-threshold level must be >= 0, got {tau}.")
    X = np.asarray(X, dtype=float)
    # "+ 0.0" turns the -0.0 of thresholded negative entries into 0.0 (IEEE 754: -0 + 0 = +0)
    return np.sign(X) * np.maximum(np.abs(X) - tau, 0.0) + 0.0


def prox_elastic_net(X, t, alpha, l1_ratio, positive=False):
    """``argmin_Z t * h(Z) + 1/2 ||Z - X||^2`` for the elastic net ``h`` (see module doc).

    ``alpha`` may be a column ``(n_rows, 1)``: one strength per row (the prox stays
    entrywise)."""
    l1 = t * alpha * l1_ratio
    shrink = 1.0 + t * alpha * (1.0 - l1_ratio)
    if positive:
        Z = np.maximum(X - l1, 0.0) if np.any(l1) else np.maximum(X, 0.0)
    elif np.any(l1):
        Z = np.sign(X) * np.maximum(np.abs(X) - l1, 0.0)
    else:
        Z = X
    return Z / shrink if np.any(shrink != 1.0) else (Z if Z is not X else X.copy())


def elastic_net_value(Z, alpha, l1_ratio):
    """``h(Z)`` (the constraint's indicator is 0 on feasible points and not included);
    ``alpha`` may be one strength per row of ``Z``."""
    if not np.any(alpha):
        return 0.0
    alpha = np.asarray(alpha, dtype=float).reshape(-1)
    if alpha.size > 1:  # per row
        alpha = alpha[:, None]
    value = 0.0
    if l1_ratio:
        value += l1_ratio * float((alpha * np.abs(Z)).sum())
    if l1_ratio < 1:
        value += 0.5 * (1.0 - l1_ratio) * float((alpha * Z * Z).sum())
    return value


def row_alpha(alpha, X, weighted):
    """The strength of each row of ``X``'s factor: ``alpha`` times the row's number of ratings
    for the weighted regularization (ALS-WR's weighted lambda), else ``alpha``."""
    return alpha * np.diff(X.indptr).astype(np.float64) if weighted else alpha


def item_counts(X):
    """Ratings per item column of a client's block (its share of the item weights)."""
    return np.bincount(X.indices, minlength=X.shape[1]).astype(np.float64)
