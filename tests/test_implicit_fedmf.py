"""loss="implicit" (weighted matrix factorization over every pair) for FedMAvg and FedMGS:
the Gram shortcuts against dense references that loop over every user-item pair, the
federations' invariants (partition, n_jobs, privacy contract) and the estimator surface."""

import gc
import pickle
import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import FedMAvg, FedMGS
from sklearn_fedmf.completion._fedmavg._fedmavg_implicit import w_bounds, w_steps
from sklearn_fedmf.completion._fedmgs._fedmgs_implicit import (
    MessageMemory,
    server_solve,
    share,
)
from sklearn_fedmf.completion._implicit import (
    implicit_item_gradient,
    implicit_item_sums,
    implicit_objective,
    implicit_rank,
    implicit_user_factors,
    packed_size,
    unpack_gram,
)
from sklearn_fedmf.exceptions import FedMFWarning
from sklearn_fedmf.metrics import ndcg_at_k
from tests._implicit_reference import (
    dense_implicit_objective,
    dense_item_gradient,
    dense_parts,
    dense_user_factors,
    dense_user_gradient,
)

RTOL = 1e-10


def tiny(seed=0, shape=(6, 5), rank=2, density=0.5):
    """Interactions of strengths 1..5 on about half the pairs, and random factors."""
    rng = np.random.default_rng(seed)
    mask = rng.random(shape) < density
    mask[np.arange(shape[0]), rng.integers(0, shape[1], shape[0])] = True  # a row each
    X = sp.csr_matrix(np.where(mask, rng.integers(1, 6, shape).astype(float), 0.0))
    return X, rng.normal(size=(shape[0], rank)), rng.normal(size=(shape[1], rank))


