"""Tests of sklearn_fedmf.datasets: MovieLens loaders, synthetic generators, partitions."""

import gzip
import hashlib
import shutil
import urllib.error
import zipfile
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from sklearn_fedmf.datasets import (
    _movielens,
    fetch_movielens,
    load_movielens,
    make_binary_tiles,
    make_ratings,
    partition_by_activity,
    partition_fedmf_cases,
    partition_iid,
    partition_label_skew,
    ratings_to_matrix,
)

FIXTURES = Path(__file__).parent / "data" / "movielens"


# ---- ratings_to_matrix -------------------------------------------------------------------


def test_ratings_to_matrix_round_trip():
    rng = np.random.default_rng(0)
    cells = rng.choice(40 * 30, 300, replace=False)
    df = pd.DataFrame(
        {
            "userId": 1000 + 7 * (cells // 30),
            "movieId": np.array([f"m{c:03d}" for c in cells % 30]),
            "rating": rng.integers(0, 6, 300).astype(float),  # zeros are real ratings
        }
    )
    X, user_ids, item_ids = ratings_to_matrix(df)
    assert sp.issparse(X) and X.format == "csr" and X.dtype == np.float64
    assert X.shape == (df.userId.nunique(), df.movieId.nunique()) and X.nnz == 300
    assert (np.diff(user_ids.astype(int)) > 0).all() and list(item_ids) == sorted(item_ids)
    row = np.searchsorted(user_ids, df.userId)
    col = np.searchsorted(item_ids, df.movieId)
    np.testing.assert_array_equal(np.asarray(X[row, col]).ravel(), df.rating)
    # every long row maps back, explicit zeros included
    Xc = X.tocoo()
    back = pd.DataFrame(
        {"userId": user_ids[Xc.row], "movieId": item_ids[Xc.col], "rating": Xc.data}
    )
    pd.testing.assert_frame_equal(
        back.sort_values(["userId", "movieId"]).reset_index(drop=True),
        df.sort_values(["userId", "movieId"]).reset_index(drop=True),
        check_dtype=False,
    )


def test_ratings_to_matrix_tuple_and_columns():
    X, users, items = ratings_to_matrix(([3, 1, 3], [5, 5, 2], [1.0, 2.0, 0.0]))
    np.testing.assert_array_equal(users, [1, 3])
    np.testing.assert_array_equal(items, [2, 5])
    assert X.nnz == 3 and X[1, 0] == 0.0 and X[1, 1] == 1.0 and X[0, 1] == 2.0
    df = pd.DataFrame({"u": [1], "i": [2], "r": [4.5]})
    X, _, _ = ratings_to_matrix(df, user_col="u", item_col="i", rating_col="r")
    assert X[0, 0] == 4.5
    with pytest.raises(ValueError, match="no column"):
        ratings_to_matrix(df)


def test_ratings_to_matrix_rejects_duplicates_and_non_finite():
    df = pd.DataFrame({"userId": [1, 1, 2, 1, 2], "movieId": [1, 1, 3, 1, 3], "rating": [1.0] * 5})
    with pytest.raises(ValueError, match="3 duplicate"):
        ratings_to_matrix(df)
    for bad in (np.nan, np.inf):
        df = pd.DataFrame({"userId": [1, 2], "movieId": [1, 1], "rating": [4.0, bad]})
        with pytest.raises(ValueError, match="NaN or infinite"):
            ratings_to_matrix(df)


# ---- embedded MovieLens and file loaders ----------------------------------------------------


def test_embedded_latest_small():
    ml = load_movielens(return_df=True)
    assert ml.X.shape == (610, 9724) and ml.X.nnz == 100836 and ml.X.format == "csr"
    assert ml.X.data.min() == 0.5 and ml.X.data.max() == 5.0
    np.testing.assert_array_equal(ml.user_ids, np.arange(1, 611))
    assert len(ml.frame) == 100836
    assert list(ml.frame.columns) == ["userId", "movieId", "rating", "timestamp"]
    first = ml.frame.iloc[0]
    i, j = np.searchsorted(ml.user_ids, first.userId), np.searchsorted(ml.item_ids, first.movieId)
    assert ml.X[i, j] == first.rating
    for words in ("revenue-bearing", "same conditions", "endorses", "10.1145/2827872"):
        assert words in ml.DESCR
    assert "frame" not in load_movielens()


def test_embedded_file_matches_pinned_hash():
    source = resources.files("sklearn_fedmf.datasets").joinpath(
        "data", "ml-latest-small-ratings.csv.gz"
    )
    content = gzip.decompress(source.read_bytes())
    digest = hashlib.sha256(content).hexdigest()
    assert digest == _movielens._RATINGS_SHA256["latest-small"]


@pytest.mark.parametrize(
    "variant, path, users, items, dense",
    [
        ("100k", "ml-100k", [22, 186, 196], [242, 302, 377], [[0, 0, 1], [0, 3, 0], [3, 0, 5]]),
        ("1m", "", [1, 2, 3], [260, 661, 1193], [[0, 3, 5], [0, 0, 4], [0, 0, 0]]),
        ("10m", "ml-10M100K/ratings.dat", [1, 7], [122, 185], [[5, 4.5], [0.5, 0]]),
        ("latest-small", "ml-latest-small", [1, 5], [1, 3], [[4, 0.5], [5, 0]]),
        ("25m", "ml-latest-small/ratings.csv", [1, 5], [1, 3], [[4, 0.5], [5, 0]]),
    ],
)
def test_loaders_parse_every_format(variant, path, users, items, dense):
    ml = load_movielens(variant, path=FIXTURES / path, return_df=True)
    np.testing.assert_array_equal(ml.user_ids, users)
    np.testing.assert_array_equal(ml.item_ids, items)
    np.testing.assert_array_equal(ml.X.toarray(), dense)
    assert ml.X.nnz == len(ml.frame)  # a rating of 0 (1m fixture) is still stored
    assert ml.frame.dtypes["timestamp"] == np.int64 and variant in ml.DESCR


@pytest.mark.parametrize(
    "variant, expected", [("1m", "ratings.dat"), ("100k", "u.data"), ("latest", "ratings.csv")]
)
def test_loader_errors_name_the_file(variant, expected, tmp_path):
    with pytest.raises(ValueError, match=f"{variant}.*{expected}"):
        load_movielens(variant, path=FIXTURES / "malformed")
    with pytest.raises(FileNotFoundError, match=f"{variant}.*{expected}"):
        load_movielens(variant, path=tmp_path)
    empty = tmp_path / expected
    empty.write_text("")
    with pytest.raises(ValueError, match=expected):
        load_movielens(variant, path=empty)


def test_loader_rejects_single_colon_and_unknown_variants(tmp_path):
    (tmp_path / "ratings.dat").write_text("1::2::3::4\n1:3:3:4\n")
    with pytest.raises(ValueError, match="ratings.dat"):
        load_movielens("1m", path=tmp_path)
    with pytest.raises(ValueError, match="path="):
        load_movielens("1m")
    with pytest.raises(ValueError, match="Unknown MovieLens variant"):
        load_movielens("2m", path=tmp_path)


# ---- fetch_movielens (never downloads) ------------------------------------------------------


def _no_download(url, dest):
    raise AssertionError(f"tests must not download {url}")


def test_fetch_cache_hit_and_corruption(tmp_path, monkeypatch):
    monkeypatch.setattr(_movielens, "_download", _no_download)
    cached = tmp_path / "movielens" / "ml-1m"
    cached.mkdir(parents=True)
    shutil.copy(FIXTURES / "ml-1m" / "ratings.dat", cached / "ratings.dat")
    ml = fetch_movielens("1m", data_home=tmp_path, download_if_missing=False)
    assert ml.X.shape == (3, 3) and ml.X.nnz == 4
    assert (cached / "ratings.dat.sha256").is_file()  # recorded on first use
    assert fetch_movielens("1m", data_home=tmp_path).X.nnz == 4
    with open(cached / "ratings.dat", "a") as fh:
        fh.write("4::1::2::3\n")
    with pytest.raises(OSError, match="sha256"):
        fetch_movielens("1m", data_home=tmp_path)


def test_fetch_not_cached_without_download(tmp_path, monkeypatch):
    monkeypatch.setattr(_movielens, "_download", _no_download)
    with pytest.raises(OSError, match=r"by hand.*load_movielens\('1m', path="):
        fetch_movielens("1m", data_home=tmp_path, download_if_missing=False)


def test_fetch_offline(tmp_path, monkeypatch):
    def offline(url, dest):
        Path(dest).write_bytes(b"partial")
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(_movielens, "_download", offline)
    with pytest.raises(OSError, match=r"Could not download.*unreachable.*by hand") as info:
        fetch_movielens("10m", data_home=tmp_path)
    assert "\n" not in str(info.value)
    assert not list((tmp_path / "movielens").glob("*.part"))  # no partial file left


def _fake_zip(folder, source, name):
    def download(url, dest):
        assert url == f"https://files.grouplens.org/datasets/movielens/{folder[0]}.zip"
        with zipfile.ZipFile(dest, "w") as zf:
            zf.write(source, f"{folder[1]}/{name}")

    return download


def test_fetch_download_extracts_and_records(tmp_path, monkeypatch):
    source = FIXTURES / "ml-10M100K" / "ratings.dat"
    monkeypatch.setattr(
        _movielens, "_download", _fake_zip(("ml-10m", "ml-10M100K"), source, "ratings.dat")
    )
    ml = fetch_movielens("10m", data_home=tmp_path)
    np.testing.assert_array_equal(ml.X.toarray(), [[5, 4.5], [0.5, 0]])
    root = tmp_path / "movielens"
    assert (root / "ml-10M100K" / "ratings.dat.sha256").is_file()
    assert not list(root.glob("*.zip"))  # the archive is removed after extraction
    # latest-small has a pinned hash: a different ratings.csv is refused
    source = FIXTURES / "ml-latest-small" / "ratings.csv"
    fake = _fake_zip(("ml-latest-small", "ml-latest-small"), source, "ratings.csv")
    monkeypatch.setattr(_movielens, "_download", fake)
    with pytest.raises(OSError, match="pinned sha256"):
        fetch_movielens("latest-small", data_home=tmp_path)


# ---- make_ratings -----------------------------------------------------------------------


def _pairs(X):
    rows = np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))
    return rows * X.shape[1] + X.indices


