"""Datasets: MovieLens (embedded latest-small, file loaders, fetcher), synthetic generators
(planted low rank; site-like, bias-dominated) and client partitions of the rows."""

from ._movielens import fetch_movielens, load_movielens, ratings_to_matrix
from ._partition import (
    partition_by_activity,
    partition_fedmf_cases,
    partition_iid,
    partition_label_skew,
)
from ._site_like import SITE_PRESETS, make_site_ratings
from ._synthetic import make_binary_ratings, make_binary_tiles, make_ratings

__all__ = [
    "SITE_PRESETS",
    "fetch_movielens",
    "load_movielens",
    "make_binary_ratings",
    "make_binary_tiles",
    "make_ratings",
    "make_site_ratings",
    "partition_by_activity",
    "partition_fedmf_cases",
    "partition_iid",
    "partition_label_skew",
    "ratings_to_matrix",
]
