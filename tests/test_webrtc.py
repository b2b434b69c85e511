"""WebRTC sessions with real aiortc peers on loopback against the real server: signaling,
control over the data channel, the paced outbound track, inbound VAD events, bad offers,
the shared session limit and cleanup."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.exceptions import InvalidStateError
from conftest import run

from voiceagent.bench.clients import Client, MicTrack, Peer, connect, open_peer
from voiceagent.transport.guard import GuardConfig
from voiceagent.transport.webrtc import WebRtcConfig, quiet_close_race
from voiceagent.transport.webrtc_media import OutboundAudioTrack

SENTENCE = "Your order shipped this morning."
SILENT_RMS = 1e-3  # decoded Opus of digital silence is (near) zero


def health(server: Any) -> dict[str, Any]:
    return dict(httpx.get(server.http + "/health", timeout=5).json())


async def post_offer(server: Any, data_channel: bool = True) -> httpx.Response:
    """Post a real aiortc offer and return the server's reply (the answer is never
    applied: the client peer is closed at once)."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    if data_channel:
        pc.createDataChannel("control")
    pc.addTransceiver("audio", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    try:
        async with httpx.AsyncClient() as http:
            return await http.post(
                server.http + "/v1/webrtc/offer",
                json={"sdp": pc.localDescription.sdp, "type": "offer"},
                timeout=10,
            )
    finally:
        await pc.close()


async def until_no_sessions(server: Any, why: str) -> None:
    deadline = time.monotonic() + 5
    while health(server)["sessions"] != 0:
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.05)


def pts_steps(frames: list[tuple[int, float, float]]) -> set[int]:
    # RTP timestamps start at a random origin and may wrap: differences modulo 2**32
    return {(b[0] - a[0]) % 2**32 for a, b in itertools.pairwise(frames)}


def test_turn_over_data_channel_and_paced_audio_track(server):
    async def go() -> tuple[Peer, list[dict[str, Any]], float]:
        peer = await open_peer(server.http)
        try:
            peer.send({"type": "session.start", "format": {"codec": "opus"}})
            created = await peer.event(("session.created",))
            # the track carries pcm16 48 kHz to aiortc's Opus encoder, whatever was asked
            assert created["settings"]["format"]["codec"] == "pcm16"
            assert created["settings"]["format"]["sample_rate"] == 48000
            assert health(server)["sessions"] == 1
            await asyncio.sleep(0.3)  # idle: the track sends silence
            peer.send({"type": "speak", "text": SENTENCE})
            events = [await peer.event(("turn.started",))]
            events.append(await peer.event(("turn.first_audio",)))
            events.append(await peer.event(("turn.done",), timeout=60))
            done_at = time.monotonic()
            await asyncio.sleep(1.0)  # the buffered lead plays out, then silence
            peer.send({"type": "ping"})
            events.append(await peer.event(("pong",)))
            return peer, events, done_at
        finally:
            await peer.close()

    peer, events, done_at = run(go())
    assert [e["type"] for e in events] == ["turn.started", "turn.first_audio", "turn.done", "pong"]
    sent_ms = events[2]["sent_ms"]
    assert sent_ms > 500
    frames = peer.frames
    assert len(frames) > 50
    # One clock for idle, turn and idle again: every step is one 20 ms frame, no gaps.
    assert pts_steps(frames) == {960}
    loud = [i for i, f in enumerate(frames) if f[1] > SILENT_RMS]
    assert loud, "no audible frame arrived"
    assert frames[0][1] <= SILENT_RMS  # silence before the turn
    # audible frames fit in the turn's span (plus a few frames of Opus/decoder tail)
    assert len(loud) <= sent_ms // 20 + 5
    assert loud[-1] - loud[0] + 1 >= 0.5 * sent_ms / 20
    tail = [f for f in frames if f[2] > done_at + 0.6]
    assert len(tail) >= 10 and all(f[1] <= SILENT_RMS for f in tail)
    # real-time pacing: frames arrive at 50 per second, not in a burst. The slope of
    # arrival time over frame index, not the first-to-last span: a receiver stalled for a
    # moment by a busy machine reads the queued frames at once (CI saw a 3.89 s span for
    # 4.16 s of frames), which a fit over all frames barely notices; a sender that sent
    # the turn's audio as fast as it is made would pull the slope far under 20 ms.
    arrival = np.array([f[2] for f in frames])
    slope = float(np.polyfit(np.arange(len(arrival)), arrival, 1)[0])
    assert slope == pytest.approx(0.02, rel=0.2)
    # lip sync: the turn's start is placed on the track once, and every frame has a level
    turn = events[0]["turn"]
    syncs = [e for e in peer.seen if e["type"] == "audio.sync"]
    # On a busy machine the track may run dry inside the turn; each restart is synced too.
    assert syncs[0] == {"type": "audio.sync", "turn": turn, "offset_ms": 0}
    offsets = [e["offset_ms"] for e in syncs]
    assert all(e["turn"] == turn for e in syncs) and offsets == sorted(set(offsets))
    levels = [x for e in peer.seen if e["type"] == "audio.levels" for x in e["levels"]]
    assert len(levels) == sent_ms // 20 and max(levels) > 0.3


