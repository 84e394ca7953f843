"""The grouped simulation of many small clients (``_groups``): same federation as one block per
client, failures still name their client, lazy row messages count and rebuild dense."""

from functools import partial

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import FedMGS
from sklearn_fedmf.engine import _fit
from sklearn_fedmf.engine._client_data import split_clients
from sklearn_fedmf.engine._federation import (
    FederatedProtocol,
    Participation,
    initialize_federation,
    nbytes,
    run_federation,
)
from sklearn_fedmf.engine._groups import (
    BatchedPhases,
    GroupedTransport,
    GroupStates,
    LazyRows,
    make_groups,
    user_rows_state,
    with_user_rows,
)
from sklearn_fedmf.exceptions import ClientError, ClientFailureWarning

BAD = 99.0  # a rating that makes a client's code raise


# A toy protocol: per client one scalar factor per row; the server keeps a vector over items.
def init_server(rng, n_items):
    v = rng.random(n_items)
    return {"v": v}, v


def init_client(block, v, rng):
    return {"U": rng.random(block.n_rows)}, {"n": float(block.nnz)}


def client_update(state, block, v, rng, selected, step=0.1):
    X = block.X
    if X.nnz and X.data.max() == BAD:
        raise ValueError("bad rating")
    resid = X.data - state["U"][block.row_of_entry] * v[X.indices]
    U = state["U"] + step * np.bincount(block.row_of_entry, resid * v[X.indices],
                                        minlength=block.n_rows) + 0.01 * rng.random()
    if not selected:
        return {"U": U}, None
    g = np.bincount(X.indices, resid * U[block.row_of_entry], minlength=X.shape[1])
    return {"U": U}, {"g": g}


def server_update(state, uploads, k):
    v = state["v"] + 0.05 * sum(u["g"] for u in uploads.values()) if uploads else state["v"]
    return {"v": v}, v


def client_metrics(state, block, v):
    X = block.X
    resid = X.data - state["U"][block.row_of_entry] * v[X.indices]
    return {"sse": float(resid @ resid), "n": X.nnz}


def combine_metrics(state, sums):
    return {"objective": sums["sse"], "train_rmse": float(np.sqrt(sums["sse"] / sums["n"]))}


# Its batched phases: whole groups at once (with a Python loop where clients draw: their
# generators must be the per-client ones).
def _rows_of(group):
    return np.repeat(np.arange(group.n_rows), np.diff(group.X.indptr))


def b_init(group, v, stream):
    from sklearn_fedmf.engine._transport import client_generator

    sizes = np.diff(group.row_ptr)
    U = np.concatenate([client_generator(stream, group.start + i).random(sizes[i])
                        for i in range(group.n_clients)])
    nnz = np.diff(group.entry_ptr)
    return {"U": U}, {group.start + i: {"n": float(nnz[i])} for i in range(group.n_clients)}


def b_update(gs, group, v, stream, active, selected, step=0.1):
    from sklearn_fedmf.engine._transport import client_generator

    X = group.X
    if X.nnz and (X.data == BAD).any():
        raise ValueError("bad rating somewhere in the group")
    rows = _rows_of(group)
    owner = np.repeat(np.arange(group.n_clients), np.diff(group.row_ptr))
    resid = X.data - gs["U"][rows] * v[X.indices]
    U = gs["U"].copy()
    grad = np.bincount(rows, resid * v[X.indices], minlength=group.n_rows)
    noise = np.zeros(group.n_clients)
    for i in np.flatnonzero(active):
        noise[i] = 0.01 * client_generator(stream, group.start + i).random()
    moved = active[owner]
    U[moved] += step * grad[moved] + noise[owner][moved]
    uploads = {}
    for i in np.flatnonzero(active & selected):
        a, b = group.entry_ptr[i], group.entry_ptr[i + 1]
        uploads[group.start + i] = {"g": np.bincount(X.indices[a:b], resid[a:b] * U[rows[a:b]],
                                                     minlength=X.shape[1])}
    return {"U": U}, uploads


def b_metrics(gs, group, v):
    X = group.X
    resid = X.data - gs["U"][_rows_of(group)] * v[X.indices]
    return {"sse": float(resid @ resid), "n": X.nnz}


def make_protocol(n_items, participation=None):
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items), init_client=init_client,
        client_update=client_update, server_update=server_update,
        client_metrics=client_metrics, combine_metrics=combine_metrics,
        participation=participation or Participation(),
        batched=BatchedPhases(init_client=b_init, client_update=b_update,
                              client_metrics=b_metrics, client_state=user_rows_state,
                              with_client_states=with_user_rows),
    )


def data(n_rows=60, n_items=15, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n_rows, n_items, density=0.3, random_state=seed, format="csr")
    X.data = rng.normal(size=X.nnz)
    X.sum_duplicates()
    X.has_canonical_format = True
    codes = np.arange(n_rows) // 2  # two rows per client
    return X, codes, n_rows // 2


def fit(clients, protocol, n_clients, **kw):
    state, init_bytes = initialize_federation(protocol, clients, entropy=3)
    return run_federation(protocol, clients, max_iter=6, entropy=3, state=state,
                          init_bytes=init_bytes, **kw)


