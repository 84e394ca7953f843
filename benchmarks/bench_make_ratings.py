"""Time and peak memory of ``make_ratings`` for one matrix size.

Usage::

    python benchmarks/bench_make_ratings.py [n_users n_items n_ratings] [--popularity P]

The default is the MovieLens-1M shape (6040 x 3706, 1000209 ratings); the Netflix shape is
``480189 17770 100000000``. Peak memory is the process's maximum resident set size.
"""

import argparse
import resource
import sys
import time

import numpy as np

from sklearn_fedmf.datasets import make_ratings


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="*", type=int, default=[6040, 3706, 1_000_209])
    parser.add_argument("--popularity", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if len(args.shape) != 3:
        parser.error("give n_users n_items n_ratings (three integers)")
    n_users, n_items, n_ratings = args.shape
    start = time.perf_counter()
    data = make_ratings(
        n_users, n_items, n_ratings, popularity=args.popularity, random_state=args.seed
    )
    seconds = time.perf_counter() - start
    X = data.X
    # ru_maxrss is in KiB on Linux, in bytes on macOS
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_gb = peak / (2**30 if sys.platform == "darwin" else 2**20)
    per_item = np.bincount(X.indices, minlength=n_items)
    per_user = np.diff(X.indptr)
    print(f"{'n_users':>9} {'n_items':>8} {'n_ratings':>11} {'seconds':>8} {'peak_GB':>8}")
    print(f"{n_users:>9} {n_items:>8} {X.nnz:>11} {seconds:>8.1f} {peak_gb:>8.2f}")
    print(
        f"ratings per user: min {per_user.min()}, median {int(np.median(per_user))}, "
        f"max {per_user.max()}; per item: median {int(np.median(per_item))}, max {per_item.max()}"
    )


if __name__ == "__main__":
    main()
