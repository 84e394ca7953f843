"""The secure-aggregation protocol: masks cancel, the server's sum is the plain sum within
the encoding's bound, a single masked upload looks uniform, dropouts are recovered through
the shares, too few clients fail clearly, seeds make runs bit-identical, and the byte
counts are the messages' sizes."""

import numpy as np
import pytest
from scipy import stats

pytest.importorskip("cryptography", reason="secure aggregation needs the 'secure' extra")

from sklearn_fedmf.engine._federation import nbytes  # noqa: E402
from sklearn_fedmf.exceptions import FederationError  # noqa: E402
from sklearn_fedmf.secure import FixedPointEncoding, secure_sum  # noqa: E402
from sklearn_fedmf.secure._crypto import TAG_BYTES, prg  # noqa: E402
from sklearn_fedmf.secure._protocol import (  # noqa: E402
    ID_BYTES,
    Survivors,
    client_advertise_keys,
    client_masked_input,
    client_share_keys,
    client_unmask,
    neighbour_graph,
    server_collect_keys,
    server_route_shares,
)
from sklearn_fedmf.secure._shamir import SHARE_BYTES  # noqa: E402


def _uploads(n, d, seed=0, scale=3.0):
    rng = np.random.default_rng(seed)
    return {c: rng.normal(scale=scale, size=d) for c in range(n)}


def _plain(uploads, clients):
    return np.sum([uploads[c] for c in clients], axis=0)


def _phases_to_masked(n, d, encoding, seed=0):
    """Every client through the first three phases, none dropping: states and uploads."""
    rngs = {c: np.random.default_rng([seed, c]) for c in range(n)}
    threshold = n // 2 + 1
    states, adverts = {}, {}
    for c in range(n):
        states[c], adverts[c] = client_advertise_keys(c, threshold, rngs[c])
    keys = server_collect_keys(adverts, threshold)
    shares = {}
    for c in range(n):
        states[c], shares[c] = client_share_keys(states[c], keys[c])
    routed = server_route_shares(shares, threshold)
    uploads = _uploads(n, d, seed)
    masked = {}
    for c in range(n):
        states[c], masked[c] = client_masked_input(states[c], routed[c], uploads[c], encoding)
    return states, uploads, masked


@pytest.mark.parametrize("ring_bits", [64, 40])
def test_pairwise_masks_cancel(ring_bits):
    # sum of masked inputs minus the self masks is the ring sum of the encodings, bit for bit
    encoding = FixedPointEncoding(clip=64.0, scale_bits=16, ring_bits=ring_bits)
    states, uploads, masked = _phases_to_masked(6, 50, encoding)
    ring = np.uint64((1 << ring_bits) - 1)
    total = np.zeros(50, dtype=np.uint64)
    expected = np.zeros(50, dtype=np.uint64)
    for c, m in masked.items():
        total += m.vector - prg(states[c].self_mask_seed, 50, ring_bits)
        expected += encoding.encode(uploads[c])
    assert np.array_equal(total & ring, expected & ring)
    # while no single client's masked input is its encoding plus its self mask alone
    for c, m in masked.items():
        alone = (encoding.encode(uploads[c]) + prg(states[c].self_mask_seed, 50, ring_bits))
        assert not np.array_equal(m.vector, alone & ring)


@pytest.mark.parametrize("ring_bits, n", [(64, 12), (64, 3), (48, 9)])
def test_unmasked_sum_is_the_plain_sum_within_the_bound(ring_bits, n):
    encoding = FixedPointEncoding(clip=64.0, scale_bits=20, ring_bits=ring_bits)
    uploads = _uploads(n, 300, seed=n)
    result = secure_sum(uploads, encoding=encoding, seed=7)
    assert result.clients == tuple(range(n))
    error = np.max(np.abs(result.sum - _plain(uploads, range(n))))
    assert error <= encoding.error_bound(n) <= n * 2.0**-20
    assert error > 0  # the rounding is real: the bound is what is tested, not equality


