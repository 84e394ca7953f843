"""The engine on its own, with a toy protocol (not through an estimator).

The toy federation estimates the mean of the clients' numbers: each client holds a vector,
steps its private estimate towards its own mean plus a little noise from its generator, and
uploads the estimate; the server averages the uploads. Everything the engine promises is
checked against what the toy functions record: sampling, seeds, byte counts, participation,
``after_round``, the failure policy, early stopping and the transport seam.
"""

import pickle
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from typing import NamedTuple

import numpy as np
import pytest

from sklearn_fedmf.engine._federation import (
    _PREPARE_CLIENT,
    _UPDATE_CLIENT,
    Broadcast,
    FederatedProtocol,
    Participation,
    evaluate,
    initialize_federation,
    nbytes,
    run_federation,
)
from sklearn_fedmf.engine._transport import LocalTransport, PhaseResult, Transport, client_generator
from sklearn_fedmf.exceptions import (
    ClientDropout,
    ClientError,
    ClientFailureWarning,
    FederationError,
)


class Block(NamedTuple):
    values: np.ndarray

    @property
    def nnz(self):
        return self.values.size

    @property
    def n_rows(self):
        return 1


def make_blocks(n_clients=10, seed=0):
    rng = np.random.default_rng(seed)
    return [Block(rng.normal(loc=c, size=5 + c)) for c in range(n_clients)]


# ---- the toy protocol (pure functions) ------------------------------------------------------
def init_server(rng):
    x = np.zeros(3)
    return {"x": x, "calls": 0}, {"x": x}


def init_client(block, broadcast, rng):
    return {"x": broadcast["x"].copy(), "steps": 0, "draws": []}, {"n": np.array([block.nnz])}


def client_update(state, block, broadcast, rng, selected, *, noise=0.01, fail=None):
    if fail is not None:
        fail(state, block, selected)
    draw = rng.normal(size=3)
    x = broadcast["x"] + 0.5 * (block.values.mean() - broadcast["x"]) + noise * draw
    new = {"x": x, "steps": state["steps"] + 1, "draws": state["draws"] + [draw]}
    return new, ({"x": x} if selected else None)


def server_update(state, uploads, round_index):
    x = np.mean([u["x"] for u in uploads.values()], axis=0) if uploads else state["x"]
    return {"x": x, "calls": state["calls"] + 1}, {"x": x}


def client_metrics(state, block, broadcast):
    return {"sq": float(((block.values[:, None] - broadcast["x"]) ** 2).sum()),
            "n": block.nnz}


def combine_metrics(server_state, sums):
    return {"objective": sums["sq"] / sums["n"]}


def toy(**changes):
    protocol = FederatedProtocol(
        init_server=init_server, init_client=init_client, client_update=client_update,
        server_update=server_update, client_metrics=client_metrics,
        combine_metrics=combine_metrics,
    )
    return replace(protocol, **changes)


def run(protocol, blocks, *, entropy=0, max_iter=5, **kwargs):
    state, init_bytes = initialize_federation(protocol, blocks, entropy=entropy,
                                              n_jobs=kwargs.get("n_jobs"))
    return run_federation(protocol, blocks, max_iter=max_iter, entropy=entropy, state=state,
                          init_bytes=init_bytes, **kwargs)


def record_rounds():
    seen = []
    return seen, (lambda k, info: seen.append((k, info)) and False)


def strip(history):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in history]


# ---- sampling and seeds ---------------------------------------------------------------------
def test_each_round_samples_the_requested_number_of_distinct_clients_uniformly():
    blocks = make_blocks(10)
    seen, callback = record_rounds()
    state = run(toy(), blocks, max_iter=400, clients_per_round=3, callback=callback,
                eval_every=0)
    counts = np.zeros(10)
    for _, info in seen:
        assert len(set(info["sampled"].tolist())) == 3
        assert sorted(info["uploads"]) == sorted(info["sampled"].tolist())
        counts[info["sampled"]] += 1
    assert all(r["n_sampled"] == 3 for r in state.history)
    # each client is sampled with probability 3/10: 120 of 400 rounds, binomial sd ~9.2
    assert np.all(np.abs(counts - 120) < 4.5 * np.sqrt(400 * 0.3 * 0.7))
    # only the sampled clients stepped
    assert sum(s["steps"] for s in state.client_states) == 3 * 400