@pytest.mark.parametrize(
    "shape, kwargs",
    [
        ((300, 120, 6000), {}),
        ((60, 40, 2300), {"popularity": 2.0}),  # heavy users take the exact top-k path
        ((200, 80, 3000), {"popularity": 0.0, "chunk_size": 500}),
    ],
)
def test_make_ratings_counts_and_scale(shape, kwargs):
    data = make_ratings(*shape, random_state=0, **kwargs)
    X = data.X
    X.check_format(full_check=True)
    assert X.shape == shape[:2] and X.nnz == shape[2]
    assert len(np.unique(_pairs(X))) == X.nnz  # distinct (user, item) pairs
    assert np.diff(X.indptr).min() >= 1  # every user has a rating
    assert set(np.unique(X.data)) <= {1.0, 2.0, 3.0, 4.0, 5.0}
    assert data.user_factors.shape == (shape[0], 5) and data.item_factors.shape == (shape[1], 5)


def test_make_ratings_is_deterministic_and_follows_the_model():
    a = make_ratings(500, 100, 8000, noise=0.0, rating_scale=None, random_state=7)
    b = make_ratings(500, 100, 8000, noise=0.0, rating_scale=None, random_state=7)
    c = make_ratings(500, 100, 8000, noise=0.0, rating_scale=None, random_state=8)
    assert (a.X != b.X).nnz == 0 and (a.X != c.X).nnz > 0
    rows = np.repeat(np.arange(500), np.diff(a.X.indptr))
    expected = np.einsum("ij,ij->i", a.user_factors[rows], a.item_factors[a.X.indices])
    np.testing.assert_allclose(a.X.data, expected)
    assert a.offset == 0.0


