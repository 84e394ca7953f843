"""The site-like rating sets: stated scale and activity, and biases that are near optimal."""

import numpy as np
import pytest
from sklearn.model_selection import train_test_split

from sklearn_fedmf.datasets import SITE_PRESETS, make_ratings, make_site_ratings


def _fit_biases(rows, cols, ratings, shape, reg_u=15.0, reg_i=10.0, n_iter=15):
    """Shrunk user and item biases by alternating least squares (Surprise's BaselineOnly)."""
    mu = ratings.mean()
    n_u = np.bincount(rows, minlength=shape[0])
    n_i = np.bincount(cols, minlength=shape[1])
    b_u = np.zeros(shape[0])
    for _ in range(n_iter):
        b_i = np.bincount(cols, ratings - mu - b_u[rows], shape[1]) / (n_i + reg_i)
        b_u = np.bincount(rows, ratings - mu - b_i[cols], shape[0]) / (n_u + reg_u)
    return mu, b_u, b_i


def _biases_gap(X, expected, rating_scale):
    """Test RMSE of fitted biases minus that of the planted noise-free values (80/20 split
    of the ratings)."""
    X, expected = X.tocoo(), expected.tocoo()
    train, test = train_test_split(np.arange(X.nnz), test_size=0.2, random_state=0)
    mu, b_u, b_i = _fit_biases(X.row[train], X.col[train], X.data[train], X.shape)
    lo, hi = rating_scale
    y = X.data[test]
    biases = np.clip(mu + b_u[X.row[test]] + b_i[X.col[test]], lo, hi)
    oracle = np.clip(expected.data[test], lo, hi)
    return np.sqrt(np.mean((biases - y) ** 2)) - np.sqrt(np.mean((oracle - y) ** 2))


@pytest.mark.parametrize("preset", ["filmtrust", "douban", "epinions"])
def test_presets_have_their_shape_scale_and_median_activity(preset):
    params = SITE_PRESETS[preset]
    X = make_site_ratings(preset, random_state=0).X
    assert X.shape == (params["n_users"], params["n_items"])
    assert X.nnz == params["n_ratings"]
    lo, hi = params["rating_scale"]
    grid = lo + params["step"] * np.arange(round((hi - lo) / params["step"]) + 1)
    assert set(np.unique(X.data)) == set(grid)  # every level used, none other
    activity = np.diff(X.indptr)
    assert activity.min() >= 1
    assert abs(np.median(activity) - params["median_activity"]) <= 0.15 * params[
        "median_activity"]
    # heavy tail: the most active user has many times the median
    assert activity.max() > 10 * np.median(activity)


def test_filmtrust_is_half_stars_on_half_to_four():
    X = make_site_ratings("filmtrust", random_state=1).X
    assert X.data.min() == 0.5 and X.data.max() == 4.0
    assert np.all(np.mod(X.data * 2, 1) == 0)
    assert 10 <= np.median(np.diff(X.indptr)) <= 20


def test_items_are_popularity_skewed():
    X = make_site_ratings("douban", random_state=0).X
    per_item = np.sort(np.diff(X.tocsc().indptr))[::-1]
    # the 1% most rated items hold far more than 1% of the ratings
    assert per_item[: len(per_item) // 100].sum() > 0.08 * X.nnz


def test_n_ratings_scales_users_and_keeps_the_activity():
    small = make_site_ratings("filmtrust", random_state=0).X
    big = make_site_ratings("filmtrust", n_ratings=142_000, random_state=0).X
    assert big.nnz == 142_000
    assert big.shape[0] == round(1508 * 142_000 / 35497)
    assert abs(np.median(np.diff(big.indptr)) - np.median(np.diff(small.indptr))) <= 2


@pytest.mark.parametrize("preset", ["filmtrust", "douban"])
def test_biases_alone_are_near_the_truth_on_bias_dominated_presets(preset):
    data = make_site_ratings(preset, random_state=0)
    gap = _biases_gap(data.X, data.expected, data.params["rating_scale"])
    # within a tenth of the noise of the planted model; on make_ratings' low-rank sets the
    # same fit is far off (next test)
    assert 0 <= gap < 0.1 * data.params["noise"]


def test_biases_alone_are_far_from_the_truth_on_make_ratings():
    data = make_ratings(1500, 2000, 36000, noise=0.7, random_state=0)
    X = data.X.tocsr()
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    expected = X.copy()
    expected.data = data.offset + np.einsum("ij,ij->i", data.user_factors[rows],
                                            data.item_factors[X.indices])
    assert _biases_gap(X, expected, (1, 5)) > 0.2


def test_seeded_and_deterministic():
    a = make_site_ratings("epinions", random_state=3).X
    b = make_site_ratings("epinions", random_state=3).X
    c = make_site_ratings("epinions", random_state=4).X
    assert (a != b).nnz == 0
    assert (a != c).nnz > 0


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="preset must be one of"):
        make_site_ratings("movielens")
    with pytest.raises(TypeError, match="Unknown settings"):
        make_site_ratings("douban", noise_level=1.0)
    with pytest.raises(ValueError, match="median_activity"):
        make_site_ratings("douban", median_activity=100)
    with pytest.raises(ValueError, match="rating_scale"):
        make_site_ratings("douban", rating_scale=(5, 1))
