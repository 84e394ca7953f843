import numpy as np
import pytest
import scipy.sparse as sp


def low_rank_ratings(m=120, n=40, r=2, density=0.5, test_fraction=0.2, seed=0):
    """Exactly low-rank ratings ``A B / sqrt(r)`` split into train/test CSR matrices."""
    rng = np.random.default_rng(seed)
    M = rng.normal(size=(m, r)) @ rng.normal(size=(r, n)) / np.sqrt(r)
    observed = rng.random((m, n)) < density
    test = observed & (rng.random((m, n)) < test_fraction)
    train = observed & ~test
    X = sp.csr_matrix((M[train], np.nonzero(train)), shape=(m, n))
    Y = sp.csr_matrix((M[test], np.nonzero(test)), shape=(m, n))
    return X, Y, M


@pytest.fixture(autouse=True)
def always_dispatch_to_workers(monkeypatch):
    """Tests use small data: make the engine use its workers anyway when n_jobs > 1."""
    monkeypatch.setattr("sklearn_fedmf._dispatch.MIN_PARALLEL_WORK", 0)


@pytest.fixture
def ratings():
    return low_rank_ratings()
