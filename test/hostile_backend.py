"""A hostile backend: a raw asyncio HTTP/1.1 server that speaks Ollama's or OpenAI's API and
breaks the rules a router must survive (test_hostile.py, bench/hostile.py).

What a stream request gets (`stream=`): `normal` (a few records), `long` (one good record,
then a record of `size` bytes that does not end, in HTTP chunks of `piece` bytes, then its
end and a final record if the router is still reading), `interim` (`100 Continue` and
`103 Early Hints` before the real answer, each in its own write), `switch` (`101 Switching
Protocols`, then bytes of some other protocol). What a whole (non-stream) request gets
(`whole=`): `normal`, `big` (a valid answer of `size` bytes: content-length, or chunked with
`chunked=True`), `cut` (a content-length answer cut after half of `size`), `interim`,
`switch`. GETs (discovery, probes) get small valid answers.

Bytes are sent as they are generated (a 200 MiB answer costs this process a piece, not 200
MiB). `served` counts answers sent in full, `refused` those the router stopped reading
(its connection closed while this server was writing).

    python -m test.hostile_backend --port 8000 --api ollama --stream long --whole big --size 209715200
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

MODEL = "evil"
OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\n"


class Hostile:
    def __init__(
        self,
        api: str = "ollama",
        stream: str = "normal",
        whole: str = "normal",
        size: int = 4 * 1024 * 1024,
        piece: int = 16 * 1024,
        chunked: bool = False,
        model: str = MODEL,
    ) -> None:
        self.api, self.stream, self.whole, self.model = api, stream, whole, model
        self.size, self.piece, self.chunked = size, piece, chunked
        self.served = 0
        self.refused = 0
        self.posts = 0
        self.server: asyncio.AbstractServer | None = None
        self.url = ""
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> Hostile:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for w in list(self._open):
                w.close()
            await self.server.wait_closed()

    async def __aenter__(self) -> Hostile:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def endpoint(self, name: str = "hostile", **extra: Any) -> dict[str, Any]:
        """This backend as one of the router's endpoints (its one model: `model`)."""
        return {"url": self.url, "name": name, "type": self.api, "models": [self.model], "max_concurrent": 4, **extra}

    # ---- the connection ---------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length) if length else b""
                method, path = head.split(b" ", 2)[:2]
                if method != b"POST":
                    await self._get(writer, path.decode())
                    continue
                self.posts += 1
                req = json.loads(body or b"{}")
                stream = req.get("stream", path.startswith(b"/api/"))
                await (self._stream(writer, req) if stream else self._whole(writer))
                if stream and self.stream != "normal" or not stream and self.whole != "normal":
                    break  # the hostile answer was the connection's last
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._open.discard(writer)
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(data)
        await writer.drain()

    async def _get(self, writer: asyncio.StreamWriter, path: str) -> None:
        m = self.model
        body = {
            "/api/tags": {"models": [{"name": m + ":latest", "model": m + ":latest"}]},
            "/api/ps": {"models": []},
            "/api/version": {"version": "0.0.0-hostile"},
            "/v1/models": {"object": "list", "data": [{"id": m, "object": "model"}]},
        }.get(path, {})
        data = json.dumps(body).encode()
        await self._send(writer, OK_HEAD % b"application/json" + b"Content-Length: %d\r\n\r\n%b" % (len(data), data))

    async def _interim(self, writer: asyncio.StreamWriter, how: str) -> bool:
        """The 1xx answers before the real one (True), or a protocol switch (False: done)."""
        if how == "interim":
            await self._send(writer, b"HTTP/1.1 100 Continue\r\n\r\n")
            await asyncio.sleep(0.02)  # (separate reads: the router must go on waiting for the head)
            await self._send(writer, b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n")
            await asyncio.sleep(0.02)
        elif how == "switch":
            await self._send(
                writer,
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\x81\x05hello",
            )
            await asyncio.sleep(0.2)
            return False
        return True

    # ---- streams --------------------------------------------------------------------------
    def _records(self, texts: list[str]) -> list[bytes]:
        if self.api == "ollama":
            out = [
                json.dumps(
                    {"model": self.model, "message": {"role": "assistant", "content": t}, "done": False}
                ).encode()
                + b"\n"
                for t in texts
            ]
            return out + [
                json.dumps(
                    {
                        "model": self.model,
                        "message": {"role": "assistant", "content": ""},
                        "done": True,
                        "done_reason": "stop",
                        "prompt_eval_count": 3,
                        "eval_count": len(texts),
                    }
                ).encode()
                + b"\n"
            ]

        def event(obj: dict) -> bytes:
            return b"data: " + json.dumps(obj).encode() + b"\n\n"

        base = {"id": "chatcmpl-hostile", "object": "chat.completion.chunk", "created": 0, "model": self.model}
        out = [
            event(
                {
                    **base,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                }
            )
        ]
        out += [
            event({**base, "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}) for t in texts
        ]
        out.append(event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        out.append(
            event(
                {
                    **base,
                    "choices": [],
                    "usage": {"prompt_tokens": 3, "completion_tokens": len(texts), "total_tokens": 3 + len(texts)},
                }
            )
        )
        return out + [b"data: [DONE]\n\n"]

    async def _stream(self, writer: asyncio.StreamWriter, req: dict) -> None:
        if not await self._interim(writer, self.stream):
            return
        ctype = b"application/x-ndjson" if self.api == "ollama" else b"text/event-stream"
        await self._send(writer, OK_HEAD % ctype + b"Transfer-Encoding: chunked\r\n\r\n")
        records = self._records(["hi", " there"])
        first = 0 if self.api == "ollama" else 1  # (the first record with text)
        try:
            for i, rec in enumerate(records):
                await self._send(writer, b"%x\r\n%b\r\n" % (len(rec), rec))
                if i == first and self.stream == "long":
                    await asyncio.sleep(0.1)  # (the router relayed the first records: the pump may take over)
                    await self._long_record(writer)
            await self._send(writer, b"0\r\n\r\n")
            self.served += 1
        except ConnectionError:
            self.refused += 1

    async def _long_record(self, writer: asyncio.StreamWriter) -> None:
        """A record of `size` bytes, sent in chunks of `piece`; it ends only after all of it."""
        start = (
            b'{"model": "evil", "message": {"role": "assistant", "content": "'
            if self.api == "ollama"
            else b'data: {"choices": [{"index": 0, "delta": {"content": "'
        )
        end = b'"}, "done": false}\n' if self.api == "ollama" else b'"}, "finish_reason": null}]}\n\n'
        await self._send(writer, b"%x\r\n%b\r\n" % (len(start), start))
        frame = b"%x\r\n%b\r\n" % (self.piece, b"x" * self.piece)
        for _ in range(max(0, self.size - len(start) - len(end)) // self.piece):
            await self._send(writer, frame)
        await self._send(writer, b"%x\r\n%b\r\n" % (len(end), end))

    # ---- whole answers ------------------------------------------------------------------
    def _whole_parts(self, filler: int) -> tuple[bytes, bytes]:
        """(what comes before `filler` bytes of text, what comes after) of a valid answer."""
        if self.api == "ollama":
            return (
                b'{"model": "evil", "created_at": "2024-01-01T00:00:00Z", "message": {"role": "assistant", '
                b'"content": "',
                b'"}, "done": true, "done_reason": "stop", "prompt_eval_count": 3, "eval_count": 7}',
            )
        return (
            b'{"id": "chatcmpl-hostile", "object": "chat.completion", "created": 0, "model": "evil", '
            b'"choices": [{"index": 0, "message": {"role": "assistant", "content": "',
            b'"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 7, '
            b'"total_tokens": 10}}',
        )

    async def _whole(self, writer: asyncio.StreamWriter) -> None:
        if not await self._interim(writer, self.whole):
            return
        size = self.size if self.whole in ("big", "cut") else 64
        before, after = self._whole_parts(0)
        filler = max(0, size - len(before) - len(after))
        total = len(before) + filler + len(after)
        chunked = self.chunked and self.whole == "big"
        head = OK_HEAD % b"application/json" + (
            b"Transfer-Encoding: chunked\r\n\r\n" if chunked else b"Content-Length: %d\r\n\r\n" % total
        )
        frame = b"x" * self.piece

        def framed(data: bytes) -> bytes:
            return b"%x\r\n%b\r\n" % (len(data), data) if chunked else data

        try:
            await self._send(writer, head + framed(before))
            left = filler if self.whole != "cut" else filler // 2
            while left > 0:
                n = min(left, self.piece)
                await self._send(writer, framed(frame[:n]))
                left -= n
            if self.whole == "cut":
                return
            await self._send(writer, framed(after) + (b"0\r\n\r\n" if chunked else b""))
            self.served += 1
        except ConnectionError:
            self.refused += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--api", choices=("ollama", "openai"), default="ollama")
    ap.add_argument("--stream", choices=("normal", "long", "interim", "switch"), default="long")
    ap.add_argument("--whole", choices=("normal", "big", "cut", "interim", "switch"), default="big")
    ap.add_argument("--size", type=int, default=200 * 1024 * 1024)
    ap.add_argument("--piece", type=int, default=64 * 1024)
    ap.add_argument("--chunked", action="store_true")
    ap.add_argument("--model", default=MODEL)
    a = ap.parse_args()

    async def run() -> None:
        h = await Hostile(a.api, a.stream, a.whole, a.size, a.piece, a.chunked, a.model).start(a.port)
        print(f"hostile backend on {h.url}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


if __name__ == "__main__":
    main()
