"""Early stopping under ``secure_aggregation=True`` (issue 28): each client's validation
report (squared-error sum and count) and the biases-only floor's squared-error sums reach
the server only as secure sums; the fit keeps the plain fit's best round and model within
the encoding's bound."""

import warnings

import numpy as np
import pytest

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS
from sklearn_fedmf.datasets import make_ratings, make_site_ratings
from sklearn_fedmf.engine._exchange import SecureExchange
from sklearn_fedmf.engine._transport import LocalTransport
from sklearn_fedmf.secure._protocol import MaskedInput
from sklearn_fedmf.secure._rounds import SecureInput

BOUND = 1e-6  # max relative difference of the fitted factors (issue 28, point 5)
REPORT = ("sse_eval", "n_eval")


def ratings():
    return make_ratings(300, 80, 6000, random_state=0)["X"]


def relative_difference(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(a)), 1e-300))


def fit(cls, secure, callback=None, X=None, **params):
    params = {**dict(n_components=3, n_clients=8, max_iter=30, random_state=0,
                     early_stopping=True, validation_fraction=0.1, callback=callback), **params}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (max_iter of a small test)
        return cls(**params, secure_aggregation=secure).fit(ratings() if X is None else X)


@pytest.mark.parametrize("cls, params", [
    (FedMGS, {}),
    (FedMCADMM, {}),
    (FedMAvg, {"solver_params": {"w_step": "local"}}),
])
def test_secure_early_stopping_keeps_the_plain_fits_best_round(cls, params):
    plain, secure = fit(cls, False, **params), fit(cls, True, **params)
    assert secure.best_iteration_ == plain.best_iteration_
    assert secure.n_iter_ == plain.n_iter_
    assert secure.best_validation_score_ == pytest.approx(plain.best_validation_score_,
                                                          rel=1e-9)
    assert relative_difference(plain.components_, secure.components_) < BOUND
    assert secure.factors_used_ == plain.factors_used_


def test_no_plain_report_reaches_the_transport_or_the_callback(monkeypatch):
    """What the clients' transport hands the engine holds no report key, and the reports'
    masked inputs are all the callback sees of them."""
    returned = []
    run = LocalTransport.run

    def recording_run(self, phase, clients, broadcast, **kwargs):
        result = run(self, phase, clients, broadcast, **kwargs)
        returned.append((phase, dict(result.messages)))
        return result

    monkeypatch.setattr(LocalTransport, "run", recording_run)
    report_bytes = []  # what each round's secure sum of the reports cost its clients
    secure_reports = SecureExchange.reports

    def recording_reports(self, *args):
        outcome = secure_reports(self, *args)
        report_bytes.append(outcome[2][0])  # (sums, masked reports, (bytes up, down))
        return outcome

    monkeypatch.setattr(SecureExchange, "reports", recording_reports)
    seen = []
    model = fit(FedMGS, True, callback=lambda k, info: seen.append(info["validation_reports"]))
    metrics = [m for phase, messages in returned if phase == "client_metrics"
               for m in messages.values()]
    assert metrics and all(not set(REPORT) & set(m) for m in metrics)
    assert all(isinstance(r, SecureInput) for phase, messages in returned
               if phase == "secure_masked_input" for r in messages.values())
    assert len(seen) == model.n_iter_
    for reports in seen:
        assert sorted(reports) == list(range(8))
        assert all(isinstance(r, MaskedInput) and r.vector.dtype == np.uint64
                   for r in reports.values())
    # the plain fit's reports are two numbers per client (16 bytes); the secure fit's are
    # every phase of their secure sum (keys, shares, masked vectors, unmasking), counted in
    # the round's bytes
    assert len(report_bytes) == model.n_iter_
    assert all(b > 16 * 8 for b in report_bytes)
    assert all(r["bytes_uploaded"] >= b for r, b in zip(model.history_, report_bytes))


def test_the_biases_floor_is_a_secure_sum_too():
    """On ratings of biases and noise alone the floor decides the model: the secure fit
    decides as the plain one, its floor fitted with secure aggregation, its per-client
    squared-error sums summed securely (more bytes than one number per client)."""
    X = make_site_ratings("douban", n_ratings=6000, interaction=0.0, random_state=0).X
    # (strong regularization: the factor part cannot help, the floor's biases are kept)
    params = dict(n_components=3, n_clients=6, max_iter=20, random_state=0, alpha_u=1e3,
                  alpha_v=1e3, early_stopping=True, validation_fraction=0.2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = FedMCADMM(**params).fit(X)
        secure = FedMCADMM(**params, secure_aggregation=True).fit(X)
    assert not plain.factors_used_ and not secure.factors_used_
    assert relative_difference(plain.item_bias_, secure.item_bias_) < BOUND
    assert relative_difference(plain.user_bias_, secure.user_bias_) < BOUND
    # the last round carries the floor: its secure rounds and its secure sum
    assert secure.history_[-1]["bytes_uploaded"] > plain.history_[-1]["bytes_uploaded"]


@pytest.mark.slow  # 60 one-user clients, two fits of 15 rounds with validation
def test_grouped_clients_report_their_group_sums_securely(monkeypatch):
    """One client per user, run in groups: each group's report is a summand of the secure
    sum (the group's own sums, as without secure aggregation)."""
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)  # grouped when batched
    seen = []
    params = dict(n_clients=60, clients_per_round=0.25, max_iter=15)
    plain = fit(FedMGS, False, **params)
    secure = fit(FedMGS, True, callback=lambda k, info: seen.append(info["validation_reports"]),
                 **params)
    assert type(secure._federation.client_states).__name__ == "GroupStates"
    assert secure.best_iteration_ == plain.best_iteration_
    assert relative_difference(plain.components_, secure.components_) < BOUND
    assert all(len(reports) > 1 and all(isinstance(r, MaskedInput) for r in reports.values())
               for reports in seen)
