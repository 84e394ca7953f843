"""Tests of the top-N ranking metrics and the sampled protocol of sklearn_fedmf.metrics."""

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.metrics import ndcg_score

from sklearn_fedmf.metrics import (
    average_precision_at_k,
    catalog_coverage,
    hit_rate_at_k,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
    sampled_rankings,
)

D = 1 / np.log2(np.arange(2, 12))  # the discounts of positions 0, 1, 2, ...

# user 0: relevant {1, 5}, hits at positions 0 and 2; user 1: {9}, hit at position 1;
# user 2: no relevant item (excluded from every mean)
Y_TRUE = [[1, 5], [9], []]
Y_PRED = [[1, 2, 5], [3, 9, 4], [1, 2, 3]]


@pytest.mark.parametrize("metric, k, expected", [
    (hit_rate_at_k, 3, 1.0),
    (hit_rate_at_k, 1, 0.5),
    (precision_at_k, 3, (2 / 3 + 1 / 3) / 2),
    (recall_at_k, 3, 1.0),
    (recall_at_k, 1, (1 / 2 + 0) / 2),
    (ndcg_at_k, 3, ((D[0] + D[2]) / (D[0] + D[1]) + D[1] / D[0]) / 2),
    (average_precision_at_k, 3, ((1 + 2 / 3) / 2 + (1 / 2) / 1) / 2),
    (average_precision_at_k, 2, ((1 / 1) / 2 + (1 / 2) / 1) / 2),
])
def test_metrics_match_hand_computed_values(metric, k, expected):
    assert metric(Y_TRUE, Y_PRED, k=k) == pytest.approx(expected, rel=1e-12)


def test_a_user_without_relevant_items_is_excluded_not_counted_as_zero():
    with_empty = hit_rate_at_k([[1], [], [7]], [[1], [1], [2]], k=1)
    assert with_empty == 0.5  # (1 + 0) / 2, not (1 + 0 + 0) / 3
    zero_grade = pd.DataFrame({"u": [0, 1, 1], "i": [1, 7, 8], "rel": [1.0, 0.0, 0.0]})
    assert hit_rate_at_k(zero_grade, [[1], [7]], k=1, users=[0, 1]) == 1.0
    with pytest.raises(ValueError, match="No user has a relevant item"):
        ndcg_at_k([[], []], [[1], [2]], k=1)


def test_k_larger_than_the_list_counts_missing_slots_as_misses():
    y_true, y_pred = [[1, 2]], [[1, None]]  # one real item, one empty slot
    assert precision_at_k(y_true, y_pred, k=5) == pytest.approx(1 / 5)
    assert recall_at_k(y_true, y_pred, k=5) == pytest.approx(1 / 2)
    assert ndcg_at_k(y_true, y_pred, k=5) == pytest.approx(D[0] / (D[0] + D[1]))
    assert average_precision_at_k(y_true, y_pred, k=5) == pytest.approx(1 / 2)
    assert hit_rate_at_k([[2]], [[1, np.nan]], k=50) == 0.0


def test_list_order_decides_ties_and_repeats_count_once():
    # a repeated item counts at its first position only
    assert precision_at_k([[2, 1]], [[2, 2, 1]], k=2) == 0.5
    assert recall_at_k([[2, 1]], [[2, 2, 1]], k=3) == 1.0
    # tied scores in a DataFrame: the row order ranks them (5, then 7, then 3)
    scored = pd.DataFrame({"u": [0, 0, 0], "i": [7, 3, 5], "score": [1.0, 1.0, 2.0]})
    truth = pd.DataFrame({"u": [0], "i": [3]})
    assert hit_rate_at_k(truth, scored, k=2) == 0.0
    assert ndcg_at_k(truth, scored, k=3) == pytest.approx(D[2])
    assert hit_rate_at_k(truth, scored.iloc[:, :2], k=2) == 1.0  # no score: the row order


def test_graded_ndcg_and_equal_input_shapes():
    truth = pd.DataFrame({"u": [0, 0, 0, 1], "i": [1, 3, 4, 2], "rel": [1.0, 3.0, 2.0, 2.0]})
    lists = [[1, 3, 9], [5, 6, 2]]
    expected_0 = (1 * D[0] + 3 * D[1]) / (3 * D[0] + 2 * D[1] + 1 * D[2])
    expected_1 = (2 * D[2]) / (2 * D[0])
    expected = (expected_0 + expected_1) / 2
    assert ndcg_at_k(truth, lists, k=3, users=[0, 1]) == pytest.approx(expected, rel=1e-12)
    as_dicts = [{1: 1.0, 3: 3.0, 4: 2.0}, {2: 2.0}]
    assert ndcg_at_k(as_dicts, lists, k=3) == pytest.approx(expected, rel=1e-12)
    as_sparse = sp.csr_matrix((truth.rel, (truth.u, truth.i)), shape=(2, 10))
    assert ndcg_at_k(as_sparse, lists, k=3) == pytest.approx(expected, rel=1e-12)
    long_lists = pd.DataFrame({"u": np.repeat([1, 0], 3), "i": [5, 6, 2, 1, 3, 9]})
    assert ndcg_at_k(truth, long_lists, k=3) == pytest.approx(expected, rel=1e-12)
    # without the relevance column every relevant item weighs 1
    binary = ndcg_at_k(truth.iloc[:, :2], lists, k=3, users=[0, 1])
    assert binary == pytest.approx(((D[0] + D[1]) / D[:3].sum() + D[2]) / 2, rel=1e-12)


