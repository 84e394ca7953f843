"""The exchange seam (issue 36, point 1): secure aggregation enters a fit through
``sklearn_fedmf.engine._exchange`` only. Every secure sum of a fit is one call of
``SecureExchange._sum`` (so a variant of the sum plugs in there, not in the round loop),
and no other module outside ``secure/`` imports it."""

import ast
import os
import subprocess
import sys
import warnings
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from sklearn_fedmf import FedMAvg, FedMCADMM
from sklearn_fedmf.datasets import make_ratings
from sklearn_fedmf.engine import _exchange
from sklearn_fedmf.engine._exchange import PlainExchange, SecureExchange
from sklearn_fedmf.exceptions import ClientError, ClientFailureWarning

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sklearn_fedmf"
needs_secure = pytest.mark.skipif(find_spec("cryptography") is None,
                                  reason="secure aggregation needs the secure extra")


def ratings():
    return make_ratings(200, 60, 4000, random_state=0)["X"]


@needs_secure
def test_every_secure_sum_of_a_fit_goes_through_the_exchange(monkeypatch):
    """The labels of the sums the exchange ran are those of the rounds' ``secure`` records
    (start, update, validation reports), in order, then the biases floor's fit."""
    calls = []
    original = SecureExchange._sum

    def recording(self, transport, clients, dropped, key, round_number, exchange, **kwargs):
        calls.append((exchange, key))
        return original(self, transport, clients, dropped, key, round_number, exchange,
                        **kwargs)

    monkeypatch.setattr(SecureExchange, "_sum", recording)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FedMCADMM(n_components=2, n_clients=6, max_iter=4, random_state=0,
                          early_stopping=True, validation_fraction=0.1,
                          secure_aggregation=True).fit(ratings())
    recorded = []
    for record in model.history_:
        start = record["secure"].get("start")
        if start is not None:
            recorded.append(start["label"])
        recorded += [e["label"] for e in record["secure"]["exchanges"]]
    labels = [label for label, _ in calls]
    assert labels[:len(recorded)] == recorded
    assert recorded.count("update") == recorded.count("report") == len(model.history_)
    # one seed per sum of the fit: the start's, and each round's update and reports
    assert len({key for _, key in calls[:len(recorded)]}) == len(recorded)
    # then the biases floor's own secure fit (early stopping), through the same exchange
    floor = labels[len(recorded):]
    assert floor[0] == "init" and set(floor) <= {"init", "update"} and "update" in floor


@needs_secure
def test_a_variant_of_the_sum_reaches_the_model_without_the_round_loop(monkeypatch):
    """A wrapper of ``_sum`` that changes what the server receives (here: one more added to
    every entry of a round's sums) changes the fitted model: the loop takes the sums from the
    exchange."""
    X = ratings()
    params = dict(n_components=2, n_clients=6, max_iter=3, random_state=0,
                  secure_aggregation=True, solver_params={"w_step": "local"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = FedMAvg(**params).fit(X)
        original = SecureExchange._sum

        def doubled(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if args[5] == "update":
                result.sums = {k: v + 1.0 for k, v in result.sums.items()}
            return result

        monkeypatch.setattr(SecureExchange, "_sum", doubled)
        changed = FedMAvg(**params).fit(X)
    assert not np.allclose(reference.components_, changed.components_)


def test_a_plain_fit_runs_the_plain_exchange_and_keeps_it_for_warm_start():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = FedMCADMM(n_components=2, n_clients=4, max_iter=2, random_state=0,
                          warm_start=True).fit(ratings())
    assert isinstance(model._federation.exchange, PlainExchange)
    assert not any("secure" in key for r in model.history_ for key in r)


def test_a_plain_fit_needs_no_cryptography_and_a_secure_one_names_its_extra():
    """The engine imports the secure exchange; ``cryptography`` (the secure extra) is
    imported by the first secure fit only (a fresh process in which it cannot be
    imported)."""
    script = """
import sys, warnings
sys.modules["cryptography"] = None  # (not installed)
from sklearn_fedmf import FedMCADMM
from sklearn_fedmf.datasets import make_ratings
X = make_ratings(60, 30, 900, random_state=0)["X"]
params = dict(n_components=2, n_clients=3, max_iter=2, random_state=0)
warnings.simplefilter("ignore")
FedMCADMM(**params).fit(X)
try:
    FedMCADMM(**params, secure_aggregation=True).fit(X)
except ModuleNotFoundError as exc:
    print(exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "pip install 'sklearn_fedmf[secure]'" in done.stdout


def _secure_imports(path):
    """``(line, inside a function)`` of each import of ``secure`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.module else [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any("secure" in name.split(".") for name in names):
            found.append((node.lineno, id(node) in inside))
    return found


def test_secure_aggregation_enters_through_the_exchange_module_only():
    importing = {}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "secure":
            continue
        found = _secure_imports(path)
        if found:
            importing[str(relative)] = found
    assert list(importing) == ["engine/_exchange.py"]
    assert not any(inside for found in importing.values() for _, inside in found)


def test_the_import_reader_sees_imports_inside_functions(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from .secure import a\n\ndef f():\n    from ..secure._rounds import b\n")
    assert _secure_imports(path) == [(1, False), (4, True)]


def test_an_error_in_a_clients_secure_phase_surfaces_with_its_client_and_phase(monkeypatch):
    """A client's exception inside a secure phase is not swallowed: it is raised as a
    ClientError naming the client and the phase, chained to the original, or (skip) warned
    once and counted in n_failed."""
    real = _exchange.client_secure_phase

    def failing(phase, client, slot, message, *args):
        if phase == "secure_masked_input" and client == 2 and message["exchange"] == "update":
            raise RuntimeError("disk full")  # (a round's sum: at the start every error raises)
        return real(phase, client, slot, message, *args)

    monkeypatch.setattr(_exchange, "client_secure_phase", failing)
    params = dict(n_components=2, n_clients=8, max_iter=2, random_state=0,
                  early_stopping=False, secure_aggregation=True)
    with pytest.raises(ClientError, match="Client 2 failed in secure_masked_input .round") as info:
        FedMCADMM(**params).fit(ratings())
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.warns(ClientFailureWarning, match="disk full"):
        est = FedMCADMM(**params, solver_params={"on_client_error": "skip"}).fit(ratings())
    assert sum(r["n_failed"] for r in est.history_) >= 1
