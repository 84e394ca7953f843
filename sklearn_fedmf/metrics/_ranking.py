"""Top-N ranking metrics: hit rate, precision, recall, NDCG and average precision at k.

Every metric takes the held-out relevant items ``y_true`` and the recommended lists
``y_pred`` (best first) of the same users, in one of two shapes:

* **arrays**: ``y_pred`` a 2-D array (or a list of lists) of item ids, one row per user, as
  ``RatingRegressor.recommend`` returns it (``None`` or NaN mark an empty slot); ``y_true``
  one entry per row of ``y_pred``: a collection of item ids, a single item id, a dict
  ``{item: relevance}``, or a row of a sparse matrix whose stored columns are the relevant
  items (column index = item id) and whose values are their relevance;
* **long DataFrames**: ``y_true`` with the columns (user, item[, relevance]) and ``y_pred``
  with the columns (user, item[, score]), read by position; ``y_pred``'s rows are ranked by
  the score when it has one (descending, ties in row order), else in row order. When only
  one of the two is a DataFrame, ``users`` gives the user id of each row of the other.

Conventions (the same in every metric):

* an item is **relevant** when its relevance is positive (1 when none is given); the mean is
  over the users with at least one relevant item, the others are **excluded** (a metric
  raises when no user has one);
* ``k`` larger than a list is allowed: the missing slots are misses (``precision_at_k``
  still divides by ``k``); an item listed twice counts at its first position only;
* ``ndcg_at_k`` uses the relevance as a linear gain (graded NDCG, as
  :func:`sklearn.metrics.ndcg_score`), so binary input gives the usual binary NDCG.

Public references define these alike (RecBole, Microsoft ``recommenders``); two differ in
detail: ``implicit.evaluation.precision_at_k`` divides by ``min(k, n_relevant)`` where this
module divides by ``k``, and some libraries use the gain ``2**rel - 1``.
"""

from __future__ import annotations

import numbers

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ..datasets._synthetic import _check_generator
from ..engine._client_data import check_int, factorize_ids

__all__ = [
    "hit_rate_at_k",
    "precision_at_k",
    "recall_at_k",
    "ndcg_at_k",
    "average_precision_at_k",
    "catalog_coverage",
    "sampled_rankings",
]

_INPUT_DOC = """y_true : DataFrame, sparse matrix or sequence
        Held-out relevant items of each user (see the module notes): a DataFrame
        (user, item[, relevance]), a sparse matrix (users x items), or one entry per row
        of ``y_pred`` (item ids, one item id, or a dict ``{item: relevance}``).
    y_pred : DataFrame, 2-D array-like or sequence of lists
        Recommended item ids per user, best first: rows of an array (``None`` or NaN mark
        an empty slot), or a DataFrame (user, item[, score]).
    k : int, default=10
        Length of the list that is evaluated; may exceed the lists' length.
    users : array-like, default=None
        The user id of each row of the argument that is not a DataFrame, when the other
        one is."""


# ---- input ------------------------------------------------------------------------------
def _is_frame(obj):
    return isinstance(obj, pd.DataFrame)


def _clean_list(row):
    """A recommended list without its empty slots (None or NaN)."""
    row = list(row)
    return [x for x in row if x is not None and not (isinstance(x, float) and np.isnan(x))]


def _lists_of_frame(frame):
    """``{user: ranked list}`` of a (user, item[, score]) DataFrame."""
    if frame.shape[1] < 2:
        raise ValueError("y_pred as a DataFrame needs the columns (user, item[, score]).")
    if frame.shape[1] >= 3:
        frame = frame.iloc[np.argsort(-frame.iloc[:, 2].to_numpy(dtype=float), kind="stable")]
    users, items = frame.iloc[:, 0].to_numpy(), frame.iloc[:, 1].to_numpy()
    return {u: list(items[g]) for u, g in pd.Series(np.arange(len(users))).groupby(
        users, sort=False).indices.items()}


