"""Deployment costs of secure aggregation in ``history_`` (issue 39, points 1 and 3): each
party's seconds and bytes per exchange and phase, equal to what the messages say; the
protocol's floor counts in closed form; and the memory changes (a one-user client keeps its
upload and re-encodes on demand, the server sums masked inputs as they arrive) leave the
model bit for bit as it was."""

import warnings

import numpy as np
import pytest

from sklearn_fedmf import FedMAvg, FedMCADMM, FedMGS
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.engine._exchange import SECURE_PHASES, SecureExchange
from sklearn_fedmf.engine._transport import LocalTransport
from sklearn_fedmf.exceptions import FederationError
from sklearn_fedmf.secure import FixedPointEncoding, SecureAggregation, _rounds
from sklearn_fedmf.secure._costs import floor_seconds
from sklearn_fedmf.secure._protocol import PHASES

N_USERS = 60


def fit(cls, recorder=None, **params):
    X = make_ratings(N_USERS, 30, 600, random_state=0).X
    params = {"n_clients": N_USERS, "clients_per_round": 10, "max_iter": 3, "random_state": 0,
              **params}
    params.setdefault("secure_aggregation", True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**params).fit(X, clients=np.arange(N_USERS))


@pytest.fixture
def recorded(monkeypatch):
    """Every secure phase's replies as the transport returned them, in call order."""
    calls = []
    run = LocalTransport.run

    def recording_run(self, phase, clients, broadcast, **kwargs):
        result = run(self, phase, clients, broadcast, **kwargs)
        if phase in SECURE_PHASES:
            calls.append((phase, {c: m for c, m in result.messages.items() if m is not None},
                          {c: m for c, m in broadcast.messages.items() if c in result.messages}))
        return result

    monkeypatch.setattr(LocalTransport, "run", recording_run)
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 10**9)  # (LocalTransport)
    return calls


def split_exchanges(calls):
    """The recorded calls cut into exchanges: ``{phase: {client: reply}}`` each."""
    exchanges = []
    for phase, replies, _ in calls:
        if phase == "secure_advertise_keys":
            exchanges.append({p: {} for p in PHASES})
        exchanges[-1][PHASES[SECURE_PHASES.index(phase)]].update(replies)
    return exchanges


def recorded_exchanges(model):
    out = []
    for record in model.history_:
        if "start" in record["secure"]:
            out.append(record["secure"]["start"])
        out.extend(record["secure"]["exchanges"])
    return out


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_sent_bytes_are_the_messages_nbytes(cls, recorded):
    model = fit(cls)
    exchanges = recorded_exchanges(model)
    messages = split_exchanges(recorded)
    assert len(exchanges) == len(messages) > 0
    labels = [e["label"] for e in exchanges]
    # FedMAvg (the guarded W step): a prepare and an update exchange a round; FedMGS: the
    # start's exchange over every client, then one a round
    assert labels == (["prepare", "update"] * 3 if cls is FedMAvg else ["init"] + ["update"] * 3)
    for exchange, sent in zip(exchanges, messages):
        for phase in PHASES:
            sizes = [m.nbytes for m in sent[phase].values()]
            costs = exchange["phases"][phase]
            assert costs["clients"] == len(sizes) == exchange["clients"]
            assert costs["client_bytes_sent_max"] == max(sizes)
            assert costs["client_bytes_sent_median"] == np.median(sizes)
        first = next(iter(sent["masked_input"].values()))
        assert exchange["vector_words"] == first.masked.vector.size
    # the round's per-client totals: each client's sum over the exchanges of its round
    rounds = [r["secure"] for r in model.history_]
    offset = 1 if cls is FedMGS else 0
    per_round = len(rounds[0]["exchanges"])
    for k, costs in enumerate(rounds):
        totals = {}
        for sent in messages[offset + k * per_round: offset + (k + 1) * per_round]:
            for phase in PHASES:
                for c, m in sent[phase].items():
                    totals[c] = totals.get(c, 0) + m.nbytes
        assert costs["clients"] == len(totals)
        assert costs["client_bytes_sent_max"] == max(totals.values())
        assert costs["client_bytes_sent_median"] == np.median(list(totals.values()))


