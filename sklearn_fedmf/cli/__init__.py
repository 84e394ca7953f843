"""The ``fedmf`` command: run, compare and tune federated matrix factorization from a shell.

``fedmf`` alone is the README's main job: FedMC-ADMM and FedMAvg on the embedded MovieLens
latest-small under the papers' protocol (80/20 hold-out with seed 0, 100 clients, 10 sampled
per round, 100 rounds, rank 5), each with the papers' settings and with the library's
defaults, beside two yardsticks on the same split and clients: the global mean and the
federated biases-only model (:class:`~sklearn_fedmf.FedBaseline`). It prints a
table of final train and test RMSE, seconds (compilation excluded) and bytes communicated
and writes ``curves.png`` (objective and test RMSE per round, the yardsticks as horizontal
lines) and ``history.json`` to ``--out``. ``fedmf run`` takes any method and data set,
``fedmf tune`` runs a (halving) grid search (entry-wise folds of the ratings by default),
``fedmf recommend`` fits on a ratings file and prints users' top-N items, and ``fedmf
methods`` lists the registry.

Every error prints one line on stderr and exits non-zero; ``FEDMF_DEBUG=1`` shows tracebacks.
Building the parser imports neither scikit-learn nor numba (``fedmf --help`` stays fast):
each command imports what it needs when it runs.
"""

import importlib
import os
import sys

from ._flower import add_flower_split
from ._messages import _one_line
from ._options import (
    _assignment,
    _at_least_two,
    _columns,
    _common,
    _grid_entry,
    _non_negative_int,
    _Parser,
    _positive_int,
)
from ._registry import MAIN_JOB, METHODS, PROTOCOL, RATING_METHODS, RECOMMEND_METHOD

__all__ = ["main", "build_parser", "METHODS"]

# public helpers of the command, imported from their module on first use (PEP 562)
_LAZY = {
    "fit_method": "_commands", "load_data": "_data", "read_ratings": "_data",
    "load_pairs": "_data", "prepare_data": "_data", "binarize": "_data",
    "BINARY_THRESHOLD": "_data", "format_table": "_report", "format_search": "_report",
    "plot_histories": "_report", "load_model": "_recommend",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})


# The commands, each importing its module when it runs.
def cmd_run(args):
    from ._commands import cmd_run

    return cmd_run(args)


def cmd_tune(args):
    from ._tune import cmd_tune

    return cmd_tune(args)


def cmd_recommend(args):
    from ._recommend import cmd_recommend

    return cmd_recommend(args)


def cmd_methods(args):
    from ._commands import cmd_methods

    return cmd_methods(args)


