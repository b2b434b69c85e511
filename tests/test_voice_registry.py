"""The voice registry (POST/GET/DELETE /v1/voices, docs/voices.md) against real servers on
loopback, with a real httpx client and real WebSocket sessions.

The model is a random-weight CosyVoice2 directory (random_checkpoint.py) with FAKE prompt
frontend files (tests/onnx_fakes.py): the released campplus.onnx and
speech_tokenizer_v2.onnx cannot be downloaded here, so the fakes stand in with the same
interface. The reference audio is real human speech: Asterisk's recorded prompts (8 kHz
telephone audio, Debian asterisk-core-sounds-en-wav) with their transcripts.
"""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import wave
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import soxr
import torch
from conftest import run

from voiceagent.auth import keys
from voiceagent.auth.gate import AuthConfig
from voiceagent.bench import phone_speech
from voiceagent.bench.clients import Client, TurnResult, connect
from voiceagent.model import checkpoint
from voiceagent.model.contract import Voice
from voiceagent.model.speech_model import SpeechModel
from voiceagent.model.voice_store import load_voice, read_voice_file, save_voice
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.server.voices_api import HAS_MULTIPART
from voiceagent.session.playout import PlayoutConfig
from voiceagent.text.normalize import normalize
from voiceagent.voices import registry as registry_module
from voiceagent.voices.reference import MAX_UPLOAD_BYTES

SECRET = "registry-test-secret"
PHONE = 8000
SPOKEN = "Thanks, one moment please."

needs_multipart = pytest.mark.skipif(
    not HAS_MULTIPART, reason="python-multipart is not installed: no multipart/form-data"
)

# -- audio ------------------------------------------------------------------------------


def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def encoded(pcm: np.ndarray, rate: int, fmt: str, codec: str, out_rate: int = 44100) -> bytes:
    """`pcm` re-encoded with PyAV as stereo at `out_rate` (the right channel quieter)."""
    x = soxr.resample(pcm, rate, out_rate, quality="HQ").astype(np.float32)
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=out_rate, layout="stereo")
        if codec == "vorbis":
            stream.codec_context.options = {"strict": "experimental"}  # FFmpeg's own encoder
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(np.stack([x, 0.8 * x])), format="fltp", layout="stereo"
        )
        frame.sample_rate = out_rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buf.getvalue()


def pcm_of(p: phone_speech.Prompt) -> np.ndarray:
    return p.pcm.astype(np.float32) / 32768.0


# -- servers ----------------------------------------------------------------------------


def fresh_model(clone_dir: Path) -> SpeechModel:
    return checkpoint.load(clone_dir)  # its own copy: the server adds voices to it


# No real-time pacing, and at most 2 s of speech a turn: the random model never stops early.
FAST = PlayoutConfig(lead_ms=100_000, max_segment_tokens=50)


@pytest.fixture
def voice_server(make_server, clone_dir, tmp_path) -> BackgroundServer:
    server: BackgroundServer = make_server(
        fresh_model(clone_dir), voices_dir=tmp_path / "voices", playout=FAST
    )
    return server


def create(server: BackgroundServer, key: str | None = None, **fields: Any) -> httpx.Response:
    """POST /v1/voices as JSON, the audio (bytes) in base64."""
    body = dict(fields)
    if isinstance(body.get("audio"), bytes):
        body["audio"] = base64.b64encode(body["audio"]).decode()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.http}/v1/voices", json=body, headers=headers, timeout=120)


def create_form(server: BackgroundServer, audio: bytes, filename: str, **fields: str):
    files = {"file": (filename, audio, "application/octet-stream")}
    return httpx.post(f"{server.http}/v1/voices", files=files, data=fields, timeout=120)


async def speak_with(server: BackgroundServer, voice: str, key: str | None = None):
    async with connect(server.url, key) as ws:
        c = Client(ws)
        await c.start(voice=voice)
        return await c.speak(SPOKEN)


async def start_error(server: BackgroundServer, voice: str, key: str | None = None) -> dict:
    async with connect(server.url, key) as ws:
        c = Client(ws)
        await c.send({"type": "session.start", "voice": voice})
        return await c.event()


def assert_speaks(server: BackgroundServer, voice: str, key: str | None = None) -> dict:
    """A real session turn with `voice` makes audio; returns its timings."""
    turn = run(speak_with(server, voice, key))
    assert turn.frames, [e["type"] for e in turn.events]
    timings = turn.event("turn.done")["timings"]
    assert timings["tokens"] > 0
    return dict(timings)


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return dict(body)


