"""Early stopping's validation panel (issue 39): when a round samples its clients, a panel of
clients drawn once from the fit's seed reports at each evaluation, in blocks of at most a
round's clients; when every client takes part in every round, every client reports as
before."""

import warnings

import numpy as np
import pytest
from numpy.testing import assert_array_equal

from sklearn_fedmf import FedMAvg, FedMGS
from sklearn_fedmf.engine._fit import validation_split
from sklearn_fedmf.engine._panel import _PANEL, PANEL_RELATIVE_SE, _rng, panel_enough

from .test_validation import kept_state, model_arrays, ratings

N_USERS, PER_ROUND, FRACTION = 80, 0.1, 0.25  # one client per user: 8 clients a round


def fit(cls=FedMGS, callback=None, X=None, **params):
    X = ratings(n_users=N_USERS) if X is None else X
    params = {**dict(n_components=3, n_clients=X.shape[0], clients_per_round=PER_ROUND,
                     max_iter=12, random_state=0, early_stopping=True,
                     validation_fraction=FRACTION, callback=callback), **params}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (max_iter of a small test)
        return cls(**params).fit(X, clients=np.arange(X.shape[0]))


def panel_of(model, size):
    """The panel the fit's seed draws: the first ``size`` clients of its permutation."""
    return np.sort(_rng(model._entropy, _PANEL).permutation(model.n_clients_)[:size])


def test_the_panels_reports_are_its_clients_own_sums():
    """Each evaluation the server sees the reports of the panel's clients only (the first
    24 of the seed's permutation), two numbers each; the validation RMSE is theirs; at the
    kept round each report equals the squared error of the client's own validation ratings
    computed directly from the kept state."""
    seen = []
    model = fit(callback=lambda k, info: seen.append((info["validation_reports"],
                                                      dict(info["record"]))),
                solver_params={"validation_panel": 24})
    X = ratings(n_users=N_USERS)
    panel = panel_of(model, 24)
    for reports, record in seen:
        assert sorted(reports) == panel.tolist()
        assert record["validation_clients"] == 24
        sse = sum(r[0] for r in reports.values())
        count = sum(r[1] for r in reports.values())
        assert record["validation_rmse"] == pytest.approx(np.sqrt(sse / count), rel=1e-12)
    _, valid = validation_split(X, np.arange(N_USERS), N_USERS, FRACTION, model._entropy)
    V, *U = kept_state(model)  # (the best round's state, before any fallback)
    reports = seen[model.best_iteration_ - 1][0]
    for client in panel:
        row = valid[client]
        residual = row.data - model.mean_ - U[client][0] @ V[:, row.indices]
        assert reports[client][1] == row.nnz
        assert reports[client][0] == pytest.approx(np.sum(residual ** 2), rel=1e-9)
    assert -model.best_validation_score_ == pytest.approx(
        np.sqrt(sum(reports[c][0] for c in panel) / sum(reports[c][1] for c in panel)),
        rel=1e-12)


def test_every_client_in_every_round_is_unchanged():
    """A fit whose rounds hold every client ignores the panel: bit for bit the fit of
    every client reporting."""
    X = ratings(n_users=N_USERS)
    runs = [fit(X=X, clients_per_round=None, solver_params={"validation_panel": panel})
            for panel in ("auto", None, 5)]
    for other in runs[1:]:
        for a, b in zip(model_arrays(runs[0]), model_arrays(other)):
            assert_array_equal(a, b)
        assert [{k: v for k, v in r.items() if k != "seconds"} for r in runs[0].history_] == [
            {k: v for k, v in r.items() if k != "seconds"} for r in other.history_]
    assert not any("validation_clients" in r for r in runs[0].history_)


