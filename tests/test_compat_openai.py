"""The OpenAI speech API, spoken to with the real `openai` SDK: only the base URL, the key
and the voice change. The tiny random-weight model makes noise, but real audio in shape
and length, and the same audio for the same text and seed."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time

import av
import httpx
import numpy as np
import openai
import pytest
from conftest import run

from voiceagent.auth import keys
from voiceagent.auth.gate import AuthConfig

TEXT = "Thanks for calling. Your order ships on Monday, the third of March."
FORMATS = {  # response_format: (container, codec, sample rate, extra samples allowed)
    "mp3": ("mp3", "mp3", 24000, 2 * 1152),  # LAME's priming and padding
    "opus": ("ogg", "opus", 48000, 0),  # in 48 kHz samples; Ogg trims the lookahead
    "aac": ("aac", "aac", 24000, 2 * 1024),
    "flac": ("flac", "flac", 24000, 0),
    "wav": ("wav", "pcm_s16le", 24000, 0),
}


def client(server, key="not-needed-on-loopback"):
    return openai.AsyncOpenAI(base_url=f"{server.http}/v1", api_key=key, max_retries=0)


def a_voice(server):
    return next(iter(server.engine.model.voices))


async def speech(server, fmt, text=TEXT, **extra):
    async with (
        client(server) as sdk,
        sdk.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice=a_voice(server), input=text, response_format=fmt, **extra
        ) as response,
    ):
        chunks = [c async for c in response.iter_bytes()]
        return response, b"".join(chunks)


def decode(data):
    with av.open(io.BytesIO(data)) as f:
        stream = f.streams.audio[0]
        pcm = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(stream)])
        return f.format.name, stream.codec_context.name, stream.rate, stream.channels, pcm


def test_pcm_is_24khz_16bit_mono_as_the_sdk_player_assumes(server):
    response, data = run(speech(server, "pcm"))
    assert response.headers["content-type"] == "audio/pcm"
    assert len(data) % 2 == 0 and len(data) > 24000  # over half a second of audio
    again = run(speech(server, "pcm"))[1]
    assert again == data  # same text, same seed: same audio


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_decodes_to_the_turns_audio(server, fmt):
    pcm_bytes = run(speech(server, "pcm"))[1]
    samples = len(pcm_bytes) // 2  # the turn's audio at 24 kHz
    container, codec, rate, extra = FORMATS[fmt]
    data = run(speech(server, fmt))[1]
    name, got_codec, got_rate, channels, pcm = decode(data)
    assert container in name.split(",") and codec in got_codec  # (decoder: "mp3float")
    assert (got_rate, channels) == (rate, 1)
    expected = samples * rate // 24000
    assert expected <= len(pcm) <= expected + extra + rate // 50  # + one 20 ms frame
    if fmt in ("wav", "flac"):  # lossless: the very samples of `pcm`
        reference = np.frombuffer(pcm_bytes, "<i2")
        got = pcm if pcm.dtype == np.int16 else (pcm * 32768).astype(np.int16)
        assert np.array_equal(got[: len(reference)], reference)


def test_audio_streams_while_the_turn_is_still_synthesizing(server):
    """On the client's clock: the first bytes come long before the last, as the audio is
    made; a server that made the whole file first would send it all at once at the end."""
    long_text = " ".join([TEXT] * 6)

    async def go():
        arrivals = []
        asked = time.perf_counter()
        async with (
            client(server) as sdk,
            sdk.audio.speech.with_streaming_response.create(
                model="tts-1", voice=a_voice(server), input=long_text, response_format="mp3"
            ) as response,
        ):
            async for chunk in response.iter_bytes():
                if chunk:
                    arrivals.append(time.perf_counter())
        async with httpx.AsyncClient() as http:
            after = _gauge(
                (await http.get(f"{server.http}/metrics")).text, "voiceagent_turns_active"
            )
        return asked, arrivals, after

    asked, arrivals, after = run(go())
    assert len(arrivals) > 3
    assert arrivals[-1] - arrivals[0] > 0.5 * (arrivals[-1] - asked)
    assert after == 0  # its live-turn slot is given back


def _gauge(page: str, name: str) -> float:
    for line in page.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_sse_sends_audio_deltas_then_done(server):
    async def go():
        async with (
            client(server) as sdk,
            sdk.audio.speech.with_streaming_response.create(
                model="tts-1",
                voice=a_voice(server),
                input=TEXT,
                response_format="pcm",
                stream_format="sse",
            ) as response,
        ):
            lines = [line async for line in response.iter_lines()]
            return response.headers["content-type"], lines

    content_type, lines = run(go())
    assert content_type.startswith("text/event-stream")
    events = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data:")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1 and events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert audio == run(speech(server, "pcm"))[1]


def test_models_lists_the_served_model_and_the_names_openai_clients_send(server):
    async def go():
        async with client(server) as sdk:
            return [m.id async for m in sdk.models.list()]

    ids = run(go())
    assert server.engine.model.name in ids and {"tts-1", "gpt-4o-mini-tts"} <= set(ids)


def test_a_voice_object_and_a_role_work_like_a_voice_name(make_server, tmp_path, tiny_model):
    voice = next(iter(tiny_model.voices))
    roles = tmp_path / "roles.toml"
    roles.write_text(f"[roles.support]\nvoice = '{voice}'\nseed = 5\n")
    server = make_server(roles_file=roles)

    async def one(voice_field, **extra):
        async with client(server) as sdk:
            response = await sdk.audio.speech.create(
                model="tts-1", voice=voice_field, input="Hello.", response_format="pcm", **extra
            )
            return response.content

    by_name = run(one(voice, extra_body={"seed": 5}))
    assert run(one({"id": voice}, extra_body={"seed": 5})) == by_name
    assert run(one("support")) == by_name  # the role's seed


def test_instructions_are_accepted_and_reported_as_ignored(server):
    response, data = run(speech(server, "pcm", instructions="Speak cheerfully."))
    assert data and response.headers["x-voiceagent-ignored"] == "instructions"


def test_an_optional_field_sent_as_null_means_its_default(server):
    # What was seen: 400 invalid_parameter for "speed": null (clients that forward every
    # parameter send None for those left unset)
    optional = ("speed", "seed", "language", "instructions", "stream_format")
    body = {"model": "tts-1", "voice": a_voice(server), "input": "Hello there."}
    plain = httpx.post(f"{server.http}/v1/audio/speech", json=body | {"response_format": "pcm"})
    nulls = body | {"response_format": "pcm"} | dict.fromkeys(optional)
    r = httpx.post(f"{server.http}/v1/audio/speech", json=nulls)
    assert r.status_code == 200, r.text
    assert r.content == plain.content and "x-voiceagent-ignored" not in r.headers
    mp3 = httpx.post(f"{server.http}/v1/audio/speech", json=body | {"response_format": None})
    assert mp3.status_code == 200 and mp3.headers["content-type"] == "audio/mpeg"


@pytest.mark.parametrize(
    ("fields", "error", "code"),
    [
        ({"voice": "nobody"}, openai.BadRequestError, "unknown_voice"),
        ({"model": "dall-e-3"}, openai.NotFoundError, "unknown_model"),
        ({"input": "x" * 4097}, openai.BadRequestError, "text_too_long"),
        ({"input": "   "}, openai.BadRequestError, "invalid_parameter"),
        ({"speed": 4.0}, openai.BadRequestError, "invalid_parameter"),
        ({"response_format": "ogg"}, openai.BadRequestError, "invalid_parameter"),
        ({"extra_body": {"pitch": 2}}, openai.BadRequestError, "invalid_parameter"),
        ({"extra_body": {"seed": 2**31}}, openai.BadRequestError, "invalid_parameter"),
    ],
)
def test_bad_requests_get_openai_errors_with_stable_codes(server, fields, error, code):
    request = {"model": "tts-1", "voice": a_voice(server), "input": "Hello.", **fields}

    async def go():
        async with client(server) as sdk:
            await sdk.audio.speech.create(**request)

    with pytest.raises(error) as raised:
        run(go())
    assert raised.value.code == code
    assert run(speech(server, "pcm", text="Still serving."))[1]  # and the server serves on


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        # What was seen: a plain-text 500, which no client parses
        (b"[" * 100_000 + b"]" * 100_000, 400, "invalid_json"),
        # What was seen: 150 MiB read and parsed whole (OpenAI's input is 4,096 characters)
        (b'{"input": "' + b"a" * (2 << 20) + b'"}', 413, "message_too_large"),
    ],
    ids=["malformed", "nested-too-deep", "oversize"],
)
def test_a_bad_body_is_refused_with_a_code(server, body, status, code):
    url = f"{server.http}/v1/audio/speech"
    r = httpx.post(url, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status and r.json()["error"]["code"] == code


def test_with_auth_on_the_sdk_key_is_the_bearer_credential(make_server, tmp_path):
    keys_file = tmp_path / "keys.toml"
    key, _ = keys.add_key(keys_file, "acme")
    server = make_server(auth=AuthConfig(mode="on", keys_file=keys_file))

    async def go(k):
        async with client(server, k) as sdk:
            await sdk.audio.speech.create(
                model="tts-1", voice=a_voice(server), input="Hi.", response_format="pcm"
            )

    with pytest.raises(openai.AuthenticationError):
        run(go("wrong-key"))
    run(go(key))


def test_a_client_that_hangs_up_frees_its_turn(server):
    metrics = f"{server.http}/metrics"

    async def go():
        async with (
            client(server) as sdk,
            sdk.audio.speech.with_streaming_response.create(
                model="tts-1",
                voice=a_voice(server),
                input=" ".join([TEXT] * 8),
                response_format="pcm",
            ) as response,
        ):
            async for _ in response.iter_bytes():
                break  # hang up after the first bytes
        async with httpx.AsyncClient() as http:
            for _ in range(100):
                page = (await http.get(metrics)).text
                if _gauge(page, "voiceagent_turns_active") == 0:
                    return page
                await asyncio.sleep(0.1)
        return page

    page = run(go())
    assert _gauge(page, "voiceagent_turns_active") == 0
    assert 'voiceagent_turns_total{outcome="cancelled",transport="openai"} 1.0' in page
