"""A whole Flower deployment on 127.0.0.1, in one call: a SuperLink, one SuperNode per site
and ``flwr run`` of the example app, each a process with a deadline, all ended by their
process groups afterwards. For trying a deployment and for the tests and benchmark.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import joblib

from ._sites import split_sites
from ._supernode import DEFAULT_POLL

__all__ = ["run_loopback"]

EXAMPLE_APP = Path(__file__).resolve().parents[2] / "examples" / "flower_app"


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _wait_for_port(port, deadline, proc):
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with status {proc.returncode}.")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"Nothing listens on 127.0.0.1:{port}.")


def _end(procs):
    """End each process started here and what it started: its process group (its PID)."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        try:  # a ClientApp or ServerApp process left in the group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _toml(value):
    if value is None:
        raise ValueError("A run config has no None: leave the parameter at its default.")
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def run_loopback(X, clients, workdir, *, estimator="FedMCADMM", params=None, app=None,
                 deadline=240.0, clientapp="warm", poll=DEFAULT_POLL, runs=None):
    """Fit ``estimator`` on a Flower deployment on 127.0.0.1: one site per client label.

    Writes the site files (:func:`~sklearn_fedmf.flower.split_sites`) and a copy of the app
    (``examples/flower_app`` unless ``app`` names another) under ``workdir``, sets its run
    config to ``estimator`` and ``params``, starts a SuperLink and one SuperNode per site
    and runs ``flwr run``, with telemetry, update checks and runtime dependency installation
    off. Every process is ended by ``deadline`` seconds. The processes import this
    package from where the caller imported it.

    ``clientapp="warm"`` (default) starts each site with ``python -m sklearn_fedmf.flower``:
    one ClientApp process serves all of the site's Messages and the SuperNode waits
    ``poll`` seconds between two requests for a Message; ``"flower"`` starts Flower's own
    ``flower-supernode`` (a fresh ClientApp process per Message, a 3 s idle poll).

    ``runs``: a list of dicts, each overriding some of ``params`` (solver_params' keys by
    their own names; a key must be in ``params``, which sets it for the other runs): one
    ``flwr run`` per entry, all at once on the same SuperLink and sites, each site serving
    their Messages in turn (for example ``[{}, {"secure_aggregation": True}]``: a plain fit
    and a secure one, for the start-up of one deployment). ``model`` and ``seconds`` are
    then lists, one entry per run.

    Returns
    -------
    model : estimator or None
        What the ServerApp wrote (None if it wrote nothing: ``flwr run`` exits 0 even when
        the run failed, so only the written model tells).
    seconds : float
        Wall time from starting the SuperLink to the end of ``flwr run`` (with ``runs``:
        to the end of each).
    logs : dict
        Each process's output (``run``, or ``run-0``, ``run-1``, ... with ``runs``).
    """
    if clientapp not in ("warm", "flower"):
        raise ValueError(f"clientapp must be 'warm' or 'flower', got {clientapp!r}.")
    app = Path(app or EXAMPLE_APP)
    if not (app / "pyproject.toml").is_file():
        raise FileNotFoundError(f"No Flower app at {app}: pass app= (a copy of the source "
                                "tree's examples/flower_app).")
    workdir = Path(workdir)
    paths = split_sites(X, clients, workdir / "sites")
    app_dir = workdir / "app"
    shutil.copytree(app, app_dir,
                    ignore=shutil.ignore_patterns("__pycache__", "*.joblib"))
    output = workdir / "model.joblib"
    params = dict(params or {})
    # a run config is flat: solver_params' keys go by their own names (the ServerApp routes
    # them back into solver_params)
    params.update(params.pop("solver_params", None) or {})
    overrides = None if runs is None else [dict(r) for r in runs]
    for r in overrides or ():
        r.update(r.pop("solver_params", None) or {})
        if set(r) - set(params):
            raise ValueError(f"runs override {sorted(set(r) - set(params))}, which params "
                             "does not set: give their value for the other runs there.")
    config = {"estimator": estimator, **params, "min-nodes": len(paths),
              "node-wait": deadline, "round-timeout": deadline, "output": str(output)}
    # Flower accepts only run-config keys the app declares: set them in its file
    pyproject = app_dir / "pyproject.toml"
    head = pyproject.read_text().split("[tool.flwr.app.config]")[0]
    pyproject.write_text(head + "[tool.flwr.app.config]\n" + "".join(
        f"{key} = {_toml(value)}\n" for key, value in config.items()))
    link, *node_ports = _free_ports(1 + len(paths))
    home = workdir / "flwr-home"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'[superlink.loopback]\naddress = "127.0.0.1:{link}"\ninsecure = true\n')
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           # the SuperLink's executor looks for the run's ServerApp task this often
           # (default 1 s; it polls for the whole run, so not as often as the sites)
           "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.25",
           "PYTHONPATH": os.pathsep.join(filter(None, (
               str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH"))))}
    logs, procs = {}, []

    def start(name, *args):
        logs[name] = workdir / f"{name}.log"
        with logs[name].open("w") as out:
            procs.append(subprocess.Popen(args, cwd=workdir, env=env, stdout=out,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1]

    tic = time.monotonic()
    stop = tic + deadline
    try:
        superlink = start("superlink", "flower-superlink", "--insecure", "--host", "127.0.0.1",
                          "--port", str(link), "--disable-runtime-dependency-installation")
        _wait_for_port(link, stop, superlink)
        for c, (path, port) in enumerate(zip(paths, node_ports)):
            command = (["flower-supernode"] if clientapp == "flower" else
                       [sys.executable, "-m", "sklearn_fedmf.flower", "--poll", str(poll)])
            start(f"supernode-{c}", *command, "--insecure", "--superlink",
                  f"127.0.0.1:{link}", "--port", str(port),
                  "--node-config", f'partition-id={c} data="{path}"')
        outputs, started = [], []
        for i, run_config in enumerate([None] if overrides is None else overrides):
            extra = []
            if run_config is not None:
                outputs.append(workdir / f"model-{i}.joblib")
                run_config = {**run_config, "output": str(outputs[-1])}
                extra = ["--run-config", " ".join(f"{key}={_toml(value)}"
                                                  for key, value in run_config.items())]
            started.append(start("run" if run_config is None else f"run-{i}", "flwr", "run",
                                 str(app_dir), "loopback", "--stream", *extra))
        seconds = []
        for run in started:
            try:
                run.wait(timeout=max(stop - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                pass  # no model: the caller sees None and the logs
            seconds.append(time.monotonic() - tic)
    finally:
        _end(procs)
    logs = {name: path.read_text() for name, path in logs.items()}
    if overrides is None:
        return (joblib.load(output) if output.is_file() else None), seconds[0], logs
    return [joblib.load(out) if out.is_file() else None for out in outputs], seconds, logs
