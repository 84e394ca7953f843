"""Federated validation and early stopping (issue 26): the clients' held-out ratings, the best
validated round kept and restored, the validation report, the fallback to the biases."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from numpy.testing import assert_array_equal

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM, FedMGS, RFRec
from sklearn_fedmf.datasets import make_site_ratings
from sklearn_fedmf.engine._fit import validation_split
from sklearn_fedmf.exceptions import DegenerateFitWarning
from sklearn_fedmf.model_selection import train_test_split_ratings

SEED = 3
N_CLIENTS = 4

# small, fast settings that overfit the toy data below (weak regularization, many rounds)
FAST = {
    "FedMAvg": lambda **kw: FedMAvg(n_components=6, alpha_u=0.01, alpha_v=0.01, **kw),
    "FedMGS": lambda **kw: FedMGS(n_components=6, alpha_u=0.01, alpha_v=0.01, **kw),
    "FedMCADMM": lambda **kw: FedMCADMM(n_components=6, local_iter=10, alpha_u=0.01,
                                        alpha_v=0.01, **kw),
    # (RFRec with biases climbs for its first ~25 rounds from a small start on this toy,
    # then descends: without them it descends from round 10)
    "RFRec": lambda **kw: RFRec(n_components=6, alpha_u=0.01, alpha_v=0.01, biased=False,
                                **kw),
}


def ratings(n_users=80, n_items=40, density=0.5, seed=0):
    """Rank-2 ratings with noise, on a 1-5 scale: structure to fit, noise to overfit."""
    rng = np.random.default_rng(seed)
    M = 3.5 + rng.normal(size=(n_users, 2)) @ rng.normal(size=(2, n_items)) * 0.6
    M += rng.normal(scale=0.5, size=M.shape)
    mask = rng.random(M.shape) < density
    mask[np.arange(n_users), rng.integers(0, n_items, n_users)] = True  # no empty row
    X = sp.csr_matrix(np.where(mask, np.clip(M, 1, 5), 0.0))
    X.eliminate_zeros()
    return X


def labels(n_users):
    return np.arange(n_users) % N_CLIENTS


def model_arrays(model):
    biases = [model.item_bias_, model.user_bias_] if model.biased else []
    return [model.components_, model.user_factors_, *biases]


def kept_state(model):
    """The federation's state after the fit, as the server and the clients hold it (the
    model before any fallback to the biases): ``V`` with its bias rows, each client's
    ``U`` with its bias columns."""
    fed = model._federation
    states = fed.client_states
    return [model._read_components(fed.server_state, fed.broadcast),
            *(model._read_user_factors(states[c]) for c in range(len(states)))]


# ---- the split ------------------------------------------------------------------------------
def test_validation_split_partitions_each_clients_ratings():
    X = ratings(n_users=200, density=0.3)
    codes = labels(X.shape[0])
    train, valid = validation_split(X, codes, N_CLIENTS, 0.2, SEED)
    # disjoint, and together exactly X
    assert train.multiply(valid).nnz == 0
    assert_array_equal((train + valid).toarray(), X.toarray())
    # each row keeps at least one rating; the held-out share is the fraction on average
    assert np.all(np.diff(train.indptr) >= 1)
    assert abs(valid.nnz / X.nnz - 0.2) < 0.03
    # with one rating a row keeps it
    single = sp.csr_matrix(([4.0, 3.0], ([0, 1], [2, 5])), shape=(2, 6))
    assert validation_split(single, np.array([0, 1]), 2, 0.5, SEED)[1].nnz == 0


def test_validation_split_is_each_clients_own_draw():
    """A client's held-out ratings depend only on its own rows and its own seed: removing
    the other clients' ratings does not change them."""
    X = ratings(n_users=60, density=0.4)
    codes = labels(X.shape[0])
    _, valid = validation_split(X, codes, N_CLIENTS, 0.3, SEED)
    alone = X.multiply(sp.csr_matrix((codes == 1)[:, None].astype(float))).tocsr()
    alone.eliminate_zeros()
    alone.sort_indices()  # (canonical, as the fit's ratings)
    _, valid_alone = validation_split(alone, codes, N_CLIENTS, 0.3, SEED)
    rows = codes == 1
    assert_array_equal(valid[rows].toarray(), valid_alone[rows].toarray())
    # and another seed draws another split
    assert (validation_split(X, codes, N_CLIENTS, 0.3, SEED + 1)[1] != valid).nnz > 0


