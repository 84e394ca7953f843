"""The ``fedmf`` command: main job on reduced sizes, data specs, tune, errors and --help."""

import argparse
import json
import re
import subprocess
import sys
import warnings

import joblib
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.model_selection import KFold, cross_validate

from sklearn_fedmf import RatingRegressor, cli
from sklearn_fedmf.cli import MAIN_JOB, METHODS, build_parser, main
from sklearn_fedmf.completion import FedMAvg
from sklearn_fedmf.exceptions import DegenerateFitWarning
from sklearn_fedmf.model_selection import train_test_split_ratings

FED = ["--data", "synthetic:200x60x3000", "--clients", "10", "--clients-per-round", "3",
       "--rounds", "4"]
SMALL = [*FED, "--quiet"]
PAPERS = ["--settings", "papers", "--no-baselines"]  # one row per method, as the papers ran


def run(argv, capsys):
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def table_rows(out, labels):
    """The cells of the table rows whose label is in ``labels`` (cells: 2+ spaces apart)."""
    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in labels:
            rows[cells[0]] = cells
    return rows


def test_main_job_on_reduced_sizes(tmp_path, capsys):
    status, out, _ = run([*SMALL, *PAPERS, "--out", str(tmp_path)], capsys)
    assert status == 0
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "history.json").read_text())
    labels = [f"{METHODS[name].label} (papers)" for name in MAIN_JOB]
    assert [r["label"] for r in report["results"]] == labels
    rows = table_rows(out, labels)
    assert set(rows) == set(labels)
    for result in report["results"]:
        history, summary = result["history"], result["summary"]
        assert [h["round"] for h in history] == [1, 2, 3, 4]
        assert summary["eval_rmse"] == history[-1]["eval_rmse"]
        assert summary["bytes_uploaded"] == sum(h["bytes_uploaded"] for h in history) > 0
        params = result["params"]
        assert (params["n_clients"], params["clients_per_round"], params["max_iter"],
                params["n_components"], params["random_state"]) == (10, 3, 4, 5, 0)
        # the row: method, rounds, train RMSE, test RMSE, seconds, MB up, MB down
        row = rows[result["label"]]
        assert row[1] == "4" and row[3] == f"{summary['eval_rmse']:.4f}"
        assert row[5] == f"{summary['bytes_uploaded'] / 1e6:.1f}"
    fedmavg = report["results"][labels.index("FedMAvg (papers)")]
    assert fedmavg["params"]["solver_params"]["variant"] == "fedmc_admm"
    # the restated FedMAvg records FedMC-ADMM's objective F, so the curves share an axis
    assert len({r["objective"] for r in report["results"]}) == 1


def test_bare_command_is_the_papers_protocol(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "cmd_run", lambda args: seen.append(args) or 0)
    assert main([]) == 0 and main(["--rounds", "7"]) == 0
    args = seen[0]
    assert args.method.split(",") == list(MAIN_JOB) == ["fedmc-admm", "fedmavg"]
    assert (args.data, args.test_size, args.clients, args.clients_per_round, args.rounds,
            args.rank, args.seed, args.out) == ("embedded", 0.2, 100, 10, 100, 5, 0, "fedmf-out")
    assert seen[1].rounds == 7


def test_embedded_data_split_80_20(tmp_path, capsys):
    status, out, _ = run(["run", "--method", "fedmc-admm", "--rounds", "2", "--quiet", *PAPERS,
                          "--out", str(tmp_path)], capsys)
    assert status == 0
    assert "610 users x 9724 items, 100836 ratings" in out
    train, test = _counts(out)
    assert train + test == 100836 and abs(test / 100836 - 0.2) < 0.01


def _counts(out):
    text = out.split("ratings (")[1]
    train = int(text.split(" train")[0])
    test = int(text.split("/ ")[1].split(" test")[0])
    return train, test


def test_same_model_for_one_and_two_jobs(tmp_path, capsys):
    histories = []
    for jobs in ("1", "2"):
        assert run([*SMALL, *PAPERS, "--method", "fedmc-admm", "--jobs", jobs,
                    "--out", str(tmp_path / jobs)], capsys)[0] == 0
        report = json.loads((tmp_path / jobs / "history.json").read_text())
        histories.append([{k: v for k, v in h.items() if k != "seconds"}
                          for h in report["results"][0]["history"]])
    assert histories[0] == histories[1]


