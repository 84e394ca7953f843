"""Splitters for rating matrices and default search spaces."""

from ._search import default_search_space
from ._split import train_test_split_ratings

__all__ = ["default_search_space", "train_test_split_ratings"]
