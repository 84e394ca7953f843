"""The losses of the completion estimators: what each decides outside the protocols.

A completion estimator's ``loss`` names one of :data:`LOSSES`; the estimator asks that object
(``self._loss``) wherever the two losses differ outside an algorithm (the data's check and
centring, the rank and the defaults of ``None``, the fold-in, the clip and the score), and
each algorithm declares its protocol per loss in its ``_protocols`` mapping
(:meth:`~._base.FederatedMFBase._make_protocol`). No method reads a flag of the loss.

``"squared"``: ratings, centred by their mean, biases allowed, scored by RMSE.
``"implicit"``: interactions read as preferences with confidences (:mod:`._implicit`): no mean,
no range, no biases, each user's fold-in the exact weighted minimizer, scored by NDCG at 10.
"""

from __future__ import annotations

import numpy as np

from ._implicit import (
    IMPLICIT_ALPHA,
    check_interactions,
    implicit_rank,
    implicit_user_factors,
    resolve_confidence,
)
from ._validation import split_validation

__all__ = ["ImplicitLoss", "LOSSES", "SquaredLoss"]


class SquaredLoss:
    """The squared error on ratings."""

    name = "squared"

    def pick(self, defaults):
        """This loss's entry of a ``(squared, implicit)`` pair of defaults."""
        return defaults[0]

    def biased(self, biased):
        """Whether the model has biases: as asked."""
        return biased

    def rank(self, default, n_interactions, n_items):
        """The rank ``n_components=None`` gives: the default, at most ``n_items``."""
        return min(default, n_items)

    def check_data(self, X, settings):
        """Refuse data or settings the loss cannot fit (ratings: any)."""

    def split_validation(self, ctx, settings, validation_keys):
        """:func:`~._validation.split_validation` for this loss."""
        return split_validation(ctx, settings, implicit=False, validation_keys=validation_keys)

    def summary(self, X, ctx, estimator):
        """``(mean, rating_range)`` of the training ratings: each client sends only the sum,
        the count and the extremes of its ratings (warm start: the first fit's)."""
        if ctx.warm:  # the model keeps the centring of its first fit
            return estimator.mean_, estimator.rating_range_
        return float(X.data.mean()), (float(X.data.min()), float(X.data.max()))

    def offset(self, mean, center):
        """What is subtracted from the ratings before factorizing: their mean when
        ``center``."""
        return mean if center else 0.0

    def fit_info(self, estimator, ctx, settings, X):
        """The loss's own entries of the fit's context (none)."""
        return {}

    def deployed_info(self, estimator, settings, mean):
        """:meth:`fit_info` of a deployed federation from its sites' mean rating (none)."""
        return {}

    def collect(self, estimator, ctx):
        """Set the loss's own fitted attributes (none)."""

    def target_rms(self, sample):
        """The RMS of the fitted targets at ``sample``'s entries: the (centred) ratings'."""
        return np.sqrt(np.mean(np.square(sample.data, dtype=np.float64)))

    def fold_in(self, estimator, Xc, Vt):
        """The rows' factors against ``Vt`` (the estimator's ratings fold-in)."""
        return estimator._fold_in_ratings(Xc, Vt)

    def clip(self, estimator, values):
        """Predictions within the training ratings' range when ``clip=True``."""
        if estimator.clip:
            return np.clip(values, *estimator.rating_range_)
        return values

    def score(self, estimator, Xc, y):
        """``score``: the negative RMSE."""
        return estimator._rmse_score(Xc, y)

    def auto_strength(self, rule):
        """A strength set to ``"auto"``: the estimator's rule, ``rule()``."""
        return rule()

    def check_link(self, link):
        """Refuse a link the loss cannot fit through (ratings: any)."""

    def rating_scale(self, scale):
        """What the ratings are divided by in a fit that scales them: ``scale``."""
        return scale

    def uses_auto(self, asked):
        """Whether ``"auto"`` strengths run the rating-scale rules (:mod:`._auto_strengths`)."""
        return asked


class ImplicitLoss(SquaredLoss):
    """The weighted squared error on preferences of :mod:`._implicit`."""

    name = "implicit"

    def pick(self, defaults):
        return defaults[1]

    def biased(self, biased):
        """No biases: preference scores have neither biases nor a mean."""
        return False

    def rank(self, default, n_interactions, n_items):
        """:func:`~._implicit.implicit_rank`: grows with the interactions."""
        return implicit_rank(default, n_interactions, n_items)

    def check_data(self, X, settings):
        check_interactions(X)
        if settings["l1_ratio"] or settings["positive"]:
            raise ValueError(
                'loss="implicit" solves each user exactly (a ridge system); set '
                "solver_params['l1_ratio'] to 0 and solver_params['positive'] to False.")

    def split_validation(self, ctx, settings, validation_keys):
        return split_validation(ctx, settings, implicit=True, validation_keys=validation_keys)

    def summary(self, X, ctx, estimator):
        """Preference scores: no mean, no range (nothing is sent for them)."""
        return 0.0, (-np.inf, np.inf)

    def offset(self, mean, center):
        """Nothing: preferences are not centred (a deployment's sites may still report a
        mean)."""
        return 0.0

    def fit_info(self, estimator, ctx, settings, X):
        """The confidence scale (warm start: the first fit's)."""
        return {"confidence": estimator.confidence_ if ctx.warm else resolve_confidence(
            settings["confidence"], float(X.data.mean()))}

    def deployed_info(self, estimator, settings, mean):
        """The sites' mean strength sets ``"auto"``'s confidence scale."""
        estimator.confidence_ = resolve_confidence(settings["confidence"], float(mean))
        return {"confidence": estimator.confidence_}

    def collect(self, estimator, ctx):
        estimator.confidence_ = ctx.info.confidence

    def target_rms(self, sample):
        """The fitted target at a stored entry is the preference 1."""
        return 1.0

    def fold_in(self, estimator, Xc, Vt):
        """The exact minimizer over every item (:mod:`._implicit`)."""
        return implicit_user_factors(Xc, Vt, Vt.T @ Vt, confidence=estimator.confidence_,
                                     alpha_u=estimator._fold_in_alpha_u())

    def clip(self, estimator, values):
        """Preference scores have no range."""
        return values

    def score(self, estimator, Xc, y):
        """``score``: the mean NDCG at 10 of the rows' lists."""
        return estimator._ranking_score(Xc, y)

    def auto_strength(self, rule):
        """``IMPLICIT_ALPHA``."""
        return IMPLICIT_ALPHA

    def check_link(self, link):
        if link != "identity":
            raise ValueError('loss="implicit" needs link="identity" (the preferences are 0 '
                             "and 1, not ratings to map into a range).")

    def rating_scale(self, scale):
        """1: the confidences read ``X`` as given."""
        return 1.0

    def uses_auto(self, asked):
        """Never: preferences, not ratings (no scale and no biases to start)."""
        return False


LOSSES = {"squared": SquaredLoss(), "implicit": ImplicitLoss()}
