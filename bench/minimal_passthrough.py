"""The floor of the router's design: raw ASGI under uvicorn + one aiohttp session, no
validation, no scheduling. bench/overhead.py --floor runs it beside the router.

    UPSTREAM=http://127.0.0.1:11434 uvicorn minimal_passthrough:app --app-dir bench
"""

import os

import aiohttp

UPSTREAM = os.environ.get("UPSTREAM", "http://127.0.0.1:11434")
_session: aiohttp.ClientSession | None = None


async def app(scope, receive, send):
    global _session
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
                await send({"type": "lifespan.startup.complete"})
            else:
                await _session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    async with _session.post(UPSTREAM + scope["path"], data=body) as r:
        await send(
            {
                "type": "http.response.start",
                "status": r.status,
                "headers": [(b"content-type", r.headers.get("Content-Type", "").encode())],
            }
        )
        async for chunk in r.content.iter_any():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
