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


def test_one_client_per_user_learns_the_items_slowly(split, default_rmse):
    per_user = _rmse(RFRec(n_clients=None, random_state=0), split)
    assert per_user > default_rmse + 0.005


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
