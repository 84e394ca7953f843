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
        assert floor.history_[0]["secure"]["start"]["clients"] == N_USERS  # its start
        for exchanges in round_exchanges(floor):
            assert [e["clients"] for e in exchanges] == [PER_ROUND]
    # the evidence: secure sums of a round's clients each, together every client once
    assert [len(s) for s in sums] == [PER_ROUND] * (N_USERS // PER_ROUND)
    assert sorted(c for s in sums for c in s) == list(range(N_USERS))


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