def test_peer_leaving_mid_turn_is_cleaned_up(server):
    async def go() -> None:
        peer = await open_peer(server.http)
        peer.send({"type": "session.start"})
        await peer.event(("session.created",))
        peer.send({"type": "speak", "text": SENTENCE + " " + SENTENCE})
        await peer.event(("turn.first_audio",), timeout=60)
        assert health(server)["sessions"] == 1
        await peer.close()
        deadline = time.monotonic() + 10
        while health(server)["sessions"] != 0:
            assert time.monotonic() < deadline, "session was not cleaned up"
            await asyncio.sleep(0.05)
        assert not server.voice_server.webrtc.sessions

    run(go())


def test_a_draining_server_says_why_it_ends_the_session_before_the_channel_closes(
    make_server,
):
    """A peer connection has no close code: the last message on the data channel carries
    the one a WebSocket would get (1001 on SIGTERM's drain), after the live turn's end."""
    server = make_server()

    async def go() -> None:
        peer = await open_peer(server.http)
        closed = asyncio.Event()
        peer.channel.on("close", closed.set)
        peer.send({"type": "session.start"})
        await peer.event(("session.created",))
        peer.send({"type": "speak", "text": SENTENCE})
        await peer.event(("turn.first_audio",), timeout=60)
        drained = asyncio.wrap_future(server.drain(deadline_s=60))
        await peer.event(("turn.done",), timeout=60)  # the live turn finishes
        closing = await peer.event(("session.closing",))
        assert closing == {"type": "session.closing", "code": 1001, "reason": "server draining"}
        await asyncio.wait_for(closed.wait(), 10)
        await asyncio.wait_for(drained, 10)
        await peer.close()

    run(go())


def test_inbound_speech_gives_vad_events(server, spoken):
    lead_s = 0.6
    mic = MicTrack(spoken, clip_at=int(lead_s * 50))
    speech_ms = spoken.size / 48

    async def go() -> list[dict[str, Any]]:
        peer = await open_peer(server.http, mic)
        try:
            kinds = ("speech_started", "speech_stopped")
            started = await peer.event(kinds, timeout=10)
            stopped = await peer.event(kinds, timeout=10)
            return [started, stopped]
        finally:
            await peer.close()

    started, stopped = run(go())
    assert started["type"] == "speech_started" and stopped["type"] == "speech_stopped"
    # t_ms is on the inbound timeline, which starts with the first frame the server
    # decoded: within a few frames of the mic's first frame.
    assert abs(started["t_ms"] - lead_s * 1000) <= 200, started
    assert stopped["t_ms"] - started["t_ms"] == pytest.approx(speech_ms, abs=300)


def hostile_bodies() -> list[tuple[bytes, str]]:
    good_shape = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
    return [
        (b"garbage", "invalid_json"),
        (b"[1, 2]", "invalid_json"),
        (json.dumps({"sdp": "garbage", "type": "offer"}).encode(), "invalid_sdp"),
        (json.dumps({"sdp": "", "type": "offer"}).encode(), "invalid_sdp"),
        (json.dumps({"sdp": 12, "type": "offer"}).encode(), "invalid_sdp"),
        (json.dumps({"sdp": good_shape, "type": "answer"}).encode(), "invalid_sdp"),
        (json.dumps({"sdp": good_shape, "type": "offer"}).encode(), "invalid_sdp"),
        (
            json.dumps(
                {"sdp": good_shape + "m=audio 9 UDP/TLS/RTP/SAVPF x\r\n", "type": "offer"}
            ).encode(),
            "invalid_sdp",
        ),
        (json.dumps({"sdp": "v=0\r\n" + "a=x\r\n" * 50_000, "type": "offer"}).encode(), ""),
        (b"{" * 100_000, "sdp_too_large"),
    ]


