"""What every drop-in API's requests share. A role (roles.toml: a voice with defaults)
works by name in each, as in a session: its defaults fill in what a request does not
set, and a request's own settings win (what was seen: OpenAI and /v1/tts applied a
role's seed and speed, but Cartesia and ElevenLabs spoke the role's voice with their own
defaults). And a client that hangs up stops its synthesis, streaming or not."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import httpx
import pytest

TEXT = "Your order shipped this morning."
ROLE = "[roles.support]\nvoice = '{voice}'\nseed = 5\nspeed = 1.5\n"


def openai(voice: str, **given: Any) -> dict[str, Any]:
    body = {"model": "tts-1", "voice": voice, "input": TEXT, "response_format": "pcm"}
    return {"url": "/v1/audio/speech", "json": body | given}


def cartesia(voice: str, **given: Any) -> dict[str, Any]:
    fmt = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
    body = {"model_id": "sonic-3", "voice": {"mode": "id", "id": voice}, "transcript": TEXT}
    return {"url": "/tts/bytes", "json": body | {"output_format": fmt} | given}


def elevenlabs(voice: str, **given: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"text": TEXT}
    if "speed" in given:
        body["voice_settings"] = {"speed": given.pop("speed")}
    return {
        "url": f"/v1/text-to-speech/{voice}/stream",
        "params": {"output_format": "pcm_24000"},
        "json": body | given,
    }


def tts(voice: str, **given: Any) -> dict[str, Any]:
    return {"url": "/v1/tts", "json": {"voice": voice, "text": TEXT, "format": "pcm"} | given}


@pytest.mark.parametrize("api", [openai, cartesia, elevenlabs, tts], ids=lambda f: f.__name__)
def test_a_role_s_defaults_apply_and_a_request_s_own_settings_win(
    make_server, tmp_path, tiny_model, api
):
    voice = next(iter(tiny_model.voices))
    roles = tmp_path / "roles.toml"
    roles.write_text(ROLE.format(voice=voice))
    server = make_server(roles_file=roles)

    def audio(request: dict[str, Any]) -> bytes:
        url = server.http + request.pop("url")
        r = httpx.post(url, timeout=60, **request)
        assert r.status_code == 200, r.text
        return r.content

    as_the_role_says = audio(api(voice, seed=5, speed=1.5))
    assert audio(api("support")) == as_the_role_says
    assert audio(api(voice)) != as_the_role_says  # (the defaults do change the audio)
    assert audio(api("support", seed=9, speed=1.5)) == audio(api(voice, seed=9, speed=1.5))


def test_tts_without_streaming_stops_when_its_client_hangs_up(make_server, tiny_model):
    # What was seen: with `stream: false` the whole text was still made (and its slot
    # held) after the client had gone; streaming requests stop at once.
    server = make_server()
    voice = next(iter(tiny_model.voices))
    body = {"voice": voice, "text": "A long answer that takes a while. " * 30, "stream": False}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(server.http + "/v1/tts", json=body, timeout=0.5)
    admission = server.voice_server.admission
    deadline = time.monotonic() + 5
    while admission.live_turns and time.monotonic() < deadline:
        time.sleep(0.05)
    assert admission.live_turns == 0
    metrics = httpx.get(server.http + "/metrics").text
    assert 'voiceagent_turns_total{outcome="cancelled",transport="tts"} 1.0' in metrics


def test_a_draining_server_refuses_new_requests_in_each_api_s_own_error_shape(
    make_server, tiny_model
):
    """After SIGTERM a load balancer stops sending, but a request already on its way is
    told to go elsewhere (503 server_draining), not started on a server about to exit."""
    voice = next(iter(tiny_model.voices))
    server = make_server()
    server.drain(deadline_s=1.0).result(timeout=10)
    for api in (openai, cartesia, elevenlabs, tts):
        request = api(voice)
        r = httpx.post(server.http + request.pop("url"), timeout=60, **request)
        assert r.status_code == 503, (api.__name__, r.status_code, r.text)
        assert "server_draining" in r.text, (api.__name__, r.text)
        assert r.headers["retry-after"], api.__name__


@pytest.mark.parametrize("path", ["/v1/voices", "/v1/tts", "/v1/audio/speech", "/tts/bytes"])
def test_a_client_that_hangs_up_mid_body_is_no_error(make_server, caplog, path):
    """What was seen: `POST /v1/voices failed` (and /v1/tts) at ERROR with a traceback
    for a client that went away during its upload: nothing was wrong with the server."""
    server = make_server()
    host, port = server.http.removeprefix("http://").split(":")
    uvicorn_log = logging.getLogger("uvicorn.error")  # (it does not propagate to the root)
    uvicorn_log.addHandler(caplog.handler)
    with socket.create_connection((host, int(port))) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Content-Length: 100000\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"audio": "AAAA')
        time.sleep(0.3)
    time.sleep(0.5)
    uvicorn_log.removeHandler(caplog.handler)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
    assert httpx.get(server.http + "/healthz").status_code == 200
