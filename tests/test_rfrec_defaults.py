"""RFRec's defaults and paper settings on a bias-dominated, heavy-tailed set (issue 26).

The set is built like the sets where the former defaults lost to biases alone and the former
paper settings diverged: FilmTrust's shape and 0.5-4 half-star scale, a few users with
hundreds of ratings, and biases that explain nearly everything.
"""

import numpy as np
import pytest

from sklearn_fedmf import RatingRegressor, RFRec
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.datasets import make_site_ratings

from .test_site_like import _fit_biases


@pytest.fixture(scope="module")
def split():
    X = make_site_ratings("filmtrust", n_ratings=15000, random_state=0).X.tocoo()
    test = np.random.default_rng(0).random(X.nnz) < 0.2  # 80/20 of the ratings
    pairs = np.column_stack([X.row, X.col])
    return pairs[~test], X.data[~test], pairs[test], X.data[test], X.shape


def _rmse(estimator, split):
    P_train, y_train, P_test, y_test, _ = split
    model = RatingRegressor(estimator).fit(P_train, y_train)
    return float(np.sqrt(np.mean((model.predict(P_test) - y_test) ** 2)))


@pytest.fixture(scope="module")
def biases_rmse(split):
    P_train, y_train, P_test, y_test, shape = split
    mu, b_u, b_i = _fit_biases(P_train[:, 0], P_train[:, 1], y_train, shape)
    pred = np.clip(mu + b_u[P_test[:, 0]] + b_i[P_test[:, 1]], 0.5, 4.0)
    return float(np.sqrt(np.mean((pred - y_test) ** 2)))


@pytest.fixture(scope="module")
def default_rmse(split):
    return _rmse(RFRec(random_state=0), split)


def test_defaults_are_not_worse_than_biases_alone(default_rmse, biases_rmse):
    # (the former default, one client per user, was 0.011 worse than biases on FilmTrust's
    # full shape: the item columns move by n_j / N of a step per round)
    assert default_rmse <= biases_rmse + 0.005


def test_one_client_per_user_learns_the_items_slowly(split):
    # (the factor models themselves, without the biases-only floor that now catches the
    # per-user model on validation)
    grouped = _rmse(RFRec(early_stopping=False, random_state=0), split)
    per_user = _rmse(RFRec(n_clients=None, early_stopping=False, random_state=0), split)
    assert per_user > grouped + 0.005


def test_rfrecf_defaults_are_within_0_01_of_rfrec(split, default_rmse):
    rfrecf = _rmse(RFRec(solver_params={"variant": "rfrecf"}, random_state=0), split)
    assert rfrecf <= default_rmse + 0.01


def test_paper_settings_do_not_diverge_where_plain_steps_did(split):
    # the former paper settings: the paper's alpha as a plain gradient step, a user per client
    plain = {"alpha_u": 0.1, "alpha_v": 0.0, "biased": False, "learning_rate": 0.05,
             "n_clients": None}
    with pytest.raises(FloatingPointError, match="learning_rate"):
        _rmse(RFRec(**plain, max_iter=30, random_state=0), split)
    rmse = _rmse(RFRec(**PAPER_SETTINGS["RFRec"], random_state=0), split)
    assert rmse < np.std(split[3])  # finite, and better than the test ratings' own mean


# ---- RFRecF's "auto" schedule (issue 26) -----------------------------------------------
@pytest.mark.parametrize("p", [0.2, 0.5])
def test_rfrecf_shared_columns_follow_grad_F_in_expectation(p):
    """L2GD is unbiased: with probability 1 - p a main step, with p a pull, and on the
    columns every client shares the expected change is a gradient step on ``F``,
    ``-a (2 reg_v W + reg (W - Vbar))`` with ``a = p / reg`` (the "auto" pull is 1). The
    former main step 1 / curvature set these columns to 0 on every main round."""
    from sklearn_fedmf.completion._rfrec._rfrec_protocol import _shared_op, pull_strength

    rng = np.random.default_rng(0)
    W, Vbar = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    reg, reg_v = 10.0, 0.45
    eta = pull_strength(None, reg, reg_v, p, None)
    common = dict(lr=None, reg=reg, reg_v=reg_v, p=p, eta=eta, optimizer="gd")
    main = _shared_op(W, None, Vbar, "main", **common)[0]
    pulled = _shared_op(W, None, Vbar, "pull", **common)[0]
    expected = (1 - p) * (main - W) + p * (pulled - W)
    step = p / reg
    np.testing.assert_allclose(expected, -step * (2 * reg_v * W + reg * (W - Vbar)),
                               atol=1e-12)


@pytest.mark.parametrize("p, rounds", [(0.2, 125), (0.5, 200)])
def test_rfrecf_default_rounds_make_rfrecs_fit_steps(p, rounds):
    """``max_iter=None``: RFRec's 100 rounds, and for RFRecF the flips whose expected fit
    steps (a flip steps with probability 1 - p) are 100."""
    X = make_site_ratings("filmtrust", n_ratings=600, random_state=0).X
    rfrecf = RFRec(n_components=2, early_stopping=False, random_state=0,
                   solver_params={"variant": "rfrecf", "p": p}).fit(X)
    assert rfrecf.n_iter_ == rounds
    assert RFRec(n_components=2, early_stopping=False, random_state=0).fit(X).n_iter_ == 100


def test_rfrecf_early_stopping_scores_the_averaging_rounds(split):
    """Between two averages the server's model does not change: RFRecF's best validated
    round is a round that averages (coin 1), and the rounds of coin 0 are not scored."""
    P_train, y_train, _, _, _ = split
    model = RatingRegressor(RFRec(random_state=0, solver_params={"variant": "rfrecf"})).fit(
        P_train, y_train).estimator_
    history = model.history_
    assert history[model.best_iteration_ - 1]["coin"] == 1
    scored = [r["validation_rmse"] for r in history if r.get("coin") == 1]
    assert -model.best_validation_score_ == min(scored)