# -- making, listing, using -------------------------------------------------------------


@pytest.mark.parametrize(
    "via", ["json", "json-mime-base64", pytest.param("multipart", marks=needs_multipart)]
)
def test_a_voice_from_real_phone_speech_is_made_listed_and_speaks(voice_server, phone, via):
    audio = wav_bytes(pcm_of(phone), PHONE)
    if via.startswith("json"):
        # MIME base64 (`base64` on the command line, Python's encodebytes) breaks its lines
        sent = base64.encodebytes(audio).decode() if via == "json-mime-base64" else audio
        r = create(voice_server, audio=sent, name="caller", transcript=phone.text, language="en")
    else:
        r = create_form(
            voice_server, audio, "caller.wav", name="caller", transcript=phone.text or "",
            language="en",
        )  # fmt: skip
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["id"] == info["name"] == "caller" and info["owner"] == "tenant"
    assert info["transcript"] == phone.text and info["language"] == "en"
    assert info["source_sample_rate"] == PHONE
    assert abs(info["duration_s"] - phone.seconds) < 0.5  # the prompts have little silence
    assert isinstance(info["created_at"], int)
    assert any("above 4 kHz" in w for w in info["warnings"]), info["warnings"]  # 8 kHz caveat

    listed = httpx.get(f"{voice_server.http}/v1/voices").json()
    assert "caller" in listed["voices"] and {"agent", "narrator"} <= set(listed["voices"])
    entry = next(d for d in listed["data"] if d["id"] == "caller")
    assert entry == info
    shared = next(d for d in listed["data"] if d["id"] == "agent")
    assert shared["owner"] == "shared" and shared["created_at"] is None
    assert httpx.get(f"{voice_server.http}/v1/voices/caller").json() == info

    path = voice_server.voice_server.config.voices_dir / "default" / "caller.pt"  # type: ignore[operator]
    voice, text, meta = read_voice_file(path)
    assert voice.lm_prompt and text == phone.text and meta["source_sample_rate"] == PHONE
    assert len(voice.prompt_tokens) == pytest.approx(25 * info["duration_s"], abs=3)
    assert_speaks(voice_server, "caller")


@pytest.mark.parametrize(
    ("fmt", "codec", "rate"), [("mp3", "libmp3lame", 44100), ("ogg", "vorbis", 44100)]
)
def test_compressed_stereo_uploads_make_voices(voice_server, phone, fmt, codec, rate):
    audio = encoded(pcm_of(phone), PHONE, fmt, codec, rate)
    r = create(voice_server, audio=audio, name=f"from-{fmt}", transcript=phone.text)
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["source_sample_rate"] == rate and info["language"] == "auto"
    assert not any("kHz" in w for w in info["warnings"])  # 44.1 kHz: no band warning
    assert abs(info["duration_s"] - phone.seconds) < 0.5
    assert_speaks(voice_server, f"from-{fmt}")


def test_a_voice_without_transcript_speaks_without_an_lm_prompt(voice_server, phone):
    r = create(voice_server, audio=wav_bytes(pcm_of(phone), PHONE))
    assert r.status_code == 201, r.text
    info = r.json()
    assert info["transcript"] is None
    assert info["id"].startswith("voice_") and len(info["id"]) == len("voice_") + 12
    voice = voice_server.engine.model.voices[f"default/{info['id']}"]
    assert not voice.lm_prompt and voice.lm_text_ids == () and voice.lm_speech_tokens == ()
    assert voice.prompt_tokens and voice.prompt_mel is not None  # the flow keeps its prompt
    timings = assert_speaks(voice_server, info["id"])
    # the LM's prompt is the turn's text alone (+ sos, task id), not the ~80 prompt tokens
    tokenizer = voice_server.engine.model.tokenizer
    assert timings["prompt_tokens"] == len(tokenizer.encode(normalize(SPOKEN))) + 2


def test_a_name_is_taken_once_per_tenant(voice_server, phone):
    audio = wav_bytes(pcm_of(phone), PHONE)
    assert create(voice_server, audio=audio, name="dup", transcript=phone.text).status_code == 201
    assert_error(create(voice_server, audio=audio, name="dup"), 409, "voice_exists")

    async def both() -> list[httpx.Response]:  # two at once: one wins, one is told
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"audio": base64.b64encode(audio).decode(), "name": "twin"}
            url = f"{voice_server.http}/v1/voices"
            return list(await asyncio.gather(*(client.post(url, json=body) for _ in range(2))))

    statuses = sorted(r.status_code for r in run(both()))
    assert statuses == [201, 409]


