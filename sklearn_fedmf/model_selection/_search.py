"""Default hyperparameter search spaces of the completion estimators."""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import loguniform

__all__ = ["default_search_space"]

# Each estimator's strengths of regularization live on its own scale (FedMC-ADMM divides its
# data term and R_i by p but not R(V); RFRec's penalties carry no 1/2), so each range is the
# measured default (benchmarks/bench_defaults.py) divided and multiplied by 3: a 3-point grid
# is (default / 3, default, 3 * default). ALS-WR's weighted lambda is a strength per rating,
# on one scale for the three estimators that have it (reference 0.1), so the two
# regularizations are separate sub-spaces of their own strengths. FedMC-ADMM's and FedMAvg's
# "auto" strengths follow the ratings per row (completion/_auto_strengths): their plain ranges
# are centred near the values they take at MovieLens latest-small's training part (alpha_u
# about 23 for FedMC-ADMM, alpha_v 0.27; FedMAvg's "degrees" rule: both about 14).
# FedMGS's "auto" starts at 10 and never exceeds it (times the ratings' root mean square).
_STRENGTHS = {
    "FedMCADMM": {"plain": {"alpha_u": (20 / 3, 60.0), "alpha_v": (0.3 / 3, 0.9)}},
    "FedMAvg": {"plain": {"alpha_u": (14 / 3, 42.0), "alpha_v": (14 / 3, 42.0)}},
    "FedMGS": {"plain": {"alpha_u": (10 / 3, 30.0), "alpha_v": (10 / 3, 30.0)}},
    "RFRec": {"plain": {"alpha_u": (1.5, 13.5), "alpha_v": (1.5, 13.5)}},
    "FedBaseline": {"plain": {"alpha_u": (5.0, 45.0), "alpha_v": (10 / 3, 30.0)}},  # Surprise's
}
for _name in ("FedMCADMM", "FedMAvg", "FedMGS"):
    _STRENGTHS[_name]["weighted"] = {"alpha_u": (0.1 / 3, 0.3), "alpha_v": (0.1 / 3, 0.3)}
_OTHERS = {
    "FedMCADMM": {"beta": ["auto", 0.003, 0.03], "local_iter": [30, 100],
                  "n_components": [5, 10, 20], "biased": [True, False]},
    "FedMAvg": {"local_iter_u": [5, 10], "n_components": [5, 10, 20], "biased": [True, False]},
    "FedMGS": {"local_iter_u": [5, 10], "local_iter_v": [1, 5], "n_components": [5, 10, 20],
               "biased": [True, False]},
    "RFRec": {"reg_consensus": [5.0, 10.0, 20.0], "n_components": [5, 10, 20],
              "biased": [True, False]},
    "FedBaseline": {},
}


