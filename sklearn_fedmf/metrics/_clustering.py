"""Clustering accuracy: the best one-to-one relabelling of the clusters (Hungarian matching)."""

from scipy.optimize import linear_sum_assignment
from sklearn.metrics.cluster import contingency_matrix
from sklearn.utils.validation import check_consistent_length, column_or_1d

__all__ = ["clustering_accuracy"]


def clustering_accuracy(y_true, y_pred):
    """Fraction of samples whose cluster maps to their class under the best matching.

    ``ACC = max_map (1/n) sum_j 1[y_true_j = map(y_pred_j)]`` over one-to-one maps from
    predicted clusters to classes (Cai et al., the metric of Wang and Chang's Section V), solved by
    the Hungarian algorithm on the contingency table. The numbers of clusters and classes
    may differ: unmatched clusters count as errors.

    Parameters
    ----------
    y_true : array-like of shape (n_samples,)
        Ground-truth class labels (any hashable values).
    y_pred : array-like of shape (n_samples,)
        Cluster labels to evaluate.

    Returns
    -------
    accuracy : float
        In [0, 1]; 1 means the clustering equals the classes up to a relabelling.

    Examples
    --------
    >>> from sklearn_fedmf.metrics import clustering_accuracy
    >>> clustering_accuracy([0, 0, 1, 1, 2, 2], [1, 1, 0, 0, 2, 2])
    1.0
    >>> clustering_accuracy([0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1])
    0.8333333333333334
    """
    y_true = column_or_1d(y_true)
    y_pred = column_or_1d(y_pred)
    check_consistent_length(y_true, y_pred)
    if y_true.size == 0:
        raise ValueError("clustering_accuracy needs at least one sample.")
    table = contingency_matrix(y_true, y_pred)  # classes x clusters
    rows, cols = linear_sum_assignment(table, maximize=True)
    return float(table[rows, cols].sum() / y_true.size)
