"""The pair face of ``fedmf``: ``recommend`` (fit on a ratings file, save, print a user's
top-N with the original ids) and the entry-wise cross-validation of ``tune``."""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from ._commands import _output_folder, grid_size, report_search
from ._data import _check_sizes, _movielens_file, load_data
from ._messages import CommandError, _note
from ._options import _literal
from ._registry import _methods, make_estimator

PREFIX = "estimator__"


def load_pairs(args):
    """``(X, y, description)``: a DataFrame of (user, item) ids and the ratings.

    A MovieLens file or folder and the embedded data keep their ``userId``/``movieId``; any
    other CSV with a header gives its ``--user-col``, ``--item-col`` and ``--rating-col``;
    generated data (``synthetic:``) uses the matrix's row and column numbers as ids.
    """
    from ..datasets import load_movielens

    spec = args.data
    user, item, rating = args.user_col, args.item_col, args.rating_col
    path = Path(spec).expanduser()
    if spec in ("embedded", "movielens", "latest-small"):
        frame, name = load_movielens(return_df=True).frame, "MovieLens latest-small (embedded)"
        user, item, rating = "userId", "movieId", "rating"
    elif path.is_dir() or path.name in ("u.data", "ratings.dat"):
        file, variant = _movielens_file(path)
        frame = load_movielens(variant, path=file, return_df=True).frame
        name, (user, item, rating) = f"MovieLens {variant} ({file})", ("userId", "movieId",
                                                                       "rating")
    elif path.is_file():
        frame, name = pd.read_csv(path), str(path)
        missing = [c for c in (user, item, rating) if c not in frame.columns]
        if missing:
            raise CommandError(
                f"--data {spec}: no column {', '.join(map(repr, missing))} (columns: "
                f"{', '.join(frame.columns)}); name them with --user-col, --item-col and "
                "--rating-col"
            )
    else:
        X, name = load_data(spec, args.seed)  # generated data: row and column numbers
        X = X.tocoo()
        frame = pd.DataFrame({"user": X.row, "item": X.col, "rating": X.data})
        user, item, rating = "user", "item", "rating"
    return frame[[user, item]], frame[rating].to_numpy(dtype=float), name


def cmd_recommend(args):
    import joblib

    from .._rating_regressor import RatingRegressor

    if args.model:
        model = joblib.load(args.model)
        if not isinstance(model, RatingRegressor):
            raise CommandError(f"--model {args.model}: not a RatingRegressor saved by fedmf")
        print(f"model: {args.model}: {type(model.estimator_).__name__} on "
              f"{len(model.users_)} users x {len(model.items_)} items")
    else:
        methods = _methods(args.method)
        if len(methods) != 1 or methods[0].kind != "completion":
            raise CommandError(f"--method {args.method}: recommend takes one rating-completion "
                               "method")
        X, y, name = load_pairs(args)
        print(f"data: {name}: {X.iloc[:, 0].nunique()} users x {X.iloc[:, 1].nunique()} "
              f"items, {len(y)} ratings (all used for training)")
        _check_sizes(SimpleNamespace(shape=(X.iloc[:, 0].nunique(), X.iloc[:, 1].nunique())),
                     args)
        model = RatingRegressor(make_estimator(methods[0], args, verbose=0))
        tic = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(X, y)
        for message in dict.fromkeys(str(w.message).splitlines()[0] for w in caught):
            _note(message)
        save = Path(args.save) if args.save else Path(args.out) / "model.joblib"
        save.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(model, save)
        print(f"fitted {methods[0].label} in {time.perf_counter() - tic:.1f} s; wrote {save}")
    for text in args.user or []:
        user = _find_user(model, text)
        items, ratings = model.recommend(user, n=args.top, exclude_seen=not args.include_seen)
        print(f"\ntop-{args.top} for user {user!r}:")
        print(f"{'rank':>4}  {'item':<20}{'predicted':>10}")
        for k, (item, value) in enumerate(zip(items, ratings), 1):
            if item is not None:
                print(f"{k:>4}  {str(item):<20}{value:>10.3f}")
    return 0


def _find_user(model, text):
    """The user id written ``text`` on the command line (a number or a string)."""
    for candidate in (_literal(text), text):
        if model._encode(np.array([candidate], dtype=object), model._user_index)[0] >= 0:
            return candidate
    return _literal(text)  # unseen: recommend gives the cold-start list


def tune_entrywise(args, method, grid, estimator):
    """``fedmf tune`` on ratings: ``KFold`` over the ratings through ``RatingRegressor``."""
    from sklearn.model_selection import GridSearchCV, KFold

    from .._rating_regressor import RatingRegressor

    out = _output_folder(args.out, ("tune.json",))  # a bad --out fails before any fit
    X, y, name = load_pairs(args)
    n_users, n_items = X.iloc[:, 0].nunique(), X.iloc[:, 1].nunique()
    cv = KFold(args.cv, shuffle=True, random_state=args.seed)
    common = dict(cv=cv, n_jobs=args.jobs, error_score="raise", refit=False,
                  scoring="neg_root_mean_squared_error")
    prefixed = [{PREFIX + k: v for k, v in g.items()} for g in grid]
    regressor = RatingRegressor(estimator.set_params(n_jobs=None))
    if args.halving:
        from sklearn.experimental import enable_halving_search_cv  # noqa: F401
        from sklearn.model_selection import HalvingGridSearchCV

        for g in prefixed:
            g.pop(PREFIX + "max_iter", None)
        search = HalvingGridSearchCV(regressor, prefixed, resource=PREFIX + "max_iter",
                                     max_resources=args.rounds, factor=3,
                                     random_state=args.seed, **common)
    else:
        search = GridSearchCV(regressor, prefixed, **common)
    n_candidates = grid_size(grid)
    print(f"data: {name}: {n_users} users x {n_items} items, {len(y)} ratings; tuning "
          f"{method.label}: {n_candidates} candidates x {args.cv} folds of the ratings "
          "(entry-wise)" + (" (successive halving on rounds)" if args.halving else ""),
          flush=True)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        search.fit(X, y)
    seconds = time.perf_counter() - tic
    results = dict(search.cv_results_)
    results["params"] = [{k[len(PREFIX):]: v for k, v in p.items()} for p in results["params"]]
    if "n_resources" in results:
        results["n_resources"] = np.asarray(results["n_resources"])
    view = SimpleNamespace(cv_results_=results)
    data = {"name": name, "shape": [n_users, n_items], "nnz": len(y)}
    return report_search(args, method, view, seconds, grid, data, out, split="ratings",
                         estimator=estimator.get_params())
