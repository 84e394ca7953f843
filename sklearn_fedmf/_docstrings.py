"""The shared parameters' documentation, written once and substituted into each class.

A parameter that means the same in several estimators is described here, and a class's
docstring names the description on a line of its own (imbalanced-learn's ``Substitution``
pattern)::

    @Substitution(**SHARED_PARAMETERS)
    class MyEstimator(...):
        '''...
        Parameters
        ----------
        max_iter : int, default=100
            %(max_iter)s
        '''

The header line (type and default) stays in the class, next to its signature; only the
description is shared, so it cannot say one thing in one class and another elsewhere. The
parameters whose header is the same in every class (``SHARED_HEADERS``: ``callback``,
``random_state``, ``n_jobs``...) are written whole, header included, by
:func:`parameter_entries` (``tests/test_docstrings.py`` checks each header's default against
the signature). A key of ``solver_params`` that several classes share is written as a sub-list
item by :func:`solver_key`. Substitution is by whole lines (:func:`fill_doc`), so the text may hold
``%`` signs and keeps the indentation of the line it replaces.
"""

from __future__ import annotations

__all__ = ["SHARED_HEADERS", "SHARED_PARAMETERS", "Substitution", "federation_keys",
           "fill_doc", "pairs_example", "parameter_entries", "solver_key", "toy_example"]