def interactions(seed=0, n_users=40, n_items=25, rank=3):
    """Interactions drawn from a low-rank preference (enough structure to rank)."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(n_users, rank)) @ rng.normal(size=(rank, n_items))
    mask = scores > np.quantile(scores, 0.75, axis=1, keepdims=True)
    return sp.csr_matrix(np.where(mask, rng.integers(1, 6, mask.shape), 0).astype(float))


# ---- the shared module against the dense references ----------------------------------------
@pytest.mark.parametrize("confidence", [0.0, 0.7, 3.0])
def test_gram_objective_equals_the_sum_over_every_pair(confidence):
    X, U, Vt = tiny()
    got = implicit_objective(X, U, Vt, confidence=confidence, alpha_u=0.3, alpha_v=0.2)
    want = dense_implicit_objective(X, U, Vt, confidence=confidence, alpha_u=0.3, alpha_v=0.2)
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_user_solve_is_the_dense_minimizer_and_zeroes_the_dense_gradient():
    X, _, Vt = tiny(seed=1)
    U = implicit_user_factors(X, Vt, Vt.T @ Vt, confidence=2.0, alpha_u=0.5)
    np.testing.assert_allclose(U, dense_user_factors(X, Vt, confidence=2.0, alpha_u=0.5),
                               rtol=RTOL)
    grad = dense_user_gradient(X, U, Vt, confidence=2.0) + 0.5 * U
    np.testing.assert_allclose(grad, 0.0, atol=1e-12)


def test_item_gradient_and_aggregates_equal_the_dense_gradient():
    X, U, Vt = tiny(seed=2)
    want = dense_item_gradient(X, U, Vt, confidence=1.5)
    np.testing.assert_allclose(implicit_item_gradient(X, U, Vt, confidence=1.5), want,
                               rtol=RTOL)
    items, G = implicit_item_sums(X, U, confidence=1.5)
    r = U.shape[1]
    G2, G1 = G[:, :r], unpack_gram(G[:, r:], r)
    from_sums = Vt @ (U.T @ U)  # every item: the Gram term; rated items: the aggregates
    from_sums[items] += np.einsum("jab,jb->ja", G1, Vt[items]) - G2
    np.testing.assert_allclose(from_sums, want, rtol=RTOL)


# ---- FedMGS: the server's step from the clients' messages -----------------------------------
def test_fedmgs_server_step_is_the_exact_minimizer_from_the_clients_messages():
    X, U, _ = tiny(seed=3, shape=(6, 5))
    parts = [np.array([0, 3]), np.array([1, 2, 5]), np.array([4])]  # three clients
    r = U.shape[1]
    sums, grams = np.zeros((X.shape[1], packed_size(r))), np.zeros((r, r))
    for rows in parts:
        msg = share(U[rows], X[rows], confidence=1.2)
        sums[msg["items"]] += msg["G"]
        grams += msg["gram"]
    Vt = server_solve(sums, grams, alpha_v=0.4)
    grad = dense_item_gradient(X, U, Vt, confidence=1.2) + 0.4 * Vt
    np.testing.assert_allclose(grad, 0.0, atol=1e-12)


def test_fedmgs_change_message_is_the_difference_of_two_messages():
    X, U, _ = tiny(seed=4)
    U_old = np.random.default_rng(9).normal(size=U.shape)
    change = share(U, X, confidence=0.8, U_old=U_old)
    new, old = share(U, X, confidence=0.8), share(U_old, X, confidence=0.8)
    np.testing.assert_allclose(change["G"], new["G"] - old["G"], rtol=RTOL, atol=1e-14)
    np.testing.assert_allclose(change["gram"], new["gram"] - old["gram"], rtol=RTOL,
                               atol=1e-14)



def test_message_memory_gives_the_fresh_message_in_one_array_round_after_round():
    # items rated by 1 to 11 users: both ways of forming a row (direct, and the product)
    X = interactions(seed=6, n_users=30, n_items=20)
    assert {1, 2, 3} & set(np.diff(X.tocsc().indptr)) and np.diff(X.tocsc().indptr).max() >= 4
    rng, memory = np.random.default_rng(0), MessageMemory()
    U_old, arrays = np.zeros((30, 3)), []
    for _ in range(3):
        U = rng.normal(size=(30, 3))
        fresh = share(U, X, confidence=1.5, U_old=U_old)
        kept = share(U, X, confidence=1.5, U_old=U_old, memory=memory)
        for key in ("items", "G", "gram"):
            np.testing.assert_array_equal(kept[key], fresh[key])
        arrays.append(kept["G"])
        U_old = U
    assert all(a is arrays[0] for a in arrays)
    # another matrix has its own array; a copy (a protocol sent to a worker) starts empty
    other = share(U, X[:10], confidence=1.5, memory=memory)
    assert not np.shares_memory(other["G"], arrays[0])
    assert pickle.loads(pickle.dumps(memory))._clients == {}


def test_message_memory_goes_with_the_fit():
    X = interactions(seed=7, n_users=30, n_items=20)
    gc.collect()
    before = sum(isinstance(o, MessageMemory) for o in gc.get_objects())
    model = fit(FedMGS, X, n_components=3, n_clients=3, max_iter=2)
    gc.collect()
    assert model.n_iter_ == 2
    assert sum(isinstance(o, MessageMemory) for o in gc.get_objects()) == before

# ---- FedMAvg: the local W steps ------------------------------------------------------------
def test_fedmavg_w_step_is_a_gradient_step_of_the_dense_local_objective():
    X, U, Vt = tiny(seed=5)
    scale, alpha_v = 2.5, 0.3
    d = 0.6 * w_bounds(X, U, confidence=1.0, scale=scale, alpha_v=alpha_v)
    got = w_steps(Vt, U, X, 1, d, confidence=1.0, scale=scale, alpha_v=alpha_v)
    grad = scale * dense_item_gradient(X, U, Vt, confidence=1.0) + alpha_v * Vt
    np.testing.assert_allclose(got, Vt - grad / d[:, None], rtol=RTOL)
    # the bound holds every row's curvature: scale * (U^T U + G1_j) + alpha_v
    P, R = dense_parts(X)
    for j in range(X.shape[1]):
        H = scale * (U.T * (1.0 + 1.0 * R[:, j])) @ U + alpha_v * np.eye(U.shape[1])
        assert np.linalg.eigvalsh(H)[-1] <= d[j] / 0.6 * (1 + 1e-12)


# ---- the estimators ------------------------------------------------------------------------
def fit(cls, X, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        return cls(loss="implicit", random_state=0, **params).fit(X)


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_recorded_objective_is_the_dense_objective_at_the_fitted_factors(cls):
    X = interactions(seed=1)
    est = fit(cls, X, n_components=3, n_clients=4, max_iter=3, alpha_u=0.5, alpha_v=0.7)
    want = dense_implicit_objective(X, est.user_factors_, est.components_.T,
                                    confidence=est.confidence_,
                                    alpha_u=0.5, alpha_v=0.7)
    np.testing.assert_allclose(est.history_[-1]["objective"], want, rtol=RTOL)


def test_fedmgs_with_every_client_does_not_depend_on_the_partition():
    # every round is one exact ALS sweep: the users' solves and the items' solves (the
    # exact solver: conjugate-gradient steps start from the partition's users)
    X = interactions(seed=2)
    exact = {"implicit_solver": "cholesky"}
    one = fit(FedMGS, X, n_components=3, n_clients=1, max_iter=4, solver_params=exact)
    five = fit(FedMGS, X, n_components=3, n_clients=5, max_iter=4,
               solver_params={"init_scale": 1.0, **exact})
    # (the users' start differs with the partition; the first user solve removes it)
    np.testing.assert_allclose(five.components_, one.components_, rtol=1e-8, atol=1e-10)
    # one client per user (cross-device) is the same federation
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        per_user = FedMGS(loss="implicit", n_components=3, max_iter=4, random_state=0,
                          solver_params=exact).fit(X, clients=np.arange(X.shape[0]))
    np.testing.assert_allclose(per_user.components_, one.components_, rtol=1e-8, atol=1e-10)
    objectives = [h["objective"] for h in one.history_]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(objectives, objectives[1:]))


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_model_does_not_depend_on_n_jobs(cls):
    X = interactions(seed=3)
    a = fit(cls, X, n_components=3, n_clients=4, max_iter=3, clients_per_round=2)
    b = fit(cls, X, n_components=3, n_clients=4, max_iter=3, clients_per_round=2, n_jobs=2)
    np.testing.assert_array_equal(a.components_, b.components_)


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_auto_confidence_makes_the_model_free_of_the_strengths_unit(cls):
    # "auto" is 1 / mean strength: strengths times 7 give the same weights, so the same model
    X = interactions(seed=6)
    model = fit(cls, X, n_components=3, n_clients=3, max_iter=3)
    assert model.confidence_ == pytest.approx(1.0 / X.data.mean(), rel=1e-12)
    scaled = fit(cls, 7.0 * X, n_components=3, n_clients=3, max_iter=3)
    np.testing.assert_allclose(scaled.components_, model.components_, rtol=1e-9, atol=1e-12)
    fixed = fit(cls, 7.0 * X, n_components=3, n_clients=3, max_iter=3,
                solver_params={"confidence": 1.0})  # (a fixed scale reads the unit)
    assert fixed.confidence_ == 1.0
    assert not np.allclose(fixed.components_, model.components_, rtol=1e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_fedmavg_default_schedule_does_not_drift_back_up(seed):
    # Constant local steps (Q2 = 5) pull each client's copy towards its own minimizer: the
    # average stalls and the objective climbs back (2% above its minimum here); the paper's
    # diminishing Q2 (the default) ends within 0.5% of the best round.
    X = interactions(seed=seed, n_users=80, n_items=40)
    ends = {}
    for q2 in (None, 5):
        model = fit(FedMAvg, X, n_components=4, n_clients=4, max_iter=40, local_iter_v=q2,
                    solver_params={"confidence": 1.0})
        objectives = np.array([h["objective"] for h in model.history_])
        ends[q2] = objectives[-1] / objectives.min()
    assert ends[None] <= 1.005 < ends[5]


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_uploads_hold_no_client_rows_or_factors(cls):
    X = interactions(seed=4, n_users=30, n_items=60)
    seen = []
    est = FedMGS if cls is FedMGS else FedMAvg
    model = est(loss="implicit", n_components=3, n_clients=3, max_iter=3, random_state=0,
                callback=lambda k, info: seen.append(info["uploads"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        model.fit(X)
    n_items, r = X.shape[1], 3
    for uploads in seen:
        for p, upload in uploads.items():
            rows = np.flatnonzero(model.clients_ == p)
            if cls is FedMAvg:  # the paper's W_p only
                assert set(upload) == {"W"} and upload["W"].shape == (n_items, r)
            else:  # aggregates on the client's items and an r x r Gram
                assert set(upload) == {"items", "G", "gram"}
                np.testing.assert_array_equal(upload["items"], np.unique(X[rows].indices))
                assert upload["G"].shape == (len(upload["items"]), r + r * (r + 1) // 2)
                assert upload["gram"].shape == (r, r)
            for value in upload.values():  # no array of the client's row count
                assert np.ndim(value) == 0 or np.shape(value)[0] != len(rows) or \
                    np.shape(value)[0] in (n_items, r, len(upload.get("items", ())))


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_implicit_model_ranks_held_out_interactions_above_chance(cls):
    X = interactions(seed=5, n_users=60, n_items=40)
    rng = np.random.default_rng(0)
    held = sp.lil_matrix(X.shape)
    train = X.tolil()
    for u in range(X.shape[0]):
        j = rng.choice(X[u].indices)
        held[u, j], train[u, j] = 1.0, 0.0
    train = sp.csr_matrix(train)
    train.eliminate_zeros()
    est = fit(cls, train, n_components=3, n_clients=4, max_iter=10)
    score = est.score(train, held.tocsr())
    # a random list holds the one held-out item of ~30 candidates with probability 1/3
    assert score > 0.5
    # score is the NDCG@10 of the full ranking of the unseen items
    P = est.predict(train)
    P[train.nonzero()] = -np.inf
    lists = np.argsort(-P, axis=1, kind="stable")[:, :10]
    assert score == pytest.approx(ndcg_at_k(held.tocsr(), lists, k=10), rel=1e-12)


def test_predictions_are_unclipped_scores_without_biases():
    X = interactions(seed=6)
    est = fit(FedMGS, X, n_components=3, n_clients=2, max_iter=3)
    assert not hasattr(est, "item_bias_") and est.mean_ == 0.0
    np.testing.assert_allclose(est.predict(X), est.transform(X) @ est.components_,
                               rtol=1e-12)
    assert est._rank() == 3 and FedMGS(loss="implicit")._rank(100_000) == 32


def test_default_implicit_rank_grows_with_the_interactions():
    # 32 at 100,000 interactions, the fifth root of their number, in steps of 8, <= n_items
    ranks = [implicit_rank(32, n, 10_000) for n in (1e4, 1e5, 2.5e5, 1e6, 3.2e6, 1e3)]
    assert ranks == [24, 32, 40, 48, 64, 16] and implicit_rank(32, 1e6, 20) == 20
    # a default fit (FedMAvg and FedMGS: n_components=None) takes the rank of its count
    X = interactions(seed=2, n_users=60, n_items=40)
    for cls in (FedMAvg, FedMGS):
        est = fit(cls, X, n_clients=3, max_iter=1)
        assert est.components_.shape[0] == implicit_rank(32, X.nnz, 40) == 8
        assert fit(cls, X, n_clients=3, max_iter=1, n_components=5).components_.shape[0] == 5


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_bad_input_under_implicit_is_a_clear_error(cls):
    X = interactions(seed=7)
    negative = X.copy()
    negative.data[0] = -1.0
    with pytest.raises(ValueError, match="negative"):
        cls(loss="implicit").fit(negative)
    with pytest.raises(ValueError, match="eval_set"):
        cls(loss="implicit", max_iter=1).fit(X, eval_set=X)
    with pytest.raises(ValueError, match="regularization"):
        cls(loss="implicit", regularization="weighted", max_iter=1).fit(X)
    with pytest.raises(ValueError, match="l1_ratio"):
        cls(loss="implicit", solver_params={"l1_ratio": 0.5}).fit(X)
