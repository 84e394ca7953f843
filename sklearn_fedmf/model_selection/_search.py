"""Default hyperparameter search spaces of the completion estimators."""

from __future__ import annotations

from scipy.stats import loguniform

__all__ = ["default_search_space"]

# Each estimator's strengths of regularization live on its own scale (FedMC-ADMM divides its
# data term and R_i by p but not R(V); RFRec's penalties carry no 1/2), so each space is
# centred on that estimator's measured good values (benchmarks/bench_defaults.py).
_SPACES = {
    "FedMCADMM": {
        "alpha_u": (1.0, 30.0), "alpha_v": (1e-3, 0.3), "beta": ["auto", 0.003, 0.03],
        "local_iter": [30, 100], "n_components": [5, 10, 20], "biased": [True, False],
    },
    "FedMAvg": {
        "alpha_u": (1.0, 30.0), "alpha_v": (1.0, 30.0), "local_iter_u": [5, 10],
        "n_components": [5, 10, 20], "biased": [True, False],
    },
    "FedMGS": {
        "alpha_u": (1.0, 30.0), "alpha_v": (1.0, 30.0), "local_iter_u": [5, 10],
        "n_components": [5, 10, 20], "biased": [True, False],
    },
    "RFRec": {
        "alpha_u": (0.5, 15.0), "alpha_v": (0.5, 15.0), "reg_consensus": [5.0, 10.0, 20.0],
        "n_components": [5, 10, 20], "biased": [True, False],
    },
}


def default_search_space(estimator, *, kind="grid", n_points=3, include=None):
    """A search space over an estimator's regularization, local steps, rank and biases.

    Used by ``fedmf tune``; ready for :class:`~sklearn.model_selection.GridSearchCV`,
    :class:`~sklearn.model_selection.RandomizedSearchCV` and
    :class:`~sklearn.model_selection.HalvingGridSearchCV` (with ``resource="max_iter"``:
    rounds as the resource, so ``max_iter`` is never part of the space).

    Parameters
    ----------
    estimator : estimator instance, class or class name
        :class:`~sklearn_fedmf.FedMCADMM`, :class:`~sklearn_fedmf.FedMAvg`,
        :class:`~sklearn_fedmf.FedMGS` or :class:`~sklearn_fedmf.RFRec`.
    kind : {"grid", "distributions"}, default="grid"
        ``"grid"``: lists (continuous strengths as ``n_points`` log-spaced values);
        ``"distributions"``: ``scipy.stats.loguniform`` for the strengths, lists otherwise.
    n_points : int, default=3
        Values per continuous strength in a grid.
    include : list of str, default=None
        Keep only these parameters (for a smaller grid); None keeps all.

    Returns
    -------
    space : dict
        Parameter name to a list of values or a distribution.

    Examples
    --------
    >>> from sklearn_fedmf import FedMAvg
    >>> from sklearn_fedmf.model_selection import default_search_space
    >>> space = default_search_space(FedMAvg(), include=["alpha_u", "biased"])
    >>> [round(a, 2) for a in space["alpha_u"]], space["biased"]
    ([1.0, 5.48, 30.0], [True, False])
    """
    if isinstance(estimator, str):
        name = estimator
    else:
        name = estimator.__name__ if isinstance(estimator, type) else type(estimator).__name__
    if name not in _SPACES:
        raise ValueError(f"No default search space for {name}; known: {', '.join(_SPACES)}.")
    if kind not in ("grid", "distributions"):
        raise ValueError(f"kind must be 'grid' or 'distributions', got {kind!r}.")
    if not isinstance(n_points, int) or n_points < 1:
        raise ValueError(f"n_points must be a positive integer, got {n_points!r}.")
    space = {}
    for param, values in _SPACES[name].items():
        if include is not None and param not in include:
            continue
        if isinstance(values, tuple):  # (low, high) of a strength, searched on a log scale
            low, high = values
            if kind == "distributions":
                values = loguniform(low, high)
            elif n_points == 1:
                values = [float((low * high) ** 0.5)]
            else:
                values = [float(low * (high / low) ** (k / (n_points - 1)))
                          for k in range(n_points)]
        space[param] = values
    if include is not None and set(include) - set(space):
        raise ValueError(f"{name} has no default range for {sorted(set(include) - set(space))}.")
    return space
