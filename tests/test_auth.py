"""Authentication, tenants and quotas (docs/security.md), against real servers on
loopback with auth turned on: real websockets and httpx clients, a real aiortc peer."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from conftest import run
from test_voice_store import a_voice

from voiceagent import cli
from voiceagent.auth import keys, tokens
from voiceagent.auth.gate import AuthConfig, Gate, auth_enabled, exposure_warning
from voiceagent.bench.clients import Client, connect, open_peer
from voiceagent.model import checkpoint
from voiceagent.model.voice_store import save_voice
from voiceagent.server.app import ServerConfig, VoiceServer
from voiceagent.session.quota import PerMinute, Quota, TenantUsage

SECRET = "test-token-secret"
WS_ENTRIES = [
    "/v1/ws",
    "/v1/calls",
    "/v1/telephony/twilio",
    "/v1/telephony/telnyx",
    "/v1/telephony/vonage",
    "/v1/telephony/asterisk",
]


class Site:
    """A server with auth on, a keys file, and an API key for tenants acme and globex."""

    def __init__(self, server: Any, keys_file: Path, voices: Path, acme: str, globex: str):
        self.server, self.keys_file, self.voices = server, keys_file, voices
        self.acme, self.globex = acme, globex
        self.http = server.http
        self.ws = server.http.replace("http://", "ws://")

    def token(self, tenant: str = "acme", ttl_s: float = 60, voice: str | None = None) -> str:
        return tokens.mint(SECRET.encode(), tenant, ttl_s, voice)


@pytest.fixture
def make_site(make_server, tiny_dir, tmp_path):
    def make(quotas: str = "", metrics: str = "open", **overrides: Any) -> Site:
        keys_file = tmp_path / "keys.toml"
        keys_file.write_text(quotas)
        acme, _ = keys.add_key(keys_file, "acme")
        globex, _ = keys.add_key(keys_file, "globex")
        voices = tmp_path / "voices"
        save_voice(voices / "acme", a_voice("anna"), "anna speaking")
        auth = AuthConfig("on", keys_file, SECRET, token_ttl_s=600, metrics=metrics)  # type: ignore[arg-type]
        model = checkpoint.load(tiny_dir)  # its own copy: the server adds voices to it
        server = make_server(model, voices_dir=voices, voices_rescan_s=0.1, auth=auth, **overrides)
        return Site(server, keys_file, voices, acme, globex)

    return make


@pytest.fixture
def site(make_site) -> Site:
    return make_site()


def bearer(credential: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


async def handshake(url: str, credential: str | None = None) -> tuple[int, dict[str, Any]]:
    """The HTTP status of a WebSocket handshake (101: upgraded) and a refusal's body."""
    try:
        async with connect(url, credential):
            return 101, {}
    except websockets.InvalidStatus as refused:
        response = refused.response
        return response.status_code, json.loads(response.body or b"{}")


def refusal(status: int, body: dict[str, Any]) -> tuple[int, str, str]:
    return status, body.get("type", ""), body.get("code", "")


UNAUTHORIZED = (401, "error", "unauthorized")
FORBIDDEN = (403, "error", "forbidden")


# -- every entry asks for a credential ------------------------------------------------


@pytest.mark.parametrize("path", WS_ENTRIES)
def test_every_websocket_entry_refuses_a_missing_or_wrong_credential_before_the_upgrade(site, path):
    async def go():
        return [
            await handshake(site.ws + path),
            await handshake(site.ws + path, "va_00000000_" + "x" * 43),
            await handshake(site.ws + path, site.token()[:-2] + "AA"),
        ]

    for status, body in run(go()):
        assert refusal(status, body) == UNAUTHORIZED


