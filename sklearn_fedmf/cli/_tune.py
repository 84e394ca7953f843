"""``fedmf tune``: a (halving) grid search of one method, entry-wise folds of the ratings
(through :class:`~sklearn_fedmf.RatingRegressor`) or folds of the users (fold-in), with the
number of fits and an estimate of its time printed before it starts."""

from __future__ import annotations

import itertools
import json
import math
import time
import warnings
from types import SimpleNamespace

import numpy as np

from ._data import _check_sizes, load_pairs, prepare_data
from ._messages import CommandError
from ._progress import with_progress
from ._registry import _OPTION_PARAMS, _flag, check_value, make_estimator, one_method
from ._report import format_search, jsonable, output_folder

PREFIX = "estimator__"  # RatingRegressor's parameters of the wrapped estimator
HALVING_FACTOR = 3


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
    return [_whole_solver_params(method, g) for g in grids]


def _whole_solver_params(method, grid):
    """``grid`` with its keys of the estimator's ``solver_params`` (``--grid p=0.5,0.8``)
    turned into whole ``solver_params`` dicts over the method's fixed ones: a search sets
    parameters, and one key of a dict is not a parameter."""
    cls = method.load()
    own = cls().get_params()
    keys = [k for k in grid if k in cls._solver_params and k not in own]
    if not keys:
        return grid
    grid = dict(grid)
    fixed = method.fixed.get("solver_params") or {}
    combos = list(itertools.product(*(grid.pop(k) for k in keys)))
    grid["solver_params"] = [{**base, **dict(zip(keys, combo))}
                             for base in grid.get("solver_params", [fixed]) for combo in combos]
    return grid


def with_defaults(grids, params):
    """The defaults of a search and the grid that holds them as a candidate.

    The defaults are the values the estimator of the command (``params``: the method's
    settings and the options) gives every parameter the grid varies, i.e. the model
    ``fedmf run`` fits with the same options. When no candidate of ``grids`` is the
    defaults, they become one more sub-grid of one candidate, so the search always scores
    them (a new list; ``grids`` is returned itself when it holds them).
    """
    from sklearn.model_selection import ParameterGrid

    defaults = {k: params[k] for g in grids for k in g}
    if any(is_defaults(c, defaults) for c in ParameterGrid(grids)):
        return defaults, grids
    return defaults, [*grids, {k: [v] for k, v in defaults.items()}]


def is_defaults(candidate, defaults):
    """Whether a candidate sets every parameter it names to its default (the others keep
    the estimator's value, which is the default)."""
    return all(k not in defaults or bool(v == defaults[k]) for k, v in candidate.items())


def grid_size(grids):
    """The number of candidates of a list of sub-grids."""
    return sum(int(np.prod([len(v) for v in g.values()])) for g in grids)


def grid_values(grids, param, default):
    """Every value of ``param`` over the sub-grids (``[default]`` where a sub-grid lacks it)."""
    return [v for g in grids for v in g.get(param, [default])]


