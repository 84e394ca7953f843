"""The main job of ``fedmf`` shows its yardsticks: the global mean and the federated
biases-only model beside each method with the papers' settings and with the library's
defaults, on the same split and clients, timed after a warm-up round."""

import json
import re

import numpy as np
import pytest
from matplotlib.axes import Axes

from sklearn_fedmf import FedBaseline, FedMAvg, FedMCADMM
from sklearn_fedmf.cli import main
from sklearn_fedmf.completion import PAPER_SETTINGS
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.model_selection import train_test_split_ratings

FED = ["--data", "synthetic:200x60x3000", "--clients", "10", "--clients-per-round", "3",
       "--rounds", "4", "--quiet"]
ROWS = ["global mean", "biases only (FedBaseline)", "FedMC-ADMM (papers)",
        "FedMC-ADMM (defaults)", "FedMAvg (papers)", "FedMAvg (defaults)"]
PROTOCOL = dict(n_clients=10, clients_per_round=3, max_iter=4, random_state=0)


def run(argv, capsys):
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def table(out):
    """The table's rows as lists of cells (cells are 2+ spaces apart), and the line under it
    (a fit's "! ..." note, e.g. a degenerate 4-round fit, is not a row)."""
    lines = out.splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("method "))
    rows = []
    for line in lines[start + 2:]:
        if not line.strip() or line.startswith("rows: "):
            return rows, line
        if not line.startswith("! "):
            rows.append(re.split(r"\s{2,}", line.strip()))
    return rows, ""


@pytest.fixture(scope="module")
def split():
    X = make_ratings(200, 60, 3000, random_state=0).X
    return train_test_split_ratings(X, 0.2, random_state=0)


def test_main_job_rows_are_the_yardsticks_then_papers_and_defaults(split, tmp_path, capsys):
    status, out, _ = run([*FED, "--out", str(tmp_path)], capsys)
    assert status == 0
    rows, legend = table(out)
    assert [r[0] for r in rows] == ROWS
    for words in ("global mean = ", "biases only = FedBaseline", "(papers) = PAPER_SETTINGS",
                  "(defaults) = the estimator's defaults", "Same split, clients and rounds",
                  "seconds exclude compilation"):
        assert words in legend
    results = json.loads((tmp_path / "history.json").read_text())["results"]
    by_label = {r["label"]: r for r in results}
    test_rmse = {r[0]: float(r[3]) for r in rows}
    X_train, X_test = split
    # the global mean: the training mean for every held-out rating
    mean = X_train.data.mean()
    assert test_rmse["global mean"] == pytest.approx(
        np.sqrt(np.mean((X_test.data - mean) ** 2)), abs=5e-5)
    # the biases-only yardstick is FedBaseline with the run's clients, rounds and seed
    baseline = FedBaseline(**PROTOCOL).fit(X_train, eval_set=X_test)
    assert by_label["biases only (FedBaseline)"]["summary"]["eval_rmse"] == pytest.approx(
        baseline.history_[-1]["eval_rmse"], rel=1e-12)
    # each method twice: the papers' settings, then the estimator's defaults
    for cls, label, extra in [(FedMCADMM, "FedMC-ADMM", {}),
                              (FedMAvg, "FedMAvg", {"solver_params": {"variant": "fedmc_admm"}})]:
        papers = by_label[f"{label} (papers)"]["params"]
        defaults = by_label[f"{label} (defaults)"]["params"]
        assert {k: papers[k] for k in PAPER_SETTINGS[cls.__name__]} == PAPER_SETTINGS[
            cls.__name__]
        assert all(papers[k] == v for k, v in extra.items())
        own = cls().get_params()
        changed = {k for k, v in defaults.items()
                   if v != own[k] and not (v != v and own[k] != own[k])}  # NaN == NaN
        assert changed <= {*PROTOCOL, "n_components", "n_jobs"}
        model = cls(**{**papers, "verbose": 0}).fit(X_train, eval_set=X_test)
        assert by_label[f"{label} (papers)"]["summary"]["eval_rmse"] == pytest.approx(
            model.history_[-1]["eval_rmse"], rel=1e-10)
    # the same clients for every federated row
    for r in results[1:]:
        assert {k: r["params"][k] for k in PROTOCOL} == PROTOCOL


def test_timed_fits_come_after_a_warm_up_round_of_each(tmp_path, capsys, monkeypatch):
    calls = []
    for cls in (FedBaseline, FedMCADMM, FedMAvg):
        def recording_fit(self, *args, _fit=cls.fit, **kwargs):
            calls.append((type(self).__name__, self.max_iter))
            return _fit(self, *args, **kwargs)

        monkeypatch.setattr(cls, "fit", recording_fit)
    assert run([*FED, "--out", str(tmp_path)], capsys)[0] == 0
    fits = ["FedBaseline", "FedMCADMM", "FedMCADMM", "FedMAvg", "FedMAvg"]
    # every warm-up (1 round) before the first timed fit (4 rounds), one per row
    assert calls == [(name, 1) for name in fits] + [(name, 4) for name in fits]


def test_plot_marks_the_yardsticks_as_horizontal_lines(tmp_path, capsys, monkeypatch):
    lines = {}
    axhline = Axes.axhline

    def recording_axhline(self, y=0, *args, **kwargs):
        lines[kwargs.get("label")] = y
        return axhline(self, y, *args, **kwargs)

    monkeypatch.setattr(Axes, "axhline", recording_axhline)
    assert run([*FED, "--out", str(tmp_path)], capsys)[0] == 0
    results = json.loads((tmp_path / "history.json").read_text())["results"]
    assert lines == {r["label"]: r["summary"]["eval_rmse"] for r in results[:2]}
    assert set(lines) == {"global mean", "biases only (FedBaseline)"}


def test_settings_and_yardsticks_can_be_chosen(tmp_path, capsys):
    status, out, _ = run([*FED, "--settings", "defaults", "--no-baselines",
                          "--out", str(tmp_path)], capsys)
    rows, legend = table(out)
    assert status == 0 and [r[0] for r in rows] == ["FedMC-ADMM (defaults)",
                                                    "FedMAvg (defaults)"]
    assert legend == ""  # one kind of row: nothing to explain
    # the biases-only model is also a method of its own (then it is not repeated)
    status, out, _ = run([*FED, "--method", "baseline", "--out", str(tmp_path)], capsys)
    rows, legend = table(out)
    assert status == 0 and [r[0] for r in rows] == ["global mean", "biases only (FedBaseline)"]
    assert legend.startswith("rows: global mean = the training mean; biases only = FedBaseline")
    assert "(papers)" not in legend


def test_set_applies_to_the_methods_that_have_the_parameter(tmp_path, capsys):
    argv = [*FED, "--settings", "papers", "--no-baselines", "--out", str(tmp_path)]
    status, _, err = run([*argv, "--set", "beta=0.5"], capsys)  # FedMAvg has no beta
    assert status == 0, err
    results = json.loads((tmp_path / "history.json").read_text())["results"]
    assert [r["params"].get("beta") for r in results] == [0.5, None]
    status, _, err = run([*argv, "--set", "nonsense=1"], capsys)
    assert status == 1 and err == ("fedmf: error: --set nonsense=...: no method of the run "
                                   "(fedmc-admm,fedmavg) has a parameter 'nonsense'\n")
