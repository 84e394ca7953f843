"""FedMC-ADMM's batched client phases (``_fedmc_admm_batched``): the lazy client copies give
the per-client simulation's iterates, messages and bytes; the memory check fires before a fit
whose per-client state cannot fit."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import FedMCADMM
from sklearn_fedmf.completion._fedmc_admm import _fedmc_admm
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_batched import (
    ClientUpload,
    LazyFactor,
    _Pool,
    _reserve,
)
from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_protocol import client_update, make_protocol
from sklearn_fedmf.engine._client_data import split_clients
from sklearn_fedmf.engine._federation import initialize_federation, nbytes, run_federation
from sklearn_fedmf.engine._groups import GroupedTransport, GroupStates, make_groups
from sklearn_fedmf.exceptions import ClientFailureWarning

N_ROWS, N_ITEMS, N_CLIENTS = 40, 25, 30


def ratings(seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(N_ROWS, N_ITEMS, density=0.25, random_state=seed, format="csr")
    X.data = rng.normal(size=X.nnz)
    X.sum_duplicates()
    X.has_canonical_format = True
    # one row per client, except the last client (11 rows): both shapes of client
    codes = np.minimum(np.arange(N_ROWS), N_CLIENTS - 1)
    return X, codes


def protocol(biased, w_update, **kw):
    params = dict(n_items=N_ITEMS, n_clients=N_CLIENTS, n_components=3, beta=0.05,
                  local_iter=4, alpha_u=0.1, alpha_v=0.1, l1_ratio=0.0, positive=False,
                  w_update=w_update, init_scale=1.0, dual_init="paper", biased=biased)
    return make_protocol(**{**params, **kw})


def fit(proto, clients, seen=None, **kw):
    def callback(k, info):
        if seen is not None:
            seen[k] = {c: {key: np.asarray(v) for key, v in u.items()}
                       for c, u in info["uploads"].items()}

    state, init_bytes = initialize_federation(proto, clients, entropy=3)
    kw = {"max_iter": 12, "clients_per_round": 7, "dropout": 0.2, **kw}
    return run_federation(proto, clients, entropy=3, state=state, init_bytes=init_bytes,
                          callback=callback, **kw)


def assert_family_close(ref, got, rtol=1e-12):
    """Equal to ``rtol`` relative to the largest entry of the family (entries that are
    rounding noise around 0 in one run are exactly 0 in the other)."""
    scale = max(np.abs(a).max() for a in ref)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("w_update", ["linearized", "exact"])
@pytest.mark.parametrize("biased", [False, True])
def test_grouped_federation_equals_per_client(biased, w_update):
    X, codes = ratings()
    proto = protocol(biased, w_update)
    seen_ref, seen_got = {}, {}
    ref = fit(proto, split_clients(X, codes, N_CLIENTS), seen_ref)
    got = fit(proto, GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=3)),
              seen_got)
    assert isinstance(got.client_states, GroupStates)
    np.testing.assert_allclose(got.server_state["Vt"], ref.server_state["Vt"], rtol=1e-12)
    for key in ("U", "Wt", "Yt"):
        assert_family_close([s[key] for s in ref.client_states],
                            [s[key] for s in got.client_states])
    for a, b in zip(ref.history, got.history):
        assert (a["bytes_uploaded"], a["bytes_downloaded"], a["n_failed"]) == (
            b["bytes_uploaded"], b["bytes_downloaded"], b["n_failed"])
        assert b["objective"] == pytest.approx(a["objective"], rel=1e-12)
        assert b["consensus_gap"] == pytest.approx(a["consensus_gap"], rel=1e-10)
    # the messages are the paper's dense (W_i, Y_i), client by client
    assert sum(map(len, seen_ref.values())) > 30
    for k, uploads in seen_ref.items():
        assert uploads.keys() == seen_got[k].keys()
        for c, message in uploads.items():
            assert_family_close([message["W"], message["Y"]],
                                [seen_got[k][c]["W"], seen_got[k][c]["Y"]])


def test_grouped_federation_zero_duals_l1_nonnegative():
    X, codes = ratings(3)
    X.data = np.abs(X.data)
    proto = protocol(False, "linearized", dual_init="zeros", positive=True, l1_ratio=0.5)
    ref = fit(proto, split_clients(X, codes, N_CLIENTS))
    got = fit(proto, GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=4)))
    np.testing.assert_allclose(got.server_state["Vt"], ref.server_state["Vt"], rtol=1e-12,
                               atol=1e-14)
    for key in ("U", "Wt", "Yt"):
        assert_family_close([s[key] for s in ref.client_states],
                            [s[key] for s in got.client_states])


@pytest.mark.parametrize("w_update", ["linearized", "exact"])
def test_batched_update_equals_per_client_function(w_update):
    X, codes = ratings(1)
    proto = protocol(True, w_update)
    transport = GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=2))
    state = fit(proto, transport)
    batched = proto.batched
    group, gs = transport.groups[1], state.client_states.group_states[1]
    before = [batched.client_state(gs, group, i) for i in range(group.n_clients)]
    active = np.zeros(group.n_clients, dtype=bool)
    active[::2] = True
    selected = active.copy()
    selected[0] = False  # computes without uploading
    new, uploads = batched.client_update(gs, group, state.broadcast, (3, 1, 99), active,
                                         selected)
    assert sorted(uploads) == [group.start + i for i in np.flatnonzero(selected)]
    sent = {c: {key: np.asarray(v) for key, v in u.items()} for c, u in uploads.items()}
    if w_update == "exact":
        # the input is unchanged: the same update again from it gives the same result and
        # leaves the first one's messages untouched
        again, uploads_again = batched.client_update(gs, group, state.broadcast, (3, 1, 99),
                                                     active, selected)
        for i in range(group.n_clients):
            for key in ("U", "Wt", "Yt"):
                np.testing.assert_array_equal(batched.client_state(again, group, i)[key],
                                              batched.client_state(new, group, i)[key])
            np.testing.assert_array_equal(batched.client_state(gs, group, i)["Wt"],
                                          before[i]["Wt"])
        for c, u in uploads.items():
            for key in ("W", "Y"):
                np.testing.assert_array_equal(np.asarray(u[key]), sent[c][key])
                np.testing.assert_array_equal(np.asarray(uploads_again[c][key]), sent[c][key])
    else:  # the linearized round writes over the clients' rows: no second array
        assert all(a is b for a, b in zip(new["wy"].arrays, gs["wy"].arrays))
    for u in uploads.values():
        assert isinstance(u, ClientUpload) and set(u) == {"W", "Y"}
        assert not u["W"].values.flags.writeable  # it shares or gathers the state's rows
    for i in range(group.n_clients):
        after = batched.client_state(new, group, i)
        if not active[i]:
            for key in ("U", "Wt", "Yt"):
                np.testing.assert_array_equal(after[key], before[i][key])
            continue
        ref, message = client_update(before[i], group.block(i), state.broadcast, None, True,
                                     **proto.client_update.keywords)
        for key in ("U", "Wt", "Yt"):
            assert_family_close([ref[key]], [after[key]])
        if selected[i]:
            upload = uploads[group.start + i]
            assert isinstance(upload["W"], LazyFactor)
            assert nbytes(upload) == nbytes(message)  # counted as the dense message
            assert_family_close([message["W"], message["Y"]],
                                [sent[group.start + i]["W"], sent[group.start + i]["Y"]])


def test_full_pool_is_compacted_in_place_and_its_input_keeps_its_values():
    X, codes = ratings(4)
    proto = protocol(True, "exact")  # (the exact round appends its rows to the pools)
    transport = GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=2))
    state = fit(proto, transport, max_iter=1)
    batched, group = proto.batched, transport.groups[0]
    everyone = np.ones(group.n_clients, dtype=bool)
    gs = state.client_states.group_states[0]

    def states_of(gs):
        return [batched.client_state(gs, group, i) for i in range(group.n_clients)]

    ref, pool = states_of(gs), gs["wy"]
    for k in range(4):  # every client appends its rows each round: the pool fills at once
        before = states_of(gs)
        new, _ = batched.client_update(gs, group, state.broadcast, (3, 2, k), everyone,
                                       everyone)
        assert new["wy"] is pool  # compacted in place, never a second pool
        for a, b in zip(before, states_of(gs)):  # the input's values, under a new layout
            for key in ("U", "Wt", "Yt"):
                np.testing.assert_array_equal(b[key], a[key])
        gs = new
        ref = [client_update(s, group.block(i), state.broadcast, None, True,
                             **proto.client_update.keywords)[0] for i, s in enumerate(ref)]
        for a, b in zip(ref, states_of(gs)):
            for key in ("U", "Wt", "Yt"):
                assert_family_close([a[key]], [b[key]])
    assert len(pool.arrays[0]) <= 2 * int(np.diff(gs["e_ptr"]).sum()) + 16


def test_pool_of_growing_segments_is_not_compacted_at_every_call():
    # The coefficients' pool: a client that takes part rewrites its whole segment past the
    # tail, one entry longer. Compacting whenever the live entries fit would, once they near
    # the pool's size, move them all at nearly every call; the pool must instead grow, so that
    # the entries moved stay within a constant times those written.
    rng = np.random.default_rng(0)
    n_clients = 60
    sizes = np.ones(n_clients, dtype=np.int64)
    values = np.arange(n_clients, dtype=np.float64)  # client c's entries all hold c
    pool = _Pool.holding([values])
    at, used = np.arange(n_clients, dtype=np.int64), n_clients
    moved = written = 0
    for _ in range(300):
        act = np.sort(rng.choice(n_clients, 6, replace=False))
        n = int((sizes[act] + 1).sum())
        new, base, new_at = _reserve(pool, used, at, sizes, n, act)
        if new is not pool:  # a new pool took every other client's segment
            moved += int(sizes.sum() - sizes[act].sum())
        elif base < used:  # compacted in place: every live entry moved down
            moved += int(sizes.sum())
        old = [pool.arrays[0][at[c]:at[c] + sizes[c]].copy() for c in act]
        offsets = base + np.concatenate([[0], np.cumsum(sizes[act] + 1)])
        for c, o, seg in zip(act, offsets, old):
            new.arrays[0][o:o + seg.size + 1] = np.append(seg, c)
        new_at[act] = offsets[:-1]
        sizes[act] += 1
        new.tail = base + n
        pool, used, at = new, new.tail, new_at
        written += n
    for c in range(n_clients):  # every client's segment kept its values
        np.testing.assert_array_equal(pool.arrays[0][at[c]:at[c] + sizes[c]], c)
    assert moved <= 2 * written


def test_with_client_states_holds_a_dense_state_exactly():
    X, codes = ratings(2)
    proto = protocol(False, "linearized")
    transport = GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=2))
    state = fit(proto, transport)
    batched, group = proto.batched, transport.groups[0]
    gs = state.client_states.group_states[0]
    rng = np.random.default_rng(0)
    dense = {"U": rng.normal(size=(1, 3)), "Wt": rng.normal(size=(N_ITEMS, 3)),
             "Yt": rng.normal(size=(N_ITEMS, 3))}
    new = batched.with_client_states(gs, group, {1: dense})
    for key in dense:
        np.testing.assert_array_equal(batched.client_state(new, group, 1)[key], dense[key])
    # and it goes on like the per-client function from that state
    active = np.zeros(group.n_clients, dtype=bool)
    active[1] = True
    out, _ = batched.client_update(new, group, state.broadcast, (3, 1, 5), active, active)
    ref, _ = client_update(dense, group.block(1), state.broadcast, None, True,
                           **proto.client_update.keywords)
    for key in dense:
        assert_family_close([ref[key]], [batched.client_state(out, group, 1)[key]])


def test_estimator_one_client_per_user_grouped_equals_per_client(monkeypatch):
    rng = np.random.default_rng(0)
    M = rng.normal(size=(60, 2)) @ rng.normal(size=(2, 30)) + 3.0
    X = np.where(rng.random(M.shape) < 0.3, M, np.nan)
    X[5] = np.nan
    X[5, 3] = 2.0  # a user with a single rating
    params = dict(n_components=2, max_iter=8, clients_per_round=0.3, random_state=0,
                  alpha_u=0.1, alpha_v=0.01, solver_params={"dropout": 0.2, "eval_every": 0})
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 10**9)
    ref = FedMCADMM(**params).fit(X, clients=np.arange(60))
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    got = FedMCADMM(**params).fit(X, clients=np.arange(60))
    assert isinstance(got._federation.client_states, GroupStates)
    np.testing.assert_allclose(got.components_, ref.components_, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(got.user_factors_, ref.user_factors_, rtol=1e-12, atol=1e-13)
    assert [r["bytes_uploaded"] for r in got.history_] == [
        r["bytes_uploaded"] for r in ref.history_]
    assert [r["n_failed"] for r in got.history_] == [r["n_failed"] for r in ref.history_]
    # a warm start continues the implicit state
    ref.set_params(warm_start=True, max_iter=3).fit(X, clients=np.arange(60))
    got.set_params(warm_start=True, max_iter=3).fit(X, clients=np.arange(60))
    np.testing.assert_allclose(got.components_, ref.components_, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("min_clients", [1, 10**9])
def test_memory_error_before_the_fit_names_the_bytes(monkeypatch, min_clients):
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", min_clients)
    monkeypatch.setattr(_fedmc_admm, "_available_memory", lambda: 10_000)
    started = []
    monkeypatch.setattr("sklearn_fedmf.engine._fit.initialize_federation",
                        lambda *a, **k: started.append(1))
    X, _ = ratings()
    expected = _fedmc_admm.state_nbytes(
        n_clients=N_ROWS, n_items=N_ITEMS, n_factors=7, itemsize=8,
        grouped=min_clients == 1, nnz=X.nnz, max_iter=100)
    assert expected > 10_000
    with pytest.raises(MemoryError, match=rf"needs about .*\({expected} bytes\).*fewer "
                                          r"clients.*n_components.*float32"):
        FedMCADMM(random_state=0).fit(X, clients=np.arange(N_ROWS))
    assert not started
    # the dense state grows with the clients: 3 p n r numbers
    assert _fedmc_admm.state_nbytes(n_clients=6040, n_items=3706, n_factors=7, itemsize=8,
                                    grouped=False) == 3 * 6040 * 3706 * 7 * 8


def _state_bytes(obj):
    """Bytes of the numpy arrays in a (nested) state."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(map(_state_bytes, obj.values()))
    if isinstance(obj, (list, tuple)):
        return sum(map(_state_bytes, obj))
    return _state_bytes(getattr(obj, "arrays", ()))


