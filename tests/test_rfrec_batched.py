"""RFRec's batched client phases (a whole client group per compiled call) against its
per-client functions, phase by phase and through whole fits: same states, same uploads, same
bytes, same model."""

import numpy as np
import pytest
import scipy.sparse as sp

import sklearn_fedmf.engine._fit as fit_module
from sklearn_fedmf import RFRec
from sklearn_fedmf.completion._rfrec._rfrec import ItemMatrixUpload, make_protocol
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.engine._groups import GroupStates, make_groups
from sklearn_fedmf.engine._transport import client_generator

RTOL = 1e-12


def ratings(n_rows=90, n_items=25, seed=0):
    rng = np.random.default_rng(seed)
    X = sp.random(n_rows, n_items, density=0.25, random_state=seed, format="csr")
    X.data = rng.integers(1, 6, size=X.nnz) - 3.0
    X.sum_duplicates()
    X.has_canonical_format = True
    Y = sp.random(n_rows, n_items, density=0.05, random_state=seed + 1, format="csr")
    Y.data = rng.normal(size=Y.nnz)
    return X, Y


def protocol(n_items, n_clients, **kw):
    params = dict(n_items=n_items, n_clients=n_clients, n_components=3, variant="rfrec",
                  schedule="l2gd", learning_rate=None, reg_consensus=4.0, alpha_u=0.3,
                  alpha_v=1.0, p=0.5, pull_eta=None, optimizer="gd", link="identity",
                  shift=3.0, span=4.0, init_std=0.3, clip_delta=None, noise_scale=0.0,
                  simulate_uploads=False, biased=False)
    return make_protocol(**{**params, **kw})


def assert_state_equal(got, ref):
    assert set(got) == set(ref)
    for key in ("U", "P"):
        np.testing.assert_allclose(got[key], ref[key], rtol=RTOL, atol=1e-14)
    np.testing.assert_array_equal(got["cols"], ref["cols"])
    np.testing.assert_array_equal(got["pair"], ref["pair"])
    assert got["pending"] == ref["pending"]
    assert (got["opt"] is None) == (ref["opt"] is None)
    if ref["opt"] is not None:
        assert got["opt"]["t"] == ref["opt"]["t"]
        for key in ("mU", "vU", "mP", "vP"):
            np.testing.assert_allclose(got["opt"][key], ref["opt"][key], rtol=RTOL, atol=1e-14)


def assert_upload_equal(got, ref, W):
    assert type(got) is type(ref) and got.nbytes == ref.nbytes
    if isinstance(ref, ItemMatrixUpload):
        np.testing.assert_array_equal(got.cols, ref.cols)
        assert got.noise_scale == ref.noise_scale
        got, ref = got.toarray(W), ref.toarray(W)
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=1e-14)