@pytest.mark.parametrize("data", ["synthetic:120x40x1500", "tiles:120x40x3"])
def test_binary_method_on_binary_data(data, tmp_path, capsys):
    status, out, _ = run(["run", "--method", "felb", "--data", data, "--clients", "4",
                          "--rounds", "3", "--rank", "4", "--quiet", "--out", str(tmp_path)],
                         capsys)
    assert status == 0
    assert "120 rows x 40 columns" in out
    assert ("binarized at rating >= 3.5" in out) == data.startswith("synthetic")
    header = next(line for line in out.splitlines() if line.startswith("method"))
    assert header.split()[2:4] == ["F1", "RMSD"]
    summary = json.loads((tmp_path / "history.json").read_text())["results"][0]["summary"]
    assert 0.0 <= summary["f1"] <= 1.0 and summary["rounds"] == 3


def test_binarize_keeps_ratings_at_or_above_threshold():
    # every stored entry is a rating, including the low 1.0
    X = sp.csr_matrix(np.array([[5.0, 3.0, 1.0], [3.5, 0.5, 4.0]]))
    B = cli.binarize(X)
    assert B.toarray().tolist() == [[1, 0, 0], [1, 0, 1]]
    assert B.nnz == 3 and set(B.data) == {1.0}


def test_without_matplotlib_the_json_is_still_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    status, _, err = run([*SMALL, *PAPERS, "--method", "fedmc-admm", "--out", str(tmp_path)],
                         capsys)
    assert status == 0
    assert "matplotlib is not installed" in err
    assert (tmp_path / "history.json").exists() and not (tmp_path / "curves.png").exists()


def test_tune_ranks_candidates_by_the_documented_cv(tmp_path, capsys):
    argv = ["tune", "--method", "fedmc-admm", *FED, "--cv", "2", "--grid", "beta=0.1,1",
            "--grid", "alpha_u=1e-6,1", "--split", "users", "--out", str(tmp_path)]
    status, out, err = run(argv, capsys)
    assert status == 0
    report = json.loads((tmp_path / "tune.json").read_text())
    ranked = report["ranked"]
    # 2 x 2 candidates, and the defaults (beta="auto", the papers' alpha_u=1e-6) as a fifth:
    # the grid does not hold them
    assert (len(ranked) == 5
            and "(the papers' settings added as one candidate" in out.splitlines()[1])
    scores = [r["score"] for r in ranked]
    assert scores == sorted(scores)
    # progress: one line per candidate on stderr, with the score the table ranks
    progress = [line for line in err.splitlines() if line.startswith("fedmf: tune: candidate")]
    assert [line.split()[3] for line in progress] == ["1/5:", "2/5:", "3/5:", "4/5:", "5/5:"]
    assert sorted(float(line.split()[6]) for line in progress) == pytest.approx(scores, abs=1e-4)
    best = ranked[0]["params"]
    assert f"alpha_u={best['alpha_u']!r}, beta={best['beta']!r}" in out
    # Oracle: the same CV built by hand (users in KFold, X = train, y = held-out ratings).
    X, _ = cli.load_data("synthetic:200x60x3000", 0)
    X_train, X_test = train_test_split_ratings(X, 0.2, random_state=0)
    method = METHODS["fedmc-admm"]  # (its fixed settings: the papers', PAPER_SETTINGS)
    model = method.load()(n_clients=10, clients_per_round=3, max_iter=4, n_components=5,
                          random_state=0, **{**method.fixed, **best})
    folds = KFold(2, shuffle=True, random_state=0).split(X_train)
    expected = -np.mean([clone(model).fit(X_train[fit]).score(X_train[held], X_test[held])
                         for fit, held in folds])
    assert ranked[0]["score"] == pytest.approx(expected, rel=1e-10)
    # the defaults' score beside the best: the same CV of the estimator the options give
    defaults = report["defaults"]
    assert defaults["params"] == {"beta": "auto", "alpha_u": 1e-6} and defaults["added_to_grid"]
    model = method.load()(n_clients=10, clients_per_round=3, max_iter=4, n_components=5,
                          random_state=0, **method.fixed)
    folds = KFold(2, shuffle=True, random_state=0).split(X_train)
    expected = -np.mean([clone(model).fit(X_train[fit]).score(X_train[held], X_test[held])
                         for fit, held in folds])
    assert defaults["score"] == pytest.approx(expected, rel=1e-10)
    assert ranked[defaults["rank"] - 1]["params"] == defaults["params"]
    assert report["gain_over_defaults"] == pytest.approx(defaults["score"] - scores[0])
    assert report["gain_over_defaults"] >= 0 and report["best_score"] == scores[0]
    line = next(line for line in out.splitlines() if line.startswith("papers' settings: "))
    assert line == (f"papers' settings: {defaults['score']:.4f} (rank {defaults['rank']} of 5); "
                    "best: "
                    f"{scores[0]:.4f} ({report['gain_over_defaults']:.4f} better)")


