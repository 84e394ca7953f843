"""FedPALM, Remark 1 of Wang & Chang ((15)-(16)), the baseline of its Fig. 2b."""

import numpy as np
import pytest

from sklearn_fedmf import FederatedClustering, FedMAvg

from .conftest import low_rank_ratings


def test_fedpalm_with_q_2_is_fedmavg_with_one_step_each():
    """Q = 2: one U step at V^s, one W step at the new U_p: FedMAvg with Q1 = Q2 = 1 and its
    local step, round after round (nothing is projected in the unconstrained problem)."""
    X, _, _ = low_rank_ratings(m=60, n=20, seed=4)
    common = dict(n_components=2, n_clients=3, clients_per_round=2, max_iter=8, random_state=0,
                  local_iter_u=1, biased=False)
    palm = FedMAvg(**common, solver_params={"variant": "fedpalm"}).fit(X)
    mavg = FedMAvg(local_iter_v=1, **common, solver_params={"w_step": "local"}).fit(X)
    np.testing.assert_allclose(palm.components_, mavg.components_, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(palm.user_factors_, mavg.user_factors_, rtol=1e-12, atol=1e-12)
    longer = FedMAvg(**{**common, "local_iter_u": 3}, solver_params={"variant": "fedpalm"}).fit(X)
    assert not np.allclose(longer.components_, palm.components_)


def test_fedpalm_q_2_clustering_round_by_hand():
    """One round, every client: one projected H step at W^1 and one projected W step per
    client, then the N_p-weighted mean projected on [min X, max X] (Algorithm 1, Remark 1)."""
    rng = np.random.default_rng(0)
    X = rng.random((30, 4)) * 2.0
    clients = np.repeat([0, 1, 2], 10)
    W0 = np.array([[1.5, 0.2, 0.1, 0.3], [0.1, 1.8, 1.9, 0.2]])  # (K, M) centers
    model = FederatedClustering(n_clusters=2, algorithm="fedmavg", local_iter_u=1, init=W0,
                                max_iter=1, tol=0.0, random_state=0,
                                solver_params={"variant": "fedpalm", "sncp": False,
                                               "rho0": 1e-3, "nu": 1e-4}).fit(X, clients=clients)

    N, K = X.shape[0], 2
    scale = (X * X).sum() / N
    rho, nu = 1e-3 * scale, 1e-4 * scale
    lo, hi = X.min(), X.max()
    W = np.clip(W0.T, lo, hi)  # W^1 = P(W^0), (M, K)
    uploads, A_all = [], np.zeros((N, K))
    for p in range(3):
        Xp = X[clients == p]
        # start: each sample's best single cluster and scale (init from centers)
        gains = np.maximum(Xp @ W, 0) ** 2 / (W * W).sum(0)
        k = gains.argmax(1)
        A = np.zeros((len(Xp), K))
        A[np.arange(len(Xp)), k] = np.maximum(Xp @ W, 0)[np.arange(len(Xp)), k] / (W * W).sum(
            0)[k]
        Hc = (2 / N) * W.T @ W + rho * np.ones((K, K)) + (nu - rho) * np.eye(K)
        A = np.maximum(A - (A @ Hc - (2 / N) * Xp @ W) / (0.51 * np.linalg.norm(Hc, 2)), 0)
        n_p = len(Xp)
        d = 5.0 * (2 / n_p) * np.linalg.norm(A.T @ A, 2)
        Wp = np.clip(W - (W @ ((2 / n_p) * A.T @ A) - (2 / n_p) * Xp.T @ A) / d, lo, hi)
        uploads.append(Wp)
        A_all[clients == p] = A
    expected = np.clip(sum(10 / N * Wp for Wp in uploads), lo, hi)
    np.testing.assert_allclose(model.cluster_centers_, expected.T, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.sample_factors_, A_all, rtol=1e-10, atol=1e-12)


@pytest.mark.filterwarnings("ignore::sklearn_fedmf.exceptions.ConvergenceWarning")
def test_fedpalm_uploads_only_the_local_centers():
    X = np.abs(np.random.default_rng(1).normal(size=(40, 5)))

    def only_w(round_, info):
        for upload in info["uploads"].values():
            assert set(upload) == {"W"} and upload["W"].shape == (5, 3)

    FederatedClustering(n_clusters=3, algorithm="fedmavg", solver_params={"variant": "fedpalm"},
                        n_clients=4,
                        clients_per_round=2, max_iter=5, callback=only_w,
                        random_state=0).fit(X)


@pytest.mark.parametrize("algorithm, solver", [("fedmgs", {}),
                                               ("fedmavg", {"h_constraint": "onehot"})])
def test_fedpalm_needs_fedmavg_with_nonnegative_memberships(algorithm, solver):
    X = np.abs(np.random.default_rng(1).normal(size=(20, 3)))
    with pytest.raises(ValueError, match="fedpalm"):
        FederatedClustering(n_clusters=2, algorithm=algorithm,
                            solver_params={"variant": "fedpalm", **solver}).fit(X)


def test_fedpalm_refuses_a_global_w_step():
    X, _, _ = low_rank_ratings(m=20, n=10)
    with pytest.raises(ValueError, match="its own local step"):
        FedMAvg(biased=False, solver_params={"variant": "fedpalm", "w_step": "global"}).fit(X)
