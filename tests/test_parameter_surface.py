"""The completion estimators' parameter surface (issue 25): a constructor of at most 18
parameters (23 once validation, the implicit loss and secure aggregation add theirs; 24 with
``privacy``, issue 39), the
papers' constants in ``solver_params`` declared per class, the removed names refused with
their new place, and the shared parameters described once."""

import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RFRec
from sklearn_fedmf._docstrings import SHARED_PARAMETERS
from sklearn_fedmf.cli._registry import METHODS, make_estimator
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.engine._fit import merge_params, route_solver_params

from .test_docstrings import described_parameters

COMPLETION = [FedMCADMM, FedMAvg, FedMGS, RFRec, FedBaseline]
IDS = [cls.__name__ for cls in COMPLETION]
# the parameters the next issues add to every completion estimator
COMING = ("validation_fraction", "early_stopping", "n_iter_no_change", "loss",
          "secure_aggregation", "privacy")


@pytest.mark.parametrize("cls", COMPLETION, ids=IDS)
def test_constructor_leaves_room_for_the_coming_parameters(cls):
    params = cls().get_params()
    assert len(set(params) | set(COMING)) <= 24  # (a coming one already added counts once)
    assert "solver_params" in params and params["solver_params"] is None
    assert not set(params) & set(cls._solver_params)  # a name lives in one place


@pytest.mark.parametrize("cls", COMPLETION, ids=IDS)
def test_every_solver_key_was_a_parameter_and_names_its_new_place(cls):
    for key, (default, _) in cls._solver_params.items():
        with pytest.raises(TypeError, match=rf"`{key}` moved to `solver_params\['{key}'\]`"):
            cls(**{key: default})
    # the declared defaults are what a fit reads when solver_params is None
    settings = cls()._settings()
    for key, (default, _) in cls._solver_params.items():
        assert settings[key] is default or settings[key] == default or np.isnan(default)


@pytest.mark.parametrize("cls", COMPLETION, ids=IDS)
def test_unknown_or_bad_solver_keys_are_refused_at_fit(cls):
    X = np.array([[1.0, 2.0, np.nan], [3.0, np.nan, 4.0], [np.nan, 5.0, 1.0]])
    with pytest.raises(ValueError, match="no key 'n_clients'; its keys are"):
        cls(n_clients=1, solver_params={"n_clients": 2}).fit(X)
    with pytest.raises(ValueError, match=f"{cls.__name__}.solver_params"):
        cls(n_clients=1, solver_params={"eval_every": -1}).fit(X)


def test_a_solver_key_gives_the_model_of_the_former_parameter():
    """The key reaches the solver: FedMAvg's d_factor changes the model, its default does
    not (solver_params={"d_factor": 5.0} is the same fit as solver_params=None)."""
    rng = np.random.default_rng(0)
    X = np.where(rng.random((30, 12)) < 0.5, rng.normal(size=(30, 12)), np.nan)
    fit = dict(n_components=2, n_clients=3, max_iter=5, random_state=0)
    base = FedMAvg(**fit).fit(X).components_
    same = FedMAvg(**fit, solver_params={"d_factor": 5.0}).fit(X).components_
    other = FedMAvg(**fit, solver_params={"d_factor": 2.0}).fit(X).components_
    np.testing.assert_array_equal(base, same)
    assert np.abs(base - other).max() > 1e-6


@pytest.mark.parametrize("cls", COMPLETION, ids=IDS)
def test_shared_parameters_are_described_once(cls):
    described = described_parameters(cls.__doc__)
    assert "%(" not in cls.__doc__  # every substitution filled
    for name in ("callback", "warm_start", "n_jobs", "verbose", "clip", "tol"):
        assert SHARED_PARAMETERS[name].split("\n")[0] in described[name]
    # each solver key is listed in the solver_params entry with its default
    entry = described["solver_params"]
    for key in cls._solver_params:
        assert f"``{key}`` :" in entry


def test_paper_settings_are_one_call_and_merge_with_a_callers_keys():
    assert FedMCADMM(**PAPER_SETTINGS["FedMCADMM"])._settings()["init_scale"] == 1.0
    rfrecf = RFRec(**PAPER_SETTINGS["RFRecF"])._settings()
    # the authors' code: Adam, the sigmoid link, p = 0.8 and a full pull (eta = 1)
    assert (rfrecf["variant"], rfrecf["p"], rfrecf["pull_eta"], rfrecf["optimizer"]) == (
        "rfrecf", 0.8, 1.0, "adam")
    merged = merge_params(PAPER_SETTINGS["FedMCADMM"], {"solver_params": {"center": False}})
    assert merged["solver_params"] == {"init_scale": 1.0, "center": False}
    assert PAPER_SETTINGS["FedMCADMM"]["solver_params"] == {"init_scale": 1.0}  # not mutated


def test_route_solver_params_moves_only_declared_keys():
    routed = route_solver_params(FedMAvg, {"d_factor": 2.0, "max_iter": 3,
                                           "solver_params": {"variant": "fedpalm"}})
    assert routed == {"max_iter": 3, "solver_params": {"variant": "fedpalm", "d_factor": 2.0}}
    assert route_solver_params(FedMAvg, {"max_iter": 3}) == {"max_iter": 3}


def test_the_command_line_sets_a_solver_key_by_its_name():
    args = SimpleNamespace(set=[("d_factor", 2.0), ("center", False)], explicit=set())
    estimator = make_estimator(METHODS["fedmavg"], args)
    # the papers' variant of the registry is kept, the two keys are added
    assert estimator.solver_params == {"variant": "fedmc_admm", "d_factor": 2.0,
                                       "center": False}
    rfrecf = make_estimator(METHODS["rfrecf"], SimpleNamespace(set=[], explicit=set()))
    assert rfrecf._settings()["variant"] == "rfrecf"
    assert rfrecf._settings()["optimizer"] == "adam"  # the code's settings, merged
    # the "defaults" row of `fedmf run --method rfrecf` is RFRecF too, with the defaults
    default = make_estimator(METHODS["rfrecf"], SimpleNamespace(set=[], explicit=set()),
                             settings="defaults")
    assert default.solver_params == {"variant": "rfrecf"}


def test_fit_settings_are_declared_not_probed():
    """The skeleton reads every setting through ``_settings``: the class's declared
    defaults, its parameters and its solver keys; no ``getattr`` fallback in ``_fit``."""
    import sklearn_fedmf.engine._fit as fit_module

    source = inspect.getsource(fit_module.FederatedEstimator)
    assert "getattr(self" not in source and "hasattr(self, name)" not in source
    assert FedBaseline()._settings()["center"] is True  # fixed, not a key
    assert "center" not in FedBaseline._solver_params
