"""A round's uploads through secure aggregation give the server what the plain aggregation
gives it, within the encoding's bound: on the uploads of a real FedMAvg fit."""

import numpy as np
import pytest

pytest.importorskip("cryptography", reason="secure aggregation needs the 'secure' extra")

from sklearn_fedmf import FedMAvg  # noqa: E402
from sklearn_fedmf.secure import FixedPointEncoding, secure_aggregate  # noqa: E402
from tests.conftest import low_rank_ratings  # noqa: E402


@pytest.mark.parametrize("aggregation", ["weighted", "sampled_mean"])
@pytest.mark.parametrize("drop", [False, True])
def test_fedmavg_round_secure_mean_equals_the_servers_mean(aggregation, drop):
    # each round's server computes V = sum_p w_p W_p / sum_p w_p over the uploads (w_p:
    # omega_p for "weighted", the draws n_p for "sampled_mean"); secure aggregation gets it
    # as a ratio of two secure sums, each client applying its weight itself; compared with
    # the broadcast V of the real fit (or, with a client lost after the key phase, with the
    # plain mean over the clients that arrived)
    X, _, _ = low_rank_ratings(m=60, n=25, seed=4)
    rounds = []
    FedMAvg(
        n_components=3, n_clients=6, clients_per_round=5, max_iter=3, random_state=0,
        callback=lambda k, info: rounds.append(info), solver_params={"aggregation": aggregation},
    ).fit(X)
    encoding = FixedPointEncoding()
    for k, info in enumerate(rounds):
        if aggregation == "weighted":
            weights = {p: info["server_state"]["weights"][p] for p in info["uploads"]}
        else:
            weights = dict(zip(info["sampled"], info["counts"].astype(float)))
        uploads = {p: {"W": weights[p] * up["W"], "weight": weights[p]}
                   for p, up in info["uploads"].items()}
        lost = {min(uploads)} if drop else set()
        sums, result = secure_aggregate(uploads, encoding=encoding, seed=[0, k],
                                        dropout={"masked_input": lost})
        arrived = [p for p in uploads if p not in lost]
        assert list(result.clients) == arrived
        if drop:
            V = sum(uploads[p]["W"] for p in arrived) / sum(weights[p] for p in arrived)
        else:
            V = info["broadcast"]["Vt"]
        # |S_W / S_w - V| <= (e + |V| e) / (S_w - e), e the bound of each secure sum
        e = encoding.error_bound(len(arrived))
        total = sum(weights[p] for p in arrived)
        assert abs(sums["weight"] - total) <= e
        bound = e * (1 + np.abs(V)) / (total - e) + 1e-12  # + the float rounding of V
        assert np.all(np.abs(sums["W"] / sums["weight"] - V) <= bound)
        # the server received no copy W_p, only masked ring elements
        for message in result.server_view["masked_input"].values():
            assert message.vector.dtype == np.uint64


def test_secure_aggregate_keeps_names_and_shapes_and_refuses_mismatches():
    uploads = {c: {"a": np.full((2, 3), c), "b": float(c), "c": np.arange(4.0)}
               for c in range(5)}
    sums, result = secure_aggregate(uploads, seed=1)
    assert sums["a"].shape == (2, 3) and isinstance(sums["b"], float)
    assert abs(sums["b"] - 10.0) <= FixedPointEncoding().error_bound(5)
    np.testing.assert_allclose(sums["c"], 5 * np.arange(4.0), atol=1e-6)
    assert result.bytes_uploaded["masked_input"][0] == 4 + 8 * (6 + 1 + 4)
    with pytest.raises(ValueError, match="names and shapes"):
        secure_aggregate({**uploads, 7: {"a": np.zeros((3, 2)), "b": 0.0, "c": np.zeros(4)}})
    with pytest.raises(TypeError, match="secure_sum"):
        secure_aggregate({0: np.zeros(3), 1: np.zeros(3)})
