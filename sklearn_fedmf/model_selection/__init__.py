"""Splitters for rating matrices and scorers for rating pairs."""

from ._scorers import fold_in_rmse
from ._split import train_test_split_ratings

__all__ = ["fold_in_rmse", "train_test_split_ratings"]
