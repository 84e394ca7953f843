"""FedBlend: members over one federation, weights from summed validation statistics."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV, KFold

from sklearn_fedmf import FedBaseline, FedBlend, FedMCADMM, FedMGS, RatingRegressor, RFRec
from sklearn_fedmf.completion._fed_blend._fed_blend_stats import blend_design
from sklearn_fedmf.datasets import make_ratings, make_site_ratings
from sklearn_fedmf.engine._fit import validation_split
from sklearn_fedmf.exceptions import FedMFWarning


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FedMFWarning)
        yield


@pytest.fixture(scope="module")
def X():
    return make_ratings(150, 50, 3000, random_state=0).X


def _members(clip=True):
    return [("biases", FedBaseline(max_iter=10, clip=clip)),
            ("mgs", FedMGS(n_components=3, max_iter=15, early_stopping=True, clip=clip)),
            ("admm", FedMCADMM(n_components=2, max_iter=10, early_stopping=False, clip=clip))]


def _blend(**params):
    """Three small members; without refit unless asked (the members as validated)."""
    params = {"refit": False, **params}
    return FedBlend(_members(params.pop("clip", True)), n_clients=4, random_state=0, **params)


def _validation(blend, X):
    """The validation ratings the blend held out (the same function, the fit's seed)."""
    codes = np.unique(blend.clients_, return_inverse=True)[1]
    return validation_split(X, codes, blend.n_clients_, blend.validation_fraction,
                            blend._entropy)


def test_each_member_holds_out_the_entries_it_would_hold_out_alone(X):
    # A member fitted alone with the blend's seed, partition and validation_fraction (its own
    # early stopping on its own held-out ratings) is the blend's member exactly: same
    # training ratings, same validation ratings, same seed stream.
    blend = _blend().fit(X)
    member = blend.named_estimators_["mgs"]
    assert member.factors_used_  # (else the member alone would refit its floor on all)
    alone = FedMGS(n_components=3, max_iter=15, early_stopping=True, validation_fraction=0.1,
                   random_state=blend._entropy).fit(X, clients=blend.clients_)
    assert alone.best_iteration_ == member.best_iteration_
    np.testing.assert_array_equal(alone.components_, member.components_)
    np.testing.assert_array_equal(alone.user_factors_, member.user_factors_)
    # and they saw the same training ratings as the biases member
    assert blend.named_estimators_["biases"].mean_ == member.mean_ == blend.mean_


def test_weights_are_the_centralized_ridge_on_the_validation_ratings(X):
    blend = _blend(final_alpha=30.0).fit(X)
    _, X_valid = _validation(blend, X)
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X_valid.indptr))
    P = np.column_stack([_raw(m, rows, X_valid.indices) for m in blend.estimators_])
    z = np.log1p(np.diff(X.indptr))[rows] - np.log1p(X.nnz / X.shape[0])
    D = blend_design(P - blend.mean_, z)
    r = X_valid.data - blend.mean_
    K = len(blend.estimators_)
    pen = np.diag(np.r_[0.0, np.ones(K), 0.0, np.ones(K)])
    target = np.r_[0.0, np.full(K, 1 / K), np.zeros(K + 1)]
    coef = np.linalg.solve(D.T @ D + 30.0 * pen, D.T @ r + 30.0 * pen @ target)
    np.testing.assert_allclose(blend.weights_, coef[1:K + 1], atol=1e-10)
    np.testing.assert_allclose(blend.activity_coef_, coef[K + 1:], atol=1e-10)
    assert blend.intercept_ == pytest.approx(coef[0], abs=1e-10)
    rmse = np.sqrt(np.mean((r - D @ coef) ** 2))
    assert blend.validation_rmse_ == pytest.approx(rmse, rel=1e-10)
    for k, name in enumerate(blend.named_estimators_):
        member_rmse = np.sqrt(np.mean((r - (P[:, k] - blend.mean_)) ** 2))
        assert blend.member_validation_rmse_[name] == pytest.approx(member_rmse, rel=1e-10)


def _raw(member, rows, cols):
    from sklearn_fedmf._pairs import predict_pairs

    return predict_pairs(member._factor_model(), rows, cols, member.mean_)


@pytest.mark.parametrize("activity", [False, True])
def test_unpenalized_blend_validates_at_least_as_well_as_every_member(X, activity):
    # With final_alpha=0 the blend is least squares over a family holding each member alone
    # (weight 1 on it, 0 elsewhere): its validation error cannot exceed any member's.
    blend = _blend(final_alpha=0.0, activity_weights=activity).fit(X)
    assert blend.validation_rmse_ <= min(blend.member_validation_rmse_.values()) + 1e-12


