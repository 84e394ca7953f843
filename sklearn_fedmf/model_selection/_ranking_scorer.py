"""A top-N ranking scorer for ``RatingRegressor`` in ``cross_validate`` and ``GridSearchCV``."""

from __future__ import annotations

from numbers import Real

import numpy as np
import pandas as pd

from .._docstrings import Substitution, pairs_example
from ..engine._client_data import check_int
from ..metrics import (
    average_precision_at_k,
    hit_rate_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
)

__all__ = ["make_ranking_scorer"]

_METRICS = {
    "hit_rate": hit_rate_at_k,
    "precision": precision_at_k,
    "recall": recall_at_k,
    "ndcg": ndcg_at_k,
    "average_precision": average_precision_at_k,
}


class _RankingScorer:
    """``scorer(estimator, X, y)``: the ranking metric of a fitted ``RatingRegressor``'s lists
    for the users of the held-out pairs ``X`` (built by :func:`make_ranking_scorer`)."""

    def __init__(self, metric, k, threshold, graded, min_support):
        self.metric = metric
        self.k = k
        self.threshold = threshold
        self.graded = graded
        self.min_support = min_support

    def __call__(self, estimator, X, y, sample_weight=None):
        if sample_weight is not None:
            raise ValueError("A ranking scorer does not weight the held-out ratings.")
        users, items, _ = estimator._columns(X, reset=False)
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        if len(y) != len(users):
            raise ValueError(f"y has {len(y)} ratings for {len(users)} pairs.")
        relevant = np.ones(len(y), dtype=bool) if self.threshold is None else y >= self.threshold
        truth = pd.DataFrame({"user": users[relevant], "item": items[relevant],
                              "relevance": y[relevant] if self.graded else 1.0})
        held_out_users = pd.unique(truth["user"])
        options = {} if self.min_support is None else {"min_support": self.min_support}
        lists, _ = estimator.recommend(held_out_users, n=self.k, **options)
        return _METRICS[self.metric](truth, lists, k=self.k, users=held_out_users)

    def __repr__(self):
        args = [f"{self.metric!r}", f"k={self.k}"]
        for name in ("threshold", "graded", "min_support"):
            value = getattr(self, name)
            if value not in (None, False):
                args.append(f"{name}={value!r}")
        return f"make_ranking_scorer({', '.join(args)})"


@Substitution(pairs_example=pairs_example(0.5))
def make_ranking_scorer(metric="ndcg", k=10, *, threshold=None, graded=False,
                        min_support=None):
    """A scorer of top-N lists for ``RatingRegressor`` in ``cross_validate``/``GridSearchCV``.

    On each cross-validation fold, the fitted ``RatingRegressor`` ranks, for every user of
    the held-out pairs, **all** the items it saw in ``fit`` that the user did not rate in the
    training fold (full ranking, :meth:`~sklearn_fedmf.RatingRegressor.recommend`), and the
    scorer reports ``metric`` at ``k`` against that user's held-out items.

    **Which held-out items are relevant.** With ``threshold=None`` every held-out item of the
    user is relevant (an interaction counts, whatever its rating); with a ``threshold``, only
    those rated ``>= threshold`` are (e.g. 4 on a 1-5 scale), and a user with none is left
    out of the mean, as in every metric of :mod:`sklearn_fedmf.metrics`. A held-out item
    that the model never saw in ``fit`` stays relevant and can never be hit (the model
    cannot recommend it), so recall counts it as missed. A user unseen in ``fit`` (a
    ``GroupKFold`` over users) gets ``recommend``'s cold-start list.

    Parameters
    ----------
    metric : {"ndcg", "hit_rate", "recall", "precision", "average_precision"}, default="ndcg"
        The metric of :mod:`sklearn_fedmf.metrics` (``ndcg_at_k``, ``hit_rate_at_k``, ...).
    k : int, default=10
        List length.
    threshold : float, default=None
        Smallest held-out rating that counts as relevant; None: every held-out rating.
    graded : bool, default=False
        Use the held-out ratings as graded relevance (only ``"ndcg"`` reads the grades).
    min_support : int, default=None
        Passed to ``recommend``; None keeps its default.

    Returns
    -------
    scorer : callable
        ``scorer(estimator, X, y)``, greater is better.

    Examples
    --------
    %(pairs_example)s
    >>> from sklearn.model_selection import GridSearchCV, KFold
    >>> from sklearn_fedmf.model_selection import make_ranking_scorer
    >>> search = GridSearchCV(
    ...     RatingRegressor(FedMAvg(n_clients=4, max_iter=5, random_state=0)),
    ...     {"estimator__n_components": [2, 4]}, cv=KFold(3, shuffle=True, random_state=0),
    ...     scoring=make_ranking_scorer("ndcg", k=5)).fit(X, y)
    >>> bool(0 <= search.best_score_ <= 1)
    True
    """
    if metric not in _METRICS:
        raise ValueError(f"metric must be one of {sorted(_METRICS)}, got {metric!r}.")
    k = check_int(k, "k")
    if threshold is not None and (not isinstance(threshold, Real) or not np.isfinite(threshold)):
        raise ValueError(f"threshold must be a finite number or None, got {threshold!r}.")
    if not isinstance(graded, bool | np.bool_):
        raise ValueError(f"graded must be a bool, got {graded!r}.")
    if min_support is not None:
        min_support = check_int(min_support, "min_support", 0)
    return _RankingScorer(metric, k, threshold, bool(graded), min_support)
