"""``RatingRegressor``: a completion estimator as a regressor on (user, item) id pairs."""

from __future__ import annotations

import warnings
from numbers import Integral, Real

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.base import BaseEstimator, MetaEstimatorMixin, RegressorMixin, _fit_context, clone
from sklearn.metrics import r2_score
from sklearn.utils._param_validation import HasMethods, Interval
from sklearn.utils.validation import (
    _check_feature_names,
    _check_n_features,
    _check_sample_weight,
    check_array,
    check_consistent_length,
    check_is_fitted,
    column_or_1d,
)

from ._pairs import FactorModel, predict_pairs, top_n
from .engine._client_data import check_int, factorize_ids
from .exceptions import DataWarning

__all__ = ["RatingRegressor"]

# recommend's default min_support: items with fewer training ratings are listed after the
# others. Chosen by benchmarks/bench_topn.py on the embedded MovieLens (see recommend).
MIN_SUPPORT = 20


class RatingRegressor(MetaEstimatorMixin, RegressorMixin, BaseEstimator):
    """Rate (user, item) pairs with a federated completion estimator.

    Wraps FedMCADMM, FedMAvg, FedMGS or RFRec as a scikit-learn regressor on long-format
    ratings: ``X`` holds one (user, item) pair of ids per row, ``y`` the ratings. ``fit``
    builds the users x items matrix (with the id maps) and fits a clone of ``estimator``;
    ``predict`` rates each pair from that pair's factors only, in O(n_pairs x rank) time and
    memory; ``recommend`` and ``similar_items`` give top-N lists in batches of bounded memory.
    Splitting the rows of ``X`` with ``KFold`` holds out *ratings* of users who stay in
    training (the papers' entry-wise protocol); ``GroupKFold`` over the user ids holds out
    whole *users*, whom :meth:`score` folds in.

    Parameters
    ----------
    estimator : estimator object, default=None
        The completion estimator (cloned at fit); None means ``FedMGS()`` (the model of
        ``fedmf recommend``, whose factor part holds on rating sets of every scale measured
        in the user guide, "Choosing a method"). Its parameters
        are tuned as ``estimator__<name>``.
    user_col, item_col : int or str, default=0, 1
        The column of ``X`` holding the user ids and the item ids: a position, or a column
        name of a DataFrame. Ids are any hashable values (strings, integers, mixed).
    client_col : int or str, default=None
        The column holding each rating's client label (read by ``fit`` only). A user must
        have one client. When None, the ``clients`` fit parameter or the estimator's own
        ``n_clients``/``partition`` assign users to clients.
    fold_in_size : float in [0, 1), default=0.5
        In :meth:`score`, the share of a user's pairs that folds in a user unseen in ``fit``
        (every pair whose position in that user's rows crosses a multiple of
        ``1 / fold_in_size``, so the fold-in pairs are spread over the user's rows); the
        other pairs are scored. 0 scores unseen users by the cold-start fallback.

    Attributes
    ----------
    estimator_ : estimator
        The fitted clone of ``estimator``.
    users_ : ndarray of shape (n_users,)
        The user ids seen in ``fit`` (sorted when the ids are comparable, else in order of
        first appearance); row ``k`` of ``estimator_.user_factors_`` is user ``users_[k]``.
        Ids are compared as they are: the number ``7`` and the string ``"7"`` are two users
        (``fit`` warns with a :class:`~sklearn_fedmf.exceptions.DataWarning` naming how many
        such ids it met; ``fedmf`` reads a column as one type, so it never meets them).
    items_ : ndarray of shape (n_items,)
        The item ids, likewise; column ``k`` of ``estimator_.components_``.
    item_counts_ : ndarray of shape (n_items,)
        The number of training ratings of each item of ``items_`` (what ``recommend``'s
        ``min_support`` counts).
    n_features_in_ : int
        Number of columns of ``X``.
    feature_names_in_ : ndarray of shape (`n_features_in_`,)
        Column names of ``X`` when it is a DataFrame with string column names.

    See Also
    --------
    FedMAvg, FedMCADMM, FedMGS, RFRec : the estimators it wraps.

    Notes
    -----
    **Fallback.** A pair whose user or item was not seen in ``fit`` is rated by what the
    model knows: the item's bias for an unseen user and the user's bias for an unseen item
    when the model has biases, otherwise the training mean ``estimator_.mean_``. Predictions
    are never NaN, and clipped to the training rating range when the estimator has
    ``clip=True``.

    **Scores.** :meth:`score` is the R^2 of the predictions (as for every scikit-learn
    regressor), after folding unseen users in (``fold_in_size``);
    :func:`sklearn_fedmf.model_selection.fold_in_rmse` is the same protocol as a negative
    RMSE scorer. ``scoring="neg_root_mean_squared_error"`` scores :meth:`predict` as it is
    (unseen users by the fallback).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import FedMAvg, RatingRegressor
    >>> rng = np.random.default_rng(0)
    >>> users, items = np.nonzero(rng.random((30, 12)) < 0.6)
    >>> X = np.column_stack([users, items])
    >>> y = (1 + (users % 3) + (items % 2)).astype(float)
    >>> reg = RatingRegressor(FedMAvg(n_components=2, n_clients=3, random_state=0)).fit(X, y)
    >>> reg.predict([[0, 1], [999, 1]]).shape
    (2,)
    >>> item_ids, ratings = reg.recommend([0, 1], n=3)
    >>> item_ids.shape
    (2, 3)
    """

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit", "transform"]), None],
        "user_col": [Integral, str],
        "item_col": [Integral, str],
        "client_col": [Integral, str, None],
        "fold_in_size": [Interval(Real, 0, 1, closed="left")],
    }

    def __init__(self, estimator=None, *, user_col=0, item_col=1, client_col=None,
                 fold_in_size=0.5):
        self.estimator = estimator
        self.user_col = user_col
        self.item_col = item_col
        self.client_col = client_col
        self.fold_in_size = fold_in_size

    # ---- input --------------------------------------------------------------------------
    def _columns(self, X, *, reset):
        """``(user ids, item ids, client labels or None)`` of the rows of ``X``."""
        if not hasattr(X, "iloc"):
            # ids of mixed types stay themselves (np.asarray would turn 1 and "a" into str)
            X = X if isinstance(X, np.ndarray) or sp.issparse(X) else np.array(X, dtype=object)
            X = check_array(X, dtype=None, ensure_all_finite=False,
                            ensure_min_features=2 if reset else 1,  # else: n_features_in_
                            input_name="X")
        elif X.shape[0] == 0:
            raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum "
                             "of 1 is required.")
        if reset or hasattr(X, "columns"):
            # (pairs given as a plain list or array after a DataFrame fit are positional, as
            # documented: no "feature names" warning for them)
            _check_feature_names(self, X, reset=reset)
        _check_n_features(self, X, reset=reset)
        users = self._column(X, self.user_col, "user_col")
        items = self._column(X, self.item_col, "item_col")
        clients = None
        if reset and self.client_col is not None:
            clients = self._column(X, self.client_col, "client_col")
        return users, items, clients

    @staticmethod
    def _column(X, col, name):
        if hasattr(X, "iloc"):
            if isinstance(col, str):
                if col not in X.columns:
                    raise ValueError(f"{name}={col!r} is not a column of X: {list(X.columns)}.")
                values = X[col]
            else:
                values = X.iloc[:, _position(col, X.shape[1], name)]
            values = values.to_numpy()
        else:
            if isinstance(col, str):
                raise ValueError(f"{name}={col!r} names a column, but X is not a DataFrame; "
                                 "give the column's position.")
            values = X[:, _position(col, X.shape[1], name)]
        if values.dtype == object:  # one dtype when every id has it (ints from a list)
            values = pd.Series(values, dtype=object).infer_objects().to_numpy()
        if values.dtype.kind in "fc" and not np.isfinite(values).all():
            raise ValueError(f"X contains NaN or infinity in the {name[:-4]} column.")
        if values.dtype == object and pd.isna(values).any():
            raise ValueError(f"X contains missing values (None or NaN) in the {name[:-4]} column.")
        return values

    # ---- fit ----------------------------------------------------------------------------
    @_fit_context(prefer_skip_nested_validation=False)
    def fit(self, X, y=None, *, clients=None):
        """Fit the wrapped estimator on the ratings ``y`` of the (user, item) pairs ``X``.

        Without ratings (``y=None``) the pairs are implicit feedback: each is an interaction
        of strength 1, and the clone of ``estimator`` is fitted with ``loss="implicit"``
        (set on the clone: the estimator given is not changed; an estimator without a
        ``loss`` parameter is refused). With ratings or counts as ``y`` and an estimator of
        ``loss="implicit"``, they are the interactions' strengths (confidence ``1 +
        confidence * y``).

        Parameters
        ----------
        X : {array-like, DataFrame} of shape (n_ratings, n_columns)
            One (user, item) pair of ids per row (columns ``user_col`` and ``item_col``).
        y : array-like of shape (n_ratings,) or None, default=None
            The ratings. A pair listed more than once is fitted at its mean rating, with a
            :class:`~sklearn_fedmf.exceptions.DataWarning` naming how many pairs were
            (``fedmf`` does the same). None: interactions (see above).
        clients : array-like of shape (n_ratings,), default=None
            The client label of each rating's user (ignored when ``client_col`` is set).

        Returns
        -------
        self : RatingRegressor
        """
        users, items, labels = self._columns(X, reset=True)
        estimator = self._base_estimator()
        if y is None:
            if "loss" not in estimator.get_params(deep=False):
                raise ValueError(
                    f"fit without y means implicit feedback, which {type(estimator).__name__} "
                    "does not train (it has no loss parameter); pass the ratings as y.")
            estimator = clone(estimator).set_params(loss="implicit")
            y = np.ones(len(users))
        y = np.asarray(column_or_1d(y, warn=True), dtype=np.float64)
        check_consistent_length(users, y)
        if len(y) < 2:
            raise ValueError(f"n_samples={len(y)}: a factor model needs at least 2 ratings.")
        if not np.isfinite(y).all():
            raise ValueError("y contains NaN or infinity.")
        if labels is None and clients is not None:
            labels = np.asarray(clients)
            check_consistent_length(users, labels)
        self.users_, user_codes = factorize_ids(users)
        self.items_, item_codes = factorize_ids(items)
        _warn_about_ids(self.users_, "user")
        _warn_about_ids(self.items_, "item")
        _warn_about_duplicates(user_codes, item_codes, len(self.items_))
        self._user_index, self._item_index = pd.Index(self.users_), pd.Index(self.items_)
        shape = (len(self.users_), len(self.items_))
        R = _mean_matrix(y, user_codes, item_codes, shape)
        user_clients = None if labels is None else _client_of_users(labels, user_codes,
                                                                    self.users_)
        self.estimator_ = clone(estimator).fit(R, clients=user_clients)
        self._seen = sp.csr_matrix((np.ones(R.nnz, dtype=bool), R.indices, R.indptr),
                                   shape=shape)
        self.item_counts_ = np.diff(R.tocsc().indptr)
        return self

    def _base_estimator(self):
        if self.estimator is None:
            from .completion import FedMGS

            return FedMGS()
        return self.estimator

    # ---- prediction ---------------------------------------------------------------------
    def _encode(self, values, index):
        """Codes of the ids ``values`` in ``index``; -1 for an id not seen in fit."""
        uniques = index.to_numpy()
        values = np.asarray(values)
        if (uniques.dtype.kind in "iu" and values.dtype.kind in "iu"
                and int(uniques[-1]) - int(uniques[0]) + 1 == len(uniques)):
            # consecutive integer ids (sorted by _factorize): arithmetic, no hashing
            codes = values.astype(np.int64) - int(uniques[0])
            codes[(codes < 0) | (codes >= len(uniques))] = -1
            return codes
        return index.get_indexer(values).astype(np.int64)

    def _model(self):
        return self.estimator_._factor_model()

    def predict(self, X):
        """The predicted rating of each (user, item) pair of ``X``.

        Parameters
        ----------
        X : {array-like, DataFrame} of shape (n_pairs, n_columns)
            One (user, item) pair of ids per row, as in ``fit``.

        Returns
        -------
        y_pred : ndarray of shape (n_pairs,)
            One rating per pair, from that pair's factors only (never a dense matrix); an
            unseen user or item gets the fallback of the class notes.
        """
        check_is_fitted(self)
        users, items, _ = self._columns(X, reset=False)
        model = self._model()
        pred = predict_pairs(model, self._encode(users, self._user_index),
                             self._encode(items, self._item_index), self.estimator_.mean_)
        return self.estimator_._clip(pred)

    def score(self, X, y, sample_weight=None):
        """R^2 of the predicted ratings, folding in users unseen in ``fit``.

        A user of ``X`` unseen in ``fit`` (a held-out user of ``GroupKFold``) is folded in
        from a ``fold_in_size`` share of its pairs and ratings, as a new client would do on
        its own with the item factors fixed, and scored on the others; seen users are scored
        on all their pairs.

        Parameters
        ----------
        X : {array-like, DataFrame} of shape (n_pairs, n_columns)
            One (user, item) pair of ids per row, as in ``fit``.
        y : array-like of shape (n_pairs,)
            The true ratings.
        sample_weight : array-like of shape (n_pairs,), default=None
            Weights of the scored pairs.

        Returns
        -------
        score : float
            R^2 over the scored pairs.
        """
        y_true, y_pred, keep = self._fold_in_predict(X, y)
        if sample_weight is not None:
            sample_weight = _check_sample_weight(sample_weight, y_true)[keep]
        return r2_score(y_true[keep], y_pred, sample_weight=sample_weight)

    def _fold_in_predict(self, X, y):
        """``(y, predictions of the scored pairs, mask of the scored pairs)``."""
        check_is_fitted(self)
        users, items, _ = self._columns(X, reset=False)
        y = np.asarray(column_or_1d(y), dtype=np.float64)
        check_consistent_length(users, y)
        u = self._encode(users, self._user_index)
        i = self._encode(items, self._item_index)
        keep = np.ones(len(y), dtype=bool)
        unseen = np.flatnonzero(u < 0)
        if unseen.size == 0 or self.fold_in_size == 0:
            return y, self.predict(X), keep
        est = self.estimator_
        new_ids, g = factorize_ids(users[unseen])
        # position of each pair within its new user's rows (stable: in the order of X)
        order = np.argsort(g, kind="stable")
        starts = np.concatenate([[0], np.cumsum(np.bincount(g, minlength=len(new_ids)))])
        position = np.empty(unseen.size, dtype=np.int64)
        position[order] = np.arange(unseen.size) - starts[g[order]]
        s = self.fold_in_size
        folds = np.floor((position + 1) * s) > np.floor(position * s)
        folds &= i[unseen] >= 0  # an unseen item cannot inform a user's factors
        keep[unseen[folds]] = False
        rows = unseen[folds]
        R = _mean_matrix(y[rows], g[folds], i[rows], (len(new_ids), len(self.items_)))
        new_model = est._factor_model(est._check_X(R))
        has_fold_in = np.bincount(g[folds], minlength=len(new_ids)) > 0
        pred = np.empty(len(y))
        seen_rows = np.flatnonzero(u >= 0)
        pred[seen_rows] = predict_pairs(self._model(), u[seen_rows], i[seen_rows], est.mean_)
        new_users = np.where(has_fold_in[g], g, -1)
        pred[unseen] = predict_pairs(new_model, new_users, i[unseen], est.mean_)
        return y, est._clip(pred[keep]), keep

    # ---- top-N --------------------------------------------------------------------------
    def recommend(self, users, n=10, *, exclude_seen=True, items=None,
                  min_support=MIN_SUPPORT):
        """Each user's ``n`` items of highest predicted rating.

        Computed in batches of users whose score block is bounded (64 MB), so the memory
        does not grow with ``n_users x n_items``.

        An item rated by few users in ``fit`` has a predicted rating that rests on those few
        ratings (a movie rated 5 by its only two viewers tops a rating model's list).
        ``min_support`` lists such items only after every item with at least
        ``min_support`` training ratings: they still fill a list that has no other
        candidate, never come first.

        Parameters
        ----------
        users : id or array-like of ids
            Users to recommend to. A user unseen in ``fit`` gets the cold-start list: the
            items of highest item bias when the model has biases, else the most rated items,
            with their fallback ratings.
        n : int, default=10
            Items per user (at most the number of candidates).
        exclude_seen : bool, default=True
            Never recommend an item the user rated in ``fit``.
        items : array-like of ids, default=None
            Candidate items (every item seen in ``fit`` when None).
        min_support : int, default=20
            Items with fewer training ratings come after all the others (each group by
            predicted rating); 0 ranks every item by its predicted rating alone. The
            default was measured on the embedded MovieLens (user guide, Top-N
            recommendation): it lifts FedMC-ADMM's hit rate at 10 2.5 to 5 times and leaves
            the other estimators' as they were; higher values turn the lists into the
            popularity chart.

        Returns
        -------
        item_ids : ndarray of shape (n_users, n)
            Best first (ties to the item listed first in ``items_`` or ``items``). A row
            with fewer than ``n`` unseen candidates ends with ``None`` (the array is then of
            object dtype).
        ratings : ndarray of shape (n_users, n)
            Their predicted ratings (``-inf`` beside a ``None``); they decrease within each
            ``min_support`` group. For a single user id, both arrays are 1-D.
        """
        check_is_fitted(self)
        single = np.ndim(users) == 0
        codes = self._encode(_id_array(users), self._user_index)
        candidates = None
        if items is not None:
            candidates = self._known(_id_array(items), self._item_index, "items")
        n_candidates = len(self.items_) if candidates is None else len(candidates)
        n = _check_n(n, n_candidates)
        min_support = check_int(min_support, "min_support", 0)
        model = self._model()
        cand = np.arange(len(self.items_)) if candidates is None else candidates
        supported = self.item_counts_[cand] >= min_support
        known = codes >= 0
        index = np.full((len(codes), n), -1, dtype=np.int64)
        ratings = np.full((len(codes), n), -np.inf)
        if known.any():
            seen = self._seen if exclude_seen else None
            index[known], ratings[known] = _top_n_supported_first(
                model, codes[known], n, seen, candidates, supported)
        if not known.all():
            index[~known], ratings[~known] = self._cold_start(model, cand, supported, n)
        found = index >= 0
        ratings[found] = self.estimator_._clip(ratings[found])
        ids = _ids_at(self.items_, cand, index)
        return (ids[0], ratings[0]) if single else (ids, ratings)

    def _cold_start(self, model, cand, supported, n):
        key = self.item_counts_[cand] if model.item_bias is None else model.item_bias[cand]
        best = np.lexsort((-key, ~supported))[:n]  # supported first, then by key (stable)
        rating = predict_pairs(model, np.full(n, -1), cand[best], self.estimator_.mean_)
        return best, rating

    def similar_items(self, items, n=10):
        """Each item's ``n`` most similar items: cosine of the item factors.

        Parameters
        ----------
        items : id or array-like of ids
            Items seen in ``fit``.
        n : int, default=10
            Neighbours per item (the item itself excluded).

        Returns
        -------
        item_ids : ndarray of shape (n_query, n)
            Most similar first.
        similarities : ndarray of shape (n_query, n)
            Cosine similarities in [-1, 1]. For a single item id, both arrays are 1-D.
        """
        check_is_fitted(self)
        single = np.ndim(items) == 0
        codes = self._known(_id_array(items), self._item_index, "items")
        n = _check_n(n, len(self.items_) - 1)
        V = np.asarray(self._model().item_factors, dtype=np.float64)
        norms = np.linalg.norm(V, axis=1)
        V = V / np.where(norms > 0, norms, 1.0)[:, None]
        n_items = V.shape[0]
        itself = sp.csr_matrix((np.ones(n_items, dtype=bool), np.arange(n_items),
                                np.arange(n_items + 1)), shape=(n_items, n_items))
        index, sims = top_n(FactorModel(V, V, None, None, 0.0), codes, n, seen=itself)
        ids = _ids_at(self.items_, np.arange(n_items), index)
        return (ids[0], sims[0]) if single else (ids, sims)

    def _known(self, values, index, name):
        codes = self._encode(values, index)
        if (codes < 0).any():
            missing = values[codes < 0][:5].tolist()
            raise ValueError(f"{name} contains ids not seen in fit: {missing}.")
        return codes

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.string = True
        tags.input_tags.categorical = True
        # Generic checks feed continuous features: every row is then a new user and a new
        # item with a single rating, which no factor model can fit (R^2 > 0.5 is not met).
        tags.regressor_tags.poor_score = True
        return tags


