"""Local and distributed differential privacy: the mechanisms a client applies, and accounting.

An estimator that noises its uploads takes ``privacy=LocalDP(...)``
(``sklearn_fedmf.privacy._local_dp``: the object, the settings of a fit and the reader of
the budget spent); ``privacy=DistributedDP(...)`` noises the secure sum instead
(``sklearn_fedmf.privacy._distributed_dp``). Clipping, Gaussian and Laplace noise,
randomized response and their noise-scale formulas (classical and analytic Gaussian) are in
``sklearn_fedmf.privacy._mechanisms``; the cost of a client's releases over a whole fit (PLD
and RDP accountants of the optional ``dp-accounting``, or basic composition) and the
calibration of noise to a target budget are in ``sklearn_fedmf.privacy._accounting``. What
the guarantees cover, and what they do not, is documented in these modules and in the
privacy guide.
"""

from ..exceptions import PrivacyWarning
from ._accounting import (
    ACCOUNTANTS,
    basic_epsilon,
    calibrate_noise,
    epsilon_spent,
    privacy_spent,
    resolve_accountant,
)
from ._distributed_dp import (
    DistributedDP,
    ddg_rho,
    discrete_gaussian,
    distributed_noise,
)
from ._local_dp import LocalDP, privacy_settings, read_privacy_spent
from ._mechanisms import (
    CALIBRATIONS,
    MECHANISMS,
    analytic_gaussian_sigma,
    check_privacy,
    clip_entries,
    compose_basic,
    flip_probability,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_noise,
    gaussian_sigma,
    laplace_epsilon,
    laplace_noise,
    laplace_scale,
    mean_laplace_noise,
    noise_scale,
    privatize,
    randomized_response,
    sensitivity_of,
)

__all__ = [
    "ACCOUNTANTS",
    "CALIBRATIONS",
    "MECHANISMS",
    "DistributedDP",
    "LocalDP",
    "PrivacyWarning",
    "analytic_gaussian_sigma",
    "basic_epsilon",
    "calibrate_noise",
    "check_privacy",
    "clip_entries",
    "compose_basic",
    "ddg_rho",
    "discrete_gaussian",
    "distributed_noise",
    "epsilon_spent",
    "flip_probability",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_noise",
    "gaussian_sigma",
    "laplace_epsilon",
    "laplace_noise",
    "laplace_scale",
    "mean_laplace_noise",
    "noise_scale",
    "privacy_settings",
    "privacy_spent",
    "privatize",
    "randomized_response",
    "read_privacy_spent",
    "resolve_accountant",
    "sensitivity_of",
]