def test_a_tenant_may_have_only_a_few_voices_waiting_to_be_made(voice_server, phone, monkeypatch):
    # What was seen: a tenant's creations wait their turn one after another, each holding
    # its upload and decoded audio (up to about 37 MB), and nothing bounded that queue.
    release = threading.Event()
    real = registry_module.prepare_reference

    def held(audio: bytes) -> Any:  # the first creation is slow: the rest wait behind it
        release.wait(60)
        return real(audio)

    monkeypatch.setattr(registry_module, "prepare_reference", held)
    body = {"audio": base64.b64encode(wav_bytes(pcm_of(phone), PHONE)).decode()}
    url = f"{voice_server.http}/v1/voices"

    async def burst() -> tuple[list[int], dict[str, Any]]:
        async with httpx.AsyncClient(timeout=120) as client:
            waiting = [
                asyncio.ensure_future(client.post(url, json={**body, "name": f"v{i}"}))
                for i in range(registry_module.MAX_WAITING_PER_TENANT)
            ]
            await asyncio.sleep(0.5)  # all of them in the tenant's turn
            one_more = await client.post(url, json={**body, "name": "one-more"})
            release.set()
            return [r.status_code for r in await asyncio.gather(*waiting)], one_more.json()

    statuses, refused = run(burst())
    assert statuses == [201] * registry_module.MAX_WAITING_PER_TENANT
    assert refused["code"] == "rate_limited", refused


def test_a_name_is_taken_once_across_servers_sharing_the_voices_folder(
    voice_server, phone, monkeypatch
):
    # What was seen: two servers on one shared volume (operations.md's several pods) each
    # answered 201 for the same name at once; one caller's voice was silently replaced.
    folder = voice_server.voice_server.config.voices_dir / "default"
    real = registry_module.prepare_reference

    def meanwhile(audio: bytes) -> Any:  # another server saves "taken" while this one works
        save_voice(folder, Voice("taken", (1,), (2, 3), torch.zeros(192)), "the other server's")
        return real(audio)

    monkeypatch.setattr(registry_module, "prepare_reference", meanwhile)
    audio = wav_bytes(pcm_of(phone), PHONE)
    assert_error(create(voice_server, audio=audio, name="taken"), 409, "voice_exists")
    assert read_voice_file(folder / "taken.pt")[1] == "the other server's"  # kept, not replaced
    assert [p.name for p in folder.iterdir()] == ["taken.pt"]  # no temporary file left


def test_a_shared_name_may_be_shadowed_by_the_tenant(voice_server, phone):
    audio = wav_bytes(pcm_of(phone), PHONE)
    r = create(voice_server, audio=audio, name="agent", transcript=phone.text)
    assert r.status_code == 201, r.text
    listed = httpx.get(f"{voice_server.http}/v1/voices").json()
    assert listed["voices"].count("agent") == 1
    assert next(d for d in listed["data"] if d["id"] == "agent")["owner"] == "tenant"
    assert httpx.delete(f"{voice_server.http}/v1/voices/agent").status_code == 204
    back = httpx.get(f"{voice_server.http}/v1/voices/agent").json()
    assert back["owner"] == "shared"  # the shared voice shows through again


def test_a_session_on_a_deleted_voice_that_shadowed_a_shared_one_is_told(voice_server, phone):
    """What was seen: the session's next turn spoke with the shared voice of that name
    instead, without a word; docs/voices.md says a deleted voice is `unknown_voice`."""
    r = create(voice_server, audio=wav_bytes(pcm_of(phone), PHONE), name="agent")
    assert r.status_code == 201, r.text

    async def go() -> tuple[dict, dict, TurnResult]:
        async with connect(voice_server.url) as ws:
            c = Client(ws)
            await c.start(voice="agent")
            assert (await c.speak(SPOKEN)).frames
            deleted = await asyncio.to_thread(httpx.delete, f"{voice_server.http}/v1/voices/agent")
            assert deleted.status_code == 204
            await c.send({"type": "speak", "text": SPOKEN})
            refused = await c.event()
            await c.send({"type": "session.update", "voice": "agent"})  # chosen anew
            updated = await c.event()
            return refused, updated, await c.speak(SPOKEN)

    refused, updated, shared = run(go())
    assert refused["type"] == "error" and refused["code"] == "unknown_voice", refused
    assert updated["type"] == "session.updated"
    assert shared.frames and shared.event("turn.started")["voice"] == "agent"