def test_a_fraction_of_clients_is_rounded_up():
    seen, callback = record_rounds()
    run(toy(), make_blocks(10), max_iter=2, clients_per_round=0.25, callback=callback)
    assert all(len(info["sampled"]) == 3 for _, info in seen)


def test_client_draws_follow_the_keyed_streams_whatever_n_jobs():
    blocks = make_blocks(8)
    one = run(toy(), blocks, entropy=7, max_iter=4, clients_per_round=5, n_jobs=1)
    two = run(toy(), blocks, entropy=7, max_iter=4, clients_per_round=5, n_jobs=2)
    assert strip(one.history) == strip(two.history)
    for a, b in zip(one.client_states, two.client_states):
        np.testing.assert_array_equal(a["x"], b["x"])
    # client c's draw in round k is SeedSequence(entropy, spawn_key=(_UPDATE_CLIENT, k, c))
    seen, callback = record_rounds()
    state = run(toy(), blocks, entropy=7, max_iter=4, clients_per_round=5, callback=callback)
    draws = {c: list(state.client_states[c]["draws"]) for c in range(8)}
    for k, info in seen:
        for c in info["sampled"]:
            expected = np.random.default_rng(
                np.random.SeedSequence(7, spawn_key=(_UPDATE_CLIENT, k - 1, c))).normal(size=3)
            np.testing.assert_array_equal(draws[c].pop(0), expected)
    np.testing.assert_array_equal(client_generator((7, _UPDATE_CLIENT, 2), 3).normal(size=3),
                                  np.random.default_rng(np.random.SeedSequence(
                                      7, spawn_key=(_UPDATE_CLIENT, 2, 3))).normal(size=3))


# ---- byte counts ----------------------------------------------------------------------------
def test_bytes_are_the_uploads_and_the_broadcast_times_its_recipients():
    blocks = make_blocks(6)
    state = run(toy(), blocks, max_iter=3, clients_per_round=2)
    first, later = state.history[0], state.history[1]
    assert later["bytes_uploaded"] == 2 * 3 * 8  # two uploads of 3 float64
    assert later["bytes_downloaded"] == 2 * 3 * 8  # the broadcast to the 2 sampled clients
    # the initial exchange: every client's n (one int64) up, the broadcast to all 6 down
    assert first["bytes_uploaded"] == 2 * 24 + 6 * 8
    assert first["bytes_downloaded"] == 2 * 24 + 6 * 24
    to_all = run(toy(participation=Participation(receives="all")), blocks, max_iter=2,
                 clients_per_round=2)
    assert to_all.history[1]["bytes_downloaded"] == 6 * 24


def test_the_simulation_part_of_a_broadcast_reaches_clients_but_is_not_counted():
    def wrap(fn):
        def server(*args):
            state, bc = fn(*args)
            return state, Broadcast(bc if state.get("calls", 0) % 2 == 0 else None,
                                    simulation={"x": bc["x"], "secret": np.ones(1000)})
        return server

    def update(state, block, broadcast, rng, selected):
        assert broadcast.simulation["secret"].shape == (1000,)
        return client_update(state, block, broadcast.simulation, rng, selected)

    def metrics(state, block, broadcast):
        return client_metrics(state, block, broadcast.simulation)

    protocol = toy(init_server=wrap(init_server), server_update=wrap(server_update),
                   client_update=update, client_metrics=metrics,
                   init_client=lambda b, bc, rng: init_client(b, bc.simulation, rng))
    state = run(protocol, make_blocks(4), max_iter=4, clients_per_round=2)
    # rounds start from broadcasts made after 0, 1, 2, 3 server updates: sent, not, sent, not
    assert [r["bytes_downloaded"] for r in state.history[1:]] == [0, 2 * 24, 0]
    assert nbytes(Broadcast(None, np.ones(10))) == 0


