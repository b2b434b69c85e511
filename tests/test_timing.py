"""Word timing on a turn's audio timeline: exact per segment (the LM's 25 Hz token clock),
approximate within one (words share a segment by their length)."""

from __future__ import annotations

import asyncio
import itertools
import json

import numpy as np
import pytest
from conftest import run

from voiceagent.bench.clients import Client, connect
from voiceagent.engine.embedded import EmbeddedEngine
from voiceagent.model.sampling import SamplingParams
from voiceagent.pipeline.turn import FrameFormat, Turn, TurnSettings
from voiceagent.protocol import frames
from voiceagent.text.timing import SpokenSegment, word_times, words_of


def test_words_share_their_segment_by_length_in_order_without_gaps():
    words = word_times("I can help with that", 1000.0, 2000.0)
    assert [w.word for w in words] == ["I", "can", "help", "with", "that"]
    assert words[0].start_ms == 1000.0 and words[-1].end_ms == 2000.0
    for a, b in itertools.pairwise(words):
        assert a.end_ms == b.start_ms and a.start_ms < a.end_ms
    # "help" (4 letters) lasts longer than "I" (1)
    assert words[2].end_ms - words[2].start_ms > words[0].end_ms - words[0].start_ms


def test_unspaced_scripts_time_each_character():
    assert words_of("您好，世界 ok") == ["您", "好", "，", "世", "界", "ok"]


def test_a_segment_spans_its_tokens_at_40_ms_each_scaled_by_speed():
    seg = SpokenSegment.of_tokens("Hello there.", 25, 75, speed=1.0)
    assert (seg.start_ms, seg.end_ms) == (1000.0, 3000.0)
    fast = SpokenSegment.of_tokens("Hello there.", 25, 75, speed=2.0)
    assert (fast.start_ms, fast.end_ms) == (500.0, 1500.0)


@pytest.mark.parametrize("speed", [1.0, 1.5])
def test_a_turn_reports_each_segment_before_its_last_audio_and_the_spans_tile_the_audio(
    tiny_model, speed
):
    engine = EmbeddedEngine(tiny_model)
    engine.start()
    voice = next(iter(tiny_model.voices.values()))
    text = "First, a clause. Then a sentence that ends. And one more."

    async def go():
        settings = TurnSettings(voice, SamplingParams(seed=1), speed, FrameFormat(24000))
        turn = Turn("t", settings, engine)
        turn.start()
        turn.push_text(text)
        turn.end_text()
        items = []
        while (item := await turn.output.get()) is not None:
            items.append(item)
        return turn, items

    try:
        turn, items = asyncio.run(go())
    finally:
        engine.stop()
    segments = [i for i in items if isinstance(i, SpokenSegment)]
    assert " ".join(s.text for s in segments) == text
    assert segments[0].start_ms == 0
    for a, b in itertools.pairwise(segments):
        assert a.end_ms == b.start_ms  # one timeline, no gaps
    audio_ms = sum(len(i) for i in items if isinstance(i, np.ndarray)) / 24
    assert segments[-1].end_ms == pytest.approx(len(turn.tokens) * 40 / speed)
    assert abs(segments[-1].end_ms - audio_ms) <= 40  # the audio ends with the tokens
    # each segment's timing comes before the last of its audio
    assert not isinstance(items[-1], SpokenSegment)


def _spoken_stream(server, text: str) -> list:
    """Events and frames of one `speak` over a real WebSocket session, in arrival order,
    up to `turn.done` (or an error)."""

    async def go():
        async with connect(server.url) as ws:
            c = Client(ws)
            await c.start(format={"codec": "pcm16", "sample_rate": 24000})
            await c.send({"type": "speak", "text": text})
            stream = []
            while True:
                msg = await asyncio.wait_for(ws.recv(), 60)
                if isinstance(msg, bytes):
                    stream.append(frames.unpack(msg))
                    continue
                event = json.loads(msg)
                stream.append(event)
                if event["type"] in ("turn.done", "error"):
                    return stream

    return run(go())