@pytest.mark.parametrize("target", [PANEL_RELATIVE_SE, 0.15])
def test_auto_panel_stops_growing_at_the_target_standard_error(target, monkeypatch):
    """``"auto"``: blocks of a round's clients (8) in the seed's order are added at the first
    evaluation until their sums give the validation MSE a relative standard error of at
    most ``PANEL_RELATIVE_SE`` (the default, and a larger one that this toy reaches before
    every client): replayed from the first evaluation's reports."""
    monkeypatch.setattr("sklearn_fedmf.engine._panel.PANEL_RELATIVE_SE", target)
    seen = []
    model = fit(callback=lambda k, info: seen.append(info["validation_reports"]),
                solver_params={"validation_panel": "auto"})
    order = _rng(model._entropy, _PANEL).permutation(N_USERS)
    first = seen[0]
    size = len(first)
    assert sorted(first) == np.sort(order[:size]).tolist()
    parts = [[sum(first[c][j] for c in order[a:a + 8]) for j in (0, 1)]
             for a in range(0, size, 8)]
    assert size == N_USERS or panel_enough(parts, target)
    assert not any(panel_enough(parts[:b], target) for b in range(len(parts)))
    assert all(sorted(r) == sorted(first) for r in seen)  # the same panel every evaluation
    if target > PANEL_RELATIVE_SE:
        assert size < N_USERS


def test_panel_enough_is_the_ratio_estimators_standard_error():
    # equal blocks: no spread, any target holds; one block never decides
    assert panel_enough([[10.0, 5.0], [20.0, 10.0]], 1e-12, min_blocks=2)
    assert not panel_enough([[10.0, 5.0]], 1.0, min_blocks=1)
    # two blocks of MSE 1 and 3 with 10 ratings each: ratio 2, residuals -10 and +10,
    # variance 2 / 1 * 200 / 400 = 1, relative standard error 1 / 2
    parts = [[10.0, 10.0], [30.0, 10.0]]
    assert panel_enough(parts, 0.5, min_blocks=2) and not panel_enough(parts, 0.49,
                                                                       min_blocks=2)
    # the default trusts the spread from PANEL_MIN_BLOCKS blocks on
    assert not panel_enough(parts, 0.5)
    assert panel_enough(parts * 2, 0.5)


@pytest.mark.slow  # two grouped fits and two per-client ones
def test_grouped_clients_and_workers_give_the_same_panel(monkeypatch):
    """The panel's clients report with the per-client function whether the clients run in
    groups or one by one, on any number of workers: the same model and scores."""
    runs = [fit(cls=FedMAvg, solver_params={"validation_panel": 24}, n_jobs=n_jobs)
            for n_jobs in (1, 2)]
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    grouped = [fit(cls=FedMAvg, solver_params={"validation_panel": 24}, n_jobs=n_jobs)
               for n_jobs in (1, 2)]
    assert type(grouped[0]._federation.client_states).__name__ == "GroupStates"
    for a, b in zip(model_arrays(runs[0]), model_arrays(runs[1])):
        assert_array_equal(a, b)
    for a, b in zip(model_arrays(grouped[0]), model_arrays(grouped[1])):
        assert_array_equal(a, b)
    assert grouped[0].best_iteration_ == runs[0].best_iteration_
    np.testing.assert_allclose(grouped[0].validation_score_, runs[0].validation_score_,
                               rtol=1e-9)


@pytest.mark.slow  # a plain and a secure fit of 12 rounds
def test_secure_panel_equals_plain_in_sums_of_a_rounds_clients():
    """Under secure aggregation the panel's reports are secure sums of at most a round's
    clients (3 blocks of 8 for a panel of 24), and the fit keeps the plain fit's rounds and
    model within the encoding's bound."""
    params = dict(solver_params={"validation_panel": 24})
    plain = fit(**params)
    secure = fit(secure_aggregation=True, **params)
    assert secure.best_iteration_ == plain.best_iteration_
    np.testing.assert_allclose(secure.validation_score_, plain.validation_score_, rtol=1e-9)
    np.testing.assert_allclose(secure.components_, plain.components_, rtol=1e-6, atol=1e-9)
    # the floor's evidence: every client's sums, over the count the server learns with them
    assert secure.factors_used_ == plain.factors_used_
    np.testing.assert_allclose(secure._floor_evidence, plain._floor_evidence, rtol=1e-6)
    for record in secure.history_:
        reports = [e for e in record["secure"]["exchanges"] if e["label"] == "report"]
        assert [e["clients"] for e in reports] == [8, 8, 8]
