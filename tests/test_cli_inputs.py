"""The ``fedmf`` command's inputs: one reader of ratings for run, tune and recommend, errors
that name the file and line, model files, the common options, recommend's saving and unknown
users, tune's plan line, and a parser built without scikit-learn."""

import json
import subprocess
import sys

import joblib
import numpy as np
import pytest
from sklearn.experimental import enable_halving_search_cv  # noqa: F401
from sklearn.linear_model import SGDRegressor
from sklearn.model_selection import HalvingGridSearchCV

from sklearn_fedmf.cli import RATING_METHODS, build_parser, main
from sklearn_fedmf.cli._tune import halving_schedule

FED = ["--clients", "4", "--clients-per-round", "2", "--rounds", "2", "--quiet"]


def run(argv, capsys):
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def write_ratings(path, header="userId,movieId,rating", n_users=30, n_items=12, seed=0):
    """A CSV of ratings (no timestamp): every user rates 6 distinct items."""
    rng = np.random.default_rng(seed)
    lines = [header]
    for u in range(1, n_users + 1):
        for i in rng.choice(n_items, 6, replace=False):
            lines.append(f"{u},{100 + i},{rng.integers(1, 6)}")
    path.write_text("\n".join(lines) + "\n")
    return len(lines) - 1


def commands(data, out, *extra):
    """The same data and options given to run, tune and recommend."""
    return {
        "run": ["run", "--method", "fedmavg", "--settings", "papers", "--data", data, *FED,
                *extra, "--out", str(out / "run")],
        "tune": ["tune", "--method", "fedmavg", "--grid", "alpha_u=0.1,1", "--cv", "2",
                 "--data", data, *FED, *extra, "--out", str(out / "tune")],
        "recommend": ["recommend", "--data", data, *FED, *extra, "--user", "1",
                      "--out", str(out / "recommend")],
        "flower-split": ["flower-split", "--data", data, "--sites", "2", *extra,
                         "--out", str(out / "sites")],
    }


def test_one_reader_for_run_tune_and_recommend(tmp_path, capsys):
    # userId,movieId,rating without a timestamp: every command reads it, to the same counts
    n_ratings = write_ratings(tmp_path / "ratings.csv")
    for name, argv in commands(str(tmp_path / "ratings.csv"), tmp_path).items():
        status, out, err = run(argv, capsys)
        assert status == 0, (name, err)
        if name != "flower-split":  # (which prints the training ratings of its split)
            assert f"30 users x 12 items, {n_ratings} ratings" in out
    report = json.loads((tmp_path / "run" / "history.json").read_text())
    assert report["data"]["nnz"] == n_ratings == 180


def test_columns_options_on_every_command(tmp_path, capsys):
    write_ratings(tmp_path / "r.csv", header="who,what,stars")
    for name, argv in commands(str(tmp_path / "r.csv"), tmp_path, "--user-col", "who",
                               "--item-col", "what", "--rating-col", "stars").items():
        status, out, err = run(argv, capsys)
        assert status == 0 and "30 users x 12 items" in out, (name, err)
        assert "2 sites" in out or name != "flower-split"
    # without them: one line naming the file and its columns
    for name, argv in commands(str(tmp_path / "r.csv"), tmp_path).items():
        status, _, err = run(argv, capsys)
        assert status == 1 and err.count("\n") == 1, name
        assert (f"{tmp_path / 'r.csv'}: no user, item and rating columns of a known name"
                in err and "(columns: who, what, stars)" in err)


@pytest.mark.parametrize("bad_line, message", [
    ("2,101,oops", "line 3: rating 'oops' is not a number"),
    ("2,101", "line 3: 2 fields where the header has 3"),
    ("2,101,4,9", "line 3: 4 fields where the header has 3"),
    ("2,,4", "line 3: no movieId"),
    ("2,101,", "line 3: rating '' is not a number"),
    ("2,101,inf", "line 3: rating 'inf' is not a finite number"),
])
def test_parse_errors_name_the_file_and_line(bad_line, message, tmp_path, capsys):
    path = tmp_path / "ratings.csv"
    path.write_text(f"userId,movieId,rating\n1,100,4\n{bad_line}\n3,102,5\n")
    for name, argv in commands(str(path), tmp_path).items():
        status, _, err = run(argv, capsys)
        assert status == 1, name
        assert err == f"fedmf: error: {path} {message}\n", name


