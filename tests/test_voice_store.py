"""Added voices live in a folder; a running server picks them up without a restart."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import run

from voiceagent.auth.gate import Principal
from voiceagent.auth.keys import check_tenant
from voiceagent.bench.clients import Client, connect
from voiceagent.model import checkpoint
from voiceagent.model.contract import Voice
from voiceagent.model.voice_store import check_name, load_voice, load_voices, save_voice


def a_voice(name: str, spk_dim: int = 16) -> Voice:
    gen = torch.Generator().manual_seed(7)
    return Voice(
        name=name,
        prompt_text_ids=(10, 11, 12),
        prompt_tokens=tuple(int(t) for t in torch.randint(0, 6561, (12,), generator=gen)),
        embedding=torch.randn(spk_dim, generator=gen),
        prompt_mel=torch.randn(24, 80, generator=gen),
    )


def test_a_saved_voice_loads_back_equal(tmp_path):
    voice = a_voice("alice")
    save_voice(tmp_path, voice, "hello there")
    back = load_voice(tmp_path / "alice.pt")
    assert back.prompt_text_ids == voice.prompt_text_ids
    assert back.prompt_tokens == voice.prompt_tokens
    assert torch.equal(back.embedding, voice.embedding)
    assert back.prompt_mel is not None and voice.prompt_mel is not None
    assert torch.equal(back.prompt_mel, voice.prompt_mel)


def test_broken_voice_files_are_skipped_not_fatal(tmp_path):
    save_voice(tmp_path, a_voice("good"), "x")
    (tmp_path / "bad.pt").write_bytes(b"junk")
    assert list(load_voices(tmp_path)) == ["good"]


# ("anna\n": what was seen: accepted, listed beside "anna", saved as 'anna\n.pt')
@pytest.mark.parametrize("name", ["", "../etc", "a b", "x" * 65, ".hidden", "anna\n"])
def test_voice_names_are_safe_file_names(name):
    with pytest.raises(ValueError):
        check_name(name)
    with pytest.raises(ValueError):
        check_tenant(name)  # a tenant is a folder name too


def test_a_running_server_picks_up_a_new_voice(make_server, tiny_dir, tmp_path):
    voices = tmp_path / "voices"
    # its own copy of the model: the server adds the new voice to the model it serves
    own = checkpoint.load(tiny_dir)
    server = make_server(own, voices_dir=voices, voices_rescan_s=0.1)
    wrong = a_voice("wrong-size", spk_dim=5)

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "speak", "text": "Hi.", "voice": "carol"})
            before = await c.event()
            save_voice(voices, a_voice("carol"), "carol speaking")
            save_voice(voices, wrong, "does not fit this model")
            await asyncio.sleep(0.5)
            r = await c.speak("Hi.", voice="carol")
            await c.send({"type": "speak", "text": "Hi.", "voice": "wrong-size"})
            refused = await c.event()
            return before, r, refused

    before, r, refused = run(go())
    assert before["code"] == "unknown_voice"
    assert r.event("turn.started")["voice"] == "carol" and r.frames
    assert refused["code"] == "unknown_voice"  # a voice of other dimensions is not offered


def test_tenants_catalogs_are_refilled_only_when_a_voice_or_role_changes(
    make_server, tiny_dir, tmp_path, monkeypatch
):
    # What was seen: every rescan (each 2 s) rebuilt every tenant's catalog from every
    # voice on the event loop: half a second with 1000 tenants of 10 voices each.
    voices = tmp_path / "voices"
    server = make_server(checkpoint.load(tiny_dir), voices_dir=voices, voices_rescan_s=3600)
    vs = server.voice_server
    catalogs = {t: vs.catalog_for(Principal(t, "key")) for t in ("acme", "beta", "gamma")}
    refills: list[object] = []
    real_fill = vs.catalogs._fill
    monkeypatch.setattr(vs.catalogs, "_fill", lambda c, *a: refills.append(c) or real_fill(c, *a))
    vs.rescan_voices()
    assert refills == []  # nothing changed: nothing rebuilt
    save_voice(voices / "acme", a_voice("anna"), "acme's own")
    vs.rescan_voices()
    assert len(refills) == 3
    assert "anna" in catalogs["acme"].voices and catalogs["acme"].keys == {"anna": "acme/anna"}
    assert "anna" not in catalogs["beta"].voices and catalogs["beta"].keys == {}
    vs.rescan_voices()
    assert len(refills) == 3
    (voices / "acme" / "anna.pt").unlink()
    vs.rescan_voices()
    assert len(refills) == 6 and "anna" not in catalogs["acme"].voices
