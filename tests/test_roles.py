"""Roles: a name for a voice with its speaking defaults, usable wherever a voice is."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import run
from voiceagent.bench.clients import Client, connect
from voiceagent.model import checkpoint
from voiceagent.protocol.roles import parse_roles

ROLES = """
[roles.support]
voice = "VOICE"
language = "en"
speed = 1.25
temperature = 0.7
seed = 7

[roles.ghost]
voice = "no-such-voice"

[roles.calm]
voice = "VOICE"
temperature = 0.9
"""


def roles_file(tmp_path, voice):
    path = tmp_path / "roles.toml"
    path.write_text(ROLES.replace("VOICE", voice))
    return path


def test_a_role_is_a_voice_with_defaults():
    roles = parse_roles(ROLES.replace("VOICE", "agent"))
    support = roles["support"]
    assert support.voice == "agent"
    assert support.defaults == {
        "language": "en",
        "speed": 1.25,
        "sampling": {"temperature": 0.7, "seed": 7},
    }
    # what the client sets itself wins over the role's defaults
    merged = support.settings({"voice": "support", "speed": 1.0, "sampling": {"seed": 3}})
    assert merged == {
        "voice": "support",
        "language": "en",
        "speed": 1.0,
        "sampling": {"temperature": 0.7, "seed": 3},
    }


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[roles.a]\nlanguage = 'en'\n", "role 'a' needs a voice"),
        ("[roles.a]\nvoice = 'x'\npitch = 2\n", "unknown key(s) pitch"),
        ("[roles.a]\nvoice = 'x'\nspeed = 9.0\n", "role 'a'"),
        ("[roles.a]\nvoice = 'x'\nlanguage = 'tlh'\n", "role 'a'"),
        ("[voices.a]\nvoice = 'x'\n", "unknown table(s) voices"),
        ("[roles.a\n", "not TOML"),
    ],
)
def test_a_bad_roles_file_is_refused_naming_the_role_and_key(text, says):
    with pytest.raises(ValueError, match=None) as err:
        parse_roles(text, "roles.toml")
    assert says in str(err.value) and str(err.value).startswith("roles.toml")


def test_a_bad_sampling_beside_a_role_is_invalid_parameter_and_the_session_goes_on(
    make_server, tmp_path, tiny_model
):
    # What was seen: the role's defaults were merged into it as a mapping, so a TypeError
    # dropped the connection with no close frame.
    voice = next(iter(tiny_model.voices))
    server = make_server(roles_file=roles_file(tmp_path, voice))

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(voice="support")
            codes = []
            for bad in (None, 5, [], "x"):
                await c.send({"type": "session.update", "voice": "support", "sampling": bad})
                codes.append((await c.event())["code"])
            return codes, await c.speak("Still here.")

    codes, turn = run(go())
    assert codes == ["invalid_parameter"] * 4
    assert turn.event("turn.done") and turn.frames


def test_sessions_choose_a_role_as_a_voice_and_get_its_defaults(make_server, tmp_path, tiny_model):
    voice = next(iter(tiny_model.voices))
    server = make_server(roles_file=roles_file(tmp_path, voice))

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            created = await c.start(voice="support", speed=1.1)
            async with connect(server.url) as fresh:
                created_plain = await Client(fresh).start(voice=voice)
            turn = await c.speak("Hello there.")
            await c.send({"type": "session.update", "voice": voice})
            plain = await c.event()
            other = await c.speak("Hello there.", voice="support")
            await c.send({"type": "speak", "text": "Hi.", "voice": "ghost"})
            refused = await c.event()
            return created, created_plain, turn, plain, other, refused

    created, created_plain, turn, plain, other, refused = run(go())
    settings = created["settings"]
    assert created["roles"] == ["calm", "support"]  # ghost's voice does not exist
    assert settings["voice"] == "support" and settings["language"] == "en"
    assert settings["speed"] == 1.1  # set by the client, over the role's 1.25
    assert settings["sampling"]["temperature"] == 0.7 and settings["sampling"]["seed"] == 7
    assert turn.event("turn.started")["voice"] == "support" and turn.frames
    # choosing a plain voice afterwards keeps what the client set; the role's defaults go
    # (what was seen: a session that had been "support" kept its language, temperature
    # and seed under every voice it chose after)
    assert plain["type"] == "session.updated", plain
    assert plain["settings"]["voice"] == voice and plain["settings"]["speed"] == 1.1
    assert plain["settings"]["language"] == "auto"
    assert plain["settings"]["sampling"] == created_plain["settings"]["sampling"]
    assert other.frames and other.event("turn.done")
    assert refused["code"] == "unknown_voice"


def test_a_session_that_switches_roles_speaks_each_as_a_fresh_session_would(
    make_server, tmp_path, tiny_model
):
    voice = next(iter(tiny_model.voices))
    server = make_server(roles_file=roles_file(tmp_path, voice))

    async def settings(*updates):
        async with connect(server.url) as ws:
            c = Client(ws)
            got = (await c.start(**updates[0]))["settings"]
            for update in updates[1:]:
                await c.send({"type": "session.update", **update})
                got = (await c.event())["settings"]
            return got

    fresh = run(settings({"voice": "calm"}))
    assert fresh["sampling"]["temperature"] == 0.9
    assert run(settings({"voice": "support"}, {"voice": "calm"})) == fresh
    # what the client set itself stays through the switch
    kept = run(settings({"voice": "support", "sampling": {"seed": 3}}, {"voice": "calm"}))
    assert kept == fresh | {"sampling": fresh["sampling"] | {"seed": 3}}


def test_a_role_sounds_like_its_voice_at_its_settings(make_server, tmp_path, tiny_model):
    """Same voice, same seed and speed: a role's turn is the voice's turn, sample for
    sample (the role costs no model work of its own)."""
    voice = next(iter(tiny_model.voices))
    server = make_server(roles_file=roles_file(tmp_path, voice))

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(voice="support", format={"codec": "pcm16"})
            by_role = await c.speak("Numbers like 42 are fine.")
            sampling = {"temperature": 0.7, "seed": 7}
            update = {"voice": voice, "speed": 1.25, "sampling": sampling}
            await c.send({"type": "session.update", **update})
            await c.event()
            by_voice = await c.speak("Numbers like 42 are fine.")
            return by_role, by_voice

    by_role, by_voice = run(go())
    assert by_role.frames
    assert [f.payload for f in by_role.frames] == [f.payload for f in by_voice.frames]


def test_an_edited_roles_file_applies_without_a_restart(make_server, tmp_path, tiny_dir):
    own = checkpoint.load(tiny_dir)
    voice = next(iter(own.voices))
    path = roles_file(tmp_path, voice)
    server = make_server(own, roles_file=path, voices_rescan_s=0.1)

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            before = await c.start()
            path.write_text(f"[roles.sales]\nvoice = '{voice}'\n")
            await asyncio.sleep(0.6)
            await c.send({"type": "speak", "text": "Hi.", "voice": "sales"})
            started = await c.event()
            path.write_text("[roles.broken\n")  # a broken edit keeps the roles read before
            await asyncio.sleep(0.6)
            again = await c.speak("Hi.", voice="sales")
            return before, started, again

    before, started, again = run(go())
    assert before["roles"] == ["calm", "support"]
    assert started["type"] == "turn.started" and started["voice"] == "sales"
    assert again.frames


def test_a_roles_file_that_goes_missing_is_warned_about_once(
    make_server, tmp_path, tiny_model, caplog
):
    # what was seen: the same warning every rescan (2 s), for as long as it was missing
    path = roles_file(tmp_path, next(iter(tiny_model.voices)))
    server = make_server(roles_file=path, voices_rescan_s=0.05)
    path.unlink()
    time.sleep(1.0)
    warned = [r for r in caplog.records if "roles not (re)loaded" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert "support" in server.voice_server.catalog.roles  # the roles read before stay
