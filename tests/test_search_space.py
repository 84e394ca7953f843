"""Tests of sklearn_fedmf.model_selection.default_search_space."""

import numpy as np
import pytest
from scipy.stats import loguniform
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.model_selection import (
    GridSearchCV,
    HalvingGridSearchCV,
    KFold,
    ParameterGrid,
    ParameterSampler,
    RandomizedSearchCV,
)

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.model_selection import default_search_space, train_test_split_ratings
from sklearn_fedmf.model_selection._search import DefaultOr

WITH_REGULARIZATION = (FedMCADMM, FedMAvg, FedMGS)
def _subspaces(space):
    return space if isinstance(space, list) else [space]


@pytest.mark.parametrize("cls", [*WITH_REGULARIZATION, RFRec])
def test_every_key_is_a_parameter_and_strengths_centre_on_the_defaults(cls):
    params = cls().get_params()
    space = default_search_space(cls, n_points=4)
    has_regularization = "regularization" in params
    assert isinstance(space, list) == has_regularization
    for sub in _subspaces(space):
        assert set(sub) <= set(params) and "max_iter" not in sub  # rounds: the resource
        assert all(isinstance(v, list) and v for v in sub.values())
        for value in sub.get("regularization", []):  # a value the estimator accepts
            cls(regularization=value)._validate_params()
        # 4 points, and the default as a fifth where it is not one of them
        points = [v for v in sub["alpha_u"] if v != "auto"]
        assert len(sub["alpha_u"]) in (4, 5) and points == sorted(set(points))
        assert sub["biased"] == [True, False]
    # one point per strength is the default of the estimator's own regularization, exactly
    centre = default_search_space(cls(), n_points=1, include=["alpha_u", "alpha_v"])
    assert centre["alpha_u"] == [params["alpha_u"]]
    assert centre["alpha_v"] == [params["alpha_v"]]
    dists = default_search_space(cls(), kind="distributions")
    assert dists[0]["alpha_u"] == [params["alpha_u"]]  # the defaults alone, then the rest
    alpha_u = dists[1]["alpha_u"]  # the default, or a log-uniform draw
    assert isinstance(alpha_u, DefaultOr) and alpha_u.default == params["alpha_u"]
    assert isinstance(alpha_u.distribution, type(loguniform(1, 2)))


@pytest.mark.parametrize("cls", [*WITH_REGULARIZATION, RFRec, FedBaseline])
def test_the_defaults_are_a_candidate_of_the_distributions(cls):
    """The first sub-space is the defaults alone, and every other sub-space holds them
    too (its lists the default, each strength drawing it half the time): a random search
    draws the defaults whenever it draws the first sub-space."""
    defaults = cls().get_params()
    space = default_search_space(cls, kind="distributions")
    assert isinstance(space, list)
    point = {k: v[0] for k, v in space[0].items()}
    assert all(len(v) == 1 for v in space[0].values())
    assert point == {k: defaults[k] for k in point}
    rng = np.random.RandomState(0)
    for sub in space[1:]:
        for param, values in sub.items():
            if hasattr(values, "rvs") and "regularization" not in sub or (
                    hasattr(values, "rvs") and sub["regularization"] == [
                        defaults["regularization"]]):
                draws = [values.rvs(random_state=rng) for _ in range(400)]
                assert 0.4 < np.mean([d == defaults[param] for d in draws]) < 0.6
            elif isinstance(values, list) and param != "regularization" and len(values) > 1:
                assert defaults[param] in values
    points = list(ParameterSampler(space, n_iter=600, random_state=0))
    share = np.mean([p == point for p in points])
    # the first sub-space, drawn at random (and the defaults from the others, rarely)
    assert 1 / len(space) - 0.05 < share < 1 / len(space) + 0.1


@pytest.mark.parametrize("cls", [*WITH_REGULARIZATION, RFRec, FedBaseline])
@pytest.mark.parametrize("n_points", [1, 2, 3, 4])
def test_the_defaults_are_a_candidate_of_the_grid(cls, n_points, monkeypatch):
    candidates = list(ParameterGrid(default_search_space(cls, n_points=n_points)))
    defaults = cls().get_params()
    assert {k: defaults[k] for k in candidates[0]} in candidates
    # read from the class, not copied: a changed default stays a candidate
    changed = {"n_components": 7} if "n_components" in candidates[0] else {"alpha_u": 2.5}
    get_params = cls.get_params
    monkeypatch.setattr(cls, "get_params",
                        lambda self, deep=True: {**get_params(self, deep), **changed})
    candidates = list(ParameterGrid(default_search_space(cls, n_points=n_points)))
    defaults = {**defaults, **changed}
    assert {k: defaults[k] for k in candidates[0]} in candidates


