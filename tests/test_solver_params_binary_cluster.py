"""The parameter surface of the binary and clustering estimators: the papers' step constants
and switches are keys of one ``solver_params`` dict, each documented with its declared default,
and a removed parameter says where it went."""

import ast
import inspect
import re

import numpy as np
import pytest

from sklearn_fedmf import AggregatedBMF, FederatedClustering, Felb
from sklearn_fedmf.cluster import PAPER_SETTINGS

ESTIMATORS = [Felb, AggregatedBMF, FederatedClustering]


def documented_solver_keys(cls):
    """``{key: default}`` of the sub-list items ``- ``key`` : spec, default=value`` of the
    ``solver_params`` entry of ``cls``'s docstring."""
    doc = cls.__doc__.split("    solver_params : ")[1].split("\n    callback : ")[0]
    found = {}
    for line in doc.splitlines():
        match = re.match(r"\s*- ((?:``\w+``(?:, )?)+) : .*default=(.+)$", line)
        if match:
            for key in re.findall(r"``(\w+)``", match.group(1)):
                found[key] = ast.literal_eval(match.group(2))
    return found


@pytest.mark.parametrize("cls", ESTIMATORS)
def test_solver_constants_are_documented_keys_and_moved_names_say_where(cls):
    signature = inspect.signature(cls).parameters
    assert len(signature) <= 22  # room for secure_aggregation within MLPRegressor's 23
    assert documented_solver_keys(cls) == {
        key: default for key, (default, _) in cls._solver_params.items()}
    assert not set(cls._solver_params) & set(signature)
    for key in cls._moved_params:
        if key in cls._solver_params:
            with pytest.raises(TypeError, match=rf"`{key}` moved to `solver_params\['{key}'\]`"):
                cls(**{key: cls._solver_params[key][0]})
    X = np.kron(np.eye(2), np.ones((10, 6)))
    with pytest.raises(ValueError, match=r"no key 'kapa'; its keys are .*"):
        cls(2, n_clients=2, solver_params={"kapa": 0.1}).fit(X)
    with pytest.raises(ValueError, match=rf"{cls.__name__}.solver_params"):
        key = next(k for k, (_, c) in cls._solver_params.items() if c[0] != "boolean")
        cls(2, n_clients=2, solver_params={key: -1}).fit(X)


def test_clustering_paper_settings_are_one_call_and_its_solver_keys_apply():
    X = np.abs(np.random.default_rng(0).normal(size=(40, 4))) + np.kron(np.eye(2, 4) * 3,
                                                                         np.ones((20, 1)))
    paper = FederatedClustering(2, n_clients=4, max_iter=5, random_state=0,
                                **PAPER_SETTINGS["FederatedClustering"]).fit(X)
    assert paper.history_[0]["rho"] == pytest.approx(1e-8 * (X**2).sum() / len(X))
    kmeans = FederatedClustering(2, n_clients=4, max_iter=5, random_state=0,
                                 solver_params={"h_constraint": "onehot"}).fit(X)
    assert set(np.unique(kmeans.sample_factors_)) <= {0.0, 1.0}
    # the fit's constants stay with the fitted model: predict uses the fit's K-means mode
    labels = kmeans.predict(X)
    kmeans.set_params(solver_params=None)
    np.testing.assert_array_equal(kmeans.predict(X), labels)
    np.testing.assert_allclose(kmeans.transform(X)[np.arange(len(X)), labels] ** 2,
                               ((X - kmeans.cluster_centers_[labels]) ** 2).sum(axis=1))
