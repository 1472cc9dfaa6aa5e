"""The compiled relay's HTTP/1.1 framing (`relay/_pump.c`) against a reference parser.

A seeded generator writes chunked bodies as a backend might (sizes in either case with
leading zeros, extensions, trailers, bytes after the end), then breaks some of them (bytes
replaced, inserted, deleted, truncated, slices repeated); every case is split into reads at
random offsets (some at every byte). What the pump's own `decode()` makes of each
(`_pump.frame`) is held against h11, the pure-Python HTTP/1.1 parser httpx and uvicorn use:

- exactly what `model`, an independent parser of the grammar the pump means to implement,
  says: outcome, payload and dirtiness, for every split of the reads;
- and the model as h11 wherever h11 reads the body whole (the same payload; trailers make it
  dirty), and never a byte h11 would not give where h11 refuses or waits.

The differences from h11 are the model's, and documented there (`model`, `STRICTER`).

The second half drives the `Pump` object itself over socket pairs, with the same generator:
what reaches the client's socket, re-framed, decodes to whole records of the backend's
payload, in order, and nothing else. `make sanitize` runs this file under AddressSanitizer
and UndefinedBehaviorSanitizer with 200,000 cases. NOMYO_FUZZ_CASES sets the count.
"""

from __future__ import annotations

import os
import random
import socket

import h11
import pytest

from nomyo_router.relay import pump as native

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="the C extension was not built (no compiler)")

if native.AVAILABLE:
    from nomyo_router.relay import _pump

# (`make sanitize` runs 200,000 against the sanitizers' build; the plain suite a tenth, the same
# C code built without them)
CASES = int(os.environ.get("NOMYO_FUZZ_CASES", "20000"))
H11_EVERY = 4  # h11 costs 50 us a case, the pump and the model 4: it reads every 4th
HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
NOISE = b'\r\n;0123456789abcdefABCDEFxg \t"=\x00\xff'
DATA = b'ab\n{}":\r'
_AS_DATA = bytes(DATA[i % len(DATA)] for i in range(256))  # random bytes -> DATA's alphabet


def chunked(rng: random.Random) -> bytes:
    """A chunked body as a backend might write it."""
    out = []

    def size(n: int) -> bytes:
        digits = b"%x" % n if rng.random() < 0.7 else b"%X" % n
        return b"0" * rng.choice((0, 0, 0, 1, 3, 13)) + digits

    def ext() -> bytes:
        pick = rng.random()
        if pick < 0.8:
            return b""
        if pick < 0.9:
            return b";name"
        if pick < 0.95:
            return b";n=v"
        return b';q="a b"'

    for _ in range(rng.choice((0, 1, 1, 2, 3, 5))):
        n = rng.choice((1, 2, 5, 16, 40)) if rng.random() < 0.95 else rng.randint(100, 600)
        out.append(size(n) + ext() + b"\r\n" + rng.randbytes(n).translate(_AS_DATA) + b"\r\n")
    out.append(size(0) + ext() + b"\r\n")
    if rng.random() < 0.1:
        out.append(b"X-Trailer: v\r\n")
    out.append(b"\r\n")
    if rng.random() < 0.05:
        out.append(b"HTTP/1.1 200 OK\r\n")  # (bytes after the answer)
    return b"".join(out)


def broken(rng: random.Random, body: bytes) -> bytes:
    """`body` with one to three faults."""
    b = bytearray(body)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(b) + 1)
        op = rng.randrange(5)
        if op == 0 and at < len(b):
            b[at] = rng.choice(NOISE)
        elif op == 1:
            b[at:at] = bytes([rng.choice(NOISE)])
        elif op == 2 and at < len(b):
            del b[at]
        elif op == 3:
            del b[at:]
        else:
            b[at:at] = b[at : at + rng.randint(1, 8)]
    return bytes(b)


def cuts(rng: random.Random, n: int) -> list[int]:
    if n and rng.random() < 0.05:
        return list(range(1, n))  # every byte a read of its own
    return sorted(rng.sample(range(1, n), min(n - 1, rng.randint(0, 4)))) if n > 1 else []


def reference(body: bytes) -> tuple[str, bytes, bool]:
    """h11's reading of `body` as a chunked answer: (end | more | bad, payload, trailers)."""
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=1 << 20)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(HEAD + body)
    payload = []
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                return "more", b"".join(payload), False
            if isinstance(event, h11.Data):
                payload.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return "end", b"".join(payload), bool(event.headers)
    except h11.RemoteProtocolError:
        return "bad", b"".join(payload), False


