"""Datasets: MovieLens (embedded latest-small, file loaders, fetcher), synthetic generators
and client partitions of the rows."""

from ._movielens import fetch_movielens, load_movielens, ratings_to_matrix
from ._partition import (
    partition_by_activity,
    partition_fedmf_cases,
    partition_iid,
    partition_label_skew,
)
from ._synthetic import make_binary_ratings, make_binary_tiles, make_ratings

__all__ = [
    "fetch_movielens",
    "load_movielens",
    "make_binary_ratings",
    "make_binary_tiles",
    "make_ratings",
    "partition_by_activity",
    "partition_fedmf_cases",
    "partition_iid",
    "partition_label_skew",
    "ratings_to_matrix",
]
