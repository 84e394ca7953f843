"""FedMAvg's batched client phases (one compiled call per client group, lazy uploads)
give the per-client federation: same states, same uploads (rebuilt dense), same server update,
same bytes; and a grouped fit is the per-client fit."""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import FedMAvg
from sklearn_fedmf.completion._fedmavg._fedmavg import make_protocol
from sklearn_fedmf.completion._fedmavg._fedmavg_round import RoundRule
from sklearn_fedmf.engine._client_data import split_clients
from sklearn_fedmf.engine._federation import nbytes
from sklearn_fedmf.engine._fit import route_solver_params
from sklearn_fedmf.engine._groups import LazyRows, make_groups
from sklearn_fedmf.engine._transport import client_generator

RTOL = 1e-12


def ratings(n_rows=90, n_items=25, n_clients=40, seed=0):
    """Ratings of users with 0-12 items each (rows 0 and 5 empty), rows spread over clients of
    1-4 rows."""
    rng = np.random.default_rng(seed)
    X = sp.random(n_rows, n_items, density=0.15, random_state=seed, format="csr")
    X.data = rng.normal(size=X.nnz)
    X = sp.csr_matrix(X.multiply(np.isin(np.arange(n_rows), [0, 5], invert=True)[:, None]))
    X.sort_indices()
    codes = rng.permutation(np.arange(n_rows) % n_clients)
    return X, codes, n_clients


def assert_close(actual, desired):
    """Equal to ``RTOL`` relative to the array's scale."""
    actual, desired = np.asarray(actual), np.asarray(desired)
    assert actual.shape == desired.shape
    np.testing.assert_allclose(actual, desired, rtol=RTOL,
                               atol=RTOL * max(np.abs(desired).max(initial=0.0), 1e-300))


def protocol_of(n_items, n_clients, *, variant="wang_chang", participation="pcc",
                w_step="global", biased=True, positive=False, l1_ratio=0.0, rank=3):
    return make_protocol(
        n_items=n_items, n_clients=n_clients, n_components=rank, rule=RoundRule(
            variant=variant, local_iter_u=4, local_iter_v=None if variant == "wang_chang" else 3,
            q_hat=5, participation=participation, aggregation="weighted", c_factor=0.51,
            d_factor=2.0, w_step=w_step if variant == "wang_chang" else "local"),
        client_weights="entries",
        alpha_u=0.3, alpha_v=0.5, l1_ratio=l1_ratio, positive=positive, init_scale=1.0,
        biased=biased)


def run_phase(protocol, phase, blocks, groups, states, group_states, broadcast, stream, active,
              selected):
    """``phase`` per client (on the active ones) and batched per group: both results."""
    fn, batched = getattr(protocol, phase), getattr(protocol.batched, phase)
    messages, new_states = {}, list(states)
    for c in np.flatnonzero(active):
        new_states[c], messages[c] = fn(states[c], blocks[c], broadcast,
                                        client_generator(stream, c), bool(selected[c]))
    batched_messages, new_group_states = {}, []
    for group, gs in zip(groups, group_states):
        a, b = group.start, group.stop
        new, msgs = batched(gs, group, broadcast, stream, active[a:b], selected[a:b] & active[a:b])
        new_group_states.append(new)
        batched_messages.update(msgs)
    assert sorted(batched_messages) == sorted(c for c, m in messages.items() if m is not None)
    for group, gs in zip(groups, new_group_states):
        for i in range(group.n_clients):
            c = group.start + i
            got = protocol.batched.client_state(gs, group, i)
            assert_close(got["U"], new_states[c]["U"])
            if not active[c]:  # an inactive client's state is exactly unchanged
                np.testing.assert_array_equal(got["U"], states[c]["U"])
    return new_states, messages, new_group_states, batched_messages


def assert_same_uploads(batched, dense, key):
    for c, message in batched.items():
        assert nbytes(message) == nbytes(dense[c])
        assert_close(np.asarray(message[key]), dense[c][key])


