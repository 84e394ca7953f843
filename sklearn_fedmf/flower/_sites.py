"""What both sides of a Flower federation need without Flower: the supported estimators, the
parameters that travel, a site's ratings file and its client block.

Nothing here imports ``flwr``, so ``fedmf flower-split`` works on any Python.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp
from sklearn.utils import get_tags

from ..binary._base import check_binary_data
from ..completion._base import FederatedMFBase
from ..completion._validation import aggregate_info, rating_scales
from ..engine._client_data import center_and_scale, check_ratings, split_clients
from ..engine._fit import FitContext, FitInfo, fit_protocol, fit_settings
from ..privacy import LocalDP
from ..privacy._local_dp import LocalDPMixin, fit_privacy_settings

__all__ = ["estimator_class", "fit_context", "load_site", "make_site_protocol", "site_block",
           "site_estimator", "split_sites", "travelling_params"]

# Parameters that configure the local process only; they never travel to the sites.
_LOCAL_PARAMS = ("callback", "n_jobs", "verbose", "random_state", "warm_start",
                 "on_client_error")


def _supported():
    from ..binary import Felb
    from ..completion import FedMAvg, FedMCADMM, FedMGS, RFRec

    return {cls.__name__: cls for cls in (FedMCADMM, FedMAvg, FedMGS, RFRec, Felb)}


def estimator_class(name):
    """The estimator class called ``name`` among those that run on Flower."""
    classes = _supported()
    if name not in classes:
        raise ValueError(
            f"{name!r} cannot run on Flower; choose one of {sorted(classes)}."
        )
    return classes[name]


def travelling_params(estimator):
    """The estimator's parameters that a site needs to rebuild the protocol (numbers,
    strings, booleans, None, and lists or tuples of those)."""
    params = {k: v for k, v in estimator.get_params(deep=False).items()
              if k not in _LOCAL_PARAMS}
    if isinstance(params.get("privacy"), LocalDP):  # travels as its own parameters
        params["privacy"] = params["privacy"].get_params()

    def plain(v):
        if isinstance(v, (list, tuple)):
            return all(plain(x) for x in v)
        if isinstance(v, dict):
            return all(plain(x) for x in v.values())
        return v is None or isinstance(v, (bool, int, float, str, np.number))

    bad = sorted(k for k, v in params.items() if not plain(v))
    if bad:
        raise ValueError(f"The parameters {bad} of {type(estimator).__name__} cannot travel to "
                         "the sites: only numbers, strings, booleans and None can.")
    return params


def site_estimator(name, params):
    """The estimator ``name`` rebuilt from its :func:`travelling_params` on a site."""
    params = dict(params)
    if isinstance(params.get("privacy"), dict):
        params["privacy"] = LocalDP(**params["privacy"])
    return estimator_class(name)(**params)


def fit_context(estimator, *, n_items, n_clients, n_users, mean, rating_range, n_ratings,
                sum_squares=None, entropy=0):
    """The ``FitContext`` a simulated fit would hand the estimator's hooks, built from the
    sites' aggregates (rows, rating sum and count, rating range) instead of the data.

    Sets the attributes the protocol and the site's centring depend on (``mean_``,
    ``rating_range_``, ``n_users_``, ``n_features_in_``). The server and every site call
    this with the same values, so both make the same protocol.
    """
    estimator_class(type(estimator).__name__)  # a supported estimator
    settings = fit_settings(estimator)  # (resolved once, as a fit does)
    estimator.n_features_in_ = int(n_items)
    if isinstance(estimator, FederatedMFBase):
        info = aggregate_info(estimator, settings, n_users=n_users, mean=mean,
                              rating_range=rating_range, n_ratings=n_ratings,
                              sum_squares=sum_squares)
    else:  # Felb
        info = {}
    if isinstance(estimator, LocalDPMixin):  # the upload noise
        info["privacy"] = fit_privacy_settings(estimator, int(n_items))
    no_ratings = sp.csr_matrix((0, int(n_items)))  # the server holds none
    return FitContext(no_ratings, int(n_users), int(n_items), int(n_clients), None, None,
                      int(entropy), False, FitInfo(**info, deployed=True), settings,
                      # (the sites do the clients' work: the engine ignores it)
                      n_jobs=estimator.n_jobs)


def make_site_protocol(estimator, **aggregates):
    """The estimator's protocol for the federation described by ``aggregates`` (the
    keywords of :func:`fit_context`), secure when ``secure_aggregation`` asks for it."""
    return fit_protocol(estimator, fit_context(estimator, **aggregates))


def site_block(estimator, X, X_eval=None):
    """The client block of a site's ratings, exactly as the simulation cuts it.

    ``X`` holds the site's rows (users) over the federation's items; the ratings are put on
    the fit's scale as the estimator's fit puts its clients' (centred by ``mean_`` when the
    estimator centres; RFRec: divided by ``rating_scale_``), ``estimator`` set by
    :func:`fit_context`. Binary data (Felb) is checked as ``Felb.fit`` checks it.
    """
    codes = np.zeros(X.shape[0], dtype=np.intp)
    if not isinstance(estimator, FederatedMFBase):
        if X_eval is not None:
            raise ValueError(f"{type(estimator).__name__} takes no held-out data (eval-data).")
        return split_clients(check_binary_data(estimator, X, reset=True), codes, 1)[0]
    # the dtypes the estimator's solver runs in (float32 where supported), as in its fit
    kept = get_tags(estimator).transformer_tags.preserves_dtype
    X = check_ratings(X, dtype=X.dtype if X.dtype in kept else np.float64)
    if X_eval is not None:
        X_eval = check_ratings(X_eval, name="eval-data", dtype=X.dtype)
        if X_eval.shape != X.shape:
            raise ValueError(
                f"The held-out ratings have shape {X_eval.shape}, the site's ratings "
                f"{X.shape}: they must cover the same rows and items."
            )
    center_and_scale(*rating_scales(estimator), X, X_eval)
    return split_clients(X, codes, 1, X_eval)[0]


def load_site(path, n_items=None):
    """A site's ratings: a scipy CSR ``.npz`` file, or a CSV of ``user,item,rating`` lines
    (``item`` a column index below ``n_items``; rows in ascending user order)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"The site's ratings file {str(path)!r} does not exist.")
    if path.suffix == ".npz":
        return sp.load_npz(path).tocsr()
    if n_items is None:
        raise ValueError(f"A CSV ratings file ({path.name}) needs n-items in the node config.")
    table = pd.read_csv(path)
    missing = {"user", "item", "rating"} - set(table.columns)
    if missing:
        raise ValueError(f"{path.name} lacks the column(s) {sorted(missing)}.")
    if table.duplicated(["user", "item"]).any():
        raise ValueError(f"{path.name} rates some (user, item) pair twice.")
    users, rows = np.unique(table["user"].to_numpy(), return_inverse=True)
    items = table["item"].to_numpy()
    if items.size and (items.min() < 0 or items.max() >= n_items):
        raise ValueError(f"{path.name} has item indices outside [0, {n_items}).")
    return sp.csr_matrix((table["rating"].to_numpy(dtype=float), (rows, items)),
                         shape=(users.size, int(n_items)))