def test_make_ratings_popularity_skew():
    skewed = make_ratings(2000, 300, 30000, popularity=1.0, random_state=0).X
    flat = make_ratings(2000, 300, 30000, popularity=0.0, random_state=0).X
    per_item = np.bincount(skewed.indices, minlength=300)
    assert per_item.max() > 10 * np.median(per_item)
    per_item_flat = np.bincount(flat.indices, minlength=300)
    assert per_item_flat.max() < 2 * np.median(per_item_flat)


def test_make_ratings_limits():
    assert make_ratings(10, 5, 50, random_state=0).X.nnz == 50  # completely full
    sparse_users = make_ratings(100, 5, 30, random_state=0).X
    assert sparse_users.nnz == 30
    with pytest.raises(ValueError, match="exceeds"):
        make_ratings(10, 5, 51)


# ---- make_binary_tiles ----------------------------------------------------------------------


def test_binary_tiles_planted_product_and_noise_rate():
    data = make_binary_tiles(2000, 300, 6, noise=0.1, random_state=0)
    U, V = data.U, data.V
    assert U.shape == (2000, 6) and V.shape == (6, 300) and U.dtype == bool
    np.testing.assert_array_equal(data.X_clean.toarray(), U @ V)
    assert np.all(data.X.data == 1) and data.X.format == "csr"
    n_cells = 2000 * 300
    flips = (data.X != data.X_signal).nnz
    sd = np.sqrt(n_cells * 0.1 * 0.9)
    assert abs(flips - 0.1 * n_cells) < 5 * sd
    # thinning: about tile_density of the tile cells survive, never outside the tiles
    signal, clean = data.X_signal.toarray() > 0, data.X_clean.toarray() > 0
    assert not (signal & ~clean).any()
    assert 0.85 < signal.sum() / clean.sum() < 0.95
    fractions = U.mean(axis=0)
    assert fractions.min() >= 0.05 and fractions.max() <= 0.2 + 1 / 2000