def test_tune_with_the_defaults_in_the_grid_adds_no_candidate(tmp_path, capsys):
    argv = ["tune", "--method", "fedmavg", *SMALL, "--rounds", "2", "--cv", "2", "--grid",
            "alpha_u=1e-6,1", "--split", "users", "--out", str(tmp_path)]
    status, out, _ = run(argv, capsys)
    report = json.loads((tmp_path / "tune.json").read_text())
    assert status == 0 and len(report["ranked"]) == 2 and "settings added" not in out
    assert report["defaults"]["params"] == {"alpha_u": 1e-6}
    assert not report["defaults"]["added_to_grid"]
    row = report["ranked"][report["defaults"]["rank"] - 1]
    assert row["params"] == {"alpha_u": 1e-6} and row["score"] == report["defaults"]["score"]
    assert f"(rank {report['defaults']['rank']} of 2)" in out


def test_tune_on_ratings_folds_the_ratings_by_default(tmp_path, capsys):
    argv = ["tune", "--method", "fedmavg", *FED, "--cv", "3", "--grid", "alpha_u=0.1,10",
            "--out", str(tmp_path)]
    status, out, _ = run(argv, capsys)
    assert status == 0 and "folds of the ratings (entry-wise)" in out
    ranked = json.loads((tmp_path / "tune.json").read_text())["ranked"]
    assert [r["score"] for r in ranked] == sorted(r["score"] for r in ranked)
    # Oracle: scikit-learn's cross_validate over the ratings, through RatingRegressor
    X = cli.load_data("synthetic:200x60x3000", 0)[0].tocoo()
    pairs = np.column_stack([X.row, X.col])
    method = METHODS["fedmavg"]  # (its fixed settings: the papers', PAPER_SETTINGS)
    model = RatingRegressor(method.load()(
        n_clients=10, clients_per_round=3, max_iter=4, n_components=5,
        random_state=0, **{**method.fixed, **ranked[0]["params"]}))
    scores = cross_validate(model, pairs, X.data, cv=KFold(3, shuffle=True, random_state=0),
                            scoring="neg_root_mean_squared_error")["test_score"]
    assert ranked[0]["score"] == pytest.approx(-scores.mean(), rel=1e-10)


def test_recommend_saves_the_model_and_lists_unrated_items_by_their_ids(tmp_path, capsys):
    rng = np.random.default_rng(0)
    users, items = np.nonzero(rng.random((60, 25)) < 0.4)
    frame = pd.DataFrame({"who": [f"u{k}" for k in users], "film": [f"m{k}" for k in items],
                          "stars": rng.integers(1, 6, users.size)})
    frame.to_csv(tmp_path / "r.csv", index=False)
    common = ["--user", "u3", "--user", "stranger", "--top", "4", "--out", str(tmp_path)]
    argv = ["recommend", "--data", str(tmp_path / "r.csv"), "--user-col", "who",
            "--item-col", "film", "--rating-col", "stars", "--clients", "5", "--rounds", "5",
            "--save", str(tmp_path / "m.joblib"), *common]
    status, out, _ = run(argv, capsys)
    assert status == 0 and f"wrote {tmp_path / 'm.joblib'}" in out
    lists = [text.split("\n\n")[0] for text in out.split("top-4 for user ")[1:]]
    listed = [line.split()[1] for line in lists[0].splitlines()[2:] if line.strip()]
    assert len(listed) == 4 and not set(listed) & set(frame.film[frame.who == "u3"])
    model = joblib.load(tmp_path / "m.joblib")
    assert listed == model.recommend("u3", n=4)[0].tolist()
    popular = frame.film.value_counts(sort=False).sort_index()
    cold = [line.split()[1] for line in lists[1].splitlines()[2:] if line.strip()]
    assert cold == popular.sort_values(ascending=False, kind="stable").index[:4].tolist()
    # a saved model serves without refitting, with the same lists
    status, again, _ = run(["recommend", "--model", str(tmp_path / "m.joblib"), *common], capsys)
    assert status == 0 and again.split("top-4")[1:] == out.split("top-4")[1:]


