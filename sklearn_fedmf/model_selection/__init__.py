"""Splitters for rating matrices."""

from ._split import train_test_split_ratings

__all__ = ["train_test_split_ratings"]
