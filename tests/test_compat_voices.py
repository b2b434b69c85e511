"""A voice made from a few seconds of real speech is usable by name from every API: made
with the real `openai` SDK's `audio.voices.create`, then spoken through OpenAI's,
Cartesia's and ElevenLabs' endpoints, `/v1/tts` and a session, with the same audio from
each (same text, voice and seed). And `/v1/tts` with inline reference audio.

The model is a random-weight CosyVoice2 directory with FAKE prompt frontend files (see
test_voice_registry.py: the released ONNX files cannot be downloaded here); the speech
is real (Asterisk's recorded prompts)."""

from __future__ import annotations

import base64
import io
import struct
import tracemalloc
import wave

import av
import httpx
import numpy as np
import openai
import pytest
from cartesia import AsyncCartesia
from conftest import run
from test_voice_registry import FAST, fresh_model, pcm_of, wav_bytes

from voiceagent.auth import keys
from voiceagent.auth.gate import AuthConfig
from voiceagent.bench.clients import Client, connect

TEXT = "Your table is booked for eight."


@pytest.fixture
def server(make_server, clone_dir, tmp_path):
    return make_server(fresh_model(clone_dir), voices_dir=tmp_path / "voices", playout=FAST)


def sdk(server, key="local"):
    return openai.AsyncOpenAI(base_url=f"{server.http}/v1", api_key=key, max_retries=0)


async def make_voice(server, phone, name="caller", key="local"):
    async with sdk(server, key) as client:
        return await client.audio.voices.create(
            audio_sample=("caller.wav", wav_bytes(pcm_of(phone), 8000), "audio/wav"),
            name=name,
            consent="consent-on-file",
        )


async def openai_pcm(server, voice, key="local"):
    async with sdk(server, key) as client:
        response = await client.audio.speech.create(
            model="tts-1", voice=voice, input=TEXT, response_format="pcm"
        )
        return response.content