# ---- off: today's fit -------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAST))
def test_without_early_stopping_the_fit_ignores_validation(name):
    """early_stopping=False (and "auto" below 10,000 ratings) is the fit without validation:
    validation_fraction then changes nothing, bit for bit, and no round is validated."""
    X = ratings()
    fits = [FAST[name](max_iter=6, random_state=SEED, **params).fit(X)
            for params in ({"early_stopping": False, "validation_fraction": None},
                           {"early_stopping": False, "validation_fraction": 0.3},
                           {})]  # the defaults: "auto" on 1,6xx ratings
    for other in fits[1:]:
        for a, b in zip(model_arrays(fits[0]), model_arrays(other)):
            assert_array_equal(a, b)
        assert other.mean_ == fits[0].mean_
    for model in fits:
        assert model.validation_score_.size == 0
        assert model.best_iteration_ == model.n_iter_ == 6
        assert model.best_validation_score_ is None and model.factors_used_
        assert not any("validation_rmse" in r for r in model.history_)


def test_early_stopping_needs_validation_ratings():
    X = ratings()
    with pytest.raises(ValueError, match="early_stopping=True needs validation ratings"):
        FedMAvg(early_stopping=True, validation_fraction=None, max_iter=2).fit(X)
    with pytest.raises(ValueError, match="validation_fraction"):
        FedMAvg(early_stopping=True, validation_fraction=1.0).fit(X)
    # "auto" needs a validation fraction; True without one uses the eval set
    big = ratings(n_users=500, n_items=60, density=0.4)
    assert FedMAvg(validation_fraction=None, max_iter=2).fit(big).validation_score_.size == 0
    train, test = train_test_split_ratings(X, 0.2, random_state=0)
    model = FedMAvg(early_stopping=True, validation_fraction=None, max_iter=3,
                    random_state=0).fit(train, eval_set=test)
    assert model.validation_score_.shape == (3,)
    assert all(r["eval_rmse"] == r["validation_rmse"] for r in model.history_)


def test_an_eval_set_is_reported_beside_the_validation():
    """With a held-out validation part, an eval set is only a report: the model is the
    same, and each round's eval_rmse is the current federated model's RMSE on it."""
    X = ratings()
    train, test = train_test_split_ratings(X, 0.2, random_state=0)
    seen = []

    def keep(round_number, info):
        seen.append(info["record"]["eval_rmse"])
        return False

    params = dict(max_iter=60, early_stopping=True, validation_fraction=0.2,
                  n_iter_no_change=3, random_state=SEED)
    groups = labels(X.shape[0])
    plain = FAST["FedMAvg"](**params).fit(train, clients=groups)
    model = FAST["FedMAvg"](**params, callback=keep).fit(train, clients=groups,
                                                         eval_set=test)
    for a, b in zip(kept_state(plain), kept_state(model)):
        assert_array_equal(a, b)
    assert all("eval_rmse" in r and "validation_rmse" in r for r in model.history_)
    # the kept round's eval_rmse: that round's federated factors (the augmented U, V with
    # their bias rows, as the clients and the server hold them) on the eval set
    V, *Us = kept_state(model)
    U = np.empty((X.shape[0], V.shape[0]))
    for c, U_c in enumerate(Us):
        U[groups == c] = U_c
    rows = np.repeat(np.arange(test.shape[0]), np.diff(test.indptr))
    pred = model.mean_ + np.einsum("ij,ji->i", U[rows], V[:, test.indices])
    rmse = np.sqrt(np.mean((pred - test.data) ** 2))
    assert np.isclose(model.history_[model.best_iteration_ - 1]["eval_rmse"], rmse)
    assert seen == [r["eval_rmse"] for r in model.history_]


# ---- the best round, restored -----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(FAST))
def test_early_stopping_restores_the_best_round_exactly(name):
    """The kept model is the fit stopped at best_iteration_ without early stopping, on the
    same training part with the same validation ratings as eval set."""
    X = ratings()
    groups = labels(X.shape[0])
    model = FAST[name](max_iter=60, early_stopping=True, validation_fraction=0.2,
                       n_iter_no_change=3, random_state=SEED).fit(X, clients=groups)
    best = model.best_iteration_
    assert best < model.n_iter_ <= best + 3  # it stopped after 3 rounds without improvement
    assert model.factors_used_
    scores = model.validation_score_
    assert scores.shape == (model.n_iter_,) and scores.max() == model.best_validation_score_
    assert scores[best - 1] == model.best_validation_score_
    train, valid = validation_split(X, groups, N_CLIENTS, 0.2, SEED)
    ref = FAST[name](max_iter=best, early_stopping=False, random_state=SEED).fit(
        train, clients=groups, eval_set=valid)
    assert ref.mean_ == model.mean_
    for a, b in zip(model_arrays(model), model_arrays(ref)):
        assert_array_equal(a, b)
    for a, b in zip(kept_state(model), kept_state(ref)):  # the server's and the clients'
        assert_array_equal(a, b)
    assert ref.history_[-1]["eval_rmse"] == -model.best_validation_score_
    # the training part's rounds are recorded as validation, not as an eval set
    assert "eval_rmse" not in model.history_[0] and "validation_rmse" in model.history_[0]


