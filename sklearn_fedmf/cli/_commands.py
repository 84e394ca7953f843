"""``fedmf run`` (fit, time and summarize methods beside two yardsticks) and ``fedmf
methods`` (list the registry); ``tune`` is in ``_tune``, ``recommend`` in ``_recommend``."""

from __future__ import annotations

import inspect
import json
import time
import warnings
from types import SimpleNamespace

import numpy as np

from ._data import prepare_data
from ._messages import CommandError, _note
from ._registry import METHODS, _methods, make_estimator, settable
from ._report import format_table, jsonable, output_folder, plot_histories
from ._warm_up import warm_up

# The yardsticks of a rating run (what a method must beat to be worth its rounds): the
# global mean and this federated biases-only model.
BASELINE = METHODS["baseline"]
_SETTINGS = {"both": ("papers", "defaults"), "papers": ("papers",), "defaults": ("defaults",)}


def fit_method(method, estimator, X_train, X_test=None, seen=None, *, label=None,
               settings=""):
    """Fit, time, and summarize one estimator.

    Each distinct warning becomes one ``note`` line (once per command: ``seen`` holds those
    already printed) and is kept in the result; a :class:`DegenerateFitWarning` also marks
    the result ``degenerate`` (flagged in the table).
    """
    from ..exceptions import DegenerateFitWarning

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
    history = [jsonable(r) for r in getattr(estimator, "history_", [])]
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
    if method.kind == "completion" and getattr(estimator, "factors_used_", True) is False:
        # the floor kept the biases alone: the history is the dropped factor part's, so the
        # scores are the kept model's (rows folded in on their training ratings)
        summary["train_rmse"] = -float(estimator.score(X_train, X_train))
        if X_test is not None:
            summary["eval_rmse"] = -float(estimator.score(X_train, X_test))
    if method.kind == "completion" and "eval_rmse" not in summary and X_test is not None:
        summary["eval_rmse"] = -float(estimator.score(X_train, X_test))
    return {"method": method.name, "label": label or method.label, "kind": method.kind,
            "settings": settings, "objective": _objective_id(method, estimator),
            "estimator": type(estimator).__name__, "params": jsonable(estimator.get_params()),
            "summary": summary, "warnings": messages, "degenerate": degenerate[:1],
            "history": history}


def member_results(method, estimator):
    """One row per member of a fitted :class:`~sklearn_fedmf.FedBlend` (none for another
    estimator): its rounds, seconds and bytes within the blend's fit and its test RMSE, with
    its weight in the label."""
    if not hasattr(estimator, "named_estimators_"):
        return []
    rows = []
    test = getattr(estimator, "member_eval_rmse_", {})
    for (name, member), weight in zip(estimator.named_estimators_.items(),
                                      estimator.weights_):
        records = [r for r in estimator.history_ if r.get("member") == name]
        summary = {"rounds": len(records),
                   "seconds": float(sum(r.get("seconds", 0.0) for r in records)),
                   "bytes_uploaded": int(sum(r.get("bytes_uploaded", 0) for r in records)),
                   "bytes_downloaded": int(sum(r.get("bytes_downloaded", 0) for r in records)),
                   "degenerate": False}
        if name in test:
            summary["eval_rmse"] = float(test[name])
        rows.append({"method": method.name, "label": f"  {name} (weight {weight:+.2f})",
                     "kind": method.kind, "settings": "member", "objective": method.name,
                     "estimator": type(member).__name__, "params": {}, "summary": summary,
                     "warnings": [], "degenerate": [], "history": []})
    return rows


def _objective_id(method, estimator):
    """Which objective ``history_`` records: shared only while the papers' settings hold."""
    params = estimator.get_params()
    unchanged = all(params.get(k) == v for k, v in method.papers.items())
    return method.objective if method.objective and unchanged else method.name