SHARED_PARAMETERS = {
    "n_components": "Rank ``r`` of the factorization.",
    "n_clients": (
        "Number of clients ``p`` the rows are split into when ``clients`` is not given to "
        "fit."),
    "partition": (
        "How rows are assigned to ``n_clients`` clients when ``clients`` is not given to fit\n"
        "(``\"random\"`` is seeded by ``random_state``; ``\"contiguous\"`` keeps row order)."),
    "clients_per_round": (
        "Clients drawn each round: a count, a fraction in (0, 1], or None for all."),
    "max_iter": "Communication rounds.",
    "tol": (
        "Stop when the relative change of the objective falls below ``tol``; 0 runs every\n"
        "round. With early stopping, ``tol`` is instead the least decrease of the validation\n"
        "RMSE that counts as an improvement (as in scikit-learn's ``HistGradientBoosting*``)."),
    "early_stopping": (
        "Federated validation (see the user guide, Validation and early stopping): each\n"
        "client holds out ``validation_fraction`` of its own ratings; every round, each\n"
        "client reports its squared-error sum and count on them (two numbers, counted in\n"
        "``bytes_uploaded``); the fit stops when the validation RMSE has not improved by more\n"
        "than ``tol`` for ``n_iter_no_change`` evaluations and keeps **the best validated\n"
        "round's model** (the server's ``V`` and item biases, each client's ``U_i`` and user\n"
        "biases). With ``biased=True``, the kept model is compared with the federated\n"
        "biases-only model (:class:`~sklearn_fedmf.FedBaseline`) on the validation ratings\n"
        "with evidence: its gain in mean squared error must exceed one standard error of\n"
        "that gain, computed with the users as the sample's units (each client sends five\n"
        "sums over its users of the paired differences of squared errors, summable under\n"
        "secure aggregation; :mod:`sklearn_fedmf.completion._validation`); otherwise the\n"
        "factor part is dropped (``factors_used_ = False``, a\n"
        ":class:`~sklearn_fedmf.exceptions.DegenerateFitWarning`) and the biases-only model,\n"
        "refitted on all the training ratings, is kept. ``\"auto\"``: on when ``X``\n"
        "holds at least 10,000 ratings (as ``HistGradientBoostingRegressor``) and\n"
        "``validation_fraction`` is set. An eval set given to ``fit`` stays a report\n"
        "(``eval_rmse``) beside the validation; with ``early_stopping=True`` and\n"
        "``validation_fraction=None`` it is the validation set instead (scikit-learn's\n"
        "``X_val``). Off (or ``\"auto\"`` on fewer ratings), the fit is exactly the one\n"
        "without these parameters."),
    "validation_fraction": (
        "The fraction of each client's ratings it holds out for validation (drawn from the\n"
        "client's own seed, so the split does not depend on ``n_jobs`` or the backend; every\n"
        "user keeps at least one rating for training). Only used with early stopping; None\n"
        "turns ``\"auto\"`` off, and with ``early_stopping=True`` needs\n"
        "``fit(eval_set=...)``."),
    "n_iter_no_change": (
        "Evaluated rounds without an improvement of the validation RMSE before the fit\n"
        "stops (early stopping only). A fit that has not yet beaten its first evaluated\n"
        "round is in its start-up (factors growing from small values can raise the\n"
        "validation error for tens of rounds) and is not stopped."),
    "validation_attributes": (
        "best_iteration_ : int\n"
        "    The round whose model is kept: the best validated round with early stopping,\n"
        "    else the last round (``n_iter_``).\n"
        "validation_score_ : ndarray of shape (n_evaluations,)\n"
        "    Negative validation RMSE of each evaluated round (greater is better, as\n"
        "    ``score``); empty without early stopping. ``history_[k][\"validation_rmse\"]``\n"
        "    holds the RMSE.\n"
        "best_validation_score_ : float or None\n"
        "    Negative validation RMSE of the kept model (None without early stopping).\n"
        "factors_used_ : bool\n"
        "    False when the validation kept the biases alone (the factors are then zero)."),
    "callback": "``callback(round, info)`` after each round; returning True stops the fit.",
    "warm_start": "Continue from the previous fit's state for ``max_iter`` more rounds.",
    "random_state": (
        "Seeds the partition, the initialization and every round's sampling (one\n"
        "``SeedSequence`` spawned per round and client; no global random state)."),
    "n_jobs": (
        "Parallel local updates (joblib; threads unless a backend is configured). The model\n"
        "does not depend on it. A round whose clients run in one batch (one sampled client, or\n"
        "too little work to dispatch) splits their row kernels over the ``n_jobs`` threads.\n"
        "``None`` outside a ``joblib.parallel_config`` block: from 300,000 stored ratings, one\n"
        "thread per physical core (as scikit-learn's OpenMP estimators; ``numba.set_num_threads``\n"
        "lowers it), below, the calling thread; ``1``: always the calling thread."),
    "verbose": "1 shows a progress bar, 2 a line per round.",
    "secure_aggregation": (
        "Sum every round's uploads by secure aggregation (SecAgg+ over the transport,\n"
        ":mod:`sklearn_fedmf.secure`): the server learns the sum and no single upload, and the\n"
        "model equals the plain fit's within the fixed-point encoding's bound. A\n"
        ":class:`~sklearn_fedmf.secure.SecureAggregation` sets the encoding and the neighbour\n"
        "degree. ``history_`` then holds ``bytes_secure`` and ``bytes_secure_client`` (bytes of\n"
        "each phase) and ``secure``: what each party computed and sent per exchange and phase\n"
        "(server seconds, clients' median and max seconds and bytes; the layout is in\n"
        ":mod:`sklearn_fedmf.secure._costs`). Needs ``cryptography``; an algorithm whose\n"
        "server needs more than sums refuses it with a ``ValueError`` (see the user guide,\n"
        "secure aggregation)."),
    "on_client_error": (
        "An exception in a client's code raises a\n"
        ":class:`~sklearn_fedmf.exceptions.ClientError` naming the client and the round.\n"
        "``\"skip\"``, for deployments that must tolerate failing clients: the client keeps its\n"
        "previous state for that round and counts in ``history_``'s ``n_failed``, a\n"
        ":class:`~sklearn_fedmf.exceptions.ClientFailureWarning` is raised once per fit, and a\n"
        "round in which every sampled client failed raises\n"
        ":class:`~sklearn_fedmf.exceptions.FederationError`."),
    "clip": (
        "Clip predictions (``predict``, ``score``, and through\n"
        ":class:`~sklearn_fedmf.RatingRegressor` its pairs and ``recommend`` scores) to the\n"
        "training rating range ``rating_range_``, as Surprise does; False gives the raw model."),
    "biased": (
        "Fit a bias per user and per item: the prediction is ``mean_ + b_u + b_i + u . v``.\n"
        "The factors become ``[U, b_u, 1]`` and ``[V; 1; b_i]`` with the fixed entries held\n"
        "by indicator functions in the regularizers (their prox is the projection onto 1), so\n"
        "the algorithm runs unchanged on rank ``n_components + 2``. ``b_u`` stays on its\n"
        "client like its user factors; ``b_i`` travels and is aggregated as ``V`` (its bytes\n"
        "counted)."),
    "loss": (
        "``\"squared\"``: the papers' loss on the observed ratings. ``\"implicit\"``: weighted\n"
        "matrix factorization over every user-item pair (Hu, Koren & Volinsky 2008): each stored\n"
        "entry ``r`` of ``X`` is an interaction (preference 1, confidence ``1 + confidence * r``,\n"
        "``solver_params[\"confidence\"]``), every other pair a preference 0 of confidence 1.\n"
        "The unobserved pairs enter through Grams (the server broadcasts ``V^T V``, a client's\n"
        "all-items term is ``U_p^T U_p``), so a client's work stays O(its interactions x r^2 +\n"
        "r^3). Under it ``biased``, ``center`` and ``clip`` are ignored (no bias, no mean):\n"
        "``predict`` gives preference scores, ``score`` the NDCG at 10 of full rankings, and\n"
        "``RatingRegressor.recommend`` ranks by the scores. User guide: Top-N recommendation."),
    "confidence": (
        "``loss=\"implicit\"`` only: the confidence of an interaction of strength ``r`` is\n"
        "``1 + confidence * r`` (``alpha`` of ``implicit``'s ALS). ``\"auto\"``: one over the\n"
        "mean strength of the training interactions (the mean interaction weighs 2, in any\n"
        "unit of strength; each client sends its strengths' sum and count). The value used\n"
        "is ``confidence_``."),
    "elastic_net": (
        "The regularizer of a factor is ``alpha * l1_ratio * ||.||_1 + 0.5 * alpha *\n"
        "(1 - l1_ratio) * ||.||_F^2``, as in :class:`~sklearn.decomposition.NMF`."),
    "regularization": (
        "``\"plain\"``: the papers' penalties, one strength for every row. ``\"weighted\"``:\n"
        "ALS-WR's weighted lambda, each user's row scaled by its number of ratings and each\n"
        "item's by its number of ratings (``alpha_u`` and ``alpha_v`` are then strengths per\n"
        "rating). The server learns the item counts once: every client sends its ratings per\n"
        "item in round 1 (counted in its bytes)."),
    "dropout": (
        "Probability that a sampled client fails in a round (simulated: it keeps its state\n"
        "and sends nothing); failures are counted in ``history_``'s ``n_failed`` whatever\n"
        "``on_client_error`` says."),
    "eval_every": (
        "Record the objective and RMSEs every ``eval_every`` rounds (0 never; each record\n"
        "costs one pass over every client's ratings)."),
    "validation_panel": (
        "Who reports early stopping's validation when a round samples its clients: a panel\n"
        "drawn once from ``random_state``, in blocks of at most ``clients_per_round``\n"
        "clients. ``\"auto\"``: grown at the first evaluation until the validation MSE's\n"
        "relative standard error is at most 2 %; an int: that many clients; None: every\n"
        "client at every evaluation. With every client in every round, every client\n"
        "reports whatever it says (the user guide: Validation and early stopping)."),
    "missing_values": (
        "The placeholder of a missing rating in dense ``X`` (NaN by default; 0 for a matrix\n"
        "where 0 means \"not rated\"), as in :class:`~sklearn.impute.SimpleImputer`. In sparse\n"
        "input every stored entry is a rating, an explicit 0 included."),
    "center": (
        "Subtract the global training mean (from each client's rating sum and count) before\n"
        "factorizing; False is the papers' raw objective."),
    "l1_ratio": "Mix of the elastic net: 0 is squared l2, 1 is l1 (soft-thresholding).",
    "positive": "Constrain both factors to be nonnegative (refused with ``biased=True``).",
    "binarize": (
        "None: ``X`` must be binary (a ValueError otherwise). A float maps every entry to\n"
        "``x > binarize`` first, as :class:`~sklearn.naive_bayes.BernoulliNB` does (e.g. 3.25\n"
        "keeps ratings >= 3.5 of a rating matrix)."),
    "init_scale": (
        "Factors start i.i.d. ``init_scale * Uniform[0, 1)`` (0: at the zero saddle, where\n"
        "they stay; with ``biased=True`` only the biases are then fitted)."),
    "solver_params": (
        "The papers' step constants, variant switches and simulation settings, one key each\n"
        "(listed below with its default); None, or a missing key, keeps the default. Checked\n"
        "at fit: an unknown key or a bad value raises an error that lists the keys. The\n"
        "papers' exact settings are ``PAPER_SETTINGS`` (:mod:`sklearn_fedmf.completion`)."),
    # a reference cited by several classes (FedMAvg, FedMGS, FederatedClustering)
    "wang_chang_2022": (
        "S. Wang and T.-H. Chang. Federated Matrix Factorization: Algorithm Design and\n"
        "Application to Data Clustering. IEEE Trans. Signal Process., 2022."),
}