# ---- participation --------------------------------------------------------------------------
def test_computes_all_steps_every_client_but_only_the_sampled_upload():
    calls = []

    def watch(state, block, selected):
        calls.append(selected)

    protocol = toy(client_update=partial(client_update, fail=watch),
                   participation=Participation(computes="all", receives="all"))
    seen, callback = record_rounds()
    state = run(protocol, make_blocks(6), max_iter=3, clients_per_round=2, callback=callback)
    assert all(s["steps"] == 3 for s in state.client_states)
    assert calls.count(True) == 3 * 2 and calls.count(False) == 3 * 4
    assert all(len(info["uploads"]) == 2 for _, info in seen)


@pytest.mark.parametrize("dropped", ["offline", "upload_lost"])
def test_dropped_clients_lose_the_upload_and_compute_only_when_upload_lost(dropped):
    protocol = toy(participation=Participation(dropped=dropped))
    seen, callback = record_rounds()
    state = run(protocol, make_blocks(8), max_iter=30, clients_per_round=4, dropout=0.5,
                callback=callback, eval_every=0)
    n_failed = sum(r["n_failed"] for r in state.history)
    assert 0 < n_failed < 30 * 4
    assert sum(len(info["uploads"]) for _, info in seen) == 30 * 4 - n_failed
    steps = sum(s["steps"] for s in state.client_states)
    assert steps == (30 * 4 if dropped == "upload_lost" else 30 * 4 - n_failed)


def test_server_update_runs_without_uploads_only_when_asked():
    def drop(state, block, selected):
        raise ClientDropout

    for mode, calls in (("on_uploads", 0), ("every_round", 3)):
        protocol = toy(client_update=partial(client_update, fail=drop),
                       participation=Participation(server_update=mode))
        state = run(protocol, make_blocks(4), max_iter=3, clients_per_round=2)
        assert state.server_state["calls"] == calls
        assert all(r["n_failed"] == 2 for r in state.history)  # simulated: no error


def test_participation_rejects_unknown_modes():
    with pytest.raises(ValueError, match="Participation.computes"):
        Participation(computes="some")


# ---- after_round, tol, callback ---------------------------------------------------------------
def test_after_round_sees_the_evaluated_record_changes_the_broadcast_and_stops():
    seen_by_hook = []

    def after_round(server_state, broadcast, record):
        seen_by_hook.append(dict(record))
        record["note"] = record["round"] * 10
        shifted = {"x": broadcast["x"] + 100.0}  # every client must see the changed broadcast
        return server_state, shifted, record["round"] == 3

    seen, callback = record_rounds()
    state = run(toy(after_round=after_round), make_blocks(4), max_iter=10, callback=callback)
    assert state.n_rounds == 3 and len(state.history) == 3
    assert all("objective" in r for r in seen_by_hook)  # called after the evaluation
    assert [r["note"] for r in state.history] == [10, 20, 30]
    assert seen[-1][1]["record"]["note"] == 30  # the callback sees the hook's record
    np.testing.assert_allclose(state.broadcast["x"], state.server_state["x"] + 100.0)
    # round 2 started from the shifted broadcast
    x2 = state.client_states[0]["x"]
    assert np.all(x2 > 40)


def test_tol_stops_when_the_objective_stalls_and_callback_can_stop():
    blocks = make_blocks(4)
    state = run(toy(client_update=partial(client_update, noise=0.0)), blocks, max_iter=200,
                tol=1e-6)
    assert 2 < state.n_rounds < 200
    a, b = state.history[-2]["objective"], state.history[-1]["objective"]
    assert abs(a - b) <= 1e-6 * abs(a)
    stopped = run(toy(), blocks, max_iter=50, callback=lambda k, info: k == 4)
    assert stopped.n_rounds == 4


def test_a_diverging_objective_raises():
    def explode(server_state, sums):
        return {"objective": float("inf")}

    with pytest.raises(FloatingPointError, match="round 1"):
        run(toy(combine_metrics=explode), make_blocks(3), max_iter=3)


# ---- failure policy ---------------------------------------------------------------------------
def crash_client(target, exc_type=MemoryError):
    def fail(state, block, selected):
        if block.values.size == 5 + target:  # the block of client `target`
            raise exc_type("boom")
    return fail