# -- deleting ---------------------------------------------------------------------------


def test_delete_removes_the_file_and_the_voice(voice_server, phone):
    http = voice_server.http
    r = create(voice_server, audio=wav_bytes(pcm_of(phone), PHONE), name="temp")
    assert r.status_code == 201, r.text
    assert_speaks(voice_server, "temp")  # primes and caches its flow state
    acoustic = voice_server.engine.acoustic
    assert "default/temp" in acoustic.primed_voices()
    path = voice_server.voice_server.config.voices_dir / "default" / "temp.pt"  # type: ignore[operator]
    assert path.is_file()

    assert httpx.delete(f"{http}/v1/voices/temp").status_code == 204
    assert not path.exists()
    assert "default/temp" not in voice_server.engine.model.voices
    assert "default/temp" not in acoustic.primed_voices()
    assert "temp" not in httpx.get(f"{http}/v1/voices").json()["voices"]
    assert_error(httpx.get(f"{http}/v1/voices/temp"), 404, "unknown_voice")
    assert_error(httpx.delete(f"{http}/v1/voices/temp"), 404, "unknown_voice")
    assert run(start_error(voice_server, "temp"))["code"] == "unknown_voice"
    # the name is free again
    again = create(voice_server, audio=wav_bytes(pcm_of(phone), PHONE), name="temp")
    assert again.status_code == 201, again.text


def test_a_voice_file_the_model_cannot_load_can_be_deleted_and_its_name_reused(
    make_server, clone_dir, tmp_path, phone
):
    """What was seen: a tenant's voice file the server could not load (corrupt, or made for
    another model before a model swap) made its name 409 on POST and 404 on GET and
    DELETE: the tenant could neither see, use, delete nor make that voice again."""
    voices = tmp_path / "voices"
    (voices / "default").mkdir(parents=True)
    stale = voices / "default" / "anna.pt"
    stale.write_bytes(b"not a voice file")
    server = make_server(fresh_model(clone_dir), voices_dir=voices, playout=FAST)
    http, audio = server.http, wav_bytes(pcm_of(phone), PHONE)
    taken = assert_error(create(server, audio=audio, name="anna"), 409, "voice_exists")
    assert "cannot be loaded" in taken["message"]
    assert httpx.delete(f"{http}/v1/voices/anna").status_code == 204
    assert not stale.exists()
    assert create(server, audio=audio, name="anna", transcript=phone.text).status_code == 201
    assert_speaks(server, "anna")


def test_a_voice_file_removed_by_hand_is_forgotten_with_its_cached_state(
    make_server, clone_dir, tmp_path, phone
):
    server = make_server(
        fresh_model(clone_dir), voices_dir=tmp_path / "voices", voices_rescan_s=0.1, playout=FAST
    )
    r = create(server, audio=wav_bytes(pcm_of(phone), PHONE), name="temp")
    assert r.status_code == 201, r.text
    assert_speaks(server, "temp")  # primes and caches its flow state
    acoustic = server.engine.acoustic
    assert "default/temp" in acoustic.primed_voices()
    (tmp_path / "voices" / "default" / "temp.pt").unlink()  # an operator's rm

    async def forgotten() -> None:
        for _ in range(100):
            if "default/temp" not in acoustic.primed_voices():
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the removed voice's flow state is still cached")

    run(forgotten())
    assert "default/temp" not in server.engine.model.voices


def test_listing_reads_the_voice_files_off_the_event_loop(voice_server, phone, monkeypatch):
    """What was seen: the first listing of 1,500 voices after a restart read every file on
    the event loop; /healthz took 2.2 s meanwhile, and so did every session's audio."""
    for name in ("one", "two"):
        r = create(voice_server, audio=wav_bytes(pcm_of(phone), PHONE), name=name)
        assert r.status_code == 201, r.text
    readers: list[str] = []
    real = registry_module.read_voice_file

    def reading(path):
        readers.append(threading.current_thread().name)
        return real(path)

    monkeypatch.setattr(registry_module, "read_voice_file", reading)
    registry = voice_server.voice_server.registry
    registry._meta.clear()  # as after a restart: nothing read yet
    listed = httpx.get(f"{voice_server.http}/v1/voices").json()
    assert {"one", "two"} <= set(listed["voices"])
    assert len(readers) >= 2 and voice_server._thread.name not in readers, readers