@pytest.mark.parametrize("cache_rows", [True, False])
def test_memory_estimate_bounds_the_grouped_state(cache_rows):
    X, _ = ratings()
    held = {}
    for w_update in ("linearized", "exact"):
        proto = protocol(True, w_update, n_clients=N_ROWS, cache_rows=cache_rows)
        transport = GroupedTransport(make_groups(X, np.arange(N_ROWS), N_ROWS, n_groups=3))
        state = fit(proto, transport, max_iter=12, clients_per_round=N_ROWS, dropout=0.0)
        clients = sum(_state_bytes({k: v for k, v in gs.items() if k not in ("U", "V0")})
                      for gs in state.client_states.group_states)
        server, history = state.server_state, state.server_state["history"]
        held[w_update] = clients + _state_bytes(
            [server["store"], server["S"], server["C"], history.H, history.G])
        assert held[w_update] <= _fedmc_admm.state_nbytes(
            n_clients=N_ROWS, n_items=N_ITEMS, n_factors=5, itemsize=8, grouped=True,
            nnz=X.nnz, max_iter=12, exact=w_update == "exact", cache_rows=cache_rows)
    # the linearized round writes its rows in place; the exact one keeps room for a round
    assert held["linearized"] < held["exact"]


def test_weighted_regularization_runs_one_block_per_client(monkeypatch):
    # its per-row strengths are not in the batched phases: the fit keeps the per-client path
    assert protocol(True, "linearized", weighted=True).batched is None
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    X, _ = ratings()
    model = FedMCADMM(
        n_components=2, max_iter=2, regularization="weighted", random_state=0,
        solver_params={"eval_every": 0},
    ).fit(X, clients=np.arange(N_ROWS))
    assert not isinstance(model._federation.client_states, GroupStates)


