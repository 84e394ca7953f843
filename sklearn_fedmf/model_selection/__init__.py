"""Splitters for rating matrices and long-format ratings, scorers for rating pairs and top-N
lists, and default search spaces."""

from ._ranking_scorer import make_ranking_scorer
from ._scorers import fold_in_rmse
from ._search import default_search_space
from ._split import train_test_split_ratings
from ._user_split import leave_one_out_split, per_user_holdout

__all__ = [
    "default_search_space",
    "fold_in_rmse",
    "leave_one_out_split",
    "make_ranking_scorer",
    "per_user_holdout",
    "train_test_split_ratings",
]
