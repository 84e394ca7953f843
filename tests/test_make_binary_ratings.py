"""make_binary_ratings: the Felb paper's MovieLens stand-in (shape, density, skew, tastes)."""

import numpy as np
import pytest

from sklearn_fedmf.datasets import make_binary_ratings


def test_exact_ones_every_user_and_reproducible():
    data = make_binary_ratings(500, 300, 0.02, n_groups=5, random_state=0)
    X = data.X
    assert X.shape == (500, 300) and X.nnz == 3000
    assert set(np.unique(X.data)) == {1.0}
    assert np.all(np.diff(X.indptr) >= 1)  # every user has at least one one
    Y = X.copy()
    Y.sum_duplicates()
    assert Y.nnz == X.nnz and X.has_sorted_indices  # distinct items per user
    again = make_binary_ratings(500, 300, 0.02, n_groups=5, random_state=0)
    assert (again.X != X).nnz == 0 and np.array_equal(again.groups, data.groups)


def test_popularity_is_skewed_and_groups_share_tastes():
    data = make_binary_ratings(2000, 400, 0.02, n_groups=4, affinity=0.7, random_state=1)
    X, groups = data.X, data.groups
    item_counts = np.sort(np.asarray(X.sum(axis=0)).ravel())[::-1]
    assert item_counts[:10].mean() > 5 * np.median(item_counts)  # a popular head
    profiles = np.stack([np.asarray(X[groups == g].mean(axis=0)).ravel() for g in range(4)])
    profiles /= np.linalg.norm(profiles, axis=1, keepdims=True)
    cosine = profiles @ profiles.T
    assert cosine[~np.eye(4, dtype=bool)].max() < 0.8  # each group has its own favourites
    flat = make_binary_ratings(2000, 400, 0.02, n_groups=4, affinity=0.0, random_state=1)
    flat_profiles = np.stack([np.asarray(flat.X[flat.groups == g].mean(axis=0)).ravel()
                              for g in range(4)])
    flat_profiles /= np.linalg.norm(flat_profiles, axis=1, keepdims=True)
    assert (flat_profiles @ flat_profiles.T).min() > 0.9  # popularity only: alike


@pytest.mark.parametrize("params", [{"density": 0.0}, {"density": 1.5}, {"affinity": 2.0},
                                    {"n_groups": 0}])
def test_rejects_impossible_values(params):
    with pytest.raises(ValueError):
        make_binary_ratings(**{"n_users": 10, "n_items": 10, "density": 0.1, **params})