def test_a_session_gets_each_segments_words_ahead_of_its_last_audio(server):
    """`turn.words` over a real WebSocket session: the segments tile the turn's audio,
    and each arrives before the frames at its end have been sent."""
    text = "Hello, and welcome back. Your order shipped today. It arrives on Monday."
    stream = _spoken_stream(server, text)
    words = [
        (i, e) for i, e in enumerate(stream) if isinstance(e, dict) and e["type"] == "turn.words"
    ]
    sent = [(i, f) for i, f in enumerate(stream) if not isinstance(f, dict)]
    done = stream[-1]
    assert done["type"] == "turn.done", done
    assert " ".join(e["text"] for _, e in words) == text
    assert [w["word"] for _, e in words for w in e["words"]] == text.split()
    assert words[0][1]["start_ms"] == 0
    for (_, a), (_, b) in itertools.pairwise(words):
        assert a["end_ms"] == b["start_ms"]
    assert abs(words[-1][1]["end_ms"] - done["sent_ms"]) <= 60  # + the last frame's padding
    for at, event in words:  # before the frame that plays the segment's end
        last = next(i for i, f in sent if f.pts_ms + 20 >= event["end_ms"])
        assert at < last, event


def test_captions_show_an_llms_markdown_as_the_words_it_marks(server):
    """What was seen: `turn.words` carried "**Great**" and "[the page](https://...)" as
    words while the voice said "Great" and "the page"."""
    text = "**Great** news: see [the page](https://example.com/a) for `details`."
    stream = _spoken_stream(server, text)
    assert stream[-1]["type"] == "turn.done", stream[-1]
    words = [e for e in stream if isinstance(e, dict) and e["type"] == "turn.words"]
    assert " ".join(e["text"] for e in words) == "Great news: see the page for details."
    said = [w["word"] for e in words for w in e["words"]]
    assert said == ["Great", "news:", "see", "the", "page", "for", "details."]


def test_captions_show_the_words_of_speech_markup_not_its_tags(server):
    text = (
        '<speak>Hello, <emphasis level="strong">there</emphasis>. <break time="1s"/> Bye.</speak>'
    )
    stream = _spoken_stream(server, text)
    assert stream[-1]["type"] == "turn.done", stream[-1]
    words = [e for e in stream if isinstance(e, dict) and e["type"] == "turn.words"]
    assert [w["word"] for e in words for w in e["words"]] == ["Hello,", "there.", "Bye."]


def test_a_break_tag_is_that_much_silence_between_the_words(server):
    """`<break time="1.2s"/>`: 1.2 s more audio there (a pause, not the words "break
    time"), and the captions after it count it."""
    broken = _spoken_stream(server, 'Hello there, my friend. <break time="1.2s"/> Goodbye now.')
    plain = _spoken_stream(server, "Hello there, my friend. Goodbye now.")
    for stream in (broken, plain):
        assert stream[-1]["type"] == "turn.done", stream[-1]
    words = [e for e in broken if isinstance(e, dict) and e["type"] == "turn.words"]
    assert " ".join(e["text"] for e in words) == "Hello there, my friend. Goodbye now."
    before, after = words[-2], words[-1]
    assert after["start_ms"] - before["end_ms"] >= 1200, (before, after)
    # the same tokens with the silence between: the turn is that much longer (the tiny
    # model's random vocoder makes noise of silence too; tests/test_hearing.py hears it)
    longer = broken[-1]["sent_ms"] - plain[-1]["sent_ms"]
    assert 1200 <= longer <= 1200 + 200, longer


def test_a_turn_of_markup_alone_ends_without_speech(server):
    stream = _spoken_stream(server, '<speak><break strength="none"/></speak>')
    assert stream[-1]["type"] == "turn.done", stream[-1]
    assert not [e for e in stream if isinstance(e, dict) and e["type"] == "turn.words"]
