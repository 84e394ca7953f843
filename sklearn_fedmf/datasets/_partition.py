"""Client partitions of the rows: iid, by activity, label skew and the FedMAvg/FedMGS cases.

Every function returns an int array of length ``n_rows`` holding the client (0 ..
n_clients - 1) of each row, ready for the ``clients`` fit parameter. The first argument is
what the split looks at: the data ``X`` (:func:`partition_iid` also takes its number of rows
``n_rows`` instead, as it needs nothing else) or, for the label-based splits, the labels ``y``.
"""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.cluster import KMeans
from sklearn.preprocessing import normalize

from .._docstrings import Substitution
from ..engine._client_data import check_int
from ._synthetic import _check_generator

__all__ = [
    "partition_iid",
    "partition_by_activity",
    "partition_label_skew",
    "partition_fedmf_cases",
]


# The Returns section of every partition function.
_RETURNS_CLIENTS = Substitution(returns_clients="""\
Returns
-------
clients : ndarray of shape (n_rows,)
    The client (``0 .. n_clients - 1``) of each row, for ``fit(X, clients=...)``.""")

def _block_sizes(n, k):
    """Sizes of ``k`` nearly equal contiguous blocks of ``n`` items (larger blocks first)."""
    base, extra = divmod(n, k)
    return np.array([base + 1] * extra + [base] * (k - extra), dtype=np.intp)


def _check_clients(n_rows, n_clients):
    n_clients = check_int(n_clients, "n_clients", 1)
    if n_clients > n_rows:
        raise ValueError(
            f"n_clients={n_clients} is larger than the number of rows ({n_rows}): every client "
            "needs at least one row."
        )
    return n_clients


def _n_rows(X, caller):
    """The number of rows of ``X``: a matrix or array (its first axis) or an int ``n_rows``."""
    if isinstance(X, numbers.Integral) and not isinstance(X, bool):
        return check_int(X, "n_rows", 1)
    shape = getattr(X, "shape", None)
    if shape is None and isinstance(X, (list, tuple)):
        shape = (len(X),)
    if not shape or isinstance(X, (bool, numbers.Number)):
        raise ValueError(
            f"{caller} splits the rows of X: pass the data X (a matrix or array whose first "
            f"axis is the rows) or the number of rows as an integer >= 1, got {X!r}."
        )
    return check_int(shape[0], "the number of rows of X", 1)


@_RETURNS_CLIENTS
def partition_iid(X, n_clients, random_state=None):
    """Assign rows to clients uniformly at random, in sizes differing by at most one.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_rows, ...) or int
        The data whose rows are split, or their number ``n_rows`` (only the count is used).
    n_clients : int
        Number of clients, at most ``n_rows``.
    random_state : int, RandomState, Generator or None, default=None
        Seeds the assignment.

    %(returns_clients)s

    Examples
    --------
    >>> from sklearn_fedmf.datasets import partition_iid
    >>> import numpy as np
    >>> np.bincount(partition_iid(10, 3, random_state=0)).tolist()
    [4, 3, 3]
    >>> X = np.ones((10, 4))
    >>> bool((partition_iid(X, 3, random_state=0) == partition_iid(10, 3, random_state=0)).all())
    True
    """
    n_rows = _n_rows(X, "partition_iid")
    n_clients = _check_clients(n_rows, n_clients)
    labels = np.empty(n_rows, dtype=np.intp)
    labels[_check_generator(random_state).permutation(n_rows)] = np.repeat(
        np.arange(n_clients), _block_sizes(n_rows, n_clients)
    )
    return labels


@_RETURNS_CLIENTS
def partition_by_activity(X, n_clients, *, shuffle=0.0, random_state=None):
    """Non-iid split: clients hold users of similar activity (number of ratings).

    Rows are sorted by their number of observed entries (ties in random order) and cut into
    ``n_clients`` contiguous blocks of nearly equal size: client 0 holds the least active
    users. Then a fraction ``shuffle`` of the rows, chosen at random, swap their labels in a
    random permutation (client sizes are kept); ``shuffle=1`` is close to an iid split.

    Parameters
    ----------
    X : {array-like, sparse matrix} of shape (n_rows, n_items)
        Ratings: stored entries (sparse) or non-NaN entries (dense) are observed.
    n_clients : int
        Number of clients, at most ``n_rows``.
    shuffle : float in [0, 1], default=0.0
        Fraction of rows whose labels are randomly permuted.
    random_state : int, RandomState, Generator or None, default=None
        Seeds the order of equally active rows and the shuffled rows.

    %(returns_clients)s

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.datasets import partition_by_activity
    >>> X = np.array([[1, np.nan, np.nan], [1, 2, 3], [np.nan, 4, np.nan], [5, 5, np.nan]])
    >>> partition_by_activity(X, 2, random_state=0).tolist()
    [0, 1, 0, 1]
    """
    if isinstance(X, numbers.Number):
        raise ValueError(
            "partition_by_activity sorts the rows by their number of ratings: pass the rating "
            f"matrix X, got {X!r} (partition_iid takes a number of rows)."
        )
    if sp.issparse(X):
        activity = sp.csr_matrix(X).getnnz(axis=1)
    else:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2:
            raise ValueError(f"X must be 2-dimensional, got shape {X.shape}.")
        activity = (~np.isnan(X)).sum(axis=1)
    if not 0 <= shuffle <= 1:
        raise ValueError(f"shuffle must be in [0, 1], got {shuffle!r}.")
    n_rows = len(activity)
    n_clients = _check_clients(n_rows, n_clients)
    rng = _check_generator(random_state)
    order = np.lexsort((rng.random(n_rows), activity))
    labels = np.empty(n_rows, dtype=np.intp)
    labels[order] = np.repeat(np.arange(n_clients), _block_sizes(n_rows, n_clients))
    moved = rng.choice(n_rows, int(round(shuffle * n_rows)), replace=False)
    labels[moved] = labels[rng.permutation(moved)]
    return labels