def test_a_voices_folder_that_cannot_be_written_is_a_coded_error(
    make_server, clone_dir, tmp_path, phone, caplog
):
    # what was seen: HTTP 500 internal_error (the folder on a read-only volume)
    (tmp_path / "a-file").write_text("")
    server = make_server(fresh_model(clone_dir), voices_dir=tmp_path / "a-file" / "voices")
    r = create(server, audio=wav_bytes(pcm_of(phone), PHONE), name="anna")
    assert_error(r, 507, "voice_storage_failed")
    assert any("not saved" in rec.getMessage() for rec in caplog.records)
    assert "anna" not in httpx.get(f"{server.http}/v1/voices").json()["voices"]


def test_shared_voices_cannot_be_deleted(voice_server):
    r = httpx.delete(f"{voice_server.http}/v1/voices/agent")
    assert_error(r, 403, "forbidden")
    assert "agent" in httpx.get(f"{voice_server.http}/v1/voices").json()["voices"]
    assert_error(httpx.delete(f"{voice_server.http}/v1/voices/nobody"), 404, "unknown_voice")


# -- refusals ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def refusing_server(clone_dir, tmp_path_factory) -> Iterator[BackgroundServer]:
    """One server for every refusal: it must go on serving after each."""
    config = ServerConfig(
        port=free_port(), voices_dir=tmp_path_factory.mktemp("voices"), playout=FAST
    )
    with BackgroundServer(fresh_model(clone_dir), config) as server:
        yield server


def _speech_of(seconds: float) -> np.ndarray:
    """Real speech of about `seconds`, prompts joined end to end."""
    parts, total = [], 0
    for p in phone_speech.prompts():
        if p.is_speech:
            parts.append(pcm_of(p))
            total += len(p.pcm)
            if total >= seconds * PHONE:
                break
    return np.concatenate(parts)[: int(seconds * PHONE)]


