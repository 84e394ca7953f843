"""The contract every estimator of the package shares.

scikit-learn's estimator checks run here, once, over all estimators; then the input
contract of the fit skeleton: the caller's arrays are never modified, read-only arrays are
accepted, and each of the package's warnings is raised at most once per fit.
"""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.utils.estimator_checks import parametrize_with_checks

from sklearn_fedmf import (
    AggregatedBMF,
    FederatedClustering,
    FedMAvg,
    FedMCADMM,
    FedMGS,
    Felb,
    RFRec,
)
from sklearn_fedmf.exceptions import FedMFWarning

PREDICT_IS_A_MATRIX = (
    "predict returns the (n_rows, n_items) matrix of predicted ratings (the Boolean "
    "reconstruction for Felb and AggregatedBMF), not one value per row"
)
ONMF_ON_CENTRED_BLOBS = (
    "the check clusters standardized blobs around the origin; orthogonal NMF clusters by "
    "direction with nonnegative memberships (the paper's model, spec 2.2), which cannot "
    "separate them. The K-means mode (h_constraint='onehot', also checked) passes."
)

CHECKED = [
    FedMCADMM(n_components=1, n_clients=2, max_iter=100, random_state=0),
    FedMAvg(n_components=1, n_clients=2, max_iter=100, random_state=0),
    FedMGS(n_components=1, n_clients=2, max_iter=100, random_state=0),
    RFRec(n_components=1, learning_rate=0.01, max_iter=20, random_state=0),
    RFRec(n_components=1, variant="rfrecf", optimizer="adam", link="sigmoid",
          learning_rate=0.05, n_clients=2, max_iter=20, random_state=0),
    # binarize=0.0 maps the checks' real-valued data to 0/1; the default rejects it
    Felb(n_components=2, n_clients=2, max_iter=3, sync_every=2, binarize=0.0, random_state=0),
    Felb(n_components=2, n_clients=2, max_iter=3, sync_every=2, binarize=0.0, update="mu",
         random_state=0),
    AggregatedBMF(n_components=2, n_clients=2, local_iter=5, binarize=0.0, random_state=0),
    FederatedClustering(n_clusters=3, n_clients=2, max_iter=20, random_state=0),
    FederatedClustering(n_clusters=3, n_clients=2, max_iter=20, h_constraint="onehot",
                        algorithm="fedmavg", random_state=0),
]


def expected_failed_checks(estimator):
    if isinstance(estimator, FederatedClustering):
        if estimator.h_constraint == "nonnegative":
            return {"check_clustering": ONMF_ON_CENTRED_BLOBS}
        return {}
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
    est = estimator.fit(X)
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
    if "tol" in estimator.get_params():
        estimator = estimator.set_params(tol=1e-300)  # never met: DegenerateFitWarning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimator.fit(X)
    categories = [w.category for w in caught]
    assert categories, "the data above should provoke at least one warning"
    assert all(issubclass(c, FedMFWarning) for c in categories), categories
    assert len(categories) == len(set(categories)), categories
