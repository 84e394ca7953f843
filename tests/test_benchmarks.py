"""Every benchmark script still runs: its ``--quick`` smoke run exits 0 and prints its table.

The figures themselves are measured by hand (they depend on the machine); what this guards
against is a script left behind by a change of the code it times.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# Each case starts a benchmark script in a fresh interpreter (seconds to tens of seconds):
# `python -m pytest -m slow`, not the README's fast set (the scripts are not the package).
pytestmark = pytest.mark.slow

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"

# script, extra arguments, a line fragment its table must print
SMOKE_RUNS = [
    ("bench_fedmcadmm.py", [], "reference (numpy/scipy, per client)"),
    ("bench_beta.py", [], "beta / b0"),
    ("bench_completion.py", [], "test RMSE"),
    ("bench_movielens.py", [], "FedMCADMM, GridSearchCV-tuned"),
    ("bench_clustering.py", [], "ACC %"),
    ("bench_felb.py", [], "best F1*"),
    ("bench_rfrec.py", ["--table", "cost"], "s/round (1)"),
    ("bench_rfrec_scale.py", ["--cache-dir", "."], "peak RSS (MB)"),
    ("bench_privacy.py", [], "basic/PLD"),
    ("run_all.py", ["--shapes", "ml1m", "--methods", "FedMCADMM,FedMAvg", "--cache-dir", ".",
                    "--clients", "100,per-user", "--n-jobs", "2"], "ratings x steps/s"),
    ("bench_dask.py", ["--cache-dir", "."], "Dask LocalCluster"),
    ("bench_predict.py", ["--repeat", "1"], "naive numpy (dense scores, argpartition)"),
    ("bench_cv.py", [], "FedMCADMM"),
    ("bench_defaults.py", [], "tuned parameters"),
    ("bench_accuracy.py", [], "RFRec (tuned)"),
    ("bench_fed_baseline.py", [], "running sums of the latest uploads"),
    ("bench_secure.py", [], "total (wall)"),
    # whole default fits, plain against secure (early stopping: 20,000 ratings validate)
    ("bench_secure.py", ["--estimators", "--only", "FedBaseline", "--rounds", "default"],
     "rounds plain,"),
    # what each party pays per round, from history_'s secure records, beside the floor
    ("bench_secure.py", ["--deployment", "--only", "FedMGS"], "FedMGS"),
    ("bench_topn.py", [], "FedMGS (implicit, min_support=20)"),
    ("bench_implicit_als.py", [], 'FedMGS(loss="implicit"), cg'),
    ("bench_implicit_als.py", ["--phases", "--solvers", "cg"], "clients' aggregates"),
    ("bench_fit_time.py", ["--runs", "1", "--estimators", "FedMAvg"], "FedMAvg (defaults)"),
    ("bench_blend.py", [], "fit time / slowest member"),
    ("profile_fedmgs_round.py", ["--cache-dir", "."], "replace_outer kernel"),
]


@pytest.mark.parametrize("script, args, expected", SMOKE_RUNS, ids=[s for s, _, _ in SMOKE_RUNS])
def test_benchmark_smoke_run(script, args, expected, tmp_path):
    if script == "bench_dask.py":
        pytest.importorskip("distributed", reason="the optional 'dask' extra is not installed")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--quick", *args],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,  # outputs, caches: here
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout, done.stdout[-2000:]


def test_topn_reads_movielens_1m_from_its_folder(tmp_path):
    """``--movielens-dir`` is told apart by its file: a folder holding ``ratings.dat`` is the
    ml-1m set (here a small made-up one in its format), and a set without its folder is
    skipped with a note."""
    rng = np.random.default_rng(0)
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    users = np.repeat(np.arange(1, 201), 25)
    items = np.concatenate([rng.choice(np.arange(1, 201), 25, replace=False) for _ in range(200)])
    lines = [f"{u}::{i}::{rng.integers(1, 6)}::{978300000 + k}"
             for k, (u, i) in enumerate(zip(users, items))]
    (folder / "ratings.dat").write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_topn.py"), "--quick", "--sets",
         "ml-100k,ml-1m", "--movielens-dir", str(folder), "--estimators", "FedMGS",
         "--losses", "implicit", "--holdout", "latest"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ml-100k: skipped" in done.stdout, done.stdout[-2000:]
    # --quick keeps users 10, 20, ..., 200 (userId % 10 == 0): 20 held-out ratings
    assert "ml-1m (one user in ten): 480 training ratings, 20 users" in done.stdout
    assert "(the latest)" in done.stdout
    assert "FedMGS (implicit, min_support=20)" in done.stdout