def test_secure_sums_give_the_plain_weights(X):
    plain = _blend().fit(X)
    secure = _blend(secure_aggregation=True).fit(X)
    np.testing.assert_allclose(secure.weights_, plain.weights_, atol=1e-6)
    np.testing.assert_allclose(secure.activity_coef_, plain.activity_coef_, atol=1e-6)
    assert secure.history_[-1]["bytes_uploaded"] > plain.history_[-1]["bytes_uploaded"]


def test_a_client_sends_only_its_sums(X):
    seen = []

    def callback(k, info):
        if info.get("member") == "blend":
            seen.append(info["uploads"])

    blend = _blend(callback=callback).fit(X)
    assert len(seen) == 1
    uploads = seen[0]
    K = len(blend.estimators_)
    columns = 2 * K + 2  # [1, P, z, z P]
    _, X_valid = _validation(blend, X)
    codes = np.unique(blend.clients_, return_inverse=True)[1]
    assert sorted(uploads) == list(range(blend.n_clients_))
    for c, upload in uploads.items():
        # the same four sums whatever the client's number of ratings: no rating, no factor
        assert set(upload) == {"gram", "cross", "ss", "count"}
        assert upload["gram"].shape == (columns, columns)
        assert upload["cross"].shape == (columns,)
        assert upload["ss"].shape == upload["count"].shape == (1,)
        assert upload["count"][0] == X_valid[codes == c].nnz
    # what the server received is what the blend's record counts
    assert blend.history_[-1]["bytes_uploaded"] == sum(
        sum(v.nbytes for v in u.values()) for u in uploads.values())


def test_history_and_rounds_are_the_members_plus_the_blend(X):
    blend = _blend().fit(X)
    members = [r for r in blend.history_ if r["member"] != "blend"]
    assert blend.n_iter_ == sum(m.n_iter_ for m in blend.estimators_) + 1
    assert len(members) == blend.n_iter_ - 1
    for name, member in blend.named_estimators_.items():
        mine = [r for r in members if r["member"] == name]
        assert sum(r["bytes_uploaded"] for r in mine) == sum(
            r["bytes_uploaded"] for r in member.history_)
    last = blend.history_[-1]
    assert last["member"] == "blend"
    assert last["weights"] == dict(zip(blend.named_estimators_, blend.weights_.tolist()))
    assert last["member_validation_rmse"] == blend.member_validation_rmse_


@pytest.mark.parametrize("activity", [False, True])
def test_the_blended_factor_model_is_the_weighted_sum_of_the_members(X, activity):
    # members without clipping: the blend adds their raw predictions, then clips
    blend = _blend(clip=False, activity_weights=activity).fit(X)
    rng = np.random.default_rng(1)
    new = sp.random(20, X.shape[1], density=0.2, random_state=2, format="csr")
    new.data = rng.integers(1, 6, new.nnz).astype(float)
    new = sp.vstack([new[:3], sp.csr_matrix((1, X.shape[1])), new[4:]]).tocsr()  # a cold row
    at = sp.random(20, X.shape[1], density=0.3, random_state=3, format="csr")
    preds = np.column_stack([m.predict(new, at=at).data for m in blend.estimators_])
    counts = np.diff(new.indptr)[np.repeat(np.arange(20), np.diff(at.indptr))]
    z = np.log1p(counts) - np.log1p(X.nnz / X.shape[0])
    K = len(blend.estimators_)
    slopes = blend.activity_coef_ if activity else np.zeros(K + 1)
    weights = blend.weights_ + np.outer(z, slopes[1:])
    expected = blend.mean_ + blend.intercept_ + slopes[0] * z + np.sum(
        weights * (preds - blend.mean_), axis=1)
    got = blend.predict(new, at=at)
    np.testing.assert_allclose(got.data, np.clip(expected, *blend.rating_range_), atol=1e-9)
    dense = blend.predict(new)
    np.testing.assert_allclose(dense[at.nonzero()], got.toarray()[at.nonzero()], atol=1e-9)
    assert blend.score(new, at) == pytest.approx(-np.sqrt(np.mean((got.data - at.data) ** 2)))


