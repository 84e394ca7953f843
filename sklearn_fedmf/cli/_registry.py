"""The method registry of the ``fedmf`` command: each method's estimator class, variant,
papers' settings and default grid, and the mapping of command-line options onto estimator
parameters.

Nothing here imports an estimator until a method is used: ``fedmf --help`` builds its parser
from the names alone.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field

from ._messages import CommandError

MAIN_JOB = ("fedmc-admm", "fedmavg")
# recommend's model, as RatingRegressor's default estimator
RECOMMEND_METHOD = "fedmgs"
PROTOCOL = dict(clients=100, clients_per_round=10, rounds=100, rank=5, seed=0, test_size=0.2)
COLUMNS = ("userId", "movieId", "rating")  # MovieLens's
# The (user, item, rating) headers read without --user-col/--item-col/--rating-col, in this
# order of preference (case ignored); a file whose first line is data has no header.
KNOWN_COLUMNS = (COLUMNS, ("user", "item", "rating"), ("user_id", "item_id", "rating"),
                 ("userId", "itemId", "rating"), ("user_id", "movie_id", "rating"))


@dataclass(frozen=True)
class Method:
    """One entry of the registry: an estimator class, its variant, the papers' settings, a grid.

    ``variant`` is always applied (it makes the entry what it is, e.g. RFRecF); ``paper``
    names the entry of :data:`sklearn_fedmf.completion.PAPER_SETTINGS` applied on top, with
    ``extra`` after it (settings the papers' code used); ``search`` is the ``include`` list of
    :func:`~sklearn_fedmf.model_selection.default_search_space`, or ``grid_`` an explicit grid.
    """

    name: str
    target: str  # "module:Class"
    kind: str  # "completion" (ratings, held-out RMSE) or "binary" (0/1 data, F1)
    label: str
    sends: str  # what a client uploads, for ``fedmf methods``
    variant: dict = field(default_factory=dict)
    paper: str = ""  # key of PAPER_SETTINGS
    extra: dict = field(default_factory=dict)
    search: tuple = ()
    grid_: dict = field(default_factory=dict)
    objective: str = ""  # methods with the same label here record the same objective function

    def load(self):
        """The estimator class."""
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)

    @property
    def papers(self):
        """The parameters of the papers' settings (``variant`` included; ``solver_params``
        merged key by key)."""
        from ..engine._fit import merge_params

        settings = {}
        if self.paper:
            from ..completion import PAPER_SETTINGS

            settings = PAPER_SETTINGS[self.paper]
        return merge_params(self.variant, settings, self.extra)

    @property
    def fixed(self):
        """The parameters ``tune`` and ``recommend`` start from: the papers' settings."""
        return self.papers

    @property
    def grid(self):
        """The default ``tune`` grid: a dict, or a list of sub-grids."""
        if self.search:
            from ..model_selection import default_search_space

            return default_search_space(self.load().__name__, include=list(self.search))
        return self.grid_


# RFRecF with the authors' code settings (PAPER_SETTINGS["RFRecF"]): ``p`` is a solver
# constant, so the grid gives whole ``solver_params`` dicts, the code's with each ``p``.
_RFRECF_CODE = {"optimizer": "adam", "link": "sigmoid", "partition": "contiguous",
                "variant": "rfrecf", "pull_eta": 1.0}
_FELB_GRID = {"lam": [0.01, 0.1], "gamma": [0.1, 1.0], "sync_every": [5, 10],
              "n_clients": [10, 50], "n_components": [10, 20]}
_SEARCH = ("regularization", "alpha_u", "alpha_v", "biased")

METHODS = {
    m.name: m
    for m in [
        Method(
            "fedmc-admm", "sklearn_fedmf.completion:FedMCADMM", "completion", "FedMC-ADMM",
            "its item-factor copy W_i and dual Y_i", paper="FedMCADMM",
            search=("regularization", "alpha_u", "beta", "biased"), objective="fedmc",
        ),
        Method(
            "fedmavg", "sklearn_fedmf.completion:FedMAvg", "completion", "FedMAvg",
            "its item-factor copy W_i after Q2 local steps",
            # the papers' settings: the baseline as the FedMC-ADMM paper restates it, which
            # records FedMC-ADMM's objective (1/p) sum_i [f_i + R_i] + R(V)
            paper="FedMAvg", extra={"solver_params": {"variant": "fedmc_admm"}},
            search=_SEARCH,
            objective="fedmc",
        ),
        Method(
            "fedmgs", "sklearn_fedmf.completion:FedMGS", "completion", "FedMGS",
            "per rated item, its data aggregates sum x u and sum u u^T, and its Gram U_i^T U_i",
            paper="FedMGS", search=_SEARCH,
        ),
        Method(
            "rfrec", "sklearn_fedmf.completion:RFRec", "completion", "RFRec",
            "its item-matrix copy V_(c) (optionally clipped + Laplace noise)",
            variant={"solver_params": {"variant": "rfrec"}}, paper="RFRec",  # (the code's)
            grid_={"reg_consensus": [5.0, 20.0, 80.0], "learning_rate": [0.03, 0.1],
                   "n_clients": [50, 100], "n_components": [5, 10]},
        ),
        Method(
            "rfrecf", "sklearn_fedmf.completion:RFRec", "completion", "RFRecF",
            "its item-matrix copy V_(c), only when its coin flips to averaging",
            variant={"solver_params": {"variant": "rfrecf"}}, paper="RFRecF",  # (the code's)
            grid_={"reg_consensus": [5.0, 20.0, 80.0],
                   "solver_params": [{**_RFRECF_CODE, "p": p} for p in (0.5, 0.8)],
                   "n_clients": [50, 100], "n_components": [5, 10]},
        ),
        Method(
            "baseline", "sklearn_fedmf.completion:FedBaseline", "completion",
            "biases only (FedBaseline)",
            "per item its users rated, the change of its sums of r - mean - b_u",
            search=("alpha_u", "alpha_v"),
        ),
        Method(
            "blend", "sklearn_fedmf.completion:FedBlend", "completion", "FedBlend",
            "each member's uploads; then, over its validation ratings, the sums D^T D, D^T r, "
            "r^T r and its count (D: the members' predictions)",
            grid_={"final_alpha": [1.0, 10.0, 100.0], "activity_weights": [False, True]},
        ),
        Method(
            "felb", "sklearn_fedmf.binary:Felb", "binary", "Felb",
            "its item-factor copy V_i (optionally with local DP noise)", grid_=_FELB_GRID,
        ),
        Method(
            "felb-mu", "sklearn_fedmf.binary:Felb", "binary", "Felb-MU",
            "its item-factor copy V_i (optionally with local DP noise)",
            variant={"solver_params": {"update": "mu"}}, grid_=_FELB_GRID,
        ),
    ]
}
RATING_METHODS = tuple(name for name, m in METHODS.items() if m.kind == "completion")

