"""No secure exchange over every client after the start in a default secure fit (issue 39):
the biases floor of a validated fit samples the fit's ``clients_per_round``, and FedMAvg's
global step sums the sampled clients' Grams only; where the algorithm is the plain one's
(full participation) the secure model still equals the plain model."""

import copy
import math
import warnings

import numpy as np
import pytest

from sklearn_fedmf import FedBaseline, FedMAvg, FedMGS, RFRec
from sklearn_fedmf.completion import _base, _validation
from sklearn_fedmf.completion._validation import (
    FLOOR_EPOCHS,
    FLOOR_EVIDENCE_ROUNDS,
    FLOOR_Z,
    evidence_clients,
    floor_rounds,
)
from sklearn_fedmf.datasets import make_ratings, make_site_ratings

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


def recording_sums(monkeypatch):
    """The clients of each one-off secure sum of the validation (the floor's evidence)."""
    sums, original = [], _validation.sum_securely

    def recording(values, option, **kwargs):
        sums.append(sorted(values))
        return original(values, option, **kwargs)

    monkeypatch.setattr(_validation, "sum_securely", recording)
    return sums


@pytest.mark.slow  # a validated secure fit of 300 one-user clients: about 15 s each
@pytest.mark.parametrize("cls", [RFRec, FedMGS])
def test_validated_secure_fit_has_no_exchange_over_every_client_after_the_start(
        cls, validated, monkeypatch):
    floors, sums = recording_floors(monkeypatch), recording_sums(monkeypatch)
    model = fit(cls, validated, clients_per_round=PER_ROUND, max_iter=3,
                secure_aggregation=True)
    assert model.best_validation_score_ is not None and floors  # validated, with a floor
    for exchanges in round_exchanges(model):
        # (the validation reports, two numbers per client, are summed over every client)
        assert all(e["clients"] <= PER_ROUND for e in exchanges if e["label"] != "report")
    for floor in floors:
        assert floor.clients_per_round == PER_ROUND
        assert len(floor.history_) == FLOOR_EPOCHS * N_USERS // PER_ROUND
        assert "start" not in floor.history_[0]["secure"]  # (summed before, in sums)
        for exchanges in round_exchanges(floor):
            assert [e["clients"] for e in exchanges] == [PER_ROUND]
    # each floor's start, then the evidence: secure sums of a round's clients each, each
    # time every client once
    per_sum = [PER_ROUND] * (N_USERS // PER_ROUND)
    assert [len(s) for s in sums] == per_sum * (len(floors) + 1)
    for k in range(len(floors) + 1):
        part = sums[k * len(per_sum):(k + 1) * len(per_sum)]
        assert sorted(c for s in part for c in s) == list(range(N_USERS))


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


@pytest.mark.parametrize("grouped", [False, True])
def test_floor_start_in_sums_is_the_floors_own_start(validated, grouped, monkeypatch):
    """A secure sampled floor whose start was summed in sums of a round's clients
    (floor_start) is the floor that sums its own start over every client, within the
    encoding; its clients send no start, and the sums' bytes are the first round's."""
    if grouped:
        monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    params = dict(clients_per_round=PER_ROUND, max_iter=3, secure_aggregation=True)
    own = fit(FedBaseline, validated, **params)
    sums = recording_sums(monkeypatch)
    codes = np.arange(N_USERS)
    counts, rating_sums, (up, down) = _validation.floor_start(validated, codes, N_USERS,
                                                              PER_ROUND, True, 7)
    assert [len(s) for s in sums] == [PER_ROUND] * (N_USERS // PER_ROUND)
    assert np.array_equal(np.rint(counts), np.bincount(validated.indices,
                                                       minlength=validated.shape[1]))
    given = FedBaseline(n_clients=N_USERS, random_state=0, **params)
    given._given_start = counts, rating_sums, (up, down)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        given.fit(validated, clients=codes)
    assert "start" in own.history_[0]["secure"] and "start" not in given.history_[0]["secure"]
    assert type(given._federation.client_states).__name__ == (
        "GroupStates" if grouped else "list")
    scale = np.max(np.abs(own.item_bias_))
    assert np.max(np.abs(given.item_bias_ - own.item_bias_)) <= 1e-9 * scale
    assert np.max(np.abs(given.user_bias_ - own.user_bias_)) <= 1e-9 * scale
    first = given.history_[0]
    assert first["bytes_uploaded"] >= up and first["bytes_downloaded"] >= down


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


def test_evidence_clients(monkeypatch):
    """Every client in one sum at full participation; else sums of at most a round's
    clients: of every client once (FLOOR_EVIDENCE_ROUNDS=None), or of that many rounds'
    distinct clients, the same for the same entropy."""
    assert FLOOR_EVIDENCE_ROUNDS is None
    assert [b.tolist() for b in evidence_clients(7, None, 0)] == [list(range(7))]
    assert [b.tolist() for b in evidence_clients(7, 1.0, 0)] == [list(range(7))]
    every = evidence_clients(10, 4, 0)
    assert [b.size for b in every] == [4, 4, 2]
    assert sorted(np.concatenate(every).tolist()) == list(range(10))
    monkeypatch.setattr(_validation, "FLOOR_EVIDENCE_ROUNDS", 4)
    batches = evidence_clients(300, 30, 5)
    assert [b.size for b in batches] == [30] * 4
    drawn = np.concatenate(batches)
    assert np.unique(drawn).size == drawn.size and drawn.max() < 300
    assert all(np.array_equal(a, b) for a, b in zip(batches, evidence_clients(300, 30, 5)))
    assert not np.array_equal(drawn, np.concatenate(evidence_clients(300, 30, 6)))
    # more rounds' clients than clients: every client once
    assert sorted(np.concatenate(evidence_clients(10, 4, 0)).tolist()) == list(range(10))


def _evidence_case(kind):
    """Ratings with a clear gain of the factor part (low rank: about 11 standard errors) or
    with none (biases and noise: about -3), and the fit's parameters: one client per user,
    10 % a round."""
    if kind == "gain":
        X = make_ratings(400, 60, 12_000, n_components=2, noise=0.3, random_state=1).X
    else:
        X = make_site_ratings("douban", n_users=400, n_items=60, n_ratings=12_000,
                              interaction=0.0, random_state=1).X
    return X, dict(n_clients=X.shape[0], clients_per_round=40, max_iter=20, random_state=0)


@pytest.mark.parametrize("rounds", [None, 4])
@pytest.mark.parametrize("kind", ["gain", "none"])
def test_sampled_evidence_decides_as_every_client(kind, rounds, monkeypatch):
    """The evidence of a secure fit that samples its clients, from secure sums of a round's
    clients each, keeps the decision of the evidence over every client (the plain fit's)
    on a clear gain and on none: the same kept model and floor, only the evidence's sums
    differ. Over every client (the default) the evidence is the plain one; from 4 rounds'
    clients (FLOOR_EVIDENCE_ROUNDS=4) its gain is within its own noise of every client's,
    and its standard error larger (a sample of the users)."""
    X, params = _evidence_case(kind)
    seen = {}
    original = _validation.biases_floor

    def capture(ctx, model, **kwargs):
        out = original(ctx, model, **kwargs)  # (the model as compared: the fit goes on)
        seen.update(ctx=ctx, model=copy.deepcopy(model), floor=out[0], out=out)
        return out

    monkeypatch.setattr(_base, "biases_floor", capture)
    plain = fit(FedMGS, X, **params)
    assert plain.factors_used_ == (kind == "gain")
    # the same floor, its evidence summed securely as a secure sampled fit sums it
    monkeypatch.setattr(_validation, "_fit_floor", lambda *a, **k: (seen["floor"], (0, 0)))
    monkeypatch.setattr(_validation, "FLOOR_EVIDENCE_ROUNDS", rounds)
    sums = recording_sums(monkeypatch)
    _, floor_rmse, _, (sampled_gain, sampled_noise) = original(
        seen["ctx"], seen["model"], n_jobs=None, secure_aggregation=True,
        clients_per_round=params["clients_per_round"])
    assert [len(s) for s in sums] == [40] * (rounds or 10)
    gain, noise = plain._floor_evidence
    assert (sampled_gain > FLOOR_Z * sampled_noise) == plain.factors_used_
    if rounds is None:  # every client: the plain evidence (within the encoding)
        assert (sampled_gain, sampled_noise) == pytest.approx((gain, noise), rel=1e-6)
        assert floor_rmse == pytest.approx(seen["out"][1], rel=1e-6)
        return
    assert sampled_noise > noise
    assert abs(sampled_gain - gain) < 2 * sampled_noise
    assert abs(floor_rmse - seen["out"][1]) < 0.05 * seen["out"][1]  # the sample's RMSE