# The numpydoc header (type and default) of the shared parameters that have the same default
# in every class that takes them.
SHARED_HEADERS = {
    "clip": "bool, default=True",
    "callback": "callable, default=None",
    "warm_start": "bool, default=False",
    "random_state": "int, RandomState instance or None, default=None",
    "n_jobs": "int, default=None",
    "verbose": "int, default=0",
    "solver_params": "dict or None, default=None",
    "early_stopping": "'auto' or bool, default='auto'",  # (scikit-learn's HistGradientBoosting)
    "validation_fraction": "float or None, default=0.1",
    "n_iter_no_change": "int, default=10",
    "secure_aggregation": "bool or SecureAggregation, default=False",
    "binarize": "float or None, default=None",
}


def parameter_entries(*names):
    """The numpydoc entries of shared parameters: ``name : SHARED_HEADERS[name]`` and its
    indented ``SHARED_PARAMETERS[name]``, one after another."""
    return "\n".join(f"{name} : {SHARED_HEADERS[name]}\n"
                     + "\n".join("    " + line for line in SHARED_PARAMETERS[name].splitlines())
                     for name in names)


def solver_key(name, spec, text=None):
    """A ``solver_params`` sub-list item: ``- ``name`` : spec`` and its description
    (``SHARED_PARAMETERS[name]`` unless ``text`` is given), continuation lines aligned."""
    body = SHARED_PARAMETERS[name] if text is None else text
    return f"- ``{name}`` : {spec}\n" + "\n".join("  " + line for line in body.splitlines())


