"""A ClientApp process that lives for the whole fit: Flower's process isolation, served warm.

With ``flower-supernode --isolation process`` the SuperNode runs no ClientApp itself: it
queues one *task* per Message on its Runtime API, for a process started outside it to claim.
Flower's own executor (``flower-superexec``) starts a fresh ``flwr-clientapp`` process per
task, which imports Flower, the app and its dependencies, serves one Message and exits.
:func:`serve_client_tasks` claims the tasks itself and serves them one after the other in
this one process, with what ``flwr-clientapp`` does for each (pull the Message and the
node's ``Context``, call the ClientApp, push the reply and the new ``Context``), so the app
is imported once and can keep what it derived from its node config (a site's ratings,
its protocol) between Messages. The node's private state still lives in ``Context.state``,
which the SuperNode holds, exactly as with Flower's executor.

Every call below is Flower 1.41's Runtime API, as its executor and ``flwr-clientapp`` use
it; the ClientApp is loaded from the run's FAB, once per FAB.
"""

from __future__ import annotations

import argparse
import importlib
import time
from logging import ERROR, INFO

import httpx
from flwr.app import Error, Message
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.constant import ErrorCode, SubStatus
from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    PullAppMessagesRequest,
    PullTaskInputRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore import log
from flwr.supercore.app_utils import start_parent_process_monitor
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.inflatable.inflatable_protobuf_utils import (
    make_confirm_message_received_fn_protobuf,
    make_pull_object_fn_protobuf,
)
from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.retry import make_simple_http_retry_invoker
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

from ._supernode import DEFAULT_POLL, idle_waits

__all__ = ["serve_client_tasks"]


def _runtime_client(address, interceptors):
    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=True, root_certificates=None,
        interceptors=interceptors, retry_invoker=make_simple_http_retry_invoker())


def _heartbeat_fn(client):
    request = SendTaskHeartbeatRequest()

    def beat():
        # Flower's own heartbeat interrupts the process when the task has ended; this one
        # serves many tasks, so a late heartbeat of a finished task is simply dropped
        try:
            client.SendTaskHeartbeat(request)
        except httpx.TransportError:
            return False
        return True

    return beat


class _AppCache:
    """The ClientApp of each FAB, installed and imported once."""

    def __init__(self):
        self.apps = {}

    def get(self, run, fab):
        if fab.hash_str not in self.apps:
            install_from_fab(fab.content, skip_prompt=True)
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            self.apps[fab.hash_str] = load(run.fab_id, run.fab_version, fab.hash_str)
        return self.apps[fab.hash_str]


def _pull_task_input(client, poll):
    """The task's Message, Context, Run and FAB: Flower's ``pull_task_input``, except that
    an object of the Message not yet in the SuperNode's store is asked for again after
    5 ms, doubling up to ``poll`` s, not after 1 s, doubling up to 10 s (the SuperNode makes
    the task before it has pulled the Message's objects from the SuperLink)."""
    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id = res.task_id
    TaskIdentity.run_id = res.run.run_id
    TaskIdentity.node_id = res.context.node_id
    context = context_from_proto(res.context)
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node = Node(node_id=context.node_id)
    tree = pulled.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree,
        make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node,
                                                  context.run_id),
        return_type=Message, initial_backoff=0.005, backoff_cap=poll,
    )
    message.metadata.__dict__["_message_id"] = tree.object_id
    return message, context, run_from_proto(res.run), fab_from_proto(res.fab)


def _serve_task(address, token, apps, poll):
    """Serve one claimed task as ``flwr-clientapp`` does, in this process."""
    client = _runtime_client(address, [
        RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
        RuntimeTokenHttpInterceptor(token),
    ])
    heartbeat = HeartbeatSender(_heartbeat_fn(client))
    heartbeat.start()
    message = context = reply = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        message, context, run, fab = _pull_task_input(client, poll)
        reply = apps.get(run, fab)(message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    # Flower's runtime contract: whatever the ClientApp raises becomes the Message's error
    # reply, naming the exception; the server raises it as that site's ClientError (or
    # counts it, as on_client_error says), and this process serves the next task
    except Exception as exc:  # noqa: BLE001
        code = (ErrorCode.LOAD_CLIENT_APP_EXCEPTION if isinstance(exc, LoadClientAppError)
                else ErrorCode.CLIENT_APP_RAISED_EXCEPTION)
        details = f"{type(exc)}:<'{exc}'>"
        log(ERROR, "ClientApp raised an exception", exc_info=exc)
        if message is not None:
            reply = Message(Error(code=code, reason=details), reply_to=message)
    finally:
        heartbeat.stop()
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
            # a failed task leaves the node's Context as it was
            push_task_output(client, context if status == SubStatus.COMPLETED else None,
                             status, details)
        finally:
            client.close()


def serve_client_tasks(runtime_api_address, *, poll=DEFAULT_POLL, parent_pid=None,
                       preload=()):
    """Claim and serve the ClientApp tasks of a SuperNode until this process is ended.

    Parameters
    ----------
    runtime_api_address : str
        ``host:port`` of the SuperNode's Runtime API (its ``--host``/``--port``), started
        with ``--isolation process``.
    poll : float, default=0.1
        The longest wait between two requests for a task while none is waiting (the
        waits start at 5 ms and double: see ``idle_waits``).
    parent_pid : int, default=None
        End this process when that process ends (the SuperNode it serves).
    preload : sequence of str, default=()
        Modules to import before the first task (while the federation starts), so that
        the first Message does not wait for them.
    """
    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)
    for name in preload:
        importlib.import_module(name)
    client = _runtime_client(runtime_api_address,
                             [RuntimeVersionHttpInterceptor(component_name="SuperExec")])
    request = AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP])
    apps = _AppCache()
    log(INFO, "Serving the ClientApp tasks of %s in one process", runtime_api_address)
    try:
        waits = idle_waits(poll)
        while True:
            response = client.AcquireTask(request)
            if response.HasField("task") and response.token:
                _serve_task(runtime_api_address, response.token, apps, poll)
                waits = idle_waits(poll)
            else:
                time.sleep(next(waits))
    finally:
        client.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=serve_client_tasks.__doc__.splitlines()[0])
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--poll", type=float, default=DEFAULT_POLL)
    parser.add_argument("--parent-pid", type=int)
    parser.add_argument("--preload", nargs="*", default=())
    args = parser.parse_args(argv)
    serve_client_tasks(args.runtime_api_address, poll=args.poll, parent_pid=args.parent_pid,
                       preload=args.preload)


if __name__ == "__main__":
    main()
