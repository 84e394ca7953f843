"""Per-user splits of long-format ratings (one row per rating) for top-N evaluation."""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd

from ..datasets._synthetic import _check_generator
from ..engine._client_data import check_int
from ._split import first_in_group, holdout_counts

__all__ = ["leave_one_out_split", "per_user_holdout"]


def _frame(ratings):
    if isinstance(ratings, pd.DataFrame):
        return ratings
    if hasattr(ratings, "__array__") or isinstance(ratings, list | tuple):
        frame = pd.DataFrame(np.asarray(ratings, dtype=object)).infer_objects()
        if frame.ndim == 2 and frame.shape[1] >= 2:
            return frame
    raise ValueError("ratings must be a long DataFrame (or 2-D array) with one rating per row.")


def _column(frame, col, name):
    if isinstance(col, str):
        if col not in frame.columns:
            raise ValueError(f"{name}={col!r} is not a column of ratings: "
                             f"{list(frame.columns)}.")
        values = frame[col]
    elif isinstance(col, numbers.Integral) and -frame.shape[1] <= col < frame.shape[1]:
        values = frame.iloc[:, col]
    else:
        raise ValueError(f"{name}={col!r} is neither a column name nor a position of ratings "
                         f"({frame.shape[1]} columns).")
    if values.isna().any():
        raise ValueError(f"ratings has missing values in the {name[:-4]} column.")
    return values.to_numpy()


def _groups(frame, user_col):
    """Integer code of each row's user and the number of rows of each user."""
    codes, _ = pd.factorize(_column(frame, user_col, "user_col"))
    codes = codes.astype(np.int64)
    return codes, np.bincount(codes)


def _sort_key(frame, timestamp_col, rng):
    """A key in [0, 1) whose smallest values are held out first: the latest timestamps
    (ties: the later row first), or a random order."""
    n = len(frame)
    if timestamp_col is None:
        return rng.random(n)
    stamps = _column(frame, timestamp_col, "timestamp_col")
    if np.issubdtype(stamps.dtype, np.datetime64):
        stamps = stamps.astype("datetime64[ns]").astype(np.int64)
    order = np.lexsort((np.arange(n), stamps))[::-1]  # latest (then later row) first
    key = np.empty(n)
    key[order] = np.arange(n) / n
    return key


def _split(frame, test):
    return frame[~test], frame[test]


def leave_one_out_split(ratings, *, user_col=0, timestamp_col=None, random_state=None):
    """Hold out one rating of each user: the latest one, or one at random.

    The leave-one-out protocol of top-N evaluation (NCF and the federated recommendation
    papers): each user with at least 2 ratings gives one rating to the test set (the latest
    by ``timestamp_col`` when given, the later row on a tie; else one drawn at random,
    seeded by ``random_state``), and keeps the others for training. A user with a single
    rating stays entirely in training.

    Parameters
    ----------
    ratings : DataFrame or 2-D array-like
        One rating per row (long format).
    user_col : int or str, default=0
        The column of the user ids: a position or a column name.
    timestamp_col : int or str, default=None
        The column of the rating times (numbers or datetimes); None draws the held-out
        rating at random.
    random_state : int, Generator or None
        Seed of the random choice (unused with ``timestamp_col``).

    Returns
    -------
    train, test : DataFrame
        Disjoint subsets of the rows of ``ratings`` (index and row order kept) whose union
        is ``ratings``; ``test`` has one row per user with at least 2 ratings.

    Examples
    --------
    >>> import pandas as pd
    >>> from sklearn_fedmf.model_selection import leave_one_out_split
    >>> ratings = pd.DataFrame({"user": [1, 1, 1, 2, 3, 3], "item": [10, 11, 12, 10, 11, 12],
    ...                         "time": [5, 9, 7, 1, 3, 2]})
    >>> train, test = leave_one_out_split(ratings, timestamp_col="time")
    >>> test.item.tolist(), len(train)   # user 2 has one rating: kept in train
    ([11, 11], 4)
    """
    return per_user_holdout(ratings, test_size=None, user_col=user_col,
                            timestamp_col=timestamp_col, random_state=random_state)


def per_user_holdout(ratings, test_size=0.2, *, user_col=0, timestamp_col=None,
                     min_train_per_user=1, random_state=None):
    """Hold out a fraction of each user's ratings: the latest ones, or at random.

    A user with ``n`` ratings holds out ``floor(test_size * n + u)`` of them, ``u`` uniform
    (the unbiased rounding of
    :func:`~sklearn_fedmf.model_selection.train_test_split_ratings`, the same protocol on a
    matrix), but never so many that fewer than ``min_train_per_user`` remain. The held-out
    ratings are the user's latest by ``timestamp_col`` when given, else drawn at random.

    Parameters
    ----------
    ratings : DataFrame or 2-D array-like
        One rating per row (long format).
    test_size : float in (0, 1), default=0.2
        Fraction of each user's ratings to hold out.
    user_col : int or str, default=0
        The column of the user ids: a position or a column name.
    timestamp_col : int or str, default=None
        The column of the rating times; None holds out ratings drawn at random.
    min_train_per_user : int, default=1
        Ratings a user keeps in training at least (when it has more than that many).
    random_state : int, Generator or None
        Seed of the rounding and of the random choice.

    Returns
    -------
    train, test : DataFrame
        Disjoint subsets of the rows of ``ratings`` (index and row order kept).

    Examples
    --------
    >>> import numpy as np
    >>> import pandas as pd
    >>> from sklearn_fedmf.model_selection import per_user_holdout
    >>> ratings = pd.DataFrame({"user": np.repeat([0, 1], 10), "item": np.tile(range(10), 2)})
    >>> train, test = per_user_holdout(ratings, test_size=0.3, random_state=0)
    >>> test.groupby("user").size().tolist()
    [3, 3]
    """
    frame = _frame(ratings)
    if len(frame) == 0:
        raise ValueError("ratings has no row.")
    rng = _check_generator(random_state)
    group, counts = _groups(frame, user_col)
    if test_size is None:  # leave one out
        n_test = (counts >= 2).astype(np.int64)
    else:
        if (not isinstance(test_size, numbers.Real) or isinstance(test_size, bool)
                or not 0 < test_size < 1):
            raise ValueError(f"test_size must be a float in (0, 1), got {test_size!r}.")
        min_train = check_int(min_train_per_user, "min_train_per_user", 0)
        n_test = holdout_counts(counts, test_size, min_train, rng)
    test = first_in_group(group, n_test, _sort_key(frame, timestamp_col, rng))
    return _split(frame, test)