def global_mean(X_train, X_test, n_clients):
    """The first yardstick: the training mean predicts every rating (one aggregate round:
    each client uploads its sum and count, the server sends the mean back)."""
    tic = time.perf_counter()
    mean = float(X_train.data.mean())
    summary = {
        "rounds": 1,
        "train_rmse": float(np.sqrt(np.mean((X_train.data - mean) ** 2))),
        "eval_rmse": float(np.sqrt(np.mean((X_test.data - mean) ** 2))),
        "seconds": time.perf_counter() - tic,
        "bytes_uploaded": 16 * n_clients, "bytes_downloaded": 8 * n_clients,
        "degenerate": False,
    }
    return {"method": "mean", "label": "global mean", "kind": "completion", "settings": "mean",
            "objective": "mean", "estimator": None, "params": {"mean": mean},
            "summary": summary, "warnings": [], "degenerate": [], "history": []}


def _baseline_estimator(args, verbose):
    """The second yardstick, :class:`FedBaseline`, with the run's clients, rounds and seed."""
    from ._registry import _OPTION_PARAMS

    cls = BASELINE.load()
    params = cls().get_params()
    chosen = {param: getattr(args, option) for option, param in _OPTION_PARAMS.items()
              if param in params and getattr(args, option, None) is not None}
    if "verbose" in params:
        chosen["verbose"] = verbose
    return cls(**chosen)


def _rows(methods, settings):
    """``(method, settings, label)`` of each row: a method with papers' settings gets a row
    for each requested setting; the others (binary methods, the biases-only model) one."""
    rows = []
    for method in methods:
        if method.papers == method.variant:  # no papers' settings to compare
            rows.append((method, "baseline" if method is BASELINE else "", method.label))
            continue
        rows += [(method, s, f"{method.label} ({s})") for s in _SETTINGS[settings]]
    return rows


def cmd_run(args):
    methods = _methods(args.method)
    if getattr(args, "task", "ratings") == "topn":
        return run_topn(args, methods)
    out = output_folder(args.out, ("history.json", "curves.png"))
    rows = _rows(methods, args.settings)
    for key, _ in args.set or []:  # --set applies to each method that has the parameter
        if not any(settable(m, key) for m in methods):
            raise CommandError(f"--set {key}=...: no method of the run ({args.method}) has a "
                               f"parameter {key!r}")
    for method, settings, _ in rows:  # option errors before the data is loaded
        make_estimator(method, args, settings=settings, strict_set=False)
    X, X_train, X_test, name = prepare_data(args, methods[0].kind)  # may adapt the options
    verbose = 0 if args.quiet else 1
    fits = [(method, make_estimator(method, args, verbose=verbose, settings=settings,
                                    strict_set=False), settings, label)
            for method, settings, label in rows]
    yardsticks = X_test is not None and args.baselines
    if yardsticks and BASELINE not in methods:
        fits.insert(0, (BASELINE, _baseline_estimator(args, verbose), "baseline",
                        BASELINE.label))
    if X_test is None:  # binary
        print(f"data: {name}: {X.shape[0]} rows x {X.shape[1]} columns, {X_train.nnz} ones")
    else:
        print(f"data: {name}: {X.shape[0]} users x {X.shape[1]} items, {X.nnz} ratings "
              f"({X_train.nnz} train / {X_test.nnz} test)")
    for _, estimator, _, _ in fits:
        warm_up(estimator, X_train, eval_set=X_test)
    results = [global_mean(X_train, X_test, args.clients)] if yardsticks else []
    seen = set()
    for method, estimator, settings, label in fits:
        results.append(fit_method(method, estimator, X_train, X_test, seen, label=label,
                                  settings=settings))
        results += member_results(method, estimator)
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