def default_search_space(estimator, *, kind="grid", n_points=3, include=None):
    """A search space over an estimator's regularization, local steps, rank and biases.

    Used by ``fedmf tune``; ready for :class:`~sklearn.model_selection.GridSearchCV`,
    :class:`~sklearn.model_selection.RandomizedSearchCV` and
    :class:`~sklearn.model_selection.HalvingGridSearchCV` (with ``resource="max_iter"``:
    rounds as the resource, so ``max_iter`` is never part of the space), on the rating
    matrix or on (user, item) pairs through :class:`~sklearn_fedmf.RatingRegressor` (then
    prefix each name with ``estimator__``).

    Parameters
    ----------
    estimator : estimator instance, class or class name
        :class:`~sklearn_fedmf.FedMCADMM`, :class:`~sklearn_fedmf.FedMAvg`,
        :class:`~sklearn_fedmf.FedMGS`, :class:`~sklearn_fedmf.RFRec` or
        :class:`~sklearn_fedmf.FedBaseline` (its two strengths only).
    kind : {"grid", "distributions"}, default="grid"
        ``"grid"``: lists (continuous strengths as ``n_points`` log-spaced values);
        ``"distributions"``: ``scipy.stats.loguniform`` for the strengths, lists otherwise.
    n_points : int, default=3
        Values per continuous strength in a grid. Each strength's range is its default
        divided and multiplied by 3, so 3 points are ``default / 3``, ``default`` and
        ``3 * default`` (1 point: the default). An ``"auto"`` default takes the centre
        point; with an even ``n_points`` it is one more value.
    include : list of str, default=None
        Keep only these parameters (for a smaller grid); None keeps all.

    Returns
    -------
    space : dict or list of dict
        Parameter name to a list of values or a distribution (``kind="distributions"``:
        always a list, the first sub-space the defaults, below). When the space holds
        ``regularization`` (FedMCADMM, FedMAvg and FedMGS, unless ``include`` leaves it
        out), a list of two such dicts, ``regularization="plain"`` and ``"weighted"``, each
        with the strengths on its own scale (the papers' penalties, and ALS-WR's strength
        per rating); every search tool takes a list of dicts and searches each in turn. A
        strength left out of ``include`` keeps the estimator's value under its own
        regularization and is the other one's default (one point) under the other.
        Without ``regularization``, the strengths are those of the estimator's own
        regularization (``"plain"`` for a class or name).

        The space always holds the class's defaults (read from the class,
        ``cls().get_params()``) as one of its candidates: in a grid every value list of the
        default regularization's sub-grid holds its parameter's default, so a search scores
        the defaults beside the rest and its best is never worse than them on its own CV
        score. ``kind="distributions"`` always returns a list whose first sub-space is the
        defaults alone (one point), then the other sub-spaces, their lists holding the
        defaults too and each strength drawing its default (``"auto"`` or a number) half
        the time, a log-uniform value of its range otherwise (:class:`DefaultOr`). A random
        search draws a sub-space at random for each candidate, so it scores the defaults
        with the others unless it misses that sub-space every time (8 candidates over
        three sub-spaces: a chance of ``(2/3)^8``, 4%; scikit-learn scores a point drawn
        twice twice). To be sure, add the defaults as one more candidate (tuning guide).

    Examples
    --------
    >>> from sklearn_fedmf import FedMAvg
    >>> from sklearn_fedmf.model_selection import default_search_space
    >>> space = default_search_space(FedMAvg(), include=["alpha_u", "biased"])
    >>> [a if a == "auto" else round(a, 2) for a in space["alpha_u"]], space["biased"]
    ([4.67, 'auto', 42.0], [True, False])
    >>> plain, weighted = default_search_space(FedMAvg(), include=["regularization",
    ...                                                             "alpha_u"])
    >>> weighted["regularization"], [round(a, 3) for a in weighted["alpha_u"]]
    (['weighted'], [0.033, 0.1, 0.3])
    >>> from sklearn.model_selection import ParameterGrid
    >>> from sklearn_fedmf import FedMCADMM
    >>> space = default_search_space(FedMCADMM, include=["alpha_u", "beta"])
    >>> space["alpha_u"][1], space["beta"][0]  # FedMCADMM's defaults
    ('auto', 'auto')
    >>> {"alpha_u": "auto", "beta": "auto"} in list(ParameterGrid(space))
    True
    """
    if isinstance(estimator, str):
        name, own = estimator, "plain"
    elif isinstance(estimator, type):
        name, own = estimator.__name__, "plain"
    else:
        name = type(estimator).__name__
        own = getattr(estimator, "regularization", "plain")
    if name not in _STRENGTHS:
        raise ValueError(f"No default search space for {name}; known: {', '.join(_STRENGTHS)}.")
    defaults = _class_defaults(name)
    if kind not in ("grid", "distributions"):
        raise ValueError(f"kind must be 'grid' or 'distributions', got {kind!r}.")
    if not isinstance(n_points, int) or n_points < 1:
        raise ValueError(f"n_points must be a positive integer, got {n_points!r}.")
    strengths = _STRENGTHS[name]
    known = {"regularization"} if len(strengths) > 1 else set()
    known |= set(strengths["plain"]) | set(_OTHERS[name])
    if include is not None and set(include) - known:
        raise ValueError(f"{name} has no default range for {sorted(set(include) - known)}.")
    keep = known if include is None else set(include)
    if own not in strengths:
        raise ValueError(f"No default strengths for regularization={own!r} of {name}.")
    regularizations = list(strengths) if "regularization" in keep else [own]
    spaces = []
    for regularization in regularizations:
        space = {"regularization": [regularization]} if "regularization" in keep else {}
        for param, (low, high) in strengths[regularization].items():
            if param in keep:
                space[param] = _log_range(low, high, kind, n_points)
            elif regularization != own:  # the estimator's strength is on the other scale
                space[param] = _log_range(low, high, "grid", 1)
        space.update({k: list(v) for k, v in _OTHERS[name].items() if k in keep})
        _add_defaults(space, defaults, regularization)
        spaces.append(space)
    if kind == "distributions":  # first, the defaults alone
        spaces.insert(0, _around_defaults(spaces, defaults))
        return spaces
    return spaces if "regularization" in keep else spaces[0]


