"""The Felb paper's cover-based baselines Asso, GreConD and MEBF, centralized and as local
solvers of AggregatedBMF (the Felb paper's Appendix D settings); scikit-learn's estimator checks
run on them in test_common.py."""

import numpy as np
import pytest

from sklearn_fedmf.binary import MEBF, AggregatedBMF, Asso, GreConD
from sklearn_fedmf.datasets import make_binary_tiles
from sklearn_fedmf.metrics import f1_boolean

BASELINES = [Asso, GreConD, MEBF]


def planted(overlap, seed=0):
    return make_binary_tiles(400, 100, 5, noise=0.0, tile_density=1.0, overlap=overlap,
                             random_state=seed)


def counts(X, U, V):
    A = X.toarray() > 0
    P = (U.astype(int) @ V.astype(int)) > 0
    return int((P & A).sum()), int((P & ~A).sum())  # covered ones, over-covered zeros


@pytest.mark.parametrize("cls", BASELINES)
@pytest.mark.parametrize("overlap", [False, True])
def test_boolean_factors_and_f1_on_noise_free_tiles(cls, overlap):
    data = planted(overlap)
    model = cls(n_components=5).fit(data.X)
    U, V = model.user_factors_, model.components_
    assert U.dtype == bool and V.dtype == bool
    assert U.shape == (400, 5) and V.shape == (5, 100)
    assert f1_boolean(data.X, (U, V)) >= 0.9
    assert model.score(data.X) >= 0.9


def test_grecond_covers_from_below():
    """Every component is a formal concept (an all-ones rectangle of X): no zero is ever
    covered, even on noisy data; on noise-free tiles the cover is exact."""
    noisy = make_binary_tiles(300, 60, 4, noise=0.1, random_state=1)
    model = GreConD(n_components=8).fit(noisy.X)
    ones, zeros = counts(noisy.X, model.user_factors_, model.components_)
    assert zeros == 0 and ones > 0.15 * noisy.X.nnz
    assert not (model.predict(noisy.X) & ~(noisy.X.toarray() > 0)).any()  # fold-in too
    for U_l, V_l in zip(model.user_factors_.T, model.components_):  # concepts are closed
        rows = noisy.X.toarray()[U_l] > 0
        np.testing.assert_array_equal(rows.all(axis=0), V_l)
    exact = planted(True)
    fit = GreConD(n_components=5).fit(exact.X)
    assert counts(exact.X, fit.user_factors_, fit.components_) == (exact.X.nnz, 0)


def test_asso_trades_cover_for_over_cover():
    """A lower over-cover penalty buys more covered ones with more covered zeros."""
    noisy = make_binary_tiles(300, 60, 4, noise=0.05, tile_density=0.85, random_state=2)
    results = [counts(noisy.X, *(lambda m: (m.user_factors_, m.components_))(
        Asso(n_components=4, threshold=0.7, loss=loss).fit(noisy.X)))
        for loss in (0.25, 1.0, 4.0)]
    ones, zeros = np.array(results).T
    assert np.all(np.diff(ones) <= 0) and np.all(np.diff(zeros) <= 0)
    assert ones[0] > ones[-1] and zeros[0] > 2 * max(zeros[-1], 1)


def test_asso_with_the_paper_threshold_keeps_only_exact_implications():
    """threshold = 1 (Appendix D): a candidate holds column j iff every row with column i
    has j, so on noise-free disjoint tiles the candidates are the tiles' column sets."""
    data = planted(False)
    model = Asso(n_components=5).fit(data.X)
    assert sorted(map(tuple, model.components_)) == sorted(map(tuple, data.V))


@pytest.mark.parametrize("solver", ["asso", "grecond", "mebf"])
def test_cover_solvers_as_local_solvers_of_aggregated_bmf(solver):
    """Noise-free disjoint tiles of different sizes: every client finds the same tiles in the
    same (greedy, largest first) order, so the majority vote keeps them."""
    rng = np.random.default_rng(0)
    X = np.zeros((240, 60), dtype=int)
    for rows, cols in ((slice(0, 120), slice(0, 30)), (slice(120, 200), slice(30, 45)),
                       (slice(200, 240), slice(45, 52))):
        X[rows, cols] = 1
    X = X[rng.permutation(240)]
    uploads = []
    model = AggregatedBMF(n_components=3, n_clients=4, solver=solver, random_state=0,
                          callback=lambda k, info: uploads.extend(info["uploads"].values()))
    model.fit(X)
    assert model.components_.dtype == bool and model.user_factors_.dtype == bool
    assert all(u.dtype == bool and u.shape == (3, 60) for u in uploads) and len(uploads) == 4
    assert f1_boolean(X, (model.user_factors_, model.components_)) >= 0.9
    assert model.score(X) >= 0.9


def test_solver_params_reach_the_cover_solver_and_are_refused_by_elbmf():
    data = make_binary_tiles(400, 100, 5, noise=0.05, random_state=0)
    strict = AggregatedBMF(n_components=5, n_clients=2, solver="asso", random_state=0)
    loose = AggregatedBMF(n_components=5, n_clients=2, solver="asso", random_state=0,
                          solver_params={"threshold": 0.05, "loss": 0.0})
    assert not np.array_equal(strict.fit(data.X).components_, loose.fit(data.X).components_)
    with pytest.raises(ValueError, match="solver_params"):
        AggregatedBMF(n_components=2, solver_params={"threshold": 0.5}).fit(data.X)
