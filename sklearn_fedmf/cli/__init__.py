"""The ``fedmf`` command: run, compare and tune federated matrix factorization from a shell.

``fedmf`` alone is the README's main job: FedMC-ADMM and FedMAvg side by side on the embedded
MovieLens latest-small under the papers' protocol (80/20 hold-out with seed 0, 100 clients, 10
sampled per round, 100 rounds, rank 5). It prints a table of final test RMSE, seconds and bytes
communicated and writes ``curves.png`` (objective and test RMSE per round) and
``history.json`` to ``--out``. ``fedmf run`` takes any method and data set, ``fedmf tune``
runs a (halving) grid search (entry-wise folds of the ratings by default), ``fedmf recommend``
fits on a ratings file, saves the model and prints users' top-N items, and ``fedmf methods``
lists the registry.

Every error prints one line on stderr and exits non-zero; ``FEDMF_DEBUG=1`` shows tracebacks.
"""

import os
import sys

# the command's public names, importable from here (build_parser and main use some of them)
from ._commands import cmd_methods, cmd_run, cmd_tune, fit_method  # noqa: F401
from ._data import BINARY_THRESHOLD, binarize, load_data, prepare_data  # noqa: F401
from ._flower import add_flower_split
from ._messages import CommandError, _one_line  # noqa: F401
from ._options import _assignment, _at_least_two, _common, _grid_entry, _Parser, _positive_int
from ._ratings import cmd_recommend, load_pairs  # noqa: F401
from ._registry import (  # noqa: F401
    MAIN_JOB,
    METHODS,
    PROTOCOL,
    Method,
    available_methods,
    make_estimator,
)
from ._report import format_search, format_table, plot_histories  # noqa: F401

__all__ = ["main", "METHODS"]