def test_tune_halving_uses_rounds_as_resource(tmp_path, capsys):
    argv = ["tune", "--method", "fedmc-admm", *FED, "--rounds", "9", "--cv", "2",
            "--grid", "beta=0.1,1,10", "--halving", "--split", "users",
            "--out", str(tmp_path)]
    status, out, err = run(argv, capsys)
    assert status == 0
    ranked = json.loads((tmp_path / "tune.json").read_text())["ranked"]
    # 3 candidates and the defaults (beta="auto") at 3 rounds, then the best 2 at 9 rounds
    # (factor 3)
    assert sorted(r["rounds"] for r in ranked) == [3, 3, 3, 3, 9, 9]
    assert ranked[0]["rounds"] == 9
    assert err.count("fedmf: tune: candidate") == 6 and "max_iter=9)" in err
    # the defaults' line names the rounds of their longest run
    default = json.loads((tmp_path / "tune.json").read_text())["defaults"]
    assert default["params"] == {"beta": "auto"} and default["added_to_grid"]
    rounds = ranked[default["rank"] - 1]["rounds"]
    assert (f"papers' settings: {default['score']:.4f} at {rounds} rounds "
            f"(rank {default['rank']} of 6)") \
        in out
    assert "best parameters" in out and "rounds=9" in out


def test_tune_options_fix_their_parameters(tmp_path, capsys):
    # --clients and --rank leave the default grid (FedMGS: default_search_space's two
    # regularizations, each alpha_u x alpha_v x biased) and are used by every candidate
    argv = ["tune", "--method", "fedmgs", *FED, "--clients", "7", "--rank", "3", "--rounds",
            "2", "--cv", "2", "--quiet", "--split", "users", "--out", str(tmp_path)]
    status, out, err = run(argv, capsys)
    assert status == 0 and "tune: candidate" not in err  # --quiet
    report = json.loads((tmp_path / "tune.json").read_text())
    assert [g["regularization"] for g in report["grid"]] == [["plain"], ["weighted"]]
    assert all(set(g) == {"regularization", "alpha_u", "alpha_v", "biased"}
               for g in report["grid"])
    # 36, and the estimator's own settings (the papers': alpha 1e-6, no biases) as one more
    assert len(report["ranked"]) == 37 and report["defaults"]["added_to_grid"]
    assert report["defaults"]["params"] == {"regularization": "plain", "alpha_u": 1e-6,
                                            "alpha_v": 1e-6, "biased": False}
    assert {r["params"]["regularization"] for r in report["ranked"]} == {"plain", "weighted"}
    assert (report["estimator"]["n_clients"], report["estimator"]["n_components"]) == (7, 3)
    assert "n_clients=7" in out.splitlines()[0] and "n_components=3" in out.splitlines()[0]
    # Oracle: the best candidate's CV score by hand with n_clients=7 and rank 3.
    X, _ = cli.load_data("synthetic:200x60x3000", 0)
    X_train, X_test = train_test_split_ratings(X, 0.2, random_state=0)
    best = report["ranked"][0]
    method = METHODS["fedmgs"]  # (its fixed settings: the papers', PAPER_SETTINGS)
    model = method.load()(n_clients=7, clients_per_round=3, max_iter=2, n_components=3,
                          random_state=0, **{**method.fixed, **best["params"]})
    folds = KFold(2, shuffle=True, random_state=0).split(X_train)
    expected = -np.mean([clone(model).fit(X_train[fit]).score(X_train[held], X_test[held])
                         for fit, held in folds])
    assert best["score"] == pytest.approx(expected, rel=1e-10)