def _tone(seconds: float, amplitude: float, rate: int = 16000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return np.clip(amplitude * np.sin(2 * np.pi * 440 * t), -1.0, 1.0)


REFUSALS: dict[str, tuple[Callable[[phone_speech.Prompt], bytes], int, str]] = {
    "too short (0.4 s of speech)": (
        lambda p: wav_bytes(pcm_of(p)[: int(0.4 * PHONE)], PHONE),
        422,
        "audio_too_short",
    ),
    "too long (35 s of speech)": (
        lambda p: wav_bytes(_speech_of(35), PHONE),
        422,
        "audio_too_long",
    ),
    "a tone at full scale": (lambda p: wav_bytes(_tone(2, 1.0), 16000), 422, "audio_clipped"),
    "hard-clipped speech": (
        lambda p: wav_bytes(np.clip(8 * pcm_of(p), -1, 1), PHONE),
        422,
        "audio_clipped",
    ),
    "2 s of zeros": (lambda p: wav_bytes(np.zeros(2 * PHONE), PHONE), 422, "audio_silent"),
    "2 s of -70 dBFS noise": (
        lambda p: wav_bytes(
            np.random.default_rng(0).standard_normal(2 * 16000) * 10 ** (-70 / 20), 16000
        ),
        422,
        "audio_silent",
    ),
    "random bytes": (
        lambda p: np.random.default_rng(1).bytes(40_000),
        422,
        "audio_unreadable",
    ),
    "a text file": (lambda p: b"Hello, this is not audio.\n" * 200, 422, "audio_unreadable"),
    "a WAV header and no samples": (
        lambda p: wav_bytes(np.zeros(0), PHONE),
        422,
        "audio_unreadable",
    ),
    "over 10 MiB": (lambda p: bytes(MAX_UPLOAD_BYTES + 1), 413, "audio_too_large"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_reference_audio_is_refused_with_its_code(refusing_server, phone, case):
    make, status, code = REFUSALS[case]
    body = assert_error(create(refusing_server, audio=make(phone), transcript="x"), status, code)
    assert any(ch.isdigit() for ch in body["message"]), body  # says how far off it is
    if code == "audio_too_short":
        assert "3-10 s" in body["message"]
    assert httpx.get(f"{refusing_server.http}/healthz").status_code == 200
    voices_dir = refusing_server.voice_server.config.voices_dir
    assert voices_dir is not None and not list(voices_dir.rglob("*.pt"))  # nothing saved


@needs_multipart
def test_a_too_large_multipart_upload_is_refused(refusing_server):
    r = create_form(refusing_server, bytes(MAX_UPLOAD_BYTES + 1), "big.wav")
    assert_error(r, 413, "audio_too_large")


def test_a_body_without_length_is_cut_off_at_the_cap(refusing_server):
    def chunks() -> Iterator[bytes]:  # chunked transfer: the server cannot know ahead
        yield b'{"audio": "'
        for _ in range(16):
            yield b"A" * (1024 * 1024)
        yield b'"}'

    r = httpx.post(
        f"{refusing_server.http}/v1/voices",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=60,
    )
    assert_error(r, 413, "audio_too_large")


JSON = {"Content-Type": "application/json"}
WAV = {"Content-Type": "audio/wav"}


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"content": b"{not json", "headers": JSON}, 400, "invalid_json"),
        ({"json": [1, 2]}, 400, "invalid_message"),
        ({"json": {"name": "x"}}, 400, "invalid_message"),
        ({"json": {"audio": "***"}}, 400, "invalid_parameter"),
        ({"json": {"audio": "AAAA", "name": "../etc"}}, 400, "invalid_parameter"),
        ({"json": {"audio": "AAAA", "name": 5}}, 400, "invalid_parameter"),
        ({"json": {"audio": "AAAA", "language": "klingon"}}, 400, "invalid_parameter"),
        ({"json": {"audio": "AAAA", "transcript": "x" * 1001}}, 400, "invalid_parameter"),
        ({"content": b"RIFF", "headers": WAV}, 415, "unsupported_media_type"),
        # what was seen: 201 with a random id, no transcript and language auto
        ({"json": {"audio": "AAAA", "voice_name": "x", "text": "hi"}}, 400, "invalid_parameter"),
        ({"json": {"audio": "AAAA", "name": ""}}, 400, "invalid_parameter"),
    ],
)  # fmt: skip
def test_malformed_requests_are_refused(refusing_server, kwargs, status, code):
    r = httpx.post(f"{refusing_server.http}/v1/voices", timeout=30, **kwargs)
    assert_error(r, status, code)


def multipart(*parts: tuple[str, str | None, bytes]) -> bytes:
    """A multipart/form-data body with boundary B: (name, filename or None, content)."""
    out = b""
    for name, filename, content in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--B\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + content + b"\r\n"
    return out + b"--B--\r\n"


BOUNDARY = "multipart/form-data; boundary=B"


@needs_multipart
@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (multipart(("file", "a.wav", b"RIFF")), "multipart/form-data"),  # no boundary
        (multipart(("file", "a.wav", b"RIFF"), ("file", "b.wav", b"RIFF")), BOUNDARY),
        (multipart(("file", "a.wav", b"RIFF"), ("transcript", None, b"x" * 70000)), BOUNDARY),
    ],
    ids=["no-boundary", "two-files", "huge-field"],
)  # fmt: skip
def test_malformed_multipart_bodies_are_refused(refusing_server, body, content_type):
    # what was seen: 500 internal_error, and a traceback in the log
    r = httpx.post(
        f"{refusing_server.http}/v1/voices", content=body, headers={"Content-Type": content_type}
    )
    assert_error(r, 400, "invalid_message")


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/voices/acme%2Fanna", 404, "not_found"),
        ("GET", "/v1/nothing-here", 404, "not_found"),
        ("PUT", "/v1/voices/anna", 405, "method_not_allowed"),
        ("DELETE", "/v1/voices", 405, "method_not_allowed"),
    ],
)
def test_paths_and_methods_the_server_lacks_get_coded_errors(
    refusing_server, method, path, status, code
):
    # what was seen: Starlette's plain-text 'Not Found' and 'Method Not Allowed'
    r = httpx.request(method, refusing_server.http + path)
    assert_error(r, status, code)
    if status == 405:
        assert "GET" in r.headers["allow"]


def test_the_server_serves_on_after_refusals(refusing_server, phone):
    """Runs after the refusals above, on the same server."""
    r = create(refusing_server, audio=wav_bytes(pcm_of(phone), PHONE), name="after")
    assert r.status_code == 201, r.text
    assert_speaks(refusing_server, "after")
    assert_speaks(refusing_server, "agent")


