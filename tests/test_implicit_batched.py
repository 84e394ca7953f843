"""loss="implicit" for many small clients (issue 27): FedMGS's and FedMAvg's batched phases
of a client group give the per-client functions' draws, states and messages, and a grouped fit
(one client per user, or a few users per client) is the per-client fit, bytes included."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from joblib import parallel_backend

import sklearn_fedmf.completion._fedmavg._fedmavg_implicit as mavg
import sklearn_fedmf.completion._fedmgs._fedmgs_implicit as mgs
from sklearn_fedmf import FedMAvg, FedMGS
from sklearn_fedmf.completion._implicit import implicit_user_factors, spd_solve
from sklearn_fedmf.engine._client_data import split_clients
from sklearn_fedmf.engine._federation import nbytes
from sklearn_fedmf.engine._groups import make_groups
from sklearn_fedmf.engine._transport import client_generator
from sklearn_fedmf.exceptions import FedMFWarning

RTOL = 1e-10


def interactions(seed=0, n_users=60, n_items=25, rank=3, empty_row=5):
    """Interactions of strengths 1..5 drawn from a low-rank preference; one row without any."""
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(n_users, rank)) @ rng.normal(size=(rank, n_items))
    mask = scores > np.quantile(scores, 0.75, axis=1, keepdims=True)
    mask[empty_row] = False
    return sp.csr_matrix(np.where(mask, rng.integers(1, 6, mask.shape), 0).astype(float))


def clients_of(n_rows, rows_per_client, seed=0):
    """Client codes: ``rows_per_client`` rows each, shuffled."""
    codes = np.arange(n_rows) // rows_per_client
    return np.random.default_rng(seed).permutation(codes), int(codes.max()) + 1


def grouped(monkeypatch, on):
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1 if on else 10**9)


def assert_message_close(got, want):
    np.testing.assert_array_equal(got["items"], want["items"])
    assert got["items"].dtype == want["items"].dtype  # (the same bytes on the wire)
    assert nbytes(got) == nbytes(want)
    for key in ("G", "gram"):
        np.testing.assert_allclose(got[key], want[key], rtol=RTOL, atol=1e-13)


@pytest.mark.parametrize("rows_per_client", [1, 3])
def test_fedmgs_batched_phases_equal_the_per_client_functions(rows_per_client):
    X = interactions()
    codes, n_clients = clients_of(X.shape[0], rows_per_client)
    blocks = split_clients(X, codes, n_clients)
    groups = make_groups(X, codes, n_clients, n_groups=3)
    kw = dict(confidence=0.7)
    rng = np.random.default_rng(1)
    Vt = rng.random((X.shape[1], 3))
    broadcast = {"Vt": Vt, "VtV": Vt.T @ Vt}
    stream = (123, 0)
    states = {}
    for group in groups:
        state, uploads = mgs.batched_init_client(group, broadcast, stream, init_scale=0.1, **kw)
        states[group.start] = state
        for i in range(group.n_clients):
            c = group.start + i
            ref_state, ref = mgs.init_client(blocks[c], broadcast, client_generator(stream, c),
                                             init_scale=0.1, **kw)
            np.testing.assert_array_equal(mgs.client_state(state, group, i)["U"],
                                          ref_state["U"])
            assert_message_close(uploads[c], ref)
            # a one-user group holds each message's rows as their factors (counted dense)
            assert isinstance(uploads[c]["G"], mgs.OneUserChange) == (rows_per_client == 1)
    for group in groups:  # a round: some clients active, some of them sampled
        state = states[group.start]
        active = rng.random(group.n_clients) < 0.6
        selected = active & (rng.random(group.n_clients) < 0.7)
        before = {k: v.copy() for k, v in state.items() if isinstance(v, np.ndarray)}
        new, uploads = mgs.batched_client_update(state, group, broadcast, stream, active,
                                                 selected, alpha_u=0.4, **kw)
        for k, v in before.items():  # the input state is not modified
            np.testing.assert_array_equal(state[k], v)
        assert set(uploads) == {group.start + i for i in np.flatnonzero(selected)}
        for i in range(group.n_clients):
            c = group.start + i
            old = mgs.client_state(state, group, i)
            got = mgs.client_state(new, group, i)
            if not active[i]:  # exactly unchanged
                for key in ("U", "U_sent"):
                    np.testing.assert_array_equal(got[key], old[key])
                continue
            ref_state, ref = mgs.client_update(old, blocks[c], broadcast, None, selected[i],
                                               alpha_u=0.4, **kw)
            for key in ("U", "U_sent"):
                np.testing.assert_allclose(got[key], ref_state[key], rtol=RTOL, atol=1e-14)
            if selected[i]:
                assert_message_close(uploads[c], ref)
                assert isinstance(uploads[c]["G"], mgs.OneUserChange) == (rows_per_client == 1)
        # the state round trip the per-client fallback relies on
        some = {i: mgs.client_state(new, group, i) for i in range(0, group.n_clients, 2)}
        back = mgs.with_client_states(state, group, some)
        for i in range(group.n_clients):
            want = some[i] if i in some else mgs.client_state(state, group, i)
            for key in ("U", "U_sent"):
                np.testing.assert_array_equal(mgs.client_state(back, group, i)[key], want[key])


def test_solving_some_rows_leaves_the_others_untouched():
    X = interactions(seed=2)
    Vt = np.random.default_rng(3).random((X.shape[1], 3))
    full = implicit_user_factors(X, Vt, Vt.T @ Vt, confidence=1.0, alpha_u=0.5)
    out = np.full_like(full, 7.0)
    rows = np.array([1, 4, 5, 30])
    implicit_user_factors(X, Vt, Vt.T @ Vt, confidence=1.0, alpha_u=0.5, rows=rows, out=out)
    np.testing.assert_array_equal(out[rows], full[rows])
    assert (np.delete(out, rows, axis=0) == 7.0).all()


def fit(model, X, codes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        return model.fit(X, clients=codes)


def assert_grouped_is_per_client(model, X, codes, monkeypatch):
    """The grouped fit equals the per-client one: factors, objective, and the bytes exactly
    (messages counted dense, as the paper's client sends them), with dropped clients."""
    grouped(monkeypatch, False)
    ref = fit(model, X, codes)
    grouped(monkeypatch, True)
    got = fit(model, X, codes)
    assert type(got._federation.client_states).__name__ == "GroupStates"  # it ran grouped
    np.testing.assert_allclose(got.components_, ref.components_, rtol=RTOL, atol=1e-14)
    np.testing.assert_allclose(got.user_factors_, ref.user_factors_, rtol=RTOL, atol=1e-14)
    for a, b in zip(got.history_, ref.history_, strict=True):
        for key in ("bytes_uploaded", "bytes_downloaded", "n_failed"):
            assert a[key] == b[key]
        assert a["objective"] == pytest.approx(b["objective"], rel=RTOL)
    assert sum(r["n_failed"] for r in ref.history_) > 0  # dropout did drop clients


@pytest.mark.parametrize("rows_per_client", [1, 2])
def test_fedmgs_grouped_fit_is_the_per_client_fit(rows_per_client, monkeypatch):
    X = interactions(seed=4)
    codes, _ = clients_of(X.shape[0], rows_per_client, seed=1)
    model = FedMGS(loss="implicit", n_components=3, max_iter=6, clients_per_round=0.3,
                   random_state=0, n_jobs=2, solver_params={"dropout": 0.2})
    assert_grouped_is_per_client(model, X, codes, monkeypatch)



def test_one_user_change_adds_as_its_dense_rows():
    """The server adds a :class:`OneUserChange` as the rows it stands for."""
    rng = np.random.default_rng(11)
    r, n_items = 4, 9
    items = np.array([1, 4, 5, 8])
    change = mgs.OneUserChange(1.0 + rng.random(4), rng.normal(size=r), rng.normal(size=r))
    dense = {"items": items, "G": np.asarray(change), "gram": rng.normal(size=(r, r))}
    assert dense["G"].shape == change.shape and dense["G"].nbytes == change.nbytes
    start = rng.normal(size=(n_items, r + r * (r + 1) // 2))
    sums, grams = start.copy(), np.zeros((r, r))
    mgs.add_messages(sums, grams, {0: {**dense, "G": change}})
    want, want_grams = start.copy(), np.zeros((r, r))
    mgs.add_messages(want, want_grams, {0: dense})
    np.testing.assert_allclose(sums, want, rtol=RTOL, atol=1e-14)
    # the rows are the client's aggregates' change (implicit_item_sums at u less at u_sent)
    X = sp.csr_matrix((change.c - 1.0, items, [0, 4]), shape=(1, n_items))
    ref = mgs.share(change.u[None], X, confidence=1.0, U_old=change.o[None])
    np.testing.assert_allclose(np.asarray(change), ref["G"], rtol=RTOL, atol=1e-14)


@pytest.mark.parametrize("rows_per_client", [1, 3])
@pytest.mark.parametrize("settings", [
    {"participation": "pcc"},
    {"participation": "pcp", "client_weights": "rows", "aggregation": "sampled_mean"},
])
def test_fedmavg_grouped_fit_is_the_per_client_fit(rows_per_client, settings, monkeypatch):
    X = interactions(seed=7)
    codes, _ = clients_of(X.shape[0], rows_per_client, seed=2)
    model = FedMAvg(loss="implicit", n_components=3, max_iter=6, clients_per_round=0.3,
                    random_state=0, n_jobs=2, solver_params={"dropout": 0.2, **settings})
    assert_grouped_is_per_client(model, X, codes, monkeypatch)


@pytest.mark.parametrize("rows_per_client", [1, 3])
def test_fedmavg_batched_upload_is_the_per_client_w_phase(rows_per_client):
    """A sender's :class:`TransformedRows` is its dense ``W_p`` (the closed form of the
    unrated rows included), and adds into a weighted sum as the dense matrix does."""
    X = interactions(seed=8)
    codes, n_clients = clients_of(X.shape[0], rows_per_client, seed=3)
    blocks = split_clients(X, codes, n_clients)
    group = make_groups(X, codes, n_clients, n_groups=1)[0]
    rng = np.random.default_rng(4)
    Vt = rng.random((X.shape[1], 3))
    broadcast = {"Vt": Vt, "VtV": Vt.T @ Vt, "q2": 3, "total": float(X.nnz)}
    kw = dict(confidence=0.6, alpha_u=0.5, alpha_v=0.3, d_factor=0.7,
              client_weights="entries")
    state, _ = mavg.batched_init_client(group, broadcast, (5, 0), init_scale=0.1,
                                        client_weights="entries")
    active = np.ones(group.n_clients, dtype=bool)
    selected = rng.random(group.n_clients) < 0.5
    _, uploads = mavg.batched_client_update(state, group, broadcast, None, active, selected,
                                            **kw)
    assert set(uploads) == set(np.flatnonzero(selected).tolist())
    total = np.zeros_like(Vt)
    coef = np.zeros((3, 3))
    for c, upload in uploads.items():
        ref_state = mavg.u_phase({"U": None}, blocks[c], broadcast, confidence=0.6,
                                 alpha_u=0.5, client_weights="entries")
        want = mavg.w_phase(ref_state, blocks[c], None, confidence=0.6, alpha_v=0.3,
                            d_factor=0.7)["W"]
        got = upload["W"]
        assert got.nbytes == want.nbytes
        np.testing.assert_allclose(np.asarray(got), want, rtol=RTOL, atol=1e-13)
        coef += got.add_to(total, 0.25)
    np.testing.assert_allclose(total + Vt @ coef,
                               0.25 * sum(np.asarray(u["W"]) for u in uploads.values()),
                               rtol=RTOL, atol=1e-13)


@pytest.mark.parametrize("cls", [FedMAvg, FedMGS])
def test_grouped_fit_does_not_depend_on_n_jobs_or_backend(cls, monkeypatch):
    X = interactions(seed=5)
    grouped(monkeypatch, True)
    fits = [fit(cls(loss="implicit", n_components=3, max_iter=4, clients_per_round=0.5,
                    random_state=0, n_jobs=n_jobs), X, np.arange(X.shape[0]))
            for n_jobs in (1, 2)]
    with parallel_backend("loky", n_jobs=2):  # (the messages cross processes)
        fits.append(fit(cls(loss="implicit", n_components=3, max_iter=4, clients_per_round=0.5,
                            random_state=0, n_jobs=2), X, np.arange(X.shape[0])))
    for other in fits[1:]:
        np.testing.assert_array_equal(other.components_, fits[0].components_)
        np.testing.assert_array_equal(other.user_factors_, fits[0].user_factors_)


def test_fedmgs_grouped_warm_start_continues_the_fit(monkeypatch):
    X = interactions(seed=6)
    grouped(monkeypatch, True)
    params = dict(loss="implicit", n_components=3, clients_per_round=0.4, random_state=0)
    codes = np.arange(X.shape[0])
    ref = fit(FedMGS(max_iter=6, **params), X, codes)
    got = FedMGS(max_iter=3, warm_start=True, **params)
    fit(got, X, codes)
    fit(got, X, codes)
    assert got.n_iter_ == 6
    np.testing.assert_allclose(got.components_, ref.components_, rtol=RTOL, atol=1e-14)


def test_spd_solve_is_the_solution_and_falls_back_off_positive_definite():
    rng = np.random.default_rng(9)
    A = rng.normal(size=(6, 6))
    b = rng.normal(size=6)
    out, work = np.empty(6), np.empty((6, 6))
    spd = A @ A.T + 0.1 * np.eye(6)
    spd_solve(spd, b, work, out)
    np.testing.assert_allclose(spd @ out, b, rtol=RTOL, atol=1e-12)
    indefinite = A + A.T  # symmetric, eigenvalues of both signs: Cholesky stops
    assert np.linalg.eigvalsh(indefinite)[0] < 0 < np.linalg.eigvalsh(indefinite)[-1]
    spd_solve(indefinite, b, work, out)
    np.testing.assert_allclose(out, np.linalg.solve(indefinite, b), rtol=RTOL)
