"""Data for the ``fedmf`` command: one reader of every ``--data`` specification (the
embedded MovieLens, MovieLens files and folders, any CSV with a header, generated data), the
train/test split of ratings and the binarization for the binary methods."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ._messages import CommandError, _note
from ._registry import COLUMNS, KNOWN_COLUMNS

BINARY_THRESHOLD = 3.5  # Felb's binarization of MovieLens: rating >= 3.5 -> 1
_EMBEDDED = ("embedded", "movielens", "latest-small")


def read_ratings(spec, seed=0, columns=(None, None, None)):
    """The ratings of a ``--data`` value: a dict with ``X`` (CSR, users x items),
    ``user_ids`` and ``item_ids`` (the data's ids of the rows and columns) and ``name``.

    This is the only reader of the command: ``run``, ``tune``, ``recommend`` and
    ``flower-split`` read the same files the same way. ``columns`` are the user, item and
    rating columns of a CSV file with a header; generated data uses the matrix's row and
    column numbers as ids.
    """
    from ..datasets import fetch_movielens, load_movielens, make_binary_tiles, make_ratings

    if spec in _EMBEDDED:
        return _bunch(load_movielens(), "MovieLens latest-small (embedded)")
    if spec.startswith("synthetic:"):
        n_users, n_items, n_ratings = _parse_sizes(spec[len("synthetic:"):],
                                                   "synthetic:USERSxITEMSxRATINGS")
        if n_ratings > n_users * n_items:
            raise CommandError(
                f"impossible sizes in --data {spec}: {n_ratings} ratings do not fit in "
                f"{n_users} x {n_items} = {n_users * n_items} cells"
            )
        data = make_ratings(n_users, n_items, n_ratings, random_state=seed)
        return _numbered(data.X, f"synthetic {n_users} x {n_items}, {n_ratings} ratings")
    if spec.startswith("tiles:"):
        rows, cols, tiles = _parse_sizes(spec[len("tiles:"):], "tiles:ROWSxCOLSxTILES")
        data = make_binary_tiles(rows, cols, tiles, random_state=seed)
        return _numbered(data.X, f"binary tiles {rows} x {cols}, {tiles} tiles")
    if spec.startswith("movielens:"):
        variant = spec.split(":", 1)[1]
        return _bunch(fetch_movielens(variant), f"MovieLens {variant}")
    path = Path(spec).expanduser()
    if not path.exists():
        raise CommandError(
            f"--data {spec}: no such file or directory (expected 'embedded', "
            "'synthetic:USERSxITEMSxRATINGS', 'movielens:VARIANT', a MovieLens ratings file "
            "or folder, or a CSV file with a header)"
        )
    if path.is_dir() or path.name in ("u.data", "ratings.dat"):
        file, variant = _movielens_file(path)
        if file.suffix != ".csv":  # MovieLens's own formats (no header)
            try:
                data = load_movielens(variant, path=file)
            except ValueError:
                sep = "\t" if file.name == "u.data" else "::"
                raise CommandError(_first_bad_line(file, COLUMNS, sep)) from None
            return _bunch(data, f"MovieLens {variant} ({file})")
        path = file
    else:
        variant = _movielens_file(path)[1] if path.name == "ratings.csv" else None
    data = read_csv_ratings(path, columns)
    if variant is not None and data["columns"] == COLUMNS:
        data["name"] = f"MovieLens {variant} ({path})"
    return data


def read_csv_ratings(path, columns=(None, None, None)):
    """The ratings of a CSV file; an error names the file and the line.

    ``columns`` are the user, item and rating columns; those left None are detected: a
    header among :data:`KNOWN_COLUMNS` (case ignored), or, when the first line is data (its
    third field a number), the first three columns of a file without a header. What was
    detected is said in one note line. The dict's ``columns`` are the names used.
    """
    import pandas as pd

    from ..datasets import ratings_to_matrix

    header = _first_row(path)
    columns, has_header = _resolve_columns(path, header, columns)
    user, item, rating = columns
    try:
        if has_header:
            frame = pd.read_csv(path, dtype={rating: np.float64})
        else:
            frame = pd.read_csv(path, header=None, usecols=[0, 1, 2], names=list(columns),
                                dtype={rating: np.float64})
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError):
        raise CommandError(_first_bad_line(path, columns, None if has_header else ",",
                                           len(header))) from None
    if frame.empty:
        raise CommandError(f"{path}: no rating after the header")
    repeated = int(frame.duplicated([user, item]).sum())
    if repeated and not frame[[user, item, rating]].isna().any(axis=None):
        # as RatingRegressor.fit does (a missing value is reported below, by its line)
        _note(f"{path}: {repeated} rating(s) repeat a (user, item) pair listed before: each "
              "such pair is fitted at the mean of its ratings")
        frame = frame.groupby([user, item], as_index=False, sort=False)[rating].mean()
    try:
        X, user_ids, item_ids = ratings_to_matrix(frame, user_col=user, item_col=item,
                                                  rating_col=rating)
    except ValueError:  # a missing id or rating
        raise CommandError(_first_bad_line(path, columns, None if has_header else ",",
                                           len(header))) from None
    return {"X": X, "user_ids": user_ids, "item_ids": item_ids, "name": str(path),
            "columns": columns}


def _first_row(path):
    """The fields of the first non-empty line of a CSV file (its header, or its first
    rating); an empty list for an empty file."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return next((row for row in csv.reader(fh) if row), [])
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path}: not a UTF-8 text file ({exc.reason} at byte "
                           f"{exc.start})") from None
    except csv.Error as exc:
        raise CommandError(f"{path} line 1: {exc}") from None