def _relevance_of_frame(frame):
    """``{user: {item: relevance}}`` of a (user, item[, relevance]) DataFrame."""
    if frame.shape[1] < 2:
        raise ValueError("y_true as a DataFrame needs the columns (user, item[, relevance]).")
    users, items = frame.iloc[:, 0].to_numpy(), frame.iloc[:, 1].to_numpy()
    gains = (frame.iloc[:, 2].to_numpy(dtype=float) if frame.shape[1] >= 3
             else np.ones(len(frame)))
    out = {}
    for u, item, g in zip(users, items, gains):
        out.setdefault(u, {})[item] = g
    return out


def _relevance_of_entry(entry):
    if isinstance(entry, dict):
        return {item: float(g) for item, g in entry.items()}
    if np.ndim(entry) == 0:
        return {entry: 1.0}
    return {item: 1.0 for item in _clean_list(np.asarray(entry, dtype=object).ravel())}


def _relevance_of_rows(y_true):
    """One ``{item: relevance}`` per row of positional ``y_true``."""
    if sp.issparse(y_true):
        Y = sp.csr_matrix(y_true)
        Y.sum_duplicates()
        return [dict(zip(Y.indices[a:b].tolist(), Y.data[a:b].tolist()))
                for a, b in zip(Y.indptr[:-1], Y.indptr[1:])]
    return [_relevance_of_entry(e) for e in y_true]


def _pairs(y_true, y_pred, users):
    """``[(ranked list, {item: relevance > 0})]`` of the users with a relevant item."""
    if _is_frame(y_pred):
        lists = _lists_of_frame(y_pred)
    else:
        rows = [_clean_list(r) for r in y_pred]
    if _is_frame(y_true):
        relevance = _relevance_of_frame(y_true)
    else:
        rel_rows = _relevance_of_rows(y_true)
    if _is_frame(y_pred) != _is_frame(y_true):
        if users is None:
            raise ValueError("One of y_true and y_pred is a DataFrame and the other is not: "
                             "give users, the user id of each row of the other.")
        users = list(np.asarray(users, dtype=object).ravel())
        n_rows = len(rows) if _is_frame(y_true) else len(rel_rows)
        if len(users) != n_rows:
            raise ValueError(f"users has {len(users)} ids for {n_rows} rows.")
        if _is_frame(y_true):
            lists = dict(zip(users, rows))
        else:
            relevance = dict(zip(users, rel_rows))
    elif not _is_frame(y_pred):
        if len(rows) != len(rel_rows):
            raise ValueError(f"y_true has {len(rel_rows)} rows and y_pred {len(rows)}: one "
                             "entry per user in both.")
        lists, relevance = dict(enumerate(rows)), dict(enumerate(rel_rows))
    out = []
    for u, rel in relevance.items():
        gains = np.array(list(rel.values()), dtype=float)
        if not np.isfinite(gains).all() or (gains < 0).any():
            raise ValueError(f"Relevance must be finite and non-negative; user {u!r} has "
                             f"{gains[~np.isfinite(gains) | (gains < 0)][:3].tolist()}.")
        rel = {item: g for item, g in rel.items() if g > 0}
        if rel:
            out.append((lists.get(u, []), rel))
    if not out:
        raise ValueError("No user has a relevant item (relevance > 0): the metric is undefined.")
    return out


def _hits(ranked, rel, k):
    """Gain of each of the first ``k`` slots (0 for a miss, a repeat, an empty slot)."""
    gains = np.zeros(k)
    seen = set()
    for pos, item in enumerate(ranked[:k]):
        if item in rel and item not in seen:
            gains[pos] = rel[item]
        seen.add(item)
    return gains


def _mean(y_true, y_pred, k, users, per_user):
    k = check_int(k, "k")
    values = [per_user(_hits(ranked, rel, k), rel, k) for ranked, rel in _pairs(
        y_true, y_pred, users)]
    return float(np.mean(values))