def test_the_two_regularizations_have_their_own_strengths():
    for cls in WITH_REGULARIZATION:
        plain, weighted = default_search_space(cls, include=["regularization", "alpha_u",
                                                             "alpha_v"])
        assert plain["regularization"] == ["plain"]
        assert weighted["regularization"] == ["weighted"]
        # ALS-WR's strength is per rating: 0.1 at the centre for every estimator
        assert weighted["alpha_u"][1] == pytest.approx(0.1)
        assert weighted["alpha_v"][1] == pytest.approx(0.1)
        assert plain["alpha_u"][1] == cls().alpha_u  # the default itself, "auto" included
    # a strength left out stays the estimator's under its own regularization and is the
    # other one's default under the other (never plain's 10 per rating)
    plain, weighted = default_search_space(FedMAvg(alpha_u=2.0), include=["regularization"])
    assert plain == {"regularization": ["plain"]}
    assert weighted == {"regularization": ["weighted"], "alpha_u": [pytest.approx(0.1)],
                        "alpha_v": [pytest.approx(0.1)]}
    # without the regularization in the space, the strengths follow the estimator's own
    own = default_search_space(FedMGS(regularization="weighted"), include=["alpha_u"])
    assert own == {"alpha_u": pytest.approx([0.1 / 3, 0.1, 0.3])}
    low, auto, high = default_search_space("FedMGS", include=["alpha_u"])["alpha_u"]
    assert (low, auto, high) == (pytest.approx(10 / 3), "auto", pytest.approx(30.0))
    with pytest.raises(ValueError, match=r"has no default range for \['regularization'\]"):
        default_search_space(RFRec, include=["regularization"])
    with pytest.raises(ValueError, match="No default search space"):
        default_search_space(KFold)
    with pytest.raises(ValueError, match="has no default range"):
        default_search_space(FedMAvg(), include=["nonsense"])
    with pytest.raises(ValueError, match="kind must be"):
        default_search_space(FedMAvg(), kind="random")


@pytest.fixture
def pairs():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(30, 2)) @ rng.normal(size=(2, 10)) + 3
    users, items = np.nonzero(rng.random(M.shape) < 0.7)
    return np.column_stack([users, items]), M[users, items]


def _prefixed(space):
    return [{f"estimator__{k}": v for k, v in sub.items()} for sub in _subspaces(space)]


def test_grid_search_over_both_regularizations_through_rating_regressor(pairs):
    X, y = pairs
    base = RatingRegressor(FedMAvg(n_components=2, n_clients=3, max_iter=3, random_state=0))
    space = default_search_space(FedMAvg, n_points=1, include=["regularization", "alpha_u"])
    cv = KFold(2, shuffle=True, random_state=0)  # entry-wise: folds of the ratings
    search = GridSearchCV(base, _prefixed(space), cv=cv,
                          scoring="neg_root_mean_squared_error").fit(X, y)
    # each regularization with its own strength: never plain at 0.1 nor weighted at 10
    assert search.cv_results_["params"] == [
        # (the plain sub-grid holds FedMAvg's default, "auto")
        {"estimator__regularization": "plain", "estimator__alpha_u": "auto"},
        {"estimator__regularization": "weighted", "estimator__alpha_u": pytest.approx(0.1),
         "estimator__alpha_v": pytest.approx(0.1)},  # (left out: its own default)
    ]
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()
    assert search.best_estimator_.estimator_.regularization == (
        search.best_params_["estimator__regularization"])


def test_randomized_and_halving_searches_take_the_space(pairs):
    X, y = pairs
    base = RatingRegressor(FedMGS(n_components=2, n_clients=3, max_iter=3, random_state=0))
    cv = KFold(2, shuffle=True, random_state=0)
    dists = default_search_space(FedMGS, kind="distributions",
                                 include=["regularization", "alpha_u"])
    rand = RandomizedSearchCV(base, _prefixed(dists), n_iter=6, cv=cv, random_state=0,
                              refit=False).fit(X, y)
    ranges = {"plain": (10 / 3, 30.0), "weighted": (0.1 / 3, 0.3)}
    for params in rand.cv_results_["params"]:
        low, high = ranges[params["estimator__regularization"]]
        if params["estimator__alpha_u"] != "auto":  # (the default of "plain", drawn too)
            assert low <= params["estimator__alpha_u"] <= high
    grid = default_search_space(FedMGS, n_points=1, include=["regularization", "biased"])
    halving = HalvingGridSearchCV(base, _prefixed(grid), resource="estimator__max_iter",
                                  max_resources=4, min_resources=2, factor=2, cv=cv,
                                  refit=False).fit(X, y)
    # 4 candidates at 2 rounds, the best 2 at 4 rounds
    assert list(halving.n_resources_) == [2, 4]
    assert list(halving.n_candidates_) == [4, 2]


def test_grid_of_the_matrix_estimators_still_runs():
    rng = np.random.default_rng(0)
    M = rng.normal(size=(40, 2)) @ rng.normal(size=(2, 12)) + 3
    X = np.where(rng.random(M.shape) < 0.7, M, np.nan)
    X_fit, X_held = train_test_split_ratings(X, 0.2, random_state=0)
    base = FedMAvg(n_components=2, n_clients=4, max_iter=3, random_state=0)
    grid = GridSearchCV(base, default_search_space(base, include=["alpha_u", "biased"],
                                                   n_points=2),
                        cv=KFold(2, shuffle=True, random_state=0)).fit(X_fit, X_held)
    # 2 strengths and the default 10 between them, x biased
    assert len(grid.cv_results_["params"]) == 6