def test_bad_offers_get_400_and_the_server_keeps_serving(server):
    async def go() -> None:
        async with httpx.AsyncClient() as http:
            for body, code in hostile_bodies():
                r = await http.post(server.http + "/v1/webrtc/offer", content=body, timeout=10)
                assert r.status_code == 400, (body[:60], r.text)
                err = r.json()
                assert err["type"] == "error" and err["code"] in (
                    "invalid_json",
                    "invalid_sdp",
                    "sdp_too_large",
                )
                if code:
                    assert err["code"] == code, (body[:60], err)
            # a real offer without a data channel
            r = await post_offer(server, data_channel=False)
            assert r.status_code == 400 and r.json()["code"] == "invalid_sdp"
        assert health(server)["sessions"] == 0
        # a new WebRTC session and a WebSocket session still work
        peer = await open_peer(server.http)
        try:
            peer.send({"type": "session.start"})
            await peer.event(("session.created",))
            peer.send({"type": "bogus"})
            event = await asyncio.wait_for(peer.events.get(), 10)
            assert event["type"] == "error" and event["code"] == "unknown_type"
        finally:
            await peer.close()
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start()
            await c.send({"type": "ping"})
            assert (await c.event())["type"] == "pong"

    run(go())


def test_session_limit_is_shared_with_websocket_sessions(make_server):
    server = make_server(max_sessions=1)

    async def go() -> None:
        async with connect(server.url) as ws:
            await Client(ws).start()
            r = await post_offer(server)
            assert r.status_code == 503 and r.json()["code"] == "too_many_sessions"
        await until_no_sessions(server, "the WebSocket session was not released")
        peer = await open_peer(server.http)  # the slot is free again
        await peer.close()

    run(go())


# -- the outbound track on its own ----------------------------------------------------------


def test_a_turn_cut_while_playing_ends_on_a_fade_not_a_click():
    # What was seen: the last sample heard was -0.479, the next 0.000 (a tone's largest
    # step is 0.012): a click at every cancel and barge-in.
    async def go() -> np.ndarray:
        track = OutboundAudioTrack(max_frames=16)
        t = np.arange(960 * 8) / 48000
        tone = np.rint(0.5 * 32767 * np.sin(2 * np.pi * 90 * t)).astype("<i2")
        for k in range(8):
            await track.put(1, tone[k * 960 : (k + 1) * 960].tobytes())
        heard = [await track.recv() for _ in range(3)]
        track.drop_turn(1)
        heard += [await track.recv() for _ in range(2)]
        track.stop()
        return np.concatenate([f.to_ndarray().reshape(-1) for f in heard]) / 32767

    pcm = run(go())
    assert np.abs(pcm[3 * 960 :]).max() > 0.1  # the next frame was heard, fading
    assert np.abs(pcm[3 * 960 + 480 :]).max() == 0  # ...and gone within 10 ms
    assert np.abs(np.diff(pcm)).max() < 1.5 * (0.5 * 2 * np.pi * 90 / 48000)  # the tone's step


def test_track_paces_frames_and_never_rewinds_pts():
    async def go() -> None:
        syncs: list[tuple[int, int]] = []
        track = OutboundAudioTrack(max_frames=4, on_sync=lambda *a: syncs.append(a))
        tone = (np.full(960, 1000, np.int16)).tobytes()
        for _ in range(3):
            await track.put(1, tone)
        await track.put(2, tone[:100])  # a short frame is padded to 20 ms
        # full: a fifth frame waits for recv() to make room
        blocked = asyncio.get_running_loop().create_task(track.put(3, tone))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        t0 = time.monotonic()
        frames = [await track.recv()]
        # each turn's first frame after another's is said once the sender has sent it:
        # when it asks for the next frame
        assert syncs == []
        frames += [await track.recv() for _ in range(7)]
        elapsed = time.monotonic() - t0
        await blocked
        assert [f.pts for f in frames] == [960 * i for i in range(8)]
        assert all(f.sample_rate == 48000 and f.samples == 960 for f in frames)
        levels = [int(np.abs(f.to_ndarray()).max()) for f in frames]
        assert levels == [1000, 1000, 1000, 1000, 1000, 0, 0, 0]
        assert track.played == {1: 3, 2: 1, 3: 1}
        assert syncs == [(1, 0), (2, 0), (3, 0)]
        assert elapsed == pytest.approx(7 * 0.02, abs=0.03)  # absolute clock from frame 0
        # a cancelled turn's queued frames are dropped; pts carries on
        await track.put(4, tone)
        await track.put(5, tone)
        assert track.drop_turn(4) == 1
        nxt = await track.recv()
        assert nxt.pts == 8 * 960 and track.played[5] == 1
        await track.recv()
        assert syncs[-1] == (5, 0)
        track.stop()

    run(go())