def test_received_bytes_and_the_floor_in_closed_form():
    """SecAgg (every pair) over ``n`` clients without dropouts: the key list is ``n`` key
    pairs, the routed shares ``n - 1`` ciphertexts; ``2 n (n - 1)`` agreements and
    ``n (n + 1) d`` keystream words (each client: its self mask and ``n - 1`` pairwise masks;
    the server: every self mask)."""
    model = fit(FedMCADMM, local_iter=2, secure_aggregation=SecureAggregation(neighbours=None))
    ciphertext = 2 * 4 + 2 * 33 + 16
    for record in model.history_:
        for exchange in record["secure"]["exchanges"]:
            n, d = exchange["clients"], exchange["vector_words"]
            assert n == exchange["survivors"] == 10
            assert exchange["agreements"] == 2 * n * (n - 1)
            assert exchange["keystream_words"] == n * (n + 1) * d
            phases = exchange["phases"]
            assert phases["advertise_keys"]["client_bytes_received_max"] == 0
            assert phases["share_keys"]["client_bytes_received_max"] == n * 68
            assert phases["masked_input"]["client_bytes_received_median"] == 4 + (n - 1) * (
                4 + ciphertext)
            assert phases["unmasking"]["client_bytes_received_max"] == 4 * n
        assert record["secure"]["agreements"] == sum(
            e["agreements"] for e in record["secure"]["exchanges"])
    start = model.history_[0]["secure"]["start"]
    assert start["label"] == "init" and start["clients"] == N_USERS
    assert "start" not in model.history_[1]["secure"]
    costs = model.history_[0]["secure"]
    assert floor_seconds(costs, 1e-4, 1e9) == pytest.approx(
        costs["agreements"] * 1e-4 + 8 * costs["keystream_words"] / 1e9)


def test_times_are_positive_and_medians_below_maxima():
    model = fit(FedMGS, solver_params={"dropout": 0.2, "on_client_error": "skip"})
    for record in model.history_:
        costs = record["secure"]
        assert costs["server_s"] > 0 and costs["wall_s"] > 0
        assert 0 < costs["client_s_median"] <= costs["client_s_max"]
        for key in ("client_bytes_sent", "client_bytes_received"):
            assert 0 < costs[f"{key}_median"] <= costs[f"{key}_max"]
        for exchange in costs["exchanges"]:
            assert exchange["wall_s"] > 0
            # the dropped clients take part in the key phases only
            n_kept = exchange["phases"]["masked_input"]["clients"]
            assert exchange["survivors"] == n_kept == exchange["clients"] - record["n_failed"]
            for entry in exchange["phases"].values():
                assert entry["server_s"] >= 0
                assert 0 <= entry["client_s_median"] <= entry["client_s_max"]
                assert entry["client_bytes_sent_median"] <= entry["client_bytes_sent_max"]
            # the client's masked input is the heaviest step, the server's unmasking too
            phases = exchange["phases"]
            assert phases["masked_input"]["client_s_max"] > 0
            assert phases["unmasking"]["server_s"] > 0


def _fitted(model):
    return {k: v for k, v in vars(model).items() if k.endswith("_") and k != "history_"}


def _strip(history):
    return [{k: v for k, v in r.items() if k not in ("seconds", "secure")} for r in history]


def assert_same_fit(a, b):
    fa, fb = _fitted(a), _fitted(b)
    assert fa.keys() == fb.keys()
    for key in fa:
        if isinstance(fa[key], np.ndarray):
            np.testing.assert_array_equal(fa[key], fb[key], err_msg=key)
    assert _strip(a.history_) == _strip(b.history_)


