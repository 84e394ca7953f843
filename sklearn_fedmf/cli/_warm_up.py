"""The untimed warm-up fit before each timed fit of the ``fedmf`` commands."""

from __future__ import annotations

import inspect
import warnings


def warm_up(model, X, y=None, eval_set=None):
    """One untimed one-round fit of a clone of ``model`` (an estimator, or a meta-estimator
    such as ``RatingRegressor``) on the same data, so that compiling its kernels (numba, at
    the first call) is not counted in the timed fit's seconds."""
    from sklearn.base import clone

    short = clone(model).set_params(**{
        k: 1 if k.endswith("max_iter") else 0 for k in model.get_params()
        if k.rsplit("__", 1)[-1] in ("max_iter", "verbose")})
    fit_params = {}
    if eval_set is not None and "eval_set" in inspect.signature(short.fit).parameters:
        fit_params["eval_set"] = eval_set
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (said by the timed fit)
        short.fit(X, y, **fit_params)