def test_grouped_federation_with_a_failing_client_equals_per_client():
    # client 3 always raises: its group's batched call raises, the group's clients are re-run
    # one by one (dense messages and states amid the implicit ones), client 3 is skipped
    X, codes = ratings(4)
    proto = protocol(False, "linearized")
    rows_of_3 = np.flatnonzero(codes == 3)

    def failing(update):
        def client_update(state, block, *args, **kw):
            if np.isin(block.rows, rows_of_3).any():
                raise ValueError("client 3 fails")
            return update(state, block, *args, **kw)
        return client_update

    def failing_batched(update):
        def client_update(gs, group, broadcast, stream, active, selected):
            if group.start <= 3 < group.stop and active[3 - group.start]:
                raise ValueError("a client of this group fails")
            return update(gs, group, broadcast, stream, active, selected)
        return client_update

    proto = dataclasses.replace(
        proto, client_update=failing(proto.client_update),
        batched=dataclasses.replace(proto.batched,
                                    client_update=failing_batched(proto.batched.client_update)))
    seen_ref, seen_got = {}, {}
    with pytest.warns(ClientFailureWarning, match="Client 3"):
        ref = fit(proto, split_clients(X, codes, N_CLIENTS), seen_ref, on_client_error="skip",
                  clients_per_round=20, max_iter=6)
    with pytest.warns(ClientFailureWarning, match="Client 3"):
        got = fit(proto, GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=3)),
                  seen_got, on_client_error="skip", clients_per_round=20, max_iter=6)
    assert not any(3 in uploads for uploads in seen_got.values())
    # the re-run clients' dense messages reached the server's implicit store
    assert got.server_state["store"]["rd_len"].max() == N_ITEMS
    assert [r["n_failed"] for r in got.history] == [r["n_failed"] for r in ref.history]
    np.testing.assert_allclose(got.server_state["Vt"], ref.server_state["Vt"], rtol=1e-12)
    for key in ("U", "Wt", "Yt"):
        assert_family_close([s[key] for s in ref.client_states],
                            [s[key] for s in got.client_states])
    for k, uploads in seen_ref.items():
        assert uploads.keys() == seen_got[k].keys()
        for c, message in uploads.items():
            assert_family_close([message["W"], message["Y"]],
                                [seen_got[k][c]["W"], seen_got[k][c]["Y"]])