def test_tune_grid_of_rounds_names_the_best_rounds(tmp_path, capsys):
    argv = ["tune", "--method", "fedmc-admm", "--data", "synthetic:200x60x3000", "--clients",
            "10", "--clients-per-round", "3", "--cv", "2", "--grid", "max_iter=1,3",
            "--quiet", "--out", str(tmp_path)]
    status, out, _ = run(argv, capsys)
    assert status == 0
    best = json.loads((tmp_path / "tune.json").read_text())["ranked"][0]["params"]
    line = next(line for line in out.splitlines() if line.startswith("best parameters"))
    assert line.endswith(f": max_iter={best['max_iter']}")


def test_degenerate_fits_are_flagged_in_the_table(tmp_path, capsys, monkeypatch):
    fit = FedMAvg.fit

    def degenerate_fit(self, *args, **kwargs):
        fit(self, *args, **kwargs)
        warnings.warn("FedMAvg: all factors are zero", DegenerateFitWarning, stacklevel=2)
        return self

    monkeypatch.setattr(FedMAvg, "fit", degenerate_fit)
    status, out, _ = run([*SMALL, *PAPERS, "--out", str(tmp_path)], capsys)
    assert status == 0
    admm, mavg = "FedMC-ADMM (papers)", "FedMAvg (papers)"
    rows = table_rows(out, [admm, mavg])
    assert rows[mavg][-1] == "!" and rows[admm][-1] != "!"
    assert len(rows[mavg]) == len(rows[admm]) + 1  # the flag column
    assert f"! {mavg}: the fit ended degenerate: FedMAvg: all factors are zero" in out
    results = json.loads((tmp_path / "history.json").read_text())["results"]
    assert [r["summary"]["degenerate"] for r in results] == [False, True]


def test_a_real_degenerate_fit_is_flagged(tmp_path, capsys):
    # a large l1 weight zeroes Felb-MU's Boolean factors: the estimator warns, the row says so
    argv = ["run", "--method", "felb-mu", "--data", "synthetic:200x60x3000", "--clients", "4",
            "--rounds", "3", "--set", "lam=50", "--set", "kappa=5", "--quiet",
            "--out", str(tmp_path)]
    status, out, _ = run(argv, capsys)
    assert status == 0
    row = table_rows(out, ["Felb-MU"])["Felb-MU"]
    assert row[2] == "0.0000" and row[-1] == "!"
    assert "! Felb-MU: the fit ended degenerate: " in out


def test_output_path_is_checked_before_any_fit(tmp_path, capsys, monkeypatch):
    def no_fit(*args, **kwargs):
        raise AssertionError("fitted before checking --out")

    monkeypatch.setattr(cli._commands, "fit_method", no_fit)
    monkeypatch.setattr(cli._commands, "prepare_data", no_fit)
    (tmp_path / "file").write_text("")
    (tmp_path / "dir" / "history.json").mkdir(parents=True)
    for out, fragment in [("file", "exists and is not a folder"),
                          ("dir", "history.json is a folder")]:
        status, _, err = run([*SMALL, "--out", str(tmp_path / out)], capsys)
        assert status == 1 and err.count("\n") == 1
        assert err.startswith(f"fedmf: error: --out {tmp_path / out}: ") and fragment in err