@pytest.mark.parametrize("path", WS_ENTRIES)
def test_every_websocket_entry_accepts_a_key_or_a_token_in_the_header_or_the_url(site, path):
    async def go():
        return [
            await handshake(site.ws + path, site.acme),
            await handshake(site.ws + path, site.token()),
            await handshake(f"{site.ws}{path}?access_token={site.token()}"),
            await handshake(f"{site.ws}{path}?access_token={site.acme}"),
        ]

    assert [status for status, _ in run(go())] == [101] * 4


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/voices"), ("POST", "/v1/tokens"), ("POST", "/v1/webrtc/offer")],
)
def test_every_http_entry_refuses_a_missing_or_wrong_credential(site, method, path):
    for headers in ({}, bearer("nonsense"), bearer(site.token(ttl_s=-1))):
        r = httpx.request(method, site.http + path, headers=headers, json={})
        assert refusal(r.status_code, r.json()) == UNAUTHORIZED
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/audio/speech", lambda b: b["error"]["code"]),  # OpenAI's, as its SDK reads it
        ("/v1/models", lambda b: b["error"]["code"]),
        ("/v1/text-to-speech/v/stream", lambda b: b["detail"]["status"]),  # ElevenLabs'
        ("/tts/bytes", lambda b: b["error_code"]),  # Cartesia's
    ],
)
def test_a_drop_in_api_refuses_a_missing_credential_in_its_own_error_shape(site, path, shape):
    """What was seen: every API got voiceagent's own body, which the OpenAI SDK reads
    without its code and the ElevenLabs SDK without `detail`."""
    method = "GET" if path == "/v1/models" else "POST"
    for headers in ({}, bearer("nonsense")):
        r = httpx.request(method, site.http + path, headers=headers, json={})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert shape(r.json()) == "unauthorized"


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/v1/text-to-speech/v/multi-stream-input", lambda b: b["detail"]["status"]),
        ("/tts/websocket", lambda b: b["error_code"]),
    ],
)
def test_a_drop_in_socket_refuses_a_missing_credential_in_its_own_error_shape(site, path, shape):
    status, body = run(handshake(site.ws + path))
    assert status == 401 and shape(body) == "unauthorized"