def test_blank_lines_are_skipped_and_counted(tmp_path, capsys):
    path = tmp_path / "ratings.csv"
    path.write_text("userId,movieId,rating\n1,100,4\n\n2,101,oops\n")
    status, _, err = run(commands(str(path), tmp_path)["recommend"], capsys)
    assert status == 1 and f"{path} line 4: rating 'oops'" in err


def test_not_a_csv_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "ratings.csv"
    path.write_bytes(b"userId,movieId,rating\n1,100,\xff\xfe\n")
    status, _, err = run(commands(str(path), tmp_path)["run"], capsys)
    assert status == 1 and err.count("\n") == 1
    assert err.startswith(f"fedmf: error: {path}")


def _model_files(tmp_path):
    (tmp_path / "ratings.csv").write_text("userId,movieId,rating\n1,2,3\n")
    (tmp_path / "notes.txt").write_text("not a model\n")
    (tmp_path / "garbage.bin").write_bytes(bytes(range(256)))
    (tmp_path / "truncated.joblib").write_bytes(b"\x80\x04\x95\x10")
    (tmp_path / "x.txt").write_text("xylophone\n")  # starts like zlib
    joblib.dump({"a": 1}, tmp_path / "dict.joblib")
    return {"ratings.csv": "not a joblib file", "notes.txt": "not a joblib file",
            "garbage.bin": "not a joblib file", "truncated.joblib": "could not be loaded",
            "x.txt": "could not be loaded",
            "dict.joblib": "holds a dict, not a fitted RatingRegressor",
            "missing.joblib": "no such file or directory"}


def test_a_file_that_is_not_a_model_is_one_line(tmp_path, capsys):
    for name, fragment in _model_files(tmp_path).items():
        status, _, err = run(["recommend", "--model", str(tmp_path / name), "--user", "1",
                              "--out", str(tmp_path / "out")], capsys)
        assert status == 1 and err.count("\n") == 1, name
        assert err.startswith(f"fedmf: error: --model {tmp_path / name}: ") and fragment in err


def test_recommend_saves_only_with_save_and_says_unknown_users(tmp_path, capsys):
    write_ratings(tmp_path / "ratings.csv")
    out = tmp_path / "out"
    argv = ["recommend", "--data", str(tmp_path / "ratings.csv"), *FED, "--top", "3",
            "--user", "2", "--user", "999", "--out", str(out)]
    status, stdout, err = run(argv, capsys)
    assert status == 0
    assert not list(tmp_path.rglob("*.joblib")) and "model" not in stdout.split("wrote")[-1]
    # the unknown user: one note on stderr, then the cold-start list (the same for any stranger)
    assert err.splitlines() == ["fedmf: note: user '999' is not in the training data: the "
                                "cold-start list follows (items of highest item bias, or the "
                                "most rated)"]
    assert "top-3 for user 999 (cold start, ranked by " in stdout
    assert "top-3 for user 2:" in stdout
    lists = json.loads((out / "recommend.json").read_text())["lists"]
    assert [(x["user"], x["known"], len(x["items"])) for x in lists] == [(2, True, 3),
                                                                        (999, False, 3)]
    status, saved, _ = run([*argv, "--save", str(tmp_path / "m.joblib")], capsys)
    assert status == 0 and f"wrote {tmp_path / 'm.joblib'}" in saved
    assert [p.name for p in tmp_path.rglob("*.joblib")] == ["m.joblib"]
    status, served, _ = run(["recommend", "--model", str(tmp_path / "m.joblib"), "--top", "3",
                             "--user", "2", "--out", str(out)], capsys)
    assert status == 0
    assert served.split("top-3")[1].split("\n\n")[0] == saved.split("top-3")[1].split("\n\n")[0]


def test_common_options_on_every_fitting_command(capsys):
    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    common = {"--quiet", "--seed", "--jobs", "--out", "--data", "--user-col", "--item-col",
              "--rating-col", "--clients", "--clients-per-round", "--rounds", "--rank"}
    for name in ("run", "tune", "recommend"):
        options = {o for a in commands[name]._actions for o in a.option_strings}
        assert common <= options, name
        args = parser.parse_args([name, "--quiet", "--seed", "7", "--jobs", "2", "--out", "d"])
        assert (args.quiet, args.seed, args.jobs, args.out) == (True, 7, 2, "d")


