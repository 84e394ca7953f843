"""The contract every estimator of the package shares.

scikit-learn's estimator checks run here, once, over all estimators; then the input
contract of the fit skeleton: the caller's arrays are never modified, read-only arrays are
accepted, and each of the package's warnings is raised at most once per fit.
"""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.estimator_checks import parametrize_with_checks

from sklearn_fedmf import (
    AggregatedBMF,
    FedBaseline,
    FedBlend,
    FederatedClustering,
    FedMAvg,
    FedMCADMM,
    FedMGS,
    Felb,
    RFRec,
)
from sklearn_fedmf.binary import MEBF, Asso, GreConD
from sklearn_fedmf.engine._fit import objective_not_decreasing
from sklearn_fedmf.exceptions import ConvergenceWarning as FedMFConvergenceWarning
from sklearn_fedmf.exceptions import DataWarning, DegenerateFitWarning, FedMFWarning

from .conftest import low_rank_ratings

PREDICT_IS_A_MATRIX = (
    "predict returns the (n_rows, n_items) matrix of predicted ratings (the Boolean "
    "reconstruction for Felb and AggregatedBMF), not one value per row"
)
# one configuration of each estimator class: the README's fast `python -m pytest`
CHECKED = [
    FedBaseline(n_clients=2, random_state=0),
    FedBlend([("biases", FedBaseline(max_iter=5)), ("mgs", FedMGS(n_components=1, max_iter=20))],
             n_clients=2, random_state=0),
    FedMCADMM(n_components=1, n_clients=2, max_iter=20, random_state=0),
    FedMAvg(n_components=1, n_clients=2, max_iter=20, random_state=0),
    FedMGS(n_components=1, n_clients=2, max_iter=20, random_state=0),
    RFRec(n_components=1, learning_rate=0.01, max_iter=20, random_state=0),
    # binarize=0.0 maps the checks' real-valued data to 0/1; the default rejects it
    Felb(n_components=2, n_clients=2, max_iter=3, sync_every=2, binarize=0.0, random_state=0),
    AggregatedBMF(n_components=2, n_clients=2, local_iter=5, binarize=0.0, random_state=0),
    Asso(n_components=2, binarize=0.0),
    GreConD(n_components=2, binarize=0.0),
    MEBF(n_components=2, binarize=0.0),
    FederatedClustering(n_clusters=3, n_clients=2, max_iter=20, random_state=0),
]
# the variants' configurations (other solver, update rule, constraint): `pytest -m slow`
VARIANTS = [
    RFRec(
        n_components=1, biased=False, learning_rate=0.05, n_clients=2, max_iter=20, random_state=0,
        solver_params={"variant": "rfrecf", "optimizer": "adam", "link": "sigmoid"},
    ),
    Felb(n_components=2, n_clients=2, max_iter=3, sync_every=2, binarize=0.0,
         solver_params={"update": "mu"}, random_state=0),
    FederatedClustering(n_clusters=3, n_clients=2, max_iter=20,
                        solver_params={"h_constraint": "onehot"}, algorithm="fedmavg",
                        random_state=0),
]


def expected_failed_checks(estimator):
    if isinstance(estimator, FederatedClustering):
        return {}  # (check_clustering passes since the k-FED seeding)
    return {
        "check_estimator_sparse_matrix": PREDICT_IS_A_MATRIX,
        "check_estimator_sparse_array": PREDICT_IS_A_MATRIX,
    }


@parametrize_with_checks(CHECKED, expected_failed_checks=expected_failed_checks)
def test_sklearn_compatible(estimator, check):
    with warnings.catch_warnings():
        # The checks' random data leave item columns unrated, have negative entries for the
        # clustering model and are fitted for a few rounds: the package's own warnings say
        # so, which is beside the scikit-learn contract checked here.
        warnings.simplefilter("ignore", FedMFWarning)
        check(estimator)


@pytest.mark.slow
@parametrize_with_checks(VARIANTS, expected_failed_checks=expected_failed_checks)
def test_sklearn_compatible_variants(estimator, check):
    test_sklearn_compatible(estimator, check)


# ---- inputs: never modified, read-only accepted ----------------------------------------------
def _unsorted_csr(dense_mask, values):
    """A CSR matrix of ``values`` at ``dense_mask`` whose column indices run backwards in
    every row (valid, but not sorted: what scipy's ``X.min()`` would sort in place)."""
    rows, cols = np.nonzero(dense_mask)
    order = np.lexsort((-cols, rows))
    rows, cols = rows[order], cols[order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=dense_mask.shape[0]))])
    X = sp.csr_matrix((values[rows, cols], cols, indptr), shape=dense_mask.shape)
    assert not X.has_sorted_indices
    return X


