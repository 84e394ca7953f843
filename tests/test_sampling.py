"""Client sampling with replacement, proportional to omega (Wang & Chang, Algorithm 1)."""

import numpy as np
import pytest
from joblib import parallel_config

from sklearn_fedmf import FederatedClustering, FedMAvg, FedMGS
from sklearn_fedmf.cluster._federated_clustering_protocol import mavg_server_update
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.completion._fedmavg._fedmavg_protocol import server_update
from sklearn_fedmf.engine._federation import nbytes, sample_clients
from sklearn_fedmf.engine._fit import merge_params

from .conftest import low_rank_ratings


def skewed_ratings():
    """Ratings whose clients (contiguous rows) hold very different numbers of entries."""
    X, _, _ = low_rank_ratings(m=80, n=30, density=0.6, seed=3)
    X = X.tolil()
    for row in range(20):  # the first client keeps one rating per row
        X.rows[row], X.data[row] = X.rows[row][:1], X.data[row][:1]
    return X.tocsr()


def test_draws_are_iid_with_probabilities_omega():
    omega = np.array([1.0, 2.0, 3.0, 10.0, 4.0])
    rng = np.random.default_rng(0)
    n_rounds, m = 4000, 3
    draws = np.zeros(len(omega))
    for _ in range(n_rounds):
        clients, counts = sample_clients(rng, len(omega), m, "weighted", omega)
        assert np.all(np.diff(clients) > 0) and counts.sum() == m
        draws[clients] += counts
    p = omega / omega.sum()
    n = n_rounds * m
    # each client's draw count is Binomial(n, p_i): within 4 standard deviations
    assert np.all(np.abs(draws - n * p) <= 4 * np.sqrt(n * p * (1 - p)))


def test_uniform_draws_are_distinct_and_unchanged():
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    clients, counts = sample_clients(rng_a, 10, 4)
    np.testing.assert_array_equal(clients, np.sort(rng_b.choice(10, size=4, replace=False)))
    np.testing.assert_array_equal(counts, 1)


def test_fedmavg_draws_follow_omega_of_the_entries():
    X = skewed_ratings()
    clients = np.repeat(np.arange(4), 20)
    draws = np.zeros(4)

    def count(round_, info):
        draws[info["sampled"]] += info["counts"]

    FedMAvg(
        n_components=2, clients_per_round=3, max_iter=150, callback=count, random_state=0,
        solver_params={"sampling": "weighted", "eval_every": 0},
    ).fit(X, clients=clients)
    sizes = np.array([X[clients == p].nnz for p in range(4)], dtype=float)
    p, n = sizes / sizes.sum(), draws.sum()
    assert n == 450
    assert np.all(np.abs(draws - n * p) <= 4 * np.sqrt(n * p * (1 - p)))


def test_averaged_update_with_duplicates_is_the_mean_over_the_multiset():
    """Eqs. (9)-(10) on a hand-computed case: A = (0, 0, 2), W = (2 W_0 + W_2) / 3."""
    W0, W2 = np.array([[3.0, 0.0], [0.0, 3.0]]), np.array([[0.0, 6.0], [-3.0, 0.0]])
    state = {"Vt": np.zeros((2, 2)), "weights": np.array([0.5, 0.3, 0.2]), "total": 10.0}
    _, broadcast = server_update(state, {0: {"W": W0}, 2: {"W": W2}}, 0, {0: 2, 2: 1},
                                 aggregation="sampled_mean", local_iter_v=1, q_hat=5)
    np.testing.assert_allclose(broadcast["Vt"], [[2.0, 2.0], [-1.0, 2.0]])
    # the clustering server projects the same mean on the box [min X, max X]
    _, broadcast = mavg_server_update({"W": None, "rho": 0.0}, {0: {"W": W0}, 2: {"W": W2}},
                                      0, {0: 2, 2: 1}, weights=None,
                                      aggregation="sampled_mean", local_iter_v=1, q_hat=5,
                                      box=(0.0, 1.5))
    np.testing.assert_allclose(broadcast["W"], [[1.5, 1.5], [0.0, 1.5]])


