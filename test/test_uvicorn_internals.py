"""The uvicorn internals the router leans on are still there, with the shape it expects.

`nomyo_router/server/protocol.py` subclasses uvicorn's httptools protocol and reads and writes its
private state (the flow control's event, the request cycle's flags, the keep-alive timer it
replaces); `nomyo_router/ops/lifecycle.py` points `uvicorn.supervisors.multiprocess.Process`
at its own worker class; `nomyo_router/cli.py` adds a SIGHUP handler to the supervisor. None
of this is uvicorn's public API: pyproject.toml pins uvicorn to the versions this file passed
on, and a new version is let in once it passes here (the behaviour itself is tested through
the router in test_slow_reader, test_whole_write, test_connection_limits and
test_supervisor_death)."""

from __future__ import annotations

import asyncio
import inspect
import re
from collections import deque

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import Server, ServerState
from uvicorn.supervisors import Multiprocess, multiprocess

from nomyo_router.server.protocol import GuardedHttpToolsProtocol


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_module_names_the_writer_uses():
    """`BodyWriter.whole` writes uvicorn's status lines and refuses what its header check would."""
    assert isinstance(httptools_impl.HEADER_VALUE_RE, re.Pattern)
    assert httptools_impl.HEADER_VALUE_RE.search(b"ok\x01") and not httptools_impl.HEADER_VALUE_RE.search(b"ok\t")
    assert set(httptools_impl.STATUS_LINE) >= set(range(100, 600))
    assert httptools_impl.STATUS_LINE[200] == b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("connection_made", ["self", "transport"]),
        ("connection_lost", ["self", "exc"]),
        ("data_received", ["self", "data"]),
        ("on_message_begin", ["self"]),
        ("on_headers_complete", ["self"]),
        ("on_message_complete", ["self"]),
        ("pause_writing", ["self"]),
        ("resume_writing", ["self"]),
        ("on_response_complete", ["self"]),
        ("_unsupported_upgrade_warning", ["self"]),  # overridden (silenced)
        ("_unset_keepalive_if_required", ["self"]),  # called
    ],
)
def test_protocol_methods_overridden_or_called(name, params):
    method = getattr(HttpToolsProtocol, name)
    assert callable(method) and _params(method) == params