def _data(kind):
    """A dense matrix and a CSR matrix of the kind of data the estimator fits."""
    rng = np.random.default_rng(0)
    values = rng.random((30, 12)) * 4 + 1
    if kind == "ratings":
        mask = rng.random(values.shape) < 0.6
        return np.where(mask, values, np.nan), _unsorted_csr(mask, values)
    if kind == "binary":
        mask = rng.random(values.shape) < 0.4
        return mask.astype(float), _unsorted_csr(mask, np.ones_like(values))
    mask = rng.random(values.shape) < 0.7  # clustering: nonnegative samples
    return np.where(mask, values, 0.0), _unsorted_csr(mask, values)


FITTED = [
    ("ratings", FedBaseline(n_clients=3, max_iter=3, random_state=0)),
    ("ratings", FedMCADMM(n_components=2, n_clients=3, max_iter=3, random_state=0)),
    ("ratings", FedMAvg(n_components=2, n_clients=3, max_iter=3, random_state=0)),
    ("ratings", FedMGS(n_components=2, n_clients=3, max_iter=3, random_state=0)),
    ("ratings", RFRec(n_components=2, max_iter=3, random_state=0)),
    ("binary", Felb(n_components=2, n_clients=3, max_iter=2, sync_every=2, random_state=0)),
    ("binary", AggregatedBMF(n_components=2, n_clients=3, local_iter=5, random_state=0)),
    ("samples", FederatedClustering(n_clusters=2, n_clients=3, max_iter=3, random_state=0)),
]
IDS = [type(est).__name__ for _, est in FITTED]


def _use(estimator, X):
    """Fit, then every method that reads X; returns the outputs."""
    est = clone(estimator).fit(X)
    out = [est.transform(X), est.score(X)]
    if hasattr(est, "predict"):
        out.append(est.predict(X))
    return out


def _arrays(X):
    return [X.data, X.indices, X.indptr] if sp.issparse(X) else [X]


@pytest.mark.parametrize("kind, estimator", FITTED, ids=IDS)
@pytest.mark.parametrize("fmt", ["dense", "csr"])
def test_inputs_are_never_modified(kind, estimator, fmt):
    dense, csr = _data(kind)
    X = dense if fmt == "dense" else csr
    before = [(a.dtype, a.shape, a.tobytes()) for a in _arrays(X)]
    sorted_flag = X.has_sorted_indices if sp.issparse(X) else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        _use(estimator, X)
    assert [(a.dtype, a.shape, a.tobytes()) for a in _arrays(X)] == before
    if sp.issparse(X):
        assert X.has_sorted_indices == sorted_flag


@pytest.mark.parametrize("kind, estimator", FITTED, ids=IDS)
@pytest.mark.parametrize("fmt", ["dense", "csr"])
def test_read_only_inputs_give_the_same_model(kind, estimator, fmt):
    dense, csr = _data(kind)
    X = dense if fmt == "dense" else csr
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        expected = _use(estimator, X.copy())
        for a in _arrays(X):
            a.flags.writeable = False
        got = _use(estimator, X)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)


@pytest.mark.parametrize("kind, estimator", FITTED, ids=IDS)
def test_each_warning_at_most_once_per_fit(kind, estimator):
    # data and settings that provoke every warning the estimator has, over several rounds
    X = _data(kind)[0].copy()
    if kind == "ratings":
        X[:, :2] = np.nan  # unrated items: UnobservedItemsWarning
    if kind == "binary":
        X[:] = 0.0  # nothing to factorize: an all-zero reconstruction (DegenerateFitWarning)
    if kind == "samples":
        X[0, 1] = -1.0  # negative entries: DataWarning
    estimator = clone(estimator)
    if "tol" in estimator.get_params():
        estimator.set_params(tol=1e-300)  # never met: ConvergenceWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X)
    categories = [w.category for w in caught]
    assert categories, "the data above should provoke at least one warning"
    assert all(issubclass(c, FedMFWarning) for c in categories), categories
    assert len(categories) == len(set(categories)), categories