@_RETURNS_CLIENTS
def partition_label_skew(y, n_clients, classes_per_client=2, random_state=None):
    """Pathological non-iid split: each client holds rows of mostly a few classes.

    The rows, grouped by class (random order inside a class), are cut into
    ``n_clients * classes_per_client`` contiguous shards of nearly equal size, and every
    client receives ``classes_per_client`` shards at random (McMahan et al., 2017). A
    client thus sees at most ``classes_per_client`` classes, plus the neighbour class when
    a shard straddles a class boundary. Every row is assigned and no client is empty.

    Parameters
    ----------
    y : array-like of shape (n_rows,)
        Class label of each row.
    n_clients : int
        Number of clients.
    classes_per_client : int, default=2
        Shards (hence dominant classes) per client.
    random_state : int, RandomState, Generator or None, default=None
        Seeds the order of the rows inside a class and the shards' owners.

    %(returns_clients)s

    Examples
    --------
    >>> from sklearn_fedmf.datasets import partition_label_skew
    >>> y = [0] * 10 + [1] * 10 + [2] * 10 + [3] * 10
    >>> clients = partition_label_skew(y, 4, classes_per_client=1, random_state=0)
    >>> sorted(len(set(y[i] for i in range(40) if clients[i] == c)) for c in range(4))
    [1, 1, 1, 1]
    """
    y = _check_labels(y)
    n_clients = _check_clients(len(y), n_clients)
    per_client = check_int(classes_per_client, "classes_per_client", 1)
    n_shards = n_clients * per_client
    if n_shards > len(y):
        raise ValueError(
            f"n_clients * classes_per_client = {n_shards} shards need at least as many rows, "
            f"got {len(y)}."
        )
    rng = _check_generator(random_state)
    perm = rng.permutation(len(y))
    rows = perm[np.argsort(y[perm], kind="stable")]
    shard_of_client = rng.permutation(n_shards) // per_client
    labels = np.empty(len(y), dtype=np.intp)
    labels[rows] = np.repeat(shard_of_client, _block_sizes(len(y), n_shards))
    return labels