async def cartesia_pcm(server, voice):
    async with AsyncCartesia(api_key="local", base_url=server.http) as client:
        response = await client.tts.generate(
            model_id="sonic-3",
            output_format={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
            transcript=TEXT,
            voice={"mode": "id", "id": voice},
        )
        return await response.read()


async def session_pcm(server, voice):
    async with connect(server.url) as ws:
        c = Client(ws)
        await c.start(voice=voice, format={"codec": "pcm16", "sample_rate": 24000})
        turn = await c.speak(TEXT)
        return b"".join(f.payload for f in turn.frames)


def test_a_voice_made_with_the_openai_sdk_speaks_the_same_through_every_api(server, phone):
    made = run(make_voice(server, phone))
    assert (made.id, made.name, made.object, made.type) == (
        "caller", "caller", "audio.voice", "audio_sample",
    )  # fmt: skip
    assert "caller" in httpx.get(f"{server.http}/v1/voices").json()["voices"]

    by_openai = run(openai_pcm(server, made.id))
    by_cartesia = run(cartesia_pcm(server, made.id))
    by_elevenlabs = httpx.post(
        f"{server.http}/v1/text-to-speech/{made.id}/stream",
        params={"output_format": "pcm_24000"},
        json={"text": TEXT},
        timeout=120,
    ).content
    by_tts = httpx.post(
        f"{server.http}/v1/tts",
        json={"text": TEXT, "voice": made.id, "format": "pcm"},
        timeout=120,
    ).content
    by_session = run(session_pcm(server, made.id))
    assert len(by_openai) > 24000  # over half a second of 24 kHz 16-bit audio
    assert by_cartesia == by_openai and by_elevenlabs == by_openai and by_tts == by_openai
    # a session's frames end with the codec's padding to a whole 20 ms frame
    assert by_session[: len(by_openai)] == by_openai
    assert not any(by_session[len(by_openai) :])


def test_tts_with_inline_reference_audio_uses_a_one_off_voice(server, phone):
    reference = base64.b64encode(wav_bytes(pcm_of(phone), 8000)).decode()
    body = {"text": TEXT, "audio": reference, "transcript": phone.text, "format": "wav"}
    streamed = httpx.post(f"{server.http}/v1/tts", json=body, timeout=120)
    whole = httpx.post(f"{server.http}/v1/tts", json={**body, "stream": False}, timeout=120)
    assert streamed.status_code == 200 and streamed.headers["content-type"] == "audio/wav"
    assert whole.headers["content-length"] == str(len(whole.content))
    assert streamed.content[44:] == whole.content[44:]  # the same audio (WAV header aside)
    with av.open(io.BytesIO(whole.content)) as f:
        pcm = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)])
    assert len(pcm) > 12000
    # never kept: not listed, and its cached flow state is gone with the request
    listed = httpx.get(f"{server.http}/v1/voices").json()["voices"]
    assert not [v for v in listed if v.startswith("one-off")]
    assert not [k for k in server.engine.acoustic.primed_voices() if k.startswith("one-off")]
    form = httpx.post(  # multipart: the reference in a file part
        f"{server.http}/v1/tts",
        files={"file": ("ref.wav", wav_bytes(pcm_of(phone), 8000), "audio/wav")},
        data={"text": TEXT, "transcript": phone.text, "format": "pcm", "speed": "1.2"},
        timeout=120,
    )
    assert form.status_code == 200 and len(form.content) > 12000


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"text": TEXT}, 400, "invalid_parameter"),  # neither voice nor audio
        ({"voice": "agent"}, 400, "invalid_parameter"),  # no text
        ({"text": TEXT, "voice": "agent", "format": "ogg"}, 400, "invalid_parameter"),
        (
            {"text": TEXT, "voice": "agent", "format": "pcm", "sample_rate": 8000},
            400,
            "invalid_parameter",
        ),
        ({"text": TEXT, "voice": "agent", "speed": 9}, 400, "invalid_parameter"),
        ({"text": TEXT, "voice": "nobody"}, 400, "unknown_voice"),
        ({"text": TEXT, "audio": base64.b64encode(b"not audio").decode()}, 422, "audio_unreadable"),
        ({"text": TEXT, "voice": "agent", "audio": "AAAA"}, 400, "invalid_parameter"),
    ],
)
def test_tts_refuses_bad_requests_with_a_code(server, body, status, code):
    r = httpx.post(f"{server.http}/v1/tts", json=body, timeout=60)
    assert (r.status_code, r.json()["code"]) == (status, code), r.text
    ok = httpx.post(f"{server.http}/v1/tts", json={"text": "Hi.", "voice": "agent"}, timeout=60)
    assert ok.status_code == 200 and ok.content[:4] == b"RIFF"


def test_a_whole_file_is_not_held_in_memory_while_it_is_made(server):
    # What was seen: `stream: false` kept every encoded piece, then joined them: 1,500
    # characters made a 21.5 MiB body and 53 MiB more peak memory; 20,000 characters
    # would have cost about 600 MiB, and 128 such requests may run at once.
    text = " ".join(["Your order number is four five six, and it ships on Monday."] * 60)
    body = {"text": text, "voice": "agent", "format": "wav", "stream": False}
    tracemalloc.start()  # the server runs in this process (the client keeps no body)
    try:
        with httpx.stream("POST", f"{server.http}/v1/tts", json=body, timeout=300) as r:
            size = sum(len(piece) for piece in r.iter_bytes())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status_code == 200 and r.headers["content-length"] == str(size)
    assert size > 2 << 20, size  # enough to tell
    assert peak < size / 2, (peak, size)


