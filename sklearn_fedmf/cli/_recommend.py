"""``fedmf recommend``: fit one rating method on every rating of ``--data`` (or load a saved
model), print users' top-N items with the data's own ids, save the model only on ``--save``."""

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

from ._commands import one_method
from ._data import _check_sizes, load_pairs
from ._messages import CommandError, _note
from ._options import _literal
from ._registry import RATING_METHODS, make_estimator
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
    lists = []
    for text in args.user or []:
        user, known = _find_user(model, text)
        if not known:
            _note(f"user {text!r} is not in the training data: the cold-start list follows "
                  "(items of highest item bias, or the most rated)")
        support = {} if args.min_support is None else {"min_support": args.min_support}
        items, ratings = model.recommend(user, n=args.top, exclude_seen=not args.include_seen,
                                         **support)
        print(f"\ntop-{args.top} for user {user!r}" + ("" if known else " (cold start)") + ":")
        print(f"{'rank':>4}  {'item':<20}{'predicted':>10}")
        shown = [(item, float(value)) for item, value in zip(items, ratings) if item is not None]
        for k, (item, value) in enumerate(shown, 1):
            print(f"{k:>4}  {str(item):<20}{value:>10.3f}")
        lists.append({"user": user, "known": known, "items": [i for i, _ in shown],
                      "predicted": [v for _, v in shown]})
    if lists:
        (out / "recommend.json").write_text(json.dumps(jsonable(
            {"command": "recommend", "model": args.model, "lists": lists}), indent=1))
        print(f"\nwrote {out / 'recommend.json'}")
    return 0


def _fit(args):
    import joblib

    from .._rating_regressor import RatingRegressor

    method = one_method(args.method, "recommend")
    if method.name not in RATING_METHODS:
        raise CommandError(f"--method {args.method}: recommend takes a rating method: "
                           f"{', '.join(RATING_METHODS)}")
    save = Path(args.save).expanduser() if args.save else None
    if save is not None and save.is_dir():
        raise CommandError(f"--save {args.save}: is a folder; give a file name")
    make_estimator(method, args)  # option errors before the data is loaded
    X, y, name = load_pairs(args)
    n_users, n_items = X.iloc[:, 0].nunique(), X.iloc[:, 1].nunique()
    print(f"data: {name}: {n_users} users x {n_items} items, {len(y)} ratings (all used for "
          "training)")
    _check_sizes(SimpleNamespace(shape=(n_users, n_items)), args)  # may adapt the options
    model = RatingRegressor(make_estimator(method, args, verbose=0 if args.quiet else 1))
    tic = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(X, y)
    for message in dict.fromkeys(str(w.message).splitlines()[0] for w in caught):
        _note(message)
    print(f"fitted {method.label} in {time.perf_counter() - tic:.1f} s")
    if save is not None:
        save.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(model, save)
        print(f"wrote {save} (serve it with --model {save})")
    return model


def _find_user(model, text):
    """``(id, known)``: the user id written ``text`` on the command line (a number or a
    string) and whether the model saw it in training."""
    for candidate in (_literal(text), text):
        if model._encode(np.array([candidate], dtype=object), model._user_index)[0] >= 0:
            return candidate, True
    return _literal(text), False