def test_a_single_masked_upload_looks_uniform_on_the_ring():
    # a strongly structured plain vector; its masked upload's top 8 bits pass a chi-square
    # test of uniformity, the upload as a fraction of 2^64 passes a KS test, and it is not
    # correlated with the plain vector. Each test has level 1e-3 and the correlation bound
    # is 4.4 standard errors (1e-5): with a random seed the test fails at most 0.21% of the
    # time; the seed here is fixed.
    d = 1 << 14
    encoding = FixedPointEncoding(clip=2.0**10, scale_bits=24)
    plain = np.linspace(-1000, 1000, d)
    uploads = {0: plain, 1: -plain, 2: np.zeros(d), 3: plain**2 / 1000}
    result = secure_sum(uploads, encoding=encoding, seed=11)
    for c, message in result.server_view["masked_input"].items():
        y = message.vector
        top = (y >> np.uint64(56)).astype(np.int64)
        assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-3
        fraction = y.astype(np.float64) / 2.0**64
        assert stats.kstest(fraction, "uniform").pvalue > 1e-3
        if np.ptp(uploads[c]) > 0:
            assert abs(np.corrcoef(fraction, uploads[c])[0, 1]) < 4.4 / np.sqrt(d)
    # the same tests see the structure of an unmasked encoding: they have power
    q = encoding.encode(plain)
    assert stats.chisquare(np.bincount((q >> np.uint64(56)).astype(np.int64),
                                       minlength=256)).pvalue < 1e-3
    np.testing.assert_allclose(result.sum, _plain(uploads, range(4)),
                               atol=encoding.error_bound(4))


def test_the_server_never_receives_a_plain_vector():
    uploads = _uploads(5, 64, seed=3)
    encoding = FixedPointEncoding()
    result = secure_sum(uploads, encoding=encoding, seed=3)
    encodings = [encoding.encode(v) for v in uploads.values()]
    for m in result.server_view["masked_input"].values():
        assert not any(np.any(m.vector == q) for q in encodings)


@pytest.mark.parametrize("dropout", [
    {"share_keys": {2}},                          # after advertising keys: no mask with it
    {"masked_input": {0, 4}},                     # after sharing keys: masks recovered
    {"masked_input": {6}, "unmasking": {1, 3}},   # and survivors that stop answering
    {"share_keys": {5}, "masked_input": {1}},
])
def test_dropout_after_the_key_phase_is_recovered(dropout):
    n = 7
    uploads = _uploads(n, 200, seed=5)
    result = secure_sum(uploads, seed=5, dropout=dropout)
    before_unmasking = set(dropout.get("share_keys", ())) | set(dropout.get("masked_input", ()))
    survivors = tuple(c for c in range(n) if c not in before_unmasking)
    assert result.clients == survivors
    np.testing.assert_allclose(result.sum, _plain(uploads, survivors),
                               rtol=0, atol=FixedPointEncoding().error_bound(len(survivors)))
    recovered = set(dropout.get("masked_input", ()))
    for message in result.server_view["unmasking"].values():
        assert set(message.mask_key_shares) == recovered  # dropped clients' keys only
        assert not recovered & set(message.self_mask_shares)  # never both kinds


@pytest.mark.parametrize("phase", ["share_keys", "masked_input", "unmasking"])
def test_below_the_threshold_the_sum_fails_clearly(phase):
    uploads = _uploads(6, 10)
    with pytest.raises(FederationError, match="fewer than the threshold 4"):
        secure_sum(uploads, seed=0, dropout={phase: {0, 1, 2}})
    # one client fewer dropping is enough to finish
    assert secure_sum(uploads, seed=0, dropout={phase: {0, 1}}).sum.shape == (10,)


def test_a_client_refuses_an_inconsistent_survivor_list():
    states, _, _ = _phases_to_masked(5, 8, FixedPointEncoding())
    with pytest.raises(ValueError, match="refuses to unmask"):
        client_unmask(states[0], Survivors((0, 1)))  # fewer than the threshold 3
    with pytest.raises(ValueError, match="refuses to unmask"):
        client_unmask(states[0], Survivors((0, 1, 9)))  # 9 shares nothing with it
    with pytest.raises(ValueError, match="refuses to unmask"):
        client_unmask(states[0], Survivors((1, 2, 3)))  # without itself


