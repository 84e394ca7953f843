"""Every script of ``examples/`` and the ``fedmf`` main job run end to end on reduced sizes."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").glob("*.py"))
PNG = b"\x89PNG\r\n\x1a\n"
# rows each example prints (the first word(s) of its table lines)
ROWS = {
    "plot_movielens_completion.py": ["FedMC-ADMM", "FedMAvg"],
    "plot_tuning_gridsearch.py": ["best:"],
    "plot_federated_clustering.py": ["k-means (pooled data)", "FedMGS (gradient sharing)",
                                     "FedMAvg (model averaging)"],
    "plot_binary_factorization.py": ["Felb ", "Felb-MU", "AggregatedBMF (one shot)"],
    "plot_recommend.py": ["global mean", "FedMGS", "top-10 for user"],
}


def test_every_example_is_covered():
    assert {p.name for p in EXAMPLES} == set(ROWS)


@pytest.mark.slow  # whole scripts of examples/ (fits and a matplotlib figure each)
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_quick_and_saves_its_figure(script, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(script), "--quick", "--out", str(tmp_path)])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    figures = list(tmp_path.glob("*.png"))
    assert len(figures) == 1 and figures[0].read_bytes()[:8] == PNG
    assert f"wrote {figures[0]}" in out
    lines = out.splitlines()
    for row in ROWS[script.name]:
        assert any(line.startswith(row) for line in lines), f"no row {row!r} in:\n{out}"


def test_recommend_example_takes_the_csv_column_names(tmp_path, capsys, monkeypatch):
    import numpy as np

    rng = np.random.default_rng(0)
    users, items = np.nonzero(rng.random((150, 15)) < 0.5)  # (--quick: 15 users)
    lines = ["user,item,rating", *(f"u{u},i{i},{1 + (u + i) % 5}" for u, i in zip(users, items))]
    (tmp_path / "mine.csv").write_text("\n".join(lines) + "\n")
    script = next(p for p in EXAMPLES if p.name == "plot_recommend.py")
    monkeypatch.setattr(sys, "argv", [str(script), "--csv", str(tmp_path / "mine.csv"),
                                      "--user-col", "user", "--item-col", "item",
                                      "--rating-col", "rating", "--quick", "--out",
                                      str(tmp_path)])
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "top-10 for user u" in out and (tmp_path / "recommend.png").exists()


@pytest.mark.slow  # (a subprocess; tests/test_cli_main_job.py runs the main job in-process)
def test_main_job_as_a_command(tmp_path):
    """``python -m sklearn_fedmf`` with the main job's defaults except the sizes."""
    argv = ["--data", "synthetic:150x50x2000", "--clients", "10", "--clients-per-round", "3",
            "--rounds", "3", "--out", str(tmp_path)]
    result = subprocess.run([sys.executable, "-m", "sklearn_fedmf", *argv], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG
    labels = [r["label"] for r in json.loads((tmp_path / "history.json").read_text())["results"]]
    assert labels == ["global mean", "biases only (FedBaseline)", "FedMC-ADMM (papers)",
                      "FedMC-ADMM (defaults)", "FedMAvg (papers)", "FedMAvg (defaults)"]
    for label in labels:
        assert any(line.startswith(label + "  ") for line in result.stdout.splitlines())
    # the progress bars (verbose=1) go to stderr, the table to stdout
    assert "3/3" in result.stderr and "3/3" not in result.stdout


def test_api_reference_lists_every_public_name():
    """docs/api.rst documents each name of each public module's ``__all__``."""
    import importlib

    text = (Path(__file__).parents[1] / "docs" / "api.rst").read_text()
    for module in ["sklearn_fedmf", "sklearn_fedmf.datasets", "sklearn_fedmf.metrics",
                   "sklearn_fedmf.model_selection"]:
        for name in importlib.import_module(module).__all__:
            if not name.startswith("__"):
                assert f":: {name}\n" in text or f"   {name}\n" in text, (module, name)
    assert ".. automodule:: sklearn_fedmf.privacy" in text
