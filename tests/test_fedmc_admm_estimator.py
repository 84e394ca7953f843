"""FedMCADMM as a scikit-learn estimator: checks, data contract, engine behaviour."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from joblib import parallel_config
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, GroupKFold, KFold
from sklearn.pipeline import make_pipeline

from sklearn_fedmf import FedMCADMM as _FedMCADMM
from sklearn_fedmf.engine._federation import nbytes
from sklearn_fedmf.exceptions import ClientError, ClientFailureWarning, UnobservedItemsWarning

from .conftest import low_rank_ratings, paper

# The spec's oracles hold for the papers' settings (conftest.paper).

FedMCADMM = paper(_FedMCADMM)


def small_model(**params):
    defaults = dict(n_components=2, n_clients=4, max_iter=30, random_state=0, center=False)
    defaults.update(params)
    return FedMCADMM(**defaults)


# ---- data contract --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "X, fit_kwargs, message",
    [
        (np.array([[1.0, np.inf], [2.0, 3.0]] * 4), {}, "infinity"),
        (sp.csr_matrix(([1.0, np.nan], ([0, 1], [0, 1])), shape=(8, 3)), {}, "NaN"),
        (np.ones(8), {}, "2D array"),
        (np.ones((8, 3)), {"clients": [0, 1, 2]}, "one label per row"),
        (np.ones((8, 3)), {"eval_set": np.ones((8, 4))}, "same shape"),
    ],
)
def test_bad_input_raises_clear_error(X, fit_kwargs, message):
    with pytest.raises(ValueError, match=message):
        small_model(n_clients=2).fit(X, **fit_kwargs)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"n_components": 0}, "n_components"),
        ({"n_components": 4}, "larger than the number of items"),
        ({"n_clients": 9}, "larger than the number of rows"),
        ({"n_clients": 2, "clients_per_round": 3}, "clients_per_round=3 is larger"),
        ({"beta": 0.0}, "beta"),
        ({"l1_ratio": 1.5}, "l1_ratio"),
    ],
)
def test_bad_parameters_raise(params, message):
    with pytest.raises(ValueError, match=message):
        small_model(**params).fit(np.ones((8, 3)))


def test_duplicate_sparse_entries_rejected():
    X = sp.coo_matrix(([1.0, 2.0, 3.0], ([0, 0, 1], [1, 1, 2])), shape=(4, 3))
    with pytest.raises(ValueError, match="duplicate"):
        small_model(n_clients=2).fit(X)


def test_dense_nan_equals_sparse_and_explicit_zeros_are_observations(ratings):
    X, _, _ = ratings
    dense = X.toarray()
    dense[X.toarray() == 0] = np.nan
    dense[np.nonzero(X)] = X.data  # no explicit zero yet
    a = small_model().fit(X).components_
    b = small_model().fit(dense).components_
    np.testing.assert_array_equal(a, b)
    # an explicit zero is an observation: it must change the fit
    coo = X.tocoo()
    free = np.flatnonzero(X.getrow(0).toarray()[0] == 0)[0]
    X0 = sp.csr_matrix(
        (np.r_[coo.data, 0.0], (np.r_[coo.row, 0], np.r_[coo.col, free])), shape=X.shape
    )
    assert X0.nnz == X.nnz + 1
    assert not np.allclose(small_model().fit(X0).components_, a)


def test_rows_and_columns_without_observation_are_allowed(ratings):
    X, _, _ = ratings
    X = X.tolil()
    X[3, :] = 0
    X = sp.csr_matrix(X)
    X.eliminate_zeros()  # row 3 now has no observation at all
    X = sp.hstack([X, sp.csr_matrix((X.shape[0], 1))]).tocsr()  # an empty item column
    with pytest.warns(UnobservedItemsWarning, match="no training rating"):
        model = small_model().fit(X)
    pred = model.predict(X)
    assert np.isfinite(pred).all()
    np.testing.assert_allclose(pred[3], model.mean_)


def test_cold_start_rows_predict_the_training_mean(ratings):
    X, _, _ = ratings
    model = small_model(center=True).fit(X)
    new = np.full((2, X.shape[1]), np.nan)
    new[1, :5] = X[:1].toarray()[0, :5]
    pred = model.predict(new)
    np.testing.assert_allclose(pred[0], X.data.mean())
    assert np.isfinite(pred).all()


def test_clip_limits_predictions_to_training_range(ratings):
    X, _, _ = ratings
    pred = small_model(clip=True).fit(X).predict(X)
    assert pred.min() >= X.data.min() and pred.max() <= X.data.max()


# ---- estimator API --------------------------------------------------------------------------
def test_fitted_attributes_and_history(ratings):
    X, Y, _ = ratings
    model = small_model(clients_per_round=2).fit(X, eval_set=Y)
    assert model.components_.shape == (2, X.shape[1])
    assert model.user_factors_.shape == (X.shape[0], 2)
    assert model.n_iter_ == 30 == len(model.history_)
    assert model.n_clients_ == 4 and model.clients_.shape == (X.shape[0],)
    record = model.history_[-1]
    for key in ("objective", "train_rmse", "eval_rmse", "bytes_uploaded", "bytes_downloaded",
                "seconds", "n_failed"):
        assert key in record
    # downlink: V (n x r floats) to each of the 2 sampled clients
    assert record["bytes_downloaded"] == 2 * X.shape[1] * 2 * 8
    np.testing.assert_allclose(model.fit_transform(X), model.transform(X))


def test_transform_is_exact_ridge_fold_in(ratings):
    X, _, _ = ratings
    model = small_model(alpha_u=0.3).fit(X)
    U = model.transform(X)
    V = model.components_
    for t in (0, 7, 50):
        cols = X[t].indices
        Vo = V[:, cols]
        expected = np.linalg.solve(Vo @ Vo.T + 0.3 * np.eye(2), Vo @ X[t].data)
        np.testing.assert_allclose(U[t], expected, rtol=1e-10)


def test_l1_fold_in_satisfies_kkt(ratings):
    X, _, _ = ratings
    model = small_model(alpha_u=0.5, l1_ratio=1.0).fit(X)
    U = model.transform(X)
    V = model.components_
    row = X[0]
    grad = V[:, row.indices] @ (U[0] @ V[:, row.indices] - row.data)
    nz = U[0] != 0
    np.testing.assert_allclose(grad[nz], -0.5 * np.sign(U[0][nz]), atol=1e-6)
    assert np.all(np.abs(grad[~nz]) <= 0.5 + 1e-6)


def test_score_uses_held_out_entries(ratings):
    X, Y, M = ratings
    # the raw model (clip=False): the oracle is U V, and held-out entries of this exactly
    # low-rank matrix lie outside the training range that clip=True would cut them to
    model = small_model(max_iter=150, clip=False).fit(X)
    U = model.transform(X)
    pred = U @ model.components_
    rows, cols = Y.nonzero()
    expected = -np.sqrt(np.mean((pred[rows, cols] - M[rows, cols]) ** 2))
    assert model.score(X, Y) == pytest.approx(expected, rel=1e-10)
    assert model.score(X, Y) > -0.05  # exactly low rank: recovered
    np.testing.assert_allclose(model.inverse_transform(U), pred)


def test_clone_pickle_and_pipeline(ratings):
    X, Y, _ = ratings
    model = small_model().fit(X)
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict(X), model.predict(X))
    assert clone(model).get_params() == model.get_params()
    pipe = make_pipeline(small_model()).fit(X)
    assert pipe.score(X, Y) == pytest.approx(model.score(X, Y))


def test_grid_search_over_the_papers_hyperparameters():
    X, Y, _ = low_rank_ratings(m=160, n=30, seed=1)
    grid = {
        "alpha_u": [1e-6, 1.0],
        "beta": [1.0],
        "local_iter": [5, 10],
        "n_clients": [4],
        "n_components": [1, 2],
    }
    search = GridSearchCV(small_model(max_iter=40), grid, cv=KFold(3, shuffle=True,
                                                                  random_state=0))
    search.fit(X, Y)
    assert search.best_params_["n_components"] == 2  # the truth is rank 2
    assert search.best_score_ > -0.3  # predicting the mean scores about -1
    # held-out clients: GroupKFold over the client labels
    clients = np.arange(X.shape[0]) % 4
    search = GridSearchCV(small_model(max_iter=20), {"n_components": [1, 2]},
                          cv=GroupKFold(2))
    search.fit(X, Y, groups=clients, clients=clients)
    assert search.best_params_["n_components"] == 2


# ---- engine ---------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["threading", "loky"])
def test_same_model_for_any_n_jobs_and_backend(ratings, backend):
    X, _, _ = ratings
    reference = small_model(clients_per_round=2, n_jobs=1).fit(X)
    with parallel_config(backend=backend):
        other = small_model(clients_per_round=2, n_jobs=2).fit(X)
    np.testing.assert_array_equal(reference.components_, other.components_)
    np.testing.assert_array_equal(reference.user_factors_, other.user_factors_)


def test_privacy_contract_uploads_hold_only_w_and_y(ratings):
    X, _, _ = ratings
    log = []
    model = small_model(
        clients_per_round=2, callback=lambda k, info: log.append(info["uploads"])
    ).fit(X)
    n_items, r = X.shape[1], 2
    first_round_init = None
    for k, uploads in enumerate(log):
        assert len(uploads) == 2
        for upload in uploads.values():
            assert set(upload) == {"W", "Y"}
            assert upload["W"].shape == upload["Y"].shape == (n_items, r)
        counted = model.history_[k]["bytes_uploaded"]
        sent = sum(nbytes(u) for u in uploads.values())
        if k == 0:
            first_round_init = counted - sent
        else:
            assert counted == sent
    # round 1 also carries every client's one-time Y_i^0 (n_items x r floats each)
    assert first_round_init == 4 * n_items * r * 8
    # the U_i of a client are nowhere in what it sent
    for uploads in log:
        for upload in uploads.values():
            for U in (model.user_factors_[model.clients_ == c] for c in range(4)):
                assert not any(np.shares_memory(U, a) or a.shape == U.shape
                               for a in upload.values())


def test_failed_clients_lose_nothing(ratings):
    X, _, _ = ratings
    # Make client 1's update raise by giving it a row count the solver cannot handle is not
    # possible through the public API, so simulate failures with dropout and check that a
    # failed client contributes nothing and keeps its state.
    states = []
    model = small_model(
        clients_per_round=4, dropout=0.5, max_iter=10,
        callback=lambda k, info: states.append(
            {i: info["server_state"]["Z"][i].copy() for i in range(4)}
            | {"uploaded": set(info["uploads"])}
        ),
    ).fit(X)
    failures = [r["n_failed"] for r in model.history_]
    assert sum(failures) > 0
    for k in range(1, len(states)):
        for i in range(4):
            if i not in states[k]["uploaded"]:
                np.testing.assert_array_equal(states[k][i], states[k - 1][i])
    assert all(len(s["uploaded"]) == 4 - f for s, f in zip(states, failures))


def _crash_client_0(monkeypatch):
    import sklearn_fedmf.completion._fedmc_admm._fedmc_admm_protocol as admm

    original = admm.ratings_client_update

    def flaky(state, block, Vt, rng, selected, **kw):
        if block.rows[0] == 0:  # the client holding row 0 always fails
            raise RuntimeError("simulated crash")
        return original(state, block, Vt, rng, selected, **kw)

    monkeypatch.setattr(admm, "ratings_client_update", flaky)


def test_an_exception_in_a_client_update_names_the_client_and_round(ratings, monkeypatch):
    X, _, _ = ratings
    _crash_client_0(monkeypatch)
    with pytest.raises(ClientError, match=r"Client 0 failed in client_update \(round 1\)") as err:
        small_model(partition="contiguous", max_iter=5).fit(X)
    assert (err.value.client, err.value.round) == (0, 1)
    assert isinstance(err.value.__cause__, RuntimeError)


def test_on_client_error_skip_keeps_the_failing_client_frozen(ratings, monkeypatch):
    X, _, _ = ratings
    _crash_client_0(monkeypatch)
    with pytest.warns(ClientFailureWarning) as caught:
        model = small_model(partition="contiguous", max_iter=5, on_client_error="skip").fit(X)
    assert len([w for w in caught if w.category is ClientFailureWarning]) == 1  # once per fit
    assert all(r["n_failed"] == 1 for r in model.history_)
    U0 = model.user_factors_[model.clients_ == 0]
    init = small_model(partition="contiguous", max_iter=1, dropout=0.999999).fit(X)
    np.testing.assert_array_equal(U0, init.user_factors_[init.clients_ == 0])


def test_warm_start_continues_exactly(ratings):
    X, _, _ = ratings
    full = small_model(clients_per_round=2, max_iter=20).fit(X)
    part = small_model(clients_per_round=2, max_iter=10, warm_start=True).fit(X)
    part.fit(X)
    assert part.n_iter_ == 20 and len(part.history_) == 20
    np.testing.assert_array_equal(full.components_, part.components_)


def test_tol_stops_early_and_callback_can_stop(ratings):
    X, _, _ = ratings
    model = small_model(max_iter=500, tol=1e-3).fit(X)
    assert model.n_iter_ < 500
    model = small_model(max_iter=50, callback=lambda k, info: k == 7).fit(X)
    assert model.n_iter_ == 7


def test_verbose_prints_progress(ratings, capsys):
    X, _, _ = ratings
    small_model(max_iter=3, verbose=1).fit(X)
    err = capsys.readouterr().err
    assert "3/3" in err and "FedMCADMM" in err


def test_random_partition_is_seeded_and_clients_are_respected(ratings):
    X, _, _ = ratings
    a = small_model(random_state=3).fit(X).clients_
    b = small_model(random_state=3).fit(X).clients_
    np.testing.assert_array_equal(a, b)
    labels = np.array(["a", "b", "c"])[np.arange(X.shape[0]) % 3]
    model = small_model().fit(X, clients=labels)
    assert model.n_clients_ == 3
    np.testing.assert_array_equal(model.clients_, labels)


def test_inputs_are_never_modified(ratings):
    X, Y, _ = ratings
    X_before, Y_before = X.copy(), Y.copy()
    dense = np.where(X.toarray() != 0, X.toarray(), np.nan)
    dense_before = dense.copy()
    model = small_model(center=True).fit(X, eval_set=Y)
    model.predict(X), model.score(X, Y), model.transform(dense), model.fit(dense)
    for after, before in ((X, X_before), (Y, Y_before)):
        np.testing.assert_array_equal(after.data, before.data)
        np.testing.assert_array_equal(after.indices, before.indices)
    np.testing.assert_array_equal(dense, dense_before)


def test_float32_input_is_fitted_in_float32(ratings):
    # Half the memory and half the bytes on the wire; the same model up to float32 rounding.
    X, Y, _ = ratings
    params = dict(n_components=2, n_clients=4, clients_per_round=2, max_iter=40, beta=0.5,
                  random_state=0)
    dtypes = []

    def record(round_index, info):
        dtypes.extend(a.dtype for up in info["uploads"].values() for a in up.values())

    ref = FedMCADMM(**params).fit(X, eval_set=Y)
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    m = FedMCADMM(callback=record, **params).fit(X32, eval_set=Y32)
    assert set(dtypes) == {np.dtype(np.float32)}
    assert m.components_.dtype == m.user_factors_.dtype == np.float32
    assert m.transform(X32).dtype == np.float32
    assert ref.history_[-1]["bytes_uploaded"] == 2 * m.history_[-1]["bytes_uploaded"]
    np.testing.assert_allclose(m.components_, ref.components_, rtol=1e-3, atol=1e-4)
    assert abs(m.history_[-1]["eval_rmse"] - ref.history_[-1]["eval_rmse"]) < 1e-4
    # and the float32 model is the same for any n_jobs
    m2 = FedMCADMM(n_jobs=2, **params).fit(X32, eval_set=Y32)
    np.testing.assert_array_equal(m2.components_, m.components_)
    np.testing.assert_array_equal(m2.user_factors_, m.user_factors_)