def test_graded_ndcg_matches_scikit_learn_on_full_rankings():
    rng = np.random.default_rng(0)
    relevance = rng.integers(0, 4, size=(30, 12)).astype(float)
    relevance[:, 0] = np.maximum(relevance[:, 0], 1)  # every user has a relevant item
    scores = rng.permuted(np.tile(np.arange(12.0), (30, 1)), axis=1)  # distinct scores
    lists = np.argsort(-scores, axis=1)
    for k in (1, 5, 12, 20):
        ours = ndcg_at_k([dict(enumerate(row)) for row in relevance], lists, k=k)
        assert ours == pytest.approx(ndcg_score(relevance, scores, k=k), rel=1e-12)


def test_catalog_coverage():
    lists = [[0, 1, 2], [0, 3, None], [9, 9, 9]]  # 9 is outside the catalog
    assert catalog_coverage(lists, 8, k=2) == 3 / 8  # {0, 1, 3}
    assert catalog_coverage(lists, ["a", 0, 1, 2, 3], k=3) == 4 / 5
    frame = pd.DataFrame({"u": [0, 0, 1], "i": ["a", "b", "a"]})
    assert catalog_coverage(frame, ["a", "b", "c", "d"], k=1) == 1 / 4


def test_input_errors_are_clear():
    frame = pd.DataFrame({"u": [0], "i": [1]})
    with pytest.raises(ValueError, match="give users"):
        hit_rate_at_k(frame, [[1]])
    with pytest.raises(ValueError, match="one entry per user"):
        hit_rate_at_k([[1], [2]], [[1]])
    with pytest.raises(ValueError, match="non-negative"):
        ndcg_at_k([{1: -1.0}], [[1]])
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        recall_at_k([[1]], [[1]], k=0)


def _interactions(n_users=400, n_items=300, per_user=20, seed=0):
    rng = np.random.default_rng(seed)
    users = np.repeat(np.arange(n_users), per_user)
    items = np.concatenate([rng.choice(n_items, per_user, replace=False)
                            for _ in range(n_users)])
    frame = pd.DataFrame({"user": users, "item": items})
    last = frame.groupby("user").tail(1).index
    return frame.drop(last), frame.loc[last]


def test_sampled_protocol_is_reproducible_and_samples_unrated_items():
    train, test = _interactions()
    constant = lambda pairs: np.zeros(len(pairs))  # noqa: E731
    y_true, y_pred = sampled_rankings(constant, train, test, random_state=3)
    again = sampled_rankings(constant, train, test, random_state=3)
    np.testing.assert_array_equal(y_pred, again[1])
    assert not np.array_equal(y_pred, sampled_rankings(constant, train, test,
                                                       random_state=4)[1])
    assert y_pred.shape == (len(test), 100)
    rated = pd.concat([train, test]).groupby("user").item.agg(set)
    catalog = set(train.item)
    for user, held_out, row in zip(test.user, y_true, y_pred):
        assert len(set(row)) == 100 and held_out in row
        negatives = set(row) - {held_out}
        assert not negatives & rated[user] and negatives <= catalog
    # ties are ranked in random order: a constant model hits at 10 about 10% of the time
    assert abs(hit_rate_at_k(y_true, y_pred, k=10) - 0.10) < 0.05


def test_sampled_protocol_ranks_by_the_scores():
    train, test = _interactions(n_users=50)
    held_out = set(zip(test.user, test.item))
    oracle = lambda pairs: np.array([(u, i) in held_out  # noqa: E731
                                     for u, i in zip(pairs.user, pairs.item)], dtype=float)
    y_true, y_pred = sampled_rankings(oracle, train, test, n_negatives=20, random_state=0)
    assert hit_rate_at_k(y_true, y_pred, k=1) == 1.0
    # a user who left fewer unrated items than n_negatives gets a shorter, padded list
    small_train = pd.DataFrame({"user": [0, 0, 1], "item": [0, 1, 2]})
    small_test = pd.DataFrame({"user": [0], "item": [2]})
    _, short = sampled_rankings(oracle, small_train, small_test, n_negatives=5, random_state=0)
    assert short.shape == (1, 6) and sum(x is not None for x in short[0]) == 1


def test_sampled_protocol_keeps_mixed_type_ids():
    train = pd.DataFrame({"user": ["a", "a", "b", "b", 7], "item": ["x", 1, 1, "y", 2]})
    test = pd.DataFrame({"user": ["a", "b"], "item": ["y", "x"]})
    by_position = lambda pairs: -np.arange(len(pairs), dtype=float)  # noqa: E731
    y_true, y_pred = sampled_rankings(by_position, train, test, n_negatives=3, random_state=0)
    # each user left only item 2 unrated; the held-out item is scored first, so ranked first
    assert y_pred.tolist() == [["y", 2, None, None], ["x", 2, None, None]]
    assert y_true.tolist() == ["y", "x"]
