"""One privacy object: ``privacy=LocalDP(...)`` configures every noise-adding estimator alike.

Checked here: ``LocalDP`` is a scikit-learn parameter object (``clone``, ``set_params``, a
grid over ``privacy__epsilon``); the removed parameters raise a ``TypeError`` naming their
new place while the constructors' signatures stay introspectable; the same ``LocalDP`` gives
the same per-release epsilon and the same accounting in Felb, RFRec and AggregatedBMF; the
three ways to set the noise (``epsilon``, ``noise``, ``target_epsilon``) agree; bad settings
are refused at fit.
"""

import inspect

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.utils._param_validation import InvalidParameterError

from sklearn_fedmf import RFRec
from sklearn_fedmf.binary import AggregatedBMF, Felb
from sklearn_fedmf.datasets import make_binary_tiles
from sklearn_fedmf.exceptions import DegenerateFitWarning, PrivacyWarning
from sklearn_fedmf.flower._sites import site_estimator, travelling_params
from sklearn_fedmf.privacy import LocalDP, epsilon_spent
from sklearn_fedmf.privacy._local_dp import MOVED_TO_LOCAL_DP

from .conftest import rated_ratings

# the noise of these small budgets may leave an empty Boolean model: only privacy is tested
pytestmark = pytest.mark.filterwarnings("ignore", category=DegenerateFitWarning)

# each estimator's former privacy parameters (before privacy=LocalDP)
FORMER = {
    Felb: ["epsilon", "delta", "target_epsilon", "target_delta", "accountant", "calibration",
           "dp_clip", "sensitivity"],
    RFRec: ["dp_clip", "noise_scale", "target_epsilon", "target_delta", "accountant"],
    AggregatedBMF: ["epsilon"],
}


def _binary():
    return make_binary_tiles(40, 16, 2, noise=0.0, tile_density=1.0, random_state=0).X


def _felb(privacy, **params):
    return Felb(n_components=2, n_clients=4, max_iter=5, sync_every=2, privacy=privacy,
                random_state=0, **params)


def _rfrec(privacy, **params):
    return RFRec(n_components=2, learning_rate=0.01, max_iter=5, privacy=privacy,
                 random_state=0, **params)


# ---- a scikit-learn parameter object ---------------------------------------------------------
def test_clone_and_nested_params():
    model = _felb(LocalDP("laplace", epsilon=1.0, clip=1.5))
    params = model.get_params()
    assert params["privacy__epsilon"] == 1.0 and params["privacy__clip"] == 1.5
    copy = clone(model)
    assert copy.privacy is not model.privacy  # a fresh object, equal parameters
    assert copy.privacy.get_params() == model.privacy.get_params()
    copy.set_params(privacy__epsilon=5.0)
    assert copy.privacy.epsilon == 5.0 and model.privacy.epsilon == 1.0


def test_grid_search_over_the_privacy_level():
    A = _binary()
    search = GridSearchCV(_felb(LocalDP("laplace", epsilon=1.0, clip=1.5)),
                          {"privacy__epsilon": [0.5, 5.0]}, cv=2).fit(A)
    assert [p["privacy__epsilon"] for p in search.cv_results_["params"]] == [0.5, 5.0]
    best = search.best_estimator_
    assert best.privacy.epsilon == search.best_params_["privacy__epsilon"]
    # the refitted model was noised at the searched level: Laplace scale clip / epsilon
    assert best.noise_scale_ == pytest.approx(1.5 / best.privacy.epsilon)
    # and the grid's search space is the same for RFRec (one spelling for every estimator)
    X = rated_ratings()
    search = GridSearchCV(_rfrec(LocalDP(epsilon=1.0, clip=0.5)),
                          {"privacy__epsilon": [0.5, 5.0]}, cv=2).fit(X)
    assert search.best_estimator_.epsilon_ == pytest.approx(
        search.best_params_["privacy__epsilon"])


# ---- removed parameters ----------------------------------------------------------------------
@pytest.mark.parametrize("cls", list(FORMER))
def test_removed_parameters_name_their_new_place(cls):
    for name in FORMER[cls]:
        with pytest.raises(TypeError, match=rf"`{name}` moved to "
                                            rf"`privacy=LocalDP\({MOVED_TO_LOCAL_DP[name]}=\.\.\.\)`"):
            cls(**{name: 1.0})
    # the constructor's own signature stays visible to get_params and clone
    signature = inspect.signature(cls)
    assert "privacy" in signature.parameters
    assert not any(p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
                   for p in signature.parameters.values())
    assert set(cls().get_params(deep=False)) == set(signature.parameters)
    assert not set(FORMER[cls]) & set(signature.parameters)
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such'"):
        cls(no_such=1)


def test_a_mechanism_name_is_no_longer_a_privacy_value():
    with pytest.raises(InvalidParameterError, match="LocalDP"):
        Felb(privacy="gaussian").fit(_binary())


# ---- one settings function, one reader -------------------------------------------------------
def test_the_same_object_gives_the_same_accounting_everywhere():
    # Laplace noise of per-upload epsilon 0.5 with the same clip: Felb's entries move by clip,
    # RFRec's by 2 clip, so the scales differ by 2 while the epsilon and the spent budget of
    # the same number of releases are the same
    privacy = LocalDP("laplace", epsilon=0.5, clip=0.4)
    felb = _felb(privacy).fit(_binary())
    rfrec = _rfrec(privacy).fit(rated_ratings())
    assert felb.noise_scale_ == pytest.approx(0.4 / 0.5)
    assert rfrec.noise_scale_ == pytest.approx(2 * 0.4 / 0.5)
    assert felb.epsilon_ == pytest.approx(0.5) and rfrec.epsilon_ == pytest.approx(0.5)
    expected = epsilon_spent("laplace", 1 / 0.5, 5, 1e-5, "pld")
    for model in (felb, rfrec):
        assert model.accountant_ == "pld"
        assert model.privacy_spent_["n_releases"].tolist() == [5] * model.n_clients_
        np.testing.assert_allclose(model.privacy_spent_["epsilon"], expected)


