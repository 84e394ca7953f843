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

from ._messages import CommandError
from ._registry import COLUMNS

BINARY_THRESHOLD = 3.5  # Felb's binarization of MovieLens: rating >= 3.5 -> 1
_EMBEDDED = ("embedded", "movielens", "latest-small")


def read_ratings(spec, seed=0, columns=COLUMNS):
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
    if variant is not None and tuple(columns) == COLUMNS:
        data["name"] = f"MovieLens {variant} ({path})"
    return data


def read_csv_ratings(path, columns=COLUMNS):
    """The ratings of a CSV file with a header; an error names the file and the line."""
    import pandas as pd

    from ..datasets import ratings_to_matrix

    user, item, rating = columns
    try:
        frame = pd.read_csv(path, dtype={rating: np.float64})
    except (ValueError, pd.errors.ParserError, UnicodeDecodeError):
        raise CommandError(_first_bad_line(path, columns)) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise CommandError(
            f"{path}: no column {', '.join(map(repr, missing))} (columns: "
            f"{', '.join(map(str, frame.columns))}); name them with --user-col, --item-col "
            "and --rating-col"
        )
    if frame.empty:
        raise CommandError(f"{path}: no rating after the header")
    try:
        X, user_ids, item_ids = ratings_to_matrix(frame, user_col=user, item_col=item,
                                                  rating_col=rating)
    except ValueError:  # a missing id or rating, or a pair rated twice
        raise CommandError(_first_bad_line(path, columns)) from None
    return {"X": X, "user_ids": user_ids, "item_ids": item_ids, "name": str(path)}


def _first_bad_line(path, columns, sep=None):
    """``"FILE line N: what is wrong"`` for the first malformed line of a ratings file: a CSV
    file with a header (``sep=None``), or MovieLens's headerless ``user<sep>item<sep>rating
    <sep>timestamp`` lines (``columns`` then only name the fields in messages).

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
                at, n_fields, what = (0, 1, 2), 4, "format"
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
                if first != line:
                    return f"{where}: {user} {u} rated {item} {i} again (first on line {first})"
    except UnicodeDecodeError as exc:
        return f"{path}: not a UTF-8 text file ({exc.reason} at byte {exc.start})"
    except csv.Error as exc:
        return f"{path} line {reader.line_num}: {exc}"
    return f"{path}: could not be read as a ratings file"


def _bunch(data, name):
    return {"X": data.X, "user_ids": data.user_ids, "item_ids": data.item_ids, "name": name}


def _numbered(X, name):
    X = sp.csr_matrix(X)
    return {"X": X, "user_ids": np.arange(X.shape[0]), "item_ids": np.arange(X.shape[1]),
            "name": name}


def _columns(args):
    return (getattr(args, "user_col", COLUMNS[0]), getattr(args, "item_col", COLUMNS[1]),
            getattr(args, "rating_col", COLUMNS[2]))


def load_data(spec, seed=0, columns=COLUMNS):
    """``(X, description)`` for a ``--data`` value (see ``fedmf run --help``)."""
    data = read_ratings(spec, seed, columns)
    return data["X"], data["name"]


def load_pairs(args):
    """``(X, y, description)`` of ``--data``: a DataFrame of (user, item) ids and the ratings,
    for :class:`~sklearn_fedmf.RatingRegressor` (ids as in the data)."""
    import pandas as pd

    user, item, _ = _columns(args)
    data = read_ratings(args.data, args.seed, _columns(args))
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
