"""``RatingRegressor.recommend(min_support=...)``: rarely rated items never come first."""

import numpy as np
import pytest

from sklearn_fedmf import FedMCADMM, RatingRegressor
from sklearn_fedmf._rating_regressor import MIN_SUPPORT


def long_tail_ratings(n_users=60, n_items=40, seed=0):
    """Popular items rated about 3.5, a tail of items rated 5 by their few raters."""
    rng = np.random.default_rng(seed)
    p = np.geomspace(0.9, 0.015, n_items)
    users, items = np.nonzero(rng.random((n_users, n_items)) < p)
    tail = p[items] < 0.1
    y = np.where(tail, 5.0, 3.5 + 0.5 * rng.normal(size=len(items)))
    return np.column_stack([users, items]), y


@pytest.fixture(scope="module")
def fitted():
    X, y = long_tail_ratings()
    # (FedMC-ADMM's former defaults, 0.04 per rating of the mean user's 9.3 and 0.1: the
    # "auto" defaults' shrunk item biases avoid the case, as FedMAvg's former ones did)
    reg = RatingRegressor(FedMCADMM(n_components=2, n_clients=4, max_iter=20, clip=False,
                                    alpha_u=0.372, alpha_v=0.1, random_state=0)).fit(X, y)
    return reg, X


def support_of(reg, ids):
    return np.array([reg.item_counts_[reg._item_index.get_loc(i)] if i is not None else -1
                     for i in ids])


def brute_force(reg, X, user, candidates):
    """The unseen ``candidates`` of ``user`` by predicted rating (ties to the first)."""
    rated = set(X[X[:, 0] == user, 1])
    cand = np.array([i for i in candidates if i not in rated], dtype=np.int64)
    if cand.size == 0:
        return cand
    pred = reg.predict(np.column_stack([np.full(len(cand), user), cand]))
    return cand[np.argsort(-pred, kind="stable")]


def test_without_min_support_rare_items_come_first(fitted):
    reg, X = fitted
    ids, _ = reg.recommend(reg.users_, n=5, min_support=0)
    assert (support_of(reg, ids[:, 0]) < 3).mean() > 0.1  # the case min_support is for


@pytest.mark.parametrize("min_support", [  # (the default in the fast set, the others slow)
    pytest.param(2, marks=pytest.mark.slow), pytest.param(5, marks=pytest.mark.slow), 20,
    pytest.param(10_000, marks=pytest.mark.slow)])
def test_under_supported_items_come_after_all_others(fitted, min_support):
    reg, X = fitted
    n = 8
    ids, ratings = reg.recommend(reg.users_, n=n, min_support=min_support)
    items = reg.items_
    strong = items[reg.item_counts_ >= min_support]
    weak = items[reg.item_counts_ < min_support]
    for row, user in enumerate(reg.users_):
        ranked = [*brute_force(reg, X, user, strong), *brute_force(reg, X, user, weak)]
        want = (ranked + [None] * n)[:n]
        assert ids[row].tolist() == want
        supported = support_of(reg, ids[row]) >= min_support
        assert not (~supported[:-1] & supported[1:]).any()  # never a weak item before
        if len(brute_force(reg, X, user, strong)):
            assert supported[0]
        found = ratings[row] > -np.inf
        np.testing.assert_allclose(
            ratings[row][found], reg.predict(np.column_stack(
                [np.full(found.sum(), user), ids[row][found].astype(int)])), rtol=1e-12)


def test_min_support_zero_ranks_by_predicted_rating_alone(fitted):
    reg, X = fitted
    ids, _ = reg.recommend(reg.users_, n=6, min_support=0)
    for row, user in enumerate(reg.users_):
        assert ids[row].tolist() == brute_force(reg, X, user, reg.items_)[:6].tolist()


def test_min_support_with_candidates_and_cold_users(fitted):
    reg, X = fitted
    pool = reg.items_[[0, 1, -3, -2, -1]]  # two popular items, three from the tail
    assert (support_of(reg, pool[2:]) < MIN_SUPPORT).all()
    ids, _ = reg.recommend(reg.users_[:10], n=5, items=pool, exclude_seen=False,
                           min_support=MIN_SUPPORT)
    assert all(set(row[:2]) == set(pool[:2]) for row in ids.tolist())
    cold, _ = reg.recommend(["nobody"], n=len(reg.items_), min_support=MIN_SUPPORT)
    supported = support_of(reg, cold[0]) >= MIN_SUPPORT
    assert supported[: supported.sum()].all()  # the supported items first
    with pytest.raises(ValueError, match="min_support must be an integer >= 0"):
        reg.recommend(reg.users_[0], min_support=-1)


def test_the_default_guards_the_first_item(fitted):
    reg, X = fitted
    ids, _ = reg.recommend(reg.users_, n=1)
    strong = reg.items_[reg.item_counts_ >= MIN_SUPPORT]
    can = np.array([len(brute_force(reg, X, user, strong)) > 0 for user in reg.users_])
    assert MIN_SUPPORT > 0 and can.sum() > 40
    assert (support_of(reg, ids[can, 0]) >= MIN_SUPPORT).all()
    # a user who rated every supported item still gets a full list
    assert (~can).any() and all(i is not None for i in ids[~can, 0])
