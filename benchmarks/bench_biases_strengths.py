"""FedBaseline's strengths: Surprise's ``BaselineOnly``'s (15 and 10, its defaults before
``"auto"``) against weaker ones and ``"auto"``, on real rating sets (issue 37's floor and
the blend's biases member).

    python benchmarks/bench_biases_strengths.py --ratings ml-100k:/path/u.data --data small

The split of ``bench_sites.py`` (80/20, seed 0, or a set's own test). For each pair
``(alpha_u, alpha_v)`` of ``--pairs`` (numbers or ``auto``), ``RatingRegressor(FedBaseline(
alpha_u=.., alpha_v=.., random_state=0))`` fitted on the training part: the test RMSE, and
its difference from the first pair's in the next columns; the last column, the strengths the
last fit used (``alpha_u_``, ``alpha_v_``: ``"auto"``'s values).
"""

import argparse
import warnings

from bench_sites import load, rmse

from sklearn_fedmf import FedBaseline, RatingRegressor

PAIRS = "15:10,7.5:5,3.75:2.5,2:1,15:2.5,3.75:10,auto:auto"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ratings", action="append", default=[],
                        help="NAME:PATH[;TEST] of a local rating file (never committed)")
    parser.add_argument("--data", default="", help="'small': the embedded ml-latest-small")
    parser.add_argument("--pairs", default=PAIRS, help="alpha_u:alpha_v,... (first: reference)")
    args = parser.parse_args()
    pairs = [tuple(a if a == "auto" else float(a) for a in p.split(":"))
             for p in args.pairs.split(",")]
    specs = args.ratings + [n for n in args.data.split(",") if n == "small"]
    names = [f"({u}, {v})" if "auto" in (u, v) else f"({u:g}, {v:g})" for u, v in pairs]
    print("| set | " + " | ".join(names) + " | "
          + " | ".join(f"{name} - first" for name in names[1:]) + " | last's strengths |")
    print("|---" * (2 * len(pairs) + 1) + "|")
    for spec in specs:
        X_tr, y_tr, X_te, y_te, _ = load(spec)
        errors = []
        for alpha_u, alpha_v in pairs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = FedBaseline(alpha_u=alpha_u, alpha_v=alpha_v, random_state=0)
                reg = RatingRegressor(model).fit(X_tr, y_tr)
            errors.append(rmse(reg.predict(X_te), y_te))
        used = f"{reg.estimator_.alpha_u_:.2f}, {reg.estimator_.alpha_v_:.2f}"
        name = "ml-latest-small" if spec == "small" else spec.split(":", 1)[0]
        print(f"| {name} | " + " | ".join(f"{e:.4f}" for e in errors) + " | "
              + " | ".join(f"{e - errors[0]:+.4f}" for e in errors[1:]) + f" | {used} |",
              flush=True)


if __name__ == "__main__":
    main()