def test_best_round_snapshot_copies_the_pools_into_its_previous_buffers():
    # early stopping keeps a copy of the best round's states (engine._early_stopping): the
    # pools of client rows and of the server's terms are copied into the previous copy's
    # arrays (no second copy of every rating's rows at once), the data's layout is shared
    from sklearn_fedmf.engine._early_stopping import snapshot

    X, codes = ratings(1)
    proto = protocol(True, "linearized")
    transport = GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=2))
    state = fit(proto, transport, max_iter=2)
    live = (state.client_states.group_states[0], state.server_state["store"])
    first = snapshot(live)
    assert first[0]["E"] is live[0]["E"] and first[0]["loc"] is live[0]["loc"]
    for kept, now in zip(first, live):
        pool = "wy" if "wy" in now else "rd"
        for a, b in zip(kept[pool].arrays, now[pool].arrays):
            assert not np.shares_memory(a, b)
            np.testing.assert_array_equal(a, b)
        assert kept[pool].tail == now[pool].tail
    second = snapshot(live, first)
    for kept, again in zip(first, second):
        pool = "wy" if "wy" in kept else "rd"
        assert all(a is b for a, b in zip(again[pool].arrays, kept[pool].arrays))


@pytest.mark.parametrize("w_update", ["linearized", "exact"])
def test_replayed_combination_rows_are_the_combinations(w_update):
    """The values of a client's combinations on its explicit rows, made from the maps of
    the rounds it took part in (``_combination_rows``: the state without ``cache_rows``),
    are the ones the cached state holds, bit for bit, and its combinations ``sum_q coef[q]
    H[hist[q]]`` there, after rounds where every client took part several times (checked:
    each client has maps of at least 5 rounds)."""
    from sklearn_fedmf.completion._fedmc_admm._fedmc_admm_kernels import _combination_rows

    X, codes = ratings()
    proto = protocol(True, w_update, cache_rows=True)
    state = fit(proto, GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=3)),
                clients_per_round=N_CLIENTS, dropout=0.0, max_iter=6)
    history, beta = state.server_state["history"], 0.05
    checked = 0
    for gs in state.client_states.group_states:
        assert len(gs["wy"].arrays) == 4  # (W, Y and their combinations' values)
        for i in range(gs["e_ptr"].size - 1):
            e0, e1, h0, n = gs["e_ptr"][i], gs["e_ptr"][i + 1], gs["h_at"][i], gs["h_len"][i]
            hist, coef, maps = (a[h0:h0 + n] for a in gs["h"].arrays)
            assert n >= 6 and gs["from_v0"][i]
            E = gs["E"][e0:e1]
            if E.size == 0:  # (a client whose rows hold no rating)
                continue
            BW, BY = (np.empty((E.size, history.H.shape[2])) for _ in range(2))
            _combination_rows(E, hist, maps, gs["from_v0"][i], gs["V0"], history.H, BW, BY,
                              beta)
            w0 = gs["w_at"][i]
            for col, B in ((0, BW), (1, BY)):
                np.testing.assert_array_equal(B, gs["wy"].arrays[2 + col][w0:w0 + E.size])
                expected = history.combine(hist, coef[:, col], np.float64)[E]
                np.testing.assert_allclose(B, expected, rtol=1e-10,
                                           atol=1e-10 * max(np.abs(expected).max(), 1.0))
            checked += 1
    assert checked >= N_CLIENTS - 3


