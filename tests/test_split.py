"""Tests of sklearn_fedmf.model_selection.train_test_split_ratings."""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.model_selection import train_test_split_ratings


def _entries(X):
    X = X.tocoo()
    return {(int(i), int(j)): float(v) for i, j, v in zip(X.row, X.col, X.data)}


@pytest.fixture
def ratings():
    X = make_ratings(300, 80, 6000, random_state=0).X.copy()
    X.data[::7] = 0.0  # explicit zeros are observations and must survive the split
    return X


def test_split_is_a_disjoint_partition_of_the_observed_entries(ratings):
    X_train, X_test = train_test_split_ratings(ratings, 0.2, random_state=0)
    assert X_train.shape == X_test.shape == ratings.shape
    assert X_train.format == X_test.format == "csr"
    train, test, full = _entries(X_train), _entries(X_test), _entries(ratings)
    assert not train.keys() & test.keys()
    assert {**train, **test} == full  # union equals X, values and explicit zeros included
    assert X_train.nnz + X_test.nnz == ratings.nnz
    assert (X_test.data == 0).sum() + (X_train.data == 0).sum() == (ratings.data == 0).sum()


@pytest.mark.parametrize("test_size", [0.1, 0.2, 0.5])
def test_split_fraction_per_row(ratings, test_size):
    X_train, X_test = train_test_split_ratings(ratings, test_size, random_state=1)
    assert abs(X_test.nnz / ratings.nnz - test_size) < 0.02
    per_row = X_test.getnnz(axis=1) / ratings.getnnz(axis=1)
    long_rows = ratings.getnnz(axis=1) >= 20
    assert np.all(np.abs(per_row[long_rows] - test_size) < 1 / 20 + 1e-12)


def test_split_min_train_per_row():
    X = sp.csr_matrix(np.array([[1.0, 2, 0, 0], [1, 0, 0, 0], [3, 4, 5, 1]]))
    X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(3, 4))  # rows of 2, 1 and 4 entries
    for seed in range(20):
        X_train, X_test = train_test_split_ratings(X, 0.9, random_state=seed, min_train_per_row=2)
        np.testing.assert_array_equal(X_train.getnnz(axis=1), [2, 1, 2])
    X_train, _ = train_test_split_ratings(X, 0.9, random_state=0, min_train_per_row=0)
    assert X_train.getnnz(axis=1).min() == 0  # the minimum is what holds rows back


def test_split_dense_nan_input_and_determinism():
    rng = np.random.default_rng(0)
    dense = rng.integers(0, 6, (50, 30)).astype(float)
    dense[rng.random(dense.shape) < 0.6] = np.nan
    a_train, a_test = train_test_split_ratings(dense, random_state=3)
    b_train, b_test = train_test_split_ratings(dense, random_state=3)
    _, c_test = train_test_split_ratings(dense, random_state=4)
    assert (a_test != b_test).nnz == 0 and (a_train != b_train).nnz == 0
    assert (a_test != c_test).nnz > 0
    observed = ~np.isnan(dense)
    assert a_train.nnz + a_test.nnz == observed.sum()
    merged = a_train + a_test
    np.testing.assert_array_equal(merged.toarray()[observed], dense[observed])


def test_split_rejects_bad_parameters(ratings):
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match="test_size"):
            train_test_split_ratings(ratings, bad)
    with pytest.raises(ValueError, match="min_train_per_row"):
        train_test_split_ratings(ratings, 0.2, min_train_per_row=-1)