def test_rating_regressor_predicts_and_recommends_with_the_blend(X):
    coo = X.tocoo()
    pairs = np.column_stack([coo.row, coo.col])
    reg = RatingRegressor(_blend()).fit(pairs, coo.data)
    blend = reg.estimator_
    # the pairs API on training users equals the blend's own fold-free prediction
    model = blend._factor_model()
    from sklearn_fedmf._pairs import predict_pairs

    expected = blend._clip(predict_pairs(model, reg._encode(coo.row, reg._user_index),
                                         reg._encode(coo.col, reg._item_index), blend.mean_))
    np.testing.assert_allclose(reg.predict(pairs), expected)
    items, ratings = reg.recommend([0, 1], n=5)
    assert items.shape == (2, 5) and np.all(np.diff(ratings, axis=1) <= 0)
    assert not set(items[0]) & set(coo.col[coo.row == 0])  # never a rated item


def test_nested_names_and_clone():
    blend = FedBlend()
    assert blend.get_params()["fedmgs__n_components"] is None  # the default members' params
    blend.set_params(fedmgs__n_components=3, fedmavg="drop")
    assert blend.get_params()["fedmgs__n_components"] == 3
    assert dict(blend.estimators)["fedmavg"] == "drop"
    copy = clone(blend)
    assert copy.get_params()["fedmgs__n_components"] == 3
    assert copy.estimators[0][1] is not blend.estimators[0][1]
    # through RatingRegressor, as GridSearchCV sets a candidate on the default members
    reg = RatingRegressor(FedBlend()).set_params(estimator__rfrec__n_components=7)
    assert dict(reg.estimator.estimators)["rfrec"].n_components == 7
    assert len(reg.estimator.estimators) == 5


def test_grid_search_over_a_members_parameter(X):
    coo = X.tocoo()
    pairs = np.column_stack([coo.row, coo.col])
    blend = FedBlend([("biases", FedBaseline(max_iter=5)),
                      ("mgs", FedMGS(max_iter=5, early_stopping=False))],
                     n_clients=3, random_state=0)
    search = GridSearchCV(RatingRegressor(blend),
                          {"estimator__mgs__n_components": [1, 4]},
                          cv=KFold(2, shuffle=True, random_state=0)).fit(pairs, coo.data)
    assert search.best_estimator_.estimator_.named_estimators_["mgs"].n_components in (1, 4)
    assert search.cv_results_["params"][1] == {"estimator__mgs__n_components": 4}


def test_drop_and_refused_members(X):
    blend = FedBlend([("biases", FedBaseline(max_iter=5)), ("mgs", "drop")],
                     n_clients=3, random_state=0).fit(X)
    assert list(blend.named_estimators_) == ["biases"]
    sigmoid = RFRec(biased=False, max_iter=3, solver_params={"link": "sigmoid"})
    with pytest.raises(ValueError, match="link"):
        FedBlend([("rf", sigmoid)], n_clients=3, random_state=0).fit(X)
    with pytest.raises(ValueError, match="loss"):
        FedBlend([("mgs", FedMGS(loss="implicit"))], n_clients=3).fit(X)
    with pytest.raises(ValueError, match="drop"):
        FedBlend([("mgs", "drop")]).fit(X)


def test_refit_members_on_every_training_rating(X, monkeypatch):
    # every member refits
    monkeypatch.setattr("sklearn_fedmf.completion._fed_blend._fed_blend.REFIT_MIN_SHARE", 0.0)
    blend = _blend(refit=True).fit(X)
    validated = _blend().fit(X)
    np.testing.assert_array_equal(blend.weights_, validated.weights_)
    refitted = 0
    for name, member in blend.named_estimators_.items():
        kept = validated.named_estimators_[name]
        if getattr(kept, "factors_used_", True):
            refitted += 1
            assert member.mean_ == pytest.approx(X.data.mean())  # all the ratings
            if kept.get_params().get("early_stopping"):
                assert member.n_iter_ == kept.best_iteration_
        else:  # the validation kept its biases alone: kept as validated
            assert member.mean_ == kept.mean_ != pytest.approx(X.data.mean())
    assert refitted and sum(r.get("refit", False) for r in blend.history_) == sum(
        m.n_iter_ for m in blend.estimators_ if m.mean_ == pytest.approx(X.data.mean()))


