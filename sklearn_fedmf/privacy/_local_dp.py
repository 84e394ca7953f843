"""One privacy object for every estimator that noises its uploads.

``privacy=LocalDP(...)`` configures Felb, RFRec/RFRecF and AggregatedBMF alike (and any
estimator that later adds noise): :class:`LocalDP` holds the mechanism, the budget or the
noise, the clipping and the accounting; :func:`privacy_settings` turns it into the noise of
one fit and :func:`read_privacy_spent` into what the fit spent. :class:`LocalDPMixin` declares
the ``privacy`` parameter, its constraint and its documentation once for those estimators.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from numbers import Real

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils._param_validation import Interval, StrOptions

from .._docstrings import fill_doc
from ._accounting import (
    ACCOUNTANTS,
    basic_epsilon,
    calibrate_noise,
    privacy_spent,
    resolve_accountant,
)
from ._mechanisms import (
    CALIBRATIONS,
    MECHANISMS,
    check_privacy,
    is_bounded,
    noise_scale,
    sensitivity_of,
    warn_unless_bounded,
)

__all__ = ["LocalDP", "LocalDPMixin", "fit_privacy_settings", "privacy_settings",
           "read_privacy_spent"]

# The estimators' former privacy parameters -> the LocalDP field that replaced each.
MOVED_TO_LOCAL_DP = {
    "epsilon": "epsilon", "delta": "delta", "noise_scale": "noise", "dp_clip": "clip",
    "sensitivity": "sensitivity", "calibration": "calibration",
    "target_epsilon": "target_epsilon", "target_delta": "target_delta",
    "accountant": "accountant",
}

_OFF = dict(mechanism=None, clip=None, scale=None, multiplier=None, accountant=None,
            delta=None, epsilon=None)


class LocalDP(BaseEstimator):
    """Local differential privacy of every upload a client sends, against the server.

    Each client clips what it is about to send and adds noise to it (or flips its bits); the
    server, and everything it computes, only sees the noised uploads. Each upload is one
    release; a client's cost over a fit is the composition of the uploads the server
    actually received from it, reported by the fitted estimator's ``privacy_spent_``. No
    amplification by client sampling is claimed: the server samples, and it is the
    adversary. Give exactly one of ``epsilon`` (per upload), ``noise`` (the noise itself)
    and ``target_epsilon`` (the whole fit).

    Parameters
    ----------
    mechanism : {"auto", "gaussian", "laplace", "bernoulli"}, default="auto"
        Gaussian or Laplace noise per entry (after ``clip``), or randomized response (an
        entry ``v`` becomes ``1 - v`` with the flip probability). ``"auto"`` is the one of
        the estimator's paper: Gaussian for Felb, Laplace for RFRec, randomized response for
        AggregatedBMF (an estimator refuses a mechanism its upload does not support).
    epsilon : float or None, default=None
        Budget of one upload (> 0).
    delta : float, default=1e-5
        ``delta`` of one Gaussian upload with ``epsilon`` (the Felb paper uses 0.05), and
        the ``delta`` at which ``epsilon_`` of a Gaussian upload is reported.
    noise : float or None, default=None
        The noise itself (>= 0): Gaussian sigma, Laplace scale (RFRec's ``s``) or flip
        probability (at most 1/2). 0 clips the uploads without noise (no guarantee).
    clip : float or None, default=None
        Entrywise clipping threshold ``theta`` of an upload before the noise (Felb's 1.5,
        RFRec's ``delta``). It bounds how much an entry can change: by ``clip`` for
        Felb's nonnegative factors, by ``2 clip`` for RFRec's (clipped to ``[-clip,
        clip]``). Without it (Gaussian or Laplace) nothing bounds the change, the noise
        gives no formal guarantee (a :class:`~sklearn_fedmf.exceptions.PrivacyWarning`),
        ``privacy_spent_`` is None and ``target_epsilon`` is refused.
    sensitivity : {"entry", "matrix"} or float, default="entry"
        The change the noise hides: one entry of an upload (the papers'), every entry of it
        (``"matrix"``: a user's whole row; far more noise), or a proven bound given as a
        number (:func:`~sklearn_fedmf.privacy.sensitivity_of`).
    calibration : {"analytic", "classical"}, default="analytic"
        Gaussian noise of one ``(epsilon, delta)`` upload: the analytic Gaussian mechanism
        (Balle & Wang 2018; exact for every epsilon) or the classical bound of the Felb paper
        (``sqrt(2 ln(1.25 / delta)) / epsilon``: 38% more noise at ``(0.5, 1e-5)``; proven
        for ``epsilon < 1``).
    target_epsilon : float or None, default=None
        Budget of the **whole fit** (> 0): the accountant finds the smallest noise with which
        a client that uploads in every one of the ``max_iter`` rounds spends at most
        ``(target_epsilon, target_delta)``. With ``warm_start`` each fit is calibrated on its
        own, and ``privacy_spent_`` counts the releases of all of them.
    target_delta : float, default=1e-5
        ``delta`` of the whole fit: the target with ``target_epsilon``, and the ``delta`` at
        which ``privacy_spent_`` reports each client's epsilon.
    accountant : {"pld", "rdp"}, default="pld"
        Composition over rounds by dp-accounting's privacy-loss-distribution (tight) or Renyi
        accountant (the ``privacy`` extra). Without the extra, basic composition and a
        :class:`~sklearn_fedmf.exceptions.PrivacyWarning`. A single upload of a pure
        mechanism (Laplace, randomized response) needs none: its epsilon is exact, at
        ``delta = 0``.

    See Also
    --------
    sklearn_fedmf.privacy.privatize : What a client does to an upload.
    sklearn_fedmf.privacy.calibrate_noise : The noise of a whole-fit budget.

    Examples
    --------
    >>> from sklearn.base import clone
    >>> from sklearn_fedmf.binary import Felb
    >>> from sklearn_fedmf.privacy import LocalDP
    >>> model = Felb(privacy=LocalDP(epsilon=1.0, clip=1.5))
    >>> clone(model).set_params(privacy__epsilon=5.0).get_params()["privacy__epsilon"]
    5.0
    """

    _parameter_constraints: dict = {
        "mechanism": [StrOptions({"auto", *MECHANISMS})],
        "epsilon": [Interval(Real, 0, None, closed="neither"), None],
        "delta": [Interval(Real, 0, 1, closed="neither")],
        "noise": [Interval(Real, 0, None, closed="left"), None],
        "clip": [Interval(Real, 0, None, closed="neither"), None],
        "sensitivity": [StrOptions({"entry", "matrix"}),
                        Interval(Real, 0, None, closed="neither")],
        "calibration": [StrOptions(set(CALIBRATIONS))],
        "target_epsilon": [Interval(Real, 0, None, closed="neither"), None],
        "target_delta": [Interval(Real, 0, 1, closed="neither")],
        "accountant": [StrOptions(set(ACCOUNTANTS))],
    }

    def __init__(self, mechanism="auto", *, epsilon=None, delta=1e-5, noise=None, clip=None,
                 sensitivity="entry", calibration="analytic", target_epsilon=None,
                 target_delta=1e-5, accountant="pld"):
        self.mechanism = mechanism
        self.epsilon = epsilon
        self.delta = delta
        self.noise = noise
        self.clip = clip
        self.sensitivity = sensitivity
        self.calibration = calibration
        self.target_epsilon = target_epsilon
        self.target_delta = target_delta
        self.accountant = accountant


def privacy_settings(privacy, *, mechanisms, shape, n_releases, entry_range=1.0,
                     owner="The estimator"):
    """The noise of one fit: ``privacy`` validated and turned into the mechanism's settings.

    Warns (:class:`~sklearn_fedmf.exceptions.PrivacyWarning`) once when the noise has no
    proven sensitivity, when the classical Gaussian bound is outside its range, or when the
    accountant falls back to basic composition.

    Parameters
    ----------
    privacy : LocalDP or None
        None: no noise.
    mechanisms : tuple of str
        The mechanisms the estimator's upload supports; the first is ``mechanism="auto"``.
    shape : tuple of int
        Shape of one upload (for ``sensitivity="matrix"``).
    n_releases : int
        The most uploads a client makes in the fit (``target_epsilon`` covers them all).
    entry_range : float, default=1.0
        How far a clipped entry of the upload can move, in units of ``clip``: 1 for uploads
        in ``[0, clip]``, 2 for uploads in ``[-clip, clip]``.
    owner : str, default="The estimator"
        The estimator's name, for error messages.

    Returns
    -------
    settings : dict
        ``mechanism``, ``clip`` and ``scale`` (the noise of :func:`privatize`),
        ``multiplier`` (noise per unit of sensitivity, or the flip probability; None without
        a guarantee), ``accountant`` and ``delta`` (how ``privacy_spent_`` is reported), and
        ``epsilon`` (of one upload).

    Examples
    --------
    >>> from sklearn_fedmf.privacy import LocalDP, privacy_settings
    >>> s = privacy_settings(LocalDP(epsilon=0.5, clip=0.2), mechanisms=("laplace",),
    ...                      shape=(10, 3), n_releases=20, entry_range=2.0)
    >>> s["mechanism"], round(s["scale"], 6), s["epsilon"]
    ('laplace', 0.8, 0.5)
    """
    if privacy is None:
        return dict(_OFF)
    privacy._validate_params()
    mechanism = mechanisms[0] if privacy.mechanism == "auto" else privacy.mechanism
    if mechanism not in mechanisms:
        raise ValueError(f"{owner} supports LocalDP(mechanism=...) among "
                         f"{['auto', *mechanisms]}; got {privacy.mechanism!r}.")
    given = [n for n in ("epsilon", "noise", "target_epsilon") if getattr(privacy, n) is not None]
    if len(given) != 1:
        raise ValueError(f"LocalDP takes exactly one of epsilon, noise and target_epsilon; "
                         f"got {', '.join(given) or 'none of them'}.")
    clip, kind = privacy.clip, privacy.sensitivity
    bounded = is_bounded(mechanism, clip, kind)
    if privacy.target_epsilon is not None and not bounded:
        raise ValueError("target_epsilon needs clip: without clipping nothing bounds an entry "
                         "of the upload, so no noise reaches a budget.")
    if privacy.noise == 0:  # clipping only
        return dict(_OFF, mechanism=mechanism, clip=clip, scale=0.0)
    if privacy.epsilon is not None:  # (validates the Gaussian delta, warns when unbounded)
        check_privacy(mechanism, privacy.epsilon, privacy.delta, clip, kind,
                      privacy.calibration)
    elif privacy.noise is not None:
        if mechanism == "bernoulli" and privacy.noise > 0.5:
            raise ValueError(f"A flip probability above 1/2 protects nothing more; got "
                             f"noise={privacy.noise!r}.")
        warn_unless_bounded(mechanism, clip, kind, stacklevel=5)
    accountant, delta = None, None
    if bounded:
        # one release of a pure mechanism is exactly its epsilon: no accountant needed
        accountant, delta = (("basic", 0.0) if n_releases == 1 and mechanism != "gaussian"
                             else (resolve_accountant(privacy.accountant, mechanism),
                                   privacy.target_delta))
    sens = sensitivity_of(mechanism, clip, shape, kind)
    if isinstance(kind, str) and mechanism != "bernoulli":
        sens *= entry_range
    if privacy.noise is not None:
        scale = float(privacy.noise)
    elif privacy.epsilon is not None:
        scale = noise_scale(mechanism, privacy.epsilon, privacy.delta, sens,
                            privacy.calibration)
    else:  # a client uploads at most once per round
        scale = calibrate_noise(mechanism, privacy.target_epsilon, privacy.target_delta,
                                n_releases, accountant)
        scale = scale if mechanism == "bernoulli" else scale * sens
    multiplier = None
    if bounded:
        multiplier = scale if mechanism == "bernoulli" else scale / sens
    return dict(mechanism=mechanism, clip=clip, scale=scale, multiplier=multiplier,
                accountant=accountant, delta=delta, epsilon=None if multiplier is None else (
                    basic_epsilon(mechanism, multiplier, 1, privacy.delta)))


def read_privacy_spent(settings, clients, n_uploads):
    """What a fit spent: ``(noise_scale_, accountant_, epsilon_, privacy_spent_)``.

    Parameters
    ----------
    settings : dict
        The fit's :func:`privacy_settings`.
    clients : array-like of shape (n_clients,)
        Client labels, in the engine's client order.
    n_uploads : array-like of int, shape (n_clients,)
        Uploads the server received from each client.

    Returns
    -------
    noise_scale : float or None
        The noise each upload got.
    accountant : str or None
        How the releases were composed.
    epsilon : float or None
        The epsilon of one upload.
    spent : dict of ndarray or None
        :func:`~sklearn_fedmf.privacy.privacy_spent` of every client; None without a
        guarantee.

    Examples
    --------
    >>> from sklearn_fedmf.privacy import LocalDP, privacy_settings, read_privacy_spent
    >>> s = privacy_settings(LocalDP(epsilon=0.5, clip=1.0), mechanisms=("laplace",),
    ...                      shape=(2, 3), n_releases=1)
    >>> noise, accountant, epsilon, spent = read_privacy_spent(s, ["a", "b"], [1, 0])
    >>> accountant, epsilon, spent["epsilon"].tolist()
    ('basic', 0.5, [0.5, 0.0])
    """
    if settings["multiplier"] is None:
        return settings["scale"], None, None, None
    spent = privacy_spent(clients, n_uploads, mechanism=settings["mechanism"],
                          noise_multiplier=settings["multiplier"], delta=settings["delta"],
                          accountant=settings["accountant"])
    return settings["scale"], settings["accountant"], settings["epsilon"], spent


_PRIVACY_PARAMETER = """\
privacy : :class:`~sklearn_fedmf.privacy.LocalDP` or None, default=None
    Local differential privacy of every upload against the server: the client clips and
    noises what it sends (the mechanism, its budget or noise, and the accounting are
    :class:`~sklearn_fedmf.privacy.LocalDP`'s parameters, searchable as
    ``privacy__epsilon``). None adds no noise."""

_PRIVACY_ATTRIBUTES = """\
noise_scale_ : float or None
    The noise each upload got: Gaussian sigma, Laplace scale or flip probability.
epsilon_ : float or None
    The epsilon of one upload (at ``LocalDP.delta`` for Gaussian noise); None without a
    guarantee (no noise, or no clipping).
accountant_ : str or None
    ``"pld"``, ``"rdp"``, ``"basic"`` (dp-accounting not installed, or a single release of
    a pure mechanism), or None without a guarantee.
privacy_spent_ : dict of ndarray or None
    One entry per client (``pandas.DataFrame(privacy_spent_)`` is a table): ``client``,
    ``n_releases`` (uploads the server received from it: partial participation, lost
    uploads and rounds without upload cost nothing), ``epsilon`` at ``delta``
    (``LocalDP.target_delta``, or 0 for a single release of a pure mechanism) by
    ``accountant_``, and the basic-composition bound ``epsilon_basic`` at ``delta_basic``.
    None without a guarantee."""


class LocalDPMixin(metaclass=ABCMeta):
    """The ``privacy`` parameter of the estimators that noise their uploads (not for direct
    use): its constraint, its documentation (the lines ``%(privacy)s`` and
    ``%(privacy_attributes)s`` of a subclass's docstring), the removed parameters' errors,
    and the fit's settings and spent budget.

    A subclass declares the mechanisms its upload supports (``_privacy_mechanisms``, the
    first for ``"auto"``), how far a clipped entry moves (``_privacy_entry_range``), and
    implements ``_privacy_upload``.
    """

    _parameter_constraints: dict = {"privacy": [LocalDP, None]}
    _distributed_privacy = False  # (RFRec: privacy=DistributedDP noises its secure sum)
    # read by FederatedEstimator: a removed parameter raises a TypeError naming its new place
    _moved_params = {old: f"privacy=LocalDP({new}=...)" for old, new in MOVED_TO_LOCAL_DP.items()}
    _privacy_mechanisms = MECHANISMS
    _privacy_entry_range = 1.0

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__doc__:
            cls.__doc__ = fill_doc(cls.__doc__, privacy=_PRIVACY_PARAMETER,
                                    privacy_attributes=_PRIVACY_ATTRIBUTES)

    @abstractmethod
    def _privacy_upload(self, n_items):
        """``(shape of one upload, the most uploads a client makes in one fit)``."""

    def _privacy_settings(self, n_items):
        """The validated :func:`privacy_settings` of this fit (``n_items`` columns)."""
        return fit_privacy_settings(self, n_items)

    def _read_privacy_spent(self, settings, n_uploads):
        """``noise_scale_``, ``accountant_``, ``epsilon_`` and ``privacy_spent_``: the
        releases each client actually made."""
        # (a Flower server has no clients_: the sites keep their rows; engine order then)
        if getattr(self, "_ddp_plan", None) is not None:  # (DistributedDP's, already read)
            return
        clients = np.unique(getattr(self, "clients_", np.arange(len(n_uploads))))
        self.noise_scale_, self.accountant_, self.epsilon_, self.privacy_spent_ = (
            read_privacy_spent(settings, clients, n_uploads))


def fit_privacy_settings(estimator, n_items):
    """The validated :func:`privacy_settings` of a fit of the :class:`LocalDPMixin`
    ``estimator`` on ``n_items`` columns (the fit's, and a Flower server's and site's)."""
    shape, n_releases = estimator._privacy_upload(n_items)
    if estimator._distributed_privacy and not isinstance(estimator.privacy, (LocalDP, type(None))):
        return dict(_OFF)  # (DistributedDP: no noise on the uploads themselves)
    return privacy_settings(estimator.privacy, mechanisms=estimator._privacy_mechanisms,
                            shape=shape, n_releases=n_releases,
                            entry_range=estimator._privacy_entry_range,
                            owner=type(estimator).__name__)
