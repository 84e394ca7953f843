"""Data for the ``fedmf`` command: the ``--data`` specifications, the train/test split of
ratings and the binarization for the binary methods."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ._messages import CommandError

BINARY_THRESHOLD = 3.5  # Felb's binarization of MovieLens: rating >= 3.5 -> 1


def load_data(spec, seed=0):
    """``(X, description)`` for a ``--data`` value (see ``fedmf run --help``)."""
    from ..datasets import fetch_movielens, load_movielens, make_binary_tiles, make_ratings

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