@_RETURNS_CLIENTS
def partition_fedmf_cases(y=None, n_clients=100, *, case=1, X=None, method=None, random_state=None):
    """The client splits of the FedMAvg/FedMGS experiments (Wang and Chang, Section V).

    - ``case=1`` (iid, balanced): a random permutation of the rows gives
      ``n_rows // n_clients`` rows to each client and the remainder to the last client
      (the reference code). Needs only ``y`` or ``X`` for the number of rows.
    - ``case=2`` (non-iid, unbalanced), one of three ``method``:

      - ``"labels"`` (MNIST, following Li et al.; default when only ``y`` is given): each
        class, in random order, is cut into near-equal shards, ``2 * n_clients`` shards in
        all (20 per class for 10 classes and 100 clients), and every client takes one shard
        of each of two different, randomly chosen classes. The paper's unbalanced class
        proportions (.05, .05, .05, .05, .10, .10, .10, .15, .15, .20) describe how the
        MNIST subset ``y`` is drawn; client sizes then follow from them.
      - ``"kmeans"`` (synthetic, TDT2, TCGA, paper text; default when only ``X`` is given):
        K-means with ``n_clients`` clusters on the rows of ``X``, one cluster per client.
      - ``"anchors"`` (the reference code; the paper's text says K-means): ``n_clients``
        random rows of
        ``X / ||X||`` are anchors, and every row goes to its nearest anchor.

    Parameters
    ----------
    y : array-like of shape (n_rows,), default=None
        Class labels (case 2 with ``method="labels"``).
    n_clients : int, default=100
        The paper's P.
    case : {1, 2}, default=1
        1: the iid, balanced split; 2: the non-iid, unbalanced split made by ``method``.
    X : {array-like, sparse matrix} of shape (n_rows, n_features), default=None
        Samples (case 2 with ``method="kmeans"`` or ``"anchors"``).
    method : {"labels", "kmeans", "anchors"} or None, default=None
        Case-2 construction; None picks from whichever of ``y`` and ``X`` is given.
    random_state : int, RandomState, Generator or None, default=None
        Seeds case 1's assignment and case 2's construction.

    %(returns_clients)s

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf.datasets import partition_fedmf_cases
    >>> np.bincount(partition_fedmf_cases(np.zeros(1005), case=1, random_state=0))[-2:].tolist()
    [10, 15]
    """
    if y is None and X is None:
        raise ValueError("Pass the labels y or the samples X.")
    n_rows = len(y) if y is not None else X.shape[0]
    n_clients = _check_clients(n_rows, n_clients)
    rng = _check_generator(random_state)
    if case == 1:
        labels = np.empty(n_rows, dtype=np.intp)
        labels[rng.permutation(n_rows)] = np.minimum(
            np.arange(n_rows) // (n_rows // n_clients), n_clients - 1
        )
        return labels
    if case != 2:
        raise ValueError(f"case must be 1 or 2, got {case!r}.")
    if method is None:
        if (y is None) == (X is None):
            raise ValueError('Both y and X given: choose method="labels", "kmeans" or "anchors".')
        method = "labels" if y is not None else "kmeans"
    if method == "labels":
        if y is None:
            raise ValueError('method="labels" needs the class labels y.')
        return _two_class_shards(_check_labels(y), n_clients, rng)
    if method not in ("kmeans", "anchors"):
        raise ValueError(f'method must be "labels", "kmeans" or "anchors", got {method!r}.')
    if X is None:
        raise ValueError(f"method={method!r} needs the samples X.")
    if method == "kmeans":
        kmeans = KMeans(n_clients, n_init=1, random_state=int(rng.integers(2**31 - 1)))
        return kmeans.fit_predict(X).astype(np.intp)
    # nearest anchor on the unit sphere = largest cosine similarity (= largest RBF affinity)
    Xn = normalize(X)
    similarity = Xn @ Xn[rng.choice(n_rows, n_clients, replace=False)].T
    if sp.issparse(similarity):
        similarity = similarity.toarray()
    return np.argmax(similarity, axis=1).astype(np.intp)


def _check_labels(y):
    y = np.asarray(y)
    if y.ndim != 1 or len(y) == 0:
        raise ValueError(f"y must be a non-empty 1-d array of labels, got shape {y.shape}.")
    return y


def _two_class_shards(y, n_clients, rng):
    """Case 2 of Wang and Chang's Section V (MNIST): 2 * n_clients class shards, two distinct
    classes per client."""
    classes, codes = np.unique(y, return_inverse=True)
    n_classes = len(classes)
    if n_classes < 2:
        raise ValueError("method='labels' needs at least two classes in y.")
    sizes = _block_sizes(2 * n_clients, n_classes)  # near-equal; extras to random classes
    shards_per_class = sizes[rng.permutation(n_classes)]
    class_sizes = np.bincount(codes, minlength=n_classes)
    if (class_sizes < shards_per_class).any():
        raise ValueError(
            f"Every class needs at least {shards_per_class.max()} rows to be cut into shards; "
            f"the smallest class has {class_sizes.min()}."
        )
    shard_class = np.repeat(np.arange(n_classes), shards_per_class)
    pairs = rng.permutation(2 * n_clients).reshape(n_clients, 2)
    # Repair clients holding one class twice: swap one of their shards with the first shard
    # of a random client without that class. One always exists: a class has <= P shards.
    pair_class = shard_class[pairs]
    for i in np.flatnonzero(pair_class[:, 0] == pair_class[:, 1]):
        a = pair_class[i, 0]
        if pair_class[i, 1] != a:  # already repaired by an earlier swap
            continue
        while True:
            j = rng.integers(n_clients)
            if a not in pair_class[j]:
                break
        pairs[i, 1], pairs[j, 0] = pairs[j, 0], pairs[i, 1]
        pair_class[i, 1], pair_class[j, 0] = pair_class[j, 0], a
    client_of_shard = np.empty(2 * n_clients, dtype=np.intp)
    client_of_shard[pairs.ravel()] = np.repeat(np.arange(n_clients), 2)
    labels = np.empty(len(y), dtype=np.intp)
    first_shard = np.cumsum(shards_per_class) - shards_per_class
    for c in range(n_classes):
        rows = rng.permutation(np.flatnonzero(codes == c))
        sizes = _block_sizes(len(rows), shards_per_class[c])
        labels[rows] = np.repeat(client_of_shard[first_shard[c] + np.arange(len(sizes))], sizes)
    return labels
