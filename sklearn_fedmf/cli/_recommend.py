"""``fedmf recommend``: fit one completion method on ``--data`` (or load a saved model), print
users' top-N items with the data's own ids, save the model only on ``--save``.

The model is the estimator's defaults with ``--seed`` as its ``random_state`` (so the same
command prints the same lists), on implicit feedback (``loss="implicit"``, the ratings as
the interactions' strengths) unless ``--ratings`` asks for the rating model. The lists come
from a fit on every rating; a second fit, which holds out one random rating per user
(leave-one-out), scores such lists: their hit rate and NDCG at 10, full ranking, beside the
most popular items'."""

from __future__ import annotations

import json
import pickle
import struct
import time
import warnings
import zipfile
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ._data import _check_sizes, load_pairs
from ._messages import CommandError, _note
from ._options import _literal
from ._registry import RATING_METHODS, make_estimator, one_method
from ._report import jsonable, output_folder

# The first bytes of a file joblib can load: a pickle (protocol 2 or later) or one of its
# compressions (zlib, gzip, bz2, xz, lzma, lz4).
_JOBLIB_MAGIC = (b"\x80", b"x", b"\x1f\x8b", b"BZ", b"\xfd7zXZ", b"]\x00\x00", b'\x04"M\x18')
# What unpickling a file that is not a pickle of this package raises
_LOAD_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, IndexError, KeyError,
                AttributeError, ImportError, TypeError, struct.error, zlib.error,
                zipfile.BadZipFile, OSError)


def load_model(path):
    """The :class:`~sklearn_fedmf.RatingRegressor` saved at ``path``; one clear
    :class:`CommandError` for a missing file, a file of another kind or another object."""
    import joblib

    from .._rating_regressor import RatingRegressor

    where = f"--model {path}"
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise CommandError(f"{where}: {exc.strerror.lower()}") from None
    if not head.startswith(_JOBLIB_MAGIC):
        raise CommandError(f"{where}: not a model saved by 'fedmf recommend --save' (not a "
                           "joblib file)")
    try:
        model = joblib.load(path)
    except _LOAD_ERRORS as exc:
        raise CommandError(f"{where}: not a model saved by 'fedmf recommend --save' (it "
                           f"could not be loaded: {type(exc).__name__})") from None
    if not isinstance(model, RatingRegressor) or not hasattr(model, "estimator_"):
        raise CommandError(f"{where}: holds a {type(model).__name__}, not a fitted "
                           "RatingRegressor saved by 'fedmf recommend --save'")
    return model


def cmd_recommend(args):
    out = output_folder(args.out, ("recommend.json",))
    if args.model:
        model = load_model(args.model)
        print(f"model: {args.model}: {type(model.estimator_).__name__} on "
              f"{len(model.users_)} users x {len(model.items_)} items")
    else:
        model = _fit(args)
    from .._rating_regressor import MIN_SUPPORT

    lists = []
    support = {} if args.min_support is None else {"min_support": args.min_support}
    min_support = support.get("min_support", MIN_SUPPORT)
    for text in args.user or []:
        user, known = _find_user(model, text)
        if not known:
            _note(f"user {text!r} is not in the training data: the cold-start list follows "
                  "(items of highest item bias, or the most rated)")
        items, ratings = model.recommend(user, n=args.top, exclude_seen=not args.include_seen,
                                         **support)
        shown = [(item, float(value)) for item, value in zip(items, ratings) if item is not None]
        counts = model.item_counts_[model._item_index.get_indexer([i for i, _ in shown])]
        cold = ("" if known else " (cold start, ranked by item bias)"
                if model._model().item_bias is not None
                else " (cold start, ranked by the number of training ratings)")
        print(f"\ntop-{args.top} for user {user!r}{cold}:")
        print(_format_list(shown, counts, min_support, known))
        lists.append({"user": user, "known": known, "items": [i for i, _ in shown],
                      "predicted": [v for _, v in shown], "ratings": counts.tolist()})
    if lists:
        (out / "recommend.json").write_text(json.dumps(jsonable(
            {"command": "recommend", "model": args.model, "lists": lists}), indent=1))
        print(f"\nwrote {out / 'recommend.json'}")
    return 0


