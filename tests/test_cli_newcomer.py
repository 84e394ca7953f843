"""A newcomer's own small CSV (string ids, columns ``user,item,rating``, 60 users) through
every ``fedmf`` command with no flag but ``--data``: the columns and the number of clients
adapt to the file, and each command prints the same output twice and with its default
options spelled out (the seconds aside)."""

import re

import numpy as np
import pytest

from sklearn_fedmf import FedMGS
from sklearn_fedmf.cli import main

pytestmark = pytest.mark.filterwarnings("ignore")


def run(argv, capsys):
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 0, err
    return out, err


def without_seconds(text):
    """``text`` with every measured time replaced: ``in 0.3 s``, ``(1.2 s)`` and the cells of
    a table's ``seconds`` or ``fit s`` column (the only ones that differ from run to run)."""
    lines = re.sub(r"\d+(\.\d+)? (s|min|h)\b", "<t>", text).splitlines()
    end = None
    for k, line in enumerate(lines):
        column = re.search(r"\b(seconds|fit s)\b", line)
        if column:  # a table header: its cells end where the header's name ends
            end = column.end()
        elif not line.strip():
            end = None
        elif end is not None:
            lines[k] = "".join(
                "<t>".rjust(len(m[0])) if m.end() == end else m[0]
                for m in re.finditer(r"\s*\S+", line))
    return "\n".join(lines)


@pytest.fixture
def newcomer_csv(tmp_path):
    """60 users (string ids) x 40 items, 3 to 11 ratings each, with a low-rank part."""
    rng = np.random.default_rng(7)
    u, v = rng.normal(size=(60, 2)), rng.normal(size=(40, 2))
    lines = ["user,item,rating"]
    for a in range(60):
        for j in rng.choice(40, rng.integers(3, 12), replace=False):
            r = np.clip(np.round(3.4 + 0.6 * u[a] @ v[j] + rng.normal(0, 0.6)), 1, 5)
            lines.append(f"user_{a},item_{j:02d},{r}")
    path = tmp_path / "ratings.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_run_reads_the_file_with_no_flag_and_says_what_it_chose(newcomer_csv, tmp_path,
                                                                 capsys):
    out, err = run(["run", "--data", str(newcomer_csv), "--quiet", "--out", str(tmp_path)],
                   capsys)
    notes = [line for line in err.splitlines() if "columns" in line or "--clients" in line]
    assert notes == [
        f"fedmf: note: {newcomer_csv}: columns user, item, rating read as user, item and "
        "rating (--user-col, --item-col and --rating-col choose others)",
        "fedmf: note: --clients 60: one client per user (the default 100 is more than the 60 "
        "users of the data)"]
    assert f"data: {newcomer_csv}: 60 users x 40 items" in out


def test_a_file_without_header_reads_its_first_three_columns(newcomer_csv, tmp_path, capsys):
    headerless = tmp_path / "plain.csv"
    headerless.write_text(newcomer_csv.read_text().split("\n", 1)[1])
    out, err = run(["run", "--data", str(headerless), "--method", "fedmgs", "--settings",
                    "defaults", "--quiet", "--out", str(tmp_path)], capsys)
    assert f"{headerless}: no header; its first three columns read as user, item" in err
    with_header, _ = run(["run", "--data", str(newcomer_csv), "--method", "fedmgs",
                          "--settings", "defaults", "--quiet", "--out", str(tmp_path)], capsys)
    assert without_seconds(out.replace(str(headerless), "F")) == \
        without_seconds(with_header.replace(str(newcomer_csv), "F"))


@pytest.mark.parametrize("command, typed, spelled", [
    # run: the main job's methods and protocol (--clients: one per user, 60 here)
    pytest.param(["run"], [], [
        "--method", "fedmc-admm,fedmavg", "--settings", "both", "--clients", "60",
        "--clients-per-round", "10", "--rounds", "100", "--rank", "5", "--seed", "0",
        "--test-size", "0.2", "--jobs", "1"], marks=pytest.mark.slow),
    # recommend: the estimator's defaults (FedMGS: 10 clients) and the seed 0
    (["recommend", "--user", "user_3", "--user", "stranger"], [],
     ["--method", "fedmgs", "--clients", "10", "--seed", "0", "--top", "10", "--jobs", "1"]),
    # tune: a small grid (typed in all three), the rest spelled out (--clients: one per user
    # of the smallest training fold, 59 here)
    pytest.param(["tune", "--method", "fedmgs"], ["--grid", "alpha_u=1,10", "--cv", "2"], [
        "--clients", "59", "--clients-per-round", "10", "--rounds", "50", "--rank", "5",
        "--seed", "0", "--split", "ratings", "--top", "15"], marks=pytest.mark.slow),
])
def test_every_command_prints_the_same_twice_and_with_its_defaults_spelled_out(
        command, typed, spelled, newcomer_csv, tmp_path, capsys):
    argv = [*command, "--data", str(newcomer_csv), *typed, "--quiet", "--out", str(tmp_path)]
    first = without_seconds(run(argv, capsys)[0])
    assert without_seconds(run(argv, capsys)[0]) == first
    assert without_seconds(run([*argv, *spelled], capsys)[0]) == first


def test_flower_split_writes_the_same_sites_twice(newcomer_csv, tmp_path, capsys):
    outputs = []
    for _attempt in range(2):
        out, _ = run(["flower-split", "--data", str(newcomer_csv), "--out",
                      str(tmp_path / "sites")], capsys)
        outputs.append((out, sorted((p.name, p.read_bytes())
                                    for p in (tmp_path / "sites").glob("*.npz"))))
    assert outputs[0] == outputs[1] and len(outputs[0][1]) == 4


def test_recommend_help_names_the_defaults_of_the_model_that_runs(capsys):
    with pytest.raises(SystemExit):
        main(["recommend", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--method NAME one rating method among" in text and "(default: fedmgs)" in text
    assert f"(default: the estimator's own: n_clients={FedMGS().n_clients})" in text
    assert "--rounds ROUNDS communication rounds (default: the estimator's own" in text
