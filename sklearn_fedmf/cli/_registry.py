"""The method registry of the ``fedmf`` command: each method's estimator class, variant and
default grid, and the mapping of command-line options onto estimator parameters."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from ..completion import PAPER_SETTINGS
from ..model_selection import default_search_space
from ..privacy import LocalDP
from ._messages import CommandError

MAIN_JOB = ("fedmc-admm", "fedmavg")
PROTOCOL = dict(clients=100, clients_per_round=10, rounds=100, rank=5, seed=0, test_size=0.2)


@dataclass(frozen=True)
class Method:
    """One entry of the registry: an estimator class, the parameters of its variant, a grid."""

    name: str
    target: str  # "module:Class"
    kind: str  # "completion" (ratings, held-out RMSE) or "binary" (0/1 data, F1)
    label: str
    sends: str  # what a client uploads, for ``fedmf methods``
    fixed: dict = field(default_factory=dict)
    grid: dict | list = field(default_factory=dict)  # a grid or a list of sub-grids
    objective: str = ""  # methods with the same label here record the same objective function

    def load(self):
        """The estimator class, or None when it is not part of this installation."""
        module, _, cls = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            return None


# The RFRec authors' code settings: the paper's plain gradient steps (learning_rate 0.05)
# diverge on MovieLens, Adam is scale-free (RFRec docstring; benchmarks/bench_rfrec.py).
_RFREC_CODE = {**PAPER_SETTINGS["RFRec"], "optimizer": "adam", "link": "sigmoid",
               "learning_rate": 0.1, "reg_consensus": 20.0}
# The methods run with the papers' settings (PAPER_SETTINGS), not the measured defaults: the
# main job reproduces the papers' comparison.

METHODS = {
    m.name: m
    for m in [
        Method(
            "fedmc-admm", "sklearn_fedmf.completion:FedMCADMM", "completion", "FedMC-ADMM",
            "its item-factor copy W_i and dual Y_i",
            fixed=dict(PAPER_SETTINGS["FedMCADMM"]),
            grid=default_search_space(
                "FedMCADMM", include=["regularization", "alpha_u", "beta", "biased"]),
            objective="fedmc",
        ),
        Method(
            "fedmavg", "sklearn_fedmf.completion:FedMAvg", "completion", "FedMAvg",
            "its item-factor copy W_i after Q2 local steps",
            # the baseline as the FedMC-ADMM paper restates it
            fixed={"variant": "fedmc_admm", **PAPER_SETTINGS["FedMAvg"]},
            grid=default_search_space(
                "FedMAvg", include=["regularization", "alpha_u", "alpha_v", "biased"]),
            objective="fedmc",  # (1/p) sum_i [f_i + R_i] + R(V), as FedMC-ADMM's
        ),
        Method(
            "fedmgs", "sklearn_fedmf.completion:FedMGS", "completion", "FedMGS",
            "per rated item, its data aggregates sum x u and sum u u^T, and its Gram U_i^T U_i",
            fixed=dict(PAPER_SETTINGS["FedMGS"]),
            grid=default_search_space(
                "FedMGS", include=["regularization", "alpha_u", "alpha_v", "biased"]),
        ),
        Method(
            "rfrec", "sklearn_fedmf.completion:RFRec", "completion", "RFRec",
            "its item-matrix copy V_(c) (optionally clipped + Laplace noise)",
            fixed={"variant": "rfrec", **_RFREC_CODE},
            grid={"reg_consensus": [5.0, 20.0, 80.0], "learning_rate": [0.03, 0.1],
                  "n_clients": [50, 100], "n_components": [5, 10]},
        ),
        Method(
            "rfrecf", "sklearn_fedmf.completion:RFRec", "completion", "RFRecF",
            "its item-matrix copy V_(c), only when its coin flips to averaging",
            fixed={"variant": "rfrecf", "p": 0.8, "pull_eta": 1.0, **_RFREC_CODE},
            grid={"reg_consensus": [5.0, 20.0, 80.0], "p": [0.5, 0.8],
                  "n_clients": [50, 100], "n_components": [5, 10]},
        ),
        Method(
            "felb", "sklearn_fedmf.binary:Felb", "binary", "Felb",
            "its item-factor copy V_i (optionally with local DP noise)",
            grid={"lam": [0.01, 0.1], "gamma": [0.1, 1.0], "sync_every": [5, 10],
                  "n_clients": [10, 50], "n_components": [10, 20]},
        ),
        Method(
            "felb-mu", "sklearn_fedmf.binary:Felb", "binary", "Felb-MU",
            "its item-factor copy V_i (optionally with local DP noise)",
            fixed={"update": "mu"},
            grid={"lam": [0.01, 0.1], "gamma": [0.1, 1.0], "sync_every": [5, 10],
                  "n_clients": [10, 50], "n_components": [10, 20]},
        ),
    ]
}

# command-line option -> estimator parameter
_OPTION_PARAMS = {
    "clients": "n_clients", "clients_per_round": "clients_per_round", "rounds": "max_iter",
    "rank": "n_components", "jobs": "n_jobs", "seed": "random_state",
}


def available_methods():
    """Registry entries whose estimator exists in this installation."""
    return {name: m for name, m in METHODS.items() if m.load() is not None}


def _methods(text):
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    available = available_methods()
    if not names:
        raise CommandError(f"--method {text!r}: no method named; available: "
                           f"{', '.join(available)}")
    for name in names:
        if name not in available:
            raise CommandError(
                f"unknown method {name!r}; available: {', '.join(available)}"
            )
    if len({available[n].kind for n in names}) > 1:
        raise CommandError(
            "rating-completion and binary methods cannot share a run (different data and "
            "metrics); run them separately"
        )
    return [available[n] for n in names]


def _flag(option):
    return "--" + option.replace("_", "-")


def make_estimator(method, args, *, verbose=0):
    """The estimator of ``method`` with the command-line options mapped onto its parameters.

    An option the user gave for a parameter the estimator does not have, and a value the
    estimator rejects, are errors naming the option (before anything is fitted).
    """
    cls = method.load()
    params = cls().get_params()
    chosen = {**method.fixed}
    origin = {}  # parameter -> the option that set it, for error messages
    for option, param in _OPTION_PARAMS.items():
        value = getattr(args, option, None)
        if value is None:
            continue
        if param in params:
            chosen[param] = value
            origin[param] = f"{_flag(option)} {value}"
        elif option in args.explicit:
            raise CommandError(f"{_flag(option)}: {method.name} has no parameter {param}")
    if "verbose" in params:
        chosen["verbose"] = verbose
    for key, value in (getattr(args, "set", None) or []):
        if key.startswith("privacy__") and "privacy" in params:
            chosen["privacy"] = _privacy_field(chosen.get("privacy"), key, value)
            continue
        if key not in params:
            raise CommandError(f"--set {key}=...: {method.name} has no parameter {key!r}")
        chosen[key] = value
        origin[key] = f"--set {key}={value!r}"
    for param, where in origin.items():
        check_value(method, param, chosen[param], where)
    return cls(**chosen)


def _privacy_field(privacy, key, value):
    """``privacy`` (a new :class:`~sklearn_fedmf.privacy.LocalDP` when None) with the field of
    ``--set privacy__<field>=value`` set and checked."""
    privacy = LocalDP() if privacy is None else privacy
    field = key[len("privacy__"):]
    if field not in privacy.get_params():
        raise CommandError(f"--set {key}=...: LocalDP has no field {field!r} (fields: "
                           f"{', '.join(sorted(privacy.get_params()))})")
    privacy.set_params(**{field: value})
    try:
        privacy._validate_params()
    except (TypeError, ValueError) as exc:  # sklearn's InvalidParameterError is both
        raise CommandError(f"--set {key}={value!r}: {exc}") from None
    return privacy


def check_value(method, param, value, where):
    """Raise a one-line :class:`CommandError` naming ``where`` unless the estimator of
    ``method`` accepts ``value`` for ``param`` (its ``_parameter_constraints``)."""
    try:
        method.load()(**{**method.fixed, param: value})._validate_params()
    except (TypeError, ValueError) as exc:  # sklearn's InvalidParameterError is both
        raise CommandError(f"{where}: {exc}") from None