def _resolve_columns(path, first, columns):
    """``(columns, has_header)``: the typed ``columns`` (None where not typed) completed from
    the file's first row ``first``, with a note saying what was detected."""
    if all(c is not None for c in columns):
        return tuple(columns), True
    typed = ", ".join(f"{o} {c}" for o, c in zip(("--user-col", "--item-col", "--rating-col"),
                                                columns) if c is not None)
    if len(first) >= 3 and not any(columns) and _is_number(first[2]):
        names = ("user", "item", "rating")
        _note(f"{path}: no header; its first three columns read as user, item and rating")
        return names, False
    lower = {name.strip().lower(): name for name in first}
    for known in KNOWN_COLUMNS:
        found = tuple(c if c is not None else lower.get(k.lower())
                      for c, k in zip(columns, known))
        if None not in found and all(c in first for c in found):
            if found != COLUMNS:
                _note(f"{path}: columns {', '.join(found)} read as user, item and rating "
                      "(--user-col, --item-col and --rating-col choose others)")
            return found, True
    wanted = [c for c in columns if c is not None and c not in first]
    what = (f"no column {', '.join(map(repr, wanted))}" if wanted else
            "no user, item and rating columns of a known name ("
            + "; ".join(", ".join(k) for k in KNOWN_COLUMNS[:3]) + ")")
    raise CommandError(
        f"{path}: {what} (columns: {', '.join(first)}{'; typed: ' + typed if typed else ''}); "
        "name them with --user-col, --item-col and --rating-col"
    )