def test_a_model_without_a_frontend_cannot_clone(make_server, tiny_dir, tmp_path, phone):
    server = make_server(checkpoint.load(tiny_dir), voices_dir=tmp_path / "voices")
    body = assert_error(
        create(server, audio=wav_bytes(pcm_of(phone), PHONE)), 501, "voice_cloning_unsupported"
    )
    assert "campplus.onnx" in body["message"] and "speech_tokenizer_v2.onnx" in body["message"]
    assert httpx.get(f"{server.http}/v1/voices").json()["voices"]  # listing still works


# -- tenants ----------------------------------------------------------------------------


def make_site(
    make_server, clone_dir, tmp_path, quotas: str = ""
) -> tuple[BackgroundServer, str, str]:
    """Auth on: API keys of tenants acme and globex (`quotas`: the keys file's tables)."""
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(quotas)
    acme, _ = keys.add_key(keys_file, "acme")
    globex, _ = keys.add_key(keys_file, "globex")
    auth = AuthConfig("on", keys_file, SECRET, token_ttl_s=600)  # type: ignore[arg-type]
    server = make_server(
        fresh_model(clone_dir), voices_dir=tmp_path / "voices", playout=FAST, auth=auth
    )
    return server, acme, globex


@pytest.fixture
def site(make_server, clone_dir, tmp_path) -> tuple[BackgroundServer, str, str]:
    return make_site(make_server, clone_dir, tmp_path)


def test_tenants_never_see_use_or_delete_each_others_voices(site, phone):
    server, acme, globex = site
    http = server.http
    audio = wav_bytes(pcm_of(phone), PHONE)

    def get(path: str, key: str) -> httpx.Response:
        return httpx.get(f"{http}{path}", headers={"Authorization": f"Bearer {key}"})

    def delete(path: str, key: str) -> httpx.Response:
        return httpx.delete(f"{http}{path}", headers={"Authorization": f"Bearer {key}"})

    assert_error(create(server, audio=audio, name="secret"), 401, "unauthorized")
    r = create(server, acme, audio=audio, name="secret", transcript=phone.text)
    assert r.status_code == 201, r.text
    assert (server.voice_server.config.voices_dir / "acme" / "secret.pt").is_file()  # type: ignore[operator]

    assert "secret" in get("/v1/voices", acme).json()["voices"]
    assert "secret" not in get("/v1/voices", globex).json()["voices"]
    assert_error(get("/v1/voices/secret", globex), 404, "unknown_voice")
    assert_error(delete("/v1/voices/secret", globex), 404, "unknown_voice")
    assert run(start_error(server, "secret", globex))["code"] == "unknown_voice"
    assert_speaks(server, "secret", acme)

    # globex may have its own "secret": a different voice, the same name
    r = create(
        server, globex, audio=encoded(pcm_of(phone), PHONE, "mp3", "libmp3lame"), name="secret"
    )
    assert r.status_code == 201, r.text
    assert get("/v1/voices/secret", globex).json()["transcript"] is None
    assert get("/v1/voices/secret", acme).json()["transcript"] == phone.text
    assert delete("/v1/voices/secret", globex).status_code == 204
    assert get("/v1/voices/secret", acme).status_code == 200  # acme's is untouched
    assert "acme/secret" in server.engine.model.voices

    # a session token (a browser's) lists and uses, but does not make or delete voices
    token = httpx.post(
        f"{http}/v1/tokens", json={"ttl_s": 60}, headers={"Authorization": f"Bearer {acme}"}
    ).json()["token"]
    assert "secret" in get("/v1/voices", token).json()["voices"]
    assert_error(create(server, token, audio=audio, name="other"), 403, "forbidden")
    assert_error(delete("/v1/voices/secret", token), 403, "forbidden")
    scoped = httpx.post(
        f"{http}/v1/tokens",
        json={"voice": "agent"},
        headers={"Authorization": f"Bearer {acme}"},
    ).json()["token"]
    assert get("/v1/voices", scoped).json()["voices"] == ["agent"]
    assert_error(get("/v1/voices/secret", scoped), 404, "unknown_voice")


# -- the LM prompt of a voice without transcript, embedded and SGLang -------------------


