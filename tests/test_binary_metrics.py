"""Oracles for the Boolean-reconstruction metrics (F1 and RMSD of the Felb paper, Section 4)."""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf.metrics import (
    _binary,
    boolean_counts,
    f1_boolean,
    integrality_gap,
    rmsd,
    rmsd_sum_clients,
)
from sklearn_fedmf.metrics._binary import check_binary


def _dense_reference(X, U, V):
    P = np.minimum(1, U.astype(int) @ V.astype(int))
    tp = int((X * P).sum())
    f1 = 2 * tp / (X.sum() + P.sum()) if X.sum() + P.sum() else 1.0
    return P, f1, np.sqrt(np.mean((X - P) ** 2))


def test_hand_computed_tiny():
    X = np.array([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    U = np.array([[1, 0], [0, 1], [0, 0]], dtype=bool)
    V = np.array([[1, 1, 0], [0, 0, 1]], dtype=bool)
    # reconstruction [[1,1,0],[0,0,1],[0,0,0]]: tp = 3, |X| = 4, |Xhat| = 3, Hamming = 1
    assert boolean_counts(X, (U, V)) == (3, 4, 3)
    assert f1_boolean(X, (U, V)) == pytest.approx(6 / 7)
    assert rmsd(X, (U, V)) == pytest.approx(np.sqrt(1 / 9))
    # gaps .1, .5, .2, 0, .2, .3
    assert integrality_gap([[0.1, 0.5, 0.8, 1.0, -0.2, 1.3]]) == pytest.approx(1.3 / 6)
    assert integrality_gap([[0.1, 0.5, 0.8]], reduce="max") == 0.5


@pytest.mark.parametrize("k", [6, 9, 70])  # one byte of packed bits per factor, two, nine
def test_factor_path_matches_dense_computation(k):
    rng = np.random.default_rng(0)
    X = (rng.random((300, 40)) < 0.2).astype(int)
    U = rng.random((300, k)) < 1.8 / k
    V = rng.random((k, 40)) < 1.5 / k
    P, f1, r = _dense_reference(X, U, V)
    for Xin in (X, sp.csr_matrix(X), sp.coo_matrix(X), sp.csc_matrix(X)):
        assert f1_boolean(Xin, (U, V)) == pytest.approx(f1, abs=1e-15)
        assert rmsd(Xin, (U, V)) == pytest.approx(r, abs=1e-15)
        assert f1_boolean(Xin, P) == pytest.approx(f1, abs=1e-15)
        assert f1_boolean(Xin, sp.csr_matrix(P)) == pytest.approx(f1, abs=1e-15)
    # relaxed factors are read through the threshold 1/2
    assert f1_boolean(X, (U * 0.9, V * 0.6 + 0.2)) == pytest.approx(f1)


@pytest.mark.parametrize("path", ["pairs", "table", "bytes"])
@pytest.mark.parametrize("k", [1, 5, 12])
def test_predicted_ones_every_path_counts_the_product(monkeypatch, path, k):
    # |U o V| by pairs of row and column patterns, by the subset-sum table over all 2^k
    # patterns, and by the chunked products of the byte-packed patterns: the exact count of
    # nonzeros of U V, whichever the path.
    monkeypatch.setattr(_binary, "_MAX_TABLE_BITS", 64 if path == "table" else -1)
    monkeypatch.setattr(_binary, "_MAX_CODE_BITS", 0 if path == "bytes" else 63)
    if path == "table":  # the table however few patterns there are
        monkeypatch.setattr(_binary, "_table_cost", lambda k: 0)
    rng = np.random.default_rng(k)
    U = rng.random((500, k)) < 0.3
    V = rng.random((k, 70)) < 0.2
    expected = np.count_nonzero(U.astype(int) @ V.astype(int))
    assert _binary._predicted_ones(U, V) == expected
    assert _binary._predicted_ones(U[:0], V) == 0
    assert _binary._predicted_ones(np.zeros((4, k), bool), V) == 0
    assert _binary._predicted_ones(np.ones((4, k), bool), V) == 4 * np.count_nonzero(V.any(0))


def test_empty_reconstruction_and_client_sum():
    rng = np.random.default_rng(1)
    X = sp.random(400, 50, density=0.05, random_state=2, format="csr")
    X.data[:] = 1
    density = X.nnz / (400 * 50)
    empty = (np.zeros((400, 3), bool), np.zeros((3, 50), bool))
    assert f1_boolean(X, empty) == 0.0
    assert rmsd(X, empty) == pytest.approx(np.sqrt(density))
    clients = rng.permutation(np.repeat(np.arange(8), 50))
    # the scale of the paper's Table 3: about C * sqrt(density) for equal-sized clients
    # (Jensen: a bit below)
    total = rmsd_sum_clients(X, empty, clients)
    assert 0.97 * 8 * np.sqrt(density) <= total <= 8 * np.sqrt(density) + 1e-12
    assert f1_boolean(np.zeros((2, 2)), np.zeros((2, 2))) == 1.0


def test_binary_validation():
    with pytest.raises(ValueError, match="binary"):
        check_binary([[0, 2]])
    with pytest.raises(ValueError, match="binary"):
        check_binary(np.array([[0, np.nan]]))
    with pytest.raises(ValueError, match="binary"):
        check_binary(sp.csr_matrix(np.array([[0.0, 0.5]])))
    # explicit zeros are allowed and eliminated
    X = sp.csr_matrix((np.array([1.0, 0.0]), (np.array([0, 1]), np.array([0, 1]))), shape=(2, 2))
    assert check_binary(X).nnz == 1
    with pytest.raises(ValueError, match="shape"):
        f1_boolean(np.eye(3), np.eye(2))