def test_refit_skips_the_members_below_the_weight_share(X, monkeypatch):
    validated = _blend().fit(X)
    share = np.abs(validated.weights_) / np.abs(validated.weights_).sum()
    cut = float(np.sort(share)[1]) + 1e-9  # the lightest two below, the other above
    monkeypatch.setattr("sklearn_fedmf.completion._fed_blend._fed_blend.REFIT_MIN_SHARE", cut)
    blend = _blend(refit=True).fit(X)
    refit = {r["member"] for r in blend.history_ if r.get("refit")}
    assert refit == {name for name, w in zip(blend.named_estimators_, share) if w >= cut}
    for name in set(blend.named_estimators_) - refit:
        np.testing.assert_array_equal(blend.named_estimators_[name].item_bias_,
                                      validated.named_estimators_[name].item_bias_)


def test_each_package_warning_once_per_fit_and_inputs_untouched(X):
    X = X.copy().tolil()
    X[:, :2] = 0  # two unrated items: every member warns (UnobservedItemsWarning)
    X = X.tocsr()
    X.eliminate_zeros()
    before = [a.copy() for a in (X.data, X.indices, X.indptr)]
    for a in (X.data, X.indices, X.indptr):
        a.flags.writeable = False  # read-only input is accepted
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _blend().fit(X)
    categories = [w.category for w in caught if issubclass(w.category, FedMFWarning)]
    assert categories and len(categories) == len(set(categories)), categories
    for a, b in zip((X.data, X.indices, X.indptr), before):
        np.testing.assert_array_equal(a, b)


def test_fedmf_run_has_a_line_per_member(tmp_path, capsys):
    import json
    import re

    from sklearn_fedmf.cli import main

    argv = ["run", "--method", "blend", "--data", "synthetic:200x60x3000", "--clients", "5",
            "--quiet", "--no-baselines", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "history.json").read_text())["results"]
    blend, members = report[0], report[1:]
    assert blend["estimator"] == "FedBlend"
    assert [m["estimator"] for m in members] == [
        "FedBaseline", "FedMCADMM", "FedMAvg", "FedMGS", "RFRec"]
    # the blend's rounds and bytes are its members' plus its own exchange
    assert blend["summary"]["rounds"] == sum(m["summary"]["rounds"] for m in members) + 1
    assert blend["summary"]["bytes_uploaded"] > sum(
        m["summary"]["bytes_uploaded"] for m in members)
    for m in members:
        name = m["label"].split()[0]
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert f"{m['summary']['eval_rmse']:.4f}" in re.split(r"\s{2,}", line.strip())