def test_both_lm_backends_build_the_same_prompt_for_both_kinds_of_voice(tmp_path, tiny_model):
    from dataclasses import replace

    from voiceagent.engine.embedded import EmbeddedEngine
    from voiceagent.engine.sglang.client import SGLangLM
    from voiceagent.engine.sglang.export import export_sglang, prompt_ids
    from voiceagent.model.sampling import SamplingParams

    meta = export_sglang(tiny_model, tmp_path)
    sglang = SGLangLM(tiny_model, "http://127.0.0.1:9", tmp_path)
    sent: list[list[int]] = []

    async def capture(rid, ids, *args) -> None:
        sent.append(ids)

    sglang._run = capture  # type: ignore[method-assign]
    embedded = EmbeddedEngine(tiny_model)
    zero_shot = tiny_model.voices["agent"]
    cross = replace(zero_shot, lm_prompt=False)
    text = tiny_model.tokenizer.encode("Hello there.")

    async def prompts() -> list[int]:
        lengths = []
        for voice in (zero_shot, cross):
            gen = torch.Generator().manual_seed(0)
            stream = embedded.lm.generate(text, voice, SamplingParams(), gen, 1, 10)
            lengths.append(stream.prompt_tokens)
            stream = sglang.generate(text, voice, SamplingParams(), gen, 1, 10)
            await asyncio.sleep(0)
        return lengths

    lengths = run(prompts())
    zs = list(zero_shot.prompt_text_ids) + text
    assert sent == [
        prompt_ids(meta, zs, list(zero_shot.prompt_tokens)),
        prompt_ids(meta, text, []),  # cross-lingual: neither prompt text nor prompt speech
    ]
    assert lengths == [len(sent[0]), len(sent[1])]


def test_voice_files_keep_the_lm_prompt_flag_and_older_files_load(tmp_path):
    from test_voice_store import a_voice

    from voiceagent.model.voice_store import save_voice

    cross = a_voice("cross")
    from dataclasses import replace

    save_voice(tmp_path, replace(cross, lm_prompt=False), "", {"language": "en"})
    voice, text, meta = read_voice_file(tmp_path / "cross.pt")
    assert not voice.lm_prompt and text == "" and meta == {"language": "en"}
    # a file written before the flag and the metadata existed
    old = {
        "prompt_text": "hello",
        "prompt_text_ids": torch.tensor(cross.prompt_text_ids),
        "prompt_tokens": torch.tensor(cross.prompt_tokens),
        "prompt_mel": cross.prompt_mel,
        "embedding": cross.embedding,
    }
    torch.save(old, tmp_path / "old.pt")
    assert load_voice(tmp_path / "old.pt").lm_prompt
    assert read_voice_file(tmp_path / "old.pt")[1:] == ("hello", {})


def test_a_tenant_s_voices_are_bounded_by_its_quota(make_server, clone_dir, tmp_path, phone):
    """What was seen: one key made voices without end (each a file on disk and a voice in
    memory, scanned for every tenant's catalog)."""
    quotas = "[tenants.acme]\nvoices = 2\n"
    server, acme, globex = make_site(make_server, clone_dir, tmp_path, quotas)
    audio = wav_bytes(pcm_of(phone), PHONE)

    async def burst(key: str, names: list[str]) -> dict[str, int]:
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"audio": base64.b64encode(audio).decode()}
            posts = [
                client.post(
                    f"{server.http}/v1/voices",
                    json=body | {"name": name},
                    headers={"Authorization": f"Bearer {key}"},
                )
                for name in names
            ]
            answers = await asyncio.gather(*posts)
            return {name: r.status_code for name, r in zip(names, answers, strict=True)}

    made = run(burst(acme, ["a1", "a2", "a3", "a4"]))
    assert sorted(made.values()) == [201, 201, 429, 429], made  # which two: whichever came first
    over = create(server, acme, audio=audio, name="a5")
    body = assert_error(over, 429, "quota_exceeded")
    assert "2 voices" in body["message"]
    assert sorted(run(burst(globex, ["g1", "g2", "g3"])).values()) == [201] * 3  # no quota
    kept = next(name for name, status in made.items() if status == 201)
    gone = httpx.delete(
        f"{server.http}/v1/voices/{kept}", headers={"Authorization": f"Bearer {acme}"}
    )
    assert gone.status_code == 204
    assert create(server, acme, audio=audio, name="a5").status_code == 201  # room again
