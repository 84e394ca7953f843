"""RFRec's ``"auto"`` strengths (issue 26, point 2): the fit runs on the ratings divided by
their root mean square, with strengths from counts the server holds, so that it is the same
model in any rating unit and duplicated users keep every per-entry strength."""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import RatingRegressor, RFRec
from sklearn_fedmf.completion._rfrec._rfrec import AUTO_ALPHA
from sklearn_fedmf.datasets import make_site_ratings

# (a few rounds leave the factor part negligible: the fits here check scales, not accuracy)
pytestmark = pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")


@pytest.fixture(scope="module")
def ratings():
    return make_site_ratings("filmtrust", n_ratings=4000, random_state=0).X.tocsr()


def _pairs(X):
    coo = X.tocoo()
    return np.column_stack([coo.row, coo.col]), coo.data


def test_auto_strengths_are_the_rule_on_the_scaled_ratings(ratings):
    model = RFRec(max_iter=3, random_state=0).fit(ratings)
    assert (model.alpha_u, model.alpha_v) == ("auto", "auto")
    centred = ratings.data - ratings.data.mean()
    assert model.rating_scale_ == pytest.approx(np.sqrt(np.mean(centred**2)), rel=1e-12)
    assert model.alpha_u_ == model.alpha_v_ == AUTO_ALPHA


@pytest.mark.parametrize("c", [0.1, 7.0])
def test_ratings_times_c_give_predictions_times_c(ratings, c):
    P, y = _pairs(ratings)
    base = RatingRegressor(RFRec(max_iter=20, random_state=0)).fit(P, y)
    scaled = RatingRegressor(RFRec(max_iter=20, random_state=0)).fit(P, c * y)
    np.testing.assert_allclose(scaled.predict(P), c * base.predict(P), rtol=1e-9, atol=1e-9)
    m1, mc = base.estimator_, scaled.estimator_
    assert mc.history_[-1]["train_rmse"] == pytest.approx(c * m1.history_[-1]["train_rmse"])
    assert mc.alpha_u_ == m1.alpha_u_ and mc.alpha_v_ == pytest.approx(m1.alpha_v_)


def test_fold_in_is_on_the_fits_scale(ratings):
    c = 3.0
    m1 = RFRec(max_iter=20, random_state=0).fit(ratings)
    mc = RFRec(max_iter=20, random_state=0).fit(ratings * c)
    np.testing.assert_allclose(mc.predict(ratings * c, at=ratings).data,
                               c * m1.predict(ratings, at=ratings).data, rtol=1e-9)
    np.testing.assert_allclose(mc.transform(ratings * c), np.sqrt(c) * m1.transform(ratings),
                               rtol=1e-7, atol=1e-9)


def test_personal_predictions_scale_with_the_ratings(ratings):
    params = dict(max_iter=10, random_state=0, solver_params={"predict_with": "personal"})
    m1 = RFRec(**params).fit(ratings)
    m3 = RFRec(**params).fit(ratings * 3.0)
    np.testing.assert_allclose(m3.predict(ratings * 3.0, at=ratings).data,
                               3.0 * m1.predict(ratings, at=ratings).data, rtol=1e-9)


def test_duplicated_users_keep_the_per_entry_strengths(ratings):
    # every user twice: the same ratings per user and the same spread, so the same strengths
    twice = sp.vstack([ratings, ratings]).tocsr()
    m1 = RFRec(max_iter=2, random_state=0).fit(ratings)
    m2 = RFRec(max_iter=2, random_state=0).fit(twice)
    assert m2.rating_scale_ == pytest.approx(m1.rating_scale_, rel=1e-12)
    assert (m2.alpha_u_, m2.alpha_v_) == (m1.alpha_u_, m1.alpha_v_)


def test_numbers_run_on_the_ratings_as_they_are(ratings):
    model = RFRec(alpha_u=4.5, alpha_v=4.5, max_iter=3, random_state=0).fit(ratings)
    assert (model.rating_scale_, model.alpha_u_, model.alpha_v_) == (1.0, 4.5, 4.5)


def test_a_number_beside_auto_keeps_its_factor_penalty(ratings):
    model = RFRec(alpha_u=2.0, max_iter=3, random_state=0).fit(ratings)
    assert model.alpha_u_ == pytest.approx(2.0 / model.rating_scale_)


def test_warm_start_keeps_the_first_fits_scale(ratings):
    model = RFRec(max_iter=3, warm_start=True, random_state=0).fit(ratings)
    scale, alpha_v = model.rating_scale_, model.alpha_v_
    model.fit(ratings)
    assert (model.rating_scale_, model.alpha_v_) == (scale, alpha_v)
    assert model.n_iter_ == 6


def test_sigmoid_link_is_not_rescaled(ratings):
    model = RFRec(biased=False, max_iter=3, random_state=0,
                  solver_params={"link": "sigmoid"}).fit(ratings)
    assert model.rating_scale_ == 1.0