def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _first_bad_line(path, columns, sep=None, n_fields=4):
    """``"FILE line N: what is wrong"`` for the first malformed line of a ratings file: a CSV
    file with a header (``sep=None``), or headerless ``user<sep>item<sep>rating...`` lines of
    ``n_fields`` fields (MovieLens's formats: 4; ``columns`` then only name the fields in
    messages).

    Only called once the fast reader has failed: this one reads the file line by line.
    """
    user, item, rating = columns
    seen = {}
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            if sep is None:
                reader = csv.reader(fh)
                header = next(reader, [])
                missing = [c for c in columns if c not in header]
                if missing:
                    return f"{path}: no column {', '.join(map(repr, missing))}"
                at, n_fields, what = [header.index(c) for c in columns], len(header), "header"
                rows = ((reader.line_num, row) for row in reader)
            else:
                at, what = (0, 1, 2), "format" if sep != "," else "first line"
                rows = ((k, line.rstrip("\r\n").split(sep)) for k, line in enumerate(fh, 1)
                        if line.strip())
            for line, row in rows:
                where = f"{path} line {line}"
                if not row:  # blank lines are skipped, as by the fast reader
                    continue
                if len(row) != n_fields:
                    return f"{where}: {len(row)} fields where the {what} has {n_fields}"
                u, i, r = (row[k].strip() for k in at)
                if not u or not i:
                    return f"{where}: no {user if not u else item}"
                try:
                    value = float(r)
                except ValueError:
                    return f"{where}: {rating} {r!r} is not a number"
                if not math.isfinite(value):
                    return f"{where}: {rating} {r!r} is not a finite number"
                first = seen.setdefault((u, i), line)
                if first != line and sep not in (None, ","):  # (a CSV file's are averaged)
                    return f"{where}: {user} {u} rated {item} {i} again (first on line {first})"
    except UnicodeDecodeError as exc:
        return f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})"
    except csv.Error as exc:
        return f"{path} line {reader.line_num}: {exc}"
    return f"{path}: could not be read as a ratings file"


def _bunch(data, name):
    return {"X": data.X, "user_ids": data.user_ids, "item_ids": data.item_ids, "name": name,
            "columns": COLUMNS}


def _numbered(X, name):
    X = sp.csr_matrix(X)
    return {"X": X, "user_ids": np.arange(X.shape[0]), "item_ids": np.arange(X.shape[1]),
            "name": name, "columns": ("user", "item", "rating")}


def _columns(args):
    """The typed ``--user-col``, ``--item-col`` and ``--rating-col`` (None: detect)."""
    return tuple(getattr(args, name, None) for name in ("user_col", "item_col", "rating_col"))


def load_data(spec, seed=0, columns=(None, None, None)):
    """``(X, description)`` for a ``--data`` value (see ``fedmf run --help``)."""
    data = read_ratings(spec, seed, columns)
    return data["X"], data["name"]


def load_pairs(args):
    """``(X, y, description)`` of ``--data``: a DataFrame of (user, item) ids and the ratings,
    for :class:`~sklearn_fedmf.RatingRegressor` (ids as in the data)."""
    import pandas as pd

    data = read_ratings(args.data, args.seed, _columns(args))
    user, item, _ = data["columns"]
    X = data["X"].tocoo()
    pairs = pd.DataFrame({user: data["user_ids"][X.row], item: data["item_ids"][X.col]})
    return pairs, X.data.astype(np.float64), data["name"]


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
    X, name = load_data(args.data, args.seed, _columns(args))
    _check_sizes(X, args)
    if kind == "binary":
        if not tiles:
            X_fit = binarize(X)
            name += f", binarized at rating >= {BINARY_THRESHOLD}"
        return X, X if tiles else X_fit, None, name
    from ..model_selection import train_test_split_ratings

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


def _check_sizes(X, args, users="users of the data"):
    """Check the federation options against the data's shape ``X.shape`` (its ``users``: the
    rows a fit gets); the default ``--clients`` becomes one client per user when the data has
    fewer users."""
    n_rows, n_items = X.shape
    if args.clients is not None and args.clients > n_rows and "clients" not in args.explicit:
        _note(f"--clients {n_rows}: one client per user (the default {args.clients} is more "
              f"than the {n_rows} {users})")
        args.clients = n_rows
    if args.clients is not None and args.clients > n_rows:
        raise CommandError(
            f"impossible sizes: --clients {args.clients} is more than the {n_rows} {users} "
            "(every client needs at least one row)"
        )
    cpr = args.clients_per_round
    if isinstance(cpr, int) and args.clients is not None and cpr > args.clients:
        if "clients_per_round" in args.explicit:
            raise CommandError(f"impossible sizes: --clients-per-round {cpr} is more than "
                               f"--clients {args.clients}")
        args.clients_per_round = args.clients  # the default 10 with fewer clients: all of them
    if args.rank is not None and args.rank > n_items:
        raise CommandError(f"impossible sizes: --rank {args.rank} is more than {n_items} items")
