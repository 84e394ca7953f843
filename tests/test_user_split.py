"""Tests of the per-user splits of long-format ratings (leave_one_out_split, per_user_holdout)."""

import numpy as np
import pandas as pd
import pytest

from sklearn_fedmf.model_selection import leave_one_out_split, per_user_holdout


@pytest.fixture
def ratings():
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 15, size=80)  # some users with a single rating
    counts[:5] = 1
    users = np.repeat(rng.permutation(1000)[:80], counts)  # ids not 0..n-1, not sorted
    order = rng.permutation(len(users))  # users' rows interleaved
    return pd.DataFrame({
        "item": rng.integers(0, 50, len(users))[order],
        "user": users[order],
        "rating": rng.integers(1, 6, len(users))[order].astype(float),
        "time": rng.integers(0, 20, len(users))[order],  # with ties
    }, index=np.arange(len(users)) * 3 + 7)


def _is_partition(ratings, train, test):
    assert not set(train.index) & set(test.index)
    assert sorted([*train.index, *test.index]) == sorted(ratings.index)
    pd.testing.assert_frame_equal(pd.concat([train, test]).loc[ratings.index], ratings)
    assert train.index.is_monotonic_increasing and test.index.is_monotonic_increasing


def test_leave_one_out_holds_out_one_rating_of_each_user_with_two(ratings):
    train, test = leave_one_out_split(ratings, user_col="user", random_state=0)
    _is_partition(ratings, train, test)
    counts = ratings.user.value_counts()
    assert sorted(test.user) == sorted(counts.index[counts >= 2])  # exactly one each
    assert set(counts.index[counts == 1]) <= set(train.user)
    again = leave_one_out_split(ratings, user_col="user", random_state=0)[1]
    pd.testing.assert_frame_equal(test, again)
    other = leave_one_out_split(ratings, user_col="user", random_state=1)[1]
    assert not test.index.equals(other.index)


def test_leave_one_out_random_choice_is_uniform_over_a_users_ratings():
    ratings = pd.DataFrame({"user": np.zeros(4, dtype=int), "item": np.arange(4)})
    picks = [leave_one_out_split(ratings, random_state=s)[1].item.item() for s in range(400)]
    assert np.bincount(picks, minlength=4).min() > 70  # 100 expected for each of 4


def test_leave_one_out_holds_out_the_latest_by_timestamp(ratings):
    train, test = leave_one_out_split(ratings, user_col=1, timestamp_col="time")
    _is_partition(ratings, train, test)
    for user, row in test.set_index("user").iterrows():
        theirs = ratings[ratings.user == user]
        assert row.time == theirs.time.max()
        latest = theirs[theirs.time == theirs.time.max()]
        assert test.index[test.user == user][0] == latest.index[-1]  # tie: the later row
    as_dates = ratings.assign(time=pd.to_datetime(ratings.time, unit="D"))
    dated = leave_one_out_split(as_dates, user_col="user", timestamp_col="time")[1]
    assert dated.index.equals(test.index)


def test_per_user_holdout_fraction_minimum_and_time_order(ratings):
    train, test = per_user_holdout(ratings, 0.3, user_col="user", timestamp_col="time",
                                   min_train_per_user=2, random_state=0)
    _is_partition(ratings, train, test)
    n = ratings.user.value_counts()
    held = test.user.value_counts().reindex(n.index, fill_value=0)
    cap = np.maximum(n - 2, 0)  # min_train_per_user=2
    assert (held <= np.minimum(np.ceil(0.3 * n), cap)).all()
    assert ((held >= np.floor(0.3 * n)) | (held == cap)).all()
    for user in test.user.unique():  # the latest ratings are held out
        assert test[test.user == user].time.min() >= train[train.user == user].time.max()
    # the unbiased rounding keeps the overall fraction close to test_size
    _, test_random = per_user_holdout(ratings, 0.3, user_col="user", min_train_per_user=0,
                                      random_state=0)
    assert abs(len(test_random) / len(ratings) - 0.3) < 0.05


def test_split_errors_are_clear(ratings):
    with pytest.raises(ValueError, match="not a column"):
        leave_one_out_split(ratings, user_col="who")
    with pytest.raises(ValueError, match="neither a column name nor a position"):
        leave_one_out_split(ratings, user_col=9)
    with pytest.raises(ValueError, match=r"test_size must be a float in \(0, 1\)"):
        per_user_holdout(ratings, 1.5)
    with pytest.raises(ValueError, match="missing values in the user column"):
        leave_one_out_split(pd.DataFrame({"u": [1, None], "i": [1, 2]}))
    # a plain array is read by column position
    train, test = leave_one_out_split(np.array([[1, 10], [1, 11], [2, 12]]), random_state=0)
    assert len(test) == 1 and test.iloc[0, 0] == 1
