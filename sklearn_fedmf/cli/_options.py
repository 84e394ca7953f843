"""The option types and shared options of the ``fedmf`` argument parser."""

from __future__ import annotations

import argparse
import ast
import sys

from ._registry import KNOWN_COLUMNS, PROTOCOL


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        print(f"{self.prog}: error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def _int_at_least(text, low, what):
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def _positive_int(text):
    return _int_at_least(text, 1, "a positive integer")


def _non_negative_int(text):
    return _int_at_least(text, 0, "an integer >= 0")


def _at_least_two(text):
    value = _positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected an integer >= 2, got {text!r}")
    return value


def _seed(text):
    # numpy's SeedSequence takes non-negative integers; 2**32 - 1 is the largest seed that
    # every numpy RandomState accepts too
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value < 2**32:
        raise argparse.ArgumentTypeError(
            f"expected an integer from 0 to {2**32 - 1}, got {text!r}")
    return value


def _n_jobs(text):
    # joblib's convention: -1 all cores, -2 all but one, ...; 0 means nothing
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value == 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of workers or a negative one (-1 = all cores, -2 = all "
            f"but one), got {text!r}")
    return value


def _fraction(text):
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction strictly between 0 and 1, "
                                         f"got {text!r}")
    return value


def _count_or_fraction(text):
    try:
        value = float(text) if "." in text else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or a fraction, got {text!r}") from None
    if value <= 0 or (isinstance(value, float) and value > 1):
        raise argparse.ArgumentTypeError(f"expected a count >= 1 or a fraction in (0, 1], "
                                         f"got {text!r}")
    return value


def _literal(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _assignment(text):
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return key.strip(), _literal(value.strip())


def _grid_entry(text):
    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=V1,V2,..., got {text!r}")
    return key.strip(), [_literal(v.strip()) for v in values.split(",")]


class _Explicit(argparse.Action):
    """Store the value and remember that the user gave the option."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.explicit = {*getattr(namespace, "explicit", set()), self.dest}


def _columns(group):
    """The columns of a CSV ratings file: ``--user-col``, ``--item-col``, ``--rating-col``
    (unset: detected from the header, see :func:`~sklearn_fedmf.cli._data.read_csv_ratings`)."""
    known = "; ".join("/".join(names) for names in KNOWN_COLUMNS[:3])
    for option, what in zip(("--user-col", "--item-col", "--rating-col"),
                            ("user", "item", "rating")):
        group.add_argument(option, default=None, metavar="NAME",
                           help=f"{what} column of a CSV file (default: detected from the "
                                f"header, among {known}; a file without a header: its first "
                                "three columns)")


def _common(parser, *, rounds, test_size=True, model_defaults=False):
    """The options every fitting command shares: the data and its columns, the federation
    and the common ``--quiet``, ``--seed``, ``--jobs`` and ``--out``.

    ``model_defaults=True`` (``recommend``): the federation options left out keep the
    estimator's own values, so their defaults are unset here and ``rounds`` is ignored.
    """
    p = PROTOCOL
    data = parser.add_argument_group("data")
    data.add_argument("--data", default="embedded", metavar="SPEC",
                      help="'embedded' (MovieLens latest-small shipped with the package, the "
                           "default), a MovieLens ratings file or folder (u.data, ratings.dat "
                           "or ratings.csv; 100K, 1M, 10M, 20M, 25M, latest), any CSV file "
                           "(columns: --user-col, --item-col, --rating-col), "
                           "'movielens:VARIANT' (fetch_movielens: download once, then cached), "
                           "'synthetic:USERSxITEMSxRATINGS' (make_ratings, e.g. "
                           "synthetic:2000x500x50k) or, for binary methods, "
                           "'tiles:ROWSxCOLSxTILES' (make_binary_tiles). Binary methods "
                           "binarize ratings at >= 3.5")
    _columns(data)
    if test_size:
        data.add_argument("--test-size", type=_fraction, default=p["test_size"],
                          metavar="FRACTION",
                          help="held-out fraction of each user's ratings (default: "
                               "%(default)s)")
    fed = parser.add_argument_group("federation")
    def default(own, ours="%(default)s"):
        return f"(default: the estimator's own: {own})" if model_defaults else f"(default: {ours})"

    fed.add_argument("--clients", type=_positive_int, action=_Explicit,
                     default=None if model_defaults else p["clients"],
                     help="number of clients the users are split into " + default(
                         "n_clients=10", "%(default)s, or one per user when the data has "
                         "fewer users"))
    fed.add_argument("--clients-per-round", type=_count_or_fraction, action=_Explicit,
                     default=None if model_defaults else p["clients_per_round"], metavar="M",
                     help="clients sampled each round: a count, or a fraction like 0.1 "
                          + default("every client"))
    fed.add_argument("--rounds", type=_positive_int, action=_Explicit,
                     default=None if model_defaults else rounds,
                     help="communication rounds " + default("max_iter, which depends on the "
                                                            "loss"))
    fed.add_argument("--rank", type=_positive_int, action=_Explicit,
                     default=None if model_defaults else p["rank"],
                     help="rank / number of components " + default(
                         "n_components, which grows with the data"))
    common = parser.add_argument_group("common options (every fitting command)")
    common.add_argument("--quiet", action="store_true",
                        help="no progress on stderr (no bar per fit, no line per tuned "
                             "candidate); notes and errors stay")
    common.add_argument("--seed", type=_seed, default=p["seed"], action=_Explicit,
                        help="seed of the split, the partition and every round (default: "
                             "%(default)s)")
    common.add_argument("--jobs", type=_n_jobs, default=1, action=_Explicit,
                        help="parallel workers (joblib n_jobs; -1 = all cores; default: 1, "
                             "fastest on the small embedded data)")
    common.add_argument("--out", default="fedmf-out", metavar="DIR",
                        help="folder of the command's files: its JSON report, and run's "
                             "figure (default: %(default)s)")
    parser.set_defaults(explicit=set())