def test_binary_tiles_disjoint_and_noise_free():
    data = make_binary_tiles(800, 80, 4, noise=0.0, tile_density=1.0, overlap=False, random_state=1)
    assert (data.X != data.X_clean).nnz == 0
    assert data.U.sum(axis=1).max() == 1 and data.V.sum(axis=0).max() == 1
    np.testing.assert_array_equal(data.U.sum(axis=0), [160] * 4)  # 5 groups of 160 rows
    again = make_binary_tiles(800, 80, 4, noise=0.0, overlap=False, random_state=1)
    np.testing.assert_array_equal(again.U, data.U)


# ---- partitions ----------------------------------------------------------------------------


def test_partition_iid():
    labels = partition_iid(103, 10, random_state=0)
    assert labels.shape == (103,)
    sizes = np.bincount(labels)
    assert len(sizes) == 10 and sizes.max() - sizes.min() <= 1
    np.testing.assert_array_equal(labels, partition_iid(103, 10, random_state=0))
    assert (labels != partition_iid(103, 10, random_state=1)).any()
    with pytest.raises(ValueError, match="n_clients"):
        partition_iid(5, 6)


def test_partition_helpers_take_the_data_first():
    # partition_iid takes X (like its siblings) or its number of rows, with the same result
    X = sp.random(103, 20, density=0.2, format="csr", random_state=0)
    np.testing.assert_array_equal(partition_iid(X, 10, random_state=0),
                                  partition_iid(103, 10, random_state=0))
    np.testing.assert_array_equal(partition_iid(X.toarray(), 10, random_state=0),
                                  partition_iid(103, 10, random_state=0))
    for bad in (2.5, True, "100", None):
        with pytest.raises(ValueError, match="pass the data X .* or the number of rows"):
            partition_iid(bad, 2)
    with pytest.raises(ValueError, match="n_rows must be an integer >= 1, got 0"):
        partition_iid(0, 1)
    with pytest.raises(ValueError, match="pass the rating matrix X, got 100"):
        partition_by_activity(100, 10)