def test_a_credential_in_the_url_never_reaches_the_log(site, caplog):
    """What was seen: uvicorn's `"WebSocket /v1/ws?api_key=va_..." [accepted]` line, at
    INFO, for every socket that sent its key or token in the URL (refused ones too)."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="uvicorn.error")  # the server set WARNING

    async def go():
        accepted = await handshake(f"{site.ws}/v1/ws?api_key={site.acme}")
        refused = await handshake(f"{site.ws}/v1/ws?access_token=va_00000000_{'x' * 43}")
        return accepted[0], refused[0]

    assert run(go()) == (101, 401)
    lines = [r.getMessage() for r in caplog.records]
    assert any('"WebSocket /v1/ws"' in line for line in lines), lines
    assert not [line for line in lines if site.acme in line or "va_00000000" in line]


def test_a_session_over_websocket_runs_with_an_api_key(site):
    async def go():
        async with connect(site.ws + "/v1/ws", site.acme) as ws:
            c = Client(ws)
            await c.start()
            return await c.speak("Hello.")

    assert run(go()).event("turn.done")


def test_a_webrtc_offer_with_a_token_gets_an_answer_and_a_session(site):
    async def go():
        peer = await open_peer(site.http, credential=site.token())
        try:
            peer.send({"type": "session.start"})
            return await peer.event(("session.created",))
        finally:
            await peer.close()

    assert run(go())["type"] == "session.created"


def test_the_probes_the_page_and_by_default_the_metrics_are_open(site):
    for path in ("/healthz", "/readyz", "/health", "/metrics", "/"):
        assert httpx.get(site.http + path).status_code == 200, path


def test_metrics_can_require_a_credential(make_site):
    site = make_site(metrics="required")
    assert refusal(*_get(site.http + "/metrics")) == UNAUTHORIZED
    assert httpx.get(site.http + "/metrics", headers=bearer(site.acme)).status_code == 200


def _get(url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    r = httpx.get(url, **kwargs)
    return r.status_code, r.json()


# -- keys and tokens ------------------------------------------------------------------


def test_a_revoked_key_stops_working_without_a_restart(site, capsys):
    listed = keys.read(site.keys_file).keys
    acme_id = next(r.id for r in listed if r.tenant == "acme")
    assert _get(site.http + "/v1/voices", headers=bearer(site.acme))[0] == 200
    assert cli.main(["key", "revoke", acme_id, "--keys-file", str(site.keys_file)]) == 0
    assert refusal(*_get(site.http + "/v1/voices", headers=bearer(site.acme))) == UNAUTHORIZED
    assert _get(site.http + "/v1/voices", headers=bearer(site.globex))[0] == 200


def test_a_key_added_on_the_command_line_works_at_once_and_is_stored_hashed(site, capsys):
    assert cli.main(["key", "add", "--tenant", "initech", "--keys-file", str(site.keys_file)]) == 0
    key = capsys.readouterr().out.strip()
    assert key not in site.keys_file.read_text()
    assert keys.digest(key) in site.keys_file.read_text()
    assert _get(site.http + "/v1/voices", headers=bearer(key))[0] == 200
    assert cli.main(["key", "list", "--keys-file", str(site.keys_file)]) == 0
    assert "initech" in capsys.readouterr().out


def test_guessing_keys_writes_a_line_a_second_with_the_address_not_one_per_guess(site, caplog):
    # What was seen: 100 wrong keys, 100 INFO lines, none naming the client.
    caplog.set_level(logging.INFO, logger="voiceagent.auth.gate")
    started = time.monotonic()
    for i in range(100):
        headers = {"Authorization": f"Bearer va_{i:08x}_{'x' * 43}"}
        assert httpx.get(f"{site.http}/v1/voices", headers=headers).status_code == 401
    elapsed = time.monotonic() - started
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(lines) <= elapsed + 2, lines
    assert all("from 127.0.0.1" in line for line in lines), lines
    if len(lines) > 1:
        assert "more refused since the last such line" in lines[-1], lines


def test_an_api_key_mints_a_token_and_a_token_cannot_mint_another(site):
    r = httpx.post(site.http + "/v1/tokens", headers=bearer(site.acme), json={"ttl_s": 30})
    minted = r.json()
    assert r.status_code == 200 and minted["tenant"] == "acme"
    assert minted["expires_at"] <= time.time() + 31
    assert _get(site.http + "/v1/voices", headers=bearer(minted["token"]))[0] == 200
    again = httpx.post(site.http + "/v1/tokens", headers=bearer(minted["token"]), json={})
    assert refusal(again.status_code, again.json()) == FORBIDDEN


def test_a_bad_token_request_gets_a_code_and_is_not_read_past_its_limit(site):
    url, key = site.http + "/v1/tokens", bearer(site.acme)
    for body, code in (
        (b"[" * 100_000 + b"]" * 100_000, "message_too_large"),  # over 4 kB: not read on
        (b"[" * 2000 + b"]" * 2000, "invalid_json"),  # too deep for the parser
    ):
        r = httpx.post(url, headers=key, content=body)
        assert (r.status_code, r.json()["code"]) == (400, code)


def test_a_token_lives_no_longer_than_the_configured_cap(site):
    r = httpx.post(site.http + "/v1/tokens", headers=bearer(site.acme), json={"ttl_s": 10**9})
    assert r.json()["expires_at"] <= time.time() + 601


def test_an_expired_or_tampered_token_is_refused(site):
    expired = site.token(ttl_s=-5)
    payload = tokens.mint(b"another secret", "acme", 60)
    forged_tenant = site.token("acme").split(".")
    forged_tenant[1] = site.token("globex").split(".")[1]
    for bad in (expired, payload, ".".join(forged_tenant)):
        status, body = _get(site.http + "/v1/voices", headers=bearer(bad))
        assert refusal(status, body) == UNAUTHORIZED, bad
    assert "expired" in _get(site.http + "/v1/voices", headers=bearer(expired))[1]["message"]


def test_the_token_command_prints_a_demo_link_the_server_accepts(site, monkeypatch, capsys):
    monkeypatch.setenv("VOICEAGENT_AUTH__TOKEN_SECRET", SECRET)
    assert cli.main(["token", "--tenant", "demo", "--url", site.http + "/"]) == 0
    link = capsys.readouterr().out.strip()
    assert link.startswith(site.http + "/?token=vt1.")
    token = link.split("token=", 1)[1]
    assert _get(site.http + "/v1/voices", headers=bearer(token))[0] == 200
    # a lifetime of 0 or less is refused (0 quietly made one of the longest life)
    for ttl in ("0", "-5"):
        assert cli.main(["token", "--tenant", "demo", "--ttl", ttl]) == 2
        assert "--ttl must be seconds > 0" in capsys.readouterr().err


# -- tenants ----------------------------------------------------------------------------


def test_tenants_see_the_shared_voices_and_only_their_own(site):
    acme = _get(site.http + "/v1/voices", headers=bearer(site.acme))[1]["voices"]
    globex = _get(site.http + "/v1/voices", headers=bearer(site.globex))[1]["voices"]
    assert "anna" in acme and "anna" not in globex
    assert set(acme) - {"anna"} == set(globex)  # the model's built-in voices are shared


def test_a_session_cannot_use_another_tenants_voice(site):
    async def go(credential: str) -> dict[str, Any]:
        async with connect(site.ws + "/v1/ws", credential) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "speak", "text": "Hi.", "voice": "anna"})
            return await c.event()

    assert run(go(site.acme))["type"] == "turn.started"
    assert run(go(site.globex))["code"] == "unknown_voice"


def test_a_voice_scoped_token_cannot_use_another_voice(site):
    voices = _get(site.http + "/v1/voices", headers=bearer(site.acme))[1]["voices"]
    other = next(v for v in voices if v != "anna")
    scoped = site.token(voice="anna")
    assert _get(site.http + "/v1/voices", headers=bearer(scoped))[1]["voices"] == ["anna"]

    async def go():
        async with connect(site.ws + "/v1/ws", scoped) as ws:
            c = Client(ws)
            started = await c.start()
            await c.send({"type": "speak", "text": "Hi.", "voice": other})
            return started, await c.event()

    started, refused = run(go())
    assert started["voices"] == ["anna"] and refused["code"] == "unknown_voice"


def test_a_bot_of_another_tenant_cannot_attach_to_a_call(site):
    call_token = "call-token-0123456789"

    async def go():
        url = f"{site.ws}/v1/telephony/asterisk?access_token={site.acme}&token={call_token}"
        async with connect(url) as carrier:
            await carrier.send(
                "MEDIA_START connection_id:c1 channel:PJSIP/1 format:ulaw optimal_frame_size:160"
            )
            async with connect(site.ws + "/v1/calls", site.globex) as bot:
                await bot.send(json.dumps({"type": "session.attach", "token": call_token}))
                return json.loads(await bot.recv())

    assert run(go())["code"] in ("forbidden", "unknown_call")


# -- quotas -----------------------------------------------------------------------------


def test_a_tenant_over_its_session_quota_is_refused_at_connect_and_others_are_not(make_site):
    site = make_site("[tenants.acme]\nsessions = 1\n")

    async def go():
        async with connect(site.ws + "/v1/ws", site.acme) as first:
            await Client(first).start()
            async with connect(site.ws + "/v1/ws", site.acme) as second:
                refused = json.loads(await second.recv())
            async with connect(site.ws + "/v1/ws", site.globex) as other:
                started = await Client(other).start()
            return refused, started

    refused, started = run(go())
    assert refused["code"] == "quota_exceeded" and started["type"] == "session.created"


def test_a_turn_over_the_turns_quota_fails_at_once_and_the_session_goes_on(make_site):
    site = make_site("[tenants.acme]\nturns_per_min = 1\n")

    async def go():
        async with connect(site.ws + "/v1/ws", site.acme) as ws:
            c = Client(ws)
            await c.start()
            first = await c.speak("One.")
            t0 = time.monotonic()
            second = await c.speak("Two.")
            waited = time.monotonic() - t0
            await c.send({"type": "session.update", "speed": 1.0})
            while (after := await c.event())["type"] != "session.updated":
                assert after["type"] != "error", after
            return first, second, waited, after

    first, second, waited, after = run(go())
    assert first.event("turn.done")
    failed = (
        second.event("turn.failed")
        if any(e["type"] == "turn.failed" for e in second.events)
        else second.event("error")
    )
    assert failed["code"] == "quota_exceeded" and waited < 1.0
    assert after["type"] == "session.updated"  # the session goes on


def test_each_flush_group_of_a_cartesia_context_is_a_turn_of_the_quota(make_site):
    # What was seen: a context's groups after its first never drew on turns_per_min, so
    # one context could speak without end past the tenant's quota.
    site = make_site("[tenants.acme]\nturns_per_min = 2\n")
    output = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
    voice = {"mode": "id", "id": "agent"}
    request = {"model_id": "sonic-3", "voice": voice, "output_format": output}
    group = {**request, "context_id": "c", "continue": True, "flush": True}

    async def go() -> dict[str, Any]:
        async with connect(site.ws + "/tts/websocket", site.acme) as ws:
            for text in ("One.", "Two.", "Three."):
                await ws.send(json.dumps({**group, "transcript": text}))
            while True:  # (the old server: flush_done after flush_done, then nothing)
                m = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if m["type"] == "error":
                    return dict(m)

    error = run(go())
    assert error["error_code"] == "quota_exceeded" and error["context_id"] == "c", error


def test_text_over_the_character_quota_is_refused_and_the_session_goes_on(make_site):
    site = make_site("[tenants.acme]\nchars_per_min = 20\n")

    async def go():
        async with connect(site.ws + "/v1/ws", site.acme) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "speak", "text": "This sentence is longer than twenty."})
            refused = await c.event()
            ok = await c.speak("Short.")
            return refused, ok

    refused, ok = run(go())
    assert refused["type"] == "error" and refused["code"] == "quota_exceeded"
    assert ok.event("turn.done")


def test_a_quota_edited_in_the_keys_file_applies_without_a_restart(make_site):
    site = make_site("[tenants.acme]\nchars_per_min = 5\n")
    text = site.keys_file.read_text().replace("chars_per_min = 5", "chars_per_min = 5000")
    site.keys_file.write_text(text)

    async def go():
        async with connect(site.ws + "/v1/ws", site.acme) as ws:
            c = Client(ws)
            await c.start()
            return await c.speak("Now this fits.")

    assert run(go()).event("turn.done")


def test_a_per_minute_quota_refills_at_its_rate():
    now = [0.0]
    bucket = PerMinute(60, lambda: now[0])
    assert bucket.take(60) and not bucket.take(1)
    now[0] += 1.0  # one second: one unit back
    assert bucket.take(1) and not bucket.take(1)


def test_a_tenant_quota_of_zero_means_no_limit():
    usage = TenantUsage("t", Quota)
    assert all(usage.admit_session() is None for _ in range(100))
    assert all(usage.take_turn() is None for _ in range(100))
    assert usage.take_chars(10**6) is None


def test_adding_and_revoking_keys_keeps_every_tenants_quota_as_written(tmp_path):
    # What was seen: a tenant's `sessions = 0` (no limit, over a default of 20) became
    # 20 after `key add`, and the defaults were copied into every tenant's table, so a
    # later edit of [quota] no longer reached them.
    path = tmp_path / "keys.toml"
    path.write_text(
        "[quota]\nsessions = 20\nturns_per_min = 600\n"
        "[tenants.acme]\nsessions = 0\n[tenants.beta]\nchars_per_min = 900\n"
    )
    _, record = keys.add_key(path, "acme")
    keys.revoke_key(path, record.id)
    keys.add_key(path, "beta")
    after = keys.read(path)
    assert after.quota("acme") == Quota(sessions=0, turns_per_min=600, chars_per_min=0)
    assert after.quota("beta") == Quota(sessions=20, turns_per_min=600, chars_per_min=900)
    edited = path.read_text().replace("turns_per_min = 600", "turns_per_min = 60", 1)
    assert keys.parse(edited).quota("beta").turns_per_min == 60  # the default reaches it


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tenants = 5\n", "tenants"),
        ("keys = 5\n", "keys"),
        ("[quotas]\nsessions = 1\n", "quotas"),  # a misspelt table: no limit, silently
        ("[tenant.acme]\nsessions = 2\n", "tenant"),
        ("[[keys]]\nid = 5\ntenant = 'a'\nsha256 = 'x'\n", "keys"),
    ],
)
def test_a_keys_file_of_the_wrong_shape_is_refused_with_words_not_a_traceback(
    tmp_path, capsys, text, says
):
    # What was seen: AttributeError and TypeError tracebacks from `serve` and every `key`
    # command, a 500 to keyed requests, and misspelt tables dropped by `key add`.
    path = tmp_path / "keys.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=says):
        keys.parse(text)
    store = keys.KeyStore(path)
    assert store.error is not None and says in store.error
    for command in (["key", "list"], ["key", "add", "--tenant", "acme"], ["key", "revoke", "x"]):
        assert cli.main([*command, "--keys-file", str(path)]) == 2, command
        assert "error:" in capsys.readouterr().err
    assert path.read_text() == text  # nothing rewritten over it


def test_a_server_with_a_missing_or_broken_keys_file_says_so_when_it_starts(tmp_path, caplog):
    # what was seen: nothing until requests were refused with "unknown or revoked API key"
    Gate(AuthConfig("on", tmp_path / "keyz.toml", "s" * 32), "0.0.0.0")  # type: ignore[arg-type]
    (tmp_path / "bad.toml").write_text("tenants = 5\n")
    Gate(AuthConfig("on", tmp_path / "bad.toml", "s" * 32), "0.0.0.0")  # type: ignore[arg-type]
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("keyz.toml does not exist" in m for m in said), said
    assert any("bad.toml" in m and "tenants" in m for m in said), said


def test_rewriting_the_keys_file_keeps_who_may_read_it(tmp_path) -> None:
    """What was seen: `key add` made the file 0600, so the server's own user (uid 10001
    in the images) could read no keys, and refused every one."""
    path = tmp_path / "keys.toml"
    path.write_text("")
    path.chmod(0o640)
    _, record = keys.add_key(path, "acme")
    assert path.stat().st_mode & 0o777 == 0o640
    keys.revoke_key(path, record.id)
    assert path.stat().st_mode & 0o777 == 0o640
    new = tmp_path / "new" / "keys.toml"
    keys.add_key(new, "acme")
    assert new.stat().st_mode & 0o777 == 0o600  # a new one: its owner's alone


# -- auth.mode ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "on"),
    [
        ("0.0.0.0", True),
        ("::", True),
        ("10.1.2.3", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("localhost", False),
    ],
)
def test_auto_mode_is_on_unless_the_server_binds_a_loopback_address(host, on):
    assert auth_enabled("auto", host) is on
    assert auth_enabled("on", host) and not auth_enabled("off", host)


def test_auth_off_on_a_public_address_logs_a_loud_warning(tiny_model, caplog):
    from voiceagent.engine.embedded import EmbeddedEngine

    assert exposure_warning(AuthConfig(mode="off"), "127.0.0.1") is None
    with caplog.at_level(logging.WARNING):
        VoiceServer(
            EmbeddedEngine(tiny_model), ServerConfig(host="0.0.0.0", auth=AuthConfig(mode="off"))
        )
    loud = [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "AUTHENTICATION IS OFF" in r.getMessage()
    ]
    assert loud and "0.0.0.0" in loud[0].getMessage()


def test_with_auth_off_everything_is_the_default_tenant_without_quotas(server):
    r = httpx.get(server.http + "/v1/voices")
    assert r.status_code == 200 and r.json()["voices"]


def test_the_server_reads_the_auth_section_of_the_config(tmp_path):
    from voiceagent import config

    file = tmp_path / "c.toml"
    file.write_text('[auth]\nmode = "on"\nkeys_file = "/etc/va/keys.toml"\ntoken_ttl_s = 90\n')
    auth = config.load(file).settings.server_config().auth
    assert (auth.mode, auth.keys_file, auth.token_ttl_s) == ("on", Path("/etc/va/keys.toml"), 90)


def test_a_browser_may_put_its_token_in_the_url_of_v1_ws(site):
    async def go():
        async with connect(f"{site.ws}/v1/ws?token={site.token()}") as ws:
            return await Client(ws).start()

    assert run(go())["type"] == "session.created"
