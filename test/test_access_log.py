"""The access log cannot be forged: one physical line of printable ASCII per request, each key
once, a client's odd `X-Request-ID` replaced, and values from the request (the model name) or
the config (a client key's name) quoted so they read back exactly. And its `status` is what
the client was sent: a stream cut mid-way after its 200 head is 200, a client that left before
any head is 499, an exception before any head is 500.

Real sockets throughout: the router runs in this event loop (`run_router`), requests are
written byte for byte so any header value can be sent."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from mock import run_mock
from nomyo_router.events import Events, RequestRecord
from nomyo_router.ops.accesslog import text_value
from nomyo_router.ops.logformat import JsonFormatter
from nomyo_router.ops.metrics import UNKNOWN_MODEL
from test.helpers import endpoints, read_response, run_router

KEY = "router-key-0123456789"
CLIENT = 'ops "blue" status=1 \\'  # a client key's name is the operator's: it may hold anything
CHAT = {"model": "llama3", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
KEYS = {
    "request_id",
    "client",
    "api",
    "route",
    "model",
    "stream",
    "endpoint",
    "status",
    "queue_ms",
    "ttft_ms",
    "total_ms",
    "tokens_in",
    "tokens_out",
    "affinity",
    "retries",
    "resumed",
    "relay",
    "error",
}
ENVELOPE = ("time", "level", "logger", "message")  # every JSON line's (ops/logformat.py)
JSON_LINE = JsonFormatter()
ALWAYS = {"request_id", "api", "route", "model", "stream", "status", "queue_ms", "total_ms", "retries", "resumed"}
GENERATED = re.compile(r"[0-9a-f]+-[0-9]+")  # app.next_request_id

# (what the client sends as X-Request-ID, whether the router keeps it)
REQUEST_IDS = [
    (b"abc-123", True),
    (b'"q"', True),  # printable, no space: kept, quoted in a text line
    (b"x=1\\", True),
    (b"~" * 128, True),
    (b"a b", False),
    (b"x status=200", False),
    (b"a\tb", False),
    (b"x" * 129, False),
    (b"x" * 200, False),
    ("é-id".encode(), False),
    (b"\xff\xfe", False),
]  # (a DEL or NUL in a header value: the HTTP parser refuses the request before the router sees it)
MODELS = [
    "llama3\nstatus=200 request_id=evil",
    "a=b",
    'say "hi"',
    "back\\slash",
    "tab\there",
    "line\u2028sep\x85nel",
    "nul\x00",
    "é ü",
    "x" * 256,  # (the longest name allowed: MAX_MODEL_BYTES)
]  # (a lone surrogate: refused as bad JSON, 400, no line)

_PAIR = re.compile(r'([a-z_]+)=("(?:[^"\\]|\\.)*"|[^ "]+)(?: |$)')


def parse_text(line: str) -> dict[str, Any]:
    """A text access line back into its values: `key=token` or `key="json string"`, one space
    apart; fails on anything else, and on a key seen twice."""
    out: dict[str, Any] = {}
    pos = 0
    while pos < len(line):
        m = _PAIR.match(line, pos)
        assert m is not None, f"unparsable at {pos}: {line[pos:]!r}"
        key, value = m.group(1), m.group(2)
        assert key not in out, f"{key} twice in {line!r}"
        out[key] = json.loads(value) if value.startswith('"') else value
        pos = m.end()
    assert not line.endswith(" ")
    return out


def parse_json(line: str) -> dict[str, Any]:
    def once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        assert len(keys) == len(set(keys)), f"a key twice in {line!r}"
        return dict(pairs)

    return json.loads(line, object_pairs_hook=once)


def one_line(line: str) -> None:
    """Printable ASCII, no line break of any kind (`str.splitlines` knows \\x85, U+2028, ...)."""
    assert line.isascii() and line.isprintable() and line.splitlines() == [line], repr(line)


def parse(line: str, fmt: str) -> dict[str, Any]:
    one_line(line)
    fields = parse_json(line) if fmt == "json" else parse_text(line)
    if fmt == "json":  # the line's own fields, then the request's
        envelope = {k: fields.pop(k) for k in ENVELOPE}
        assert envelope["level"] == "INFO" and envelope["logger"] == "nomyo_router.access"
        assert envelope["message"] == f"{fields['route']} {fields['status']}"
        assert set(fields) == KEYS
        fields = {k: v for k, v in fields.items() if v is not None}
    else:  # typed back as a JSON line has them
        for k in ("status", "retries", "resumed", "tokens_in", "tokens_out"):
            if k in fields and fields[k].isdigit():  # (text has no types: a backend's "count" may be anything)
                fields[k] = int(fields[k])
        for k in ("queue_ms", "ttft_ms", "total_ms"):
            if k in fields:
                fields[k] = float(fields[k])
        fields["stream"] = {"True": True, "False": False}[fields["stream"]]
    assert ALWAYS <= set(fields) <= KEYS
    return fields


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines as written: a JSON one as `log_format: json`'s formatter writes it."""
    return [
        JSON_LINE.format(r) if hasattr(r, "access") else r.getMessage()
        for r in caplog.records
        if r.name == "nomyo_router.access"
    ]