def test_fedmf_recommend_takes_the_blend(tmp_path, capsys):
    import pandas as pd

    from sklearn_fedmf.cli import main

    rng = np.random.default_rng(0)
    users, items = np.nonzero(rng.random((60, 25)) < 0.4)
    pd.DataFrame({"userId": users, "movieId": items,
                  "rating": rng.integers(1, 6, users.size)}).to_csv(tmp_path / "r.csv",
                                                                    index=False)
    argv = ["recommend", "--method", "blend", "--data", str(tmp_path / "r.csv"), "--clients",
            "5", "--user", "3", "--top", "4", "--quiet", "--out", str(tmp_path), "--save",
            str(tmp_path / "m.joblib")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert 'fitted FedBlend (loss="squared", 5 clients' in out
    import joblib

    model = joblib.load(tmp_path / "m.joblib")
    listed = [line.split()[1] for line in out.split("top-4 for user 3:")[1].splitlines()[2:6]]
    assert listed == [str(i) for i in model.recommend(3, n=4)[0]]


def test_a_strong_ridge_is_the_plain_average(X):
    blend = _blend(final_alpha=1e12).fit(X)
    K = len(blend.estimators_)
    np.testing.assert_allclose(blend.weights_, np.full(K, 1 / K), atol=1e-6)
    np.testing.assert_allclose(blend.activity_coef_[1:], 0.0, atol=1e-6)


def test_members_keep_their_factor_part_where_alone_the_floor_drops_it():
    # Biases and noise only (no interaction): alone, with the blend's seed, clients and
    # validation ratings, FedMGS's factor part does not beat the biases on validation and
    # the floor drops it. Inside the blend it is kept and the weights decide; with an
    # unshrunk ridge (final_alpha=0) the blend's validation error is a least-squares fit
    # over the members' predictions, so it cannot exceed the biases member's.
    X = make_site_ratings("douban", n_ratings=4000, interaction=0.0, random_state=0).X
    members = [("biases", FedBaseline(max_iter=10)),
               ("mgs", FedMGS(n_components=3, max_iter=15, early_stopping=True))]
    blend = FedBlend(members, n_clients=4, random_state=0, refit=False,
                     final_alpha=0.0).fit(X)
    alone = FedMGS(n_components=3, max_iter=15, early_stopping=True, validation_fraction=0.1,
                   random_state=blend._entropy).fit(X, clients=blend.clients_)
    assert not alone.factors_used_ and not alone.components_.any()
    member = blend.named_estimators_["mgs"]
    assert member.factors_used_ and member.components_.any() and member.user_factors_.any()
    assert member.best_iteration_ == alone.best_iteration_  # (the same fit up to the floor)
    assert member._floor_class is FedBaseline  # (skipped during the blend's fit only)
    rmse = blend.member_validation_rmse_
    assert blend.validation_rmse_ <= rmse["biases"] + 1e-9
    assert rmse["mgs"] != rmse["biases"]  # (not a copy of the biases member)


def test_auto_ridge_concentrates_on_a_clearly_best_member():
    # Strong low-rank structure: a rank-3 FedMGS validates far better than the biases model
    # and than a one-round FedMCADMM. "auto" shrinks toward the members' evidence weights
    # (here about all on FedMGS), so the blend's weight concentrates on it and, the prior
    # being one member plus free intercepts, the blend validates no worse than that member.
    # The old rule at a strong strength (toward 1/K) gives the poor members a third each and
    # validates worse: the property depends on the prior.
    X = make_ratings(200, 60, 6000, n_components=3, noise=0.1, random_state=1).X
    members = [("biases", FedBaseline(max_iter=10)),
               ("mgs", FedMGS(n_components=3, max_iter=40, early_stopping=True)),
               ("admm", FedMCADMM(n_components=2, max_iter=1, early_stopping=False))]
    auto = FedBlend(members, n_clients=4, random_state=0, refit=False).fit(X)
    rmse = auto.member_validation_rmse_
    assert rmse["mgs"] < 0.8 * min(rmse["biases"], rmse["admm"])  # (clearly the best)
    share = np.abs(auto.weights_) / np.abs(auto.weights_).sum()
    assert share[1] > 0.9
    assert auto.validation_rmse_ <= rmse["mgs"] + 1e-9
    assert auto.final_alpha_ >= 10.0 and auto.history_[-1]["final_alpha"] == auto.final_alpha_
    flat = FedBlend(members, n_clients=4, random_state=0, refit=False,
                    final_alpha=1e6).fit(X)
    assert flat.validation_rmse_ > rmse["mgs"] + 0.01


def test_auto_strength_is_generalized_cross_validation_from_the_sums():
    # solve_blend's "gcv" against a brute-force GCV on an explicit design: the same strength
    # (ridge toward the prior, the hat matrix's trace as the degrees of freedom).
    from sklearn_fedmf.completion._fed_blend._fed_blend_stats import GCV_GRID, solve_blend

    rng = np.random.default_rng(0)
    n, K = 400, 3
    truth = rng.normal(size=n)
    P = truth[:, None] + rng.normal(scale=[0.3, 0.6, 0.9], size=(n, K))
    r = truth + rng.normal(scale=0.5, size=n)
    z = rng.normal(size=n)
    D = blend_design(P, z)
    coef, chosen = solve_blend(D.T @ D, D.T @ r, n, alpha="gcv", n_members=K, activity=True,
                               target="soft", ss=float(r @ r), free_slope=False, info=True)
    sse = ((r[:, None] - P) ** 2).sum(0)
    prior = np.exp(-(sse - sse.min()) / (2 * sse.min() / n))
    prior /= prior.sum()
    pen = np.r_[0.0, np.ones(K), 1.0, np.ones(K)]
    goal = np.r_[0.0, prior, np.zeros(K + 1)]
    scores = {}
    for a in GCV_GRID[1:-1] * n:  # (finite and positive: a plain solve)
        A = D.T @ D + np.diag(a * pen)
        theta = np.linalg.solve(A, D.T @ r + a * pen * goal)
        df = np.trace(np.linalg.solve(A, D.T @ D))
        scores[a] = np.sum((r - D @ theta) ** 2) / n / (1 - df / n) ** 2
    best = min(scores, key=scores.get)
    assert chosen["alpha"] == pytest.approx(best)
    A = D.T @ D + np.diag(best * pen)
    np.testing.assert_allclose(coef, np.linalg.solve(A, D.T @ r + best * pen * goal),
                               atol=1e-10)