def split_sites(X, clients, out_dir, X_eval=None):
    """Write one ``site-<i>.npz`` per client label (and ``site-<i>-eval.npz`` for ``X_eval``).

    Rows keep their order inside each site, so a Flower fit equals the simulated fit with
    ``clients=clients``. Returns the written training files, in client order.

    Examples
    --------
    >>> import tempfile
    >>> import scipy.sparse as sp
    >>> from sklearn_fedmf.flower import load_site, split_sites
    >>> X = sp.random(6, 4, density=0.5, format="csr", random_state=0)
    >>> paths = split_sites(X, [0, 1, 0, 1, 0, 1], tempfile.mkdtemp())
    >>> [p.name for p in paths]
    ['site-0.npz', 'site-1.npz']
    >>> load_site(paths[1]).shape
    (3, 4)
    """
    X = check_ratings(X)
    labels, codes = np.unique(np.asarray(clients), return_inverse=True)
    if codes.shape[0] != X.shape[0]:
        raise ValueError(f"clients has {codes.shape[0]} labels for {X.shape[0]} rows.")
    if X_eval is not None:
        X_eval = check_ratings(X_eval, name="eval")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for c in range(labels.size):
        rows = np.flatnonzero(codes == c)
        paths.append(out_dir / f"site-{c}.npz")
        sp.save_npz(paths[-1], X[rows], compressed=False)
        if X_eval is not None:
            sp.save_npz(out_dir / f"site-{c}-eval.npz", X_eval[rows], compressed=False)
    return paths