def test_an_exception_in_client_code_raises_with_the_client_and_round():
    protocol = toy(client_update=partial(client_update, fail=crash_client(2)))
    with pytest.raises(ClientError, match=r"Client 2 failed in client_update \(round 1\)") as e:
        run(protocol, make_blocks(5), max_iter=3, n_jobs=2)
    assert (e.value.client, e.value.round) == (2, 1)
    assert isinstance(e.value.__cause__, MemoryError)


def test_the_lowest_failing_client_is_reported_whatever_n_jobs():
    def fail(state, block, selected):
        if block.values.size in (5 + 1, 5 + 4):
            raise RuntimeError("bug")

    for n_jobs in (1, 2):
        with pytest.raises(ClientError, match="Client 1 failed"):
            run(toy(client_update=partial(client_update, fail=fail)), make_blocks(6),
                n_jobs=n_jobs)


def test_skip_keeps_the_old_state_counts_and_warns_once():
    protocol = toy(client_update=partial(client_update, fail=crash_client(2)))
    with pytest.warns(ClientFailureWarning, match="Client 2") as caught:
        state = run(protocol, make_blocks(5), max_iter=4, on_client_error="skip")
    assert len([w for w in caught if w.category is ClientFailureWarning]) == 1
    assert [r["n_failed"] for r in state.history] == [1, 1, 1, 1]
    assert state.client_states[2]["steps"] == 0  # never updated: its initial state
    assert all(s["steps"] == 4 for c, s in enumerate(state.client_states) if c != 2)


def test_skip_raises_when_every_sampled_client_failed():
    def always(state, block, selected):
        raise ValueError("down")

    with pytest.warns(ClientFailureWarning), pytest.raises(FederationError, match="round 1"):
        run(toy(client_update=partial(client_update, fail=always)), make_blocks(4),
            on_client_error="skip")


def test_client_dropout_is_a_simulated_failure():
    protocol = toy(client_update=partial(client_update, fail=crash_client(1, ClientDropout)))
    state = run(protocol, make_blocks(4), max_iter=3)  # no error, no warning
    assert [r["n_failed"] for r in state.history] == [1, 1, 1]
    assert state.client_states[1]["steps"] == 0


def test_a_failing_prepare_phase_takes_the_client_out_of_the_round():
    def prepare(state, block, broadcast, rng, selected):
        if block.values.size == 5 + 0:
            raise ClientDropout
        return state, {"n": np.array([block.nnz])}

    def server_prepare(server_state, stats, round_index):
        return server_state, {"x": server_state["x"], "senders": sorted(stats)}

    seen, callback = record_rounds()
    protocol = toy(client_prepare=prepare, server_prepare=server_prepare)
    state = run(protocol, make_blocks(3), max_iter=2, callback=callback)
    assert all(sorted(info["uploads"]) == [1, 2] for _, info in seen)
    assert all(sorted(info["stats"]) == [1, 2] for _, info in seen)
    assert [r["n_failed"] for r in state.history] == [1, 1]
    # the prepare phase draws from its own stream
    assert _PREPARE_CLIENT != _UPDATE_CLIENT


def test_a_failure_during_initialization_or_metrics_always_raises():
    def bad_init(block, broadcast, rng):
        raise KeyError("no data")

    with pytest.raises(ClientError, match="Client 0 failed in init_client"):
        run(toy(init_client=bad_init), make_blocks(2), on_client_error="skip")

    def bad_metrics(state, block, broadcast):
        raise ZeroDivisionError

    with pytest.raises(ClientError, match=r"client_metrics \(round 1\)"):
        run(toy(client_metrics=bad_metrics), make_blocks(2), on_client_error="skip")


def test_unknown_failure_policy_is_rejected():
    with pytest.raises(ValueError, match="on_client_error"):
        run(toy(), make_blocks(2), on_client_error="ignore")