def test_same_seed_bit_identical_other_seed_or_os_randomness_different():
    uploads = _uploads(6, 100, seed=9)
    runs = [secure_sum(uploads, seed=s, dropout={"masked_input": {3}}) for s in (4, 4, 5)]
    os_run = secure_sum(uploads, seed=None, dropout={"masked_input": {3}})
    masked = [r.server_view["masked_input"] for r in (*runs, os_run)]
    for c in masked[0]:
        assert np.array_equal(masked[0][c].vector, masked[1][c].vector)
        assert not np.array_equal(masked[0][c].vector, masked[2][c].vector)
        assert not np.array_equal(masked[0][c].vector, masked[3][c].vector)
    assert runs[0].server_view["share_keys"] == runs[1].server_view["share_keys"]
    assert np.array_equal(runs[0].sum, runs[1].sum)
    # the rounding depends on the data only: every run gives the same sum
    assert np.array_equal(runs[0].sum, runs[2].sum) and np.array_equal(runs[0].sum, os_run.sum)


@pytest.mark.parametrize("ring_bits", [64, 20])
def test_byte_counts_are_the_messages_sizes(ring_bits):
    n, d, dropped = 6, 37, {4}
    encoding = FixedPointEncoding(clip=4.0, scale_bits=8, ring_bits=ring_bits)
    result = secure_sum(_uploads(n, d, scale=1.0), encoding=encoding, seed=2,
                        dropout={"masked_input": dropped})
    up, down, view = result.bytes_uploaded, result.bytes_downloaded, result.server_view
    for phase, messages in view.items():
        assert up[phase] == {c: m.nbytes for c, m in messages.items()}
        assert nbytes(messages) == sum(up[phase].values())  # as the engine counts them
    ciphertext = 2 * ID_BYTES + 2 * SHARE_BYTES + TAG_BYTES  # ids, two shares, the tag
    for c in range(n):
        assert len(view["advertise_keys"][c].channel_key) == 32
        assert up["advertise_keys"][c] == ID_BYTES + 64
        assert all(len(x) == ciphertext for x in view["share_keys"][c].ciphertexts.values())
        assert up["share_keys"][c] == ID_BYTES + (n - 1) * (ID_BYTES + ciphertext)
        assert down["share_keys"][c] == n * (ID_BYTES + 64)
        assert down["masked_input"][c] == ID_BYTES + (n - 1) * (ID_BYTES + ciphertext)
    survivors = [c for c in range(n) if c not in dropped]
    for c in survivors:
        assert view["masked_input"][c].vector.shape == (d,)
        assert up["masked_input"][c] == ID_BYTES + d * ((ring_bits + 7) // 8)
        assert down["unmasking"][c] == ID_BYTES * len(survivors)
        # one share per client that shared keys: survivors' seeds, dropped clients' keys
        assert up["unmasking"][c] == 3 * ID_BYTES + n * (ID_BYTES + SHARE_BYTES)
    assert set(up["unmasking"]) == set(survivors) and 4 not in up["masked_input"]


def test_secure_sum_validation():
    uploads = _uploads(4, 5)
    with pytest.raises(ValueError, match="threshold"):
        secure_sum(uploads, threshold=5)
    with pytest.raises(ValueError, match="same shape"):
        secure_sum({**uploads, 9: np.zeros(6)})
    with pytest.raises(ValueError, match="dropout phases"):
        secure_sum(uploads, dropout={"advertise": {1}})
    with pytest.raises(ValueError, match="could wrap"):
        secure_sum(uploads, encoding=FixedPointEncoding(clip=2.0**30, scale_bits=31))
    with pytest.raises(ValueError, match="exceeds"):
        secure_sum({0: np.array([1e6]), 1: np.zeros(1)}, seed=0)


def test_neighbour_graph_is_a_symmetric_regular_graph_drawn_from_its_generator():
    clients = list(range(3, 23))
    graphs = [neighbour_graph(clients, 4, np.random.default_rng(s)) for s in (0, 0, 1)]
    graph = graphs[0]
    assert sorted(graph) == clients
    for c, peers in graph.items():
        assert len(peers) == 4 and c not in peers
        assert all(c in graph[v] for v in peers)
    assert graphs[0] == graphs[1] and graphs[0] != graphs[2]
    complete = neighbour_graph(range(5), 4, np.random.default_rng(0))
    assert all(len(p) == 4 for p in complete.values())
    with pytest.raises(ValueError, match="even"):
        neighbour_graph(clients, 3, np.random.default_rng(0))


def test_secagg_plus_sums_with_dropouts_at_linear_cost_in_the_degree():
    n, d, degree = 15, 40, 4
    uploads = _uploads(n, d, seed=12)
    dropped = {2, 9}
    result = secure_sum(uploads, neighbours=degree, seed=12, dropout={"masked_input": dropped})
    survivors = tuple(c for c in range(n) if c not in dropped)
    assert result.clients == survivors
    np.testing.assert_allclose(result.sum, _plain(uploads, survivors), rtol=0,
                               atol=FixedPointEncoding().error_bound(len(survivors)))
    ciphertext = 2 * ID_BYTES + 2 * SHARE_BYTES + TAG_BYTES
    for c in range(n):
        assert len(result.server_view["share_keys"][c].ciphertexts) == degree
        assert result.bytes_uploaded["share_keys"][c] == ID_BYTES + degree * (
            ID_BYTES + ciphertext)
        assert result.bytes_downloaded["share_keys"][c] == (degree + 1) * (ID_BYTES + 64)
    for c in survivors:  # a share per neighbour (and itself), of one kind each
        message = result.server_view["unmasking"][c]
        assert len(message.self_mask_shares) + len(message.mask_key_shares) == degree + 1


def test_secagg_plus_fails_when_a_secret_has_too_few_holders_left():
    # degree 2: a secret has 3 holders (threshold 2); when both neighbours of client 0 stop
    # answering, its self mask cannot be removed, although most clients answered
    uploads = _uploads(9, 5, seed=13)
    graph = secure_sum(uploads, neighbours=2, seed=13).server_view["share_keys"]
    neighbours = set(graph[0].ciphertexts)
    with pytest.raises(FederationError, match="client 0's secret, fewer than the threshold 2"):
        secure_sum(uploads, neighbours=2, seed=13, dropout={"unmasking": neighbours})


def test_a_state_rebuilt_from_its_fields_gives_the_same_messages():
    """A client's state keeps its loaded keys and channel ciphers outside its fields: a copy
    through pickle (or a Flower site's codec, which rebuilds it from its fields) holds none of
    them, loads them again from its keys, and sends byte for byte the same masked input and
    unmasking shares as the state that kept them."""
    import pickle
    from dataclasses import fields

    from sklearn_fedmf.secure._protocol import ClientState

    encoding = FixedPointEncoding(clip=64.0, scale_bits=16)
    n, threshold = 5, 3
    states, adverts = {}, {}
    for c in range(n):
        states[c], adverts[c] = client_advertise_keys(c, threshold, np.random.default_rng([1, c]))
    keys = server_collect_keys(adverts, threshold)
    shares = {}
    for c in range(n):
        states[c], shares[c] = client_share_keys(states[c], keys[c])
    routed = server_route_shares(shares, threshold)
    kept = states[0]
    assert "ciphers" in kept.__dict__["_transient"]  # (what the copies must do without)
    copies = [pickle.loads(pickle.dumps(kept)),
              ClientState(**{f.name: getattr(kept, f.name) for f in fields(kept)})]
    assert all("_transient" not in copy.__dict__ for copy in copies)
    vector = np.arange(7.0)
    out = []
    for state in [kept, *copies]:
        assert all(getattr(state, f.name) == getattr(kept, f.name)
                   for f in fields(kept) if f.name != "rng")  # (a Generator: by identity)
        state, masked = client_masked_input(state, routed[0], vector, encoding)
        _, reply = client_unmask(state, Survivors(tuple(range(n))))
        out.append((masked.vector, reply))
    for vector_copy, reply_copy in out[1:]:
        np.testing.assert_array_equal(vector_copy, out[0][0])
        assert reply_copy == out[0][1]