def halving_schedule(n_candidates, max_rounds, factor=HALVING_FACTOR):
    """``[(candidates, rounds), ...]`` per iteration of ``HalvingGridSearchCV`` with
    ``resource="max_iter"``, ``min_resources="exhaust"`` (its default) and ``factor``: the
    same arithmetic as scikit-learn's ``_run_search``, to count the fits before they run."""
    n_required = 1 + math.floor(math.log(n_candidates, factor))
    min_rounds = max(1, max_rounds // factor ** (n_required - 1))
    n_possible = 1 + math.floor(math.log(max_rounds // min_rounds, factor))
    schedule = []
    for itr in range(min(n_possible, n_required)):
        schedule.append((n_candidates, min(factor**itr * min_rounds, max_rounds)))
        n_candidates = math.ceil(n_candidates / factor)
    return schedule


def cmd_tune(args):
    method = one_method(args.method, "tune")
    out = output_folder(args.out, ("tune.json",))
    # option and grid errors before the data is loaded
    unknown = sorted(set(dict(args.grid or ())) - set(make_estimator(method, args).get_params()))
    if unknown:
        raise CommandError(f"--grid: {method.name} has no parameter {', '.join(unknown)}")
    grid = tune_grid(method, args)
    entrywise = method.kind == "completion" and args.split == "ratings"
    if entrywise:
        X_fit, y_fit, name = load_pairs(args)
        shape = (X_fit.iloc[:, 0].nunique(), X_fit.iloc[:, 1].nunique())
        # a fold's fit sees only the users with a rating outside the fold
        users = X_fit.iloc[:, 0].to_numpy()
        fewest = min(len(np.unique(users[train])) for train, _ in _folds(args).split(users))
        _check_sizes(SimpleNamespace(shape=(fewest, shape[1])), args,  # may adapt the options
                     users="users of the smallest training fold" if fewest < shape[0]
                     else "users of the data")
        described = f"{shape[0]} users x {shape[1]} items, {len(y_fit)} ratings"
    else:
        X, X_fit, y_fit, name = prepare_data(args, method.kind)  # may adapt the options
        shape, described = X.shape, f"{X.shape[0]} users x {X.shape[1]} items"
    estimator = make_estimator(method, args, verbose=0).set_params(n_jobs=None)
    params = estimator.get_params()
    defaults, searched_grid = with_defaults(grid, params)
    if entrywise:
        from .._rating_regressor import RatingRegressor

        searched, prefix = RatingRegressor(estimator), PREFIX
    else:
        _check_user_folds(args, grid, estimator, shape[0])
        searched, prefix = estimator, ""
    search = _search(args, method, searched, searched_grid, prefix)
    n_candidates = grid_size(searched_grid)
    # the federation every candidate shares, typed or not (the same command, typed or not,
    # prints the same)
    fixed = {param: params[param] for option, param in _OPTION_PARAMS.items()
             if param in params
             and not any(param in g for g in grid)
             and option != "jobs" and not (args.halving and param == "max_iter")}
    folds = "folds of the ratings (entry-wise)" if entrywise else "folds of the users"
    print(f"data: {name}: {described}; tuning {method.label}: {n_candidates} candidates x "
          f"{args.cv} {folds}" + (" (successive halving on rounds)" if args.halving else "")
          + "".join(f"; {k}={v!r}" for k, v in fixed.items()), flush=True)
    print(_plan(args, search, searched_grid, prefix, X_fit, y_fit, params,
                added_defaults=searched_grid is not grid), flush=True)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X_fit, y_fit)
    seconds = time.perf_counter() - tic
    results = dict(search.cv_results_)
    results["params"] = [{k[len(prefix):]: v for k, v in p.items()} for p in results["params"]]
    data = {"name": name, "shape": list(shape), "nnz": int(len(y_fit)) if entrywise
            else int(X_fit.nnz)}
    extra = {"split": "ratings"} if entrywise else {}
    return report_search(args, method, SimpleNamespace(cv_results_=results), seconds, grid,
                         data, out, **extra, estimator=params, defaults=defaults,
                         added_defaults=searched_grid is not grid)


def _check_user_folds(args, grid, estimator, n_users):
    fold_rows = n_users - -(-n_users // args.cv)
    own_clients = estimator.get_params().get("n_clients", 0)
    if max(grid_values(grid, "n_clients", 0) + [own_clients]) > fold_rows:
        raise CommandError(
            f"impossible sizes: a grid or --clients value of n_clients exceeds the {fold_rows} "
            f"users of a training fold ({args.cv}-fold CV over {n_users} users)"
        )
    cpr = estimator.get_params().get("clients_per_round")
    fewest = min(grid_values(grid, "n_clients", cpr)) if isinstance(cpr, int) else None
    if fewest is not None and fewest < cpr:
        raise CommandError(f"impossible sizes: --grid n_clients={fewest} is "
                           f"less than --clients-per-round {cpr}")


def _folds(args):
    from sklearn.model_selection import KFold

    return KFold(args.cv, shuffle=True, random_state=args.seed)


def _search(args, method, estimator, grid, prefix):
    from sklearn.model_selection import GridSearchCV

    prefixed = [{prefix + k: v for k, v in g.items()} for g in grid]
    common = dict(cv=_folds(args), n_jobs=args.jobs, error_score="raise", refit=False)
    if prefix:
        common["scoring"] = "neg_root_mean_squared_error"
    progress = dict(binary=method.kind == "binary", quiet=args.quiet, prefix=prefix)
    if args.halving:
        from sklearn.experimental import enable_halving_search_cv  # noqa: F401
        from sklearn.model_selection import HalvingGridSearchCV

        return with_progress(HalvingGridSearchCV, **progress)(
            estimator, prefixed, resource=prefix + "max_iter", max_resources=args.rounds,
            factor=HALVING_FACTOR, random_state=args.seed, **common)
    return with_progress(GridSearchCV, **progress)(estimator, prefixed, **common)


def _plan(args, search, grid, prefix, X, y, params, added_defaults=False):
    """The line printed before the search: its number of fits and an estimate of its time.

    The estimate is a linear model, measured now on the first candidate and the first fold:
    an untimed fit of one round (it compiles the kernels), then timed fits of one and three
    rounds give the seconds per fit (setup, scoring) and per round; (per fit x fits + per
    round x the rounds of all fits) / the workers. Candidates that change the work per round
    (rank, local steps) make it rough.
    """
    from joblib import effective_n_jobs
    from sklearn.base import clone
    from sklearn.model_selection import ParameterGrid

    candidates = list(ParameterGrid(grid))
    if args.halving:
        schedule = halving_schedule(len(candidates), args.rounds)
        n_fits = sum(c for c, _ in schedule) * args.cv
        rounds = sum(c * r for c, r in schedule) * args.cv
        shown = " + ".join(f"{c} x {args.cv} fits of {r} rounds" for c, r in schedule)
    else:
        n_fits = len(candidates) * args.cv
        rounds = sum(c.get("max_iter", params.get("max_iter", 1)) for c in candidates) * args.cv
        shown = f"{len(candidates)} candidates x {args.cv} folds = {n_fits} fits"
    if added_defaults:
        shown += (" (the papers' settings added as one candidate: the grid does not hold "
                  "them)")
    first = {prefix + k: v for k, v in candidates[0].items()}
    train = next(search.cv.split(X, y))[0]
    X_train = X.iloc[train] if hasattr(X, "iloc") else X[train]
    y_train = None if y is None else y[train]
    model = clone(search.estimator).set_params(**first)

    def seconds(rounds):
        tic = time.perf_counter()
        clone(model).set_params(**{prefix + "max_iter": rounds}).fit(X_train, y_train)
        return time.perf_counter() - tic

    if prefix + "max_iter" not in model.get_params():  # (FedBlend: its members' rounds)
        workers = max(1, min(effective_n_jobs(args.jobs), n_fits))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tic = time.perf_counter()
            clone(model).fit(X_train, y_train)  # (compiles the kernels too: an upper bound)
            per_fit = time.perf_counter() - tic
        return (f"plan: {shown}; estimated at most {_duration(per_fit * n_fits / workers)} "
                f"(the first candidate on the first fold: {per_fit:.2g} s per fit; {n_fits} "
                f"fits, {workers} worker" + ("s" if workers > 1 else "") + ")")

    longest = min(3, first.get(prefix + "max_iter", params.get("max_iter", 1)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seconds(1)  # compiles the kernels
        one = seconds(1)
        per_round = (seconds(longest) - one) / (longest - 1) if longest > 1 else one
    per_round = max(per_round, 0.0)  # (timings on a busy machine)
    per_fit = max(one - per_round, 0.0)  # what a fit costs besides its rounds
    workers = max(1, min(effective_n_jobs(args.jobs), n_fits))
    estimate = (per_fit * n_fits + per_round * rounds) / workers
    return (f"plan: {shown}; estimated {_duration(estimate)} (the first candidate on the "
            f"first fold: {per_fit:.2g} s per fit + {per_round:.2g} s per round; {n_fits} fits,"
            f" {rounds} rounds, {workers} worker" + ("s" if workers > 1 else "") + ")")


def _duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def report_search(args, method, search, seconds, grid, data, out, *, defaults,
                  added_defaults=False, **extra):
    """Print the ranked table, the defaults' score beside the best and the best parameters
    of a search; write ``tune.json``."""
    results = search.cv_results_
    if "n_resources" in results:
        results["n_resources"] = np.asarray(results["n_resources"])
    table, ranked = format_search(search, method.kind, args.top)
    print(table)
    best = ranked[0]
    # the best-ranked row of the defaults (halving: their longest run)
    default = next(r for r in ranked if is_defaults(r["params"], defaults))
    higher_is_better = method.kind == "binary"  # F1; else the RMSE
    gain = (best["score"] - default["score"]) * (1 if higher_is_better else -1)
    rounds = (lambda r: f" at {r['rounds']} rounds") if "rounds" in best else (lambda r: "")
    # ("defaults" means the estimator's defaults everywhere else; tune starts from the
    # papers' settings, so its line says so)
    print(f"\npapers' settings: {default['score']:.4f}{rounds(default)} (rank "
          f"{default['rank']} of "
          f"{len(ranked)}); best: {best['score']:.4f}{rounds(best)} "
          f"({abs(gain):.4f} {'better' if gain >= 0 else 'worse'})")
    shown = [f"{k}={v!r}" for k, v in sorted(best["params"].items())
             if not (args.halving and k == "max_iter")]
    if "rounds" in best:
        shown.append(f"rounds={best['rounds']}")
    print(f"\nbest parameters ({seconds:.1f} s): "
          + (", ".join(shown) or "the only candidate (no parameter varied)"))
    report = {"command": "tune", "method": method.name, "halving": args.halving, **extra,
              "data": data, "cv": args.cv, "seconds": seconds, "grid": grid,
              "defaults": {"params": defaults, "score": default["score"],
                           "rank": default["rank"], "added_to_grid": added_defaults},
              "best_score": best["score"], "gain_over_defaults": gain, "ranked": ranked}
    (out / "tune.json").write_text(json.dumps(jsonable(report), indent=1))
    print(f"wrote {out / 'tune.json'}")
    return 0
