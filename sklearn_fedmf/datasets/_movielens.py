"""MovieLens: long-format ratings to a matrix, the embedded latest-small copy, loaders, fetcher."""

from __future__ import annotations

import hashlib
import shutil
import urllib.request
import zipfile
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.datasets import get_data_home
from sklearn.utils import Bunch

__all__ = ["ratings_to_matrix", "load_movielens", "fetch_movielens"]

_COLUMNS = ["userId", "movieId", "rating", "timestamp"]
_DTYPES = {"userId": np.int64, "movieId": np.int64, "rating": np.float64, "timestamp": np.int64}
_URL = "https://files.grouplens.org/datasets/movielens/{}.zip"
_EMBEDDED = "ml-latest-small-ratings.csv.gz"
_LICENSE = "ml-latest-small-LICENSE.txt"


class _Variant(NamedTuple):
    archive: str  # zip name without .zip
    folder: str  # top folder inside the zip
    file: str  # ratings file inside that folder
    fmt: str  # "csv" (header userId,movieId,rating,timestamp), "tab" or "dat" (``::``)


_VARIANTS = {
    "100k": _Variant("ml-100k", "ml-100k", "u.data", "tab"),
    "1m": _Variant("ml-1m", "ml-1m", "ratings.dat", "dat"),
    "10m": _Variant("ml-10m", "ml-10M100K", "ratings.dat", "dat"),
    "20m": _Variant("ml-20m", "ml-20m", "ratings.csv", "csv"),
    "25m": _Variant("ml-25m", "ml-25m", "ratings.csv", "csv"),
    "32m": _Variant("ml-32m", "ml-32m", "ratings.csv", "csv"),
    "latest": _Variant("ml-latest", "ml-latest", "ratings.csv", "csv"),
    "latest-small": _Variant("ml-latest-small", "ml-latest-small", "ratings.csv", "csv"),
}
# sha256 of the ratings file of a release, pinned only where it was verified: latest-small's
# ratings.csv (the embedded copy, 100836 ratings, matches an independently published hash).
# For the other releases nothing is pinned: fetch_movielens records the sha256 of the ratings
# file at the first download and checks it on every later load.
_RATINGS_SHA256 = {
    "latest-small": "80da8b3393dae325bbba5a31f291a6ba55d8d4f4396de3c456f2c1635b1b70e8",
}


