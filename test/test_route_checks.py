"""The body checks of the OpenAI routes beyond chat (api/responses.py, rerank.py,
image_generation.py, multipart.py) and which backend types serve a route (route_types.py),
each on its own: a bad body is a 400 naming its field, a route no endpoint of the right type
serves is a 501, an answer's id is pinned where it was produced."""

from __future__ import annotations

import pytest

from nomyo_router.api import image_generation, multipart, rerank, responses, route_types
from nomyo_router.api.errors import ApiError
from nomyo_router.domain import Endpoint


def _refused(check, body) -> ApiError:
    with pytest.raises(ApiError) as e:
        check(body)
    assert e.value.status == 400
    return e.value


@pytest.mark.parametrize(
    ("check", "good", "bad", "param"),
    [
        (responses.check, {"input": "hi"}, {}, "input"),
        (responses.check, {"input": [{"role": "user"}]}, {"input": 3}, "input"),
        (
            responses.check,
            {"input": "hi", "instructions": "be brief"},
            {"input": "hi", "instructions": 1},
            "instructions",
        ),
        (
            responses.check,
            {"input": "hi", "max_output_tokens": 5},
            {"input": "hi", "max_output_tokens": True},
            "max_output_tokens",
        ),
        (rerank.check, {"query": "q", "documents": ["a"]}, {"documents": ["a"]}, "query"),
        (rerank.check, {"query": "q", "documents": ["a"]}, {"query": "q", "documents": []}, "documents"),
        (
            rerank.check,
            {"query": "q", "documents": ["a"], "top_n": 1},
            {"query": "q", "documents": ["a"], "top_n": 1.5},
            "top_n",
        ),
        (image_generation.check, {"prompt": "a cat"}, {"prompt": ""}, "prompt"),
        (image_generation.check, {"prompt": "a cat", "n": 2}, {"prompt": "a cat", "n": 0}, "n"),
        (image_generation.check, {"prompt": "a cat", "n": 1}, {"prompt": "a cat", "n": False}, "n"),
    ],
)
def test_a_body_is_checked_field_by_field(check, good, bad, param):
    check(good)
    assert _refused(check, bad).param == param


def _form(*fields: tuple[str, str], boundary: str = "XyZ") -> bytes:
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields]
    file = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\nRIFF....\r\n"
    )
    return ("".join(parts) + file + f"--{boundary}--\r\n").encode()


def test_a_transcription_is_read_from_its_form_fields_alone():
    ctype, model, stream = multipart.transcription(_form(("model", " whisper "), ("stream", "True")))
    assert (ctype, model, stream) == ("multipart/form-data; boundary=XyZ", "whisper", True)
    assert multipart.transcription(_form(("model", "whisper")))[2] is False
    assert _refused(multipart.transcription, _form(("stream", "false"))).param == "model"
    assert _refused(multipart.transcription, _form(("model", "w"), ("stream", "yes"))).param == "stream"
    assert _refused(multipart.transcription, b'{"model": "whisper"}').param is None  # not multipart
    assert "cut" in _refused(multipart.transcription, _form(("model", "w"))[:-12]).message


def _ep(name: str, kind: str, *models: str) -> Endpoint:
    ep = Endpoint(name=name, url=f"http://{name}", slots=1, type=kind)
    ep.set_models(list(models))
    return ep


def test_a_route_goes_only_to_the_backend_types_that_serve_it():
    eps = [_ep("o", "ollama", "llama3"), _ep("v", "openai", "llama3"), _ep("w", "openai", "other")]
    assert route_types.ONLY_ON["/v1/rerank"] == route_types.ONLY_ON["/rerank"] == "openai"
    assert route_types.others(eps, "openai", "llama3:latest", "/v1/rerank", "llama3") == ["o"]
    assert route_types.others(eps, "ollama", "llama3:latest", "/v1/messages", "llama3") == ["v"]
    with pytest.raises(ApiError) as e:
        route_types.others(eps, "ollama", "other:latest", "/v1/messages", "other")
    assert e.value.status == 501 and e.value.code == "not_implemented"
    assert "Ollama backends only" in e.value.message and "only on w" in e.value.message


class _Pins:
    def __init__(self) -> None:
        self.pins: dict[str, str] = {}

    async def set_pin(self, key: str, endpoint: str) -> None:
        self.pins[key] = endpoint


async def test_an_answer_id_is_pinned_to_the_endpoint_that_produced_it():
    store = _Pins()
    await responses.remember_response(store, b'{"id": "resp_1", "object": "response"}', "gpu1")
    stream = b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_2"}}\n\n'
    await responses.remember_response(store, stream, "gpu2")
    await responses.remember_response(store, b'{"error": "no"}', "gpu3")
    assert store.pins == {responses.response_key("resp_1"): "gpu1", responses.response_key("resp_2"): "gpu2"}
