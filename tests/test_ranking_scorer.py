"""``make_ranking_scorer``: top-N metrics of ``RatingRegressor`` inside scikit-learn's CV."""

import numpy as np
import pandas as pd
import pytest
from sklearn.model_selection import GridSearchCV, KFold, cross_validate

from sklearn_fedmf import FedMAvg, RatingRegressor
from sklearn_fedmf.metrics import hit_rate_at_k, ndcg_at_k, recall_at_k
from sklearn_fedmf.model_selection import make_ranking_scorer


def block_ratings(n_users=40, n_items=16, seed=0):
    """Two tastes: even users like items 0-7 (rated 5, others 1), odd users the others."""
    rng = np.random.default_rng(seed)
    users, items = np.nonzero(rng.random((n_users, n_items)) < 0.5)
    likes = (users % 2 == 0) == (items < n_items // 2)
    y = np.where(likes, 5.0, 1.0)
    return np.column_stack([users, items]), y


def estimator():
    # FedMAvg's former fixed strengths: the "auto" defaults' item penalty (2 per rating,
    # chosen for data whose structure is mostly biases) does not learn the two tastes in
    # 10 rounds (nDCG 0.26 against 0.29 for random items)
    return RatingRegressor(FedMAvg(n_components=2, n_clients=4, max_iter=10, alpha_u=10.0,
                                   alpha_v=10.0, random_state=0))


def test_scorer_is_the_metric_of_recommend_on_each_fold():
    X, y = block_ratings()
    cv = KFold(3, shuffle=True, random_state=0)
    scorer = make_ranking_scorer("ndcg", k=4, threshold=4.0)
    res = cross_validate(estimator(), X, y, cv=cv, scoring=scorer, return_estimator=True)
    rng = np.random.default_rng(0)
    random_scores = []
    for (train, test), reg, score in zip(cv.split(X), res["estimator"], res["test_score"]):
        liked = y[test] >= 4.0  # the threshold: only the held-out items rated 4 or more
        truth = pd.DataFrame({"u": X[test, 0][liked], "i": X[test, 1][liked]})
        users = truth.u.unique()
        lists, _ = reg.recommend(users, n=4)
        assert score == pytest.approx(ndcg_at_k(truth, lists, k=4, users=users), rel=1e-12)
        unseen = [rng.permutation(np.setdiff1d(np.arange(16), X[train][X[train, 0] == u, 1]))
                  for u in users]
        random_scores.append(ndcg_at_k(truth, unseen, k=4, users=users))
    # the two tastes are learnable: far better than random unseen items
    assert res["test_score"].mean() > 1.5 * np.mean(random_scores)


def test_threshold_none_counts_every_held_out_item_and_graded_reads_ratings():
    X, y = block_ratings()
    train = np.arange(len(y)) % 4 != 0
    reg = estimator().fit(X[train], y[train])
    Xt, yt = X[~train], y[~train]
    users = pd.unique(Xt[:, 0])
    lists, _ = reg.recommend(users, n=5)
    truth = pd.DataFrame({"u": Xt[:, 0], "i": Xt[:, 1], "rel": yt})
    assert make_ranking_scorer("recall", k=5)(reg, Xt, yt) == pytest.approx(
        recall_at_k(truth.iloc[:, :2], lists, k=5, users=users))
    assert make_ranking_scorer("ndcg", k=5, graded=True)(reg, Xt, yt) == pytest.approx(
        ndcg_at_k(truth, lists, k=5, users=users))
    assert make_ranking_scorer("hit_rate", k=5, min_support=0)(reg, Xt, yt) == pytest.approx(
        hit_rate_at_k(truth.iloc[:, :2], reg.recommend(users, n=5, min_support=0)[0], k=5,
                      users=users))


def test_scorer_inside_grid_search():
    X, y = block_ratings()
    cv = KFold(3, shuffle=True, random_state=0)
    scorer = make_ranking_scorer("hit_rate", k=3, threshold=4.0)
    search = GridSearchCV(estimator(), {"estimator__n_components": [1, 2]}, cv=cv,
                          scoring=scorer, error_score="raise").fit(X, y)
    scores = search.cv_results_["mean_test_score"]
    assert np.all((scores >= 0) & (scores <= 1))
    assert search.best_score_ == scores.max()
    for rank, score in zip([1, 2], scores):  # the same folds, scored alike by cross_validate
        alone = cross_validate(estimator().set_params(estimator__n_components=rank), X, y,
                               cv=cv, scoring=scorer)["test_score"].mean()
        assert score == pytest.approx(alone, rel=1e-12)


def test_scorer_arguments_are_checked():
    with pytest.raises(ValueError, match="metric must be one of"):
        make_ranking_scorer("auc")
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        make_ranking_scorer(k=0)
    with pytest.raises(ValueError, match="threshold must be a finite number"):
        make_ranking_scorer(threshold=np.nan)
    assert repr(make_ranking_scorer("ndcg", k=5, threshold=4.0)) == (
        "make_ranking_scorer('ndcg', k=5, threshold=4.0)")
