"""``FederatedClustering(secure_aggregation=True)`` (issue 28): the uploads that are sums
(FedMGS's aggregates in running sums, FedMAvg's copies as a ratio of two sums, the starts'
costs) give the plain fit's model within the encoding's bound; the server's callback sees
only masked vectors; what is not a sum is refused with its reason."""

import warnings

import numpy as np
import pytest

from sklearn_fedmf import FederatedClustering
from sklearn_fedmf.secure._protocol import MaskedInput

BOUND = 1e-6  # max relative difference of the fitted factors (issue 28, point 5)


def blobs(n=240, seed=0):
    """Three nonnegative clusters in 5 dimensions."""
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.0, 10.0, size=(3, 5))
    labels = rng.integers(3, size=n)
    return np.abs(centers[labels] + rng.normal(scale=0.5, size=(n, 5))), labels


SETTINGS = {
    "fedmgs": dict(algorithm="fedmgs"),
    "fedmavg-local": dict(algorithm="fedmavg", solver_params={"w_step": "local"}),
    "kmeans": dict(algorithm="fedmavg", solver_params={"w_step": "local",
                                                       "h_constraint": "onehot"}),
    "fedpalm": dict(algorithm="fedmavg", solver_params={"variant": "fedpalm",
                                                        "w_step": "local"}),
}


def fit(secure, callback=None, **params):
    X, _ = blobs()
    params = dict(n_clusters=3, n_clients=5, clients_per_round=3, max_iter=15, init="random",
                  n_init=2, random_state=0, callback=callback, **params)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (max_iter of a small test)
        return FederatedClustering(**params, secure_aggregation=secure).fit(X)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_secure_clustering_equals_the_plain_fit(name):
    plain, secure = fit(False, **SETTINGS[name]), fit(True, **SETTINGS[name])
    scale = np.abs(plain.cluster_centers_).max()
    assert np.abs(plain.cluster_centers_ - secure.cluster_centers_).max() / scale < BOUND
    np.testing.assert_array_equal(plain.labels_, secure.labels_)
    assert plain.n_iter_ == secure.n_iter_
    assert all("bytes_secure" in r for r in secure.history_)
    # every phase is counted: more bytes than the plain rounds' uploads
    assert sum(r["bytes_uploaded"] for r in secure.history_) > sum(
        r["bytes_uploaded"] for r in plain.history_)


@pytest.mark.parametrize("name", ["fedmgs", "fedmavg-local"])
def test_the_callback_sees_only_masked_vectors(name):
    seen = []
    fit(True, callback=lambda k, info: seen.append(info["uploads"]), **SETTINGS[name])
    assert len(seen) == 2 * 15  # (two starts)
    for uploads in seen:
        assert len(uploads) == 3
        assert all(isinstance(m, MaskedInput) and m.vector.dtype == np.uint64
                   for m in uploads.values())


@pytest.mark.parametrize("params, match", [
    (dict(init="k-fed"), "k-fed.*local centres"),
    (dict(init="random", algorithm="fedmavg"), 'w_step="local"'),  # the global step's Grams
    (dict(init="random", algorithm="fedmavg", solver_params={"w_step": "guarded"}),
     'w_step="local"'),
])
def test_what_is_not_a_sum_is_refused(params, match):
    X, _ = blobs(60)
    with pytest.raises(ValueError, match=match):
        FederatedClustering(n_clusters=3, n_clients=4, secure_aggregation=True,
                            **params).fit(X)
