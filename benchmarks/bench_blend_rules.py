"""FedBlend's weight rules compared on one fit of the members per set (issue 37).

    python benchmarks/bench_blend_rules.py --ratings ciao:PATH --data small --seed 0

Each set is split as in ``bench_sites.py`` (80/20, ``--seed``). ``FedBlend(random_state=0,
refit=False)`` is fitted once through ``RatingRegressor``; the summed validation statistics
(``gram``, ``cross``, ``ss``, ``count``) are captured, and every member is refitted on all the
training ratings as ``refit=True`` would (early stopping off, its validated rounds). Then
each rule below turns the same statistics into weights, the members carrying at least
``REFIT_MIN_SHARE`` of the weight take their refitted predictions (as ``refit=True`` does),
and the blend's test RMSE is printed: so the rules differ only in their weights.

Rules (``solve_blend`` keywords): ``target`` = ``"mean"`` (toward ``1/K``) or ``"best"``
(toward the member of lowest validation RMSE); ``alpha`` = a number or ``"gcv"`` (generalized
cross-validation over a grid, from the sums alone).
"""

import argparse
import os
import sys
import time
import warnings

import numpy as np
from sklearn.base import clone

sys.path.insert(0, os.path.dirname(__file__))
from bench_sites import load  # noqa: E402

from sklearn_fedmf import FedBlend, RatingRegressor  # noqa: E402
from sklearn_fedmf._pairs import predict_pairs  # noqa: E402
from sklearn_fedmf.completion._fed_blend import _fed_blend as fb  # noqa: E402
from sklearn_fedmf.completion._fed_blend import _fed_blend_stats as st  # noqa: E402

_PEN = {"free_slope": False}
_PEN10 = {"free_slope": False, "min_alpha": 10.0}
RULES = [("mean", 10.0), ("best", 10.0), ("soft", 10.0),
         ("mean", 10.0, True, _PEN), ("best", 10.0, True, _PEN), ("soft", 10.0, True, _PEN),
         ("mean", "gcv", True, _PEN10), ("best", "gcv", True, _PEN10),
         ("soft", "gcv", True, _PEN10), ("soft", "gcv", True, _PEN)]


def capture():
    """Patch the blend's module so the summed statistics are kept."""
    box = {}
    solve, msse = fb.solve_blend, fb.member_sse

    def solve_kept(gram, cross, count, **kw):
        box.update(gram=gram.copy(), cross=cross.copy(), count=count, kw=kw)
        return solve(gram, cross, count, **kw)

    def msse_kept(gram, cross, ss, n_members):
        box["ss"] = ss
        return msse(gram, cross, ss, n_members)

    fb.solve_blend, fb.member_sse = solve_kept, msse_kept
    return box


def refitted(member, R, labels):
    """``member`` as ``FedBlend._refit_members`` refits it (or itself when it is kept)."""
    again = clone(member)
    params = again.get_params(deep=False)
    if "early_stopping" in params and getattr(member, "best_iteration_", None):
        again.set_params(early_stopping=False, max_iter=int(member.best_iteration_))
        if not member.factors_used_:
            return member
    return again.fit(R, clients=labels)


def blend_pred(coef, K, activity, P, z, mean, lo, hi):
    c0, w = coef[0], coef[1:K + 1]
    pred = mean + c0 + (P - mean) @ w
    if activity:
        s = coef[K + 1:]
        pred = pred + s[0] * z + ((P - mean) * z[:, None]) @ s[1:]
    return np.clip(pred, lo, hi)


def run_set(name, spec, seed, rules, cache=None):
    path = None if cache is None else os.path.join(cache, f"{name}-{seed}.npz")
    if path is not None and os.path.exists(path):
        return evaluate(name, seed, dict(np.load(path, allow_pickle=True)), rules)
    X_tr, y_tr, X_te, y_te, _ = load(spec, seed)
    box = capture()
    tic = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg = RatingRegressor(FedBlend(random_state=0, refit=False)).fit(X_tr, y_tr)
    blend = reg.estimator_
    u = reg._encode(X_te[:, 0], reg._user_index)
    i = reg._encode(X_te[:, 1], reg._item_index)
    R = reg._seen.astype(np.float64)  # (pattern only; values below)
    R.data = np.asarray(_matrix_values(reg, X_tr, y_tr))
    labels = blend.clients_
    P_val, P_ref = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in blend.estimators_:
            P_val.append(predict_pairs(m._factor_model(), u, i, m.mean_))
            again = refitted(m, R, labels)
            P_ref.append(predict_pairs(again._factor_model(), u, i, again.mean_))
    seconds = time.perf_counter() - tic
    P_val, P_ref = np.column_stack(P_val), np.column_stack(P_ref)
    z = blend._activity(np.diff(R.indptr))[u]
    data = dict(gram=box["gram"], cross=box["cross"], ss=box["ss"], count=box["count"],
                P_val=P_val, P_ref=P_ref, z=z, y=y_te, mean=blend.mean_,
                range=np.array(blend.rating_range_), names=np.array(blend._names),
                activity=blend.activity_weights, seconds=seconds)
    if path is not None:
        np.savez(path, **data)
    return evaluate(name, seed, data, rules)


