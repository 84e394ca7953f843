"""From a ratings CSV to top-10 lists and a cross-validated RMSE.

``RatingRegressor`` makes a federated completion estimator a scikit-learn regressor on
(user, item) id pairs. The ratings CSV goes in as it is: ``X`` is its user and item columns
(``userId`` and ``movieId`` in MovieLens; ``--user-col`` and ``--item-col`` name others) and
``y`` its rating column (``--rating-col``). ``KFold`` over the rows holds out a fifth
of the ratings of users who stay in training (the papers' entry-wise protocol), inside
scikit-learn's own ``cross_validate``. The model is then refit on every rating, and it lists
each user's ten best unrated items with the CSV's own ids. The figure shows each fold's
test RMSE beside that of the global-mean predictor.

Run ``python examples/plot_recommend.py [--csv path/to/ratings.csv] [--user-col user]
[--item-col item] [--rating-col rating] [--quick] [--out DIR]`` (default: the MovieLens
latest-small ratings shipped with the package).
"""

import argparse
import os
from importlib.resources import files
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from sklearn.dummy import DummyRegressor  # noqa: E402
from sklearn.model_selection import KFold, cross_validate  # noqa: E402

from sklearn_fedmf import FedMGS, RatingRegressor  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", help="a ratings CSV file with a header (default: the "
                                      "embedded MovieLens ratings.csv)")
    for option, default in (("--user-col", "userId"), ("--item-col", "movieId"),
                            ("--rating-col", "rating")):
        parser.add_argument(option, default=default, help=f"(default: {default})")
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("FEDMF_QUICK")),
                        help="one user in ten, 2 folds, 10 rounds (also FEDMF_QUICK=1)")
    parser.add_argument("--out", default="fedmf-out/examples", help="folder of the figure")
    args = parser.parse_args()

    csv = args.csv or files("sklearn_fedmf.datasets") / "data" / "ml-latest-small-ratings.csv.gz"
    columns = [args.user_col, args.item_col, args.rating_col]
    ratings = pd.read_csv(csv)
    missing = [c for c in columns if c not in ratings.columns]
    if missing:
        parser.error(f"{csv}: no column {', '.join(missing)} (columns: "
                     f"{', '.join(map(str, ratings.columns))}); name them with --user-col, "
                     "--item-col and --rating-col")
    if args.quick:
        ratings = ratings[ratings[args.user_col].isin(ratings[args.user_col].unique()[::10])]
    X, y = ratings[columns[:2]], ratings[args.rating_col]
    folds = 2 if args.quick else 5
    # the library's defaults (FedMGS, the model of `fedmf recommend`)
    model = RatingRegressor(FedMGS(max_iter=10 if args.quick else None, random_state=0))
    cv = KFold(folds, shuffle=True, random_state=0)
    rmse = {}
    for name, estimator in [("global mean", DummyRegressor()), ("FedMGS", model)]:
        # (no unrated item column warns: RatingRegressor's matrix has only rated items)
        scores = cross_validate(estimator, X, y, cv=cv,
                                scoring="neg_root_mean_squared_error")["test_score"]
        rmse[name] = -scores
        print(f"{name:<12} {folds}-fold entry-wise CV RMSE {rmse[name].mean():.4f} "
              f"+- {rmse[name].std():.4f}")

    model.fit(X, y)  # every rating; then serve top-10 lists with the CSV's own ids
    users = ratings[args.user_col].unique()[:3]
    items, predicted = model.recommend(users, n=10)
    for user, row, scores in zip(users, items, predicted):
        print(f"top-10 for user {user}: " + ", ".join(f"{i} ({s:.2f})" for i, s in
                                                      zip(row, scores)))

    fig, ax = plt.subplots(figsize=(6, 3.5), layout="constrained")
    width = 0.4
    for k, (name, values) in enumerate(rmse.items()):
        ax.bar(np.arange(folds) + (k - 0.5) * width, values, width, label=name)
    ax.set_xticks(range(folds), [f"fold {k + 1}" for k in range(folds)])
    low = min(v.min() for v in rmse.values())
    ax.set_ylim(low - 0.1, None)
    ax.set(ylabel="test RMSE (lower is better)",
           title=f"RatingRegressor(FedMGS), entry-wise {folds}-fold CV\n{len(y):,} ratings")
    ax.legend()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / "recommend.png", dpi=110)
    print(f"wrote {out / 'recommend.png'}")


if __name__ == "__main__":
    main()
