"""Site files for a Flower deployment (no Flower needed): ``fedmf flower-split`` and the
readers a site uses."""

import numpy as np
import pytest
import scipy.sparse as sp

from sklearn_fedmf.cli import main
from sklearn_fedmf.flower import load_site, split_sites

from .conftest import low_rank_ratings


def test_split_sites_keeps_each_sites_rows_in_order(tmp_path):
    X, Y, _ = low_rank_ratings(m=40, n=12)
    labels = np.array(["b", "a", "c", "a"] * 10)
    paths = split_sites(X, labels, tmp_path, Y)
    assert [p.name for p in paths] == ["site-0.npz", "site-1.npz", "site-2.npz"]
    for c, label in enumerate(["a", "b", "c"]):  # client index = sorted label, as in fit
        rows = np.flatnonzero(labels == label)
        for path, M in ((paths[c], X), (tmp_path / f"site-{c}-eval.npz", Y)):
            site = load_site(path)
            assert site.shape == (rows.size, X.shape[1])
            assert (site != M[rows]).nnz == 0


def test_a_site_reads_a_ratings_csv(tmp_path):
    path = tmp_path / "site.csv"
    path.write_text("user,item,rating\n17,3,4.5\n5,0,1.0\n17,1,0.0\n")
    X = load_site(path, n_items=4)
    # users in ascending id order (5, 17); an explicit 0.0 rating is an observation
    np.testing.assert_array_equal(X.toarray(), [[1.0, 0, 0, 0], [0, 0.0, 0, 4.5]])
    assert X.nnz == 3
    with pytest.raises(ValueError, match="n-items"):
        load_site(path)
    with pytest.raises(ValueError, match="outside"):
        load_site(path, n_items=3)
    path.write_text("user,item,rating\n17,3,4.5\n17,3,1.0\n")
    with pytest.raises(ValueError, match="twice"):
        load_site(path, n_items=4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_site(tmp_path / "missing.npz")


def test_flower_split_command_writes_sites_and_prints_the_commands(tmp_path, capsys):
    out = tmp_path / "sites"
    status = main(["flower-split", "--data", "synthetic:60x20x500", "--sites", "3",
                   "--out", str(out), "--port", "9300"])
    assert status == 0
    printed = capsys.readouterr().out
    sites = [sp.load_npz(out / f"site-{c}.npz") for c in range(3)]
    evals = [sp.load_npz(out / f"site-{c}-eval.npz") for c in range(3)]
    assert sum(s.shape[0] for s in sites) == 60
    assert {s.shape[1] for s in sites + evals} == {20}
    assert sum(s.nnz + e.nnz for s, e in zip(sites, evals)) == 500  # every rating once
    assert "flower-superlink --insecure --host 127.0.0.1 --port 9300" in printed
    for c in range(3):
        assert f'partition-id={c} data="{(out / f"site-{c}.npz").resolve()}"' in printed
    assert printed.count("python -m sklearn_fedmf.flower --insecure") == 3
    assert f"FLWR_HOME={(out / 'flwr-home').resolve()} flwr run" in printed
    assert 'address = "127.0.0.1:9300"' in (out / "flwr-home" / "config.toml").read_text()
    assert main(["flower-split", "--data", "synthetic:60x20x500", "--sites", "61",
                 "--out", str(out)]) == 1
