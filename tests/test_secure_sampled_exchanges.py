"""No secure exchange over every client after the start in a default secure fit (issue 39):
the biases floor of a validated fit samples the fit's ``clients_per_round``, and FedMAvg's
global step sums the sampled clients' Grams only; where the algorithm is the plain one's
(full participation) the secure model still equals the plain model."""

import math
import warnings

import numpy as np
import pytest

from sklearn_fedmf import FedBaseline, FedMAvg, FedMGS, RFRec
from sklearn_fedmf.completion import _validation
from sklearn_fedmf.completion._validation import FLOOR_EPOCHS, floor_rounds
from sklearn_fedmf.datasets import make_ratings

N_USERS, PER_ROUND = 300, 30


@pytest.fixture(scope="module")
def validated():
    """12,000 ratings: "auto" early stopping validates (10,000 or more), one client a user."""
    return make_ratings(N_USERS, 80, 12_000, random_state=0).X


def fit(cls, X, **params):
    params = {"n_clients": X.shape[0], "random_state": 0, **params}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (max_iter of a small test)
        return cls(**params).fit(X, clients=np.arange(X.shape[0]))


def recording_floors(monkeypatch):
    floors, original = [], _validation._fit_floor

    def recording(*args, **kwargs):
        out = original(*args, **kwargs)
        floors.append(out[0])
        return out

    monkeypatch.setattr(_validation, "_fit_floor", recording)
    return floors


def round_exchanges(model):
    """Each round's secure exchanges (the start's apart) of a fitted model."""
    return [r["secure"]["exchanges"] for r in model.history_]


def test_floor_rounds():
    assert floor_rounds(100, None, True) == {}  # every client a round: the floor's own
    assert floor_rounds(100, 10, False) == {}  # plain: every client, 20 rounds
    assert floor_rounds(100, 1.0, True) == {}
    assert floor_rounds(100, 10, True) == {"clients_per_round": 10,
                                          "max_iter": FLOOR_EPOCHS * 10}
    assert floor_rounds(300, 0.1, True) == {"clients_per_round": 30, "max_iter": 80}
    assert floor_rounds(7, 3, True) == {"clients_per_round": 3,
                                        "max_iter": math.ceil(FLOOR_EPOCHS * 7 / 3)}


@pytest.mark.slow  # a validated secure fit of 300 one-user clients: about 15 s each
@pytest.mark.parametrize("cls", [RFRec, FedMGS])
def test_validated_secure_fit_has_no_exchange_over_every_client_after_the_start(
        cls, validated, monkeypatch):
    floors = recording_floors(monkeypatch)
    model = fit(cls, validated, clients_per_round=PER_ROUND, max_iter=3,
                secure_aggregation=True)
    assert model.best_validation_score_ is not None and floors  # validated, with a floor
    for exchanges in round_exchanges(model):
        # (the validation reports, two numbers per client, are summed over every client)
        assert all(e["clients"] <= PER_ROUND for e in exchanges if e["label"] != "report")
    for floor in floors:
        assert floor.clients_per_round == PER_ROUND
        assert len(floor.history_) == FLOOR_EPOCHS * N_USERS // PER_ROUND
        assert floor.history_[0]["secure"]["start"]["clients"] == N_USERS  # its start
        for exchanges in round_exchanges(floor):
            assert [e["clients"] for e in exchanges] == [PER_ROUND]


@pytest.mark.slow  # a secure floor over every client of every round: about 30 s
def test_secure_floor_at_full_participation_is_the_plain_one(validated, monkeypatch):
    """Every client a round: the secure fit's floor is the plain fit's, 20 rounds of every
    client, and the secure model and the evidence are the plain ones."""
    floors = recording_floors(monkeypatch)
    params = dict(n_clients=8, max_iter=4)
    plain = fit(FedMGS, validated, **params)
    secure = fit(FedMGS, validated, **params, secure_aggregation=True)
    assert [len(f.history_) for f in floors] == [20] * len(floors) and len(floors) >= 2
    assert all(f.clients_per_round is None for f in floors)
    assert secure.factors_used_ == plain.factors_used_
    assert secure._floor_evidence == pytest.approx(plain._floor_evidence, rel=1e-5)
    assert np.max(np.abs(secure.components_ - plain.components_)) <= (
        1e-6 * np.max(np.abs(plain.components_)))


def test_sampled_floor_is_close_to_the_floor_with_every_client(validated):
    """``FLOOR_EPOCHS`` expected rounds per client reach the every-client floor's training
    objective within 0.1 % (FedBaseline's randomized block coordinate descent)."""
    full = fit(FedBaseline, validated)
    sampled = fit(FedBaseline, validated, **floor_rounds(N_USERS, PER_ROUND, True))
    fewer = fit(FedBaseline, validated, clients_per_round=PER_ROUND, max_iter=20)
    best = full.history_[-1]["objective"]
    assert sampled.history_[-1]["objective"] <= best * 1.001
    assert fewer.history_[-1]["objective"] > sampled.history_[-1]["objective"]


@pytest.mark.parametrize("grouped", [False, True])
def test_fedmavg_secure_gram_sum_over_the_sampled_clients(validated, grouped, monkeypatch):
    """pcc under secure aggregation: the prepare exchange of each round holds the round's
    sampled clients only, and the fit stays close to the plain one (the global step from
    the latest Grams of the clients that have sent, scaled to every client, estimates the
    plain step's sum over every client's Gram)."""
    if grouped:
        monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    params = dict(clients_per_round=PER_ROUND, max_iter=8, early_stopping=False)
    plain = fit(FedMAvg, validated, **params)
    secure = fit(FedMAvg, validated, **params, secure_aggregation=True)
    for exchanges in round_exchanges(secure):
        assert [(e["label"], e["clients"]) for e in exchanges] == [
            ("prepare", PER_ROUND), ("update", PER_ROUND)]
    a, b = plain.history_[-1]["train_rmse"], secure.history_[-1]["train_rmse"]
    assert abs(a - b) <= 0.02 * a
    # the algorithm differs from the plain one's (the step is estimated)
    assert np.max(np.abs(secure.components_ - plain.components_)) > (
        1e-6 * np.max(np.abs(plain.components_)))


def test_fedmavg_pcp_secure_still_equals_plain(validated):
    """pcp's Grams come from the sampled clients in the plain fit too: the same model."""
    params = dict(clients_per_round=PER_ROUND, max_iter=4, early_stopping=False,
                  solver_params={"participation": "pcp"})
    plain = fit(FedMAvg, validated, **params)
    secure = fit(FedMAvg, validated, **params, secure_aggregation=True)
    assert np.max(np.abs(secure.components_ - plain.components_)) <= (
        1e-6 * np.max(np.abs(plain.components_)))
