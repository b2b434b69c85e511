from conftest import Client, connect, run


def test_speak_over_websocket_returns_opus_frames(server):
    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            created = await c.start(voice="narrator")
            assert created["model"]["random_weights"] is True
            r = await c.speak("Hello there, this is a test.")
            done = r.event("turn.done")
            assert len(r.frames) > 10
            assert done["sent_ms"] == 20 * len(r.frames)

    run(go())
