import httpx
from conftest import run

from voiceagent.bench.clients import Client, connect


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


def test_the_demo_page_is_served_at_the_root_when_there_is_one(make_server, tmp_path):
    page = tmp_path / "web"
    page.mkdir()
    (page / "index.html").write_text("<title>demo</title>")
    with_page, without = make_server(web_dir=page), make_server(web_dir=None)
    r = httpx.get(with_page.http + "/")
    assert r.status_code == 200 and "<title>demo</title>" in r.text
    assert httpx.get(without.http + "/").status_code == 404
    # the API routes win over the page
    assert httpx.get(with_page.http + "/health").json()["ready"] is True