@pytest.mark.parametrize("name", ["FedMAvg", "FedMGS", "FedMCADMM", "RFRec"])
def test_early_stopping_with_client_groups(name, monkeypatch):
    """One client per user, run in groups: the same rule and the same restore (the groups
    give the per-client model to rounding error)."""
    X = ratings(n_users=60)
    one_per_user = np.arange(X.shape[0])
    params = dict(max_iter=40, early_stopping=True, validation_fraction=0.2,
                  n_iter_no_change=3, random_state=SEED)
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 1)
    grouped = FAST[name](**params).fit(X, clients=one_per_user)
    assert type(grouped._federation.client_states).__name__ == "GroupStates"
    train, valid = validation_split(X, one_per_user, X.shape[0], 0.2, SEED)
    ref = FAST[name](**{**params, "max_iter": grouped.best_iteration_,
                        "early_stopping": False}).fit(train, clients=one_per_user,
                                                      eval_set=valid)
    # (the state, not the attributes: on this toy the floor of the biases may be kept)
    for a, b in zip(kept_state(grouped), kept_state(ref)):
        assert_array_equal(a, b)
    assert ref.history_[-1]["eval_rmse"] == -grouped.best_validation_score_
    monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", 10**9)
    single = FAST[name](**params).fit(X, clients=one_per_user)
    assert single.best_iteration_ == grouped.best_iteration_
    for a, b in zip(kept_state(grouped), kept_state(single)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_early_stopping_does_not_depend_on_n_jobs():
    X = ratings()
    fits = [FAST["FedMAvg"](max_iter=40, early_stopping=True, n_iter_no_change=3,
                            random_state=SEED, n_jobs=n_jobs).fit(X) for n_jobs in (1, 2)]
    assert fits[0].best_iteration_ == fits[1].best_iteration_
    for a, b in zip(model_arrays(fits[0]), model_arrays(fits[1])):
        assert_array_equal(a, b)


def test_warm_start_continues_from_the_best_round():
    """A warm start continues from the kept (best) round, with the same split; its model is
    never worse on validation than the previous one, and is unchanged unless beaten."""
    X = ratings()
    model = FAST["FedMAvg"](max_iter=60, early_stopping=True, n_iter_no_change=3,
                            validation_fraction=0.2, warm_start=True, random_state=SEED)
    model.fit(X)
    first = [a.copy() for a in model_arrays(model)]
    first_best, first_score = model.best_iteration_, model.best_validation_score_
    model.set_params(max_iter=5).fit(X)
    assert model.best_validation_score_ >= first_score
    assert model.n_iter_ > model.best_iteration_ or model.best_iteration_ > first_best
    if model.best_iteration_ == first_best:
        for a, b in zip(first, model_arrays(model)):
            assert_array_equal(a, b)


# ---- what reaches the server --------------------------------------------------------------
def test_validation_report_is_two_numbers_per_client():
    """Each client reports its squared-error sum and count on its own held-out ratings
    (nothing else), and the server's validation RMSE is made of those reports alone."""
    X = ratings()
    groups = labels(X.shape[0])
    seen = []

    def keep(round_number, info):
        seen.append((info["validation_reports"], dict(info["record"])))

    FedMAvg(max_iter=4, early_stopping=True, validation_fraction=0.25, random_state=SEED,
            callback=keep).fit(X, clients=groups)
    _, valid = validation_split(X, groups, N_CLIENTS, 0.25, SEED)
    held = np.bincount(groups, weights=np.diff(valid.indptr), minlength=N_CLIENTS)
    for reports, record in seen:
        assert sorted(reports) == list(range(N_CLIENTS))
        for client, report in reports.items():
            assert isinstance(report, tuple) and len(report) == 2
            assert all(isinstance(v, float) for v in report)
            assert report[1] == held[client]
        sse = sum(r[0] for r in reports.values())
        assert np.isclose(np.sqrt(sse / valid.nnz), record["validation_rmse"])


def test_validation_report_is_counted_in_the_bytes():
    """The same training (the eval set as validation set): a validated round uploads 16
    more bytes per client, the two numbers (8 bytes each, as the engine counts a float)."""
    X = ratings()
    train, test = train_test_split_ratings(X, 0.2, random_state=0)
    runs = [FedMAvg(max_iter=3, early_stopping=on, validation_fraction=None,
                    n_iter_no_change=10, random_state=SEED).fit(train, eval_set=test)
            for on in (False, True)]
    n = runs[1].n_clients_
    for off, on in zip(runs[0].history_[:-1], runs[1].history_[:-1]):
        assert on["bytes_uploaded"] - off["bytes_uploaded"] == 16 * n
        assert on["bytes_downloaded"] == off["bytes_downloaded"]
    # the last round also carries the biases-only floor: its rounds and one more number
    assert runs[1].history_[-1]["bytes_uploaded"] - runs[0].history_[-1]["bytes_uploaded"] > (
        16 * n + 8 * n)


# ---- never worse than biases --------------------------------------------------------------
@pytest.mark.parametrize("cls, solver_params", [
    (FedMCADMM, None), (FedMAvg, None), (FedMAvg, {"variant": "fedmc_admm"}), (FedMGS, None),
    (RFRec, None), (RFRec, {"variant": "rfrecf"})], ids=[
    "FedMCADMM", "FedMAvg", "FedMAvg-admm", "FedMGS", "RFRec", "RFRecF"])
def test_defaults_match_biases_alone_when_there_is_no_interaction(cls, solver_params):
    """On ratings made of biases and noise alone, every estimator's and variant's defaults
    end within 0.005 RMSE of the biases-only model on a held-out part."""
    data = make_site_ratings("douban", n_ratings=30_000, interaction=0.0, random_state=0)
    train, test = train_test_split_ratings(data.X, 0.2, random_state=0)
    floor = -FedBaseline(random_state=0).fit(train).score(train, test)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = cls(random_state=0, solver_params=solver_params).fit(train)
    rmse = -model.score(train, test)
    assert rmse <= floor + 0.005, (rmse, floor)
    if not model.factors_used_:  # the fallback says so, once
        fallback = [w for w in caught if issubclass(w.category, DegenerateFitWarning)]
        assert len(fallback) == 1 and "biases alone" in str(fallback[0].message)
        assert not model.components_.any() and not model.user_factors_.any()


@pytest.mark.slow  # a LocalCluster of 2 processes and 60 rounds of Dask tasks (about a minute)
def test_early_stopping_on_dask():
    """On Dask workers (one block per client, states back in this process) the kept model
    is the local one: same split, same best round, same arrays."""
    distributed = pytest.importorskip(
        "distributed", reason="the optional 'dask' extra is not installed")
    from joblib import parallel_config

    X = ratings()
    params = dict(max_iter=60, early_stopping=True, validation_fraction=0.2,
                  n_iter_no_change=3, random_state=SEED)
    local = FAST["FedMAvg"](**params).fit(X)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=None) as cluster, \
            distributed.Client(cluster), parallel_config(backend="dask"):
        remote = FAST["FedMAvg"](**params, n_jobs=2).fit(X)
    assert remote.best_iteration_ == local.best_iteration_ < remote.n_iter_
    for a, b in zip(kept_state(local), kept_state(remote)):
        assert_array_equal(a, b)


def test_the_kept_floor_is_fitted_on_every_training_rating():
    """When the biases win on the validation ratings, the fit keeps the biases-only model
    refitted on all its training ratings, the held-out part included: the fitted biases are
    those of FedBaseline on the whole of ``X`` with the same clients."""
    X = make_site_ratings("douban", n_ratings=20_000, interaction=0.0, random_state=0).X
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateFitWarning)
        # (one round from a small start has not fitted the biases yet: the floor wins)
        model = RFRec(max_iter=1, random_state=0).fit(X)
    assert not model.factors_used_
    floor = FedBaseline(n_clients=model.n_clients_, random_state=0,
                        solver_params={"eval_every": 0}).fit(X, clients=model.clients_)
    np.testing.assert_allclose(model.user_bias_, floor.user_bias_, atol=1e-10)
    np.testing.assert_allclose(model.item_bias_ + model.mean_, floor.item_bias_ + floor.mean_,
                               atol=1e-10)