def evaluate(name, seed, d, rules):
    """Every rule's weights and test RMSE from a set's captured statistics."""
    box, P_val, P_ref, z, y_te = d, d["P_val"], d["P_ref"], d["z"], d["y"]
    names, activity = list(d["names"]), bool(d["activity"])
    K, (lo, hi), mean, seconds = len(names), d["range"], float(d["mean"]), float(d["seconds"])
    n = float(box["count"])
    val = np.sqrt(np.maximum(st.member_sse(box["gram"], box["cross"], box["ss"], K), 0) / n)
    test_val = [np.sqrt(np.mean((np.clip(P_val[:, k], lo, hi) - y_te) ** 2)) for k in range(K)]
    test_ref = [np.sqrt(np.mean((np.clip(P_ref[:, k], lo, hi) - y_te) ** 2)) for k in range(K)]
    print(f"\n## {name} (seed {seed}): {int(n)} validation ratings, {seconds:.0f} s")
    print("members (validation / test as validated / test refitted): " + ", ".join(
        f"{nm} {v:.4f}/{a:.4f}/{b:.4f}" for nm, v, a, b in
        zip(names, val, test_val, test_ref)))
    out = {"best member": min(test_ref)}
    for rule in rules:
        target, alpha = rule[:2]
        act = rule[2] if len(rule) > 2 else activity
        opts = rule[3] if len(rule) > 3 else {}
        cols = slice(None) if act else slice(0, K + 1)
        gram, cross = box["gram"][cols, cols], box["cross"][cols]
        coef, info = st.solve_blend(gram, cross, box["count"], ss=box["ss"], alpha=alpha,
                                    target=target, n_members=K, activity=act, info=True,
                                    **opts)
        w = np.abs(coef[1:K + 1])
        share = w / max(w.sum(), 1e-300)
        P = np.where(share >= fb.REFIT_MIN_SHARE, P_ref, P_val)
        err = float(np.sqrt(np.mean((blend_pred(coef, K, act, P, z, mean, lo, hi)
                                     - y_te) ** 2)))
        every = float(np.sqrt(np.mean((blend_pred(coef, K, act, P_ref, z, mean, lo, hi)
                                       - y_te) ** 2)))
        vr = np.sqrt(max(st.blend_sse(gram, cross, box["ss"], coef), 0) / n)
        label = f"{target} {alpha}" + ("" if act else " flat") + "".join(
            f" {k}={v}" for k, v in opts.items())
        out[label] = err
        out[label + " every"] = every
        print(f"| {target} | {alpha} | {'act' if act else 'flat'} {opts} | test {err:.4f} | "
              f"every refit {every:.4f} | val {vr:.4f} | alpha {info['alpha']:.3g} | "
              f"df {info['df']:.2f} | w " + " ".join(f"{x:+.3f}" for x in coef[1:K + 1])
              + " |", flush=True)
    return out


def _matrix_values(reg, X_tr, y_tr):
    """The training matrix's values in CSR order (``RatingRegressor`` averages duplicates)."""
    from sklearn_fedmf._rating_regressor import _mean_matrix

    u = reg._encode(X_tr[:, 0], reg._user_index)
    i = reg._encode(X_tr[:, 1], reg._item_index)
    return _mean_matrix(y_tr, u, i, reg._seen.shape).data


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="")
    parser.add_argument("--ratings", action="append", default=[])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default=None, help="folder of captured fits (reused)")
    parser.add_argument("--summary", action="store_true", help="a table over the cache")
    args = parser.parse_args()
    specs = [(s.split(":", 1)[0], s) for s in args.ratings]
    specs += [("ml-latest-small", "small")] if args.data == "small" else []
    print(f"load average {os.getloadavg()[0]:.1f}")
    for name, spec in specs:
        run_set(name, spec, args.seed, RULES, args.cache)
    if args.summary:
        summary(args.cache)


def summary(cache):
    """Every cached (set, seed): each rule's test RMSE minus the current rule's, and where
    it is at or below the best member (refitted)."""
    import contextlib
    import io

    results = {}
    for file in sorted(os.listdir(cache)):
        if file.endswith(".npz"):
            key = file[:-4]
            with contextlib.redirect_stdout(io.StringIO()):
                results[key] = evaluate(key, "", dict(np.load(os.path.join(cache, file))),
                                        RULES)
    rules = [r for r in next(iter(results.values())) if r != "best member"]
    rules = [r for r in rules if not r.endswith("every")]  # (the refit-all columns apart)
    print("\n| set | best member | " + " | ".join(rules) + " |")
    for key, out in results.items():
        base = out[rules[0]]
        print(f"| {key} | {out['best member']:.4f} | " + " | ".join(
            f"{out[r] - base:+.4f}{'*' if out[r] <= out['best member'] else ''}" for r in rules)
            + " |")


if __name__ == "__main__":
    main()
