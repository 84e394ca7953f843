"""RatingRegressor (pairs in, ratings out), top-N lists, and the matrix face's memory guard."""

import pickle
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.model_selection import GridSearchCV, GroupKFold, KFold, cross_validate
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import parametrize_with_checks

import sklearn_fedmf.engine._client_data as data
from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf._pairs import FactorModel, predict_pairs, top_n
from sklearn_fedmf.exceptions import DataWarning
from sklearn_fedmf.model_selection import fold_in_rmse


@parametrize_with_checks(
    [RatingRegressor(FedMAvg(n_components=2, n_clients=2, max_iter=20, random_state=0))],
    # none: the checks' continuous features are read as ids (every row a new user and item);
    # the poor_score tag says why such data cannot be fitted well.
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


def ratings(n_users=40, n_items=15, density=0.6, seed=0):
    """Long-format ratings of a rank-2 model plus noise: (user ids, item ids, ratings)."""
    rng = np.random.default_rng(seed)
    users, items = np.nonzero(rng.random((n_users, n_items)) < density)
    U, V = rng.normal(size=(n_users, 2)), rng.normal(size=(n_items, 2))
    y = 3.0 + (U[users] * V[items]).sum(1) + 0.1 * rng.normal(size=users.size)
    return users, items, y


# The oracles below (dense matrices, brute-force rankings, fallbacks to the mean) read the
# plain factor model; the models with biases are checked against the dense matrix with its
# biases in test_pair_predictions_are_the_dense_matrix_entries.
ESTIMATORS = {
    "fedmcadmm": lambda **kw: FedMCADMM(n_components=2, n_clients=4, max_iter=20,
                                        random_state=0, **{"biased": False, **kw}),
    "fedmavg": lambda **kw: FedMAvg(n_components=2, n_clients=4, max_iter=20, random_state=0,
                                    **{"biased": False, **kw}),
    "fedmgs": lambda **kw: FedMGS(n_components=2, n_clients=4, max_iter=20, random_state=0,
                                  **{"biased": False, **kw}),
    "rfrec": lambda **kw: RFRec(n_components=2, max_iter=20, random_state=0,
                                **{"biased": False, **kw}),
    "rfrec-sigmoid": lambda **kw: RFRec(
        n_components=2, max_iter=20, random_state=0, learning_rate=0.1, biased=False,
        solver_params={"link": "sigmoid", "optimizer": "adam"},
    ),
}


@pytest.fixture(scope="module")
def fitted():
    users, items, y = ratings()
    X = np.column_stack([users, items])
    return RatingRegressor(ESTIMATORS["fedmavg"]()).fit(X, y), X, y


@pytest.mark.parametrize(("name", "biased"), [(name, False) for name in ESTIMATORS]
                         + [(name, True) for name in ESTIMATORS if name != "rfrec-sigmoid"])
def test_pair_predictions_are_the_dense_matrix_entries(name, biased):
    users, items, y = ratings()
    reg = RatingRegressor(ESTIMATORS[name](biased=biased, clip=False)).fit(
        np.column_stack([users, items]), y)
    est = reg.estimator_
    dense = est.inverse_transform(est.user_factors_)  # the fitted model's full matrix
    if est.biased:  # (inverse_transform of factors alone carries no user bias)
        dense = dense + est.user_bias_[:, None]
    rng = np.random.default_rng(1)
    u, i = rng.integers(0, 40, 500), rng.integers(0, 15, 500)
    pairs = np.column_stack([reg.users_[u], reg.items_[i]])
    np.testing.assert_allclose(reg.predict(pairs), dense[u, i], rtol=1e-12, atol=1e-12)
    # the default clips the same model's entries to the training range, and only that
    est.set_params(clip=True)
    np.testing.assert_allclose(reg.predict(pairs), np.clip(dense[u, i], *est.rating_range_),
                               rtol=1e-12, atol=1e-12)


def test_unseen_ids_fall_back_to_the_training_mean_and_clip():
    users, items, y = ratings()
    X = np.column_stack([users, items])
    reg = RatingRegressor(FedMAvg(n_components=2, n_clients=4, max_iter=20, random_state=0))
    pred = reg.fit(X, y).predict([[999, 0], [0, 999], [999, 999], [0, 0]])
    assert np.isfinite(pred).all()
    est = reg.estimator_  # biased by default: an unseen user gets the item's bias, and back
    assert est.biased and reg.users_[0] == 0 and reg.items_[0] == 0
    np.testing.assert_allclose(pred[:3], [est.mean_ + est.item_bias_[0],
                                          est.mean_ + est.user_bias_[0], est.mean_], rtol=1e-12)
    assert est.mean_ == pytest.approx(y.mean())
    assert pred[3] != est.mean_
    # clip=True clips to the training range, seen or not
    reg.set_params(estimator__clip=True, estimator__alpha_u=0.0, estimator__max_iter=200)
    pred = reg.fit(X, y * 3).predict(X)
    assert pred.min() >= (y * 3).min() and pred.max() <= (y * 3).max()


def test_pair_kernel_with_biases_and_its_fallbacks():
    # (the rule the biased models use: rating = offset + b_u + b_i + u.v)
    rng = np.random.default_rng(0)
    U, Vt = rng.normal(size=(5, 3)), rng.normal(size=(4, 3))
    bu, bi = rng.normal(size=5), rng.normal(size=4)
    model = FactorModel(U, Vt, bu, bi, 3.5)
    u = np.array([0, 4, -1, 2, -1])
    i = np.array([3, 0, 1, -1, -1])
    out = predict_pairs(model, u, i, fallback=9.0)
    expected = [3.5 + bu[0] + bi[3] + U[0] @ Vt[3], 3.5 + bu[4] + bi[0] + U[4] @ Vt[0],
                3.5 + bi[1], 3.5 + bu[2], 9.0]
    np.testing.assert_allclose(out, expected)
    no_bias = predict_pairs(model._replace(user_bias=None, item_bias=None), u, i, 9.0)
    np.testing.assert_allclose(no_bias, [3.5 + U[0] @ Vt[3], 3.5 + U[4] @ Vt[0], 9, 9, 9])


def test_mixed_type_ids_round_trip_and_pickle():
    ids = np.array(["alice", 7, "bob", 12], dtype=object)
    rng = np.random.default_rng(0)
    users = ids[rng.integers(0, 4, 300)]
    items = np.array(["film", 1, 2, "x", 5, 6], dtype=object)[rng.integers(0, 6, 300)]
    df = pd.DataFrame({"who": users, "what": items, "stars": rng.integers(1, 6, 300)})
    reg = RatingRegressor(FedMAvg(n_components=2, n_clients=2, max_iter=10, random_state=0),
                          user_col="who", item_col="what")
    reg.fit(df[["who", "what"]], df["stars"])
    assert set(reg.users_.tolist()) == {"alice", 7, "bob", 12}
    assert set(reg.items_.tolist()) == {"film", 1, 2, "x", 5, 6}
    got, _ = reg.recommend(["alice", 7], n=6, exclude_seen=False)
    assert {type(v) for v in got.ravel()} <= {str, int}
    assert set(got[0].tolist()) == set(reg.items_.tolist())
    again = pickle.loads(pickle.dumps(reg))
    np.testing.assert_array_equal(again.predict(df[["who", "what"]]),
                                  reg.predict(df[["who", "what"]]))
    # a list of mixed ids is read as such (np.asarray would turn 7 into "7")
    plain = RatingRegressor(reg.estimator).fit(df[["who", "what"]].to_numpy().tolist(),
                                               df["stars"])
    assert set(plain.users_.tolist()) == {"alice", 7, "bob", 12}
    np.testing.assert_array_equal(plain.predict([["alice", "film"], [7, 1]]),
                                  reg.predict(pd.DataFrame({"who": ["alice", 7],
                                                            "what": ["film", 1]})))


def test_clients_from_column_parameter_or_estimator():
    users, items, y = ratings()
    X = np.column_stack([users, items])
    label = np.where(users < 20, "north", "south")
    by_param = RatingRegressor(FedMAvg(n_components=2, max_iter=5, random_state=0))
    by_param.fit(X, y, clients=label)
    np.testing.assert_array_equal(by_param.estimator_.clients_,
                                  np.where(by_param.users_ < 20, "north", "south"))
    by_col = RatingRegressor(FedMAvg(n_components=2, max_iter=5, random_state=0),
                             client_col="shop")
    X3 = pd.DataFrame({"user": users, "item": items, "shop": label})
    by_col.fit(X3, y)
    np.testing.assert_array_equal(by_col.predict(X3), by_param.predict(X))
    label[5] = "elsewhere"  # one rating of users[5] on another client
    with pytest.raises(ValueError, match=rf"Users \[{users[5]}\] are given more than one"):
        by_param.fit(X, y, clients=label)


def test_duplicate_pairs_are_fitted_at_their_mean():
    users, items, y = ratings()
    X = np.column_stack([users, items])
    est = FedMGS(n_components=2, n_clients=4, max_iter=10, random_state=0)
    once = RatingRegressor(est).fit(X, y)
    # said once, with the number of repeated ratings (fedmf says the same of a CSV file)
    with pytest.warns(DataWarning, match=f"^{len(y)} rating\\(s\\) repeat a") as record:
        twice = RatingRegressor(est).fit(np.vstack([X, X]), np.concatenate([y - 1, y + 1]))
    assert sum(issubclass(w.category, DataWarning) for w in record) == 1
    np.testing.assert_allclose(twice.predict(X), once.predict(X))


def test_ids_that_print_alike_are_two_users_with_a_warning():
    users, items, y = ratings()
    X = np.column_stack([users, items]).astype(object)
    X[users == 3, 0] = "3"  # user 3's ratings under the string "3", user 4's under 4 and "4"
    X[(users == 4) & (np.arange(len(users)) % 2 == 0), 0] = "4"
    est = FedMGS(n_components=2, n_clients=4, max_iter=3, random_state=0)
    with pytest.warns(DataWarning, match="^1 user id\\(s\\) occur both as a number and as a "
                                         "string \\(e.g. '4'\\)"):
        reg = RatingRegressor(est).fit(X, y)
    assert len(reg.users_) == len(np.unique(users)) + 1


def test_entrywise_cross_validate_and_grid_search_do_not_depend_on_n_jobs():
    users, items, y = ratings()
    X = np.column_stack([users, items])
    reg = RatingRegressor(FedMAvg(n_components=2, n_clients=4, max_iter=200, alpha_u=1.0,
                                  alpha_v=1.0, biased=False, random_state=0))  # low-rank data
    cv = KFold(3, shuffle=True, random_state=0)
    one, two = (cross_validate(reg, X, y, cv=cv, scoring="neg_root_mean_squared_error",
                               n_jobs=n)["test_score"] for n in (1, 2))
    np.testing.assert_array_equal(one, two)
    assert (-one < 0.5 * y.std()).all()  # far better than the mean on held-out ratings
    reg.set_params(estimator__max_iter=10)
    grid = {"estimator__alpha_u": [0.1, 1.0], "estimator__n_components": [1, 2]}
    searches = [GridSearchCV(reg, grid, cv=cv, n_jobs=n).fit(X, y) for n in (1, 2)]
    np.testing.assert_array_equal(*(s.cv_results_["mean_test_score"] for s in searches))
    assert searches[0].best_estimator_.estimator_.n_components in (1, 2)


def test_users_held_out_fold_in_matches_the_matrix_fold_in():
    users, items, y = ratings(n_users=60)
    X = np.column_stack([users, items])
    train = users < 45
    reg = RatingRegressor(FedMAvg(n_components=2, n_clients=4, max_iter=200, alpha_u=1.0,
                                  alpha_v=1.0, biased=False, random_state=0))  # low-rank data
    reg.fit(X[train], y[train])
    y_true, pred, keep = reg._fold_in_predict(X[~train], y[~train])
    # oracle: the matrix face, X = the new users' fold-in ratings, at = their scored pairs
    new_u, new_i, new_y = users[~train] - 45, items[~train], y[~train]
    shape = (15, 15)
    fold = sp.csr_matrix((new_y[~keep], (new_u[~keep], new_i[~keep])), shape=shape)
    at = sp.csr_matrix((np.ones(keep.sum()), (new_u[keep], new_i[keep])), shape=shape)
    expected = reg.estimator_.predict(fold, at=at)
    np.testing.assert_allclose(pred, np.asarray(expected[new_u[keep], new_i[keep]]).ravel())
    assert 0.4 < keep.mean() < 0.6  # fold_in_size=0.5
    scores = cross_validate(reg, X, y, groups=users, cv=GroupKFold(3), scoring=fold_in_rmse)
    assert (-scores["test_score"] < y.std()).all()


def brute_force_top(reg, user, n, exclude_seen, X):
    est = reg.estimator_
    scores = est.inverse_transform(est.user_factors_)[user]
    if exclude_seen:
        rated = X[X[:, 0] == reg.users_[user], 1]
        scores[np.isin(reg.items_, rated)] = -np.inf
    order = np.argsort(-scores, kind="stable")[:n]
    return reg.items_[order], scores[order]


@pytest.mark.parametrize("exclude_seen", [True, False])
def test_top_n_is_sorted_unseen_and_matches_brute_force(fitted, exclude_seen):
    reg, X, y = fitted
    ids, scores = reg.recommend(reg.users_, n=5, exclude_seen=exclude_seen, min_support=0)
    assert ids.shape == scores.shape == (40, 5)
    assert (scores[:, :-1] >= scores[:, 1:]).all()
    padded = 0
    for k, user in enumerate(reg.users_):
        want_ids, want_scores = brute_force_top(reg, k, 5, exclude_seen, X)
        if np.isneginf(want_scores).any():  # fewer than 5 unrated items: None-padded
            want_ids = np.where(np.isneginf(want_scores), None, want_ids)
            padded += 1
        np.testing.assert_array_equal(ids[k], want_ids)
        np.testing.assert_allclose(scores[k], want_scores, rtol=1e-12)
        rated = set(X[X[:, 0] == user, 1])
        assert exclude_seen is False or not rated & set(ids[k])
    assert padded > 0 if exclude_seen else padded == 0


def test_top_n_candidates_padding_and_cold_users(fitted):
    reg, X, y = fitted
    user = X[0, 0]
    rated = X[X[:, 0] == user, 1]
    pool = np.concatenate([rated[:3], np.setdiff1d(reg.items_, rated)[:2]])
    ids, scores = reg.recommend(user, n=4, items=pool)  # 2 unseen candidates for 4 slots
    assert ids.tolist()[2:] == [None, None] and np.isneginf(scores[2:]).all()
    assert set(ids[:2]) == set(pool[3:])
    cold_ids, cold_scores = reg.recommend(["nobody"], n=3)
    popular = np.argsort(-np.bincount(X[:, 1]), kind="stable")[:3]
    np.testing.assert_array_equal(cold_ids[0], reg.items_[popular])
    np.testing.assert_array_equal(cold_scores[0], reg.estimator_.mean_)
    with pytest.raises(ValueError, match="not seen in fit"):
        reg.recommend(user, items=[123456])
    # the batches do not change the result
    model = reg.estimator_._factor_model()
    small = top_n(model, np.arange(40), 5, seen=reg._seen, budget=8 * 15 * 3)
    np.testing.assert_array_equal(small[0], top_n(model, np.arange(40), 5, seen=reg._seen)[0])


def test_similar_items_is_the_cosine_ranking(fitted):
    reg, X, y = fitted
    V = reg.estimator_.components_.T
    cos = (V @ V.T) / np.outer(np.linalg.norm(V, axis=1), np.linalg.norm(V, axis=1))
    ids, sims = reg.similar_items(reg.items_[:3], n=4)
    for k in range(3):
        row = cos[k].copy()
        row[k] = -np.inf
        order = np.argsort(-row, kind="stable")[:4]
        np.testing.assert_array_equal(ids[k], reg.items_[order])
        np.testing.assert_allclose(sims[k], row[order])


def test_in_a_pipeline_and_clone_keep_the_nested_params(fitted):
    reg, X, y = fitted
    pipe = make_pipeline(FunctionTransformer(), RatingRegressor(FedMAvg(max_iter=5)))
    pipe.set_params(ratingregressor__estimator__n_components=3)
    pipe.fit(X, y)
    assert pipe[-1].estimator_.components_.shape == (3, 15)
    assert pipe.predict(X).shape == y.shape


# ---- the matrix face ------------------------------------------------------------------------
def test_predict_at_a_sparse_pattern_equals_the_dense_entries_and_score(fitted):
    reg, X, y = fitted
    est = reg.estimator_
    R = sp.csr_matrix((y, (X[:, 0], X[:, 1])), shape=(40, 15))
    rng = np.random.default_rng(3)
    at = sp.random(40, 15, density=0.3, format="csr", random_state=rng)
    at = sp.csr_matrix(sp.diags((np.arange(40) > 0) * 1.0) @ at)  # row 0 predicts nothing
    at.eliminate_zeros()
    at.sort_indices()
    sparse = est.predict(R, at=at)
    dense = est.predict(R)
    assert sp.issparse(sparse) and (sparse != 0).nnz <= at.nnz
    np.testing.assert_array_equal(sparse.indices, at.indices)
    np.testing.assert_allclose(sparse.toarray()[at.toarray() != 0], dense[at.toarray() != 0])
    held = sp.csr_matrix((np.full(at.nnz, 3.0), at.indices, at.indptr), shape=at.shape)
    rmse = np.sqrt(np.mean((dense[held.toarray() != 0] - 3.0) ** 2))
    assert est.score(R, held) == pytest.approx(-rmse)


@pytest.mark.parametrize("name", ["fedmavg", "rfrec-sigmoid"])
def test_dense_guard_raises_before_any_work(fitted, monkeypatch, name):
    users, items, y = ratings()
    est = ESTIMATORS[name]().fit(sp.csr_matrix((y, (users, items)), shape=(40, 15)))
    R = sp.csr_matrix((y, (users, items)), shape=(40, 15))

    def no_work(*args, **kwargs):  # the guard must come before fold-in and allocation
        raise AssertionError("work started before the size check")

    monkeypatch.setattr(data, "MAX_DENSE_ENTRIES", 40 * 15 - 1)
    monkeypatch.setattr(type(est), "_factor_model", no_work)
    monkeypatch.setattr(type(est), "_fold_in", no_work)
    with pytest.raises(ValueError, match="RatingRegressor.*recommend"):
        est.predict(R)
    with pytest.raises(ValueError, match=r"predict\(X, at=pattern\)"):
        est.inverse_transform(np.zeros((40, 2)))
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert est.predict(R, at=R).nnz == R.nnz  # the pattern API is never refused


def test_binary_predict_is_guarded_too(monkeypatch):
    from sklearn_fedmf import Felb

    X = (np.random.default_rng(0).random((30, 10)) < 0.3).astype(float)
    model = Felb(n_components=2, n_clients=3, max_iter=3, random_state=0).fit(X)
    assert model.predict(X).shape == (30, 10)
    monkeypatch.setattr(data, "MAX_DENSE_ENTRIES", 299)
    monkeypatch.setattr(type(model), "transform", lambda *a: pytest.fail("work started"))
    with pytest.raises(ValueError, match=r"30 x 10 matrix.*transform\(X\) and components_"):
        model.predict(X)


# ---- predictions stay on the rating scale by default (clip=True) -------------------------
@pytest.mark.parametrize("Estimator", [FedMCADMM, FedMAvg, FedMGS, RFRec])
def test_predictions_are_clipped_to_the_training_range_by_default(Estimator):
    # a rank-2 model whose unobserved entries reach far beyond the observed range: the raw
    # model extrapolates past it, the default clips every face to rating_range_
    rng = np.random.default_rng(3)
    U, V = rng.normal(size=(60, 2)) * 2, rng.normal(size=(20, 2)) * 2
    users, items = np.nonzero(rng.random((60, 20)) < 0.5)
    raw = (U[users] * V[items]).sum(1)
    keep = np.abs(raw) < 2.0  # observed ratings in (1, 5); the hidden ones are not
    users, items, y = users[keep], items[keep], 3.0 + raw[keep]
    X = pd.DataFrame({"user": users, "item": items})
    params = dict(n_components=2, n_clients=3, max_iter=60, alpha_u=1e-3, alpha_v=1e-3,
                  random_state=0)
    if Estimator is RFRec:
        params.update(learning_rate=0.05, n_clients=20, max_iter=200)
    clipped = RatingRegressor(Estimator(**params)).fit(X, y)
    low, high = clipped.estimator_.rating_range_
    assert (low, high) == (y.min(), y.max())
    grid = pd.DataFrame({"user": np.repeat(np.arange(60), 20), "item": np.tile(np.arange(20), 60)})
    unclipped = RatingRegressor(Estimator(**params, clip=False)).fit(X, y)
    raw_pred = unclipped.predict(grid)
    assert raw_pred.min() < low - 0.1 or raw_pred.max() > high + 0.1  # the raw model leaves it
    pred = clipped.predict(grid)
    np.testing.assert_array_equal(pred, np.clip(raw_pred, low, high))
    _, scores = clipped.recommend(np.arange(60), n=5, exclude_seen=False)
    assert scores.min() >= low and scores.max() <= high
    dense = clipped.estimator_.predict(sp.csr_matrix((y, (users, items)), shape=(60, 20)))
    assert dense.min() >= low and dense.max() <= high
