"""The pieces that make a Flower round fast, without processes: the waits of idle loops, the
SuperNode's shortened waits and the server's quick retries of a reply's objects."""

import functools
import itertools

import pytest

pytest.importorskip(
    "flwr", reason="Flower (the 'flower' extra) is not installed; it needs Python >= 3.11")

from sklearn_fedmf.flower._supernode import (  # noqa: E402
    _runtime_address,
    idle_waits,
    shorten_supernode_poll,
)


def test_idle_waits_double_from_5_ms_up_to_the_cap():
    assert list(itertools.islice(idle_waits(0.1), 7)) == [
        0.005, 0.01, 0.02, 0.04, 0.08, 0.1, 0.1]
    assert list(itertools.islice(idle_waits(0.002), 2)) == [0.002, 0.002]


def test_the_supernode_loop_waits_at_most_poll_seconds(monkeypatch):
    import time

    from flwr.supernode import start_client_internal as loop

    # Flower 1.41's loop as it is: the module time and Flower's pull_objects
    monkeypatch.setattr(loop, "time", loop.time)
    monkeypatch.setattr(loop, "pull_objects", loop.pull_objects)
    original = loop.pull_objects
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    for _ in range(2):  # patching twice keeps one layer
        patched = shorten_supernode_poll(0.05)
    assert patched is loop
    loop.time.sleep(3)  # the idle wait between two requests for a Message
    loop.time.sleep(0.01)
    assert slept == [0.05, 0.01]
    assert loop.time.monotonic is time.monotonic  # everything else is the time module
    assert isinstance(loop.pull_objects, functools.partial)
    assert loop.pull_objects.func is original
    assert loop.pull_objects.keywords == {"initial_backoff": 0.005, "backoff_cap": 0.05}
    with pytest.raises(ValueError, match="positive"):
        shorten_supernode_poll(0)


def test_the_server_retries_reply_objects_quickly_only_while_it_waits():
    from flwr.superlink.grid import http_grid

    from sklearn_fedmf.flower._server import _quick_object_retries

    original = http_grid.pull_objects
    with _quick_object_retries(0.1):
        assert http_grid.pull_objects.func is original
        assert http_grid.pull_objects.keywords == {"initial_backoff": 0.005,
                                                   "backoff_cap": 0.1}
    assert http_grid.pull_objects is original
    with pytest.raises(KeyError), _quick_object_retries(0.1):
        raise KeyError("a failed phase restores it too")
    assert http_grid.pull_objects is original


def test_the_site_command_finds_the_runtime_api_of_its_supernode():
    assert _runtime_address([]) == "127.0.0.1:9094"  # flower-supernode's defaults
    assert _runtime_address(["--insecure", "--port", "9200", "--node-config", "a=1"]) == (
        "127.0.0.1:9200")
    assert _runtime_address(["--host", "::1", "--port", "9200"]) == "[::1]:9200"


def test_the_site_command_refuses_what_its_clientapp_process_cannot_serve(capsys):
    from sklearn_fedmf.flower._supernode import main

    for args in (["--isolation", "subprocess"], ["--ssl-certfile", "cert.pem"]):
        with pytest.raises(SystemExit):
            main(["--insecure", *args])
        assert args[0].lstrip("-") in capsys.readouterr().err
