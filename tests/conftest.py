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


def rated_ratings(n=30, m=12, seed=0):
    """Rank-2 ratings around 3, about half observed, every row rated at least once (CSR)."""
    rng = np.random.default_rng(seed)
    R = rng.normal(size=(n, 2)) @ rng.normal(size=(2, m)) + 3.0
    mask = rng.random((n, m)) < 0.5
    mask[np.arange(n), np.arange(n) % m] = True
    return sp.csr_matrix((R[mask], np.nonzero(mask)), shape=R.shape)

@pytest.fixture(autouse=True)
def always_dispatch_to_workers(monkeypatch):
    """Tests use small data: make the engine use its workers anyway when n_jobs > 1, and
    split grouped clients into as many groups as they allow (tests/test_groups.py tests the
    rule that sizes them by the data)."""
    monkeypatch.setattr("sklearn_fedmf.engine._dispatch.MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_RATINGS", 1)


@pytest.fixture
def ratings():
    return low_rank_ratings()


def routed(cls):
    """``cls`` taking its ``solver_params`` keys flat, as ``fedmf --set`` does
    (:func:`~sklearn_fedmf.engine._fit.route_solver_params`): the oracle tests state their cases as
    one dict of settings."""
    from sklearn_fedmf.engine._fit import route_solver_params

    def make(*args, **params):
        return cls(*args, **route_solver_params(cls, params))

    make.__name__ = cls.__name__
    return make


def paper(cls):
    """``cls`` with the papers' settings (``PAPER_SETTINGS``; any explicit parameter wins): the
    spec's oracles (closed forms, the papers' step rules at lambda = 1e-6, no biases) are
    stated for them, while the defaults are measured ones (``test_biases.py``,
    ``benchmarks/bench_defaults.py``). RFRec keeps its default step ("auto"). A test states
    its case flat: a key of the class's ``solver_params`` goes there (``routed``)."""
    from sklearn_fedmf.completion import PAPER_SETTINGS
    from sklearn_fedmf.engine._fit import merge_params

    settings = {k: v for k, v in PAPER_SETTINGS[cls.__name__].items() if k != "learning_rate"}
    make_routed = routed(cls)

    def make(*args, **params):
        return make_routed(*args, **merge_params(settings, params))

    make.__name__ = cls.__name__
    return make


def cached_aggregates(segments, client, n_items):
    """Client ``client``'s aggregates in the FedMGS server's cache (the segments of
    ``completion._fedmgs_protocol``) as the dense ``n_items x (r + r^2)`` matrix of rows
    ``[G2_j, vec(G1_j)]`` (zero on the items it did not rate)."""
    seg = segments[max(i for i, s in enumerate(segments) if s["lo"] <= client)]
    i = client - seg["lo"]
    a, b = seg["ptr"][i], seg["ptr"][i + 1]
    if seg["kind"] == "rows":
        G = seg["G"][a:b]
    else:  # a one-user client's compact form: G1_j = a a^T and G2_j = x_j a
        vec = seg["a"][i]
        G = np.hstack([np.multiply.outer(seg["x"][a:b], vec),
                       np.tile(np.multiply.outer(vec, vec).ravel(), (b - a, 1))])
    out = np.zeros((n_items, G.shape[1]))
    out[seg["items"][a:b]] = G
    return out