CONFIGS = {
    "gd-auto-biased": dict(biased=True),
    "adam-sigmoid": dict(optimizer="adam", learning_rate=0.05, link="sigmoid"),
    "gd-rfrecf-l2gd-biased": dict(variant="rfrecf", learning_rate=0.02, biased=True),
    "adam-rfrecf-algorithm2": dict(variant="rfrecf", schedule="algorithm2", optimizer="adam",
                                   learning_rate=0.05, pull_eta=0.7),
    "dense-noisy-uploads": dict(simulate_uploads=True, clip_delta=0.8, noise_scale=0.2,
                                learning_rate=0.02),
    "clipped-uploads": dict(clip_delta=0.5, noise_scale=0.1, optimizer="adam",
                            learning_rate=0.05),
}


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_batched_phases_equal_the_per_client_functions(config):
    """Phase by phase, with some clients inactive (their state must not move) and a sampled
    subset uploading (partial participation, lost uploads): the states, uploads and metric
    sums of the batched phases are the per-client functions' to 1e-12."""
    X, Y = ratings()
    rng = np.random.default_rng(1)
    codes = np.concatenate([np.arange(40), rng.integers(0, 40, size=X.shape[0] - 40)])
    codes = np.concatenate([codes[:40], np.sort(codes[40:])]) % 40  # some clients 2-5 rows
    n = 40
    proto = protocol(X.shape[1], n, **config)
    batched = proto.batched
    groups = make_groups(X, codes, n, X_eval=Y, n_groups=3)
    blocks = [g.block(i) for g in groups for i in range(g.n_clients)]
    server, broadcast = proto.init_server(np.random.default_rng(5))
    init_stream = (11, 0)
    ref = [proto.init_client(b, broadcast, client_generator(init_stream, c))[0]
           for c, b in enumerate(blocks)]
    gstates = [batched.init_client(g, broadcast, init_stream)[0] for g in groups]
    for k in range(7):
        for g, gs in zip(groups, gstates):
            for i in range(g.n_clients):
                assert_state_equal(batched.client_state(gs, g, i), ref[g.start + i])
        sums = [batched.client_metrics(gs, g, broadcast) for g, gs in zip(groups, gstates)]
        ref_sums = [proto.client_metrics(s, b, broadcast) for s, b in zip(ref, blocks)]
        for key in ref_sums[0]:
            assert sum(s[key] for s in sums) == pytest.approx(sum(s[key] for s in ref_sums),
                                                              rel=RTOL, abs=1e-12)
        active = rng.random(n) < 0.85
        selected = active & (rng.random(n) < 0.5)
        stream = (11, 1, k)
        uploads, got = {}, {}
        for c in np.flatnonzero(active):
            ref[c], up = proto.client_update(ref[c], blocks[c], broadcast,
                                             client_generator(stream, c), bool(selected[c]))
            if up is not None:
                uploads[c] = up
        for j, g in enumerate(groups):
            part = slice(g.start, g.stop)
            gstates[j], messages = batched.client_update(gstates[j], g, broadcast, stream,
                                                         active[part], selected[part])
            got.update(messages)
        assert sorted(got) == sorted(uploads)
        for c in uploads:
            assert_upload_equal(got[c], uploads[c], broadcast.simulation.W)
        server, broadcast = proto.server_update(server, uploads, k)


@pytest.fixture
def grouped(monkeypatch):
    """Run every fit of the test grouped (and a second call per-client)."""
    def set_grouping(on):
        monkeypatch.setattr(fit_module, "GROUP_MIN_CLIENTS", 1 if on else 10**9)
    return set_grouping


def _fit_both(grouped, X, **params):
    models, uploads = [], []
    for on in (False, True):
        grouped(on)
        seen = []
        def keep(k, info, seen=seen):  # (grouped uploads are views: valid in their round)
            seen.append({c: (u.cols.copy(), u.values.copy(), u.nbytes)
                         for c, u in info["uploads"].items()})

        model = RFRec(n_components=3, max_iter=5, random_state=0, callback=keep,
                      **{"n_clients": None, **params})  # (a user per client unless given)
        models.append(model.fit(X, eval_set=X))
        uploads.append(seen)
    assert isinstance(models[1]._federation.client_states, GroupStates)
    assert not isinstance(models[0]._federation.client_states, GroupStates)
    return models, uploads


FITS = {
    "defaults": dict(clients_per_round=0.3, solver_params={"dropout": 0.3}),
    "adam-unbiased": dict(biased=False, clients_per_round=7,
                          solver_params={"optimizer": "adam"}),
    "rfrecf-personal": dict(learning_rate=0.01, solver_params={"variant": "rfrecf",
                                                               "predict_with": "personal"}),
    "grouped-users": dict(n_clients=23, solver_params={"optimizer": "adam", "dropout": 0.2}),
}