def _position(col, n_columns, name):
    if not -n_columns <= col < n_columns:
        raise ValueError(f"{name}={col} is out of range for X with {n_columns} column(s).")
    return col


def _id_array(values):
    """A 1-D array of ids from an id, a list (mixed types kept) or an array."""
    if np.ndim(values) == 0:
        values = [values]
    if hasattr(values, "to_numpy"):
        values = values.to_numpy()
    values = values if isinstance(values, np.ndarray) else np.array(values, dtype=object)
    if values.dtype == object:
        values = pd.Series(values, dtype=object).infer_objects().to_numpy()
    return values.reshape(-1)


def _warn_about_ids(uniques, what):
    """Warn when ids of different types print alike (``7`` and ``"7"``): two users or items
    to the model, most likely one to whoever wrote them."""
    if uniques.dtype != object:
        return
    texts = pd.Series([str(v) for v in uniques])
    clashes = int(texts.duplicated().sum())
    if clashes:
        example = texts[texts.duplicated()].iloc[0]
        warnings.warn(
            f"{clashes} {what} id(s) occur both as a number and as a string (e.g. {example!r}): "
            f"they are different {what}s to the model; convert the {what} column to one type "
            "to merge them.", DataWarning, stacklevel=4)


def _warn_about_duplicates(rows, cols, n_cols):
    """Warn when a (user, item) pair is listed more than once (fitted at its mean)."""
    keys = rows * np.int64(n_cols) + cols
    repeated = len(keys) - len(np.unique(keys))
    if repeated:
        warnings.warn(
            f"{repeated} rating(s) repeat a (user, item) pair listed before: each such pair "
            "is fitted at the mean of its ratings.", DataWarning, stacklevel=4)


