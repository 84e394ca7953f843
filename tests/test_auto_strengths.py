"""The ``"auto"`` strengths of FedMC-ADMM and FedMAvg (``completion/_auto_strengths``): the
rule's invariances, its bias start, and fits that follow the ratings' scale."""

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_allclose

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.completion._auto_strengths import (
    AUTO_ITEM,
    AUTO_USER,
    BIAS_START_PASSES,
    auto_setup,
    bias_shrinkages,
    degree_strengths,
    rating_moments,
)
from sklearn_fedmf.datasets import make_site_ratings
from sklearn_fedmf.model_selection import train_test_split_ratings

# (no early stopping: these tests read the rule on the whole training set, and a doubled
# set would cross the "auto" threshold of 10,000 ratings)
SMALL = dict(n_components=3, n_clients=4, max_iter=8, random_state=0, early_stopping=False)
ESTIMATORS = [FedMAvg, FedMCADMM, FedMGS]


def _centred(X):
    X = X.tocsr().astype(np.float64)
    X.data -= X.data.mean()
    return X


@pytest.fixture(scope="module")
def ratings():
    return make_site_ratings("filmtrust", n_ratings=6000, random_state=0).X.tocsr()


@pytest.mark.parametrize("c", [0.1, 7.0])
def test_rule_is_free_of_the_ratings_unit(ratings, c):
    one, scaled = auto_setup(_centred(ratings)), auto_setup(_centred(ratings) * c)
    assert scaled["scale"] == pytest.approx(c * one["scale"])
    for key in ("alpha_u", "alpha_v", "user_shrinkage"):
        assert scaled[key] == pytest.approx(one[key])
    assert_allclose(scaled["item_bias"], one["item_bias"], atol=1e-12)


def test_duplicated_users_keep_the_strengths_per_rating(ratings):
    X = _centred(ratings)
    twice = sp.vstack([X, X]).tocsr()
    one, two = auto_setup(X.copy()), auto_setup(twice)
    # n_u is unchanged, n_j doubles: the same strengths per rating
    assert two["alpha_u"] == pytest.approx(one["alpha_u"])
    assert two["alpha_v"] == pytest.approx(2 * one["alpha_v"])
    assert two["scale"] == pytest.approx(one["scale"])
    assert two["user_shrinkage"] == pytest.approx(one["user_shrinkage"])
    # (the items' shrinkage is empirical Bayes: twice the raters count as more evidence)


def test_rule_values_follow_the_ratings_per_row(ratings):
    X = _centred(ratings)
    auto = auto_setup(X.copy())
    users = np.count_nonzero(np.diff(X.indptr))
    items = np.count_nonzero(np.bincount(X.indices, minlength=X.shape[1]))
    assert auto["alpha_u"] == pytest.approx(AUTO_USER * np.sqrt(X.nnz / users))
    assert auto["alpha_v"] == pytest.approx(AUTO_ITEM * X.nnz / items)
    assert auto["scale"] == pytest.approx(np.sqrt(np.mean(X.data ** 2)))


def test_degrees_rule_values_and_duplicates(ratings):
    X = _centred(ratings)
    auto = auto_setup(X.copy(), rule="degrees")
    n_u = np.diff(X.indptr).astype(float)
    n_j = np.bincount(X.indices).astype(float)
    threshold = 0.5 * (np.sqrt(np.sum(n_u ** 2) / X.nnz) + np.sqrt(np.sum(n_j ** 2) / X.nnz))
    assert auto["alpha_u"] == pytest.approx(threshold)
    assert auto["alpha_v"] == pytest.approx(threshold)
    # duplicated users: a rating's user has as many ratings, its item twice as many
    two = auto_setup(sp.vstack([X, X]).tocsr(), rule="degrees")
    assert two["alpha_u"] == pytest.approx(
        0.5 * (np.sqrt(np.sum(n_u ** 2) / X.nnz) + np.sqrt(2 * np.sum(n_j ** 2) / X.nnz)))