# command-line option -> estimator parameter
_OPTION_PARAMS = {
    "clients": "n_clients", "clients_per_round": "clients_per_round", "rounds": "max_iter",
    "rank": "n_components", "jobs": "n_jobs", "seed": "random_state",
}


def _methods(text):
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if not names:
        raise CommandError(f"--method {text!r}: no method named; available: "
                           f"{', '.join(METHODS)}")
    for name in names:
        if name not in METHODS:
            raise CommandError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    if len({METHODS[n].kind for n in names}) > 1:
        raise CommandError(
            "rating-completion and binary methods cannot share a run (different data and "
            "metrics); run them separately"
        )
    return [METHODS[n] for n in names]


def typed_only(args):
    """``args`` with the federation options the user did not type unset, so that the
    estimator's own defaults apply to them; ``--seed`` (default 0) and ``--jobs`` always
    apply, so the same command gives the same model."""
    from types import SimpleNamespace

    typed = SimpleNamespace(**vars(args))
    for option in _OPTION_PARAMS:
        if option not in args.explicit and option not in ("seed", "jobs"):
            setattr(typed, option, None)
    return typed


def _flag(option):
    return "--" + option.replace("_", "-")


def make_estimator(method, args, *, verbose=0, settings="papers", strict_set=True):
    """The estimator of ``method`` with the command-line options mapped onto its parameters.

    ``settings="papers"`` starts from the papers' settings, ``"defaults"`` from the
    estimator's own defaults (``variant`` is applied either way). ``--set NAME=VALUE`` sets a
    constructor parameter, or, when ``NAME`` is a key of the estimator's ``solver_params``,
    that key (merged into the dict). An option the user gave for
    a parameter the estimator does not have, and a value the estimator rejects, are errors
    naming the option (before anything is fitted); ``strict_set=False`` skips a ``--set``
    parameter the estimator does not have (``run`` applies each to the methods that have it).
    """
    from ..engine._fit import merge_params

    cls = method.load()
    params = cls().get_params()
    chosen = dict(method.papers if settings == "papers" else method.variant)
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
        if key in cls._solver_params and key not in params:  # a solver constant
            chosen = merge_params(chosen, {"solver_params": {key: value}})
            origin[key] = f"--set {key}={value!r}"
            continue
        if key not in params:
            if not strict_set:
                continue
            raise CommandError(f"--set {key}=...: {method.name} has no parameter {key!r}")
        chosen[key] = value
        origin[key] = f"--set {key}={value!r}"
    for param, where in origin.items():
        value = chosen[param] if param in params else chosen["solver_params"][param]
        check_value(method, param, value, where)
    return cls(**chosen)


def settable(method, key):
    """Whether ``--set key=...`` applies to ``method``: a parameter of its estimator, or a key
    of its ``solver_params`` (which ``make_estimator`` routes there)."""
    cls = method.load()
    return key in cls().get_params() or key in getattr(cls, "_solver_params", {})


def _privacy_field(privacy, key, value):
    """``privacy`` (a new :class:`~sklearn_fedmf.privacy.LocalDP` when None) with the field of
    ``--set privacy__<field>=value`` set and checked."""
    from ..privacy import LocalDP  # (lazy: the parser imports no estimator code)

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
    ``method`` accepts ``value`` for ``param`` (its ``_parameter_constraints``, or its
    declared ``solver_params`` key)."""
    from ..engine._fit import merge_params, route_solver_params

    cls = method.load()
    try:
        estimator = cls(**merge_params(method.fixed, route_solver_params(cls, {param: value})))
        estimator._validate_params()
        if hasattr(estimator, "_settings"):  # (FedBlend has no solver_params)
            estimator._settings()  # (checks the solver_params keys)
    except (TypeError, ValueError) as exc:  # sklearn's InvalidParameterError is both
        raise CommandError(f"{where}: {exc}") from None


def one_method(text, command):
    """The one method named by ``--method`` (``tune`` and ``recommend``)."""
    methods = _methods(text)
    if len(methods) != 1:
        raise CommandError(f"--method {text}: {command} takes one method at a time")
    return methods[0]