def test_a_whole_file_says_its_length_in_its_header(server):
    # What was seen: with `stream: false` the WAV's RIFF and data sizes were 0xFFFFFFFF
    # ("unknown", as a stream's must be) and Python's wave read 2,147,483,647 frames;
    # the FLAC's STREAMINFO said 0 samples.
    body = {"text": TEXT, "voice": "agent", "stream": False}
    wav = httpx.post(f"{server.http}/v1/tts", json={**body, "format": "wav"}, timeout=120)
    with wave.open(io.BytesIO(wav.content)) as w:
        assert w.getnframes() == (len(wav.content) - 44) // 2 > 12000
    assert struct.unpack("<I", wav.content[4:8])[0] == len(wav.content) - 8
    flac = httpx.post(f"{server.http}/v1/tts", json={**body, "format": "flac"}, timeout=120)
    said = (flac.content[21] & 0x0F) << 32 | int.from_bytes(flac.content[22:26], "big")
    with av.open(io.BytesIO(flac.content)) as f:
        decoded = sum(fr.samples for fr in f.decode(audio=0))
    assert said == decoded > 12000


def test_openai_voice_refusals_come_in_openai_s_error_shape(server, phone):
    # What was seen: a 401 came in OpenAI's shape ({"error": {...}}), a 409 or 422 in
    # voiceagent's ({"type": "error", ...}).
    run(make_voice(server, phone, "taken"))

    def post(audio: bytes, name: str) -> httpx.Response:
        return httpx.post(
            f"{server.http}/v1/audio/voices",
            files={"audio_sample": ("a.wav", audio, "audio/wav")},
            data={"name": name, "consent": "consent-on-file"},
            timeout=60,
        )

    for r, status, code in [
        (post(wav_bytes(pcm_of(phone), 8000), "taken"), 409, "voice_exists"),
        (post(b"not audio", "other"), 422, "audio_unreadable"),
    ]:
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["code"] == code and error["message"] and error["type"], error


def test_tts_with_reference_audio_is_admitted_before_its_voice_is_made(
    make_server, clone_dir, tmp_path, phone
):
    # What was seen: a full server (or a tenant over its turns per minute) still decoded
    # the upload and made the voice first: garbage audio got 422, real audio cost a clone
    # and was refused only after it.
    full = make_server(
        fresh_model(clone_dir), voices_dir=tmp_path / "v1", playout=FAST, max_live_turns=0
    )
    for audio in (b"not audio", wav_bytes(pcm_of(phone), 8000)):
        body = {"text": TEXT, "audio": base64.b64encode(audio).decode()}
        r = httpx.post(f"{full.http}/v1/tts", json=body, timeout=60)
        assert (r.status_code, r.json()["code"]) == (503, "server_busy"), r.text
    # a reference that cannot be used gives back the live-turn slot it was admitted with
    server = make_server(fresh_model(clone_dir), voices_dir=tmp_path / "v2", playout=FAST)
    body = {"text": TEXT, "audio": base64.b64encode(b"not audio").decode()}
    r = httpx.post(f"{server.http}/v1/tts", json=body, timeout=60)
    assert (r.status_code, r.json()["code"]) == (422, "audio_unreadable")
    assert server.voice_server.admission.live_turns == 0


def test_a_tenants_voice_is_unknown_to_another_tenant_in_every_api(
    make_server,
    clone_dir,
    tmp_path,
    phone,
):
    keys_file = tmp_path / "keys.toml"
    acme, _ = keys.add_key(keys_file, "acme")
    globex, _ = keys.add_key(keys_file, "globex")
    auth = AuthConfig("on", keys_file, "secret")
    server = make_server(
        fresh_model(clone_dir), voices_dir=tmp_path / "voices", playout=FAST, auth=auth
    )
    made = run(make_voice(server, phone, "acme-voice", acme))
    assert run(openai_pcm(server, made.id, acme))
    with pytest.raises(openai.BadRequestError) as refused:
        run(openai_pcm(server, made.id, globex))
    assert refused.value.code == "unknown_voice"
    tts = httpx.post(
        f"{server.http}/v1/tts",
        json={"text": TEXT, "voice": made.id},
        headers={"xi-api-key": globex},
        timeout=60,
    )
    assert (tts.status_code, tts.json()["code"]) == (400, "unknown_voice")