@pytest.mark.parametrize("variant, participation, w_step, biased, positive, l1_ratio", [
    ("wang_chang", "pcc", "global", True, False, 0.0),
    ("wang_chang", "pcp", "global", False, False, 0.0),
    ("wang_chang", "pcc", "guarded", False, True, 0.0),
    ("wang_chang", "pcp", "local", False, True, 0.0),
    ("wang_chang", "pcc", "local", True, False, 0.2),  # l1: uploads computed dense
    ("fedmc_admm", "pcc", "local", True, False, 0.0),
    ("fedmc_admm", "pcp", "local", False, True, 0.0),
])
def test_batched_phases_equal_per_client(variant, participation, w_step, biased, positive,
                                         l1_ratio):
    X, codes, n = ratings()
    protocol = protocol_of(X.shape[1], n, variant=variant, participation=participation,
                           w_step=w_step, biased=biased, positive=positive, l1_ratio=l1_ratio)
    blocks, groups = split_clients(X, codes, n), make_groups(X, codes, n, n_groups=3)
    server, broadcast = protocol.init_server(np.random.default_rng(1))
    init = [protocol.init_client(block, broadcast, client_generator((7, 0), c))
            for c, block in enumerate(blocks)]
    states = [s for s, _ in init]
    group_states, init_uploads = [], {}
    for group in groups:
        gs, ups = protocol.batched.init_client(group, broadcast, (7, 0))
        group_states.append(gs)
        init_uploads.update(ups)
    assert_same_uploads(init_uploads, dict(enumerate(u for _, u in init)), "size")
    server, broadcast = protocol.server_init_uploads(server, dict(enumerate(u for _, u in init)))
    rng = np.random.default_rng(2)
    for k in range(3):
        selected = rng.random(n) < 0.4
        active = np.ones(n, bool) if participation == "pcc" else selected.copy()
        active[rng.integers(n)] = False  # a dropped client
        first = broadcast
        if protocol.client_prepare is not None:
            states, stats, group_states, batched_stats = run_phase(
                protocol, "client_prepare", blocks, groups, states, group_states, broadcast,
                (7, 5, k), active, selected)
            assert_same_uploads(batched_stats, stats, "gram")
            server, broadcast = protocol.server_prepare(server, stats, k)
        states, uploads, group_states, batched_uploads = run_phase(
            protocol, "client_update", blocks, groups, states, group_states, broadcast,
            (7, 1, k), active, selected)
        assert_same_uploads(batched_uploads, uploads, "W")
        if l1_ratio == 0.0:  # the unrated rows stay implicit
            assert all(isinstance(u["W"], LazyRows) for u in batched_uploads.values())
            assert all(u["W"].rows.size < X.shape[1] for u in batched_uploads.values())
        dense = {c: uploads[c] for c in sorted(batched_uploads)}
        counts = {c: 1 + c % 2 for c in dense}
        server, broadcast = protocol.server_update(server, dense, k, counts=counts)
        implicit, _ = protocol.server_update(server, batched_uploads, k, counts=counts)
        assert_close(implicit["Vt"], server["Vt"])
        # the metrics sum over a group's clients
        for group, gs in zip(groups, group_states):
            sums = protocol.batched.client_metrics(gs, group, broadcast)
            per_client = [protocol.client_metrics(states[c], blocks[c], broadcast)
                          for c in range(group.start, group.stop)]
            for key, value in sums.items():
                assert value == pytest.approx(sum(m[key] for m in per_client), rel=1e-12)
        assert first is not broadcast


def test_failed_clients_in_batched_group_state():
    """The transport's per-client fallback: a group state with per-client states put in
    gives those states back, between the prepare and the update phase too."""
    X, codes, n = ratings()
    protocol = protocol_of(X.shape[1], n)
    group = make_groups(X, codes, n, n_groups=1)[0]
    server, broadcast = protocol.init_server(np.random.default_rng(1))
    gs, ups = protocol.batched.init_client(group, broadcast, (7, 0))
    server, broadcast = protocol.server_init_uploads(server, ups)
    block = group.block(3)
    state, _ = protocol.client_prepare(protocol.batched.client_state(gs, group, 3), block,
                                       broadcast, client_generator((7, 5, 0), 3), True)
    merged = protocol.batched.with_client_states(gs, group, {3: state})
    got = protocol.batched.client_state(merged, group, 3)
    assert got["Vt"] is broadcast["Vt"] and got["omega"] == state["omega"]
    np.testing.assert_array_equal(got["U"], state["U"])
    assert "Vt" not in protocol.batched.client_state(merged, group, 4)
    np.testing.assert_array_equal(gs["U"], protocol.batched.init_client(group, broadcast,
                                                                        (7, 0))[0]["U"])


