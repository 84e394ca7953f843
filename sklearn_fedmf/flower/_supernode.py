"""A site in one command: Flower's SuperNode with a short idle poll, and a ClientApp process
that lives for the whole fit.

``python -m sklearn_fedmf.flower [--poll SECONDS] <flower-supernode arguments>`` starts
Flower's own ``flower-supernode`` with ``--isolation process`` and, beside it, one process
that serves all its ClientApp tasks (:func:`~sklearn_fedmf.flower._worker.serve_client_tasks`):
no process start and no import per Message.

The waits: Flower 1.41's SuperNode asks the SuperLink for a Message and, when there is
none, sleeps 3 s (hard-coded; no option or environment variable sets it), waits for the
ClientApp's reply in steps of 0.5 s, and retries an object of a Message not yet uploaded
after 1 s. This command runs the same SuperNode code with each of these waits at most
``--poll`` seconds (:func:`shorten_supernode_poll`): more requests to the SuperLink while
idle (``1 / poll`` per second and site), rounds of about a second instead of several.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import subprocess
import sys
import time as _time

__all__ = ["idle_waits", "main", "shorten_supernode_poll"]

DEFAULT_POLL = 0.1
# what the first Message of this package's ClientApp would import
_PRELOAD = ("sklearn_fedmf.flower._client", "sklearn_fedmf.flower._sites",
            "sklearn_fedmf.completion", "sklearn_fedmf.binary")


def idle_waits(cap, first=0.005):
    """Waits between two polls of an idle loop: ``first``, doubling up to ``cap`` seconds.

    A reply that comes soon is seen soon, and a long wait costs one request per ``cap``
    seconds (each poll is an HTTP request that other processes on the machine pay for).
    """
    wait = min(first, cap)
    while True:
        yield wait
        wait = min(2 * wait, cap)


class _ShortSleep:
    """The ``time`` module as the SuperNode loop sees it: every sleep at most ``poll``."""

    def __init__(self, poll):
        self.poll = float(poll)

    def sleep(self, seconds):
        _time.sleep(min(seconds, self.poll))

    def __getattr__(self, name):
        return getattr(_time, name)


def shorten_supernode_poll(poll):
    """Make the waits of the SuperNode's Fleet loop (``flwr.supernode.start_client_internal``)
    at most ``poll`` seconds; return the module patched.

    Its ``time.sleep`` calls (3 s when the SuperLink has no Message, 0.5 s while the reply
    is computed) and the retries of its ``pull_objects`` (first after 1 s, up to 10 s, when
    a Message's objects are not all uploaded yet) then wait at most ``poll`` seconds.
    """
    from flwr.supernode import start_client_internal as loop

    if not poll > 0:
        raise ValueError(f"poll must be positive, got {poll!r}.")
    pull = getattr(loop, "pull_objects", None)
    pull = getattr(pull, "func", pull)  # already patched
    if (getattr(loop, "time", None) is not _time and not isinstance(loop.time, _ShortSleep)
            or pull is None or "initial_backoff" not in inspect.signature(pull).parameters):
        raise RuntimeError("This Flower version's SuperNode loop does not wait as Flower 1.41 "
                           "does; run flower-supernode itself.")
    loop.time = _ShortSleep(poll)
    loop.pull_objects = functools.partial(pull, initial_backoff=min(0.005, poll),
                                          backoff_cap=poll)
    return loop


_RUNTIME_TLS = ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certfile")


def _runtime_address(args):
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9094)
    known, _ = parser.parse_known_args(args)
    host = f"[{known.host}]" if ":" in known.host else known.host
    return f"{host}:{known.port}"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m sklearn_fedmf.flower",
        description="Run a Flower SuperNode whose ClientApp process lives for the whole fit "
                    "(the other arguments are flower-supernode's).")
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL,
                        help="seconds the SuperNode waits before asking the SuperLink again "
                             f"when it has no Message (default {DEFAULT_POLL}; Flower: 3)")
    parser.add_argument("--isolation", help=argparse.SUPPRESS)
    args, supernode_args = parser.parse_known_args(argv)
    if args.isolation not in (None, "process"):
        parser.error("this command runs the SuperNode with --isolation process")
    if any(a.split("=")[0] in _RUNTIME_TLS for a in supernode_args):
        parser.error("the ClientApp process reaches its SuperNode's Runtime API on this "
                     "machine without TLS: leave out " + ", ".join(_RUNTIME_TLS) +
                     " (the SuperLink connection keeps its own TLS options)")
    shorten_supernode_poll(args.poll)
    # the ClientApp process: ended with this one (it watches this PID)
    worker = subprocess.Popen([
        sys.executable, "-m", "sklearn_fedmf.flower._worker",
        "--runtime-api-address", _runtime_address(supernode_args),
        "--parent-pid", str(os.getpid()), "--poll", str(args.poll),
        "--preload", *_PRELOAD,
    ])
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *supernode_args, "--isolation", "process"]
    try:
        flower_supernode()
    finally:
        if worker.poll() is None:
            worker.terminate()