def test_shrinkages_recover_the_planted_variances():
    """Biases of known variance plus noise: lambda = sigma^2 / tau^2 (empirical Bayes)."""
    rng = np.random.default_rng(0)
    n_users, n_items, per_user = 2000, 300, 40
    tau_u, tau_i, sigma = 0.5, 0.3, 1.0
    rows = np.repeat(np.arange(n_users), per_user)
    cols = np.concatenate([rng.choice(n_items, per_user, replace=False)
                           for _ in range(n_users)])
    b_u, b_i = tau_u * rng.normal(size=n_users), tau_i * rng.normal(size=n_items)
    values = b_u[rows] + b_i[cols] + sigma * rng.normal(size=rows.size)
    X = _centred(sp.csr_matrix((values, (rows, cols)), shape=(n_users, n_items)))
    lambda_u, lambda_i = bias_shrinkages(rating_moments(X))
    assert lambda_u == pytest.approx(sigma**2 / tau_u**2, rel=0.15)
    assert lambda_i == pytest.approx(sigma**2 / tau_i**2, rel=0.15)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.UnobservedItemsWarning")
@pytest.mark.parametrize("cls", [FedMAvg, FedMCADMM])  # (FedMGS: rating units, its own rule)
def test_predictions_follow_the_ratings_scale(ratings, cls):
    """Ratings times c: the same fit on the scaled ratings, predictions times c."""
    c = 10.0
    model = cls(**SMALL, clip=False).fit(ratings)
    scaled = cls(**SMALL, clip=False).fit(ratings * c)
    assert scaled.alpha_u_ == pytest.approx(model.alpha_u_)
    assert scaled.alpha_v_ == pytest.approx(model.alpha_v_)
    pattern = ratings[:50]
    assert_allclose(scaled.predict(pattern * c, at=pattern).data,
                    c * model.predict(pattern, at=pattern).data, rtol=1e-6)
    assert_allclose(scaled.item_bias_, c * model.item_bias_, rtol=1e-6, atol=1e-9)
    # the history is in rating units too
    assert scaled.history_[-1]["train_rmse"] == pytest.approx(
        c * model.history_[-1]["train_rmse"], rel=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.UnobservedItemsWarning")
@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")  # 8 rounds
@pytest.mark.parametrize("cls", [FedMAvg, FedMCADMM])  # (FedMGS's: the server's, per round)
def test_duplicated_users_fit_the_same_strengths_per_rating(ratings, cls):
    model = cls(**SMALL).fit(ratings)
    twice = cls(**SMALL).fit(sp.vstack([ratings, ratings]).tocsr())
    if cls is FedMCADMM:  # the ratings per row
        assert twice.alpha_u_ == pytest.approx(model.alpha_u_)
        assert twice.alpha_v_ == pytest.approx(2 * model.alpha_v_)
        return
    # FedMAvg's degrees rule: a rating's item has twice the ratings, its user as many
    n, n_u = ratings.nnz, np.diff(ratings.indptr).astype(float)
    n_j = np.bincount(ratings.indices).astype(float)
    assert model.alpha_u_ == model.alpha_v_ == pytest.approx(
        degree_strengths(n, np.sum(n_u ** 2), np.sum(n_j ** 2))[0])
    assert twice.alpha_u_ == pytest.approx(
        degree_strengths(2 * n, 2 * np.sum(n_u ** 2), 4 * np.sum(n_j ** 2))[0])


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.UnobservedItemsWarning")
@pytest.mark.parametrize("cls", [FedMAvg, FedMCADMM])
def test_fold_in_uses_the_fits_units(ratings, cls):
    """transform on the training rows (fold-in, scaled as the fit ran) gives the same
    factors whatever the ratings' unit, up to sqrt(c)."""
    c = 4.0
    model, scaled = cls(**SMALL).fit(ratings), cls(**SMALL).fit(ratings * c)
    assert_allclose(scaled.transform(ratings * c), np.sqrt(c) * model.transform(ratings),
                    rtol=1e-6, atol=1e-9)
    assert scaled.score(ratings * c) == pytest.approx(c * model.score(ratings), rel=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.UnobservedItemsWarning")
@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")  # 1 round
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_biases_start_at_their_shrunk_means(ratings, cls):
    """One round in, the fit is already about as good as the biases' start: far below the
    global mean's error (from 0 the biases need hundreds of rounds)."""
    model = cls(**{**SMALL, "max_iter": 1}).fit(ratings)
    spread = np.std(ratings.data)
    assert model.history_[0]["train_rmse"] < 0.9 * spread
    fixed = cls(**{**SMALL, "max_iter": 1}, alpha_u=1.0, alpha_v=1.0).fit(ratings)
    assert model.history_[0]["train_rmse"] < fixed.history_[0]["train_rmse"]


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.UnobservedItemsWarning")
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_fixed_strengths_and_paper_settings_are_unscaled(ratings, cls):
    model = cls(**{**SMALL, "max_iter": 2}, alpha_u=3.0, alpha_v=0.5).fit(ratings)
    assert (model.alpha_u_, model.alpha_v_, model._scale) == (3.0, 0.5, 1.0)
    paper = PAPER_SETTINGS[cls.__name__]
    model = cls(**{**SMALL, "max_iter": 2, **{k: v for k, v in paper.items()
                                                if k != "solver_params"}}).fit(ratings)
    assert model._scale == 1.0 and model.alpha_u_ == paper["alpha_u"]


@pytest.fixture(scope="module")
def biases_only_split():
    """Ratings whose structure is biases and noise only (no rank part: biases are optimal)."""
    X = make_site_ratings("douban", n_ratings=30000, interaction=0.0, random_state=0).X
    return train_test_split_ratings(X, 0.2, random_state=0)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("cls", ESTIMATORS)
def test_defaults_are_not_worse_than_biases_where_biases_are_optimal(biases_only_split, cls):
    """Issue 26's floor on data built so that biases are optimal: every default ends within
    0.005 RMSE of the federated biases-only model (measured: FedMAvg 0.7301, FedMC-ADMM
    0.7362, FedMGS 0.7392 against 0.7363)."""
    X_train, X_test = biases_only_split
    floor = -FedBaseline(random_state=0).fit(X_train).score(X_train, X_test)
    assert -cls(random_state=0).fit(X_train).score(X_train, X_test) <= floor + 0.005


def _biases_only(X, lambda_u, lambda_i, n_passes=500):
    """The biases-only model of the centred CSR ``X`` with the shrinkages given: alternating
    exact steps to convergence (the oracle)."""
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    user_counts, item_counts = np.diff(X.indptr), np.bincount(X.indices, minlength=X.shape[1])
    b_u, b_i = np.zeros(X.shape[0]), np.zeros(X.shape[1])
    for _ in range(n_passes):
        b_i = np.bincount(X.indices, weights=X.data - b_u[rows],
                          minlength=X.shape[1]) / (lambda_i + item_counts)
        b_u = np.bincount(rows, weights=X.data - b_i[X.indices],
                          minlength=X.shape[0]) / (lambda_u + user_counts)
    return b_u, b_i


def test_fedmc_admm_variant_biases_take_their_shrinkages(ratings):
    """FedMAvg's "fedmc_admm" variant under "auto": its biases' ridges are the
    empirical-Bayes shrinkages, not the factors' strengths, and they start at that
    biases-only model. With the factors held at 0 (``init_scale=0``) the fitted biases are
    that model (the oracle: alternating exact steps to convergence on the same ratings);
    with the factors' strengths on the biases they would be shrunk several times more."""
    X = ratings.tocsr().astype(np.float64)
    model = FedMAvg(**SMALL, solver_params={"variant": "fedmc_admm", "init_scale": 0.0}).fit(X)
    Xc = _centred(X)
    lambda_u, lambda_i = bias_shrinkages(rating_moments(Xc))
    b_u, b_i = _biases_only(Xc, lambda_u, lambda_i)
    assert not model.components_.any() and not model.user_factors_.any()
    # (the start is 11 passes from zero, about 4e-3 from converged on these ratings, and the
    # clients' unequal steps d_p weigh the average: b_i stays within 1e-3 of its start)
    assert_allclose(model.item_bias_, b_i, atol=6e-3)
    assert_allclose(model.user_bias_, b_u, atol=6e-3)
    shrunk_u, _ = _biases_only(Xc, model.alpha_u_, lambda_i)
    assert np.max(np.abs(shrunk_u - b_u)) > 5 * 6e-3  # (the test can tell the two apart)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.DegenerateFitWarning")
@pytest.mark.parametrize("cls, params, passes", [
    (FedMCADMM, {}, 0),
    (FedMAvg, {}, BIAS_START_PASSES),
    (FedMAvg, {"solver_params": {"variant": "fedmc_admm"}}, BIAS_START_PASSES),
    (FedMCADMM, {"biased": False}, None),
])
def test_auto_start_exchanges_are_counted_in_the_first_rounds_bytes(cls, params, passes):
    """The ``"auto"`` statistics are counted in round 1's bytes: against the same fit with
    fixed strengths (the same protocol messages), the first record has exactly, over the
    clients ``p`` with ``k_p`` rated items (4-byte indices, 8-byte numbers): up, two sums,
    a count of users and ``k_p`` (index, count, sum), then ``k_p`` sums for the biases'
    start and ``k_p`` per FedMAvg pass (its biases' own ridges); down, two numbers, and ``k_p`` per
    pass. Without biases
    (``passes=None``) no start of the biases is exchanged."""
    rng = np.random.default_rng(0)
    dense = np.where(rng.random((40, 25)) < 0.3, rng.integers(1, 6, (40, 25)), 0.0)
    X = sp.csr_matrix(dense)
    clients = np.arange(40) % 5
    k = sum(np.count_nonzero(dense[clients == p].any(axis=0)) for p in range(5))
    assert X.indices.dtype.itemsize == 4
    fixed = dict(n_clients=5, max_iter=1, validation_fraction=None, random_state=0, **params)
    auto = cls(**fixed).fit(X, clients=clients).history_[0]
    plain = cls(alpha_u=1.0, alpha_v=1.0, **fixed).fit(X, clients=clients).history_[0]
    start = (1 + (passes or 0)) if passes is not None else 0
    degrees = cls is FedMAvg and not params  # (its "degrees" rule: one more sum per client)
    assert auto["bytes_uploaded"] - plain["bytes_uploaded"] == (
        5 * (24 + 8 * degrees) + k * (4 + 16) + 8 * k * start)
    assert auto["bytes_downloaded"] - plain["bytes_downloaded"] == 5 * 16 + 8 * k * (passes or 0)
    # a warm start continues without a new start exchange: its rounds weigh the same
    warm = [cls(**strengths, warm_start=True, **fixed).fit(X, clients=clients)
            for strengths in ({}, dict(alpha_u=1.0, alpha_v=1.0))]
    records = [model.fit(X, clients=clients).history_[-1] for model in warm]
    assert records[0]["bytes_uploaded"] == records[1]["bytes_uploaded"]
    assert records[0]["bytes_downloaded"] == records[1]["bytes_downloaded"]


def test_start_bytes_counts_each_clients_rated_items_once():
    """``start_bytes``' ``sum_p k_p`` (the items each client rated): with one row per client
    it is the ratings' count (taken without the client-by-item product), with several rows
    per client the distinct items of each, brute force."""
    import scipy.sparse as sp

    from sklearn_fedmf.completion._auto_strengths import start_bytes

    X = sp.random(30, 12, density=0.4, random_state=0, format="csr")
    index = X.indices.dtype.itemsize
    for codes, n_clients in ((np.arange(30)[::-1].copy(), 30), (np.arange(30) % 4, 4)):
        rated = sum(np.unique(X[codes == p].indices).size for p in range(n_clients))
        up, down = start_bytes(X, codes, n_clients)
        assert up == 24 * n_clients + rated * (index + 16) + 8 * rated
        assert down == 16 * n_clients
    assert sum(np.unique(X[np.arange(30) % 4 == p].indices).size for p in range(4)) < X.nnz
