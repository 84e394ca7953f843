"""Local differential-privacy mechanisms shared by the estimators.

Clipping, Gaussian and Laplace noise, randomized response, and their noise-scale formulas.
What the guarantees cover, and what they do not (per-release cost, composition over rounds),
is documented in ``sklearn_fedmf.privacy._mechanisms``.
"""

from ._mechanisms import (
    MECHANISMS,
    PrivacyWarning,
    check_privacy,
    clip_entries,
    compose_basic,
    flip_probability,
    gaussian_noise,
    gaussian_sigma,
    laplace_epsilon,
    laplace_noise,
    laplace_scale,
    noise_scale,
    privatize,
    randomized_response,
    sensitivity_of,
)

__all__ = [
    "MECHANISMS",
    "PrivacyWarning",
    "check_privacy",
    "clip_entries",
    "compose_basic",
    "flip_probability",
    "gaussian_noise",
    "gaussian_sigma",
    "laplace_epsilon",
    "laplace_noise",
    "laplace_scale",
    "noise_scale",
    "privatize",
    "randomized_response",
    "sensitivity_of",
]