def _bad_file(tmp_path):
    path = tmp_path / "ratings.dat"
    path.write_text("this is not a rating\n")
    return str(path)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["run", "--method", "nope"], "unknown method 'nope'"),
        (["run", "--data", "{tmp}/missing"], "no such file or directory"),
        (["run", "--data", "{bad}"], "ratings.dat"),
        (["run", "--data", "synthetic:10x10x500"], "impossible sizes"),
        (["run", "--data", "synthetic:40x30x300", "--clients", "50"], "impossible sizes"),
        (["run", "--data", "synthetic:40x30x300", "--clients", "5", "--rank", "31"],
         "impossible sizes"),
        (["run", "--method", "fedmc-admm,felb"], "cannot share a run"),
        (["run", "--method", "fedmc-admm", "--data", "tiles:50x20x3"], "binary data"),
        (["run", "--method", "felb", "--data", "tiles:50x20"], "expected tiles:ROWSxCOLSxTILES"),
        (["tune", "--method", "fedmc-admm,fedmavg"], "one method at a time"),
        (["tune", "--grid", "nonsense=1,2", "--data", "synthetic:40x30x300", "--clients", "5"],
         "no parameter"),
        (["run", "--method", ""], "--method '': no method named"),
        (["run", "--method", " , "], "--method ' , ': no method named"),
        (["tune", "--method", ""], "--method '': no method named"),
        (["run", "--data", "synthetic:40x30x300", "--clients", "5", "--set", "beta=-1"],
         "--set beta=-1: "),
        (["run", "--method", "felb", "--data", "tiles:50x20x3", "--clients-per-round", "3"],
         "--clients-per-round: felb has no parameter clients_per_round"),
        # a solver constant goes into solver_params, its value checked there
        (["run", "--method", "felb-mu", "--data", "tiles:50x20x3", "--set", "kappa=-1"],
         "--set kappa=-1: "),
        (["run", "--method", "felb", "--data", "tiles:50x20x3", "--set", "update=newton"],
         "--set update='newton': "),
        (["tune", "--data", "synthetic:40x30x300", "--clients", "5", "--grid", "n_clients=4,5"],
         "--clients and --grid n_clients=... both set n_clients"),
        (["tune", "--data", "synthetic:40x30x300", "--clients", "5", "--rounds", "5", "--grid",
          "max_iter=1,2"],
         "--rounds and --grid max_iter=... both set max_iter"),
        (["tune", "--data", "synthetic:40x30x300", "--clients", "5", "--halving", "--grid",
          "max_iter=1,2"],
         "--grid max_iter=...: with --halving"),
        (["tune", "--data", "synthetic:40x30x300", "--clients", "5", "--grid", "beta=0.1,-1"],
         "--grid beta=-1: "),
    ],
)
def test_errors_are_one_line(argv, fragment, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path, bad=_bad_file(tmp_path)) for a in argv]
    status, _, err = run([*argv, "--out", str(tmp_path / "out")], capsys)
    assert status == 1
    assert err.startswith("fedmf: error: ") and err.count("\n") == 1
    assert fragment in err and "Traceback" not in err


@pytest.mark.parametrize("argv, option", [
    (["run", "--rounds", "abc"], "--rounds"),
    (["run", "--seed", "-1"], "--seed"),
    (["run", "--seed", str(2**32)], "--seed"),
    (["run", "--jobs", "0"], "--jobs"),
    (["tune", "--jobs", "zero"], "--jobs"),
    (["run", "--test-size", "1.5"], "--test-size"),
    (["run", "--test-size", "nan"], "--test-size"),
    (["tune", "--cv", "1"], "--cv"),
    (["recommend", "--min-support", "-1"], "--min-support"),
    (["recommend", "--min-support", "many"], "--min-support"),
])
def test_bad_option_is_one_line_exit_2(argv, option, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert f"argument {option}: expected" in err
    assert "Parallel" not in err and "non-negative integer" not in err


def test_help_documents_every_option():
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == {"run", "tune", "recommend", "methods", "flower-split"}
    for name, sub in [("fedmf", parser), *commands.items()]:
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
            for option in action.option_strings:
                assert option in text


def test_movielens_files_in_each_format(tmp_path):
    rows = [(1, 10, 4.0, 1), (1, 20, 3.0, 2), (2, 10, 5.0, 3), (3, 30, 1.0, 4)]
    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_text("".join(
        f"{u}\t{i}\t{int(r)}\t{t}\n" for u, i, r, t in rows))
    (tmp_path / "ml-1m").mkdir()
    (tmp_path / "ml-1m" / "ratings.dat").write_text("".join(
        f"{u}::{i}::{int(r)}::{t}\n" for u, i, r, t in rows))
    (tmp_path / "ml-latest").mkdir()
    (tmp_path / "ml-latest" / "ratings.csv").write_text(
        "userId,movieId,rating,timestamp\n" + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in rows)
    )
    for folder, variant in [("ml-100k", "100k"), ("ml-1m", "1m"), ("ml-latest", "latest")]:
        for spec in (tmp_path / folder, next((tmp_path / folder).iterdir())):
            X, name = cli.load_data(str(spec))
            assert f"MovieLens {variant} " in name
            assert X.shape == (3, 3) and X.nnz == 4 and X.sum() == 13.0
    X, _ = cli.load_data(str(tmp_path))  # a parent folder: the first release found inside
    assert X.nnz == 4