def federation_keys():
    """The ``solver_params`` sub-list items every estimator shares: ``partition`` and
    ``on_client_error`` (how rows become clients; what a failing client does)."""
    return "\n".join([solver_key("partition", '{"random", "contiguous"}, default="random"'),
                      solver_key("on_client_error", '{"raise", "skip"}, default="raise"')])


def fill_doc(doc, **parts):
    """``doc`` with every line ``%(name)s`` replaced by ``parts[name]`` at its indentation."""
    lines = []
    for line in doc.splitlines():
        name = line.strip()
        if name.startswith("%(") and name.endswith(")s") and name[2:-2] in parts:
            indent = line[:len(line) - len(line.lstrip())]
            lines.extend(indent + part if part else part
                         for part in parts[name[2:-2]].splitlines())
        else:
            lines.append(line)
    return "\n".join(lines)


class Substitution:
    """Decorator filling the ``%(name)s`` lines of a docstring (see the module docstring).

    Parameters
    ----------
    **parts : str
        The text of each name.

    Examples
    --------
    >>> from sklearn_fedmf._docstrings import SHARED_PARAMETERS, Substitution
    >>> @Substitution(**SHARED_PARAMETERS)
    ... def f(max_iter=100):
    ...     '''Parameters
    ...     ----------
    ...     max_iter : int, default=100
    ...         %(max_iter)s
    ...     '''
    >>> print(f.__doc__.splitlines()[3].strip())
    Communication rounds.
    """

    def __init__(self, **parts):
        self.parts = parts

    def __call__(self, obj):
        if obj.__doc__:
            obj.__doc__ = fill_doc(obj.__doc__, **self.parts)
        return obj


def toy_example(name, *, max_iter, alpha, bound):
    """The Examples section of a factor model: ``name`` fits a noise-free rank-2 toy with 40 %
    of its entries missing to an RMSE below ``bound``, with strengths ``alpha``."""
    return "\n".join([
        "Examples",
        "--------",
        ">>> import numpy as np",
        f">>> from sklearn_fedmf import {name}",
        ">>> rng = np.random.default_rng(0)",
        ">>> M = rng.normal(size=(60, 2)) @ rng.normal(size=(2, 30))",
        ">>> X = np.where(rng.random(M.shape) < 0.6, M, np.nan)",
        ">>> # a noise-free low-rank toy needs little regularization (the defaults suit ratings)",
        f">>> model = {name}(n_components=2, n_clients=4, max_iter={max_iter}, alpha_u={alpha},",
        f"...     alpha_v={alpha}, random_state=0).fit(X)",
        f">>> bool(model.score(X) > -{bound})",
        "True",
    ])


def pairs_example(density):
    """The first lines of a pair-API Examples section: the ``(user, item)`` pairs ``X`` of a
    40 x 15 toy, each pair present with probability ``density``, and their ratings ``y``."""
    return "\n".join([
        ">>> import numpy as np",
        ">>> from sklearn_fedmf import FedMAvg, RatingRegressor",
        f">>> users, items = np.nonzero(np.random.default_rng(0).random((40, 15)) < {density})",
        ">>> X, y = np.column_stack([users, items]), 1.0 + (users % 4) + (items % 2)",
    ])