# ---- missing_values (the ratings estimators) -------------------------------------------------
RATINGS = [est for kind, est in FITTED if kind == "ratings"]
RATINGS_IDS = [type(est).__name__ for est in RATINGS]


def _zero_filled():
    """Integer ratings 1..5 with 0 for "not rated" (70% of the entries), and the same
    observations as a sparse matrix."""
    rng = np.random.default_rng(1)
    R = np.where(rng.random((30, 12)) < 0.3, rng.integers(1, 6, size=(30, 12)), 0)
    R[:, 0] = rng.integers(1, 6, size=30)  # every item rated by someone
    return R, sp.csr_matrix(R)


@pytest.mark.parametrize("estimator", RATINGS, ids=RATINGS_IDS)
def test_missing_values_zero_fits_the_observed_ratings_only(estimator):
    R, S = _zero_filled()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)  # missing_values=0: nothing to warn about
        dense = clone(estimator).set_params(solver_params={"missing_values": 0}).fit(R)
    sparse = clone(estimator).fit(S)
    np.testing.assert_array_equal(dense.components_, sparse.components_)
    assert dense.mean_ == sparse.mean_ and dense.mean_ >= 1  # no rating of 0 went in
    np.testing.assert_array_equal(dense.predict(R), sparse.predict(S))
    assert dense.score(R) == sparse.score(S)


@pytest.mark.parametrize("estimator", RATINGS, ids=RATINGS_IDS)
def test_zero_filled_integer_matrix_warns_with_the_default(estimator):
    R, _ = _zero_filled()
    with pytest.warns(DataWarning, match="'missing_values': 0"):
        model = clone(estimator).fit(R)
    assert model.mean_ == pytest.approx(R.mean())  # every 0 fitted as a rating, as it says
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        clone(estimator).fit(R.astype(float))  # a float matrix holds what it says


def test_missing_values_semantics():
    R, S = _zero_filled()
    est = FedMCADMM(n_components=2, n_clients=3, max_iter=2, random_state=0)
    bad = R.astype(float)
    bad[0, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        clone(est).set_params(solver_params={"missing_values": 0}).fit(bad)
    # sparse input: every stored entry is a rating, an explicit 0 included, whatever
    # missing_values says
    S = S.astype(float)
    S[0, 1] = 0.0  # an explicit zero: stored
    a = clone(est).set_params(solver_params={"missing_values": 0}).fit(S)
    b = clone(est).fit(S)
    np.testing.assert_array_equal(a.components_, b.components_)
    assert a.mean_ < sp.csr_matrix(R).data.mean()  # the stored 0 counted


# ---- degenerate fits -----------------------------------------------------------------------
def _degenerate_cases():
    zeros = np.zeros((30, 12))
    X, _, _ = low_rank_ratings(m=40, n=12)
    return [
        (Felb(n_components=2, n_clients=3, max_iter=3, random_state=0), zeros, "all zero"),
        (AggregatedBMF(n_components=2, n_clients=3, local_iter=5, random_state=0), zeros,
         "all zero"),
        (FedMCADMM(
            n_components=2, n_clients=3, max_iter=5, alpha_u=1e6, alpha_v=1e6, random_state=0,
            solver_params={"l1_ratio": 1.0},
        ), X, "all zero"),
        (FederatedClustering(n_clusters=2, n_clients=3, max_iter=3, tol=0, random_state=0),
         zeros, "center is zero"),
    ]


@pytest.mark.parametrize("estimator, X, reason", _degenerate_cases(),
                         ids=lambda p: type(p).__name__ if hasattr(p, "fit") else "")
def test_a_trivial_result_warns_once_and_says_so(estimator, X, reason):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X)
    degenerate = [w for w in caught if issubclass(w.category, DegenerateFitWarning)]
    assert len(degenerate) == 1 and reason in str(degenerate[0].message)
    assert reason in estimator.degenerate_


@pytest.mark.parametrize("kind, estimator", FITTED, ids=IDS)
def test_a_healthy_fit_does_not_warn(kind, estimator):
    if kind == "binary":
        X = np.zeros((30, 12))
        X[:15, :6] = X[15:, 6:] = 1  # two tiles
    else:
        X = _data(kind)[0]
    params = {"tol": 0.0} if "tol" in estimator.get_params() else {}
    if kind == "ratings":  # data with a factor structure, and strengths that let it show
        X = low_rank_ratings(m=40, n=12)[0]
        params.update(HEALTHY)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateFitWarning)
        warnings.simplefilter("error", FedMFConvergenceWarning)
        model = clone(estimator).set_params(**params).fit(X)
    assert model.degenerate_ is None and model.converged_