@pytest.mark.parametrize("params, rows_per_client", [
    (dict(), 1),
    (dict(participation="pcp", biased=False, sampling="weighted"), 1),
    # (the restatement's d_i = 5 lambda_max(U_i^T U_i) leaves the ridge out: a small client
    # with a large alpha_v diverges, on either path)
    (dict(variant="fedmc_admm", positive=True, biased=False, alpha_u=0.05, alpha_v=0.05), 4),
    (dict(w_step="guarded", client_weights="rows"), 1),
])
def test_grouped_fit_equals_per_client_fit(params, rows_per_client, monkeypatch):
    X, _, _ = ratings(n_rows=120, n_items=30, seed=5)
    clients = np.arange(X.shape[0]) // rows_per_client
    kw = dict(n_components=2, max_iter=4, clients_per_round=0.3, dropout=0.2, random_state=0,
              alpha_u=0.5, alpha_v=0.5, n_jobs=2)
    kw = route_solver_params(FedMAvg, {**kw, **params})
    monkeypatch.setattr("sklearn_fedmf.engine._dispatch.MIN_PARALLEL_WORK", 0)
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 10**9)
    ref = FedMAvg(**kw).fit(X, clients=clients)
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    monkeypatch.setattr("sklearn_fedmf.engine._fit.N_GROUPS", 5)
    uploads = []
    got = FedMAvg(**kw, callback=lambda k, info: uploads.append(info["uploads"])).fit(
        X, clients=clients)
    assert any(isinstance(u["W"], LazyRows) for up in uploads for u in up.values())
    assert_close(got.components_, ref.components_)
    assert_close(got.user_factors_, ref.user_factors_)
    for a, b in zip(got.history_, ref.history_):
        for key in ("bytes_uploaded", "bytes_downloaded", "n_failed"):
            assert a[key] == b[key]
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-12)


def test_grouped_warm_start_continues_like_per_client(monkeypatch):
    X, _, _ = ratings(n_rows=120, n_items=30, seed=6)
    clients = np.arange(X.shape[0])
    kw = dict(n_components=2, max_iter=2, clients_per_round=0.3, random_state=0, alpha_u=0.5,
              alpha_v=0.5, warm_start=True)
    fits = []
    for min_clients in (10**9, 1):
        monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", min_clients)
        model = FedMAvg(**kw).fit(X, clients=clients)
        fits.append(model.fit(X, clients=clients))
    ref, got = fits
    assert got.n_iter_ == ref.n_iter_ == 4
    assert_close(got.components_, ref.components_)
    assert_close(got.user_factors_, ref.user_factors_)


def test_fedpalm_has_no_batched_phases():
    """FedPALM interleaves U and W steps on each client's copy: it runs client by client."""
    assert protocol_of(25, 40, variant="fedpalm", biased=False).batched is None
    assert protocol_of(25, 40).batched is not None


def test_positive_steps_from_a_signed_v_are_sent_dense():
    """Under ``positive`` an unrated row of a signed ``V`` is clipped, not scaled: such an
    upload is computed dense, and still equals the per-client one."""
    X, codes, n = ratings(seed=7)
    protocol = protocol_of(X.shape[1], n, participation="pcp", w_step="local", biased=False,
                           positive=True)
    blocks, groups = split_clients(X, codes, n), make_groups(X, codes, n, n_groups=2)
    server, broadcast = protocol.init_server(np.random.default_rng(1))
    init = [protocol.init_client(b, broadcast, client_generator((7, 0), c))
            for c, b in enumerate(blocks)]
    server, broadcast = protocol.server_init_uploads(server, dict(enumerate(u for _, u in init)))
    broadcast = dict(broadcast, Vt=broadcast["Vt"] - 0.5)
    group_states = [protocol.batched.init_client(g, broadcast, (7, 0))[0] for g in groups]
    selected = np.random.default_rng(3).random(n) < 0.5
    _, uploads, _, batched = run_phase(protocol, "client_update", blocks, groups,
                                       [s for s, _ in init], group_states, broadcast, (7, 1, 0),
                                       selected, selected)
    assert batched and not any(isinstance(u["W"], LazyRows) for u in batched.values())
    assert_same_uploads(batched, uploads, "W")