HEX = frozenset(b"0123456789abcdefABCDEF")


STRICTER = ("a size of more than 15 digits", "a CR in an extension not followed by LF")


def model(body: bytes, split: list[int]) -> tuple[tuple[int, bytes, int], str]:
    """The framing the pump means to implement, written as a parser of the whole body:
    ((outcome, payload, dirty) as `_pump.frame` gives them, why it refused). Its grammar is
    RFC 9112's chunked coding, read as h11 reads it, with documented differences. Stricter
    (`STRICTER`: refused where h11 reads on): a chunk size has at most 15 hex digits (no size
    can overflow the pump's counter), leading zeros included; an extension ends at its first
    CR, which must be followed by LF. More lenient (never seen by the client, whose answer is
    framed anew): a space or tab may follow the size; extensions and trailer lines are skipped
    unparsed, and trailers make the end dirty (the connection is not reused)."""
    n, i, out = len(body), 0, bytearray()

    def bad(why: str = "malformed") -> tuple[tuple[int, bytes, int], str]:
        return (_pump.BAD, bytes(out), 0), why

    def more(dirty: int = 0) -> tuple[tuple[int, bytes, int], str]:
        return (0, bytes(out), dirty), ""

    while True:
        j = i
        while j < n and body[j] in HEX and j - i < 16:
            j += 1
        if j - i > 15:
            return bad(STRICTER[0])
        if j == n:
            return more()
        size, c = int(body[i:j] or b"0", 16), body[j]
        if j == i or c not in b";\r \t":
            return bad()
        in_ext = c != 13
        if in_ext:  # an extension, up to CR
            while j < n and body[j] not in b"\r\n":
                j += 1
            if j == n:
                return more()
            if body[j] == 10:
                return bad()
        if j + 1 == n:
            return more()
        if body[j + 1] != 10:
            return bad(STRICTER[1] if in_ext else "malformed")
        i = j + 2
        if size:
            out += body[i : i + size]
            if i + size > n:
                return more()
            i += size
            for k, want in ((i, 13), (i + 1, 10)):
                if k == n:
                    return more()
                if body[k] != want:
                    return bad()
            i += 2
            continue
        dirty = 0
        while True:  # trailers, then the empty line
            if i == n:
                return more(dirty)
            if body[i] in b"\r\n":  # the empty line: CRLF, or a bare LF
                if body[i] == 13:
                    if i + 1 == n:
                        return more(dirty)
                    if body[i + 1] != 10:
                        return (_pump.BAD, bytes(out), dirty), "malformed"
                end = i + (2 if body[i] == 13 else 1)
                if end < n and end not in split:  # bytes after the answer, read with it
                    dirty = 1
                return ((_pump.END_DIRTY if dirty else _pump.END), bytes(out), dirty), ""
            dirty = 1
            i += 1
            while i < n and body[i] != 10:
                i += 1
            if i == n:
                return more(dirty)
            i += 1


def check(body: bytes, split: list[int], h11_too: bool = True) -> str:
    """One case: the pump exactly as the model; the model as h11 wherever h11 reads the body
    whole (but for what it refuses on purpose), and never a byte h11 would not give. Returns
    h11's verdict ("" when not asked)."""
    got = _pump.frame(body, split)
    want, why = model(body, split)
    assert got == want, f"body {body!r} split at {split}: pump {got}, model {want}"
    if not h11_too:
        return ""
    verdict, expected, trailers = reference(body)
    outcome, payload, dirty = want
    where = f"body {body!r}: model {want} ({why}), h11 {verdict} {expected!r}"
    if verdict == "end" and not (outcome == _pump.BAD and why in STRICTER):
        assert outcome in (_pump.END, _pump.END_DIRTY) and payload == expected, where
        assert dirty or not trailers, where
    else:
        assert payload.startswith(expected) or expected.startswith(payload), where
    return verdict


def test_the_pumps_framing_agrees_with_h11():
    rng = random.Random(20261129)
    ends = bad = 0
    for i in range(CASES):
        body = chunked(rng)
        if rng.random() < 0.6:
            body = broken(rng, body)
        verdict = check(body, cuts(rng, len(body)), not i % H11_EVERY)
        ends += verdict == "end"
        bad += verdict == "bad"
    # (the generator reaches both sides: whole bodies and malformed ones, many of each)
    assert ends > CASES // H11_EVERY // 4 and bad > CASES // H11_EVERY // 10, (ends, bad)