def ratings_to_matrix(ratings, *, user_col="userId", item_col="movieId", rating_col="rating"):
    """Turn long-format ratings into a users x items CSR matrix and its id maps.

    Parameters
    ----------
    ratings : pandas.DataFrame or tuple of three array-likes
        One row per rating: a DataFrame with the columns below, or ``(users, items, values)``.
    user_col, item_col, rating_col : str
        Column names used when ``ratings`` is a DataFrame.

    Returns
    -------
    X : scipy.sparse.csr_matrix of shape (n_users, n_items), dtype float64
        ``X[i, j]`` is the rating of ``user_ids[i]`` on ``item_ids[j]``. Every rating is a
        stored entry, a rating of 0 included. Rows and columns follow the sorted ids.
    user_ids : ndarray of shape (n_users,)
        The distinct original user ids, sorted.
    item_ids : ndarray of shape (n_items,)
        The distinct original item ids, sorted; only items with a rating appear.

    Raises
    ------
    ValueError
        If a column is missing, an id is missing, a rating is NaN or infinite, or the same
        (user, item) pair occurs more than once; the message gives the number of duplicate
        rows. Aggregate them first, e.g. ``df.drop_duplicates([user, item], keep="last")``.

    Examples
    --------
    >>> import pandas as pd
    >>> from sklearn_fedmf.datasets import ratings_to_matrix
    >>> df = pd.DataFrame({"userId": [7, 3, 7], "movieId": [10, 10, 42], "rating": [4.0, 0, 5]})
    >>> X, user_ids, item_ids = ratings_to_matrix(df)
    >>> X.toarray()
    array([[0., 0.],
           [4., 5.]])
    >>> X.nnz, user_ids.tolist(), item_ids.tolist()
    (3, [3, 7], [10, 42])
    """
    if isinstance(ratings, pd.DataFrame):
        missing = [c for c in (user_col, item_col, rating_col) if c not in ratings.columns]
        if missing:
            raise ValueError(
                f"ratings has no column(s) {missing}; its columns are {list(ratings.columns)}."
            )
        users, items, values = (ratings[c].to_numpy() for c in (user_col, item_col, rating_col))
    else:
        try:
            users, items, values = (np.asarray(a) for a in ratings)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                "ratings must be a DataFrame or a tuple (users, items, ratings) of arrays."
            ) from exc
    if len(users) == 0:
        raise ValueError("ratings is empty: there is no rating to put in a matrix.")
    if not users.ndim == items.ndim == values.ndim == 1 or not len(users) == len(items) == len(
        values
    ):
        raise ValueError("users, items and ratings must be 1-d arrays of the same length.")
    try:
        values = values.astype(np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"ratings must be numbers: {exc}") from exc
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(
            f"{int(bad.sum())} rating(s) are NaN or infinite; drop missing ratings instead."
        )
    user_codes, user_ids = pd.factorize(users, sort=True)
    item_codes, item_ids = pd.factorize(items, sort=True)
    if (user_codes < 0).any() or (item_codes < 0).any():
        raise ValueError("ratings has missing (NaN/None) user or item ids.")
    n_users, n_items = len(user_ids), len(item_ids)
    key = user_codes.astype(np.int64) * n_items + item_codes
    if len(key) > 1 and not (key[1:] > key[:-1]).all():
        order = np.argsort(key)  # keys are distinct unless duplicated: no need for stability
        key, item_codes, values = key[order], item_codes[order], values[order]
        n_dup = int((key[1:] == key[:-1]).sum())
        if n_dup:
            raise ValueError(
                f"ratings has {n_dup} duplicate (user, item) row(s): the same user rated the "
                "same item more than once. Keep one rating per pair before building the matrix."
            )
    indptr = np.zeros(n_users + 1, dtype=np.int64)
    np.cumsum(np.bincount(key // n_items, minlength=n_users), out=indptr[1:])
    index_dtype = np.int32 if max(n_items, len(key)) < 2**31 else np.int64
    X = sp.csr_matrix(
        (values, item_codes.astype(index_dtype), indptr.astype(index_dtype)),
        shape=(n_users, n_items),
    )
    X.has_canonical_format = True
    return X, np.asarray(user_ids), np.asarray(item_ids)


def load_movielens(variant="latest-small", *, path=None, return_df=False):
    """Load MovieLens ratings as a users x movies matrix, without any network access.

    With no argument, this returns the copy of ml-latest-small embedded in the package
    (610 users, 9724 rated movies, 100836 ratings from 0.5 to 5 stars). Other releases
    are read from local files given by ``path``; see :func:`fetch_movielens` to download them.

    Parameters
    ----------
    variant : {"latest-small", "100k", "1m", "10m", "20m", "25m", "32m", "latest"}
        The MovieLens release. Its ratings file is ``u.data`` (100k, tab-separated
        ``user item rating timestamp``), ``ratings.dat`` (1m, 10m, ``::``-separated) or
        ``ratings.csv`` (the others, with the header ``userId,movieId,rating,timestamp``).
    path : str or path-like, default=None
        The ratings file itself, or a directory holding it directly or inside the release's
        unzipped folder (e.g. ``ml-1m/``). Required unless ``variant="latest-small"``.
    return_df : bool, default=False
        Also return the long-format ratings as ``frame``.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``X`` (CSR float64, users x movies, rows and columns in sorted id order, only rated
        movies), ``user_ids``, ``item_ids`` (original ids of the rows and columns),
        ``DESCR`` (description and license conditions) and, with ``return_df=True``,
        ``frame``: a DataFrame with columns userId, movieId, rating, timestamp.

    Raises
    ------
    FileNotFoundError
        If the expected ratings file is not found under ``path``.
    ValueError
        If the file does not have the variant's format.

    Examples
    --------
    >>> from sklearn_fedmf.datasets import load_movielens
    >>> ml = load_movielens()
    >>> ml.X.shape, ml.X.nnz
    ((610, 9724), 100836)
    """
    spec = _check_variant(variant)
    if path is None:
        if variant != "latest-small":
            raise ValueError(
                f"MovieLens {variant!r} is not embedded: pass path= to its local "
                f"{spec.file} (or its folder), or use fetch_movielens({variant!r})."
            )
        source = resources.files(__package__).joinpath("data", _EMBEDDED)
        name = _EMBEDDED
        with source.open("rb") as fh:
            frame = _read(fh, spec, variant, name, compression="gzip")
    else:
        file = _find_file(Path(path), spec, variant)
        name = file.name
        frame = _read(file, spec, variant, name)
    try:
        X, user_ids, item_ids = ratings_to_matrix(frame)
    except ValueError as exc:
        raise ValueError(
            f"MovieLens {variant!r} ratings file {name!r} is not valid: {exc}"
        ) from exc
    bunch = Bunch(X=X, user_ids=user_ids, item_ids=item_ids, DESCR=_descr(variant, X, path))
    if return_df:
        bunch.frame = frame
    return bunch


def fetch_movielens(variant, *, data_home=None, download_if_missing=True, return_df=False):
    """Load a MovieLens release, downloading its official zip from GroupLens once.

    The zip is unpacked to ``<data_home>/movielens/`` and deleted. At the first download the
    sha256 of the ratings file is stored next to it (``<file>.sha256``), and every later
    load checks it, so a corrupted cache is detected. No checksum of the zips themselves is
    pinned in this package; the ratings file of latest-small is checked against a pinned hash.

    Parameters
    ----------
    variant : {"100k", "1m", "10m", "20m", "25m", "32m", "latest", "latest-small"}
        The MovieLens release (``https://files.grouplens.org/datasets/movielens/ml-<variant>.zip``).
    data_home : str or path-like, default=None
        Cache folder; defaults to :func:`sklearn.datasets.get_data_home`.
    download_if_missing : bool, default=True
        If False, raise an ``OSError`` instead of downloading a release that is not cached.
    return_df : bool, default=False
        Also return the long-format ratings as ``frame``.

    Returns
    -------
    data : sklearn.utils.Bunch
        As :func:`load_movielens`.

    Raises
    ------
    OSError
        If the release is not cached and cannot (or may not) be downloaded, or if the cached
        ratings file no longer matches its recorded sha256.

    Examples
    --------
    >>> from sklearn_fedmf.datasets import fetch_movielens
    >>> ml = fetch_movielens("1m")  # doctest: +SKIP
    >>> ml.X.shape  # doctest: +SKIP
    (6040, 3706)
    """
    spec = _check_variant(variant)
    root = Path(get_data_home(data_home)) / "movielens"
    target = root / spec.folder / spec.file
    if not target.is_file():
        url = _URL.format(spec.archive)
        hint = (
            f"download {url} by hand, unzip it and call "
            f"load_movielens({variant!r}, path=<unzipped folder>)"
        )
        if not download_if_missing:
            raise OSError(
                f"MovieLens {variant!r} is not in the cache {root} and download_if_missing=False; "
                f"{hint}."
            )
        _download_and_extract(url, root, spec, variant, hint)
        _write_sha256(target)
    _check_cached(target)
    return load_movielens(variant, path=target, return_df=return_df)


def _check_variant(variant):
    if variant not in _VARIANTS:
        raise ValueError(
            f"Unknown MovieLens variant {variant!r}; expected one of {list(_VARIANTS)}."
        )
    return _VARIANTS[variant]


def _find_file(path, spec, variant):
    if path.is_file():
        return path
    candidates = [path / spec.file, path / spec.folder / spec.file]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"MovieLens {variant!r}: expected its ratings file {spec.file!r} at "
        f"{' or '.join(str(c) for c in candidates)}."
    )


def _read(source, spec, variant, name, compression="infer"):
    """Parse a ratings file into a DataFrame with columns userId, movieId, rating, timestamp."""
    if spec.fmt == "csv":
        options = dict(sep=",", usecols=_COLUMNS)
        layout = "a header userId,movieId,rating,timestamp then one comma-separated rating a line"
    elif spec.fmt == "tab":
        options = dict(sep="\t", header=None, names=_COLUMNS)
        layout = "tab-separated lines: user item rating timestamp"
    else:  # "::" separators: split on ":" with the fast C parser and keep every other field
        names = ["userId", "_1", "movieId", "_2", "rating", "_3", "timestamp"]
        options = dict(sep=":", header=None, names=names)
        layout = "lines user::item::rating::timestamp"
    try:
        if spec.fmt != "csv" and isinstance(source, Path):
            _check_fields(source, "\t" if spec.fmt == "tab" else "::")
        dtypes = {**_DTYPES, "_1": np.float32, "_2": np.float32, "_3": np.float32}
        frame = pd.read_csv(source, dtype=dtypes, compression=compression, **options)
        if spec.fmt == "dat" and frame[["_1", "_2", "_3"]].notna().any(axis=None):
            raise ValueError("some fields are separated by a single ':' instead of '::'")
    except (ValueError, TypeError, pd.errors.ParserError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(
            f"MovieLens {variant!r}: could not parse ratings file {name!r} (expected {layout}): "
            f"{message}"
        ) from exc
    return frame[_COLUMNS]


def _check_fields(file, sep):
    """Raise ValueError unless the first line has the 4 fields user, item, rating, timestamp."""
    with open(file, "rb") as fh:
        first = fh.readline().decode("utf-8", "replace").rstrip("\r\n")
    if first and len(first.split(sep)) != 4:
        raise ValueError(
            f"its first line {first[:60]!r} does not have 4 fields separated by {sep!r}"
        )


def _descr(variant, X, path):
    license_text = resources.files(__package__).joinpath("data", _LICENSE).read_text("utf-8")
    if path is None:
        head = (
            "MovieLens latest-small (copy embedded in sklearn_fedmf)\n"
            "========================================================\n\n"
            "Ratings of 610 MovieLens users on 9724 movies (100836 ratings, 0.5 to 5 stars in\n"
            "half-star steps, March 1996 - September 2018). X has users as rows (sorted userId)\n"
            "and movies as columns (sorted movieId); only movies with at least one rating are\n"
            "columns (the release lists 9742 movies, 18 of them only tagged). Every stored\n"
            "entry of X is a rating; absent entries are unobserved.\n"
        )
    else:
        head = (
            f"MovieLens {variant} (read from {path})\n\n"
            f"{X.shape[0]} users, {X.shape[1]} rated movies, {X.nnz} ratings. X has users as rows\n"
            "and movies as columns, both in sorted id order; every stored entry is a rating.\n"
            "The GroupLens conditions of use apply to every MovieLens release:\n"
        )
    return f"{head}\n{license_text}"


def _download(url, dest):
    """Fetch ``url`` into the file ``dest`` (replaced by tests to simulate being offline)."""
    with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
        shutil.copyfileobj(response, out, length=1 << 20)


def _download_and_extract(url, root, spec, variant, hint):
    root.mkdir(parents=True, exist_ok=True)
    archive = root / f"{spec.archive}.zip"
    partial = root / f"{spec.archive}.zip.part"
    try:
        _download(url, partial)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise OSError(f"Could not download MovieLens {variant!r} ({exc}); {hint}.") from exc
    partial.replace(archive)
    try:
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(root)
    except zipfile.BadZipFile as exc:
        raise OSError(f"The download of {url} is not a valid zip ({exc}); {hint}.") from exc
    finally:
        archive.unlink(missing_ok=True)
    target = root / spec.folder / spec.file
    if not target.is_file():
        raise OSError(f"The zip {url} has no {spec.folder}/{spec.file}; {hint}.")
    expected = _RATINGS_SHA256.get(variant)
    if expected is not None and _sha256(target) != expected:
        target.unlink()
        raise OSError(f"The download of {url} does not match its pinned sha256; {hint}.")


def _sha256(file):
    digest = hashlib.sha256()
    with open(file, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_sha256(target):
    try:
        target.with_name(target.name + ".sha256").write_text(_sha256(target) + "\n")
    except OSError:  # a read-only cache is still usable, only unchecked
        pass


def _check_cached(target):
    record = target.with_name(target.name + ".sha256")
    if not record.is_file():  # placed in the cache by hand: trust it on first use
        _write_sha256(target)
        return
    if _sha256(target) != record.read_text().strip():
        raise OSError(
            f"The cached file {target} does not match the sha256 recorded when it was "
            f"downloaded; delete the folder {target.parent} to download it again."
        )