@pytest.mark.parametrize("params", FITS.values(), ids=FITS.keys())
def test_grouped_fit_equals_per_client_fit(grouped, params):
    """A whole fit through the GroupedTransport gives the per-client fit's model, history
    (bytes unchanged), callback uploads and personal predictions."""
    X = make_ratings(120, 30, 1500, random_state=0).X
    (ref, got), (ref_up, got_up) = _fit_both(grouped, X, **params)
    np.testing.assert_allclose(got.components_, ref.components_, rtol=RTOL, atol=1e-14)
    np.testing.assert_allclose(got.user_factors_, ref.user_factors_, rtol=RTOL, atol=1e-14)
    for a, b in zip(got.history_, ref.history_):
        for key in ("bytes_uploaded", "bytes_downloaded", "n_failed", "comm_rounds"):
            assert a[key] == b[key]
        for key in ("objective", "train_rmse", "eval_rmse"):
            assert a[key] == pytest.approx(b[key], rel=RTOL)
    W = got._federation.broadcast.simulation.W
    for a, b in zip(got_up, ref_up):
        assert sorted(a) == sorted(b)
        for c in b:  # (W only fills the columns the clients did not rate: same both sides)
            np.testing.assert_array_equal(a[c][0], b[c][0])
            np.testing.assert_allclose(a[c][1], b[c][1], rtol=RTOL, atol=1e-14)
            assert a[c][2] == b[c][2] == W.size * 8
    np.testing.assert_allclose(got.predict(X, at=X).data, ref.predict(X, at=X).data,
                               rtol=RTOL)


def test_grouped_state_is_proportional_to_the_ratings(grouped):
    """The grouped state holds the rows' factors and one row per rated (client, item) pair,
    Adam's moments included, and no per-client object; an upload is a read-only view of it;
    a warm start continues it exactly."""
    X = make_ratings(150, 40, 1200, random_state=1).X
    grouped(True)
    sent = []
    model = RFRec(
        n_components=4, max_iter=2, random_state=0, n_clients=None, warm_start=True,
        callback=lambda k, info: sent.append(info["uploads"][0]),
        solver_params={"optimizer": "adam"},
    )
    model.fit(X)
    with pytest.raises(ValueError, match="read-only"):  # a view: no writing into the state
        sent[0].values[0, 0] = 1.0
    states = model._federation.client_states
    d = 4 + 2  # with the biases
    for group, gs in zip(states.groups, states.group_states):
        assert gs["U"].shape == gs["opt"]["mU"].shape == (group.n_rows, d)
        assert gs["P"].shape == gs["opt"]["vP"].shape == (group.nnz, d)  # a user per client
        assert gs["opt"]["t"].shape == gs["pending"].shape == (group.n_clients,)
    model.fit(X)  # 2 more rounds, continued
    grouped(False)
    ref = RFRec(n_components=4, max_iter=4, random_state=0, n_clients=None,
                solver_params={"optimizer": "adam"}).fit(X)
    np.testing.assert_allclose(model.components_, ref.components_, rtol=RTOL, atol=1e-14)


def test_grouped_fit_does_not_depend_on_workers_threads_or_backend(grouped, monkeypatch):
    """One client per user (the groups' compiled calls on the fit's workers): the same model,
    history and client states, bit for bit, with one worker, two, the default
    (``n_jobs=None`` from ``THREADED_MIN_RATINGS`` ratings: numba's thread count, here 1 and
    2) and joblib's loky processes."""
    import numba
    from joblib import parallel_config

    X = make_ratings(300, 40, 4000, random_state=2).X
    grouped(True)  # (the suite's conftest dispatches even these rounds to the workers)
    monkeypatch.setattr(fit_module, "THREADED_MIN_RATINGS", 0)

    def fit(n_jobs):
        return RFRec(n_components=3, max_iter=6, clients_per_round=0.1, alpha_u=0.01,
                     alpha_v=0.01, random_state=0, n_jobs=n_jobs).fit(
                         X, clients=np.arange(X.shape[0]))

    fits = [fit(1), fit(2)]
    before = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            fits.append(fit(None))
    finally:
        numba.set_num_threads(before)
    with parallel_config(backend="loky", n_jobs=2):  # (the states cross processes)
        fits.append(fit(2))
    assert isinstance(fits[0]._federation.client_states, GroupStates)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in fits[0].history_]
    for other in fits[1:]:
        np.testing.assert_array_equal(other.components_, fits[0].components_)
        np.testing.assert_array_equal(other.user_factors_, fits[0].user_factors_)
        assert [{k: v for k, v in r.items() if k != "seconds"}
                for r in other.history_] == strip
        for gs, ref in zip(other._federation.client_states.group_states,
                           fits[0]._federation.client_states.group_states):
            np.testing.assert_array_equal(gs["P"], ref["P"])  # (the clients' own states)
            np.testing.assert_array_equal(gs["U"], ref["U"])