@pytest.mark.parametrize(
    "body, outcome, payload",
    [
        (b"5\r\nhello\r\n0\r\n\r\n", 1, b"hello"),
        (b"0000000000000005\r\nhello\r\n0\r\n\r\n", 4, b""),  # 16 digits: refused
        (b"5;a=b\r\nhello\r\n0\r\nX: y\r\n\r\n", 2, b"hello"),
        (b"fffffffffffffff\r\nab", 0, b"ab"),  # a huge size waits for its bytes, holding what came
        (b"5\r\nhello\n0\r\n\r\n", 4, b"hello"),
        (b"-5\r\nhello\r\n", 4, b""),
        (b"\r\n", 4, b""),
    ],
)
def test_edges(body: bytes, outcome: int, payload: bytes):
    assert _pump.frame(body, list(range(1, len(body)))) == (outcome, payload, int(outcome == 2))


def relay(body: bytes, split: list[int], record_limit: int, small: bool) -> tuple[int, bytes, bytes, bool]:
    """`body` through a real Pump between two socket pairs: (its final event, or 0 when it
    still waits; the payload the client's socket got, decoded; the pump's `sent`; whether it
    ever waited for the client). `small`:
    the client's socket takes little at a time, so the pump waits for it (its back-pressure
    path: the rest kept, the backend not read, resumed when the client reads)."""
    pump = _pump.Pump()
    up_ours, up_pumps = socket.socketpair()
    client_pumps, client_ours = socket.socketpair()
    if small:
        client_pumps.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1024)
        client_ours.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    client_ours.setblocking(False)
    framed = bytearray()
    blocked = False

    def drain() -> int:
        """Run the pump and read the client's side until neither moves; the final event."""
        nonlocal blocked
        for _ in range(10_000):
            events = pump.run(256)
            blocked = blocked or pump.blocked(h)
            got = 0
            while True:
                try:
                    chunk = client_ours.recv(512 if small else 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                framed.extend(chunk)
                got += len(chunk)
            for _, e in events:
                if e != _pump.SENT:
                    return int(e)
            if not events and not got:
                return 0
        raise AssertionError("the pump never settled")

    try:
        h = pump.add(up_pumps.fileno(), client_pumps.fileno(), b"\n", b"", 1 << 30, record_limit)
        event = 0
        bounds = [0, *split, len(body)]
        for a, b in zip(bounds, bounds[1:], strict=False):
            if a < b:
                up_ours.sendall(body[a:b])
                event = drain()
                if event:
                    break
        if not event:
            up_ours.shutdown(socket.SHUT_WR)  # the backend closes: a cut, unless the body ended
            event = drain()
        sent, _, out = pump.remove(h)
        framed.extend(out)  # (what the client's socket had not taken yet)
        got = reference(bytes(framed) + b"0\r\n\r\n")
        assert got[0] == "end", f"the pump wrote malformed framing {bytes(framed)!r}"
        return event, got[1], sent, blocked
    finally:
        pump.close()
        for s in (up_ours, up_pumps, client_pumps, client_ours):
            s.close()


def test_the_pump_relays_whole_records_and_nothing_else():
    rng = random.Random(7)
    waited = 0
    for i in range(max(200, CASES // 60)):
        body = chunked(rng)
        small = rng.random() < 0.25
        if small:  # long enough to fill the client's socket several times
            body = b"%x\r\n%s\r\n" % (30_000, rng.randbytes(30_000).translate(_AS_DATA)) + body
        if rng.random() < 0.5:
            body = broken(rng, body)
        limit = rng.choice((0, 0, 8, 64))
        event, relayed, sent, blocked = relay(body, cuts(rng, len(body)), limit, small)
        waited += blocked
        want, expected, _ = reference(body)
        where = f"case {i}: body {body[:200]!r}...: event {event}, h11 {want}"
        assert relayed == sent, where  # (what Python is told was written is what was written)
        assert expected.startswith(relayed) or (want != "end" and relayed.startswith(expected)), where
        assert not relayed or relayed.endswith(b"\n"), where  # whole records only
        if want == "end" and event in (_pump.END, _pump.END_DIRTY):
            assert relayed == expected[: expected.rfind(b"\n") + 1], where
    assert waited > 20


def test_the_sanitized_build_is_the_one_tested():
    """Under `make sanitize`, the pump these tests drive is the sanitizers' build."""
    where = os.environ.get("NOMYO_SANITIZED")
    if not where:
        pytest.skip("not the sanitizer run (make sanitize)")
    assert _pump.__file__.startswith(os.path.abspath(where) + os.sep)
