"""Proximal operators of the regularizers shared by the estimators.

The regularizer of a factor ``Z`` is sklearn's elastic net (as in ``NMF``)::

    h(Z) = alpha * l1_ratio * ||Z||_1 + 0.5 * alpha * (1 - l1_ratio) * ||Z||_F^2

optionally with the constraint ``Z >= 0`` (``positive=True``). Its prox with parameter ``t``
is entrywise: ``S(X, t*alpha*l1_ratio) / (1 + t*alpha*(1 - l1_ratio))``, with ``S`` the
soft-threshold (replaced by ``max(X - tau, 0)`` under nonnegativity).
"""

import numpy as np

__all__ = ["soft_threshold", "prox_elastic_net", "elastic_net_value"]


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
    """``argmin_Z t * h(Z) + 1/2 ||Z - X||^2`` for the elastic net ``h`` (see module doc)."""
    l1 = t * alpha * l1_ratio
    shrink = 1.0 + t * alpha * (1.0 - l1_ratio)
    if positive:
        Z = np.maximum(X - l1, 0.0) if l1 else np.maximum(X, 0.0)
    elif l1:
        Z = np.sign(X) * np.maximum(np.abs(X) - l1, 0.0)
    else:
        Z = X
    return Z / shrink if shrink != 1.0 else (Z if Z is not X else X.copy())


def elastic_net_value(Z, alpha, l1_ratio):
    """``h(Z)`` (the constraint's indicator is 0 on feasible points and not included)."""
    if not alpha:
        return 0.0
    value = 0.0
    if l1_ratio:
        value += alpha * l1_ratio * float(np.abs(Z).sum())
    if l1_ratio < 1:
        value += 0.5 * alpha * (1.0 - l1_ratio) * float(np.vdot(Z, Z))
    return value