@pytest.mark.parametrize("participation", [Participation(), Participation(computes="all")])
@pytest.mark.parametrize("n_jobs", [1, 2])
def test_grouped_equals_one_block_per_client(participation, n_jobs, monkeypatch):
    monkeypatch.setattr("sklearn_fedmf.engine._dispatch.MIN_PARALLEL_WORK", 0)
    X, codes, n = data()
    protocol = make_protocol(X.shape[1], participation)
    kw = dict(clients_per_round=7, dropout=0.2, n_jobs=n_jobs)
    ref = fit(split_clients(X, codes, n), protocol, n, **kw)
    got = fit(GroupedTransport(make_groups(X, codes, n, n_groups=4), n_jobs=n_jobs),
              protocol, n, **kw)
    np.testing.assert_allclose(got.server_state["v"], ref.server_state["v"], rtol=1e-12)
    for c in range(n):
        np.testing.assert_allclose(got.client_states[c]["U"], ref.client_states[c]["U"],
                                   rtol=1e-12)
    for a, b in zip(got.history, ref.history):
        assert a["bytes_uploaded"] == b["bytes_uploaded"]
        assert a["bytes_downloaded"] == b["bytes_downloaded"]
        assert a["n_failed"] == b["n_failed"]
        assert a["objective"] == pytest.approx(b["objective"], rel=1e-12)
    assert isinstance(got.client_states, GroupStates) and len(got.client_states) == n


def test_make_groups_covers_every_client_once():
    X, codes, n = data(n_rows=61)
    codes = np.random.default_rng(1).permutation(np.arange(61) % 20)
    groups = make_groups(X, codes, 20, n_groups=6)
    assert [g.start for g in groups] == sorted(g.start for g in groups)
    assert sum(g.n_clients for g in groups) == 20 and groups[-1].stop == 20
    ref = split_clients(X, codes, 20)
    for g in groups:
        for i in range(g.n_clients):
            block = g.block(i)
            np.testing.assert_array_equal(block.rows, ref[g.start + i].rows)
            assert (block.X != ref[g.start + i].X).nnz == 0
    with pytest.raises(ValueError, match="own no rows"):
        make_groups(X, np.zeros(61, dtype=int), 2)


def test_group_count_follows_the_stored_ratings(monkeypatch):
    # a group holds at least GROUP_RATINGS ratings, at most N_GROUPS groups, whatever n_jobs
    monkeypatch.setattr(_fit, "GROUP_RATINGS", 1_000)
    assert [_fit.group_count(n) for n in (10, 999, 1_000, 5_999, 10**9)] == [
        1, 1, 1, 5, _fit.N_GROUPS]
    rng = np.random.default_rng(0)
    X = sp.random(600, 40, density=0.25, format="csr", random_state=rng,
                  data_rvs=lambda k: rng.integers(1, 6, k).astype(float))
    X = X[np.diff(X.indptr) > 0]  # (every client holds a rating)
    monkeypatch.setattr(_fit, "GROUP_MIN_CLIENTS", 1)
    for n_jobs in (1, 2):
        model = FedMGS(n_components=2, max_iter=2, clients_per_round=0.1, n_jobs=n_jobs,
                       random_state=0).fit(X, clients=np.arange(X.shape[0]))
        groups = model._federation.client_states.groups
        assert len(groups) == _fit.group_count(X.nnz) == X.nnz // 1_000


def test_a_failing_client_is_named_and_skipped_like_per_client():
    X, codes, n = data()
    X = X.copy()
    X.data[X.indptr[10]] = BAD  # row 10: client 5
    protocol = make_protocol(X.shape[1])
    groups = make_groups(X, codes, n, n_groups=3)
    with pytest.raises(ClientError, match="Client 5 failed in client_update"):
        fit(GroupedTransport(groups), protocol, n)
    with pytest.warns(ClientFailureWarning, match="Client 5"):
        got = fit(GroupedTransport(groups), protocol, n, on_client_error="skip")
    with pytest.warns(ClientFailureWarning):
        ref = fit(split_clients(X, codes, n), protocol, n, on_client_error="skip")
    np.testing.assert_allclose(got.server_state["v"], ref.server_state["v"], rtol=1e-12)
    assert [r["n_failed"] for r in got.history] == [r["n_failed"] for r in ref.history]


def test_warm_start_continues_the_groups():
    X, codes, n = data()
    protocol = make_protocol(X.shape[1])
    transport = GroupedTransport(make_groups(X, codes, n, n_groups=4))
    state = fit(transport, protocol, n, clients_per_round=5)
    again = GroupedTransport(transport.groups, client_states=state.client_states)
    state = run_federation(protocol, again, max_iter=3, entropy=3, state=state,
                           clients_per_round=5)
    blocks = split_clients(X, codes, n)
    ref, b = initialize_federation(protocol, blocks, entropy=3)
    ref = run_federation(protocol, blocks, max_iter=9, entropy=3, state=ref, init_bytes=b,
                         clients_per_round=5)
    np.testing.assert_allclose(state.server_state["v"], ref.server_state["v"], rtol=1e-12)


def test_implicit_rows_rebuild_dense_and_count_dense():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(9, 3))
    rows = np.array([1, 4, 7])
    values = rng.normal(size=(3, 3))
    msg = LazyRows(base, 0.8, rows, values)
    dense = 0.8 * base
    dense[rows] = values
    np.testing.assert_array_equal(np.asarray(msg), dense)
    assert nbytes(msg) == dense.nbytes == msg.nbytes
    # an aggregate of several messages from their rated rows and one base coefficient
    other = LazyRows(None, 0.0, np.array([0, 4]), rng.normal(size=(2, 3)), shape=(9, 3))
    out = np.zeros((9, 3))
    coef = msg.add_to(out, 0.3) + other.add_to(out, 0.7)
    np.testing.assert_allclose(out + coef * base, 0.3 * dense + 0.7 * np.asarray(other),
                               rtol=1e-14, atol=1e-15)