@pytest.mark.parametrize("w_update, dropout", [("linearized", 0.2), ("exact", 0.0)])
def test_made_combination_rows_give_the_cached_fit(w_update, dropout):
    """A state that makes its combinations' values from the maps (``cache_rows=False``)
    holds no float64 rows beside ``W_i``, ``Y_i`` and fits bit for bit as the cached one:
    the same history (losses, consensus), uploads and final states."""
    X, codes = ratings()
    runs = {}
    for cache_rows in (True, False):
        seen = {}
        proto = protocol(True, w_update, cache_rows=cache_rows)
        state = fit(proto, GroupedTransport(make_groups(X, codes, N_CLIENTS, n_groups=3)),
                    seen=seen, dropout=dropout, max_iter=8)
        assert all(len(gs["wy"].arrays) == (4 if cache_rows else 2)
                   for gs in state.client_states.group_states)
        runs[cache_rows] = state, seen
    (cached, seen_c), (made, seen_m) = runs[True], runs[False]
    def records(history):  # (all but the rounds' timings)
        return [{k: v for k, v in rec.items() if k != "seconds"} for rec in history]

    assert records(made.history) == records(cached.history)
    assert all("consensus_gap" in rec for rec in made.history)
    assert seen_m.keys() == seen_c.keys() and any(seen_c.values())
    for k in seen_c:
        for c in seen_c[k]:
            for key in seen_c[k][c]:
                np.testing.assert_array_equal(seen_m[k][c][key], seen_c[k][c][key])
    np.testing.assert_array_equal(made.server_state["Vt"], cached.server_state["Vt"])
    for gm, gc in zip(made.client_states.group_states, cached.client_states.group_states):
        np.testing.assert_array_equal(gm["U"], gc["U"])


