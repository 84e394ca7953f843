"""The subcommands of ``fedmf``: ``run`` (fit, time and summarize methods), ``tune`` (grid
search of one method) and ``methods`` (list the registry); ``recommend`` is in ``_ratings``."""

from __future__ import annotations

import inspect
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np

from ..exceptions import DegenerateFitWarning
from ._data import prepare_data
from ._messages import CommandError, _note
from ._progress import with_progress
from ._registry import (
    _OPTION_PARAMS,
    METHODS,
    _flag,
    _methods,
    available_methods,
    check_value,
    make_estimator,
)
from ._report import format_search, format_table, plot_histories


def fit_method(method, estimator, X_train, X_test=None, seen=None):
    """Fit, time, and summarize one estimator.

    Each distinct warning becomes one ``note`` line (once per command: ``seen`` holds those
    already printed) and is kept in the result; a :class:`DegenerateFitWarning` also marks
    the result ``degenerate`` (flagged in the table).
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
    degenerate = [str(w.message).splitlines()[0] for w in caught
                  if issubclass(w.category, DegenerateFitWarning)]
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
        "degenerate": bool(degenerate),
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
            "summary": summary, "warnings": messages, "degenerate": degenerate[:1],
            "history": history}


def _objective_id(method, estimator):
    """Which objective ``history_`` records: shared only while the variant is unchanged."""
    params = estimator.get_params()
    unchanged = all(params.get(k) == v for k, v in method.fixed.items())
    return method.objective if method.objective and unchanged else method.name


def _output_folder(text, files):
    """The ``--out`` folder, created now, so that a bad path fails before any fit."""
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        raise CommandError(f"--out {text}: exists and is not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"--out {text}: cannot create the folder ({exc.strerror})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CommandError(f"--out {text}: the folder is not writable")
    for name in files:
        if (out / name).is_dir():
            raise CommandError(f"--out {text}: {out / name} is a folder, not a file")
    return out


def cmd_run(args):
    methods = _methods(args.method)
    out = _output_folder(args.out, ("history.json", "curves.png"))
    for method in methods:  # option errors before the data is loaded
        make_estimator(method, args)
    X, X_train, X_test, name = prepare_data(args, methods[0].kind)  # may adapt the options
    estimators = [make_estimator(m, args, verbose=0 if args.quiet else 1) for m in methods]
    if X_test is None:  # binary
        print(f"data: {name}: {X.shape[0]} rows x {X.shape[1]} columns, {X_train.nnz} ones")
    else:
        print(f"data: {name}: {X.shape[0]} users x {X.shape[1]} items, {X.nnz} ratings "
              f"({X_train.nnz} train / {X_test.nnz} test)")
    results, seen = [], set()
    for method, estimator in zip(methods, estimators):
        results.append(fit_method(method, estimator, X_train, X_test, seen))
    print()
    print(format_table(results))
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


def tune_grid(method, args):
    """The grid of ``fedmf tune`` as a list of sub-grids: ``--grid`` (one sub-grid) or the
    method's default grid (two sub-grids when it searches ``regularization``: each
    regularization with its strengths on its own scale).

    An option the user gave (``--clients``, ``--rank``, ``--rounds``, ...) fixes its
    parameter: it leaves the default grid, and is an error together with a ``--grid`` of the
    same parameter. Every value is checked against the estimator's constraints.
    """
    if args.grid:
        grids = [dict(args.grid)]
    else:
        grids = [dict(g) for g in (method.grid if isinstance(method.grid, list)
                                   else [method.grid])]
    for option, param in _OPTION_PARAMS.items():
        if option not in args.explicit or not any(param in g for g in grids):
            continue
        if args.grid:
            raise CommandError(f"{_flag(option)} and --grid {param}=... both set {param}; "
                               "give one of them")
        for g in grids:
            g.pop(param, None)
    if args.halving and any("max_iter" in g for g in grids):
        raise CommandError("--grid max_iter=...: with --halving the rounds are the resource "
                           "(up to --rounds); leave max_iter out of the grid")
    for g in grids:
        for param, values in g.items():
            for value in values:
                check_value(method, param, value, f"--grid {param}={value!r}")
    return grids


def grid_size(grids):
    """The number of candidates of a list of sub-grids."""
    return sum(int(np.prod([len(v) for v in g.values()])) for g in grids)


def grid_values(grids, param, default):
    """Every value of ``param`` over the sub-grids (``[default]`` where a sub-grid lacks it)."""
    return [v for g in grids for v in g.get(param, [default])]


def cmd_tune(args):
    from sklearn.model_selection import GridSearchCV, KFold

    methods = _methods(args.method)
    if len(methods) != 1:
        raise CommandError(f"--method {args.method}: tune takes one method at a time")
    method = methods[0]
    out = _output_folder(args.out, ("tune.json",))
    # option and grid errors before the data is loaded
    unknown = sorted(set(dict(args.grid or ())) - set(make_estimator(method, args).get_params()))
    if unknown:
        raise CommandError(f"--grid: {method.name} has no parameter {', '.join(unknown)}")
    grid = tune_grid(method, args)
    if method.kind == "completion" and args.split == "ratings":
        from ._ratings import tune_entrywise

        return tune_entrywise(args, method, grid, make_estimator(method, args, verbose=0))
    X, X_fit, y_fit, name = prepare_data(args, method.kind)  # may adapt the options
    estimator = make_estimator(method, args, verbose=0)
    fold_rows = X.shape[0] - -(-X.shape[0] // args.cv)
    own_clients = estimator.get_params().get("n_clients", 0)
    if max(grid_values(grid, "n_clients", 0) + [own_clients]) > fold_rows:
        raise CommandError(
            f"impossible sizes: a grid or --clients value of n_clients exceeds the {fold_rows} "
            f"users of a training fold ({args.cv}-fold CV over {X.shape[0]} users)"
        )
    cpr = estimator.get_params().get("clients_per_round")
    fewest = min(grid_values(grid, "n_clients", cpr)) if isinstance(cpr, int) else None
    if fewest is not None and fewest < cpr:
        raise CommandError(f"impossible sizes: --grid n_clients={fewest} is "
                           f"less than --clients-per-round {cpr}")
    cv = KFold(args.cv, shuffle=True, random_state=args.seed)
    common = dict(cv=cv, n_jobs=args.jobs, error_score="raise", refit=False)
    progress = dict(binary=method.kind == "binary", quiet=args.quiet)
    if args.halving:
        from sklearn.experimental import enable_halving_search_cv  # noqa: F401
        from sklearn.model_selection import HalvingGridSearchCV

        search = with_progress(HalvingGridSearchCV, **progress)(
            estimator.set_params(n_jobs=None), grid, resource="max_iter",
            max_resources=args.rounds, factor=3, random_state=args.seed, **common)
    else:
        search = with_progress(GridSearchCV, **progress)(
            estimator.set_params(n_jobs=None), grid, **common)
    n_candidates = grid_size(grid)
    params = estimator.get_params()
    fixed = {param: params[param] for option, param in _OPTION_PARAMS.items()
             if option in args.explicit and param in params
             and not any(param in g for g in grid)
             and option != "jobs" and not (args.halving and param == "max_iter")}
    print(f"data: {name}: {X.shape[0]} users x {X.shape[1]} items; tuning {method.label}: "
          f"{n_candidates} candidates x {args.cv} folds"
          + (" (successive halving on rounds)" if args.halving else "")
          + "".join(f"; {k}={v!r}" for k, v in fixed.items()), flush=True)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X_fit, y_fit)
    seconds = time.perf_counter() - tic
    data = {"name": name, "shape": list(X.shape), "nnz": int(X.nnz)}
    return report_search(args, method, search, seconds, grid, data, out, estimator=params)


def report_search(args, method, search, seconds, grid, data, out, **extra):
    """Print the ranked table and the best parameters of a search; write ``tune.json``."""
    table, ranked = format_search(search, method.kind, args.top)
    print(table)
    best = ranked[0]
    shown = [f"{k}={v!r}" for k, v in sorted(best["params"].items())
             if not (args.halving and k == "max_iter")]
    if "rounds" in best:
        shown.append(f"rounds={best['rounds']}")
    print(f"\nbest parameters ({seconds:.1f} s): "
          + (", ".join(shown) or "the only candidate (no parameter varied)"))
    report = {"command": "tune", "method": method.name, "halving": args.halving, **extra,
              "data": data, "cv": args.cv, "seconds": seconds, "grid": grid, "ranked": ranked}
    (out / "tune.json").write_text(json.dumps(_jsonable(report), indent=1))
    print(f"wrote {out / 'tune.json'}")
    return 0


def cmd_methods(args):
    """Print the registry as an aligned table; a variant's fixed parameters go on the line
    below its row, so that long ones do not widen every row."""
    available = available_methods()
    rows = [("name", "kind", "estimator", "a client uploads", "")]
    for m in METHODS.values():
        if m.name in available:
            fixed = ", ".join(f"{k}={v!r}" for k, v in m.fixed.items())
            rows.append((m.name, m.kind, m.target.replace(":", "."), m.sends, fixed))
    widths = [max(len(row[j]) for row in rows) for j in range(3)]
    indent = sum(widths[:2]) + 4
    for *cells, fixed in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(cells, widths)), cells[3]]))
        if fixed:
            print(" " * indent + f"with {fixed}")
    return 0


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
