"""RFRec and RFRecF: regularized federated recommendation (Liu et al., CIKM 2024).

Every client ``c`` owns its users' vectors ``u_i`` and a personal copy ``V_(c)`` of the item
matrix; the server only averages the copies, ``Vbar = mean_c V_(c)``. The problem (the paper's
(5); ``N`` clients, ``lambda = reg_consensus`` multiplies ``psi`` which carries 1/2)::

    F(x) = sum_c [ sum_{i in c} ( sum_{j in Omega_i} (r_ij - u_i . v_(c)j)^2 + alpha_u ||u_i||^2 )
                   + (alpha_v / N) ||V_(c)||^2 ]  +  lambda * sum_c 1/2 ||V_(c) - Vbar||^2

RFRec (Algorithm 1) is one gradient step on ``F`` per client and round, then averaging.
RFRecF (Algorithm 2) flips one shared coin per round: a local step on ``f`` alone with step
``alpha / (1 - p)``, or a pull ``V_(c) <- V_(c) - eta (V_(c) - Vbar)``; it communicates only
when the coin changes. ``F`` is **not** convex (sign and rotation symmetries, no
minimizer when ``alpha_v = 0``): nothing here assumes a unique optimum.

Representation: every copy starts at ``Vbar^0``, so a column that client ``c`` has not
rated evolves identically in every client. Those columns are simulated once (``W``, carried in
the broadcast's uncounted simulation part, never counted as communication); a client stores only its
rated columns ``P`` (one row per (client, item) pair). An upload is the client's whole
``n_items x d`` matrix, sent as :class:`ItemMatrixUpload` (its rated columns over ``W``) whose
``nbytes`` is the dense matrix the paper sends. Item arrays are item-major, ``(n_items, d)``.

Engine mapping: one engine client is one paper client (one user by default), so sampling,
lost uploads (``dropout``), byte counts and the callback's ``uploads`` are per paper client.
Every client steps each round (``Participation(computes="all")``); a client that is not
sampled, or whose upload is lost, still receives ``Vbar`` (the upload-loss model of the paper's
Section 3.3 and Table 3; the engine's ``Participation(dropped="upload_lost")``). The "offline"
model, where a dropped client freezes, would break the shared-column representation and is not
offered. Many clients (one per user) run in groups: :mod:`._rfrec_batched`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from numbers import Integral, Real
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
from sklearn.base import _fit_context
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import _num_samples, check_is_fitted

from ... import _biases
from ..._docstrings import Substitution
from ..._kernels import ridge_fold_in
from ...engine._client_data import center_and_scale, check_dense_size
from ...engine._federation import FederatedProtocol, Participation, SummableUploads
from ...engine._groups import GroupStates
from ...exceptions import ConfigurationWarning
from ...privacy._distributed_dp import DistributedDP, DistributedDPMixin
from ...privacy._local_dp import LocalDP, LocalDPMixin
from .._base import COMPLETION_DOCS, IMPLICIT_SETTINGS, FederatedMFBase, moved_to_solver_params
from .._fed_baseline._fed_baseline import FedBaseline
from .._fedmc_admm import _fedmc_admm
from ._rfrec_batched import make_batched
from ._rfrec_kernels import _errors_at, _sigmoid_fold_in
from ._rfrec_protocol import (  # noqa: F401  (the tests import _coin and _pulled from here)
    _EXPLODE,
    ItemMatrixUpload,
    PreferenceTerms,
    RatingTerms,
    _coin,
    _diverged,
    _pulled,
    _pulled_group,
    client_metrics,
    client_update,
    combine_metrics,
    init_client,
    init_server,
    preference_metrics,
    pull_strength,
    secure_reference,
    secure_server_update,
    secure_summands,
    server_update,
)

__all__ = ["RFRec", "ItemMatrixUpload"]

# learning_rate="auto" with optimizer="adam": Adam's steps are scale-free, so one value serves
# every data set (the authors' code uses 0.1; measured in benchmarks/bench_defaults.py).
AUTO_ADAM_LR = 0.05

# alpha_u = alpha_v = "auto" (the defaults): the solver runs on the centred ratings over their
# RMS (``rating_scale_``), the same model in any rating unit, both strengths AUTO_ALPHA on that
# scale; per-user or per-item ones lost on the site-like sets (docs/guide/defaults.rst).
AUTO_ALPHA = 4.5


def auto_strengths(alpha_u, alpha_v, *, sum_squares, n_ratings):
    """``(rating_scale, alpha_u, alpha_v)`` of a fit: with an ``"auto"`` strength the ratings'
    root mean square (after centring; 1 without ``"auto"``) and both strengths on the ratings
    divided by it (a number ``a`` given beside ``"auto"`` is ``a / rating_scale`` there, the
    same penalty of the factor part). From aggregates only: the clients' sums of squares and
    rating counts."""
    if "auto" not in (alpha_u, alpha_v):
        return 1.0, float(alpha_u), float(alpha_v)
    scale = float(np.sqrt(sum_squares / max(n_ratings, 1))) or 1.0
    return (scale, *(AUTO_ALPHA if a == "auto" else float(a) / scale
                     for a in (alpha_u, alpha_v)))


def make_protocol(*, link, shift, span, **params):
    """Bind the hyperparameters to the pure functions of :mod:`._rfrec_protocol` and
    :mod:`._rfrec_batched` (``alpha_v`` is split 1/N;
    ``biased``: rank ``n_components + 2`` with the augmented factors of ``_biases``;
    ``rating_scale``: the ratings were divided by it, the metrics are reported times it)."""
    link_, biased = dict(link=link, shift=shift, span=span), params.get("biased", False)
    protocol, step, privacy = _bind(**params, loss=LossParts(
        RatingTerms(**link_), partial(client_metrics, biased=biased, **link_), False))
    kw = {k: params[k] for k in ("init_std", "optimizer", "variant", "schedule", "alpha_u")}
    bound = dict(variant=kw["variant"], schedule=kw["schedule"], **step)
    return replace(
        protocol,
        # dense uploads (simulate=True) are summable: each client clips and noises its own
        summable=SummableUploads(client=secure_summands, server_update=partial(
            secure_server_update, **bound), reference=partial(secure_reference, **bound))
        if params["simulate_uploads"] else None,
        batched=make_batched(**kw, biased=biased, eta=step["eta"], step=step, privacy=privacy,
                             simulate=params["simulate_uploads"], link=link_))


def make_implicit_protocol(*, confidence, link, shift, span, **params):
    """RFRec's protocol under ``loss="implicit"`` with confidence scale ``confidence``
    (:mod:`._rfrec_implicit`: every client owns all its columns, one block per client, and
    its uploads are not summed; ``link`` is the identity)."""
    return _bind(**params, loss=LossParts(
        PreferenceTerms(confidence), partial(preference_metrics, confidence=confidence), True))[0]


class LossParts(NamedTuple):
    """What the loss puts in RFRec's protocol: the clients' data ``terms``
    (:class:`~._rfrec_protocol.RatingTerms` or :class:`~._rfrec_protocol.PreferenceTerms`),
    their ``metrics``, and ``every_column`` (each client starts every column of ``V_(c)``)."""

    terms: Any
    metrics: Callable
    every_column: bool


def _bind(*, n_items, n_clients, n_components, variant, schedule, learning_rate,
          reg_consensus, alpha_u, alpha_v, p, pull_eta, optimizer, init_std, clip_delta,
          noise_scale, simulate_uploads, biased=False, rating_scale=1.0, loss):
    """``(protocol, step, privacy)``: the protocol both losses share and its bound step and
    privacy settings; the loss enters through ``loss`` (:class:`LossParts`)."""
    p = None if variant == "rfrec" else p
    eta = None if p is None else pull_strength(learning_rate, reg_consensus,
                                               alpha_v / n_clients, p, pull_eta)
    step = dict(lr=learning_rate, reg=reg_consensus, reg_v=alpha_v / n_clients, p=p, eta=eta,
                optimizer=optimizer, biased=biased)
    privacy = dict(clip_delta=clip_delta, noise_scale=noise_scale)
    return FederatedProtocol(
        init_server=partial(init_server, n_items=n_items,
                            n_components=_biases.n_factors(n_components, biased),
                            init_std=init_std, p=p, optimizer=optimizer, biased=biased),
        init_client=partial(init_client, init_std=init_std, optimizer=optimizer,
                            biased=biased, implicit=loss.every_column),
        client_update=partial(client_update, variant=variant, schedule=schedule,
                              alpha_u=alpha_u, simulate=simulate_uploads, **step, **privacy,
                              terms=loss.terms),
        server_update=partial(server_update, variant=variant, schedule=schedule, **step,
                              **privacy),
        client_metrics=partial(loss.metrics, alpha_u=alpha_u, eta=eta),
        combine_metrics=partial(combine_metrics, n_clients=n_clients, reg=reg_consensus,
                                alpha_v=alpha_v, lr=learning_rate,
                                optimizer=optimizer, variant=variant,
                                rating_scale=rating_scale),
        # every client steps each round; only uploads are sampled or lost (Section 3.3)
        participation=Participation(computes="all", receives="all", dropped="upload_lost",
                                    server_update="every_round"),
    ), step, privacy


# ---- estimator ----------------------------------------------------------------------------
@Substitution(**COMPLETION_DOCS)
class RFRec(DistributedDPMixin, LocalDPMixin, FederatedMFBase):
    """Regularized federated recommendation: RFRec and RFRecF (Liu et al., CIKM 2024).

    Each client keeps its users' vectors and its own copy ``V_(c)`` of the item matrix, tied to
    the server's average ``Vbar`` by the consensus penalty ``reg_consensus``. ``"rfrec"`` takes
    one gradient step on the regularized problem per round and averages (Algorithm 1);
    ``"rfrecf"`` flips a shared coin each round between a local step on the fit and a pull
    towards ``Vbar`` (Algorithm 2), and communicates only when the coin changes. A client only
    ever sends its item matrix (``n_items x n_components``); predictions use the user vectors
    and ``Vbar`` (``components_``). By default the users are grouped into 10 clients; the
    paper's one client per user is ``n_clients=None``.

    Parameters
    ----------
    n_components : int, default=20
        Latent dimension ``d``.
    learning_rate : float or "auto", default="auto"
        Step ``alpha`` (the paper: 0.05 for RFRec, 0.025 for RFRecF). With ``optimizer="gd"``
        a float must stay below about ``1 / L``, which grows with the ratings per user and
        item (on MovieLens about 0.005); a diverging run raises ``FloatingPointError`` naming
        this parameter instead of returning NaN factors. ``"auto"`` with ``"gd"`` steps each
        user vector and each rated item column by ``1 / L_block``, ``L_block`` a Gershgorin
        bound of the Hessian's rows of the block at the current iterate (``2 sum_j (||v_j||^2
        + ||u_i|| ||v_j|| + |e_ij|) + 2 alpha_u`` for ``u_i``, ``2 sum_i (||u_i||^2 + ||u_i||
        ||v_j|| + |e_ij|) + 2 reg_v + reg_consensus`` for a column, ``e`` the residuals; the
        sigmoid link scales the data part by 0.16): a diagonally preconditioned gradient
        step that no data scale makes diverge. From the small initialization the residual
        terms dominate, so the first rounds are slow (see the tuning guide).
        ``"auto"`` with ``"adam"`` is 0.05.
    reg_consensus : float, default=10.0
        The paper's ``lambda``, multiplying ``1/2 sum_c ||V_(c) - Vbar||^2``. The authors' code
        has no 1/2: its ``lam_L = 10`` is ``reg_consensus=20``. Large values tie every copy to
        ``Vbar`` (the gap shrinks like ``1 / lambda``); 0 gives independent local models.
    n_clients : int or None, default=10
        Number of clients the users are grouped into (``solver_params["partition"]``), as in
        the other estimators; the authors' code used 200 contiguous groups. None is one client
        per user (the paper's setting): then the server's ``Vbar`` (and the item biases, which
        travel with it) moves by the *mean* of the clients' steps, ``n_j / N`` of a step for an
        item with ``n_j`` raters among ``N`` clients, and 100 rounds leave most items near
        their start: on MovieLens and on the site-like sets that model loses to biases alone
        (see the tuning guide). With few clients each holds raters of most items and ``Vbar``
        moves at about the full step.
    clients_per_round : int, float or None, default=None
        Clients whose upload is used each round (a fresh random subset). The others still step
        and receive ``Vbar``; their upload is lost (the dropout model of Table 3).
    max_iter : int or None, default=None
        Iterations ``K`` (for RFRecF, coin flips; messages happen on some of them only).
        None: 100 for RFRec; for RFRecF ``ceil(100 / (1 - p))`` (125 at the default ``p``),
        since a flip takes a fit step with probability ``1 - p`` only: RFRec's 100 fit
        steps in expectation (the authors' RFRecF code ran 200).
    %(validation_parameters)s
    alpha_u : float or "auto", default="auto"
        ``lambda_u`` on ``sum_i ||u_i||^2``; also the fold-in ridge of ``transform``.
        ``"auto"``: the fit runs on the centred ratings divided by their root mean square
        (``rating_scale_``; each client adds the sum of squares of its ratings to the sum
        and count it sends for the mean), with ``alpha_u = alpha_v = 4.5`` on that scale,
        so that the same data in another rating unit gives the same model (ratings times
        ``c``: predictions times ``c``; with ``link="sigmoid"``, whose ratings are min-max
        scaled anyway, 4.5 on those). A number is the penalty on the ratings as they are
        (beside an ``"auto"`` one: divided by ``rating_scale_``). The values used are
        ``alpha_u_`` and ``alpha_v_``.
    alpha_v : float or "auto", default="auto"
        ``lambda_v``: ``(alpha_v / N) ||V_(c)||^2`` per client (``alpha_v ||V||^2`` at
        consensus). The paper uses 0; then ``F`` has no minimizer (the scales of ``U`` and
        ``V`` drift), which a positive value removes. ``"auto"``: see ``alpha_u``; the 4.5
        (no 1/2 on the penalties: a 9 in the other estimators' scale) was chosen on the
        sets of ``benchmarks/bench_defaults.py``'s ``CHOSEN_ON`` and confirmed on the
        site-like sets (tuning guide, "RFRec's strengths"); the code's settings are in
        ``PAPER_SETTINGS``.
    %(privacy)s
        RFRec's upload is ``V_(c)``: ``"auto"`` is the paper's (Section 3.4, eq. 9)
        ``clip(V_(c), clip) + Laplace(noise)`` per entry, the only mechanism offered.
        Clipping bounds an entry's change by ``2 clip``, so one upload is ``epsilon_ = 2
        clip / noise``-DP for a change of one entry of ``V_(c)`` (``sensitivity="matrix"``
        covers the ``n_items * d`` entries of an upload). Without noise, uploads reveal
        which items a client rated (its copy differs from ``Vbar`` only there); with
        ``center=True`` each client's rating sum and count reach the server without noise,
        outside the guarantee (with ``"auto"`` strengths also its sum of squares; ``clip``
        then bounds the entries of the copies on the fit's scale, ``rating_scale_``).
    biased : bool, default=True
        %(biased)s
    loss : {"squared", "implicit"}, default="squared"
        %(loss)s
        The local steps keep their form on the weighted objective (derivation in
        ``_rfrec_implicit``); every client then keeps all the columns of its ``V_(c)`` as
        its own (``n_items x d`` per client, no grouped phases). Needs ``link="identity"``.
        ``history_``'s ``train_rmse`` and ``eval_rmse`` are then the errors of the
        preference 1 at the stored entries.
    %(run_parameters)s
        RFRecF (Algorithm 2) is ``solver_params={"variant": "rfrecf"}``; its paper settings
        are ``PAPER_SETTINGS["RFRecF"]``.

        - ``variant`` : {"rfrec", "rfrecf"}, default="rfrec"
          ``"rfrec"``: a gradient step on the regularized problem and an average every
          round (Algorithm 1). ``"rfrecf"``: the communication-free variant, a coin per round
          between a local step and a pull towards ``Vbar`` (Algorithm 2; see ``p``).
        - ``p`` : float, default=0.2
          RFRecF's probability of the averaging branch (the paper's experiments: 0.5; the
          authors' code: 0.8). A round takes a local step on the fit with probability
          ``1 - p`` only, and with the ``"auto"`` step the ``1 / (1 - p)`` reweighting of
          that step cancels in its curvature bound, so ``K`` rounds make about ``(1 - p) K``
          fit steps: at 0.5, half of RFRec's, and RFRecF lagged RFRec by 0.01 to 0.26 RMSE.
          The paper's optimal ``p = lambda / (L + lambda)`` (Corollary 3.10) is small when a
          client's curvature ``L`` exceeds ``reg_consensus``, as it does for clients holding
          many users; 0.2 was measured best of 0.1, 0.2 and 0.5 (tuning guide). With a float
          ``learning_rate`` the pull ``learning_rate * reg_consensus / p`` grows as ``p``
          shrinks: with Adam's 0.05 use ``p=0.5`` or ``pull_eta=1`` (the code's).
        - ``schedule`` : {"l2gd", "algorithm2"}, default="l2gd"
          RFRecF's iteration: the unbiased form the theorems analyse (every coin 1 pulls; a fresh
          ``Vbar`` after a 0; 2 messages per 0 -> 1 transition), or the pseudo-code literally
          (upload at 0 -> 1, pull instead of a step at 1 -> 0).
        - ``pull_eta`` : float or None, default=None
          Pull strength ``eta``; None is ``learning_rate * reg_consensus / p`` (with
          ``learning_rate="auto"`` and ``"gd"``: ``min(1, reg_consensus / ((reg_consensus +
          2 alpha_v / N) p))``, the unrated columns' step in its place). The code uses 1
          (copy := ``Vbar``). A value above 1 overshoots and warns.
        - ``optimizer`` : {"gd", "adam"}, default="gd"
          Exact gradient steps (the paper's algorithms) or Adam with per-client moments
          (beta 0.9/0.999, eps 1e-8; the authors' code, with ``learning_rate=0.1``).
        - ``link`` : {"identity", "sigmoid"}, default="identity"
          ``r = u . v`` (the paper), or the code's ``r = lo + (hi - lo) sigmoid(u . v)`` fitted
          on ratings min-max scaled with the training range (``center`` then has no effect).
        - ``init_std`` : float, default=0.01
          Standard deviation of the Gaussian initialization of ``u_i`` and ``Vbar^0``.
        - ``simulate_uploads`` : bool, default=False
          Send dense per-client matrices with per-client noise (tiny problems, audits); by
          default uploads are sparse views and the noise is summed exactly on the server.
        - ``predict_with`` : {"global", "personal"}, default="global"
          ``"global"``: ``predict``/``score`` fold rows in against ``Vbar`` (the paper's and the
          code's model). ``"personal"``: each training user's client predicts with
          its own copy, ``link(u_i . v_(c)j)`` with the federated ``u_i``; then the rows of
          ``X`` must be the training rows, in order (a personal copy lives on its client).
        - ``dropout`` : float, default=0.0
          Probability that a sampled client's upload is lost in a round (it still steps and
          receives ``Vbar``: the upload-loss model of Table 3).
        - ``eval_every`` : int, default=1
          %(eval_every)s
        - ``validation_panel`` : "auto", int or None, default=None
          %(validation_panel)s
        - ``partition`` : {"random", "contiguous"}, default="random"
          %(partition)s
        - ``missing_values`` : float, default=np.nan
          %(missing_values)s
        - ``on_client_error`` : {"raise", "skip"}, default="raise"
          %(on_client_error)s
        %(solver_center)s
        %(solver_confidence)s
    %(secure_parameter)s

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_items)
        The server's averaged item matrix ``Vbar``.
    user_factors_ : ndarray of shape (n_users, n_components)
        The federated user vectors (kept for analysis; they never leave a client).
    %(fit_attributes)s
    rating_scale_ : float
        What the centred ratings were divided by during the fit (``"auto"`` strengths:
        their root mean square; else 1). The fitted factors and biases are back on the
        rating scale; the clients' copies and uploads are on the fit's.
    alpha_u_, alpha_v_ : float
        The strengths used, on the fit's scale.
    comm_rounds_ : int
        One-way communication rounds (Definition 3.8), counted as in Lemma 3.9.
    %(privacy_attributes)s
    history_ : list of dict
        Per round: ``objective`` (``F``, with ``psi`` against the server's ``Vbar``),
        ``train_rmse``, ``eval_rmse``/``eval_mae`` (``eval_set``, federated factors),
        ``consensus_gap`` (``sum_c ||V_(c) - Vbar||^2``), ``vbar_change``, ``comm_rounds``,
        ``coin`` (RFRecF), bytes, ``n_sampled``, ``n_failed``, ``seconds``.
    %(outcome_attributes)s
    %(validation_attributes)s

    Notes
    -----
    Every engine client is one paper client; its state is its users' vectors and its rated
    columns, so memory is ``O((n_users + nnz) d)`` instead of ``N n_items d``. With many
    clients (500 or more) the clients run in groups and the uploads that ``callback``
    receives are read-only views of the clients' state, valid during their round.

    References
    ----------
    L. Liu, W. Wang, X. Zhao et al. Efficient and Robust Regularized Federated
    Recommendation. CIKM 2024. doi:10.1145/3627673.3679682.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn_fedmf import RFRec
    >>> rng = np.random.default_rng(0)
    >>> M = rng.normal(size=(40, 2)) @ rng.normal(size=(2, 15))
    >>> X = np.where(rng.random(M.shape) < 0.6, M, np.nan)
    >>> model = RFRec(n_components=2, learning_rate=0.01, max_iter=300, alpha_u=0.01,
    ...               random_state=0).fit(X)
    >>> bool(model.score(X) > -0.3)
    True
    """

    _solver_params: dict = {
        **FederatedMFBase._solver_params,
        **IMPLICIT_SETTINGS,
        "variant": ("rfrec", [StrOptions({"rfrec", "rfrecf"})]),
        "p": (0.2, [Interval(Real, 0, 1, closed="neither")]),
        "schedule": ("l2gd", [StrOptions({"l2gd", "algorithm2"})]),
        "pull_eta": (None, [Interval(Real, 0, None, closed="neither"), None]),
        "optimizer": ("gd", [StrOptions({"gd", "adam"})]),
        "link": ("identity", [StrOptions({"identity", "sigmoid"})]),
        "init_std": (0.01, [Interval(Real, 0, None, closed="neither")]),
        "simulate_uploads": (False, ["boolean"]),
        "predict_with": ("global", [StrOptions({"global", "personal"})]),
    }
    _validation_keys = ("eval_rmse", ("eval_sse", "eval_n"))  # (its client_metrics' keys)
    # max_iter=None: RFRec's rounds under either loss (RFRecF: see _engine_params)
    _loss_defaults: dict = {**FederatedMFBase._loss_defaults, "max_iter": (100, 100)}
    _moved_params = moved_to_solver_params(_solver_params)
    _floor_class = FedBaseline  # the biases-only floor of a validated fit

    _parameter_constraints: dict = {
        **FederatedMFBase._parameter_constraints,
        **LocalDPMixin._parameter_constraints,
        "privacy": [LocalDP, DistributedDP, None],
        "n_clients": [Interval(Integral, 1, None, closed="left"), None],
        "reg_consensus": [Interval(Real, 0, None, closed="left")],
        "learning_rate": [Interval(Real, 0, None, closed="neither"), StrOptions({"auto"})],
        "alpha_u": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
        "alpha_v": [Interval(Real, 0, None, closed="left"), StrOptions({"auto"})],
    }

    def __init__(
        self,
        n_components=20,
        *,
        learning_rate="auto",
        reg_consensus=10.0,
        n_clients=10,
        clients_per_round=None,
        max_iter=None,
        tol=0.0,
        early_stopping="auto",
        validation_fraction=0.1,
        n_iter_no_change=10,
        alpha_u="auto",
        alpha_v="auto",
        privacy=None,
        biased=True,
        loss="squared",
        clip=True,
        callback=None,
        warm_start=False,
        random_state=None,
        n_jobs=None,
        verbose=0,
        solver_params=None,
        secure_aggregation=False,
    ):
        super().__init__(
            n_components, alpha_u=alpha_u, alpha_v=alpha_v, biased=biased, n_clients=n_clients,
            clients_per_round=clients_per_round, max_iter=max_iter, tol=tol,
            early_stopping=early_stopping, validation_fraction=validation_fraction,
            n_iter_no_change=n_iter_no_change, clip=clip, warm_start=warm_start,
            callback=callback, random_state=random_state, n_jobs=n_jobs, verbose=verbose,
            solver_params=solver_params, loss=loss,
            secure_aggregation=secure_aggregation,
        )
        self.learning_rate = learning_rate
        self.reg_consensus = reg_consensus
        self.privacy = privacy

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, *, clients=None, eval_set=None):
        """Run the federation on the rating matrix ``X``.

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_users, n_items)
            Training ratings: sparse (every stored entry observed) or dense with NaN missing.
        y : Ignored
            Not used, present for API consistency by convention.
        clients : array-like of shape (n_users,), default=None
            Client label of each row; None assigns rows to ``n_clients`` clients (one per user
            when ``n_clients=None``).
        eval_set : {array-like, sparse matrix} of shape (n_users, n_items), default=None
            Held-out ratings of the same rows, scored every round with ``u_i . vbar_j``.

        Returns
        -------
        self : RFRec
        """
        if clients is None and self.n_clients is None:
            clients = np.arange(_num_samples(X))
        return self._fit(X, clients, eval_set=eval_set)

    def _check_fit_data(self, X, *, reset, settings, eval_set=None):
        self._loss.check_link(settings["link"])
        if self._biased and settings["link"] != "identity":
            raise ValueError("biased=True needs link='identity' (the biases are added to the "
                             "rating, outside any link); set biased=False for the sigmoid link.")
        # (the "auto" pull is capped at 1; reg_v only enters it, so 0 is exact here)
        eta = pull_strength(self._learning_rate(settings), self.reg_consensus, 0.0, settings["p"],
                            settings["pull_eta"])
        if settings["variant"] == "rfrecf" and eta > 1:
            warnings.warn(
                f"The pull strength eta = {eta:.3g} exceeds 1 (learning_rate * reg_consensus "
                "/ p by default): each pull overshoots Vbar. Lower learning_rate or set "
                "pull_eta <= 1.", ConfigurationWarning, stacklevel=5,  # the caller of fit
            )
        X, info = super()._check_fit_data(X, reset=reset, settings=settings, eval_set=eval_set)
        info["privacy"] = self._privacy_settings(X.shape[1])
        return X, info

    def _validation_plan(self, ctx):
        """The base's plan, then the centred training ratings divided by ``rating_scale``
        (``"auto"`` strengths; a warm start keeps the first fit's scale and strengths)."""
        ctx, rule = super()._validation_plan(ctx)
        if not ctx.warm:  # each client adds the sum of squares of its ratings to its sum
            info = replace(ctx.info, **self._scale_info(
                float(np.vdot(ctx.X.data, ctx.X.data)), ctx.X.nnz, ctx.settings))
        else:
            info = replace(ctx.info, rating_scale=self.rating_scale_, alpha_u=self.alpha_u_,
                           alpha_v=self.alpha_v_)
        center_and_scale(0.0, info.rating_scale, ctx.X, info.eval_X, info.report_X)
        if rule is not None and ctx.settings["variant"] == "rfrecf":
            # RFRecF's model changes on the server only when it averages (coin 1); between
            # averages each client's vectors fit its own copy, and the validation error of
            # the federated model drifts up for a run of coins 0 (mean 1 / p rounds). The
            # rounds that average are scored, and the patience counts them.
            rule = replace(rule, scored_if="coin")
        return replace(ctx, info=info), rule

    def _scale_info(self, sum_squares, n_ratings, settings):
        """``rating_scale``, ``alpha_u`` and ``alpha_v`` of a fit from the sum of squares of
        the centred ratings and their count (:func:`auto_strengths`; a Flower server and its
        sites get them from the sites' aggregates)."""
        scale, alpha_u, alpha_v = auto_strengths(self.alpha_u, self.alpha_v,
                                                 sum_squares=sum_squares, n_ratings=n_ratings)
        scale = self._loss.rating_scale(scale)  # (implicit: confidences read X as given)
        if settings["link"] != "identity":
            scale = 1.0  # (the link fits ratings scaled to [0, 1])
        return dict(rating_scale=scale, alpha_u=alpha_u, alpha_v=alpha_v)

    def _collect(self, state, blocks, ctx):
        info = ctx.info
        self.rating_scale_, self.alpha_u_, self.alpha_v_ = (
            info.rating_scale, info.alpha_u, info.alpha_v)
        super()._collect(state, blocks, ctx)
        self._check_diverged(ctx.X, info.offset, ctx.settings)
        self._keep_personal(state, ctx.settings)
        self.comm_rounds_ = state.server_state["comm_rounds"]
        self._read_privacy_spent(info.privacy, state.n_uploads)
        scale = self.rating_scale_
        if scale != 1.0:  # the model back in rating units (u . v and the biases times scale)
            root = np.sqrt(scale)
            self.components_ *= root
            self.user_factors_ *= root
            if self._biased:
                self.item_bias_ *= scale
                self.user_bias_ *= scale
            ctx.X.data *= scale  # (the end-of-fit checks read X in rating units)

    def _keep_personal(self, state, settings):
        """Every client's copy ``V_(c)`` as its rated columns over the shared ones: blocks of
        consecutive clients ``(first client, pair_ptr, cols)`` with their rows ``values``
        (grouped clients' blocks are their group's arrays, not copies), and the shared
        columns. The search keys are built on the first personal prediction (``nnz`` int64s
        that a fit does not need)."""
        self._personal_keys = None
        if not state.client_states:  # clients in their own processes keep their copies
            self._personal = None
            return
        eta = None if settings["variant"] == "rfrec" else pull_strength(  # as make_protocol does
            self._learning_rate(settings), self.reg_consensus, self.alpha_v_ / self.n_clients_,
            settings["p"], settings["pull_eta"])
        replica = state.broadcast.simulation  # Vbar and the shared columns W
        states = state.client_states
        if isinstance(states, GroupStates):
            blocks = [(g.start, gs["pair_ptr"], gs["cols"])
                      for g, gs in zip(states.groups, states.group_states)]
            values = [_pulled_group(gs, replica, eta) for gs in states.group_states]
        else:
            sizes = [len(s["cols"]) for s in states]
            blocks = [(0, np.concatenate([[0], np.cumsum(sizes)]),
                       np.concatenate([s["cols"] for s in states]))]
            values = [np.concatenate([_pulled(s, replica, eta) for s in states])]
        self._personal = (blocks, values, replica.W)

    def _personal_index(self):
        """Sorted keys ``client * n_items + item`` of every rated column, and where each
        block's keys start."""
        if self._personal_keys is None:
            keys = [np.repeat(np.arange(first, first + len(ptr) - 1, dtype=np.int64),
                              np.diff(ptr)) * self.n_features_in_ + cols
                    for first, ptr, cols in self._personal[0]]
            self._personal_keys = (np.concatenate(keys),
                                   np.cumsum([0] + [len(k) for k in keys]))
        return self._personal_keys

    def personal_scores(self, rows, items):
        """Scores ``u_i . v_(c)j`` with each training user's client's own item matrix.

        Parameters
        ----------
        rows : array-like of int
            Training users (row indices of the training matrix).
        items : array-like of int, same length as ``rows``
            Items to score.

        Returns
        -------
        scores : ndarray of shape (len(rows),)
            Before the link (see ``predict_with``).
        """
        check_is_fitted(self)
        rows, items = np.asarray(rows, dtype=np.intp), np.asarray(items, dtype=np.intp)
        _, values, W = self._personal
        keys, offsets = self._personal_index()
        codes = np.unique(self.clients_, return_inverse=True)[1]
        query = codes[rows].astype(np.int64) * self.n_features_in_ + items
        pos = np.minimum(np.searchsorted(keys, query), len(keys) - 1)
        hit = np.flatnonzero(keys[pos] == query)
        V = W[items]
        block = np.searchsorted(offsets, pos[hit], side="right") - 1
        for k in np.unique(block):
            at = block == k
            V[hit[at]] = values[k][pos[hit[at]] - offsets[k]]
        scale = self.rating_scale_  # (the copies are on the scale the fit ran on)
        U = self.user_factors_[rows] / np.sqrt(scale)
        if self._biased:  # the copies are augmented: [U, b_u, 1] . [V; 1; b_i]
            U = np.hstack([U, self.user_bias_[rows, None] / scale, np.ones((len(rows), 1))])
        return scale * np.einsum("ij,ij->i", U, V)

    def _personal_predict_at(self, Xc, target):
        """Personal predictions (rating scale) at the stored entries of ``target``."""
        if self._personal is None:
            raise ValueError('predict_with="personal" needs the client states, which stayed '
                             "with the clients of this fit's transport.")
        if Xc.shape[0] != self.n_users_:
            raise ValueError(
                f'predict_with="personal" predicts for the {self.n_users_} training users '
                f"only (row i of X is training user i; got {Xc.shape[0]} rows): a personal "
                'item matrix lives on its client. Use predict_with="global" for new rows.')
        rows = np.repeat(np.arange(target.shape[0]), np.diff(target.indptr))
        pred = self._to_ratings(self.personal_scores(rows, target.indices))
        pred[np.diff(Xc.indptr)[rows] == 0] = self.mean_
        return self._clip(pred)

    def _check_diverged(self, Xc, offset, settings):
        """Raise unless the federated model's training error on the centred training ratings
        ``Xc`` is finite and of the ratings' order (the objective is only checked on evaluated
        rounds, ``eval_every``)."""
        if Xc.nnz == 0:  # nothing to check against (a Flower server holds no rating)
            return
        U, Vt = self.user_factors_, self.components_.T
        if self._biased:  # the augmented factors [U, b_u, 1] . [V; 1; b_i]
            U = np.hstack([U, self.user_bias_[:, None], np.ones((U.shape[0], 1))])
            Vt = np.hstack([Vt, np.ones((Vt.shape[0], 1)), self.item_bias_[:, None]])
        lo, hi = self.rating_range_
        # (entry by entry in a kernel: no nnz x d temporaries at the end of a large fit)
        sse, _ = _errors_at(Xc.indptr, Xc.indices, Xc.data, np.ascontiguousarray(U),
                            np.ascontiguousarray(Vt), settings["link"] == "sigmoid",
                            offset - lo, (hi - lo) or 1.0)
        rmse = np.sqrt(sse / Xc.nnz)
        if not rmse <= _EXPLODE * (hi - lo + 1):
            raise FloatingPointError(_diverged(
                f"the training RMSE of the federated model is {rmse:.4g} for ratings in "
                f"[{lo:g}, {hi:g}]", self.learning_rate, settings["optimizer"]))

    _privacy_mechanisms = ("laplace",)  # the paper's
    _distributed_privacy = True  # privacy=DistributedDP: noise on the secure sum
    _privacy_entry_range = 2.0  # an entry clipped to [-clip, clip] moves by up to 2 clip

    def _privacy_upload(self, n_items):
        # V_(c) (with the bias rows when biased), at most once per round
        # (the privacy hook has no fit context: the one more resolution of an RFRec fit)
        rounds = self._engine_params(self._settings())["max_iter"]
        return (n_items, self.n_components + 2 * self._biased), rounds

    def _engine_params(self, settings):
        """The base's, and RFRecF's ``max_iter=None``: the flips that make RFRec's fit steps
        in expectation, ``ceil(100 / (1 - p))``."""
        params = super()._engine_params(settings)
        if self.max_iter is None and settings["variant"] == "rfrecf":
            params["max_iter"] = int(np.ceil(params["max_iter"] / (1 - settings["p"])))
        return params

    def _learning_rate(self, settings):
        """The step handed to the solver: None means per-block curvature steps (gd)."""
        if self.learning_rate != "auto":
            return float(self.learning_rate)
        return AUTO_ADAM_LR if settings["optimizer"] == "adam" else None

    def _squared_protocol(self, ctx):
        """RFRec on ratings."""
        return self._protocol(ctx, make_protocol)

    def _implicit_protocol(self, ctx):
        """RFRec under ``loss="implicit"`` (:mod:`._rfrec_implicit`)."""
        return self._protocol(ctx, partial(make_implicit_protocol,
                                           confidence=ctx.info.confidence))

    _protocols = {"squared": _squared_protocol, "implicit": _implicit_protocol}

    def _protocol(self, ctx, make):
        """``make`` (the loss's protocol) bound to the fit's settings."""
        settings = ctx.settings
        offset = ctx.info.offset
        lo, hi = ctx.info.rating_range
        return make(
            n_items=ctx.n_features, n_clients=ctx.n_clients, n_components=self.n_components,
            variant=settings["variant"], schedule=settings["schedule"],
            learning_rate=self._learning_rate(settings), reg_consensus=self.reg_consensus,
            alpha_u=ctx.info.alpha_u, alpha_v=ctx.info.alpha_v, p=settings["p"],
            pull_eta=settings["pull_eta"], optimizer=settings["optimizer"], link=settings["link"],
            shift=offset - lo, span=(hi - lo) or 1.0, init_std=settings["init_std"],
            clip_delta=ctx.info.privacy["clip"], noise_scale=ctx.info.privacy["scale"] or 0.0,
            # secure aggregation sums dense uploads, each clipped and noised by its client
            simulate_uploads=(settings["simulate_uploads"]
                              or settings["secure_aggregation"] is not False),
            biased=self._biased, rating_scale=ctx.info.rating_scale,
        )

    def _run(self, protocol, blocks, ctx, early_stopping=None):
        check = self._memory_checks[self._loss.name]
        if check is not None and not ctx.warm and isinstance(blocks, list):
            check(self, ctx)
        return super()._run(protocol, blocks, ctx, early_stopping)

    def _check_implicit_memory(self, ctx):
        """Under ``loss="implicit"`` every client keeps its whole ``V_(c)`` (with Adam, its
        two moments too): raise before the first round when they would not fit in memory."""
        copies = 3 if ctx.settings["optimizer"] == "adam" else 1
        need = (copies * ctx.n_clients * ctx.n_features * self.n_components
                * ctx.X.dtype.itemsize)
        available = _fedmc_admm._available_memory()
        if need > available:
            raise MemoryError(
                f'RFRec with loss="implicit" needs about {need / 2**30:.2f} GiB ({need} '
                f"bytes) for every client's whole item matrix ({ctx.n_clients} clients x "
                f"{ctx.n_features} items x {self.n_components} factors x {copies} "
                f"array(s)), but {available / 2**30:.2f} GiB are available. Use fewer "
                "clients (n_clients, or fewer distinct labels in clients) or a lower "
                "n_components.")

    # {loss: the check that the clients' state fits in memory, or None}
    _memory_checks = {"squared": None, "implicit": _check_implicit_memory}

    def _read_components(self, server_state, broadcast):
        return np.ascontiguousarray(server_state["Vbar"].T)

    # ---- fold-in and prediction through the link ----------------------------------------
    def _link_params(self):
        lo, hi = self.rating_range_
        return self._offset - lo, (hi - lo) or 1.0

    def _fold_in_alpha_u(self):
        return self.alpha_u_

    def _fold_in_ratings(self, Xc, Vt):
        """Each row's ``argmin_u sum_j (r_ij - link(u . vbar_j))^2 + alpha_u ||u||^2``, on the
        scale the fit ran on (ratings over ``rating_scale_``, the factors over its root, the
        biases over it; ``Vt``'s last column is the fixed ones when biased)."""
        U = np.zeros((Xc.shape[0], Vt.shape[1]))
        if self._settings()["link"] != "identity":
            shift, span = self._link_params()
            _sigmoid_fold_in(Xc.indptr, Xc.indices, Xc.data, Vt, self.alpha_u_, shift, span,
                             50, U)
            return U
        scale = self.rating_scale_
        back = np.full(Vt.shape[1], np.sqrt(scale))  # what each column of U is multiplied by
        if self.biased:
            back[-1] = scale  # b_u (against the fixed ones)
        data = Xc.data / scale if scale != 1.0 else Xc.data
        Vt_fit = np.ascontiguousarray(Vt * (back / scale)) if scale != 1.0 else Vt
        ridge_fold_in(Xc.indptr, Xc.indices, data, Vt_fit, self.alpha_u_, U)  # exact
        return U * back if scale != 1.0 else U

    def _to_ratings(self, Z):
        """Scores ``u . v`` to ratings (the shifted scale plus the offset, or the sigmoid
        link's range)."""
        if self._settings()["link"] == "identity":
            return super()._to_ratings(Z)
        lo, hi = self.rating_range_
        return lo + (hi - lo) / (1 + np.exp(-Z))

    def _factor_model(self, Xc=None):
        # The sigmoid link maps the raw score u . v to the rating range (no offset).
        model = super()._factor_model(Xc)
        if self._settings()["link"] == "identity":
            return model
        return model._replace(offset=0.0, link=self._to_ratings)

    def predict(self, X, at=None):
        """Predicted ratings for the rows of ``X`` by fold-in, or by each training user's own
        client model (``predict_with="personal"``).

        Parameters
        ----------
        X : {array-like, sparse matrix} of shape (n_rows, n_items)
            Observed ratings of the rows, folded in (see :meth:`transform`). With
            ``predict_with="personal"`` the rows are the training users, in order.
        at : {array-like, sparse matrix} of shape (n_rows, n_items), default=None
            Predict only at its stored entries and return a CSR matrix (see
            :meth:`FedMCADMM.predict <sklearn_fedmf.FedMCADMM.predict>`).

        Returns
        -------
        ratings : ndarray of shape (n_rows, n_items) or csr_matrix
            Dense when ``at`` is None (refused above ``MAX_DENSE_ENTRIES`` entries).
        """
        if self._settings()["predict_with"] == "personal" and at is None:
            Xc = self._check_X(X)
            check_dense_size(*Xc.shape, "predict(X)")
            full = sp.csr_matrix(np.ones(Xc.shape))
            return self._personal_predict_at(Xc, full).reshape(Xc.shape)
        return super().predict(X, at=at)

    def _predict_entries(self, Xc, pattern):
        if self._settings()["predict_with"] == "personal":
            return self._personal_predict_at(Xc, pattern)
        return super()._predict_entries(Xc, pattern)