def build_parser():
    """The argument parser of the ``fedmf`` command."""
    names = ", ".join(METHODS)
    parser = _Parser(
        prog="fedmf",
        description="Federated matrix factorization from the command line. With no command, "
                    "runs the main job: FedMC-ADMM and FedMAvg on the embedded MovieLens "
                    "latest-small under the papers' protocol (80/20 hold-out, 100 clients, "
                    "10 per round, 100 rounds, rank 5), each with the papers' settings and "
                    "the library's defaults, beside the global mean and the federated "
                    "biases-only model, i.e. 'fedmf run' with its defaults. Options given "
                    "without a command go to 'run'.",
        epilog="Run 'fedmf COMMAND --help' for the options of a command. Errors print one line "
               "and exit with status 1 (2 for bad options); set FEDMF_DEBUG=1 for tracebacks.",
    )
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                help="'run' when omitted")

    run = sub.add_parser(
        "run", help="fit one or more methods beside the yardsticks, print a table, write "
                    "curves.png and history.json",
        description="Fit each method on the training ratings with the held-out ratings as "
                    "eval_set, print final train/test RMSE (F1 and RMSD for binary methods, "
                    "which use the data binarized at rating >= 3.5 and no hold-out), seconds "
                    "and megabytes uploaded/downloaded, and write curves.png (objective and "
                    "test RMSE per round) and history.json (every round's record) to --out. "
                    "Rating methods run beside two yardsticks on the same split and clients "
                    "(the global mean and FedBaseline, the federated biases-only model), "
                    "each with the papers' settings and with the estimator's defaults "
                    "(--settings). Every fit runs one untimed warm-up round first, so that "
                    "the seconds exclude compiling the kernels.")
    run.add_argument("--method", default=",".join(MAIN_JOB), metavar="NAMES",
                     help=f"comma-separated methods among {names} (default: %(default)s)")
    run.add_argument("--settings", choices=("both", "papers", "defaults"), default="both",
                     help="rows of each rating method: the papers' settings "
                          "(sklearn_fedmf.completion.PAPER_SETTINGS), the estimator's "
                          "defaults, or both (default: %(default)s)")
    run.add_argument("--task", choices=("ratings", "topn"), default="ratings",
                     help="ratings: the 80/20 rating protocol (RMSE); topn: leave-one-out "
                          "(one random rating per user held out), each rating method with "
                          "loss=\"implicit\" (its defaults) and on ratings, beside the most "
                          "popular items: HR and NDCG at 10 and 20 of full rankings "
                          "(default: %(default)s)")
    run.add_argument("--no-baselines", dest="baselines", action="store_false",
                     help="leave out the two yardstick rows of a rating run (the global mean "
                          "and FedBaseline)")
    run.add_argument("--set", type=_assignment, action="append", metavar="NAME=VALUE",
                     help="any other estimator parameter, or a key of its solver_params, e.g. "
                          "--set beta=0.5 or --set center=False (repeatable; applies to every "
                          "method that has it)")
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
                    "rows). Candidates start from the papers' settings. Default grids: "
                    "sklearn_fedmf.model_selection.default_search_space (two sub-grids: the "
                    "papers' penalties and ALS-WR's weighted lambda, each with its strengths; "
                    "beta; biases); RFRec: reg_consensus, learning_rate, p, n_clients, rank. "
                    "The defaults (the candidates' starting settings) are always scored, as "
                    "one extra candidate when the grid lacks them, and a line after the "
                    "table gives their score and rank beside the best. "
                    "Before the search starts, a line gives the number of fits and an "
                    "estimate of the time: fits of one and three rounds of the first "
                    "candidate on the first fold are timed (after an untimed one) and scaled "
                    "to the fits and rounds of the search over the workers.")
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
    _common(tune, rounds=50)
    tune.set_defaults(func=cmd_tune)

    rec = sub.add_parser(
        "recommend", help="fit on a ratings file (or load a saved model), print users' "
                          "top-N items",
        description="Fit one completion method wrapped in RatingRegressor on --data, with "
                    "the estimator's defaults and --seed: implicit feedback "
                    "(loss=\"implicit\", the ratings as the interactions' strengths) unless "
                    "--ratings asks for the rating model; a second fit that holds out one "
                    "random rating per user prints the lists' HR@10 and NDCG@10 beside the "
                    "most popular items'. Or load a model saved earlier (--model). Then print "
                    "the top-N unrated items of each --user with the data's own ids and their "
                    "number of training ratings (also written to OUT/recommend.json). The "
                    "model is saved only with --save FILE. A user absent from the training "
                    "data is said on stderr and gets the cold-start list (the items of "
                    "highest item bias, or the most rated). The same command and data give "
                    "the same output.")
    rec.add_argument("--method", default=RECOMMEND_METHOD, metavar="NAME",
                     help=f"one rating method among {', '.join(RATING_METHODS)} (default: "
                          "%(default)s)")
    rec.add_argument("--user", action="append", metavar="ID",
                     help="a user id of the data (repeatable)")
    rec.add_argument("--top", type=_positive_int, default=10,
                     help="items per user (default: %(default)s)")
    rec.add_argument("--include-seen", action="store_true",
                     help="also list items the user has rated")
    rec.add_argument("--ratings", action="store_true",
                     help="train the rating model (loss=\"squared\") instead of the "
                          "implicit-feedback one (loss=\"implicit\", the ratings as the "
                          "interactions' strengths); both with the estimator's defaults")
    rec.add_argument("--min-support", type=_non_negative_int, default=None, metavar="N",
                     help="list items known from fewer than N training ratings only after "
                          "all others (default: RatingRegressor.recommend's, 20; 0 ranks "
                          "every item by its score alone)")
    rec.add_argument("--model", metavar="FILE",
                     help="a model saved by an earlier 'fedmf recommend --save' (a pickle: "
                          "load only files you trust)")
    rec.add_argument("--save", metavar="FILE", help="save the fitted model to FILE (joblib)")
    rec.add_argument("--set", type=_assignment, action="append", metavar="NAME=VALUE",
                     help="any other estimator parameter or solver_params key, e.g. "
                          "--set alpha_u=10")
    _common(rec, rounds=None, test_size=False, model_defaults=True)
    rec.set_defaults(func=cmd_recommend)

    add_flower_split(sub, _positive_int, _columns)

    methods = sub.add_parser("methods", help="list the methods",
                             description="List the methods of the registry, their estimators "
                                         "and what their clients upload.")
    methods.set_defaults(func=cmd_methods)
    return parser


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
