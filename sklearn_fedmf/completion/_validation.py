"""Federated validation of the completion estimators: which ratings validate, when to stop,
and the biases-only floor a factor model must beat.

Each client holds out ``validation_fraction`` of its own ratings (``_fit.validation_split``);
per evaluated round it reports its squared-error sum and count on them (two numbers), and the
engine keeps the best round (:class:`~sklearn_fedmf._engine.EarlyStopping`). At the end the
federated biases-only model (:class:`~sklearn_fedmf.FedBaseline`, Surprise's ``BaselineOnly``)
is fitted on the same clients' training ratings; when it validates at least as well, the fit
keeps it, refitted on all the training ratings (the validation part included): a factor model
is never worse than biases alone on the validation ratings.
"""

from __future__ import annotations

import warnings

import numpy as np
import scipy.sparse as sp

from .._engine import EarlyStopping
from .._fit import validation_split
from ..exceptions import FedMFWarning

__all__ = ["EARLY_STOPPING_MIN_RATINGS", "biases_floor", "floor_on_all_ratings",
           "split_validation"]

# "auto" early stopping needs this many ratings (HistGradientBoosting's 10,000 samples)
EARLY_STOPPING_MIN_RATINGS = 10_000


def split_validation(ctx, settings, *, implicit, validation_keys):
    """``(X, eval_X, report_X, rule)``: the training ratings, the validation ratings, the
    ``eval_set`` kept as a report beside them, and early stopping's rule (None: no
    validation). ``validation_keys`` is the class's ``(score key, report keys)``."""
    on, fraction = settings["early_stopping"], settings["validation_fraction"]
    X, eval_X = ctx.X, ctx.info["eval_X"]
    if on == "auto":  # (eval_every=0: the caller asked for no evaluation)
        on = (not implicit and fraction is not None
              and X.nnz >= EARLY_STOPPING_MIN_RATINGS and settings["eval_every"] > 0)
    if not on:
        return X, eval_X, None, None
    if implicit:
        raise ValueError(
            'early_stopping=True validates the rating error, which loss="implicit" does not '
            "predict (its scores rank items); set early_stopping=False and choose max_iter "
            "with a ranking scorer (sklearn_fedmf.model_selection).")
    if eval_X is None and fraction is None:
        raise ValueError(
            "early_stopping=True needs validation ratings: set validation_fraction (each "
            "client holds out that fraction of its ratings) or pass fit(eval_set=...).")
    report_X = None
    held_out = fraction is not None  # (else the eval set is the validation set)
    if held_out:  # the eval set, if any, stays a report beside the validation
        report_X = eval_X
        X, eval_X = validation_split(X, ctx.codes, ctx.n_clients, fraction, ctx.entropy)
    score_key, report_keys = validation_keys
    rule = EarlyStopping(n_iter_no_change=settings["n_iter_no_change"], tol=settings["tol"],
                         score_key=score_key, report_keys=report_keys, rename=held_out)
    return X, eval_X, report_X, rule


def biases_floor(ctx, floor_class, *, n_jobs, secure_aggregation=False):
    """The federated biases-only model on the fit's clients' training ratings, its
    validation RMSE in rating units, and the bytes ``(up, down)`` it cost.

    ``ctx.X`` and ``ctx.info["eval_X"]`` are the fit's (centred by ``offset``, divided by
    ``rating_scale`` where a class scales them). Each client sends one more number, the
    squared-error sum of the floor on its validation ratings. ``floor_class`` is
    :class:`~sklearn_fedmf.FedBaseline` (passed in: it is itself a completion estimator).
    With ``secure_aggregation`` (the fit's) the floor is fitted with it too, and the
    clients' squared-error sums (each over the validation count, which the server has from
    the reports' secure sums) reach the server as one secure sum.
    """
    offset, scale = ctx.info["offset"], ctx.info.get("rating_scale", 1.0)
    floor, (up, down) = _fit_floor(ctx, ctx.X, floor_class, n_jobs, secure_aggregation)
    X_valid = ctx.info["eval_X"]
    rows = np.repeat(np.arange(X_valid.shape[0]), np.diff(X_valid.indptr))
    residual = (X_valid.data * scale + offset
                - (floor.user_bias_[rows] + floor.item_bias_[X_valid.indices] + floor.mean_))
    if secure_aggregation is False:
        return floor, float(np.sqrt(np.mean(np.square(residual)))), (up + 8 * ctx.n_clients,
                                                                     down)
    from ..secure import SecureAggregation, secure_sum

    options = SecureAggregation() if secure_aggregation is True else secure_aggregation
    n, count = ctx.n_clients, residual.size
    mean_sse = np.bincount(ctx.codes[rows], weights=np.square(residual), minlength=n) / count
    result = secure_sum({p: mean_sse[p:p + 1] for p in range(n)},
                        encoding=options.encoding_for(n), neighbours=options.degree(n),
                        seed=np.random.SeedSequence(ctx.entropy, spawn_key=(_FLOOR_SUM,)))
    up += sum(sum(v.values()) for v in result.bytes_uploaded.values())
    down += sum(sum(v.values()) for v in result.bytes_downloaded.values())
    return floor, float(np.sqrt(max(result.sum[0], 0.0))), (up, down)


_FLOOR_SUM = 9  # the floor's secure sum: its seed kind (the engine's are 0 to 7)


def floor_on_all_ratings(ctx, floor_class, *, n_jobs, secure_aggregation=False):
    """The biases-only model refitted on every training rating, the validation ratings held
    out of them included, and its bytes: what a fit keeps when the floor wins. The choice is
    made; the held-out tenth only cost the floor accuracy (about 0.0015 RMSE on MovieLens,
    where the floor on all the ratings equals Surprise's ``BaselineOnly``)."""
    # (stacked, not added: a sum would drop a centred rating of exactly 0)
    parts = [ctx.X.tocoo(), ctx.info["eval_X"].tocoo()]
    X = sp.csr_matrix((np.concatenate([p.data for p in parts]),
                       (np.concatenate([p.row for p in parts]),
                        np.concatenate([p.col for p in parts]))), shape=ctx.X.shape)
    return _fit_floor(ctx, X, floor_class, n_jobs, secure_aggregation)


def _fit_floor(ctx, X, floor_class, n_jobs, secure_aggregation):
    """``floor_class`` fitted on the fit's clients with the ratings ``X`` (on the fit's
    scale), with the fit's ``secure_aggregation``, and the bytes ``(up, down)`` of its
    rounds."""
    offset, scale = ctx.info["offset"], ctx.info.get("rating_scale", 1.0)
    X = X.copy()
    X.data = X.data * scale + offset  # back to ratings: the floor centres them itself
    with warnings.catch_warnings():  # (what it would say, this fit has said)
        warnings.simplefilter("ignore", FedMFWarning)
        floor = floor_class(n_clients=ctx.n_clients, random_state=ctx.entropy, n_jobs=n_jobs,
                            solver_params={"eval_every": 0},
                            secure_aggregation=secure_aggregation).fit(X, clients=ctx.labels)
    up = sum(r["bytes_uploaded"] for r in floor.history_)
    down = sum(r["bytes_downloaded"] for r in floor.history_)
    return floor, (up, down)
