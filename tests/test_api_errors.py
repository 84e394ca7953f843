"""Clear errors at the public API's edges: user factors that are not a finite 2-D array given
to ``inverse_transform``, and held-out ratings with no rating at all given to ``score``
(``tests/test_common.py`` checks the rank of the factors and an empty ``eval_set``)."""

import warnings

import numpy as np
import pytest

from sklearn_fedmf import AggregatedBMF, FedMAvg, FedMCADMM, FedMGS, Felb, RFRec
from sklearn_fedmf.datasets import make_binary_tiles, make_ratings

RATINGS = make_ratings(60, 20, 600, random_state=0).X
BINARY = make_binary_tiles(60, 20, 3, random_state=0).X
SMALL = dict(n_components=3, n_clients=4, random_state=0)
ESTIMATORS = [
    (FedMCADMM(max_iter=2, **SMALL), RATINGS),
    (FedMAvg(max_iter=2, **SMALL), RATINGS),
    (FedMGS(max_iter=2, **SMALL), RATINGS),
    (RFRec(max_iter=2, **SMALL), RATINGS),
    (Felb(max_iter=2, **SMALL), BINARY),
    (AggregatedBMF(local_iter=3, **SMALL), BINARY),
]
IDS = [type(e).__name__ for e, _ in ESTIMATORS]


def _fitted(estimator, X):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimator.fit(X)


@pytest.mark.parametrize("estimator, X", ESTIMATORS, ids=IDS)
def test_inverse_transform_rejects_non_finite_or_1d_factors(estimator, X):
    model = _fitted(estimator, X)
    U = model.transform(X[:5])
    assert np.asarray(model.inverse_transform(U)).shape == (5, X.shape[1])
    with pytest.raises(ValueError, match="Expected 2D array"):
        model.inverse_transform(np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        model.inverse_transform([[np.nan, 1.0, 1.0]])


@pytest.mark.parametrize("estimator", [e for e, X in ESTIMATORS if X is RATINGS],
                         ids=[i for i, (_, X) in zip(IDS, ESTIMATORS) if X is RATINGS])
def test_held_out_ratings_without_a_rating_are_an_error(estimator):
    model = _fitted(estimator, RATINGS)
    with pytest.raises(ValueError, match="no rating to score"):
        model.score(RATINGS, np.full(RATINGS.shape, np.nan))