def test_epsilon_noise_and_target_agree():
    A = _binary()
    by_epsilon = _felb(LocalDP("laplace", epsilon=0.5, clip=1.5)).fit(A)
    by_noise = _felb(LocalDP("laplace", noise=1.5 / 0.5, clip=1.5)).fit(A)
    # the same noise: the same model, the same accounting
    np.testing.assert_array_equal(by_epsilon.components_relaxed_, by_noise.components_relaxed_)
    assert by_noise.epsilon_ == pytest.approx(0.5)
    np.testing.assert_allclose(by_noise.privacy_spent_["epsilon"],
                               by_epsilon.privacy_spent_["epsilon"])
    # a whole-fit budget of what 5 releases of epsilon 0.5 spend needs that very noise
    total = float(by_epsilon.privacy_spent_["epsilon"][0])
    by_target = _felb(LocalDP("laplace", target_epsilon=total, clip=1.5)).fit(A)
    assert by_target.noise_scale_ == pytest.approx(1.5 / 0.5, rel=1e-3)
    assert np.all(by_target.privacy_spent_["epsilon"] <= total * (1 + 1e-6))


def test_a_single_pure_release_needs_no_accountant():
    agg = AggregatedBMF(n_components=2, n_clients=4, local_iter=20, random_state=0,
                        privacy=LocalDP(epsilon=0.7)).fit(_binary())
    assert agg.accountant_ == "basic" and agg.epsilon_ == pytest.approx(0.7)
    assert agg.noise_scale_ == pytest.approx(1 / (1 + np.exp(0.7)))  # "auto": flips
    np.testing.assert_allclose(agg.privacy_spent_["epsilon"], 0.7)
    assert agg.privacy_spent_["delta"].tolist() == [0.0] * 4


@pytest.mark.parametrize("make, data", [(_felb, _binary), (_rfrec, rated_ratings)])
def test_without_clipping_no_guarantee_is_reported(make, data):
    with pytest.warns(PrivacyWarning, match="without clipping"):
        model = make(LocalDP("laplace", epsilon=0.5)).fit(data())
    assert model.noise_scale_ > 0  # the noise is added ...
    assert model.privacy_spent_ is None and model.epsilon_ is None  # ... but proves nothing
    off = make(None).fit(data())
    assert off.noise_scale_ is None and off.privacy_spent_ is None and off.accountant_ is None


# ---- bad settings, refused at fit -------------------------------------------------------------
@pytest.mark.parametrize("make, data, privacy, match", [
    (_rfrec, rated_ratings, LocalDP("gaussian", epsilon=1.0, clip=0.5),
     r"RFRec supports LocalDP\(mechanism=...\) among \['auto', 'laplace'\]"),
    (lambda p: AggregatedBMF(privacy=p, n_components=2, n_clients=4, local_iter=5), _binary,
     LocalDP("laplace", epsilon=1.0, clip=0.5), "AggregatedBMF supports"),
    (_felb, _binary, LocalDP(clip=1.5), "exactly one of epsilon, noise and target_epsilon"),
    (_felb, _binary, LocalDP(epsilon=1.0, noise=0.1, clip=1.5), "got epsilon, noise"),
    (_felb, _binary, LocalDP("laplace", target_epsilon=1.0), "target_epsilon needs clip"),
    (_felb, _binary, LocalDP("bernoulli", noise=0.7), "flip probability above 1/2"),
])
def test_bad_settings_are_refused(make, data, privacy, match):
    with pytest.raises(ValueError, match=match):
        make(privacy).fit(data())


def test_fields_are_validated_at_fit():
    model = _felb(LocalDP(epsilon=-1.0, clip=1.5))  # __init__ only stores
    with pytest.raises(InvalidParameterError, match="'epsilon' parameter of LocalDP"):
        model.fit(_binary())


def test_the_object_travels_to_flower_sites():
    model = _felb(LocalDP("gaussian", epsilon=0.5, delta=0.05, clip=1.0))
    params = travelling_params(model)
    assert params["privacy"] == model.privacy.get_params()  # plain values only
    rebuilt = site_estimator("Felb", params)
    assert isinstance(rebuilt.privacy, LocalDP)
    assert rebuilt.privacy.get_params() == model.privacy.get_params()


def test_the_command_line_sets_fields_of_the_privacy_object():
    from sklearn_fedmf.cli import METHODS, build_parser
    from sklearn_fedmf.cli._messages import CommandError
    from sklearn_fedmf.cli._registry import make_estimator

    def estimator(*pairs):
        argv = ["run", "--method", "rfrec"] + [a for p in pairs for a in ("--set", p)]
        return make_estimator(METHODS["rfrec"], build_parser().parse_args(argv))

    est = estimator("privacy__clip=0.2", "privacy__noise=0.1")
    assert est.privacy.get_params() == LocalDP(clip=0.2, noise=0.1).get_params()
    with pytest.raises(CommandError, match="LocalDP has no field 'scale'"):
        estimator("privacy__scale=0.1")
    with pytest.raises(CommandError, match=r"--set privacy__clip=-1.*'clip' parameter"):
        estimator("privacy__clip=-1")
    with pytest.raises(CommandError, match="no parameter 'dp_clip'"):
        estimator("dp_clip=0.2")