async def until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    """The line is written in the request's `finally`, which may run after the client has its answer."""
    for _ in range(int(timeout / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


async def raw_post(url: str, path: str, body: bytes, headers: list[bytes]) -> tuple[int, dict[bytes, bytes]]:
    """POST with header lines written as given; (status, headers) of the content-length answer."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"POST %s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            % (path.encode(), len(body))
            + b"".join(h + b"\r\n" for h in headers)
            + b"\r\n"
            + body
        )
        status, head, _ = await read_response(reader)
        return int(status.split()[1]), dict(head)
    finally:
        writer.close()


def keyed(mock: Any, fmt: str, **extra: Any) -> dict[str, Any]:
    return {
        "endpoints": endpoints(mock),
        "access_log": True,
        "log_format": fmt,
        "client_keys": [{"name": CLIENT, "key": KEY}],
        **extra,
    }


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_forged_request_ids_and_model_names_stay_in_their_field(mock, caplog, fmt):
    auth = b"Authorization: Bearer " + KEY.encode()
    sent: list[tuple[bytes | str, int, bytes]] = []  # (what was sent, status, echoed id)
    with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
        async with run_router(keyed(mock, fmt)) as r:
            for rid, _ in REQUEST_IDS:
                status, head = await raw_post(
                    r.url, "/api/chat", json.dumps(CHAT).encode(), [auth, b"X-Request-ID: " + rid]
                )
                sent.append((rid, status, head[b"x-request-id"]))
            for model in MODELS:
                rid = b"m-%d" % len(sent)
                body = json.dumps({**CHAT, "model": model}).encode()
                status, head = await raw_post(r.url, "/api/chat", body, [auth, b"X-Request-ID: " + rid])
                sent.append((model, status, rid))
            await until(lambda: len(access_lines(caplog)) == len(sent))
    lines = [parse(line, fmt) for line in access_lines(caplog)]
    by_id = {x["request_id"]: x for x in lines}
    assert len(by_id) == len(sent)  # one line per request, each with its own id
    for (rid, keep), (_, status, echoed) in zip(REQUEST_IDS, sent, strict=False):
        assert status == 200
        if keep:
            assert echoed == rid  # kept verbatim, and echoed as it came
        else:
            assert GENERATED.fullmatch(echoed.decode()), echoed  # replaced, and the replacement echoed
        line = by_id[echoed.decode("ascii")]
        assert line["status"] == 200 and line["model"] == "llama3" and line["client"] == CLIENT
        assert line["endpoint"] == "m0" and line["route"] == "/api/chat" and line["stream"] is False
    for _model, (_, status, rid) in zip(MODELS, sent[len(REQUEST_IDS) :], strict=True):
        assert status == 404  # an unknown model, still logged, under the placeholder (never what the client wrote)
        line = by_id[rid.decode()]
        assert line["model"] == UNKNOWN_MODEL and line["status"] == 404 and line["client"] == CLIENT
        assert line["error"] == "error" and "endpoint" not in line


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("resume", [True, False])
async def test_a_stream_cut_mid_way_is_one_line_with_the_200_the_client_got(caplog, fmt, resume):
    # One endpoint: nowhere to resume, so the client gets its 200 head, part of the answer and an error chunk.
    async with run_mock(ttft_ms=0.0, tok_ms=2.0, tokens=40, drop_rate=1.0) as dropping:
        cfg = {
            "endpoints": endpoints(dropping),
            "access_log": True,
            "log_format": fmt,
            "resume_streams": resume,
            "eject_after": 1000,
        }
        with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
            async with run_router(cfg) as r, aiohttp.ClientSession() as s:
                async with s.post(r.url + "/api/chat", json={**CHAT, "stream": True}) as resp:
                    assert resp.status == 200
                    raw = await resp.read()
                await until(lambda: len(access_lines(caplog)) == 1)
        assert dropping.stats()["errors_injected"]["drop"] == 1
    assert b'"error"' in raw.splitlines()[-1]  # the client was told, in the stream's own format
    (line,) = [parse(x, fmt) for x in access_lines(caplog)]
    assert line["status"] == 200 and line["error"] == "stream_cut" and line["stream"] is True
    assert line["endpoint"] == "m0" and "ttft_ms" in line


@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_a_client_gone_before_any_head_is_499(caplog, fmt):
    """Waiting for the backend's answer, and waiting for its key's permit (max_concurrent):
    the client leaves, nothing was sent, the line says 499 (nginx's code), once."""
    async with run_mock(ttft_ms=3000.0, tok_ms=0.0, tokens=4) as slow:
        cfg = {
            "endpoints": endpoints(slow),
            "access_log": True,
            "log_format": fmt,
            "client_keys": [{"name": "capped", "key": KEY, "max_concurrent": 1}],
        }
        with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
            async with run_router(cfg) as r:
                host, port = r.url.removeprefix("http://").split(":")
                body = json.dumps(CHAT).encode()
                socks = []
                # the first is at the backend, then the second waits for the key's one permit
                for rid, there in (
                    (b"holds-the-permit", lambda: slow.stats()["in_flight"] == 1),
                    (b"waits-for-it", lambda: r.router.store.held_aside == 1),
                ):
                    sock = socket.create_connection((host, int(port)))
                    sock.sendall(
                        b"POST /api/chat HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        b"Authorization: Bearer %s\r\nX-Request-ID: %s\r\nContent-Length: %d\r\n\r\n%s"
                        % (KEY.encode(), rid, len(body), body)
                    )
                    socks.append(sock)
                    await until(there)
                for sock in socks:
                    sock.close()
                await until(lambda: len(access_lines(caplog)) == 2)
    lines = {x["request_id"]: x for x in (parse(line, fmt) for line in access_lines(caplog))}
    at_backend, waiting = lines["holds-the-permit"], lines["waits-for-it"]
    assert at_backend["status"] == 499 and at_backend["error"] == "client_gone" and at_backend["endpoint"] == "m0"
    assert waiting["status"] == 499 and waiting["error"] == "client_gone" and "endpoint" not in waiting
    assert at_backend["client"] == waiting["client"] == "capped"


@pytest.mark.instruments  # (it breaks the proxy on purpose)
async def test_an_exception_before_any_head_is_the_500_the_client_got(mock, caplog):
    async with run_router({"endpoints": endpoints(mock), "access_log": True, "log_format": "json"}) as r:

        async def broken(*args: Any) -> None:
            raise RuntimeError("a bug")

        r.router.proxy.forward = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
            status, _ = await raw_post(r.url, "/api/chat", json.dumps(CHAT).encode(), [b"X-Request-ID: boom"])
            await until(lambda: len(access_lines(caplog)) == 1)
    assert status == 500
    (line,) = [parse(x, "json") for x in access_lines(caplog)]
    assert line["request_id"] == "boom" and line["status"] == 500 and line["error"] == "internal_error"


def test_a_record_without_a_head_is_settled_by_how_the_request_ended():
    events, told = Events(), []
    events.on_request_done(told.append)
    events.request_done(RequestRecord("1", "ollama", "/api/chat", "m", False))  # returned: the client left
    events.request_done(RequestRecord("2", "ollama", "/api/chat", "m", False), failed=True)  # an exception
    events.request_done(RequestRecord("3", "ollama", "/api/chat", "m", False, status=404, error="error"))
    assert [(x.status, x.error) for x in told] == [(499, "client_gone"), (500, "internal_error"), (404, "error")]


def test_text_values_are_plain_tokens_or_json_strings():
    tricky = [
        "",
        " ",
        "=",
        '"',
        "\\",
        "a b",
        "\n",
        "\r\n",
        "\x00",
        "\x7f",
        "\x85",
        "\u2028",
        "\u2029",
        "\ud800",
        "é",
        "\U0001f600",
        "x=1",
        'q"',
        "\t",
    ] + [chr(c) for c in range(0x21, 0x7F)]
    for value in tricky:
        out = text_value(value)
        one_line(out)
        assert " " not in out and out.count("=") == 0 or out.startswith('"'), out
        assert (json.loads(out) if out.startswith('"') else out) == value
        if out == value:  # left as it is: only a plain token
            assert re.fullmatch(r"[\x21-\x7e]+", value) and not set(value) & set('="\\')
    assert text_value(True) == "True" and text_value(12) == "12" and text_value(1.5) == "1.5"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_any_value_of_any_type_keeps_the_line_whole(caplog, fmt):
    """A backend's token "count" reaches the record unchecked on the translated path: a
    string, a list, an empty string must not forge a field either."""
    from nomyo_router.ops.accesslog import AccessLog

    events = Events()
    AccessLog(events, fmt)
    odd: list[Any] = ["1 status=200", ["a b", 'c"'], "", {"k": "v\n"}, 12]
    with caplog.at_level(logging.INFO, logger="nomyo_router.access"):
        for value in odd:
            events.request_done(
                RequestRecord(
                    "r", "ollama", "/api/chat", "m", True, status=200, prompt_tokens=value, completion_tokens=value
                )
            )
    for value, line in zip(odd, access_lines(caplog), strict=True):
        fields = parse(line, fmt)
        expected = value if fmt == "json" or isinstance(value, int) else str(value)
        assert fields["tokens_in"] == fields["tokens_out"] == expected and fields["status"] == 200