def build_parser():
    """The argument parser of the ``fedmf`` command."""
    names = ", ".join(METHODS)
    parser = _Parser(
        prog="fedmf",
        description="Federated matrix factorization from the command line. With no command, "
                    "runs the main job: FedMC-ADMM and FedMAvg side by side on the embedded "
                    "MovieLens latest-small under the papers' protocol (80/20 hold-out, 100 "
                    "clients, 10 per round, 100 rounds, rank 5), i.e. 'fedmf run' with its "
                    "defaults. Options given without a command go to 'run'.",
        epilog="Run 'fedmf COMMAND --help' for the options of a command. Errors print one line "
               "and exit with status 1 (2 for bad options); set FEDMF_DEBUG=1 for tracebacks.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="'run' when omitted")

    run = sub.add_parser(
        "run", help="fit one or more methods, print a table, write curves.png and history.json",
        description="Fit each method on the training ratings with the held-out ratings as "
                    "eval_set, print final train/test RMSE (F1 and RMSD for binary methods, "
                    "which use the data binarized at rating >= 3.5 and no hold-out), seconds "
                    "and megabytes uploaded/downloaded, and write curves.png (objective and "
                    "test RMSE per round) and history.json (every round's record) to --out.")
    run.add_argument("--method", default=",".join(MAIN_JOB), metavar="NAMES",
                     help=f"comma-separated methods among {names} (default: %(default)s; "
                          "'fedmf methods' lists those installed)")
    run.add_argument("--set", type=_assignment, action="append", metavar="NAME=VALUE",
                     help="any other estimator parameter, e.g. --set beta=0.5 (repeatable; "
                          "applies to every method that has it)")
    run.add_argument("--quiet", action="store_true", help="no progress bars")
    _common(run, rounds=PROTOCOL["rounds"])
    run.set_defaults(func=cmd_run)

    tune = sub.add_parser(
        "tune", help="grid search (GridSearchCV or HalvingGridSearchCV) of one method",
        description="Cross-validate a grid of parameters. Rating methods (--split ratings, "
                    "the default): the ratings are split into --cv folds (KFold, the papers' "
                    "entry-wise protocol) and each candidate, wrapped in RatingRegressor, is "
                    "fit on the other folds' ratings and scored by RMSE on the fold's. With "
                    "--split users (and for binary methods) the users are split instead: each "
                    "candidate is fit on the training ratings of the other folds' users and "
                    "scored on the held-out ratings of the fold's users by fold-in (X = "
                    "training matrix, y = held-out matrix; binary methods: F1 on the fold's "
                    "rows). Default grids: sklearn_fedmf.model_selection.default_search_space "
                    "(two sub-grids: the papers' penalties and ALS-WR's weighted lambda, "
                    "each with its strengths; beta; biases); RFRec: reg_consensus, "
                    "learning_rate, p, n_clients, rank.")
    tune.add_argument("--method", default="fedmc-admm", metavar="NAME",
                      help=f"one of {names} (default: %(default)s)")
    tune.add_argument("--grid", type=_grid_entry, action="append", metavar="NAME=V1,V2",
                      help="a parameter and its values (repeatable); replaces the method's "
                           "default grid. A parameter cannot be both in --grid and set by an "
                           "option (--clients, --rank, ...); an option given without --grid "
                           "fixes its parameter and drops it from the default grid")
    tune.add_argument("--cv", type=_at_least_two, default=3,
                      help="folds, at least 2 (default: %(default)s)")
    tune.add_argument("--halving", action="store_true",
                      help="HalvingGridSearchCV with the rounds (max_iter) as the resource, up "
                           "to --rounds")
    tune.add_argument("--top", type=_positive_int, default=15,
                      help="rows of the ranked table to print (default: %(default)s)")
    tune.add_argument("--split", choices=("ratings", "users"), default="ratings",
                      help="what the folds hold out for rating methods: ratings of users who "
                           "stay in training (entry-wise, the default) or whole users "
                           "(fold-in)")
    _ratings_columns(tune)
    tune.add_argument("--quiet", action="store_true",
                      help="no progress line per candidate on stderr")
    _common(tune, rounds=50)
    tune.set_defaults(func=cmd_tune)

    rec = sub.add_parser(
        "recommend", help="fit on a ratings file, save the model, print users' top-N items",
        description="Fit one rating method, wrapped in RatingRegressor, on every rating of "
                    "--data (a MovieLens file or folder, the embedded data, or any CSV with "
                    "a header: --user-col, --item-col, --rating-col), save it with joblib "
                    "(--save) and print the top-N unrated items of each --user with the "
                    "data's own ids. --model loads a saved model instead of fitting.")
    rec.add_argument("--method", default="fedmavg", metavar="NAME",
                     help=f"one rating method among {names} (default: %(default)s)")
    rec.add_argument("--user", action="append", metavar="ID",
                     help="a user id of the data (repeatable); an unknown id gets the "
                          "cold-start list (the most rated items)")
    rec.add_argument("--top", type=_positive_int, default=10,
                     help="items per user (default: %(default)s)")
    rec.add_argument("--include-seen", action="store_true",
                     help="also list items the user has rated")
    rec.add_argument("--model", metavar="FILE", help="a model saved by an earlier run")
    rec.add_argument("--save", metavar="FILE",
                     help="where to save the fitted model (default: OUT/model.joblib)")
    rec.add_argument("--set", type=_assignment, action="append", metavar="NAME=VALUE",
                     help="any other estimator parameter, e.g. --set alpha_u=10")
    _ratings_columns(rec)
    _common(rec, rounds=PROTOCOL["rounds"])
    rec.set_defaults(func=cmd_recommend)

    add_flower_split(sub, _positive_int)

    methods = sub.add_parser("methods", help="list the installed methods",
                             description="List the methods of this installation.")
    methods.set_defaults(func=cmd_methods)
    return parser


def _ratings_columns(parser):
    cols = parser.add_argument_group("columns of a CSV ratings file")
    cols.add_argument("--user-col", default="userId", help="(default: %(default)s)")
    cols.add_argument("--item-col", default="movieId", help="(default: %(default)s)")
    cols.add_argument("--rating-col", default="rating", help="(default: %(default)s)")


def main(argv=None):
    """Entry point of ``fedmf`` and ``python -m sklearn_fedmf``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["run", *argv]
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("\nfedmf: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line, no traceback (FEDMF_DEBUG=1 shows it)
        if os.environ.get("FEDMF_DEBUG"):
            raise
        print(f"fedmf: error: {_one_line(exc)}", file=sys.stderr)
        return 1
