"""Reading a multipart/form-data body: audio transcriptions (`POST /v1/audio/transcriptions`).

A transcription's body is read once (bounded by `max_body_bytes`, kept for a retry on another
endpoint) and forwarded as it came, with its own Content-Type; the model is read from the
`model` form field without decoding the file part. Field names are read as Go's
mime/multipart reads them, and a body Ollama could read otherwise (a field twice, a name spelt
another way, a boundary inside a part) is refused: form_names.py.
"""

from __future__ import annotations

import re

from . import form_names
from .errors import ApiError

_MAX_FIELD = 4096


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def form(raw: bytes) -> tuple[str, dict[str, str]]:
    """(the Content-Type to forward, the small text fields) of a multipart/form-data body.

    The boundary is the body's first line (clients send no preamble), so the router needs
    neither the request's header nor a copy of the file part: only the text fields are
    decoded (`model`, `stream`, ...), the file's bytes are never touched."""
    first = raw[:1024].split(b"\r\n", 1)[0]
    if not first.startswith(b"--") or len(first) < 3 or not re.fullmatch(rb"--[\x21-\x7e]{1,200}", first):
        raise _bad("the body must be multipart/form-data with a `file` and a `model` field")
    delimiter = b"\r\n" + first
    fields: dict[str, str] = {}
    names: list[str] = []  # every text field, in order (form_names.check_form_names)
    pos = len(first) + 2
    while pos < len(raw):
        head_end = raw.find(b"\r\n\r\n", pos, pos + 8192)
        if head_end < 0:  # (a part the router cannot read is one a backend might)
            raise _bad("a multipart part has no header block within 8 KB")
        head = raw[pos:head_end].decode("latin-1")
        end = raw.find(delimiter, head_end + 4)
        if end < 0:
            raise _bad("the multipart body is cut: no closing boundary")
        name, is_file = form_names.form_part(head)  # as Go's mime/multipart reads it
        if name is not None and not is_file:
            names.append(name)
            if end - head_end - 4 <= _MAX_FIELD:
                fields[name] = raw[head_end + 4 : end].decode("utf-8", "replace")
        pos = end + len(delimiter)
        if raw[pos : pos + 2] == b"--":
            if raw[pos + 2 : pos + 4] not in (b"", b"\r\n"):  # (not the end for Go's reader, which reads on)
                raise _bad("a multipart part contains its closing boundary")
            break
        if raw[pos : pos + 2] != b"\r\n":  # a boundary is followed by CRLF or "--"; else it is part of the content
            raise _bad("a multipart part contains its boundary")
        pos += 2
    form_names.check_form_names(names)
    return "multipart/form-data; boundary=" + first[2:].decode("latin-1"), fields


def transcription(raw: bytes) -> tuple[str, str, bool]:
    """(content type, model, stream) of a transcription request."""
    ctype, fields = form(raw)
    model = fields.get("model", "").strip()
    if not model:
        raise _bad("model is required (a form field)", "model")
    stream = fields.get("stream", "false").strip().lower()
    if stream not in ("true", "false"):
        raise _bad("stream must be true or false", "stream")
    return ctype, model, stream == "true"
