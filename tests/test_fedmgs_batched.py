"""FedMGS for many small clients: the batched phases of a client group give the per-client
functions' states and messages, the server's sparse cache of per-item aggregates gives a dense
cache's steps, and a grouped fit is the per-client fit (issue 15)."""

from functools import partial

import numpy as np
import pytest
import scipy.sparse as sp

import sklearn_fedmf._kernels as kernels
import sklearn_fedmf.completion._fedmgs._fedmgs_batched as batched
import sklearn_fedmf.completion._fedmgs._fedmgs_protocol as fedmgs
from sklearn_fedmf import FedMGS
from sklearn_fedmf._biases import item_step_bounds
from sklearn_fedmf._kernels import parallel_kernels
from sklearn_fedmf.completion._fedmavg._fedmavg_protocol import (
    EPS_LIPSCHITZ,
    lambda_max,
    prox_nonsmooth,
)
from sklearn_fedmf.engine._federation import nbytes
from sklearn_fedmf.engine._groups import make_groups
from sklearn_fedmf.engine._transport import client_generator
from sklearn_fedmf.exceptions import FederationError

from .conftest import cached_aggregates


def ratings(n_rows=90, n_items=40, density=0.15, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n_rows, n_items, density=density, random_state=seed, format="csr")
    X.data = rng.normal(size=X.nnz)
    X.sum_duplicates()
    X.has_canonical_format = True
    return X


def clients_of(n_rows, rows_per_client, seed=0):
    """Client codes: ``rows_per_client`` rows each, shuffled (a row of no rating included)."""
    codes = np.arange(n_rows) // rows_per_client
    return np.random.default_rng(seed).permutation(codes), int(codes.max()) + 1


def assert_close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)


def assert_messages_equal(sent, ref, exact=True):
    """The aggregates of a group's message are the per-client function's (the same kernel:
    bit for bit from the same factors)."""
    for key in set(sent) - {"counts"}:
        (np.testing.assert_array_equal if exact or key == "items" else assert_close)(
            sent[key], ref[key])


