"""Splitters for rating matrices, scorers for rating pairs and default search spaces."""

from ._scorers import fold_in_rmse
from ._search import default_search_space
from ._split import train_test_split_ratings

__all__ = ["default_search_space", "fold_in_rmse", "train_test_split_ratings"]