def run_topn(args, methods):
    """``fedmf run --task topn``: the leave-one-out protocol of the ranking papers. Each
    rating method through ``RatingRegressor``, with ``loss="implicit"`` (its defaults, the
    options typed and ``--seed``) and on ratings (``--settings``), beside the most popular
    items; HR and NDCG at 10 and 20 of full rankings, fit seconds (after an untimed one-round
    fit, so compilation excluded) and megabytes moved per round."""
    from .._rating_regressor import RatingRegressor
    from ..metrics import hit_rate_at_k, ndcg_at_k
    from ._data import _check_sizes, load_pairs
    from ._recommend import _hold_out, _most_popular
    from ._registry import RATING_METHODS, typed_only

    methods = [m for m in methods if m.name in RATING_METHODS]
    if not methods:
        raise CommandError(f"--task topn: --method {args.method} has no rating method; take "
                           f"one or more of {', '.join(RATING_METHODS)}")
    out = output_folder(args.out, ("topn.json",))
    X, y, name = load_pairs(args)
    n_users, n_items = X.iloc[:, 0].nunique(), X.iloc[:, 1].nunique()
    _check_sizes(SimpleNamespace(shape=(n_users, n_items)), args)  # may adapt the options
    X_train, y_train, X_test = _hold_out(X, y, args.seed)
    users, truth = X_test.iloc[:, 0].to_numpy(), X_test.iloc[:, 1].to_numpy()
    print(f"data: {name}: {len(y)} ratings, one of each of {len(users)} users held out "
          f"(seed {args.seed}); full ranking of each user's unrated items")
    ks = (10, 20)
    verbose = 0 if args.quiet else 1
    rows = [("most popular", _most_popular(X_train, users, max(ks)), None, None)]
    for method in methods:
        fits = [("implicit", make_estimator(method, typed_only(args), verbose=verbose,
                                            settings="defaults", strict_set=False
                                            ).set_params(loss="implicit"))]
        fits += [(f"ratings, {s}", make_estimator(method, args, verbose=verbose, settings=s,
                                                  strict_set=False))
                 for s in _SETTINGS[args.settings]]
        for label, estimator in fits:
            model = RatingRegressor(estimator)
            warm_up(model, X_train, y_train)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                tic = time.perf_counter()
                model.fit(X_train, y_train)
                seconds = time.perf_counter() - tic
            for message in dict.fromkeys(str(w.message).splitlines()[0] for w in caught):
                _note(message)
            lists, _ = model.recommend(users, n=max(ks))
            history = model.estimator_.history_
            moved = np.mean([r["bytes_uploaded"] + r["bytes_downloaded"] for r in history])
            rows.append((f"{method.label} ({label})", lists, seconds, moved / 1e6))
    header = ["model", *(f"{m}@{k}" for k in ks for m in ("HR", "NDCG")), "fit s", "MB/round"]
    width = max(len(r[0]) for r in rows) + 2
    print("\n" + header[0].ljust(width) + "".join(h.rjust(10) for h in header[1:]))
    results = []
    for label, lists, seconds, mb in rows:
        values = [f(truth, lists, k=k) for k in ks for f in (hit_rate_at_k, ndcg_at_k)]
        cells = [f"{v:10.3f}" for v in values] + [
            "-".rjust(10) if seconds is None else f"{seconds:10.1f}",
            "-".rjust(10) if mb is None else f"{mb:10.2f}"]
        print(label.ljust(width) + "".join(cells))
        results.append({"model": label, **dict(zip(header[1:5], values)),
                        "seconds": seconds, "mb_per_round": mb})
    (out / "topn.json").write_text(json.dumps(jsonable(
        {"command": "run", "task": "topn", "data": name, "results": results}), indent=1))
    print(f"\nwrote {out / 'topn.json'}")
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


def cmd_methods(args):
    """Print the registry as an aligned table; a variant's fixed parameters go on the line
    below its row, so that long ones do not widen every row."""
    rows = [("name", "kind", "estimator", "a client uploads", "")]
    for m in METHODS.values():
        fixed = ", ".join(f"{k}={v!r}" for k, v in m.fixed.items())
        rows.append((m.name, m.kind, m.target.replace(":", "."), m.sends, fixed))
    widths = [max(len(row[j]) for row in rows) for j in range(3)]
    indent = sum(widths[:2]) + 4
    for *cells, fixed in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(cells, widths)), cells[3]]))
        if fixed:
            print(" " * indent + f"with {fixed}")
    return 0
