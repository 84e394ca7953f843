"""Predicting at scale: pair predictions and top-N lists of ``RatingRegressor``.

Prediction costs do not depend on how the factors were trained, so each model here is a
``RatingRegressor`` fitted for one round on a sparse "seen" pattern of the right shape, whose
factors are then replaced by random factors of the benchmark's rank. Three tables:

1. ``predict`` on 10 million (user, item) pairs at the Netflix shape (480,189 x 17,770,
   rank 13), with consecutive integer ids and with ids that need the hash map, and the
   memory it allocated (tracemalloc).
2. ``recommend`` top-10 for every user of the ML-1M shape (6,040 x 3,706, rank 20, seen
   items excluded, 1,000,209 seen ratings) beside the naive numpy computation (all scores
   as one dense matrix, seen entries masked, ``argpartition``), checked to agree.
3. ``recommend`` top-10 for every user of the Netflix shape, in a fresh subprocess: the peak
   memory it allocates above the fitted model (tracemalloc) and the process's peak RSS.

    python benchmarks/bench_predict.py --quick   # small shapes, seconds
    python benchmarks/bench_predict.py           # the shapes above (about a minute)
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import warnings

import numpy as np

SHAPES = {  # users, items, rank, seen ratings
    "netflix": (480_189, 17_770, 13, 2 * 480_189),
    "ml1m": (6_040, 3_706, 20, 1_000_209),
}
QUICK = {"netflix": (20_000, 3_000, 13, 40_000), "ml1m": (1_000, 800, 20, 50_000)}


def random_model(n_users, n_items, rank, n_seen, seed=0):
    """A fitted RatingRegressor with random factors, and its seen pattern (users, items)."""
    from sklearn_fedmf import FedMAvg, RatingRegressor
    from sklearn_fedmf.exceptions import FedMFWarning

    rng = np.random.default_rng(seed)
    users = np.concatenate([np.arange(n_users), rng.integers(0, n_users, n_seen - n_users)])
    items = rng.integers(0, n_items, n_seen)
    items[:n_items] = np.arange(n_items)  # every item seen
    y = rng.integers(1, 6, n_seen).astype(float)
    reg = RatingRegressor(FedMAvg(
        n_components=rank, n_clients=10, max_iter=1, biased=False, random_state=0,
        solver_params={"eval_every": 0},
    ))  # random factors, no biases
    with warnings.catch_warnings():  # one round on random ratings: it says so
        warnings.simplefilter("ignore", FedMFWarning)
        reg.fit(np.column_stack([users, items]), y)
    est = reg.estimator_
    est.user_factors_ = rng.normal(scale=0.3, size=(n_users, rank))
    est.components_ = rng.normal(scale=0.3, size=(rank, n_items))
    return reg, users, items


def timed(fn, repeat):
    """Median wall seconds and median CPU seconds (all threads) of ``fn``, and its result.

    On a busy machine the wall time stretches; the CPU time, divided by the cores, is what
    the same call costs when it has them to itself.
    """
    times, cpu, out = [], [], None
    for _ in range(repeat):
        tic, tic_cpu = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - tic)
        cpu.append(time.process_time() - tic_cpu)
    return statistics.median(times), statistics.median(cpu), out


def traced_peak(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def pairs_table(shape, n_pairs, repeat):
    n_users, n_items, rank, n_seen = shape
    reg, _, _ = random_model(*shape)
    rng = np.random.default_rng(1)
    X = np.column_stack([rng.integers(0, n_users, n_pairs), rng.integers(0, n_items, n_pairs)])
    reg.predict(X[:1000])  # compile
    print(f"predict: {n_pairs:,} pairs, {n_users:,} x {n_items:,} users x items, rank {rank}")
    print(f"{'ids':<40}{'seconds':>9}{'CPU s':>8}{'pairs/s':>14}{'MB allocated':>14}")
    seconds, cpu, pred = timed(lambda: reg.predict(X), repeat)
    peak = traced_peak(lambda: reg.predict(X))
    print(f"{'consecutive integers (arithmetic)':<40}{seconds:>9.2f}{cpu:>8.2f}"
          f"{n_pairs / seconds:>14,.0f}{peak / 1e6:>14.0f}")
    # the same model under other ids: multiples of 3 are not consecutive, so they are hashed
    reg.users_, reg.items_ = reg.users_ * 3, reg.items_ * 3
    import pandas as pd

    reg._user_index, reg._item_index = pd.Index(reg.users_), pd.Index(reg.items_)
    seconds, cpu, hashed = timed(lambda: reg.predict(X * 3), repeat)
    print(f"{'integers through the hash map':<40}{seconds:>9.2f}{cpu:>8.2f}"
          f"{n_pairs / seconds:>14,.0f}{'':>14}")
    assert np.array_equal(pred, hashed)
    print(f"(the pairs and their predictions alone are {X.nbytes / 1e6 + pred.nbytes / 1e6:.0f}"
          " MB; nothing grows with users x items)")


def naive_top(U, V, users, items, n):
    S = U @ V.T
    S[users, items] = -np.inf
    part = np.argpartition(-S, n, axis=1)[:, :n]
    order = np.argsort(-np.take_along_axis(S, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)


def topn_table(shape, repeat):
    n_users, n_items, rank, n_seen = shape
    reg, users, items = random_model(*shape)
    reg.recommend(reg.users_[:10])  # compile
    U, V = reg.estimator_.user_factors_, reg.estimator_.components_.T
    ours, ours_cpu, (ids, _) = timed(lambda: reg.recommend(reg.users_, n=10), repeat)
    naive, naive_cpu, idx = timed(lambda: naive_top(U, V, users, items, 10), repeat)
    same = np.array_equal(ids, reg.items_[idx])
    print(f"\ntop-10 for all {n_users:,} users, {n_items:,} items, rank {rank}, {n_seen:,} seen "
          "ratings excluded")
    print(f"{'method':<48}{'seconds':>9}{'CPU s':>8}{'same lists':>12}")
    print(f"{'RatingRegressor.recommend (64 MB batches)':<48}{ours:>9.2f}{ours_cpu:>8.2f}")
    print(f"{'naive numpy (dense scores, argpartition)':<48}{naive:>9.2f}{naive_cpu:>8.2f}"
          f"{'yes' if same else 'NO':>12}")
    if not same:
        sys.exit("recommend and the naive computation disagree")


def memory_child(quick):
    shape = QUICK["netflix"] if quick else SHAPES["netflix"]
    reg, _, _ = random_model(*shape)
    reg.recommend(reg.users_[:10])  # compile outside the measurement
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tic = time.perf_counter()
    peak = traced_peak(lambda: reg.recommend(reg.users_, n=10))
    seconds = time.perf_counter() - tic
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = (reg.estimator_.user_factors_.nbytes + reg.estimator_.components_.nbytes
             + reg._seen.data.nbytes + reg._seen.indices.nbytes + reg._seen.indptr.nbytes)
    print(f"{shape[0]} {shape[1]} {seconds} {peak} {model} {rss_before * 1024} {rss * 1024}")


def memory_table(quick):
    done = subprocess.run([sys.executable, __file__, "--memory-child"]
                          + (["--quick"] if quick else []),
                          capture_output=True, text=True, check=True)
    n_users, n_items, seconds, peak, model, rss0, rss1 = done.stdout.split()[-7:]
    print(f"\nrecommend top-10 for all {int(n_users):,} users x {int(n_items):,} items "
          "(fresh process)")
    print(f"{'seconds':>9}{'model MB':>10}{'peak MB above the model':>25}"
          f"{'process peak RSS MB':>21}")
    print(f"{float(seconds):>9.1f}{int(model) / 1e6:>10.0f}{int(peak) / 1e6:>25.0f}"
          f"{max(int(rss0), int(rss1)) / 1e6:>21.0f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (median)")
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        return memory_child(args.quick)
    shapes = QUICK if args.quick else SHAPES
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (medians of "
          f"{args.repeat} runs; wall seconds stretch on a busy machine, CPU seconds do not)\n")
    pairs_table(shapes["netflix"], 100_000 if args.quick else 10_000_000, args.repeat)
    topn_table(shapes["ml1m"], args.repeat)
    memory_table(args.quick)


if __name__ == "__main__":
    main()