@pytest.mark.parametrize("grouped", [False, True])
def test_compact_state_gives_the_dense_encodings_sums_bit_for_bit(grouped, monkeypatch):
    """A one-user FedMGS client keeps its upload, not its dense encoding, and re-encodes it
    when its next change is due: the running sum, so the model, is the one of the clients
    that keep the encoding (with dropouts: a dropped client's change is not committed)."""
    if grouped:
        monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    kept = []
    original = _rounds._Source.kept_for

    def recording(self, q):
        kept.append(original(self, q))
        return kept[-1]

    monkeypatch.setattr(_rounds._Source, "kept_for", recording)
    params = dict(solver_params={"dropout": 0.2, "on_client_error": "skip"}, max_iter=4)
    compact = fit(FedMGS, **params)
    assert kept and all(isinstance(k, _rounds._Source) for k in kept)
    monkeypatch.setattr(_rounds._Source, "kept_for", lambda self, q: q)
    dense = fit(FedMGS, **params)
    assert_same_fit(compact, dense)
    plain = fit(FedMGS, secure_aggregation=False, **params)
    scale = np.max(np.abs(plain.components_))
    assert np.max(np.abs(plain.components_ - compact.components_)) < 1e-6 * scale


def test_a_re_encoding_that_differs_is_refused():
    encoding = FixedPointEncoding(clip=8.0, scale_bits=20)
    source = _rounds._Source("update", {"x": np.array([1.0, 2.0])}, None, None, encoding)

    class Summable:
        scale = 1.0

        def client(self, upload, weight):
            return {"x": upload["x"] * self.scale}

    summable = Summable()
    q = encoding.encode([1.0, 2.0])
    kept = source.kept_for(np.concatenate([q] * 8))  # (an upload smaller than half of it)
    kept = _rounds._Source(*[getattr(kept, f) for f in ("exchange", "upload", "broadcast",
                                                        "weight", "encoding")],
                           digest=_rounds._digest(q))
    np.testing.assert_array_equal(kept.encoding_of(summable), q)
    summable.scale = 1.0 + 2.0**-18  # one unit of the encoding's last place
    with pytest.raises(FederationError, match="re-encoded"):
        kept.encoding_of(summable)


def test_masked_inputs_in_batches_give_the_same_fit(monkeypatch, recorded):
    reference = fit(FedMGS)
    batches = sum(1 for phase, _, _ in recorded if phase == "secure_masked_input")
    monkeypatch.setattr(_rounds, "MASKED_BATCH", 3)
    recorded.clear()
    batched = fit(FedMGS)
    assert sum(1 for phase, _, _ in recorded if phase == "secure_masked_input") > batches
    assert_same_fit(reference, batched)
    assert [r["bytes_secure"] for r in batched.history_] == [
        r["bytes_secure"] for r in reference.history_]


def test_the_work_clock_leaves_out_garbage_collections():
    """A collection scans the whole simulation's heap: it is not the work of the client
    whose step happened to trigger it."""
    import gc
    import time

    from sklearn_fedmf.secure._costs import work_clock

    heap = [[i] for i in range(300_000)]
    for a, b in zip(heap[::2], heap[1::2]):  # cycles for the collector to walk
        a.append(b)
        b.append(a)
    work, cpu = work_clock(), time.thread_time()
    gc.collect()
    work, cpu = work_clock() - work, time.thread_time() - cpu
    assert cpu > 0 and work < 0.2 * cpu
    del heap


def test_a_rounds_masked_inputs_are_held_for_a_callback_only(monkeypatch):
    """Their dense vectors are summed as they arrive; the engine keeps them only for a
    callback (its ``uploads``), and the model does not depend on it."""
    held = []
    update = SecureExchange.update

    def recording(self, *args, **kwargs):
        masked = update(self, *args, **kwargs)
        held.append(list(masked.values()))
        return masked

    monkeypatch.setattr(SecureExchange, "update", recording)
    quiet = fit(FedMGS)
    assert held and all(v is None for masked in held for v in masked)
    held.clear()
    seen = []
    watched = fit(FedMGS, callback=lambda k, info: seen.append(info["uploads"]))
    assert all(v is not None for masked in held for v in masked)
    assert len(seen) == 3 and all(len(u) == 10 for u in seen)  # (10 clients a round)
    assert_same_fit(quiet, watched)