def test_barge_in_cancels_the_playing_turn(make_server, spoken):
    server = make_server()
    mic = MicTrack(spoken, clip_at=None)

    async def go() -> tuple[Peer, dict[str, Any], dict[str, Any], float]:
        peer = await open_peer(server.http, mic)
        try:
            peer.send({"type": "session.start", "barge_in": {"mode": "cancel", "guard_ms": 300}})
            await peer.event(("session.created",))
            peer.send({"type": "speak", "text": " ".join([SENTENCE] * 4)})
            await peer.event(("turn.first_audio",), timeout=60)
            await asyncio.sleep(0.5)
            mic.play_now()  # the user talks over the bot
            onset = await peer.event(("speech_started", "turn.done"), timeout=10)
            cancelled = await peer.event(("turn.cancelled", "turn.done"), timeout=10)
            at = time.monotonic()
            # what arrives from 0.3 s on: 10 frames at least (a busy machine delivers them
            # late and in bursts, so wait for them rather than for a fixed time)
            deadline = at + 5
            while sum(f[2] > at + 0.3 for f in peer.frames) < 10 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            return peer, onset, cancelled, at
        finally:
            await peer.close()

    peer, onset, cancelled, at = run(go())
    assert onset["type"] == "speech_started"
    assert cancelled["type"] == "turn.cancelled" and cancelled["reason"] == "barge_in"
    # the bot played ~0.5 s + VAD onset delay before it was cut off
    assert 400 <= cancelled["played_ms"] <= cancelled["sent_ms"]
    assert cancelled["played_ms"] <= 1500
    # the queued lead is dropped: silence within a few frames (network + jitter buffer)
    late = [f for f in peer.frames if f[2] > at + 0.3]
    assert len(late) >= 10 and all(f[1] <= SILENT_RMS for f in late)
    assert pts_steps(peer.frames) == {960}
    # from the first voiced frame the client sent to silence in what it receives
    assert mic.onset is not None
    after = [f for f in peer.frames if f[2] > mic.onset]
    cut = next(i for i in range(len(after)) if all(f[1] <= SILENT_RMS for f in after[i : i + 10]))
    latency_ms = (after[cut][2] - mic.onset) * 1000
    # The stated bound is loose for a loaded CI machine, an aiortc client holding 80 ms of
    # jitter buffer, and speech that starts unvoiced ("Hello"); `voiceagent bench
    # --scenario webrtc` measures it (about 140 ms on an idle 2-core machine).
    assert 60 < latency_ms < 600, latency_ms
    # Without the listener's reports played_ms is the server's estimate (what its track
    # emitted), short of what the receiver got by what was in flight: a few frames on a
    # busy machine. With reports it is exact (test_played_position.py).
    assert cancelled["played_source"] == "server"
    heard = [i for i, f in enumerate(peer.frames) if f[1] > SILENT_RMS]
    heard_ms = (heard[-1] - heard[0] + 1) * 20
    # (the track fills an underrun with silence, which the span counts and the turn's
    # audio does not: allowed for, on a machine too busy to keep up)
    gaps_ms = sum(f[1] <= SILENT_RMS for f in peer.frames[heard[0] : heard[-1]]) * 20
    assert -20 <= heard_ms - cancelled["played_ms"] <= 100 + gaps_ms, (
        cancelled["played_ms"],
        heard_ms,
        gaps_ms,
    )