def test_methods_lists_the_registry(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name in METHODS:
        assert any(line.startswith(name + " ") for line in lines)
    assert set(MAIN_JOB) <= set(METHODS)
    # aligned columns: every row's estimator and upload start under their headers
    header = lines[0]
    for name, method in METHODS.items():
        line = next(line for line in lines if line.startswith(name + " "))
        assert line.index("sklearn_fedmf.") == header.index("estimator")
        assert line.index(method.sends) == header.index("a client uploads")


def test_python_dash_m_runs_the_command():
    result = subprocess.run([sys.executable, "-m", "sklearn_fedmf", "--version"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.startswith("fedmf ")


def test_set_routes_a_solver_constant_into_solver_params():
    # felb-mu's variant is solver_params={"update": "mu"}: a --set of another solver key
    # joins it, a constructor parameter stays one
    from sklearn_fedmf.cli._registry import METHODS, make_estimator

    args = argparse.Namespace(set=[("kappa", 5.0), ("lam", 50.0)], explicit=set())
    felb_mu = make_estimator(METHODS["felb-mu"], args)
    assert felb_mu.solver_params == {"update": "mu", "kappa": 5.0} and felb_mu.lam == 50.0
    assert make_estimator(METHODS["felb"], args).solver_params == {"kappa": 5.0}


def test_recommend_min_support_is_passed_to_the_lists(tmp_path, capsys):
    # item m0 is rated by 3 users, all 5 stars; the 11 others by about 48 each, lower: the
    # default (min_support=20) lists m0 after every other item, --min-support 0 by its score
    rng = np.random.default_rng(1)
    users, items = np.nonzero(rng.random((80, 12)) < 0.6)
    frame = pd.DataFrame({"who": users, "film": [f"m{k}" for k in items],
                          "stars": rng.integers(1, 4, users.size)})
    rare = pd.DataFrame({"who": [0, 1, 2], "film": ["m0"] * 3, "stars": [5, 5, 5]})
    frame = pd.concat([frame[frame.film != "m0"], rare], ignore_index=True)
    frame.to_csv(tmp_path / "r.csv", index=False)
    base = ["recommend", "--data", str(tmp_path / "r.csv"), "--user-col", "who",
            "--item-col", "film", "--rating-col", "stars", "--clients", "4", "--rounds", "5",
            "--save", str(tmp_path / "m.joblib"), "--user", "79", "--top", "12",
            "--include-seen", "--out", str(tmp_path), "--quiet"]

    def listed(extra):
        status, out, _ = run(base + extra, capsys)
        assert status == 0
        table = out.split("top-12 for user ")[1].split("\n\n")[0]
        # (the line "-- items with fewer than N training ratings --" is no item)
        return [line.split()[1] for line in table.splitlines()[2:]
                if line.strip() and not line.strip().startswith("--")]

    plain = listed(["--min-support", "0"])
    model = joblib.load(tmp_path / "m.joblib")
    assert plain == model.recommend(79, n=12, exclude_seen=False, min_support=0)[0].tolist()
    default = listed([])
    model = joblib.load(tmp_path / "m.joblib")
    assert default == model.recommend(79, n=12, exclude_seen=False)[0].tolist()
    assert default[-1] == "m0" and sorted(default) == sorted(plain)
    # the printed list says why m0 comes last: its training ratings, under a line
    _, out, _ = run(base, capsys)
    table = out.split("top-12 for user ")[1].split("\n\n")[0].splitlines()
    assert table[-2] == "      -- items with fewer than 20 training ratings (--min-support) --"
    assert table[-1].split()[1] == "m0" and table[-1].split()[-1] == "3"
