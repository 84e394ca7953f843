"""The federation's state out of memory during the biases floor (``engine._page_out``):
the memory is given back, the same bytes come back, the fit is the same bit for bit."""

import sys

import numpy as np
import pytest
from numpy.testing import assert_array_equal

import sklearn_fedmf
from sklearn_fedmf.engine import _page_out
from sklearn_fedmf.engine._page_out import paged_out

from .test_validation import SEED, ratings

linux = pytest.mark.skipif(not sys.platform.startswith("linux"),
                           reason="madvise(MADV_DONTNEED) pages out on Linux only")


@linux
def test_paged_out_arrays_read_zero_inside_and_come_back_exact(monkeypatch):
    monkeypatch.setattr(_page_out, "_ARRAY_MIN", 0)
    rng = np.random.default_rng(0)
    big = rng.normal(size=(300, 1000))  # (2.4 MB: whole pages inside)
    view = big[10:20]  # (a view: its owner is paged out once)
    ints = rng.integers(0, 10**9, size=400_000)
    ints.flags.writeable = False  # (a read-only array's pages go out too)
    kept = rng.normal(size=500_000)
    state = ({"V": big, "view": view}, [ints, kept])
    reference = [a.copy() for a in (big, ints, kept)]
    with paged_out(state, keep={"mine": kept}, min_bytes=0) as released:
        # the whole pages inside each buffer are released: they read as zeros now
        assert released >= big.nbytes + ints.nbytes - 4 * 4096
        assert np.count_nonzero(big) < 2 * 4096 and np.count_nonzero(ints) < 2 * 4096
        assert_array_equal(kept, reference[2])  # (what the body reads stays)
    for a, b in zip((big, ints, kept), reference):
        assert_array_equal(a, b)
    assert_array_equal(view, reference[0][10:20])


def test_small_states_stay_in_memory():
    a = np.arange(1000.0)
    with paged_out({"a": a}) as released:  # (below PAGE_OUT_MIN_BYTES)
        assert released == 0
        assert a[500] == 500.0


def _fitted(model):
    return {k: np.asarray(v) for k, v in vars(model).items()
            if k.endswith("_") and not k.startswith("_")
            and isinstance(v, (np.ndarray, float, int))}


@linux
@pytest.mark.parametrize("name", ["FedMCADMM", "RFRec"])
def test_a_fit_with_its_state_paged_out_during_the_floor_is_the_same(name, monkeypatch):
    """One client per user (grouped), early stopping on, the floor fitted: with every state
    array paged out during the floor (checked: memory was released), the fitted
    attributes and the history are the in-memory fit's, bit for bit."""
    import sklearn_fedmf.completion._base as base

    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    X = ratings(n_users=120, n_items=60)
    clients = np.arange(X.shape[0])

    def fit():
        return getattr(sklearn_fedmf, name)(
            n_components=3, max_iter=12, early_stopping=True, validation_fraction=0.2,
            clients_per_round=0.3, random_state=SEED).fit(X, clients=clients)

    reference = fit()
    released = []

    def recorded(*args, **kwargs):
        kwargs["min_bytes"] = 0
        with paged_out(*args, **kwargs) as n:
            released.append(n)
            yield n

    from contextlib import contextmanager

    monkeypatch.setattr(_page_out, "_ARRAY_MIN", 0)
    monkeypatch.setattr(base, "paged_out", contextmanager(recorded))
    model = fit()
    assert released and released[0] > 0
    def timeless(history):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in history]

    assert timeless(model.history_) == timeless(reference.history_)
    ref, out = _fitted(reference), _fitted(model)
    assert out.keys() == ref.keys()
    for key in ref:
        assert_array_equal(out[key], ref[key], err_msg=key)


def test_the_floors_stacked_ratings_are_the_triplets_canonical_matrix():
    """``_validation._stacked`` (the floor on every rating's input, made without COO
    triplets) is the canonical matrix of both parts' entries, explicit zeros kept."""
    import scipy.sparse as sp

    from sklearn_fedmf.completion._validation import _stacked
    from sklearn_fedmf.engine._client_data import check_ratings

    rng = np.random.default_rng(0)
    M = sp.random(50, 30, density=0.4, random_state=1, format="csr")
    M.data = np.round(rng.normal(size=M.nnz), 1)  # (some entries exactly 0)
    held = rng.random(M.nnz) < 0.3
    A, B = (sp.csr_matrix((M.data[m], M.indices[m], np.concatenate(
        [[0], np.cumsum(np.add.reduceat(m.astype(int), M.indptr[:-1])
                        * (np.diff(M.indptr) > 0))])), shape=M.shape) for m in (~held, held))
    assert A.nnz + B.nnz == M.nnz and (M.data == 0).any()
    parts = [A.tocoo(), B.tocoo()]
    reference = check_ratings(sp.csr_matrix(
        (np.concatenate([p.data for p in parts]),
         (np.concatenate([p.row for p in parts]), np.concatenate([p.col for p in parts]))),
        shape=M.shape))
    got = _stacked(A, B)
    assert got.has_canonical_format
    for name in ("data", "indices", "indptr"):
        assert_array_equal(getattr(got, name), getattr(reference, name), err_msg=name)