def test_every_round_is_the_multiset_mean_and_bytes_count_both_ways():
    X = skewed_ratings()
    seen = []

    def check(round_, info):
        counts = dict(zip(info["sampled"].tolist(), info["counts"].tolist()))
        assert set(info["uploads"]) == set(counts)  # one upload per distinct client
        m = sum(counts.values())
        mean = sum(counts[p] * u["W"] for p, u in info["uploads"].items()) / m
        np.testing.assert_allclose(info["broadcast"]["Vt"], mean, rtol=1e-12, atol=1e-14)
        record, size = info["record"], nbytes(next(iter(info["uploads"].values())))
        if round_ > 1:  # round 1 also carries the initial exchange
            assert record["bytes_uploaded"] == len(counts) * size
        assert record["bytes_uploaded_draws"] - record["bytes_uploaded"] == (m - len(counts)) * size
        assert record["n_distinct"] == len(counts) and record["n_sampled"] == m
        seen.append(m - len(counts))

    FedMAvg(
        n_components=2, clients_per_round=4, max_iter=40, n_clients=4, callback=check,
        random_state=0, solver_params={"sampling": "weighted", "w_step": "local"},
    ).fit(X)
    assert sum(seen) > 0  # some round drew a client twice


def test_weighted_sampling_gives_the_same_model_for_any_n_jobs():
    X = skewed_ratings()
    params = dict(n_components=2, clients_per_round=3, max_iter=20, random_state=0,
                  solver_params={"sampling": "weighted"})
    ref = FedMAvg(**params, n_jobs=1).fit(X)
    with parallel_config(backend="threading"):
        par = FedMAvg(**params, n_jobs=2).fit(X)
    np.testing.assert_array_equal(ref.components_, par.components_)
    np.testing.assert_array_equal(ref.user_factors_, par.user_factors_)


def test_weighted_sampling_fits_and_fedmgs_applies_each_client_once():
    X, Y, _ = low_rank_ratings(m=120, n=40, seed=2)

    def one_upload_per_client(round_, info):
        assert len(info["uploads"]) == len(info["sampled"])

    for cls in (FedMAvg, FedMGS):
        model = cls(**merge_params(PAPER_SETTINGS[cls.__name__], dict(
            n_components=2, n_clients=6, clients_per_round=4, max_iter=300,
            callback=one_upload_per_client, random_state=0,
            solver_params={"sampling": "weighted", "center": False}))).fit(X, eval_set=Y)
        assert model.history_[-1]["eval_rmse"] < 0.1  # predicting 0 gives about 1


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.ConvergenceWarning")
def test_weighted_sampling_clusters_blobs():
    rng = np.random.default_rng(0)
    centers = np.array([[5.0, 0.2, 0.2], [0.2, 5.0, 0.2], [0.2, 0.2, 5.0]])
    y = rng.integers(3, size=150)
    X = np.abs(centers[y] + 0.3 * rng.normal(size=(150, 3)))
    model = FederatedClustering(n_clusters=3, algorithm="fedmavg", n_clients=6,
                                clients_per_round=3, solver_params={"sampling": "weighted"},
                                max_iter=200,
                                random_state=0).fit(X)
    agreement = max(np.mean(model.labels_[y == k] == np.bincount(model.labels_[y == k]).argmax())
                    for k in range(3))
    assert agreement > 0.95


@pytest.mark.parametrize("cls", [FedMAvg, FederatedClustering])
def test_omega_weighted_mean_of_omega_draws_is_refused(cls):
    X = np.abs(low_rank_ratings(m=40, n=10, density=1.0)[2])
    params = dict(sampling="weighted", aggregation="weighted")
    if cls is FederatedClustering:
        params = dict(algorithm="fedmavg", solver_params=params)
    else:
        params = dict(solver_params=params)
    with pytest.raises(ValueError, match="omega twice"):
        cls(**params).fit(X)