def test_tol_never_met_warns_and_sets_converged():
    X, _, _ = low_rank_ratings(m=40, n=12)
    est = FedMCADMM(n_components=2, n_clients=3, max_iter=4, random_state=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = clone(est).set_params(tol=1e-300).fit(X)
    # not meeting tol is a ConvergenceWarning (scikit-learn's filters apply), not a
    # degenerate fit: the model itself is fine
    categories = [w.category for w in caught]
    assert categories == [FedMFConvergenceWarning] and not model.converged_
    assert "tol=1e-300 was not met within max_iter=4" in str(caught[0].message)
    assert issubclass(FedMFConvergenceWarning, ConvergenceWarning)
    assert model.degenerate_ is None
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedMFConvergenceWarning)
        model = clone(est).set_params(tol=0.5, max_iter=50).fit(X)  # met early
    assert model.converged_ and model.n_iter_ < 50


# ---- a collapsed factor part (every completion estimator) ----------------------------------
# weak strengths and enough rounds for RFRec's small start to grow off the zero saddle
HEALTHY = dict(alpha_u=0.01, alpha_v=0.01, max_iter=30, tol=0.0)
COLLAPSING = {  # strengths far above the data's scale: U V ends negligible beside the biases
    "FedMCADMM": dict(alpha_u=1e4, alpha_v=1e4),
    "FedMAvg": dict(alpha_u=1e4, alpha_v=1e4),
    "FedMGS": dict(alpha_u=1e4, alpha_v=1e4),
    "RFRec": dict(alpha_u=1e4, alpha_v=1e4, learning_rate=1e-5),
}


# (FedBaseline has no factor part to collapse: it is the biases-only model)
FACTOR_MODELS = [est for est in RATINGS if not isinstance(est, FedBaseline)]


@pytest.mark.parametrize("estimator", FACTOR_MODELS,
                         ids=[type(est).__name__ for est in FACTOR_MODELS])
def test_a_collapsed_factor_part_warns_that_the_model_is_its_biases(estimator):
    X, _, _ = low_rank_ratings(m=40, n=12)
    name = type(estimator).__name__
    est = clone(estimator).set_params(biased=True, tol=0.0, max_iter=30, **COLLAPSING[name])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X)
    degenerate = [str(w.message) for w in caught if w.category is DegenerateFitWarning]
    assert len(degenerate) == 1 and "the model is its biases alone" in degenerate[0]
    assert "factor part is negligible" in est.degenerate_
    # the same data with weak strengths and enough rounds keeps its factor part
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateFitWarning)
        clone(estimator).set_params(biased=True, **HEALTHY).fit(X)


def test_objective_not_decreasing():
    def history(*objectives):
        return [{"objective": o} for o in objectives] + [{"round": 9}]  # (unevaluated round)

    assert objective_not_decreasing(history(3.0, 2.0, 2.5)) is None
    assert "frozen" in objective_not_decreasing(history(2.0, 2.0, 2.0))
    assert "did not decrease" in objective_not_decreasing(history(2.0, 1.0, 2.0))
    assert objective_not_decreasing(history(2.0)) is None  # one evaluation: nothing to compare


# (FedBaseline's transform returns one column, the user biases: tests/test_fed_baseline.py)
@pytest.mark.parametrize(
    "kind, estimator",
    [f for f in FITTED if f[0] != "samples" and not isinstance(f[1], FedBaseline)],
    ids=[i for (k, e), i in zip(FITTED, IDS) if k != "samples" and not isinstance(e, FedBaseline)])
def test_inverse_transform_names_the_rank_it_needs(kind, estimator):
    X = _data(kind)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        model = clone(estimator).fit(X)
    U = model.transform(X)
    assert model.inverse_transform(U).shape == X.shape
    with pytest.raises(ValueError, match="X has 3 columns but .* has n_components=2"):
        model.inverse_transform(np.ones((4, 3)))


def test_an_empty_eval_set_is_an_error():
    X, _, _ = low_rank_ratings(m=40, n=12)
    with pytest.raises(ValueError, match="eval_set has no rating"):
        FedMCADMM(n_components=2, n_clients=3, max_iter=2).fit(X, eval_set=np.full(X.shape,
                                                                                 np.nan))