def test_on_response_complete_steps_are_the_ones_the_override_copies():
    """Without a pipelined request, `GuardedHttpToolsProtocol.on_response_complete` does
    uvicorn's steps itself (counting the request, dropping the keep-alive timer, resuming
    reads) but arms its own deadline instead of uvicorn's timer. A step uvicorn adds there
    would be skipped: this is the list of what the method touches."""
    names = set(HttpToolsProtocol.on_response_complete.__code__.co_names)
    assert names == {
        "server_state",
        "total_requests",
        "transport",
        "is_closing",
        "_unset_keepalive_if_required",
        "flow",
        "resume_reading",
        "pipeline",
        "pop",
        "_start_asgi_task",
        "timeout_keep_alive_task",
        "loop",
        "call_later",
        "timeout_keep_alive",
        "timeout_keep_alive_handler",
    }


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out: list[bytes] = []
        self.closing = False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 1), "peername": ("127.0.0.1", 2)}.get(name, default)

    def write(self, data):
        self.out.append(bytes(data))

    def writelines(self, list_of_data):
        self.out.extend(bytes(d) for d in list_of_data)

    def is_closing(self):
        return self.closing

    def close(self):
        self.closing = True

    def abort(self):
        self.closing = True

    def pause_reading(self):
        pass

    def resume_reading(self):
        pass


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def test_protocol_and_cycle_state_read_and_written():
    """The attributes server/protocol.py reads or sets on the protocol, its flow control and the
    request cycle, on a real connection fed one request."""
    config = Config(app=_app, http=GuardedHttpToolsProtocol, lifespan="off", access_log=False)
    config.load()
    loop = asyncio.get_running_loop()
    proto = GuardedHttpToolsProtocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    assert proto.loop is loop and proto.app is config.loaded_app
    assert isinstance(proto.timeout_keep_alive, (int, float))
    assert proto.timeout_keep_alive_task is None
    assert isinstance(proto.pipeline, deque)
    assert isinstance(proto.server_state.total_requests, int)
    assert proto.tasks is proto.server_state.tasks and isinstance(proto.tasks, set)  # (requests in progress)

    transport = _Transport()
    proto.connection_made(transport)
    assert proto.transport is transport
    assert isinstance(proto.flow, FlowControl)
    assert proto.flow.write_paused is False
    assert type(proto.flow._is_writable_event).__name__ == "_LeanEvent"  # it was an asyncio.Event, swapped
    assert proto.cycle is None  # (no request yet: connection_lost and data_received test for None)

    proto.data_received(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
    cycle = proto.cycle
    assert isinstance(cycle, RequestResponseCycle)
    assert type(cycle.transport).__name__ == "Cork"  # assigned by the override
    assert type(cycle.message_event).__name__ == "_LeanEvent"  # it was an asyncio.Event, swapped
    assert isinstance(cycle.scope, dict) and cycle.scope["method"] == "GET"
    for name, kind in [
        ("chunked_encoding", (bool, type(None))),
        ("response_complete", bool),
        ("disconnected", bool),
        ("response_started", bool),
        ("access_log", bool),
        ("default_headers", list),
        ("keep_alive", bool),
        ("waiting_for_100_continue", bool),
    ]:
        assert isinstance(getattr(cycle, name), kind), name
    assert callable(cycle.on_response)
    for _ in range(20):  # the app answers; the cycle completes and calls on_response
        if cycle.response_complete:
            break
        await asyncio.sleep(0.01)
    assert cycle.response_complete and proto.server_state.total_requests == 1
    assert b"".join(transport.out).startswith(b"HTTP/1.1 204 No Content\r\n")
    assert proto.timeout_keep_alive_task is None  # our deadline, not uvicorn's timer
    # uvicorn's protocol keeps a key-sharing __dict__ with our one attribute (`_g`) added:
    # CPython shares keys up to 30 names, past that every connection pays a full dict
    assert len(vars(proto)) < 30, sorted(vars(proto))
    proto.connection_lost(None)


def test_supervisor_process_hooks():
    """lifecycle.WorkerProcess subclasses `multiprocess.Process` (its constructor, its
    `target` run in the child, its `server`), and `use_bound_workers` swaps the module-level
    name that the supervisor looks up each time it makes a worker."""
    assert inspect.isclass(multiprocess.Process)
    assert _params(multiprocess.Process.__init__) == ["self", "config", "sockets"]
    assert _params(multiprocess.Process.target) == ["self", "sockets"]
    assert isinstance(inspect.getattr_static(multiprocess.Process, "server"), property)
    makers = [
        name for name, fn in vars(Multiprocess).items() if inspect.isfunction(fn) and "Process" in fn.__code__.co_names
    ]
    assert makers, "the supervisor no longer builds workers from the module's `Process`"
    assert Multiprocess.__module__ == multiprocess.__name__
    # the exit handler the worker wraps, and the setting it shortens
    assert _params(Server.handle_exit) == ["self", "sig", "frame"]
    assert "timeout_graceful_shutdown" in _params(Config.__init__)


def test_supervisor_dispatches_signals_by_handler_name():
    """cli.Supervisor adds `handle_hup`; uvicorn's supervisor calls `handle_<signal>` by name and
    keeps its workers in `processes`, each with its multiprocessing `process`."""
    source = inspect.getsource(Multiprocess.handle_signals)
    assert 'f"handle_{sig_name.lower()}"' in source
    assert "HUP" in multiprocess.SIGNALS.values()
    assert "self.processes" in inspect.getsource(Multiprocess.__init__)
    assert "self.process = " in inspect.getsource(multiprocess.Process.__init__)