# ---- the transport seam -----------------------------------------------------------------------
class WireTransport(Transport):
    """A stand-in for a remote transport: each client's block and state live in a private
    'process' the engine cannot see, and everything crossing the wire is pickled."""

    def __init__(self, blocks):
        self._clients = [{"block": b, "state": None} for b in blocks]
        self.calls, self.wire_bytes = [], 0

    @property
    def n_clients(self):
        return len(self._clients)

    @contextmanager
    def session(self, protocol):
        self.protocol = protocol
        yield self

    def _send(self, obj):
        data = pickle.dumps(obj)
        self.wire_bytes += len(data)
        return pickle.loads(data)

    def run(self, phase, clients, broadcast, *, stream=None, selected=None, round_number=None):
        self.calls.append((phase, list(clients), round_number))
        fn = getattr(self.protocol, phase)
        messages, failures = {}, {}
        for c in reversed(clients):  # any order: the engine must not depend on it
            node, received = self._clients[c], self._send(broadcast)
            if phase == "client_metrics":
                messages[c] = self._send(fn(node["state"], node["block"], received))
                continue
            rng = client_generator(stream, c)
            if phase == "init_client":
                node["state"], msg = fn(node["block"], received, rng)
            else:
                node["state"], msg = fn(node["state"], node["block"], received, rng,
                                        selected is None or c in selected)
            messages[c] = self._send(msg)
        return PhaseResult(dict(sorted(messages.items())), failures)


def test_a_transport_gives_the_local_fit_without_exposing_client_states():
    blocks = make_blocks(6)
    local = run(toy(), blocks, max_iter=4, clients_per_round=3, dropout=0.2)
    wire = WireTransport(blocks)
    remote = run(toy(), wire, max_iter=4, clients_per_round=3, dropout=0.2)
    assert strip(remote.history) == strip(local.history)
    np.testing.assert_array_equal(remote.server_state["x"], local.server_state["x"])
    assert remote.client_states is None  # the server never holds them
    for node, state in zip(wire._clients, local.client_states):
        np.testing.assert_array_equal(node["state"]["x"], state["x"])
    phases = [p for p, _, _ in wire.calls]
    assert phases[0] == "init_client" and phases.count("client_update") == 4
    assert [r for p, _, r in wire.calls if p == "client_update"] == [1, 2, 3, 4]
    assert wire.wire_bytes > 0
    assert evaluate(toy(), remote, wire) == {"objective": remote.history[-1]["objective"]}


def test_local_transport_keeps_old_states_of_failed_clients():
    blocks = make_blocks(3)
    transport = LocalTransport(blocks)
    protocol = toy(client_update=partial(client_update, fail=crash_client(1, RuntimeError)))
    with transport.session(protocol):
        init = transport.run("init_client", [0, 1, 2], {"x": np.zeros(3)}, stream=(0, 0))
        assert sorted(init.messages) == [0, 1, 2] and not init.failures
        before = transport.client_states[1]
        result = transport.run("client_update", [0, 1, 2], {"x": np.ones(3)},
                               stream=(0, _UPDATE_CLIENT, 0), selected={0})
    assert list(result.messages) == [0, 2] and list(result.failures) == [1]
    assert result.messages[2] is None  # computed, not selected: no upload
    assert isinstance(result.failures[1], RuntimeError)
    assert transport.client_states[1] is before


def test_solver_params_are_declared_defaults_updated_and_checked():
    from numbers import Real

    from sklearn.utils._param_validation import Interval, InvalidParameterError

    from sklearn_fedmf.engine._fit import FederatedEstimator, resolve_solver_params

    class Toy(FederatedEstimator):
        _solver_params = {"step": (0.5, [Interval(Real, 0, None, closed="neither")]),
                          "mode": ("paper", [str])}

        def __init__(self, solver_params=None):
            self.solver_params = solver_params

        _check_fit_data = _make_protocol = _collect = None

    assert resolve_solver_params(Toy()) == {"step": 0.5, "mode": "paper"}
    assert resolve_solver_params(Toy({"step": 2.0})) == {"step": 2.0, "mode": "paper"}
    with pytest.raises(ValueError, match="no key 'stepp'; its keys are mode, step"):
        resolve_solver_params(Toy({"stepp": 2.0}))
    with pytest.raises(InvalidParameterError, match="Toy.solver_params"):
        resolve_solver_params(Toy({"step": -1.0}))