def _fit(args):
    import joblib

    from .._rating_regressor import RatingRegressor
    from ._warm_up import warm_up

    method = one_method(args.method, "recommend")
    if method.name not in RATING_METHODS:
        raise CommandError(f"--method {args.method}: recommend takes a rating method: "
                           f"{', '.join(RATING_METHODS)}")
    save = Path(args.save).expanduser() if args.save else None
    if save is not None and save.is_dir():
        raise CommandError(f"--save {args.save}: is a folder; give a file name")
    implicit = not getattr(args, "ratings", False)
    if implicit and "loss" not in method.load()().get_params(deep=False):
        _note(f"{method.label} blends rating models: it fits the ratings (as with --ratings)")
        implicit = False
    make_estimator(method, args, settings="defaults")  # option errors before the data is loaded
    X, y, name = load_pairs(args)
    n_users, n_items = X.iloc[:, 0].nunique(), X.iloc[:, 1].nunique()
    print(f"data: {name}: {n_users} users x {n_items} items, {len(y)} ratings (all used for "
          "training)")
    _check_sizes(SimpleNamespace(shape=(n_users, n_items)), args)  # may adapt the options
    estimator = make_estimator(method, args, verbose=0 if args.quiet else 1,
                               settings="defaults")
    if implicit:
        estimator.set_params(loss="implicit")
    model = RatingRegressor(estimator)
    warm_up(model, X, y)
    tic = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    seconds = time.perf_counter() - tic
    for message in dict.fromkeys(str(w.message).splitlines()[0] for w in caught):
        _note(message)
    kind = 'loss="implicit"' if implicit else 'loss="squared"'
    fitted = model.estimator_
    rank = (f", rank {fitted.components_.shape[0]}" if hasattr(fitted, "components_")
            else "")  # (a blend has its members' ranks)
    print(f"fitted {method.label} ({kind}{rank}, {fitted.n_clients_} clients, "
          f"{fitted.n_iter_} rounds, random_state={fitted.random_state}) in {seconds:.1f} s "
          "(compilation excluded: an untimed one-round fit first)")
    _print_held_out(model, X, y, args.seed, args.min_support)
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(model, save)
        print(f"wrote {save} (serve it with --model {save})")
    return model


def _format_list(shown, counts, min_support, known):
    """The printed list: rank, item, the score it is ranked by and the item's number of
    training ratings. A known user's items with fewer than ``min_support`` ratings come after
    the others (``RatingRegressor.recommend``), under a line that says so; a cold-start list
    is ranked by item bias (its predicted rating) or, without biases, by the ratings."""
    lines = [f"{'rank':>4}  {'item':<20}{'predicted':>10}{'ratings':>9}"]
    held_back = False
    for k, ((item, value), count) in enumerate(zip(shown, counts), 1):
        if known and count < min_support and not held_back and k > 1:
            lines.append(f"      -- items with fewer than {min_support} training ratings "
                         "(--min-support) --")
        held_back = held_back or count < min_support
        lines.append(f"{k:>4}  {str(item):<20}{value:>10.3f}{count:>9d}")
    return "\n".join(lines)


def _hold_out(X, y, seed):
    """``(X_train, y_train, X_test)``: one random pair per user with at least two held out
    (:func:`~sklearn_fedmf.model_selection.leave_one_out_split`)."""
    from ..model_selection import leave_one_out_split

    frame = X.assign(_rating=y)
    train, test = leave_one_out_split(frame, random_state=seed)
    return train.iloc[:, :2], train["_rating"].to_numpy(), test.iloc[:, :2]


def _print_held_out(model, X, y, seed, min_support, k=10):
    """HR@k and NDCG@k of the lists of a clone of ``model`` fitted without one random pair
    per user (full ranking of the unseen items), beside the most popular items'."""
    from sklearn.base import clone

    from ..metrics import hit_rate_at_k, ndcg_at_k

    X_train, y_train, X_test = _hold_out(X, y, seed)
    if len(X_test) == 0:
        _note("no user has two ratings: nothing held out to score the lists")
        return
    users, truth = X_test.iloc[:, 0].to_numpy(), X_test.iloc[:, 1].to_numpy()
    support = {} if min_support is None else {"min_support": min_support}
    scored = clone(model).set_params(estimator__verbose=0)
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (said by the first fit)
        scored.fit(X_train, y_train)
    seconds = time.perf_counter() - tic
    lists, _ = scored.recommend(users, n=k, **support)
    popular = _most_popular(X_train, users, k)
    print(f"held out: one rating of each of {len(users)} users, lists of a second fit "
          f"without them ({seconds:.1f} s), full ranking:")
    print(f"  {'lists':<16}{'HR@' + str(k):>8}{'NDCG@' + str(k):>9}")
    for label, ranked in (("this model", lists), ("most popular", popular)):
        print(f"  {label:<16}{hit_rate_at_k(truth, ranked, k=k):>8.3f}"
              f"{ndcg_at_k(truth, ranked, k=k):>9.3f}")


def _most_popular(X_train, users, k):
    """Each user's ``k`` most rated items of the training pairs that she has not rated
    (ties to the item first met)."""
    counts = X_train.iloc[:, 1].value_counts(sort=False)
    order = counts.index.to_numpy()[np.lexsort((np.arange(len(counts)), -counts.to_numpy()))]
    seen = X_train.groupby(X_train.columns[0])[X_train.columns[1]].agg(set)
    return [[i for i in order[:k + len(seen[u])] if i not in seen[u]][:k] for u in users]


def _find_user(model, text):
    """``(id, known)``: the user id written ``text`` on the command line (a number or a
    string) and whether the model saw it in training."""
    for candidate in (_literal(text), text):
        if model._encode(np.array([candidate], dtype=object), model._user_index)[0] >= 0:
            return candidate, True
    return _literal(text), False