# ---- metrics ----------------------------------------------------------------------------
def hit_rate_at_k(y_true, y_pred, *, k=10, users=None):
    """Share of users with at least one relevant item among their first ``k``.

    Parameters
    ----------
    {inputs}

    Returns
    -------
    hit_rate : float
        In [0, 1], over the users with a relevant item.

    Examples
    --------
    >>> from sklearn_fedmf.metrics import hit_rate_at_k
    >>> hit_rate_at_k([[3], [7]], [[1, 3, 5], [2, 4, 6]], k=2)
    0.5
    """
    return _mean(y_true, y_pred, k, users, lambda g, rel, k: float(g.any()))


def precision_at_k(y_true, y_pred, *, k=10, users=None):
    """Mean over users of (relevant items among the first ``k``) / ``k``.

    Parameters
    ----------
    {inputs}

    Returns
    -------
    precision : float
        In [0, 1]; a list shorter than ``k`` counts its missing slots as misses.

    Examples
    --------
    >>> from sklearn_fedmf.metrics import precision_at_k
    >>> precision_at_k([[1, 5]], [[1, 3, 5, 7]], k=4)
    0.5
    """
    return _mean(y_true, y_pred, k, users, lambda g, rel, k: np.count_nonzero(g) / k)


def recall_at_k(y_true, y_pred, *, k=10, users=None):
    """Mean over users of (relevant items among the first ``k``) / (relevant items).

    Parameters
    ----------
    {inputs}

    Returns
    -------
    recall : float
        In [0, 1]: 1 when each user's first ``k`` hold all its relevant items.

    Examples
    --------
    >>> from sklearn_fedmf.metrics import recall_at_k
    >>> recall_at_k([[1, 5, 9, 11]], [[1, 3, 5, 7]], k=4)
    0.5
    """
    return _mean(y_true, y_pred, k, users, lambda g, rel, k: np.count_nonzero(g) / len(rel))


def _discounts(k):
    return 1.0 / np.log2(np.arange(2, k + 2))


def _ndcg(gains, rel, k):
    ideal = np.sort(np.fromiter(rel.values(), dtype=float))[::-1][:k]
    return float(gains @ _discounts(k) / (ideal @ _discounts(len(ideal))))


def ndcg_at_k(y_true, y_pred, *, k=10, users=None):
    """Normalized discounted cumulative gain of the first ``k`` items.

    ``DCG = sum_i rel_i / log2(i + 2)`` over the positions ``i = 0 .. k-1`` of the list,
    divided by the DCG of the ideal list (the user's relevant items by decreasing relevance,
    cut at ``k``). With relevance values (a third DataFrame column, sparse values, dicts)
    the gain is graded; without, it is 1 per relevant item.

    Parameters
    ----------
    {inputs}

    Returns
    -------
    ndcg : float
        In [0, 1]: 1 when every list is in the ideal order.

    Examples
    --------
    >>> from sklearn_fedmf.metrics import ndcg_at_k
    >>> round(ndcg_at_k([[3]], [[1, 3]], k=2), 4)   # 1 / log2(3)
    0.6309
    >>> # graded: (1 + 3 / log2(3)) / (3 + 1 / log2(3))
    >>> round(ndcg_at_k([{1: 1.0, 3: 3.0}], [[1, 3]], k=2), 4)
    0.7967
    """
    return _mean(y_true, y_pred, k, users, _ndcg)


def _average_precision(gains, rel, k):
    hit = gains > 0
    precisions = np.cumsum(hit) / np.arange(1, k + 1)
    return float(precisions[hit].sum() / min(k, len(rel)))


def average_precision_at_k(y_true, y_pred, *, k=10, users=None):
    """Mean over users of the average precision at ``k`` (MAP@k).

    ``AP@k = sum_i P@(i+1) * hit_i / min(k, n_relevant)`` over the positions
    ``i = 0 .. k-1``: the mean of the precisions at each hit, divided by the most hits a
    list of length ``k`` could have.

    Parameters
    ----------
    {inputs}

    Returns
    -------
    map : float
        In [0, 1]: 1 when each list's first ``min(k, n_relevant)`` slots are hits.

    Examples
    --------
    >>> from sklearn_fedmf.metrics import average_precision_at_k
    >>> average_precision_at_k([[1, 5]], [[1, 3, 5]], k=3)   # (1/1 + 2/3) / 2
    0.8333333333333333
    """
    return _mean(y_true, y_pred, k, users, _average_precision)