def _around_defaults(spaces, defaults):
    """The sub-space of the defaults alone: one point, the parameters of the default
    regularization's sub-space at their defaults. Measured on MovieLens 100K (8 candidates,
    3 folds): without it, 6 of 8 draws of FedMGS's space had ``biased=False`` or the
    weighted regularization and the search ended 0.02 RMSE worse on test than the
    defaults; with the defaults' strengths drawn only half the time (and log-uniform
    otherwise, every other parameter at its default) it never drew the defaults and ended
    0.004 worse, its best CV score 0.9362 against the defaults' 0.9341."""
    own = next(sub for sub in spaces if sub.get("regularization", [None])[0] in (
        None, defaults.get("regularization")))
    return {param: values if param == "regularization" else [defaults[param]]
            for param, values in own.items()}


def _class_defaults(name):
    """The class's own defaults (read now, so a changed default stays in the space)."""
    from .. import completion

    return getattr(completion, name)().get_params()


def _add_defaults(space, defaults, regularization):
    """Make every list of ``space`` hold the class default of its parameter, so that a
    search over the space cannot miss the defaults (a tuned model never loses to them on
    the search's own score).

    A strength on another regularization's scale is left alone: that sub-grid does not
    hold the default regularization anyway. A numeric default that a point approximates
    (``5 / 3 * 3``) replaces it exactly; an ``"auto"`` strength takes the centre of an odd
    range (the range is centred on the value "auto" takes on MovieLens); any other missing
    default is added as one more value.
    """
    if regularization != defaults.get("regularization", regularization):
        space = {k: v for k, v in space.items() if k not in ("alpha_u", "alpha_v")}
    for param, values in space.items():
        if param == "regularization":  # each sub-grid is one regularization
            continue
        default = defaults[param]
        if hasattr(values, "rvs"):  # a distribution: the default drawn beside its values
            space[param] = DefaultOr(values, default)
            continue
        if default in values:
            continue
        near = [i for i, v in enumerate(values) if _is_close(v, default)]
        if near:
            values[near[0]] = default
        elif isinstance(default, str) and param.startswith("alpha_") and len(values) % 2:
            values[len(values) // 2] = default
        elif all(_is_close(v, v) for v in [*values, default]):  # numbers: kept in order
            values.insert(sum(v < default for v in values), default)
        else:
            values.insert(0, default)


class DefaultOr:
    """A distribution of a strength that holds its default: the default with probability
    ``p``, else a draw of ``distribution``.

    Parameters
    ----------
    distribution : object with ``rvs``
        The values otherwise (``scipy.stats.loguniform`` in :func:`default_search_space`).
    default : str or float
        The default (``"auto"`` or a number).
    p : float, default=0.5
        Its probability.

    Examples
    --------
    >>> import numpy as np
    >>> from scipy.stats import loguniform
    >>> from sklearn_fedmf.model_selection._search import DefaultOr
    >>> rng = np.random.RandomState(0)
    >>> draws = [DefaultOr(loguniform(1, 10), "auto").rvs(random_state=rng) for _ in range(6)]
    >>> int(sum(d == "auto" for d in draws)), all(d == "auto" or 1 <= d <= 10 for d in draws)
    (2, True)
    """

    def __init__(self, distribution, default, p=0.5):
        self.distribution, self.default, self.p = distribution, default, p

    def rvs(self, random_state=None):
        rng = np.random.RandomState(random_state) if not hasattr(
            random_state, "uniform") else random_state
        if rng.uniform() < self.p:
            return self.default
        return self.distribution.rvs(random_state=rng)

    def __repr__(self):
        return f"DefaultOr({self.distribution!r}, {self.default!r}, p={self.p})"


def _is_close(value, default):
    numbers = (int, float)
    return (isinstance(value, numbers) and isinstance(default, numbers)
            and not isinstance(value, bool) and not isinstance(default, bool)
            and math.isclose(value, default, rel_tol=1e-9))


def _log_range(low, high, kind, n_points):
    """A strength searched on a log scale between ``low`` and ``high``."""
    if kind == "distributions":
        return loguniform(low, high)
    if n_points == 1:
        return [float((low * high) ** 0.5)]
    return [float(low * (high / low) ** (k / (n_points - 1))) for k in range(n_points)]