def _mean_matrix(values, rows, cols, shape):
    """CSR matrix of ``values`` at ``(rows, cols)``; a pair given more than once holds the
    mean of its values (least squares on the repeated pair fits that mean)."""
    total = sp.coo_matrix((values, (rows, cols)), shape=shape).tocsr()
    count = sp.coo_matrix((np.ones(len(values)), (rows, cols)), shape=shape).tocsr()
    total.data /= count.data  # tocsr sums duplicates: the two share one sorted pattern
    return total


def _client_of_users(labels, user_codes, users):
    """One client label per user; a user given two clients is an error."""
    label_values, label_codes = factorize_ids(labels)
    n_users = len(users)
    first = np.full(n_users, -1, dtype=np.int64)
    first[user_codes[::-1]] = label_codes[::-1]  # the first label listed for each user
    bad = np.flatnonzero(first[user_codes] != label_codes)
    if bad.size:
        who = pd.unique(users[user_codes[bad]])[:5].tolist()
        raise ValueError(
            f"Users {who} are given more than one client; a user's ratings live on one "
            "client (each user must have a single client label)."
        )
    return label_values[first]


def _top_n_supported_first(model, users, n, seen, candidates, supported):
    """``top_n`` over ``candidates`` (every item when None), the ``supported`` ones first:
    positions in ``candidates``, -1 where a user has fewer than ``n`` unseen candidates."""
    if supported.all() or not supported.any():
        return top_n(model, users, n, seen=seen, candidates=candidates)
    cand = np.arange(len(supported)) if candidates is None else candidates
    strong, weak = np.flatnonzero(supported), np.flatnonzero(~supported)
    index, scores = top_n(model, users, n, seen=seen, candidates=cand[strong])
    index = np.where(index >= 0, strong[np.maximum(index, 0)], -1)
    short = np.flatnonzero(index[:, -1] < 0)  # rows left with empty slots
    if short.size:
        fill, fill_scores = top_n(model, users[short], n, seen=seen, candidates=cand[weak])
        fill = np.where(fill >= 0, weak[np.maximum(fill, 0)], -1)
        for row, f, fs in zip(short, fill, fill_scores):
            start = np.count_nonzero(index[row] >= 0)
            index[row, start:] = f[: n - start]
            scores[row, start:] = fs[: n - start]
    return index, scores


def _check_n(n, n_max):
    if not isinstance(n, Integral) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}.")
    if n_max < 1:
        raise ValueError("There is no candidate item to rank.")
    return int(min(n, n_max))


def _ids_at(item_ids, candidates, index):
    """The ids of ``candidates[index]``; ``None`` where ``index`` is -1."""
    missing = index < 0
    ids = item_ids[candidates[np.where(missing, 0, index)]]
    if missing.any():
        ids = ids.astype(object)
        ids[missing] = None
    return ids
