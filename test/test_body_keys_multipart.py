"""One meaning per multipart body (nomyo_router/api/multipart.py): a transcription's form
with a field twice or spelt another way, a part with headers Go's reader reads otherwise, or a
boundary inside a part is a 400 naming the field and never reaches a backend (through a real
router: test/body_keys_router.py); the forms the usual clients write are read, nothing refused."""

from __future__ import annotations

import aiohttp
import pytest

from nomyo_router.api import multipart
from nomyo_router.api.errors import ApiError
from test.body_keys_router import ALLOWED, SECRET, assert_refused, limited_router, post


@pytest.fixture
async def router():
    async with limited_router() as r:
        yield r


def form(*fields: tuple[bytes, bytes], boundary: bytes = b"b0undary7MA4YWxk") -> bytes:
    """A multipart body: (Content-Disposition parameters, value) per text field, then a file."""
    parts = [b"Content-Disposition: form-data; " + spelt + b"\r\n\r\n" + value for spelt, value in fields]
    parts.append(
        b'Content-Disposition: form-data; name="file"; filename="talk.wav"\r\nContent-Type: audio/wav'
        b"\r\n\r\nRIFF\x00\x01\x02\r\n--not-the-boundary\r\n"
    )
    return b"".join(b"--" + boundary + b"\r\n" + p + b"\r\n" for p in parts) + b"--" + boundary + b"--\r\n"


MULTIPART_BYPASSES = [  # (fields, the name the error names)
    ([(b'name="model"', ALLOWED.encode()), (b'name="model"', SECRET.encode())], "model"),
    ([(b'name="model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b"name=model", SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'NAME="model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'Name="model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'name="Model"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "Model"),
    ([(b'name="MODEL"', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "MODEL"),
    ([(b'name="model"; filename=""', SECRET.encode()), (b'name="model"', ALLOWED.encode())], "model"),
    ([(b'name="model"', ALLOWED.encode()), (b'name="stream"', b"false"), (b'name="stream"', b"true")], "stream"),
]


async def test_multipart_transcription_bypasses_are_refused(router):
    url, seen = router
    ctype = "multipart/form-data; boundary=b0undary7MA4YWxk"
    path = "/v1/audio/transcriptions"
    async with aiohttp.ClientSession() as s:
        for fields, key in MULTIPART_BYPASSES:
            status, body = await post(s, url + path, form(*fields), ctype)
            assert_refused(path, status, body, key)
        for fields in (
            [(b"name=\"prompt\"; name*=utf-8''model", SECRET.encode()), (b'name="model"', ALLOWED.encode())],
            [(b'name="model"\r\nContent-Transfer-Encoding: quoted-printable', ALLOWED.encode())],
            [
                (b'name="x"\r\nX-Other: 1\nContent-Disposition: form-data; name="model"', SECRET.encode()),
                (b'name="model"', ALLOWED.encode()),
            ],
        ):
            status, body = await post(s, url + path, form(*fields), ctype)
            assert status == 400 and body["error"]["type"] == "invalid_request_error", body
        # a boundary inside a part (Go's reader reads on; the router would stop)
        raw = form((b'name="model"', ALLOWED.encode())).replace(b"--b0undary7MA4YWxk--", b"--b0undary7MA4YWxk--x", 1)
        assert (await post(s, url + path, raw, ctype))[0] == 400
        raw = form((b'name="model"', ALLOWED.encode() + b"\r\n--b0undary7MA4YWxkX"))
        assert (await post(s, url + path, raw, ctype))[0] == 400
        assert seen == []
        status, body = await post(s, url + path, form((b'name="model"', ALLOWED.encode())), ctype)
        assert status == 200 and body["text"].startswith("mock transcription")
    assert seen == [path]


async def test_multipart_bodies_of_the_usual_clients_are_read():
    """aiohttp, httpx (the openai client), urllib3 (requests) and a file part marked
    `Content-Transfer-Encoding: binary` (Java's HttpMime): the model is read, nothing refused."""
    import httpx
    import urllib3

    form = aiohttp.FormData()
    form.add_field("model", ALLOWED)
    form.add_field("file", b"RIFF\r\n--x", filename="r\u00e9sum\u00e9.wav", content_type="audio/wav")
    writer = form()

    class Sink:
        data = b""

        async def write(self, chunk: bytes) -> None:
            self.data += chunk

    sink = Sink()
    await writer.write(sink)
    bodies = [
        sink.data,
        httpx.Request(
            "POST",
            "http://x",
            data={"model": ALLOWED, "language": "en"},
            files={"file": ("r\u00e9sum\u00e9.wav", b"RIFF", "audio/wav")},
        ).read(),
        urllib3.encode_multipart_formdata(
            {"model": ALLOWED, "file": ("a.wav", b"RIFF", "audio/wav")}, boundary="urllib3boundary"
        )[0],
        form_raw := form_bytes(
            [(b'name="model"', ALLOWED.encode())],
            file_head=b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\nContent-Transfer-Encoding: binary",
        ),
    ]
    for raw in bodies:
        assert multipart.transcription(raw)[1:] == (ALLOWED, False), raw[:300]
    with pytest.raises(ApiError):
        multipart.transcription(form_raw.replace(b"binary", b"quoted-printable"))


def form_bytes(fields: list[tuple[bytes, bytes]], file_head: bytes, boundary: bytes = b"bNd") -> bytes:
    parts = [b"Content-Disposition: form-data; " + spelt + b"\r\n\r\n" + value for spelt, value in fields]
    parts.append(file_head + b"\r\n\r\nRIFF")
    return b"".join(b"--" + boundary + b"\r\n" + p + b"\r\n" for p in parts) + b"--" + boundary + b"--\r\n"