def test_a_connection_attempt_ended_by_its_sessions_close_is_not_an_error() -> None:
    """aiortc's own connection-attempt task, failing because the session closed its peer
    connection meanwhile (seen in the suite's SDP fuzz under load), is an INFO line; any
    other exception no task retrieved still reaches the loop's handler."""
    seen: list[dict[str, Any]] = []

    async def go() -> list[str]:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: seen.append(context))
        quiet_close_race(loop)
        quiet_close_race(loop)  # once per loop, whatever the callers
        pc = RTCPeerConnection()
        attempt = loop.create_task(pc._RTCPeerConnection__connect())  # type: ignore[attr-defined]
        other = loop.create_task(asyncio.sleep(0))
        await asyncio.gather(attempt, other)
        await pc.close()
        closed = InvalidStateError("RTCIceTransport is closed")
        for task, exc in ((attempt, closed), (other, closed), (attempt, RuntimeError("bug"))):
            loop.call_exception_handler(
                {"message": "Task exception was never retrieved", "exception": exc, "future": task}
            )
        return [str(c["exception"]) for c in seen]

    # only aiortc's attempt failing on a closed transport is let go
    assert run(go()) == ["RTCIceTransport is closed", "bug"]


def test_an_offer_never_completed_times_out(make_server):
    server = make_server(webrtc=WebRtcConfig(connect_timeout_s=0.5))

    async def go() -> None:
        r = await post_offer(server)  # no ICE, no DTLS from this side afterwards
        assert r.status_code == 200
        assert health(server)["sessions"] == 1
        await until_no_sessions(server, "unconnected session was not dropped")

    run(go())
    # operators see why (it was counted nowhere)
    metrics = httpx.get(f"{server.http}/metrics").text
    assert 'voiceagent_sessions_closed_total{reason="connect_timeout"} 1.0' in metrics


def test_a_connected_peer_that_never_opens_a_control_channel_is_dropped(make_server):
    """What was seen: a peer that connected with a pre-negotiated channel (no open message
    reaches the server) held its session slot for good: the start timeout counts from the
    channel's opening, and the connect deadline only asked for a connection."""
    server = make_server(webrtc=WebRtcConfig(connect_timeout_s=1.0))

    async def go() -> None:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        channel = pc.createDataChannel("control", negotiated=True, id=0)
        pc.addTransceiver("audio", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        try:
            async with httpx.AsyncClient() as http:
                offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
                answer = (await http.post(f"{server.http}/v1/webrtc/offer", json=offer)).json()
            await pc.setRemoteDescription(RTCSessionDescription(answer["sdp"], "answer"))
            deadline = time.monotonic() + 10
            while channel.readyState != "open":
                assert time.monotonic() < deadline, "the peer never connected"
                await asyncio.sleep(0.05)
            assert health(server)["sessions"] == 1
            await until_no_sessions(server, "a session without control was kept")
        finally:
            await pc.close()

    run(go())
    metrics = httpx.get(f"{server.http}/metrics").text
    assert 'voiceagent_sessions_closed_total{reason="connect_timeout"} 1.0' in metrics


def test_a_flooding_data_channel_is_read_at_the_rate_then_dropped(make_server):
    # What was seen: the data channel had no message rate; every message was acted on at
    # once, however fast they came.
    guard = GuardConfig(messages_per_s=50, message_burst=50, flood_close_s=30)
    server = make_server(guard=guard, webrtc=WebRtcConfig(max_inbox=64))

    async def go() -> int:
        peer = await open_peer(server.http)
        peer.send({"type": "session.start"})
        await peer.event(("session.created",))
        t0, sent = time.monotonic(), 0
        while health(server)["sessions"] and sent < 4000:  # about 500 a second
            for _ in range(10):
                peer.send({"type": "ping"})
            sent += 10
            await asyncio.sleep(0.02)
        await until_no_sessions(server, "the flooding session was not dropped")
        flooded_for = time.monotonic() - t0
        await peer.close()
        pongs = sum(e["type"] == "pong" for e in peer.seen)
        assert pongs <= 50 + 50 * flooded_for + 10, (pongs, flooded_for)
        return [e.get("code") for e in peer.seen if e["type"] == "error"].count("rate_limited")

    assert run(go()) >= 1  # warned before it was dropped
    metrics = httpx.get(f"{server.http}/metrics").text
    assert 'voiceagent_sessions_closed_total{reason="rate_limited"} 1.0' in metrics