PARAMS = dict(local_iter_u=4, c_factor=0.51, alpha_u=0.3, l1_ratio=0.0, positive=False)
CASES = [dict(biased=True), dict(biased=False), dict(biased=True, positive=True, l1_ratio=0.2),
         dict(biased=True, weighted=True), dict(biased=False, weighted=True, l1_ratio=0.3)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("rows_per_client", [1, 3])
def test_batched_phases_equal_the_per_client_functions(case, rows_per_client):
    X = ratings()
    X = sp.csr_matrix(X.multiply(np.arange(X.shape[0])[:, None] != 5))  # row 5: no rating
    X.has_canonical_format = True
    codes, n = clients_of(X.shape[0], rows_per_client)
    params = {**PARAMS, **case}
    biased, positive = params["biased"], params["positive"]
    n_f = 4 if biased else 2
    Vt = np.random.default_rng(1).random((X.shape[1], n_f))
    if biased:
        Vt[:, -2] = 1.0
    weighted = params.get("weighted", False)
    init = dict(init_scale=1.0, positive=positive, biased=biased, weighted=weighted)
    stream, rng = (7, 0), np.random.default_rng(2)
    for group in make_groups(X, codes, n, n_groups=3):
        state, uploads = batched.batched_init_client(group, Vt, stream, **init)
        assert set(uploads) == set(range(group.start, group.stop))
        for i in range(group.n_clients):
            block, c = group.block(i), group.start + i
            ref, ref_up = fedmgs.init_client(block, Vt, client_generator(stream, c), **init)
            assert_close(batched.client_state(state, group, i)["U"], ref["U"])
            sent = uploads[c]
            # one-user clients with biases send the compact form (a and their ratings)
            outer = biased and rows_per_client == 1
            assert set(sent) - {"counts"} == ({"items", "x", "a"} if outer
                                              else {"items", "G", "gram"})
            np.testing.assert_array_equal(sent["items"], np.unique(block.X.indices))
            assert_messages_equal(sent, ref_up)
            if weighted:  # ratings per item, on the rated items
                np.testing.assert_array_equal(np.asarray(sent["counts"]), ref_up["counts"])
            assert nbytes(sent) == nbytes(ref_up)
        active = rng.random(group.n_clients) < 0.6
        selected = active & (rng.random(group.n_clients) < 0.7)
        Vt2 = Vt + 0.1 * rng.random(Vt.shape)
        if biased:
            Vt2[:, -2] = 1.0
        new, uploads = batched.batched_client_update(state, group, Vt2, stream, active,
                                                    selected, **params)
        assert set(uploads) == {group.start + i for i in np.flatnonzero(selected)}
        for i in range(group.n_clients):
            block, before = group.block(i), batched.client_state(state, group, i)
            got = batched.client_state(new, group, i)
            if not active[i]:
                np.testing.assert_array_equal(got["U"], before["U"])
                continue
            ref, ref_up = fedmgs.client_update(before, block, Vt2, None, selected[i], **params)
            assert_close(got["U"], ref["U"])
            if selected[i]:
                assert_messages_equal(uploads[group.start + i], ref_up, exact=False)
        if positive:
            assert (new["U"] >= 0).all()
        # the metrics' sums over the group
        metrics = dict(alpha_u=0.3, l1_ratio=params["l1_ratio"], biased=biased, alpha_v=0.2,
                       weighted=weighted)
        sums = fedmgs._metrics(new, group, Vt2, **metrics)
        refs = [fedmgs._metrics(batched.client_state(new, group, i), group.block(i), Vt2,
                                **metrics) for i in range(group.n_clients)]
        for key in sums:
            assert sums[key] == pytest.approx(sum(r[key] for r in refs), rel=1e-12)
        # the states of with_client_states are the ones given
        swapped = batched.with_client_states(new, group, {0: before})
        np.testing.assert_array_equal(batched.client_state(swapped, group, 0)["U"],
                                      before["U"])
        np.testing.assert_array_equal(new["U"], batched.batched_client_update(
            state, group, Vt2, stream, active, selected, **params)[0]["U"])  # input untouched


def test_client_items_lays_out_each_clients_rated_items():
    X = ratings(n_rows=40, n_items=12, density=0.3)
    codes, n = clients_of(40, 4, seed=3)
    for group in make_groups(X, codes, n, n_groups=2):
        layout = batched.group_layout(group)
        for i in range(group.n_clients):
            block = group.block(i)
            a, b = layout["item_ptr"][i], layout["item_ptr"][i + 1]
            items = layout["items"][a:b]
            np.testing.assert_array_equal(items, np.unique(block.X.indices))
            lo, hi = group.entry_ptr[i], group.entry_ptr[i + 1]
            np.testing.assert_array_equal(items[layout["slot"][lo:hi]], group.X.indices[lo:hi])


def dense_aggregates(upload, n_items):
    """A message as the dense ``n_items x (r + r^2)`` matrix of rows ``[G2_j, vec(G1_j)]``."""
    if "x" in upload:
        a = upload["a"]
        G = np.hstack([np.multiply.outer(upload["x"], a),
                       np.tile(np.multiply.outer(a, a).ravel(), (len(upload["x"]), 1))])
        gram = np.multiply.outer(a, a)
    else:
        G, gram = upload["G"], upload["gram"]
    out = np.zeros((n_items, G.shape[1]))
    out[upload["items"]] = G
    return out, gram


def dense_server_update(state, uploads, *, d_factor, local_iter_v, alpha_v, l1_ratio,
                        positive, biased):
    """The server's steps with a dense ``p x n x (r + r^2)`` cache (the oracle)."""
    cache, grams = state["cache"].copy(), state["grams"].copy()
    for p, upload in uploads.items():
        cache[p], grams[p] = dense_aggregates(upload, cache.shape[1])
    ridge = alpha_v * (1.0 - l1_ratio)
    if biased:  # a bound per column block (_biases.item_step_bounds)
        d = d_factor * np.maximum(item_step_bounds(grams.sum(axis=0), ridge), EPS_LIPSCHITZ)
    else:
        d = d_factor * max(lambda_max(grams.sum(axis=0)) + ridge, EPS_LIPSCHITZ)
    Vt = state["Vt"]
    free = np.delete(Vt, Vt.shape[1] - 2, axis=1) if biased else Vt
    r = free.shape[1]
    total = cache.sum(axis=0)
    for _ in range(local_iter_v):
        grad = np.einsum("jac,jc->ja", total[:, r:].reshape(-1, r, r), free) - total[:, :r]
        free = prox_nonsmooth(free - (grad + ridge * free) / d, 1.0 / d, alpha_v, l1_ratio,
                              positive)
    if biased:
        free = np.hstack([free[:, :-1], np.ones((len(free), 1)), free[:, -1:]])
    return {"Vt": free, "cache": cache, "grams": grams}


@pytest.mark.parametrize("biased", [True, False])
def test_sparse_cache_steps_as_the_dense_cache(biased, monkeypatch):
    """Over rounds with both message forms (one-user clients with biases send ``a`` and
    their ratings), a group's views adopted without a copy and the exact re-sums, the
    running sums give the dense cache's V."""
    monkeypatch.setattr(fedmgs, "RESUM_EVERY", 3)
    rng = np.random.default_rng(0)
    n_clients, n_items, r = 7, 15, 3
    n_f = r + 1 if biased else r
    rated = [np.sort(rng.choice(n_items, size=rng.integers(1, 6), replace=False))
             for _ in range(n_clients)]
    rated[2] = rated[2][:0]  # a client with no rating
    compact = np.array([False] * 4 + [biased] * 2 + [False])  # (fixed by a client's rows)

    def upload(p):
        A = rng.normal(size=(2, n_f))
        if biased:
            A[:, -1] = 1.0
        if compact[p]:
            return {"items": rated[p], "x": rng.normal(size=len(rated[p])), "a": A[0]}
        G = np.hstack([rng.normal(size=(len(rated[p]), n_f)),
                       np.tile((A.T @ A).ravel(), (len(rated[p]), 1))])
        return {"items": rated[p], "G": G, "gram": A.T @ A}

    first = {p: upload(p) for p in range(n_clients)}
    items = np.concatenate(rated[:4])  # clients 0-3: a group's consecutive views
    values = np.concatenate([first[p]["G"] for p in range(4)])
    grams = np.stack([first[p]["gram"] for p in range(4)])
    offsets = np.cumsum([0] + [len(rated[p]) for p in range(4)])
    for p in range(4):
        lo, hi = offsets[p], offsets[p + 1]
        first[p] = {"items": items[lo:hi], "G": values[lo:hi], "gram": grams[p]}
    Vt = rng.random((n_items, n_f + 1 if biased else n_f))
    kw = dict(d_factor=0.501, local_iter_v=2, alpha_v=0.2, l1_ratio=0.1, positive=False,
              biased=biased)
    state, _ = fedmgs.server_init_uploads({"Vt": Vt}, first, n_clients=n_clients)
    assert np.shares_memory(state["segments"][0]["G"], values)  # adopted, not copied
    assert np.shares_memory(state["segments"][0]["grams"], grams)
    assert ("outer" in [s["kind"] for s in state["segments"]]) == biased
    ref = {"Vt": Vt, "cache": np.stack([dense_aggregates(first[p], n_items)[0]
                                        for p in range(n_clients)]),
           "grams": np.stack([dense_aggregates(first[p], n_items)[1]
                              for p in range(n_clients)])}
    for k in range(8):
        sampled = np.sort(rng.choice(n_clients, size=3, replace=False))
        uploads = {int(p): upload(p) for p in sampled}
        state, broadcast = fedmgs.server_update(state, uploads, k, **kw)
        ref = dense_server_update(ref, uploads, **kw)
        np.testing.assert_allclose(broadcast, ref["Vt"], rtol=1e-12, atol=1e-14)
        # (rows-form clients among them: the server's sums are not packed)
        assert not fedmgs.packed_sums(state["segments"])
        np.testing.assert_allclose(state["sums"], ref["cache"].sum(axis=0), rtol=1e-12,
                                   atol=1e-14)
        for p in range(n_clients):
            np.testing.assert_allclose(cached_aggregates(state["segments"], p, n_items),
                                       ref["cache"][p], rtol=1e-15)
        np.testing.assert_allclose(fedmgs.gram_sum(state["segments"]),
                                   ref["grams"].sum(axis=0), rtol=1e-13)
    # a client's rated items are fixed by its data: a message on others is refused
    bad = {0: {**upload(0), "items": rated[0] + 1}}
    with pytest.raises(FederationError, match="Client 0"):
        fedmgs.server_update(state, bad, 8, **kw)


def test_compact_cache_update_by_item_ranges_is_the_serial_sum_bit_for_bit(monkeypatch):
    """The server's update of one-user clients' compact aggregates (and its exact re-sum) runs
    by item ranges, on threads inside ``parallel_kernels``: its packed running sums and cached
    ``x`` and ``a`` are, bit for bit, those of adding each client's change in client order
    over the full ``[G2_j, vec(G1_j)]`` (the serial update), with or without threads, and
    with a client whose items do not ascend (its items are then each tested)."""
    monkeypatch.setattr(fedmgs, "RESUM_EVERY", 3)
    split = []
    original = fedmgs.split_rows

    def recording(kernel, n_rows, calls):  # (the pending item-range calls, run together)
        if kernels.row_tasks(n_rows) > 1:
            split.extend(call[0].__name__ for call in calls)
        return original(kernel, n_rows, calls)

    monkeypatch.setattr(fedmgs, "split_rows", recording)
    rng = np.random.default_rng(0)
    n_clients, n_items, r = 300, 400, 4
    rated = [np.sort(rng.choice(n_items, size=rng.integers(1, 60), replace=False))
             for _ in range(n_clients)]
    rated[5] = rated[5][::-1].copy()

    def upload(p):
        a = np.append(rng.normal(size=r - 1), 1.0)
        return {"items": rated[p], "x": rng.normal(size=len(rated[p])), "a": a}

    first = {p: upload(p) for p in range(n_clients)}
    rounds = []
    for k in range(1, 6):  # (client 5, whose items do not ascend, in rounds 2 and 4 only)
        sampled = set(rng.choice(np.setdiff1d(np.arange(n_clients), [5]), 60, replace=False))
        rounds.append({p: upload(p) for p in sorted(sampled | ({5} if k % 2 == 0 else set()))})

    def reference():  # full sums, client by client, with numpy
        cache = {p: (u["x"], u["a"]) for p, u in first.items()}
        total = np.zeros((n_items, r + r * r))
        for p in range(n_clients):
            total[rated[p]] += np.hstack([np.multiply.outer(cache[p][0], cache[p][1]),
                                          np.tile(np.multiply.outer(cache[p][1], cache[p][1])
                                                  .ravel(), (len(rated[p]), 1))])
        out = []
        for k, uploads in enumerate(rounds, 1):
            for p, u in uploads.items():
                (x, a), (nx, na) = cache[p], (u["x"], u["a"])
                total[rated[p], :r] += np.multiply.outer(nx, na) - np.multiply.outer(x, a)
                total[rated[p], r:] += (np.multiply.outer(na, na)
                                        - np.multiply.outer(a, a)).ravel()
                cache[p] = (nx, na)
            if k % 3 == 0:  # the exact re-sum, from zero in client order
                total = np.zeros_like(total)
                for p in range(n_clients):
                    x, a = cache[p]
                    total[rated[p]] += np.hstack([np.multiply.outer(x, a), np.tile(
                        np.multiply.outer(a, a).ravel(), (len(rated[p]), 1))])
            out.append(total.copy())
        return out

    def run(threads):
        state, _ = fedmgs.server_init_uploads({"Vt": np.zeros((n_items, r + 1))}, first,
                                              n_clients=n_clients)
        out = []
        with parallel_kernels(threads):
            for k, uploads in enumerate(rounds, 1):
                state, total, _ = fedmgs.fold_cache(state, uploads, k)
                out.append(total.copy())
        return state, out

    serial, serial_sums = run(1)
    assert serial["sums"].shape == (n_items, r + r * (r + 1) // 2)  # packed
    assert not split
    parallel, parallel_sums = run(2)
    assert {"replace_outer", "add_outer"} <= set(split)
    for a, b, c in zip(serial_sums, parallel_sums, reference()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(serial["sums"], parallel["sums"])
    for key in ("x", "a"):
        np.testing.assert_array_equal(serial["segments"][0][key], parallel["segments"][0][key])


def grouped(monkeypatch, on):
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1 if on else 10**9)


@pytest.mark.parametrize("biased", [True, False])
@pytest.mark.parametrize("rows_per_client", [1, 2])
@pytest.mark.parametrize("regularization", ["plain", "weighted"])
def test_grouped_fit_is_the_per_client_fit(biased, rows_per_client, regularization,
                                           monkeypatch):
    X = ratings(n_rows=120, n_items=30, density=0.2)
    codes, _ = clients_of(120, rows_per_client, seed=1)
    fit = partial(FedMGS(
        n_components=2, max_iter=8, clients_per_round=0.3, biased=biased,
        regularization=regularization, random_state=0, n_jobs=2,
        solver_params={"dropout": 0.2, "eval_every": 2},
    ).fit, X, clients=codes)
    grouped(monkeypatch, False)
    ref = fit()
    grouped(monkeypatch, True)
    got = fit()
    np.testing.assert_allclose(got.components_, ref.components_, rtol=1e-12)
    np.testing.assert_allclose(got.user_factors_, ref.user_factors_, rtol=1e-12, atol=1e-15)
    for a, b in zip(got.history_, ref.history_):
        for key in ("bytes_uploaded", "bytes_downloaded", "n_failed"):
            assert a[key] == b[key]
        if "objective" in b:
            assert a["objective"] == pytest.approx(b["objective"], rel=1e-12)
    assert sum(r["n_failed"] for r in ref.history_) > 0  # dropout did drop clients


def test_grouped_fit_uploads_hold_the_paper_message(monkeypatch):
    """Privacy contract on the grouped path: a sampled one-user client (biases) sends ``a =
    [u, 1]`` and its ratings minus ``b_u`` on the items it rated, which are its aggregates
    ``G1_j = a a^T``, ``G2_j = x_j a`` in ``k + r`` numbers; nobody else sends."""
    X = ratings(n_rows=60, n_items=20, density=0.25)
    grouped(monkeypatch, True)
    log = []
    model = FedMGS(
        n_components=2, max_iter=3, clients_per_round=10, random_state=0,
        callback=lambda k, info: log.append(info), solver_params={"eval_every": 0},
    ).fit(
                       X, clients=np.arange(60))
    for info in log:
        assert set(info["uploads"]) == set(info["sampled"].tolist())
        for c, upload in info["uploads"].items():
            assert set(upload) == {"items", "x", "a"}
            np.testing.assert_array_equal(upload["items"], np.unique(X[c].indices))
            assert upload["a"].shape == (3,) and upload["a"][-1] == 1.0
            assert nbytes(upload) == upload["items"].nbytes + 8 * (len(upload["items"]) + 3)
    for c, upload in log[-1]["uploads"].items():  # at the client's final factors
        np.testing.assert_allclose(upload["a"][:2], model.user_factors_[c], rtol=1e-15)
        np.testing.assert_allclose(upload["x"], X[c].data - model.mean_ - model.user_bias_[c],
                                   rtol=1e-15, atol=1e-15)


def test_grouped_warm_start_continues_the_fit(monkeypatch):
    X = ratings(n_rows=80, n_items=25, density=0.2)
    grouped(monkeypatch, True)
    params = dict(n_components=2, clients_per_round=0.25, random_state=0,
                  solver_params={"eval_every": 0})
    ref = FedMGS(max_iter=6, **params).fit(X, clients=np.arange(80))
    got = FedMGS(max_iter=3, warm_start=True, **params).fit(X, clients=np.arange(80))
    got.fit(X, clients=np.arange(80))
    np.testing.assert_allclose(got.components_, ref.components_, rtol=1e-12)
    np.testing.assert_allclose(got.user_factors_, ref.user_factors_, rtol=1e-12)