def test_recommend_offers_only_rating_methods(tmp_path, capsys):
    parser = build_parser()
    recommend = parser._subparsers._group_actions[0].choices["recommend"]
    text = " ".join(recommend.format_help().split())
    assert "fedmc-admm, fedmavg, fedmgs, rfrec, rfrecf, baseline, blend" in text
    assert "felb" not in text
    assert set(RATING_METHODS) == {"fedmc-admm", "fedmavg", "fedmgs", "rfrec", "rfrecf",
                                   "baseline", "blend"}
    status, _, err = run(["recommend", "--method", "felb", "--data", "synthetic:40x20x300",
                          "--out", str(tmp_path)], capsys)
    assert status == 1 and "recommend takes a rating method: fedmc-admm" in err


@pytest.mark.parametrize("halving", [False, True])
def test_tune_prints_the_number_of_fits_and_an_estimate_first(halving, tmp_path, capsys):
    argv = ["tune", "--method", "fedmavg", "--data", "synthetic:120x40x1500", "--clients",
            "4", "--clients-per-round", "2", "--rounds", "9", "--cv", "2",
            "--grid", "alpha_u=1e-6,0.1,1,10", "--out", str(tmp_path)]  # (1e-6: the default)
    status, out, err = run([*argv, *(["--halving"] if halving else [])], capsys)
    assert status == 0
    plan = out.splitlines()[1]
    assert plan.startswith("plan: ") and " estimated " in plan
    assert " s per fit + " in plan and " s per round; " in plan
    ranked = json.loads((tmp_path / "tune.json").read_text())["ranked"]
    n_fits = 2 * len(ranked)  # every evaluated candidate, on each of the 2 folds
    if halving:  # 4 candidates at 3 rounds, then 2 at 9 (factor 3, rounds up to 9)
        assert "4 x 2 fits of 3 rounds + 2 x 2 fits of 9 rounds" in plan
        assert f"; 12 fits, {4 * 2 * 3 + 2 * 2 * 9} rounds, 1 worker)" in plan and n_fits == 12
    else:
        assert f"4 candidates x 2 folds = {n_fits} fits" in plan and n_fits == 8
        assert "; 8 fits, 72 rounds, 1 worker)" in plan
    # the plan is printed before any candidate is evaluated
    assert out.index("plan: ") < out.index("best parameters")
    assert err.count("fedmf: tune: candidate") == len(ranked)


@pytest.mark.parametrize("n_candidates, max_rounds", [(4, 9), (10, 27), (36, 50), (7, 5),
                                                      (2, 100), (1, 10)])
def test_halving_schedule_is_scikit_learns(n_candidates, max_rounds):
    # Oracle: scikit-learn's own HalvingGridSearchCV, with max_iter as its resource
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(40, 3)), rng.normal(size=40)
    grid = {"alpha": list(np.logspace(-4, 0, n_candidates))}
    search = HalvingGridSearchCV(SGDRegressor(tol=None), grid, resource="max_iter",
                                 max_resources=max_rounds, factor=3, cv=2,
                                 random_state=0).fit(X, y)
    assert halving_schedule(n_candidates, max_rounds) == list(
        zip(search.n_candidates_, search.n_resources_))


def test_help_builds_without_scikit_learn_or_numba():
    # fedmf --help stays fast: the parser of every command needs only the standard library
    code = ("import sys; from sklearn_fedmf.cli import build_parser; p = build_parser(); "
            "[c.format_help() for c in p._subparsers._group_actions[0].choices.values()]; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sklearn', 'numba', 'numpy', 'scipy', 'pandas', 'joblib'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
    for module in ("sklearn_fedmf", "sklearn_fedmf.cli"):
        result = subprocess.run([sys.executable, "-m", module, "--help"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and result.stdout.startswith("usage: fedmf")


@pytest.mark.parametrize("name, lines, message", [
    ("ratings.dat", ["1::10::4::1", "2::11::x::2"], "line 2: rating 'x' is not a number"),
    ("ratings.dat", ["1::10::4::1", "2:11:4:2"], "line 2: 1 fields where the format has 4"),
    ("u.data", ["1\t10\t4\t1", "", "2\t11\t4"], "line 3: 3 fields where the format has 4"),
    ("u.data", ["1\t10\t4\t1", "1\t10\t5\t2"], "line 2: userId 1 rated movieId 10 again"),
])
def test_movielens_formats_name_the_line_too(name, lines, message, tmp_path, capsys):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    status, _, err = run(["run", "--data", str(path), "--out", str(tmp_path / "out")], capsys)
    assert status == 1 and err.startswith(f"fedmf: error: {path} {message}")