for _metric in (hit_rate_at_k, precision_at_k, recall_at_k, ndcg_at_k, average_precision_at_k):
    _metric.__doc__ = _metric.__doc__.replace("{inputs}", _INPUT_DOC)


def catalog_coverage(y_pred, catalog, *, k=10):
    """Share of the catalog that appears in at least one user's first ``k`` items.

    Parameters
    ----------
    y_pred : DataFrame, 2-D array-like or sequence of lists
        Recommended item ids per user, best first (as in :func:`ndcg_at_k`).
    catalog : int or array-like
        The item ids that could be recommended, or their number when the ids are the
        integers ``0 .. catalog - 1``. Listed ids outside the catalog are not counted.
    k : int, default=10
        Length of the list that is read.

    Returns
    -------
    coverage : float
        In [0, 1].

    Examples
    --------
    >>> from sklearn_fedmf.metrics import catalog_coverage
    >>> catalog_coverage([[0, 1, 2], [0, 3, None]], catalog=8, k=2)
    0.375
    """
    k = check_int(k, "k")
    if isinstance(catalog, numbers.Integral):
        catalog = np.arange(check_int(catalog, "catalog"))
    catalog = set(np.asarray(catalog, dtype=object).ravel().tolist())
    if not catalog:
        raise ValueError("catalog is empty.")
    lists = (_lists_of_frame(y_pred).values() if _is_frame(y_pred)
             else (_clean_list(r) for r in y_pred))
    shown = {item for ranked in lists for item in ranked[:k]}
    return len(shown & catalog) / len(catalog)