def test_cache_rows_auto_rule_and_equal_fits(monkeypatch):
    """``solver_params["cache_rows"]="auto"`` holds the combinations' values when the state
    with them takes at most half of the available memory and makes them otherwise; either
    way (and forced either way) the one-client-per-user fit is the same, bit for bit."""
    X, _ = ratings()
    clients = np.arange(N_ROWS)
    need = _fedmc_admm.state_nbytes(
        n_clients=N_ROWS, n_items=N_ITEMS, n_factors=5, itemsize=8, grouped=True,
        nnz=X.nnz, max_iter=6, round_fraction=0.5, cache_rows=True)
    from sklearn_fedmf.engine import _fit

    monkeypatch.setattr(_fit, "GROUP_MIN_CLIENTS", 2)  # (40 clients: grouped)
    layouts, models = {}, {}
    for name, available, setting in (("auto, room", 2 * need, "auto"),
                                     ("auto, no room", 2 * need - 1, "auto"),
                                     ("forced on", 0, True), ("forced off", 10**15, False)):
        monkeypatch.setattr(_fedmc_admm, "_available_memory", lambda a=available: a)
        est = FedMCADMM(n_components=3, max_iter=6, clients_per_round=0.5, random_state=0,
                        early_stopping=False, solver_params={"cache_rows": setting})
        # (the memory check itself: enough memory for the state without the caches)
        monkeypatch.setattr(_fedmc_admm.FedMCADMM, "_check_memory", lambda *a: None)
        est.fit(X, clients=clients)
        groups = est._federation.client_states.group_states
        layouts[name] = {len(gs["wy"].arrays) for gs in groups}
        models[name] = (est.components_, est.history_)
    assert layouts == {"auto, room": {4}, "auto, no room": {2}, "forced on": {4},
                       "forced off": {2}}
    ref_V, ref_history = models["auto, room"]
    for V, history in models.values():
        np.testing.assert_array_equal(V, ref_V)
        assert [{k: v for k, v in rec.items() if k != "seconds"} for rec in history] == [
            {k: v for k, v in rec.items() if k != "seconds"} for rec in ref_history]
