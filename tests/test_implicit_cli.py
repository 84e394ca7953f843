"""Implicit feedback through the pair API and the command line: RatingRegressor.fit(X)
without ratings, and ``fedmf recommend``'s default implicit model and its held-out scores."""

import joblib
import numpy as np
import pandas as pd
import pytest

from sklearn_fedmf import FedMGS, RatingRegressor
from sklearn_fedmf.cli import main
from sklearn_fedmf.completion import FedMCADMM


def pairs(seed=0, n_users=50, n_items=30):
    rng = np.random.default_rng(seed)
    taste = rng.normal(size=(n_users, 2)) @ rng.normal(size=(2, n_items))
    users, items = np.nonzero(taste > np.quantile(taste, 0.7, axis=1, keepdims=True))
    return pd.DataFrame({"user": users, "item": items})


def test_fit_without_ratings_trains_the_implicit_model_on_ones():
    X = pairs()
    reg = RatingRegressor(FedMGS(n_components=3, n_clients=3, max_iter=3, random_state=0))
    reg.fit(X)
    assert reg.estimator.loss == "squared"  # the given estimator is left as it was
    assert reg.estimator_.loss == "implicit"
    same = FedMGS(n_components=3, n_clients=3, max_iter=3, random_state=0, loss="implicit")
    R = reg.estimator_.user_factors_ @ reg.estimator_.components_
    est = same.fit(reg._seen.astype(float), clients=reg.estimator_.clients_)
    np.testing.assert_allclose(R, est.user_factors_ @ est.components_, rtol=1e-12)
    # recommend ranks by the unclipped scores, never a seen item
    items, scores = reg.recommend(0, n=5, min_support=0)
    assert not set(items) & set(X.item[X.user == 0])
    np.testing.assert_allclose(scores, np.sort(reg.predict(
        pd.DataFrame({"user": 0, "item": items})))[::-1], rtol=1e-12)


def test_fit_without_ratings_refuses_an_estimator_without_loss():
    class NoLoss(FedMCADMM):  # (FedMCADMM gains loss in its own branch)
        def get_params(self, deep=True):
            params = super().get_params(deep)
            params.pop("loss", None)
            return params

    with pytest.raises(ValueError, match="implicit feedback"):
        RatingRegressor(NoLoss(max_iter=1)).fit(pairs())


def run(argv, capsys):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.mark.parametrize("ratings", [False, True])
def test_recommend_prints_held_out_scores_beside_most_popular(tmp_path, capsys, ratings):
    frame = pairs(seed=1).assign(stars=1 + np.arange(len(pairs(seed=1))) % 5)
    frame.to_csv(tmp_path / "r.csv", index=False)
    argv = ["recommend", "--data", str(tmp_path / "r.csv"), "--user-col", "user",
            "--item-col", "item", "--rating-col", "stars", "--clients", "3", "--user", "0",
            "--quiet", "--out", str(tmp_path), "--save", str(tmp_path / "m.joblib"),
            *(["--ratings", "--rounds", "3"] if ratings else ["--set", "max_iter=4",
                                                              "--rank", "3"])]
    status, out, _ = run(argv, capsys)
    assert status == 0
    assert ('loss="implicit"' in out) != ratings
    table = out.split("full ranking:")[1].splitlines()
    mine = [float(v) for v in table[2].split()[-2:]]
    popular = [float(v) for v in table[3].split()[-2:]]
    assert table[2].split()[0] == "this" and table[3].split()[0] == "most"
    assert all(0.0 <= v <= 1.0 for v in mine + popular)
    if not ratings:  # low-rank interactions: the implicit model beats the chart
        assert mine[0] > popular[0]
    model = joblib.load(tmp_path / "m.joblib")
    assert model.estimator_.loss == ("squared" if ratings else "implicit")
    if not ratings:  # the typed options reach the implicit model
        assert model.estimator_.n_components == 3 and model.estimator_.max_iter == 4


def test_run_task_topn_prints_a_leave_one_out_table(tmp_path, capsys):
    frame = pairs(seed=2).assign(stars=3)
    frame.to_csv(tmp_path / "r.csv", index=False)
    argv = ["run", "--task", "topn", "--data", str(tmp_path / "r.csv"), "--user-col", "user",
            "--item-col", "item", "--rating-col", "stars", "--method", "fedmgs,fedmavg",
            "--settings", "papers", "--clients", "3", "--rounds", "3", "--rank", "3",
            "--quiet", "--out", str(tmp_path)]
    status, out, _ = run(argv, capsys)
    assert status == 0
    table = out.split("MB/round")[1].strip().splitlines()[:5]
    labels = [line.rsplit(None, 6)[0].strip() for line in table]
    assert labels == ["most popular", "FedMGS (implicit)", "FedMGS (ratings, papers)",
                      "FedMAvg (implicit)", "FedMAvg (ratings, papers)"]
    import json

    results = json.loads((tmp_path / "topn.json").read_text())["results"]
    assert [r["model"] for r in results] == labels
    for line, result in zip(table, results):  # the printed figures are the saved ones
        assert float(line.split()[-6]) == pytest.approx(result["HR@10"], abs=5e-4)
        assert 0.0 <= result["NDCG@10"] <= result["HR@10"] <= result["HR@20"] <= 1.0
    # the low-rank interactions: FedMGS's implicit lists beat the popularity chart
    assert results[1]["HR@10"] > results[0]["HR@10"]
