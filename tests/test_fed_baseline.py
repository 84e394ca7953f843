"""FedBaseline, the federated biases-only model: the oracles are a centralized ALS written here
in a few numpy lines and Surprise's ``BaselineOnly`` (``method="als"``)."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf import FedBaseline, RatingRegressor
from sklearn_fedmf.completion._fed_baseline import _fed_baseline_protocol as protocol
from sklearn_fedmf.datasets import load_movielens
from sklearn_fedmf.exceptions import DegenerateFitWarning, FedMFWarning
from sklearn_fedmf.model_selection import default_search_space, train_test_split_ratings


def als_baseline(X, alpha_u, alpha_v, n_rounds):
    """Centralized ALS on ``mean + b_u + b_i``, items first (Surprise's order): ``b_u`` after
    ``n_rounds`` user steps, ``b_i`` after ``n_rounds + 1`` item steps."""
    X = sp.csr_matrix(X)
    mean = X.data.mean()
    x = X.data - mean
    rows, cols = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr)), X.indices
    n_u = np.bincount(rows, minlength=X.shape[0])
    n_i = np.bincount(cols, minlength=X.shape[1])
    b_u = np.zeros(X.shape[0])
    b_i = np.bincount(cols, weights=x - b_u[rows], minlength=X.shape[1]) / (alpha_v + n_i)
    for _ in range(n_rounds):
        b_u = np.bincount(rows, weights=x - b_i[cols], minlength=X.shape[0]) / (alpha_u + n_u)
        b_i = np.bincount(cols, weights=x - b_u[rows], minlength=X.shape[1]) / (alpha_v + n_i)
    return mean, b_u, b_i


def bias_ratings(n_users=200, n_items=80, density=0.3, noise=0.3, seed=0):
    """Ratings ``3 + b_u + b_i + noise`` (no interaction) and the noise-free matrix."""
    rng = np.random.default_rng(seed)
    R = 3.0 + rng.normal(size=(n_users, 1)) + 0.7 * rng.normal(size=(1, n_items))
    observed = rng.random(R.shape) < density
    observed[np.arange(n_users), rng.integers(n_items, size=n_users)] = True
    noisy = R + noise * rng.normal(size=R.shape)
    return sp.csr_matrix((noisy[observed], np.nonzero(observed)), shape=R.shape), R


@pytest.fixture(scope="module")
def movielens_split():
    X = load_movielens().X
    return train_test_split_ratings(X, 0.2, random_state=0)


def _fit(estimator, X, **fit_params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)  # (unrated items of a split)
        return estimator.fit(X, **fit_params)


@pytest.mark.parametrize("n_clients", [1, 7, 200])
def test_full_participation_is_centralized_als(n_clients):
    X, _ = bias_ratings()
    model = FedBaseline(alpha_u=3.0, alpha_v=2.0, n_clients=n_clients, max_iter=6,
                        random_state=0).fit(X)
    mean, b_u, b_i = als_baseline(X, 3.0, 2.0, 6)
    assert model.mean_ == pytest.approx(mean, abs=1e-12)
    np.testing.assert_allclose(model.user_bias_, b_u, rtol=0, atol=1e-10)
    np.testing.assert_allclose(model.item_bias_, b_i, rtol=0, atol=1e-10)
    assert model.components_.shape == (0, X.shape[1])
    assert model.user_factors_.shape == (X.shape[0], 0)


def test_objective_is_the_penalized_loss_and_never_increases():
    X, _ = bias_ratings()
    model = FedBaseline(alpha_u=3.0, alpha_v=2.0, n_clients=5, max_iter=8, random_state=0)
    model.fit(X)
    objectives = [r["objective"] for r in model.history_]
    assert np.all(np.diff(objectives) <= 1e-9 * objectives[0])
    x = X.data - model.mean_
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    residual = x - model.user_bias_[rows] - model.item_bias_[X.indices]
    expected = 0.5 * (residual @ residual + 3.0 * model.user_bias_ @ model.user_bias_
                      + 2.0 * model.item_bias_ @ model.item_bias_)
    assert objectives[-1] == pytest.approx(expected, rel=1e-12)
    assert model.history_[-1]["train_rmse"] == pytest.approx(np.sqrt(np.mean(residual ** 2)))


def test_surprise_baseline_only_als(movielens_split):
    surprise = pytest.importorskip("surprise", reason="the oracle is Surprise's BaselineOnly")
    import pandas as pd

    train, test = movielens_split
    coo = train.tocoo()
    data = surprise.Dataset.load_from_df(
        pd.DataFrame({"u": coo.row, "i": coo.col, "r": coo.data}),
        surprise.Reader(rating_scale=(0.5, 5.0)))
    trainset = data.build_full_trainset()

    def baseline_only(n_epochs):
        return surprise.BaselineOnly(bsl_options={"method": "als", "n_epochs": n_epochs},
                                     verbose=False).fit(trainset)

    # Surprise's defaults (FedBaseline's before "auto")
    model = _fit(FedBaseline(alpha_u=15.0, alpha_v=10.0, max_iter=10, random_state=0), train)
    # the same iterates: b_u after 10 epochs, b_i after 11 (round k: user step k, item k+1)
    rated_users = np.flatnonzero(np.diff(train.indptr))
    rated_items = np.unique(train.indices)
    inner_u = [trainset.to_inner_uid(u) for u in rated_users]
    inner_i = [trainset.to_inner_iid(i) for i in rated_items]
    np.testing.assert_allclose(model.user_bias_[rated_users], baseline_only(10).bu[inner_u],
                               rtol=0, atol=1e-10)
    np.testing.assert_allclose(model.item_bias_[rated_items], baseline_only(11).bi[inner_i],
                               rtol=0, atol=1e-10)
    # and the same test RMSE on the 80/20 split, both with their defaults (clipped)
    test_coo = test.tocoo()
    algo = baseline_only(10)
    theirs = np.array([algo.predict(u, i).est for u, i in zip(test_coo.row, test_coo.col)])
    surprise_rmse = np.sqrt(np.mean((theirs - test_coo.data) ** 2))
    ours = -_fit(FedBaseline(alpha_u=15.0, alpha_v=10.0, random_state=0), train).score(
        train, test)
    assert abs(ours - surprise_rmse) < 1e-3
    assert ours < 0.87  # (0.8661 measured; the global mean gives about 1.04)


def test_uploads_hold_only_item_aggregates_on_rated_items():
    X, _ = bias_ratings(n_users=60)
    uploads = []
    model = FedBaseline(n_clients=4, max_iter=3, random_state=0,
                        callback=lambda k, info: uploads.append(info["uploads"])).fit(X)
    rated = {c: np.unique(X[model.clients_ == c].indices) for c in range(4)}
    init = {c: protocol.init_client(_block(X, model.clients_ == c), None, None)[1]
            for c in range(4)}
    assert set(init[0]) == {"items", "counts", "sums"}
    for c, upload in init.items():
        np.testing.assert_array_equal(upload["items"], rated[c])
        np.testing.assert_array_equal(upload["counts"],
                                      np.bincount(X[model.clients_ == c].indices)[rated[c]])
    for round_uploads in uploads:
        assert sorted(round_uploads) == [0, 1, 2, 3]
        for c, upload in round_uploads.items():
            assert set(upload) == {"items", "sums"}  # no b_u, no rating, no user index
            np.testing.assert_array_equal(upload["items"], rated[c])
            assert upload["sums"].shape == rated[c].shape


def _block(X, mask):
    from sklearn_fedmf.engine._client_data import ClientBlock

    Xc = X[np.flatnonzero(mask)]
    Xc.data -= X.data.mean()
    return ClientBlock(np.flatnonzero(mask), Xc, None)


def test_the_server_needs_only_the_sum_of_the_uploads():
    # (what secure aggregation hides the single uploads behind)
    n_items = 6
    state, _ = protocol.init_server(None, n_items=n_items)
    state, _ = protocol.server_init_uploads(
        state, {0: {"items": np.array([0, 2, 5]), "counts": np.array([1, 2, 1]),
                    "sums": np.array([1.0, -2.0, 0.5])},
                1: {"items": np.array([1, 2]), "counts": np.array([3, 1]),
                    "sums": np.array([0.3, 0.4])}}, alpha_v=1.0)
    a = {"items": np.array([0, 2, 5]), "sums": np.array([0.1, 0.2, -0.3])}
    b = {"items": np.array([1, 2]), "sums": np.array([-0.4, 0.5])}
    total = np.zeros(n_items)
    for upload in (a, b):
        total[upload["items"]] += upload["sums"]
    apart = protocol.server_update(state, {0: a, 1: b}, 0, alpha_v=1.0)[1]
    summed = protocol.server_update(state, {0: {"items": np.arange(n_items), "sums": total}},
                                    0, alpha_v=1.0)[1]
    np.testing.assert_allclose(apart, summed, rtol=0, atol=1e-15)


def test_bytes_are_the_item_aggregates():
    X, _ = bias_ratings(n_users=60)
    model = FedBaseline(n_clients=4, max_iter=2, random_state=0).fit(X)
    k = sum(len(np.unique(X[model.clients_ == c].indices)) for c in range(4))
    # int32 item indices; init: int32 counts and float64 sums, then float64 changes
    assert model.history_[0]["bytes_uploaded"] == 4 * 24 + k * (4 + 4 + 8) + k * (4 + 8)
    assert model.history_[1]["bytes_uploaded"] == k * (4 + 8)
    assert model.history_[1]["bytes_downloaded"] == 4 * X.shape[1] * 8  # b_i to each client
    # "auto": three float64 sums per client up, alpha_u down, in the first round's record
    fixed = FedBaseline(alpha_u=15.0, alpha_v=10.0, n_clients=4, max_iter=2,
                        random_state=0).fit(X)
    assert model.history_[0]["bytes_uploaded"] - fixed.history_[0]["bytes_uploaded"] == 4 * 24
    assert (model.history_[0]["bytes_downloaded"]
            - fixed.history_[0]["bytes_downloaded"]) == 4 * 8


def test_n_jobs_does_not_change_the_model():
    X, _ = bias_ratings()
    params = dict(n_clients=6, clients_per_round=0.5, max_iter=5, random_state=0)
    one = FedBaseline(n_jobs=1, **params).fit(X)
    two = FedBaseline(n_jobs=2, **params).fit(X)
    np.testing.assert_array_equal(one.item_bias_, two.item_bias_)
    np.testing.assert_array_equal(one.user_bias_, two.user_bias_)
    assert [r["objective"] for r in one.history_] == [r["objective"] for r in two.history_]


@pytest.mark.parametrize("partial", [dict(clients_per_round=2),
                                     dict(solver_params={"dropout": 0.5})])
def test_partial_participation_reaches_the_same_model(partial):
    # a client that is not sampled (or drops out) keeps b_u, so its sums at the server stay
    # exact: randomized block coordinate descent on the same objective, to the same minimizer
    # (Surprise's strengths: "auto" is about 0.1 on these nearly noise-free biases, where
    # b_u + c, b_i - c is an almost flat direction that 60 rounds do not settle)
    X, _ = bias_ratings()
    strengths = dict(alpha_u=15.0, alpha_v=10.0)
    full = FedBaseline(n_clients=6, max_iter=60, random_state=0, **strengths).fit(X)
    partial = FedBaseline(n_clients=6, max_iter=400, random_state=0, **strengths,
                          **partial).fit(X)
    np.testing.assert_allclose(partial.item_bias_, full.item_bias_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(partial.user_bias_, full.user_bias_, rtol=0, atol=1e-8)


def test_warm_start_continues_the_rounds():
    X, _ = bias_ratings()
    once = FedBaseline(n_clients=4, max_iter=6, random_state=0).fit(X)
    warm = FedBaseline(n_clients=4, max_iter=3, warm_start=True, random_state=0).fit(X)
    warm.fit(X)
    assert warm.n_iter_ == 6
    np.testing.assert_allclose(warm.item_bias_, once.item_bias_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(warm.user_bias_, once.user_bias_, rtol=0, atol=1e-12)


def test_search_space_holds_the_defaults():
    space = default_search_space(FedBaseline())
    assert set(space) == {"alpha_u", "alpha_v"}
    assert "auto" in space["alpha_u"] and "auto" in space["alpha_v"]


def test_biases_only_data_fit_to_the_noise_level():
    # rating-like noise, about 120 ratings per user and per item: Surprise's shrinkage
    # (alpha_u=15, alpha_v=10) costs about 1 % over the noise, "auto" no more
    X, R = bias_ratings(n_users=300, n_items=300, density=0.5, noise=1.0, seed=1)
    train, test = train_test_split_ratings(X, 0.2, random_state=0)
    rmse = -FedBaseline(random_state=0).fit(train).score(train, test)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(test.indptr))
    truth_rmse = np.sqrt(np.mean((R[rows, test.indices] - test.data) ** 2))  # the noise
    assert rmse < 1.03 * truth_rmse


def test_transform_folds_in_the_user_bias():
    X, _ = bias_ratings()
    model = FedBaseline(n_clients=5, random_state=0).fit(X)
    new = X[:7].toarray()
    new[new == 0] = np.nan
    B = model.transform(new)
    assert B.shape == (7, 1)
    rows, items = np.nonzero(~np.isnan(new))
    dev = np.bincount(rows, weights=new[rows, items] - model.mean_ - model.item_bias_[items],
                      minlength=7)
    np.testing.assert_allclose(B[:, 0], dev / (model.alpha_u_ + np.bincount(rows, minlength=7)),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(model.inverse_transform(B), model.mean_ + B + model.item_bias_)
    np.testing.assert_allclose(model.fit_transform(X), model.transform(X))
    with pytest.raises(ValueError, match="takes one: the user biases"):
        model.inverse_transform(np.ones((2, 3)))


def test_predict_is_the_clipped_bias_model_and_cold_rows_get_the_item_bias():
    X, _ = bias_ratings(noise=1.0)
    X.data = np.clip(np.round(X.data), 1, 5)  # stars: mean + b_u + b_i may leave 1..5
    model = FedBaseline(alpha_u=0.1, alpha_v=0.1, n_clients=5, random_state=0).fit(X)
    raw = model.mean_ + model.transform(X) + model.item_bias_  # predict folds b_u in
    assert raw.max() > model.rating_range_[1] or raw.min() < model.rating_range_[0]
    np.testing.assert_allclose(model.predict(X), np.clip(raw, *model.rating_range_),
                               atol=1e-12)
    unclipped = FedBaseline(alpha_u=0.1, alpha_v=0.1, n_clients=5, clip=False,
                            random_state=0).fit(X)
    np.testing.assert_allclose(unclipped.predict(X), raw, atol=1e-12)
    assert np.abs(raw - unclipped.inverse_transform(unclipped.transform(X))).max() < 1e-12
    cold = np.full((1, X.shape[1]), np.nan)
    np.testing.assert_allclose(unclipped.predict(cold)[0], model.mean_ + model.item_bias_)


def test_rating_regressor_pairs_and_recommend():
    X, _ = bias_ratings()
    coo = X.tocoo()
    pairs, y = np.column_stack([coo.row, coo.col]), coo.data
    reg = RatingRegressor(FedBaseline(n_clients=5, random_state=0)).fit(pairs, y)
    est = reg.estimator_
    expected = np.clip(est.mean_ + est.user_bias_[reg._encode(coo.row, reg._user_index)]
                       + est.item_bias_[reg._encode(coo.col, reg._item_index)],
                       *est.rating_range_)
    np.testing.assert_allclose(reg.predict(pairs), expected, atol=1e-12)
    # an unseen user gets the item's bias, an unseen item the user's
    item, user = coo.col[0], coo.row[0]
    cold = reg.predict(np.array([[10_000, item], [user, 10_000]]))
    np.testing.assert_allclose(cold, np.clip(
        [est.mean_ + est.item_bias_[reg._encode(np.array([item]), reg._item_index)[0]],
         est.mean_ + est.user_bias_[reg._encode(np.array([user]), reg._user_index)[0]]],
        *est.rating_range_), atol=1e-12)
    # one user's ranking is the item biases' among the items it has not rated
    items, _ = reg.recommend(coo.row[0], n=5)
    seen = set(coo.col[coo.row == coo.row[0]])
    unseen = [i for i in reg.items_ if i not in seen]
    bias = {i: est.item_bias_[reg._encode(np.array([i]), reg._item_index)[0]] for i in unseen}
    assert list(items) == sorted(unseen, key=lambda i: -bias[i])[:5]


def test_eval_set_history():
    X, _ = bias_ratings()
    train, test = train_test_split_ratings(X, 0.2, random_state=0)
    model = FedBaseline(n_clients=5, max_iter=4, clip=False, random_state=0).fit(
        train, eval_set=test)
    assert len(model.history_) == 4
    for key in ("objective", "train_rmse", "eval_rmse", "bytes_uploaded", "bytes_downloaded"):
        assert key in model.history_[-1]
    rows = np.repeat(np.arange(X.shape[0]), np.diff(test.indptr))
    pred = model.mean_ + model.user_bias_[rows] + model.item_bias_[test.indices]
    assert model.history_[-1]["eval_rmse"] == pytest.approx(
        np.sqrt(np.mean((pred - test.data) ** 2)), rel=1e-12)


def test_zero_biases_are_a_degenerate_fit():
    X, _ = bias_ratings()
    X.data[:] = 4.0  # every rating the mean: nothing to fit
    with pytest.warns(DegenerateFitWarning, match="biases are all zero"):
        model = FedBaseline(n_clients=3, max_iter=2, random_state=0).fit(X)
    assert "all zero" in model.degenerate_
    with warnings.catch_warnings():
        warnings.simplefilter("error", DegenerateFitWarning)
        healthy = FedBaseline(n_clients=3, max_iter=2, random_state=0).fit(bias_ratings()[0])
    assert healthy.degenerate_ is None


@pytest.mark.parametrize("rows_per_client", [1, 3])
@pytest.mark.parametrize("participation", ["some", "all_active", "every"])
def test_batched_phases_equal_the_per_client_functions(rows_per_client, participation):
    """A group's phases give each client's per-client state and message, bit for bit (the
    same sums in the same order), and leave inactive clients and their input unchanged;
    with every client active (and selected), the paths that take the group's rows whole."""
    from sklearn_fedmf.engine._groups import make_groups

    X, _ = bias_ratings(n_users=60, n_items=25)
    X.data -= X.data.mean()
    codes = np.arange(X.shape[0]) // rows_per_client
    n = codes[-1] + 1
    rng = np.random.default_rng(0)
    item_bias = rng.normal(size=X.shape[1])
    for group in make_groups(X, codes, n, n_groups=3):
        state, uploads = protocol.batched_init_client(group, None, None)
        assert set(uploads) == set(range(group.start, group.stop))
        for i in range(group.n_clients):
            ref, ref_up = protocol.init_client(group.block(i), None, None)
            got = protocol.client_state(state, group, i)
            for key in ("U", "items", "inverse"):
                np.testing.assert_array_equal(got[key], ref[key])
                assert got[key].dtype == ref[key].dtype
            for key in ("items", "counts", "sums"):
                assert uploads[group.start + i][key].tobytes() == ref_up[key].tobytes()
        active = rng.random(group.n_clients) < 0.7
        selected = active & (rng.random(group.n_clients) < 0.7)
        if participation != "some":
            active[:] = True
            selected = np.ones(group.n_clients, dtype=bool) if participation == "every" else (
                np.arange(group.n_clients) % 2 == 0)
        new, uploads = protocol.batched_client_update(state, group, item_bias, None, active,
                                                      selected, alpha_u=2.0)
        assert set(uploads) == {group.start + i for i in np.flatnonzero(selected)}
        for i in range(group.n_clients):
            before = protocol.client_state(state, group, i)
            got = protocol.client_state(new, group, i)["U"]
            if not active[i]:
                np.testing.assert_array_equal(got, before["U"])
                continue
            ref, ref_up = protocol.client_update(before, group.block(i), item_bias, None,
                                                 selected[i], alpha_u=2.0)
            assert got.tobytes() == ref["U"].tobytes()
            if selected[i]:
                assert uploads[group.start + i]["sums"].tobytes() == ref_up["sums"].tobytes()
        assert not np.shares_memory(new["U"], state["U"])  # the input state is untouched


def test_grouped_fit_is_the_per_client_fit(monkeypatch):
    """Many clients run in groups: the same biases, bit for bit, as one client at a time."""
    X, _ = bias_ratings()
    fits = []
    for group_min in (10**9, 1):
        monkeypatch.setattr("sklearn_fedmf.engine._fit.GROUP_MIN_CLIENTS", group_min)
        fits.append(FedBaseline(n_clients=10, clients_per_round=0.5, max_iter=5,
                                random_state=0).fit(X, clients=np.arange(X.shape[0])))
    for key in ("user_bias_", "item_bias_"):
        assert getattr(fits[0], key).tobytes() == getattr(fits[1], key).tobytes()
    assert fits[0].history_[-1]["bytes_uploaded"] == fits[1].history_[-1]["bytes_uploaded"]


# ---- the "auto" strengths (empirical Bayes from summed moments) -----------------------------
def random_effects(n_users, n_items, n_ratings, tau_u, tau_i, sigma, seed=0, item_weights=None):
    """``x = b_u + b_i + e`` at ``n_ratings`` distinct random pairs (items drawn with
    ``item_weights``), with the biases' and the noise's standard deviations given."""
    rng = np.random.default_rng(seed)
    pairs = set()
    while len(pairs) < n_ratings:
        users = rng.integers(n_users, size=n_ratings)
        items = rng.choice(n_items, size=n_ratings, p=item_weights)
        pairs.update(zip(users.tolist(), items.tolist()))
    users, items = np.array(sorted(pairs)[:n_ratings]).T
    x = (tau_u * rng.normal(size=n_users)[users] + tau_i * rng.normal(size=n_items)[items]
         + sigma * rng.normal(size=users.size))
    return sp.csr_matrix((x, (users, items)), shape=(n_users, n_items))


@pytest.mark.parametrize("heavy_tail", [False, True])
def test_auto_strengths_recover_noise_over_bias_variance(heavy_tail):
    # the truth: alpha_u = sigma^2 / tau_u^2 = 2.25, alpha_v = sigma^2 / tau_i^2 = 4; with a
    # heavy tail of items most items have one or two ratings (Ciao-like), where the one-way
    # analyses of _auto_strengths.bias_shrinkages give a far too small alpha_v
    weights = None
    if heavy_tail:
        weights = 1.0 / np.arange(1, 20_001) ** 0.9
        weights /= weights.sum()
    X = random_effects(3000, 20_000 if heavy_tail else 600, 60_000, tau_u=0.6, tau_i=0.45,
                       sigma=0.9, item_weights=weights)
    X.data -= X.data.mean()
    alpha_u, alpha_v = protocol.moment_strengths(X)
    assert alpha_u == pytest.approx(2.25, rel=0.15)
    assert alpha_v == pytest.approx(4.0, rel=0.15)


def test_auto_strengths_are_free_of_the_ratings_unit():
    X = random_effects(400, 150, 8000, tau_u=0.6, tau_i=0.45, sigma=0.9)
    ten = X.copy()
    ten.data = 10.0 * ten.data + 3.0
    one = FedBaseline(n_clients=5, max_iter=5, random_state=0).fit(X)
    other = FedBaseline(n_clients=5, max_iter=5, random_state=0).fit(ten)
    assert other.alpha_u_ == pytest.approx(one.alpha_u_, rel=1e-9)
    assert other.alpha_v_ == pytest.approx(one.alpha_v_, rel=1e-9)
    np.testing.assert_allclose(other.item_bias_, 10.0 * one.item_bias_, rtol=1e-9, atol=1e-9)


def test_auto_strengths_beat_surprises_on_noisy_biases():
    # Surprise's 15 and 10 over-shrink biases estimated from about 20 ratings each
    X = random_effects(500, 400, 12_000, tau_u=0.6, tau_i=0.45, sigma=0.9, seed=1)
    train, test = train_test_split_ratings(X, 0.2, random_state=0)
    auto = -FedBaseline(random_state=0).fit(train).score(train, test)
    surprise = -FedBaseline(alpha_u=15.0, alpha_v=10.0, random_state=0).fit(train).score(
        train, test)
    assert auto < surprise - 0.002


def test_auto_is_the_fit_with_its_numbers():
    # "auto" only chooses the numbers: the fit with them given is the same, bit for bit (so
    # numbers keep their meaning); the numbers are the rule's on the fit's training ratings
    X, _ = bias_ratings(noise=1.0)
    auto = FedBaseline(n_clients=4, max_iter=5, random_state=0).fit(X)
    fixed = FedBaseline(alpha_u=auto.alpha_u_, alpha_v=auto.alpha_v_, n_clients=4, max_iter=5,
                        random_state=0).fit(X)
    np.testing.assert_array_equal(auto.item_bias_, fixed.item_bias_)
    np.testing.assert_array_equal(auto.user_bias_, fixed.user_bias_)
    centred = X.copy()
    centred.data -= auto.mean_
    assert (auto.alpha_u_, auto.alpha_v_) == protocol.moment_strengths(centred)
    # one strength given, the other "auto"
    half = FedBaseline(alpha_u=15.0, n_clients=4, max_iter=5, random_state=0).fit(X)
    assert (half.alpha_u_, half.alpha_v_) == (15.0, auto.alpha_v_)


def test_auto_secure_equals_plain():
    pytest.importorskip("cryptography", reason="secure aggregation's key agreement")
    X, _ = bias_ratings(noise=1.0)
    plain = FedBaseline(n_clients=4, max_iter=4, random_state=0).fit(X)
    secure = FedBaseline(n_clients=4, max_iter=4, random_state=0,
                         secure_aggregation=True).fit(X)
    assert (secure.alpha_u_, secure.alpha_v_) == (plain.alpha_u_, plain.alpha_v_)
    np.testing.assert_allclose(secure.item_bias_, plain.item_bias_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(secure.user_bias_, plain.user_bias_, rtol=0, atol=1e-8)


def test_strengths_from_moments_degenerate_cases():
    # no rating or no variation: no shrinkage; every user with one rating (a user's bias and
    # the noise cannot be told apart): finite, non-negative strengths
    assert protocol.strengths_from_moments(n_ratings=0, n_users=0, n_items=0, sum_squares=0.0,
                                           between_users=0.0, between_items=0.0) == (0.0, 0.0)
    rng = np.random.default_rng(0)
    X = sp.csr_matrix((rng.normal(size=2000), (np.arange(2000), rng.integers(50, size=2000))),
                      shape=(2000, 50))
    alpha_u, alpha_v = protocol.moment_strengths(X)
    assert np.isfinite([alpha_u, alpha_v]).all() and min(alpha_u, alpha_v) >= 0