def test_partition_by_activity():
    X = make_ratings(400, 100, 8000, random_state=0).X
    activity = np.diff(X.indptr)
    labels = partition_by_activity(X, 8, random_state=0)
    assert labels.shape == (400,) and (np.bincount(labels) == 50).all()
    means = [activity[labels == c].mean() for c in range(8)]
    assert np.all(np.diff(means) >= 0)
    assert activity[labels == 0].max() <= activity[labels == 7].min()
    shuffled = partition_by_activity(X, 8, shuffle=0.5, random_state=0)
    assert (np.bincount(shuffled) == 50).all()
    moved = (shuffled != labels).mean()
    assert 0.3 < moved <= 0.5
    dense = np.full(X.shape, np.nan)
    dense[X.nonzero()] = X.data  # ratings are >= 1: nonzero() finds every stored entry
    np.testing.assert_array_equal(partition_by_activity(dense, 8, random_state=0), labels)


def test_partition_label_skew():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, 3000)
    labels = partition_label_skew(y, 50, classes_per_client=2, random_state=0)
    assert labels.shape == (3000,) and np.bincount(labels, minlength=50).min() > 0
    dominant = []
    for c in range(50):
        counts = np.bincount(y[labels == c], minlength=10)
        dominant.append((counts > 0.1 * counts.sum()).sum())
    assert np.mean(np.array(dominant) <= 2) >= 0.8
    iid = partition_iid(3000, 50, random_state=0)
    assert all(len(np.unique(y[iid == c])) > 2 for c in range(50))  # the check can fail


def test_fedmf_case1_sizes():
    labels = partition_fedmf_cases(np.zeros(1234), 100, case=1, random_state=0)
    sizes = np.bincount(labels)
    assert len(sizes) == 100 and (sizes[:-1] == 12).all() and sizes[-1] == 12 + 34


def test_fedmf_case2_labels_mnist_split():
    proportions = [0.05, 0.05, 0.05, 0.05, 0.10, 0.10, 0.10, 0.15, 0.15, 0.20]
    y = np.repeat(np.arange(10), (10000 * np.array(proportions)).astype(int))
    labels = partition_fedmf_cases(y, 100, case=2, random_state=0)
    assert labels.shape == y.shape and np.bincount(labels).min() > 0
    for c in range(100):
        classes, counts = np.unique(y[labels == c], return_counts=True)
        assert len(classes) == 2  # one shard of each of two different digits
        shard = 10000 * np.array(proportions)[classes] / 20
        np.testing.assert_allclose(counts, shard, atol=1)
    assert np.ptp(np.bincount(labels)) >= 100  # unbalanced clients


def test_fedmf_case2_similarity_splits():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(5, 20)) * 10
    X = np.repeat(centers, 40, axis=0) + rng.normal(size=(200, 20))
    labels = partition_fedmf_cases(X=X, n_clients=5, case=2, random_state=0)
    for c in range(5):  # each blob is one client
        assert len(np.unique(labels[c * 40 : (c + 1) * 40])) == 1
    assert len(np.unique(labels)) == 5
    anchors = partition_fedmf_cases(X=sp.csr_matrix(X), n_clients=5, case=2, method="anchors")
    assert anchors.shape == (200,) and len(np.unique(anchors)) == 5  # an anchor keeps itself
    with pytest.raises(ValueError, match="method"):
        partition_fedmf_cases(np.zeros(200), 5, case=2, X=X)
