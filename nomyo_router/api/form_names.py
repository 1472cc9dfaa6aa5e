"""How a multipart/form-data body names its fields, read as Go's mime/multipart reads them, and
the refusal of a body that Ollama could read otherwise than the router (body_keys.py says why:
Go reads `name=model` and `NAME="model"` as the field `model`, decodes RFC 2231 names, and
takes the *first* `model` field where a naive reader takes another). The rule: each text
field named once, as `name="..."`, no two names alike under case folding, none a field name
spelt another way; anything else is a 400 naming it. Used by multipart.py (transcriptions)."""

from __future__ import annotations

import re
from urllib.parse import unquote_to_bytes

from .body_keys import FIELDS, check_spelling, quoted
from .errors import ApiError

# As Go reads a part's header block (net/textproto) and its Content-Disposition (mime.ParseMediaType):
_TSPECIALS = '()<>@,;:\\"/[]?='
_TOKEN = "[" + "".join(re.escape(chr(c)) for c in range(0x21, 0x7F) if chr(c) not in _TSPECIALS) + "]+"
_HEADER = re.compile(rf"({_TOKEN}):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
_PARAM = re.compile(rf'[ \t]*;[ \t]*({_TOKEN})[ \t]*=[ \t]*(?:"((?:[^"\\\r\n]|\\[^\r\n])*)"|({_TOKEN}))')
_TRAILING = re.compile(r"[ \t]*;?[ \t]*")


def form_part(head: str) -> tuple[str | None, bool]:
    """(the form field's name, whether the part is a file) of one part of a multipart body, as
    Go's mime/multipart reads them; `head` is the part's header block (latin-1 text). None: a
    part without a name (Go skips it). 400 for anything the router and Go could read apart."""
    disposition = None
    for line in head.split("\r\n"):
        m = _HEADER.fullmatch(line)
        if m is None:  # folded or bare-LF lines, a space before the colon, no colon...
            raise ApiError(400, f"a multipart part has a malformed header line: {line[:80]!r}")
        name = m.group(1).lower()
        if name == "content-disposition":
            if disposition is not None:
                raise ApiError(400, "a multipart part has two Content-Disposition headers")
            disposition = m.group(2)
        elif name == "content-transfer-encoding" and m.group(2).lower() not in ("binary", "8bit", "7bit"):
            # (Go decodes quoted-printable parts: the router would read the value undecoded)
            raise ApiError(
                400, f"a multipart part has Content-Transfer-Encoding: {m.group(2)[:40]}; send it as is (binary)"
            )
    if disposition is None:
        return None, False
    base = disposition.partition(";")[0]
    if base.strip(" \t").lower() != "form-data":
        raise ApiError(400, f"a multipart part is not form-data: {base[:80]!r}")
    params: dict[str, str] = {}
    spelt: dict[str, str] = {}  # each parameter as written, from its name to its value
    pos, rest = 0, disposition[len(base) :]
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        if m is None:
            if _TRAILING.fullmatch(rest, pos):
                break
            raise ApiError(400, f"a multipart part has a malformed Content-Disposition: {disposition[:120]!r}")
        key = m.group(1).lower()
        if key in params:
            raise ApiError(400, f"a multipart part's Content-Disposition gives {key} twice")
        params[key] = _unquote(m.group(2)) if m.group(2) is not None else m.group(3)
        spelt[key] = m.group(0).strip(" \t;")
        pos = m.end()
    for key in params:
        if "*" in key and key != "filename*":  # RFC 2231 names and continuations
            raise ApiError(400, f'a multipart part\'s Content-Disposition has {key}: give the name as name="..."')
    filename = params.get("filename", "")
    if "filename*" in params:  # Go decodes it and lets it replace filename
        filename = _rfc2231(params["filename*"])
    name = params.get("name")
    if name is None:
        return None, False  # (Go: no name, the part is skipped)
    if spelt["name"] != f'name="{name}"':
        raise ApiError(
            400,
            f"a multipart field is named {spelt['name']!r}; the router reads names only as "
            f'name="{name}" (lower-case, quoted, no escapes)',
            param=name,
        )
    return name, filename != ""


def _unquote(value: str) -> str:
    """A quoted-string's content as Go's mime package reads it: a backslash escapes a tspecial
    character and is kept before any other."""
    return re.sub(r"\\(.)", lambda m: m.group(1) if m.group(1) in _TSPECIALS else m.group(0), value)


def _rfc2231(value: str) -> str:
    charset, quote, rest = value.partition("'")
    _lang, quote2, encoded = rest.partition("'")
    if (
        not (quote and quote2)
        or charset.lower() not in ("utf-8", "us-ascii")
        or re.search(r"%(?![0-9A-Fa-f]{2})", encoded)
    ):
        raise ApiError(400, f"a multipart part has an unreadable filename*: {value[:80]!r}")
    return unquote_to_bytes(encoded).decode("latin-1")


def check_form_names(names: list[str]) -> None:
    """The text fields of a multipart body (in order): each once, no two alike under case
    folding, none a field name spelt another way (400 naming it)."""
    if len(set(names)) != len(names):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise ApiError(
                    400,
                    f"the form field {quoted(name)} appears more than once; "
                    f"backends disagree on which one counts: send it once",
                    param=name,
                )
            seen.add(name)
    if not FIELDS.issuperset(names):
        check_spelling(names, "form field")