# ---- sampled protocol -------------------------------------------------------------------
def sampled_rankings(predict, train, test, *, n_negatives=99, random_state=None):
    """Rank each held-out item among ``n_negatives`` sampled items its user has not rated.

    The sampled protocol of the neural and federated recommendation papers (NCF, FedNCF,
    PFedRec): each held-out (user, item) pair of ``test`` is scored beside ``n_negatives``
    items drawn uniformly, without replacement, from the items of ``train`` that the user
    rated neither in ``train`` nor in ``test``; the candidates are ranked by ``predict`` (ties
    in random order, so a model that scores everything alike is not favoured). The result
    feeds any metric of this module: ``hit_rate_at_k(*sampled_rankings(...), k=10)``.

    Sampled metrics are not full-ranking metrics and can reorder models: Krichene and
    Rendle (KDD 2020, "On Sampled Metrics for Item Recommendation") show that a model better
    under sampled HR@10 can be worse under the full ranking. Use them to compare with a
    paper's table; use full ranking (``RatingRegressor.recommend`` and the metrics above) to
    choose a model.

    Parameters
    ----------
    predict : callable
        ``predict(pairs)`` returns one score per row of ``pairs``, a DataFrame with the
        columns of ``train``'s first two (user, item) when ``train`` is a DataFrame, else an
        array of (user, item) rows; ``RatingRegressor.predict`` of a fitted model is one.
    train, test : DataFrame or array-like of shape (n, >= 2)
        Training and held-out ratings, (user, item) in the first two columns.
    n_negatives : int, default=99
        Sampled items per held-out pair (fewer for a user who left fewer unrated items).
    random_state : int, Generator or None
        Seed of the sampling and of the order of ties; the result is reproducible for a
        fixed seed.

    Returns
    -------
    y_true : ndarray of shape (n_test,)
        The held-out item of each row of ``test``.
    y_pred : ndarray of shape (n_test, n_negatives + 1)
        Its candidates ranked by ``predict``, best first (``None`` pads a short row).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.metrics import hit_rate_at_k, sampled_rankings
    >>> train = np.array([[0, 0], [0, 1], [1, 1], [1, 2], [2, 3]])   # items 0 to 3
    >>> test = np.array([[0, 2], [1, 0]])
    >>> small_ids_first = lambda pairs: -np.asarray(pairs)[:, 1].astype(float)
    >>> y_true, y_pred = sampled_rankings(small_ids_first, train, test, n_negatives=2,
    ...                                   random_state=0)
    >>> y_pred.tolist()   # each user left only item 3 unrated
    [[2, 3, None], [0, 3, None]]
    >>> hit_rate_at_k(y_true, y_pred, k=1)
    1.0
    """
    n_negatives = check_int(n_negatives, "n_negatives", 0)
    rng = _check_generator(random_state)
    columns = list(train.columns[:2]) if _is_frame(train) else None
    train_u, train_i = _two_columns(train, "train")
    test_u, test_i = _two_columns(test, "test")
    item_ids, train_codes = factorize_ids(train_i)
    test_codes = pd.Index(item_ids).get_indexer(test_i)  # -1: an item unseen in train
    rated = pd.DataFrame({"u": np.concatenate([train_u, test_u]),
                          "i": np.concatenate([train_codes, test_codes])})
    rated = rated[rated.i >= 0].groupby("u").i.unique().to_dict()
    n_items = len(item_ids)
    width = n_negatives + 1
    cand = np.full((len(test_u), width), -1, dtype=np.int64)
    for row, (u, i) in enumerate(zip(test_u, test_codes)):
        excluded = np.unique(rated.get(u, np.zeros(0, dtype=np.int64)))
        m = min(n_negatives, n_items - len(excluded))
        # the j-th item not in ``excluded`` is j plus the number of excluded items up to it
        picks = rng.choice(n_items - len(excluded), size=m, replace=False)
        picks = picks + np.searchsorted(excluded - np.arange(len(excluded)), picks,
                                        side="right")
        cand[row, 0] = i
        cand[row, 1 : 1 + m] = picks
    filled = cand >= 0
    filled[:, 0] = True
    counts = filled.sum(axis=1)
    flat = cand[filled]  # row by row, the held-out item first
    users = np.repeat(np.asarray(test_u, dtype=object), counts)
    items = item_ids[np.maximum(flat, 0)].astype(object)
    items[np.concatenate([[0], np.cumsum(counts)[:-1]])] = test_i  # (maybe unseen in train)
    pairs = (pd.DataFrame({columns[0]: users, columns[1]: items}) if columns is not None
             else np.column_stack([users, items]))
    if columns is not None:
        pairs = pairs.infer_objects()
    scores = np.full(cand.shape, -np.inf)
    scores[filled] = np.asarray(predict(pairs), dtype=float)
    ranked_ids = np.full(cand.shape, None, dtype=object)
    ranked_ids[filled] = items
    # a random order first, then a stable sort by score: ties land in random order
    shuffle = rng.permuted(np.tile(np.arange(width), (len(test_u), 1)), axis=1)
    shuffled = np.take_along_axis(scores, shuffle, axis=1)
    order = np.take_along_axis(shuffle, np.argsort(-shuffled, axis=1, kind="stable"), axis=1)
    y_pred = np.take_along_axis(ranked_ids, order, axis=1)
    y_true = np.asarray(test_i)
    return y_true, _narrow(y_pred)


def _narrow(ids):
    """An object array of ids as the ids' own dtype when they share one (mixed ids and
    ``None`` padding stay objects)."""
    if any(x is None for x in ids.flat):
        return ids
    flat = pd.Series(ids.ravel(), dtype=object).infer_objects()
    return ids if flat.dtype == object else flat.to_numpy().reshape(ids.shape)


def _two_columns(data, name):
    if _is_frame(data):
        if data.shape[1] < 2:
            raise ValueError(f"{name} needs (user, item) in its first two columns.")
        return data.iloc[:, 0].to_numpy(), data.iloc[:, 1].to_numpy()
    arr = np.asarray(data)
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise ValueError(f"{name} must have (user, item) in its first two columns, got shape "
                         f"{arr.shape}.")
    return arr[:, 0], arr[:, 1]
