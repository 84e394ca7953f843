"""The ``fedmf`` command: run, compare and tune federated matrix factorization from a shell.

``fedmf`` alone is the README's main job: FedMC-ADMM and FedMAvg side by side on the embedded
MovieLens latest-small under the papers' protocol (80/20 hold-out with seed 0, 100 clients, 10
sampled per round, 100 rounds, rank 5). It prints a table of final test RMSE, seconds and bytes
communicated and writes ``curves.png`` (objective and test RMSE per round) and
``history.json`` to ``--out``. ``fedmf run`` takes any method and data set, ``fedmf tune``
runs a (halving) grid search and ``fedmf methods`` lists the registry.

Every error prints one line on stderr and exits non-zero; ``FEDMF_DEBUG=1`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

__all__ = ["main", "METHODS"]

MAIN_JOB = ("fedmc-admm", "fedmavg")
PROTOCOL = dict(clients=100, clients_per_round=10, rounds=100, rank=5, seed=0, test_size=0.2)
BINARY_THRESHOLD = 3.5  # Felb's binarization of MovieLens: rating >= 3.5 -> 1


@dataclass(frozen=True)
class Method:
    """One entry of the registry: an estimator class, the parameters of its variant, a grid."""

    name: str
    target: str  # "module:Class"
    kind: str  # "completion" (ratings, held-out RMSE) or "binary" (0/1 data, F1)
    label: str
    sends: str  # what a client uploads, for ``fedmf methods``
    fixed: dict = field(default_factory=dict)
    grid: dict = field(default_factory=dict)
    objective: str = ""  # methods with the same label here record the same objective function

    def load(self):
        """The estimator class, or None when it is not part of this installation."""
        module, _, cls = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            return None


# The RFRec authors' code settings: the paper's plain gradient steps (learning_rate 0.05)
# diverge on MovieLens, Adam is scale-free (RFRec docstring; benchmarks/bench_rfrec.py).
_RFREC_CODE = {"optimizer": "adam", "link": "sigmoid", "learning_rate": 0.1,
               "reg_consensus": 20.0}

METHODS = {
    m.name: m
    for m in [
        Method(
            "fedmc-admm", "sklearn_fedmf.completion:FedMCADMM", "completion", "FedMC-ADMM",
            "its item-factor copy W_i and dual Y_i",
            grid={"alpha_u": [1e-6, 1.0, 10.0], "beta": ["auto", 0.01, 0.1], "local_iter": [5, 10],
                  "n_clients": [50, 100], "n_components": [5, 10]},
            objective="fedmc",
        ),
        Method(
            "fedmavg", "sklearn_fedmf.completion:FedMAvg", "completion", "FedMAvg",
            "its item-factor copy W_i after Q2 local steps",
            fixed={"variant": "fedmc_admm"},  # the baseline as the FedMC-ADMM paper restates it
            grid={"alpha_u": [1e-6, 1.0, 10.0], "local_iter_u": [5, 10],
                  "local_iter_v": [5, 10], "n_clients": [50, 100], "n_components": [5, 10]},
            objective="fedmc",  # (1/p) sum_i [f_i + R_i] + R(V), as FedMC-ADMM's
        ),
        Method(
            "fedmgs", "sklearn_fedmf.completion:FedMGS", "completion", "FedMGS",
            "the V-gradient of its squared error and its r x r Gram U_i^T U_i",
            grid={"alpha_u": [1e-6, 1.0, 10.0], "local_iter_u": [5, 10],
                  "n_clients": [50, 100], "n_components": [5, 10]},
        ),
        Method(
            "rfrec", "sklearn_fedmf.completion:RFRec", "completion", "RFRec",
            "its item-matrix copy V_(c) (optionally clipped + Laplace noise)",
            fixed={"variant": "rfrec", **_RFREC_CODE},
            grid={"reg_consensus": [5.0, 20.0, 80.0], "learning_rate": [0.03, 0.1],
                  "n_clients": [50, 100], "n_components": [5, 10]},
        ),
        Method(
            "rfrecf", "sklearn_fedmf.completion:RFRec", "completion", "RFRecF",
            "its item-matrix copy V_(c), only when its coin flips to averaging",
            fixed={"variant": "rfrecf", "p": 0.8, "pull_eta": 1.0, **_RFREC_CODE},
            grid={"reg_consensus": [5.0, 20.0, 80.0], "p": [0.5, 0.8],
                  "n_clients": [50, 100], "n_components": [5, 10]},
        ),
        Method(
            "felb", "sklearn_fedmf.binary:Felb", "binary", "Felb",
            "its item-factor copy V_i (optionally with local DP noise)",
            grid={"lam": [0.01, 0.1], "gamma": [0.1, 1.0], "sync_every": [5, 10],
                  "n_clients": [10, 50], "n_components": [10, 20]},
        ),
        Method(
            "felb-mu", "sklearn_fedmf.binary:Felb", "binary", "Felb-MU",
            "its item-factor copy V_i (optionally with local DP noise)",
            fixed={"update": "mu"},
            grid={"lam": [0.01, 0.1], "gamma": [0.1, 1.0], "sync_every": [5, 10],
                  "n_clients": [10, 50], "n_components": [10, 20]},
        ),
    ]
}

# command-line option -> estimator parameter
_OPTION_PARAMS = {
    "clients": "n_clients", "clients_per_round": "clients_per_round", "rounds": "max_iter",
    "rank": "n_components", "jobs": "n_jobs", "seed": "random_state",
}


class CommandError(Exception):
    """A user error: printed as one line, exit status 1."""


# ---- data -------------------------------------------------------------------------------------
def load_data(spec, seed=0):
    """``(X, description)`` for a ``--data`` value (see ``fedmf run --help``)."""
    from .datasets import fetch_movielens, load_movielens, make_binary_tiles, make_ratings

    if spec in ("embedded", "movielens", "latest-small"):
        return load_movielens().X, "MovieLens latest-small (embedded)"
    if spec.startswith("synthetic:"):
        n_users, n_items, n_ratings = _parse_sizes(spec[len("synthetic:"):],
                                                   "synthetic:USERSxITEMSxRATINGS")
        if n_ratings > n_users * n_items:
            raise CommandError(
                f"impossible sizes in --data {spec}: {n_ratings} ratings do not fit in "
                f"{n_users} x {n_items} = {n_users * n_items} cells"
            )
        data = make_ratings(n_users, n_items, n_ratings, random_state=seed)
        return data.X, f"synthetic {n_users} x {n_items}, {n_ratings} ratings"
    if spec.startswith("tiles:"):
        rows, cols, tiles = _parse_sizes(spec[len("tiles:"):], "tiles:ROWSxCOLSxTILES")
        data = make_binary_tiles(rows, cols, tiles, random_state=seed)
        return data.X, f"binary tiles {rows} x {cols}, {tiles} tiles"
    if spec.startswith("movielens:"):
        variant = spec.split(":", 1)[1]
        return fetch_movielens(variant).X, f"MovieLens {variant}"
    path = Path(spec).expanduser()
    if not path.exists():
        raise CommandError(
            f"--data {spec}: no such file or directory (expected 'embedded', "
            "'synthetic:USERSxITEMSxRATINGS', 'movielens:VARIANT' or a MovieLens ratings "
            "file or folder)"
        )
    file, variant = _movielens_file(path)
    return load_movielens(variant, path=file).X, f"MovieLens {variant} ({file})"


def _parse_sizes(text, form):
    scale = {"": 1, "k": 10**3, "m": 10**6}
    parts = text.lower().split("x")
    match = [re.fullmatch(r"(\d+(?:\.\d+)?)([km]?)", p.strip()) for p in parts]
    prefix = form.split(":")[0]
    if len(parts) != 3 or not all(match):
        raise CommandError(f"--data {prefix}:{text}: expected {form}, e.g. {prefix}:2000x500x50k")
    sizes = [int(float(m[1]) * scale[m[2]]) for m in match]
    if min(sizes[:2]) < 1 or (prefix == "tiles" and sizes[2] < 1):
        raise CommandError(f"--data {prefix}:{text}: impossible sizes (each must be at least 1)")
    return sizes


def prepare_data(args, kind):
    """``(X, X_fit, X_test, description)``: ratings split 80/20 per user, or 0/1 data."""
    tiles = args.data.startswith("tiles:")
    if tiles and kind != "binary":
        raise CommandError(f"--data {args.data} is binary data, for the binary methods "
                           "(felb, felb-mu) only")
    X, name = load_data(args.data, args.seed)
    _check_sizes(X, args)
    if kind == "binary":
        if not tiles:
            X_fit = binarize(X)
            name += f", binarized at rating >= {BINARY_THRESHOLD}"
        return X, X if tiles else X_fit, None, name
    from .model_selection import train_test_split_ratings

    X_train, X_test = train_test_split_ratings(X, args.test_size, random_state=args.seed)
    return X, X_train, X_test, name


def _movielens_file(path):
    """The ratings file under ``path`` and its MovieLens variant (from the file/folder name)."""
    names = ("u.data", "ratings.dat", "ratings.csv")
    if path.is_dir():
        found = [path / n for n in names if (path / n).is_file()]
        found += sorted(f for n in names for f in path.glob(f"*/{n}"))
        if not found:
            raise CommandError(
                f"--data {path}: no MovieLens ratings file (u.data, ratings.dat or "
                "ratings.csv) in this folder or its subfolders"
            )
        path = found[0]
    folder = path.parent.name.lower()
    if path.name == "u.data":
        return path, "100k"
    if path.name.endswith(".dat"):
        return path, "10m" if "10m" in folder else "1m"
    for variant in ("latest-small", "20m", "25m", "32m"):
        if folder.endswith(variant):
            return path, variant
    return path, "latest"


def binarize(X, threshold=BINARY_THRESHOLD):
    """The 0/1 matrix ``rating >= threshold`` (Felb's protocol for MovieLens), sparse."""
    X = sp.csr_matrix(X, copy=True)
    X.data = (X.data >= threshold).astype(np.float64)
    X.eliminate_zeros()
    return X


# ---- estimators -------------------------------------------------------------------------------
def available_methods():
    """Registry entries whose estimator exists in this installation."""
    return {name: m for name, m in METHODS.items() if m.load() is not None}


def _methods(text):
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    available = available_methods()
    for name in names:
        if name not in available:
            raise CommandError(
                f"unknown method {name!r}; available: {', '.join(available)}"
            )
    if len({available[n].kind for n in names}) > 1:
        raise CommandError(
            "rating-completion and binary methods cannot share a run (different data and "
            "metrics); run them separately"
        )
    return [available[n] for n in names]


def make_estimator(method, args, *, verbose=0):
    """The estimator of ``method`` with the command-line options mapped onto its parameters."""
    cls = method.load()
    params = cls().get_params()
    chosen = {**method.fixed}
    for option, param in _OPTION_PARAMS.items():
        value = getattr(args, option, None)
        if value is None:
            continue
        if param in params:
            chosen[param] = value
        elif option in args.explicit:
            _note(f"{method.name} has no parameter {param}; --{option.replace('_', '-')} ignored")
    if "verbose" in params:
        chosen["verbose"] = verbose
    for key, value in (getattr(args, "set", None) or []):
        if key not in params:
            raise CommandError(f"--set {key}=...: {method.name} has no parameter {key!r}")
        chosen[key] = value
    return cls(**chosen)


def _check_sizes(X, args):
    n_rows, n_items = X.shape
    if args.clients is not None and args.clients > n_rows:
        raise CommandError(
            f"impossible sizes: --clients {args.clients} is more than the {n_rows} users of "
            "the data (every client needs at least one row)"
        )
    cpr = args.clients_per_round
    if isinstance(cpr, int) and args.clients is not None and cpr > args.clients:
        if "clients_per_round" in args.explicit:
            raise CommandError(f"impossible sizes: --clients-per-round {cpr} is more than "
                               f"--clients {args.clients}")
        args.clients_per_round = args.clients  # the default 10 with fewer clients: all of them
    if args.rank is not None and args.rank > n_items:
        raise CommandError(f"impossible sizes: --rank {args.rank} is more than {n_items} items")


# ---- run --------------------------------------------------------------------------------------
def fit_method(method, estimator, X_train, X_test=None, seen=None):
    """Fit, time, and summarize one estimator.

    Each distinct warning becomes one ``note`` line (once per command: ``seen`` holds those
    already printed) and is kept in the result.
    """
    fit_params = {}
    if X_test is not None and "eval_set" in inspect.signature(estimator.fit).parameters:
        fit_params["eval_set"] = X_test
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tic = time.perf_counter()
        estimator.fit(X_train, **fit_params)
        seconds = time.perf_counter() - tic
    messages = list(dict.fromkeys(str(w.message).splitlines()[0] for w in caught))
    seen = set() if seen is None else seen
    for message in messages:
        if message not in seen:
            _note(message)
            seen.add(message)
    history = [_jsonable(r) for r in getattr(estimator, "history_", [])]
    summary = {
        "rounds": int(getattr(estimator, "n_iter_", len(history))),
        "seconds": seconds,
        "bytes_uploaded": int(sum(r.get("bytes_uploaded", 0) for r in history)),
        "bytes_downloaded": int(sum(r.get("bytes_downloaded", 0) for r in history)),
    }
    for key in ("train_rmse", "eval_rmse", "f1", "rmsd", "objective"):
        values = [r[key] for r in history if key in r]
        if values:
            summary[key] = float(values[-1])
    if method.kind == "completion" and "eval_rmse" not in summary and X_test is not None:
        summary["eval_rmse"] = -float(estimator.score(X_train, X_test))
    return {"method": method.name, "label": method.label, "kind": method.kind,
            "objective": _objective_id(method, estimator),
            "estimator": type(estimator).__name__, "params": _jsonable(estimator.get_params()),
            "summary": summary, "warnings": messages, "history": history}


def _objective_id(method, estimator):
    """Which objective ``history_`` records: shared only while the variant is unchanged."""
    params = estimator.get_params()
    unchanged = all(params.get(k) == v for k, v in method.fixed.items())
    return method.objective if method.objective and unchanged else method.name


def cmd_run(args):
    methods = _methods(args.method)
    out = Path(args.out)
    X, X_train, X_test, name = prepare_data(args, methods[0].kind)
    if X_test is None:  # binary
        print(f"data: {name}: {X.shape[0]} rows x {X.shape[1]} columns, {X_train.nnz} ones")
    else:
        print(f"data: {name}: {X.shape[0]} users x {X.shape[1]} items, {X.nnz} ratings "
              f"({X_train.nnz} train / {X_test.nnz} test)")
    results, seen = [], set()
    for method in methods:
        estimator = make_estimator(method, args, verbose=0 if args.quiet else 1)
        results.append(fit_method(method, estimator, X_train, X_test, seen))
    print()
    print(format_table(results))
    out.mkdir(parents=True, exist_ok=True)
    setup = _setup(args, X, name, methods[0].kind)
    report = {"command": "run", "data": setup, "results": results}
    (out / "history.json").write_text(json.dumps(report, indent=1))
    print(f"\nwrote {out / 'history.json'}")
    png = plot_histories(results, out / "curves.png", _title(setup))
    if png is not None:
        print(f"wrote {png}")
    return 0


def _setup(args, X, name, kind):
    return {"name": name, "shape": list(X.shape), "nnz": int(X.nnz), "kind": kind,
            "seed": args.seed, "test_size": None if kind == "binary" else args.test_size,
            "clients": args.clients, "clients_per_round": args.clients_per_round,
            "rounds": args.rounds, "rank": args.rank}


def _title(setup):
    parts = [setup["name"].split(" (")[0]]
    if setup["test_size"]:
        held = round(100 * setup["test_size"])
        parts.append(f"{100 - held}/{held} hold-out")
    if setup["clients"]:
        parts.append(f"{setup['clients']} clients")
    if setup["clients_per_round"] and setup["kind"] == "completion":
        parts.append(f"{setup['clients_per_round']} per round")
    if setup["rank"]:
        parts.append(f"rank {setup['rank']}")
    return ", ".join(parts)


def format_table(results):
    """Plain-text table: one row per method with its final scores, time and traffic."""
    binary = results[0]["kind"] == "binary"
    scores = ("f1", "rmsd") if binary else ("train_rmse", "eval_rmse")
    heads = ("F1", "RMSD") if binary else ("train RMSE", "test RMSE")
    header = ["method", "rounds", *heads, "seconds", "MB up", "MB down"]
    rows = [header]
    for r in results:
        s = r["summary"]
        rows.append([r["label"], str(s["rounds"]),
                     *(f"{s[k]:.4f}" if k in s else "-" for k in scores),
                     f"{s['seconds']:.1f}", f"{s['bytes_uploaded'] / 1e6:.1f}",
                     f"{s['bytes_downloaded'] / 1e6:.1f}"])
    widths = [max(len(row[j]) for row in rows) for j in range(len(header))]
    lines = ["  ".join(c.ljust(w) if j == 0 else c.rjust(w)
                       for j, (c, w) in enumerate(zip(row, widths))) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def plot_histories(results, path, title):
    """Objective (log scale) and test RMSE (or F1) per round; returns the path or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        _note("matplotlib is not installed, so no figure was drawn (pip install "
              "'sklearn_fedmf[plot]'); the histories are in the JSON file")
        return None
    binary = results[0]["kind"] == "binary"
    right, right_label = ("f1", "F1 of the Boolean reconstruction") if binary else (
        "eval_rmse", "test RMSE (held-out ratings)")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for r in results:
        for ax, key in zip(axes, ("objective", right)):
            pts = [(h["round"], h[key]) for h in r["history"] if h.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), label=r["label"], lw=1.8)
    axes[0].set_yscale("log")
    axes[0].set_title("Relaxed objective (its weight lambda_t grows)" if binary
                      else "Training objective")
    same = len({r["objective"] for r in results}) == 1
    axes[0].set_ylabel("objective (log scale)" if same
                       else "objective, each method's own (log scale)")
    axes[1].set_title("F1 on the training data" if binary else "Test RMSE")
    axes[1].set_ylabel(right_label)
    for ax in axes:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("communication round")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small", framealpha=0.7)
    fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ---- tune -------------------------------------------------------------------------------------
def cmd_tune(args):
    from sklearn.model_selection import GridSearchCV, KFold

    methods = _methods(args.method)
    if len(methods) != 1:
        raise CommandError(f"--method {args.method}: tune takes one method at a time")
    method = methods[0]
    X, X_fit, y_fit, name = prepare_data(args, method.kind)
    grid = dict(args.grid) if args.grid else dict(method.grid)
    estimator = make_estimator(method, args, verbose=0)
    unknown = sorted(set(grid) - set(estimator.get_params()))
    if unknown:
        raise CommandError(f"--grid: {method.name} has no parameter {', '.join(unknown)}")
    fold_rows = X.shape[0] - -(-X.shape[0] // args.cv)
    if max(grid.get("n_clients", [0]) + [estimator.get_params().get("n_clients", 0)]) > fold_rows:
        raise CommandError(
            f"impossible sizes: a grid or --clients value of n_clients exceeds the {fold_rows} "
            f"users of a training fold ({args.cv}-fold CV over {X.shape[0]} users)"
        )
    cv = KFold(args.cv, shuffle=True, random_state=args.seed)
    common = dict(cv=cv, n_jobs=args.jobs, error_score="raise", refit=False)
    if args.halving:
        from sklearn.experimental import enable_halving_search_cv  # noqa: F401
        from sklearn.model_selection import HalvingGridSearchCV

        grid.pop("max_iter", None)
        search = HalvingGridSearchCV(estimator.set_params(n_jobs=None), grid,
                                     resource="max_iter", max_resources=args.rounds,
                                     factor=3, random_state=args.seed, **common)
    else:
        search = GridSearchCV(estimator.set_params(n_jobs=None), grid, **common)
    n_candidates = int(np.prod([len(v) for v in grid.values()]))
    print(f"data: {name}: {X.shape[0]} users x {X.shape[1]} items; tuning {method.label}: "
          f"{n_candidates} candidates x {args.cv} folds"
          + (" (successive halving on rounds)" if args.halving else ""), flush=True)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X_fit, y_fit)
    seconds = time.perf_counter() - tic
    table, ranked = format_search(search, method.kind, args.top)
    print(table)
    best = ranked[0]
    print(f"\nbest parameters ({seconds:.1f} s): "
          + ", ".join(f"{k}={v!r}" for k, v in sorted(best["params"].items()) if k != "max_iter")
          + (f", rounds={best['rounds']}" if "rounds" in best else ""))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": "tune", "method": method.name, "halving": args.halving,
              "data": {"name": name, "shape": list(X.shape), "nnz": int(X.nnz)},
              "cv": args.cv, "seconds": seconds, "grid": grid, "ranked": ranked}
    (out / "tune.json").write_text(json.dumps(_jsonable(report), indent=1))
    print(f"wrote {out / 'tune.json'}")
    return 0


def format_search(search, kind, top):
    """The ranked table of a fitted search and its rows (halving: longest runs first)."""
    res = search.cv_results_
    scores = res["mean_test_score"]
    # Halving ranks candidates that survived to more rounds first (scores at fewer rounds are
    # not comparable); a plain grid has one level.
    level = res.get("n_resources", np.zeros(len(scores), dtype=int))
    idx = np.lexsort((-scores, -level))
    sign = 1.0 if kind == "binary" else -1.0
    ranked = [{"rank": i + 1, "score": sign * float(scores[j]),
               "std": float(res["std_test_score"][j]),
               "fit_seconds": float(res["mean_fit_time"][j]), "params": res["params"][j],
               **({"rounds": int(level[j])} if "n_resources" in res else {})}
              for i, j in enumerate(idx)]
    keys = sorted(search.param_grid)
    halving = "n_resources" in res
    rows = [["rank", "F1" if kind == "binary" else "CV RMSE", "std", "fit s",
             *(["rounds"] if halving else []), *keys]]
    for r in ranked[:top]:
        values = [f"{v:g}" if isinstance(v, float) else str(v)
                  for v in (r["params"][k] for k in keys)]
        rows.append([str(r["rank"]), f"{r['score']:.4f}", f"{r['std']:.4f}",
                     f"{r['fit_seconds']:.1f}", *([str(r["rounds"])] if halving else []),
                     *values])
    widths = [max(len(row[j]) for row in rows) for j in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    if len(ranked) > top:
        lines.append(f"... {len(ranked) - top} more in tune.json")
    return "\n".join(lines), ranked


# ---- methods ----------------------------------------------------------------------------------
def cmd_methods(args):
    available = available_methods()
    print(f"{'name':<12} {'estimator':<32} {'kind':<11} a client uploads")
    for m in METHODS.values():
        if m.name in available:
            fixed = ", ".join(f"{k}={v!r}" for k, v in m.fixed.items())
            est = m.target.replace(":", ".") + (f"({fixed})" if fixed else "")
            print(f"{m.name:<12} {est:<32} {m.kind:<11} {m.sends}")
    return 0


# ---- argument parsing -------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        print(f"{self.prog}: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _count_or_fraction(text):
    try:
        value = float(text) if "." in text else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or a fraction, got {text!r}") from None
    if value <= 0 or (isinstance(value, float) and value > 1):
        raise argparse.ArgumentTypeError(f"expected a count >= 1 or a fraction in (0, 1], "
                                         f"got {text!r}")
    return value


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _assignment(text):
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key.strip(), _literal(value.strip())


def _grid_entry(text):
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=V1,V2,..., got {text!r}")
    return key.strip(), [_literal(v.strip()) for v in values.split(",")]


class _Explicit(argparse.Action):
    """Store the value and remember that the user gave the option."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.explicit = {*getattr(namespace, "explicit", set()), self.dest}


def _common(parser, *, rounds):
    p = PROTOCOL
    data = parser.add_argument_group("data")
    data.add_argument("--data", default="embedded", metavar="SPEC",
                      help="'embedded' (MovieLens latest-small shipped with the package, the "
                           "default), a MovieLens ratings file or folder (u.data, ratings.dat "
                           "or ratings.csv; 100K, 1M, 10M, 20M, 25M, latest), "
                           "'movielens:VARIANT' (fetch_movielens: download once, then cached), "
                           "'synthetic:USERSxITEMSxRATINGS' (make_ratings, e.g. "
                           "synthetic:2000x500x50k) or, for binary methods, "
                           "'tiles:ROWSxCOLSxTILES' (make_binary_tiles). Binary methods "
                           "binarize ratings at >= 3.5")
    data.add_argument("--test-size", type=float, default=p["test_size"], metavar="FRACTION",
                      help="held-out fraction of each user's ratings (default: %(default)s)")
    fed = parser.add_argument_group("federation")
    fed.add_argument("--clients", type=_positive_int, default=p["clients"], action=_Explicit,
                     help="number of clients the users are split into (default: %(default)s)")
    fed.add_argument("--clients-per-round", type=_count_or_fraction, action=_Explicit,
                     default=p["clients_per_round"], metavar="M",
                     help="clients sampled each round: a count, or a fraction like 0.1 "
                          "(default: %(default)s)")
    fed.add_argument("--rounds", type=_positive_int, default=rounds, action=_Explicit,
                     help="communication rounds (default: %(default)s)")
    fed.add_argument("--rank", type=_positive_int, default=p["rank"], action=_Explicit,
                     help="rank / number of components (default: %(default)s)")
    fed.add_argument("--jobs", type=int, default=1, action=_Explicit,
                     help="parallel workers (joblib n_jobs; -1 = all cores; default: 1, "
                          "fastest on the small embedded data)")
    fed.add_argument("--seed", type=int, default=p["seed"],
                     help="seed of the split, the partition and every round (default: "
                          "%(default)s)")
    out = parser.add_argument_group("output")
    out.add_argument("--out", default="fedmf-out", metavar="DIR",
                     help="folder for the figure and JSON files (default: %(default)s)")
    parser.set_defaults(explicit=set())


def build_parser():
    """The argument parser of the ``fedmf`` command."""
    names = ", ".join(METHODS)
    parser = _Parser(
        prog="fedmf",
        description="Federated matrix factorization from the command line. With no command, "
                    "runs the main job: FedMC-ADMM and FedMAvg side by side on the embedded "
                    "MovieLens latest-small under the papers' protocol (80/20 hold-out, 100 "
                    "clients, 10 per round, 100 rounds, rank 5), i.e. 'fedmf run' with its "
                    "defaults. Options given without a command go to 'run'.",
        epilog="Run 'fedmf COMMAND --help' for the options of a command. Errors print one line "
               "and exit with status 1 (2 for bad options); set FEDMF_DEBUG=1 for tracebacks.",
    )
    from . import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="'run' when omitted")

    run = sub.add_parser(
        "run", help="fit one or more methods, print a table, write curves.png and history.json",
        description="Fit each method on the training ratings with the held-out ratings as "
                    "eval_set, print final train/test RMSE (F1 and RMSD for binary methods, "
                    "which use the data binarized at rating >= 3.5 and no hold-out), seconds "
                    "and megabytes uploaded/downloaded, and write curves.png (objective and "
                    "test RMSE per round) and history.json (every round's record) to --out.")
    run.add_argument("--method", default=",".join(MAIN_JOB), metavar="NAMES",
                     help=f"comma-separated methods among {names} (default: %(default)s; "
                          "'fedmf methods' lists those installed)")
    run.add_argument("--set", type=_assignment, action="append", metavar="NAME=VALUE",
                     help="any other estimator parameter, e.g. --set beta=0.5 (repeatable; "
                          "applies to every method that has it)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    _common(run, rounds=PROTOCOL["rounds"])
    run.set_defaults(func=cmd_run)

    tune = sub.add_parser(
        "tune", help="grid search (GridSearchCV or HalvingGridSearchCV) of one method",
        description="Cross-validate a grid of parameters. Users are split into --cv folds "
                    "(KFold); each candidate is fit on the training ratings of the other folds' "
                    "users and scored on the held-out ratings of the fold's users by fold-in "
                    "(X = training matrix, y = held-out matrix; binary methods: F1 on the "
                    "fold's rows). Default grids: the papers' lambda (alpha_u), beta, N "
                    "(local_iter), p (n_clients) and rank (n_components).")
    tune.add_argument("--method", default="fedmc-admm", metavar="NAME",
                      help=f"one of {names} (default: %(default)s)")
    tune.add_argument("--grid", type=_grid_entry, action="append", metavar="NAME=V1,V2",
                      help="a parameter and its values (repeatable); replaces the method's "
                           "default grid")
    tune.add_argument("--cv", type=_positive_int, default=3, help="folds (default: %(default)s)")
    tune.add_argument("--halving", action="store_true",
                      help="HalvingGridSearchCV with the rounds (max_iter) as the resource, up "
                           "to --rounds")
    tune.add_argument("--top", type=_positive_int, default=15,
                      help="rows of the ranked table to print (default: %(default)s)")
    _common(tune, rounds=50)
    tune.set_defaults(func=cmd_tune)

    methods = sub.add_parser("methods", help="list the installed methods",
                             description="List the methods of this installation.")
    methods.set_defaults(func=cmd_methods)
    return parser


def main(argv=None):
    """Entry point of ``fedmf`` and ``python -m sklearn_fedmf``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("\nfedmf: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line, no traceback (FEDMF_DEBUG=1 shows it)
        if os.environ.get("FEDMF_DEBUG"):
            raise
        print(f"fedmf: error: {_one_line(exc)}", file=sys.stderr)
        return 1


# ---- helpers ----------------------------------------------------------------------------------
def _one_line(exc):
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (CommandError, ValueError, OSError)):
        return text
    return f"{type(exc).__name__}: {text}"


def _note(message):
    print(f"fedmf: note: {message}", file=sys.stderr)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.integer, np.bool_)):
        return obj.item()
    if isinstance(obj, np.floating):
        return float(obj)
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    return repr(obj)
