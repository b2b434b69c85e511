"""Speech markup in a client's text (voiceagent/text/markup.py): SSML and Cartesia's tags
are not read out; the words inside them are, a break is a pause, a sub says its alias."""

from __future__ import annotations

import time

import pytest

from voiceagent.text.markup import without_markup
from voiceagent.text.normalize import normalize


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # ElevenLabs' break tag, in any spacing: a pause where no stop makes one
        ('Hello <break time="1.5s" /> there.', "Hello, there."),
        ('Hello<break time="1s"/>there.', "Hello, there."),
        ('Wait. <break strength="strong"/>Go.', "Wait. Go."),
        ('<break time="1s"/>Hi.', "Hi."),
        # SSML around and inside the words
        ('<speak>Hi <emphasis level="strong">you</emphasis>.</speak>', "Hi you."),
        ('<speak><prosody rate="slow">Slowly</prosody> now.</speak>', "Slowly now."),
        ('Say <sub alias="World Wide Web">WWW</sub> now.', "Say World Wide Web now."),
        ("<p><s>One.</s><s>Two.</s></p>", "One.Two."),
        # Cartesia's: a tag between two words keeps them apart
        ('a<emotion value="happy"/>b and <spell>AB</spell>.', "a b and AB."),
        ('<SPEED ratio="1.2"/>Fast.', "Fast."),
    ],
)
def test_markup_is_read_as_the_words_it_marks(written, said):
    assert " ".join(without_markup(written).split()) == said


@pytest.mark.parametrize("text", ["x < 5 and y > 3", "I <3 you", "<b>bold</b>", "a <c> d"])
def test_what_is_not_speech_markup_is_left_as_written(text):
    assert without_markup(text) == text


def test_the_server_never_reads_a_tag_out_loud():
    """What was seen: '<break time="1s"/>' was read 'break time equals one s'."""
    said = normalize('Your total is $5. <break time="1s"/> <emphasis>Thank you</emphasis>!')
    assert said == "Your total is five dollars. Thank you!"


@pytest.mark.parametrize("piece", ["<sub alias='x'>", '<sub alias="', "a <break/>", "<speak"])
def test_a_turns_worth_of_unclosed_or_repeated_tags_costs_no_more_than_text(piece):
    """What was seen: 15,000 characters of unclosed `<sub alias>` tags took 32 s to read
    (the pattern backtracked over the rest of the text at every tag). A turn reaches the
    reader in segments of about 200 characters, where that cost is small; any other
    caller may pass a whole text. The bound is loose: a busy machine is slower."""
    text = piece * (20_000 // len(piece))  # a session's turn holds at most 20,000
    began = time.perf_counter()
    normalize(text)
    assert time.perf_counter() - began < 2.0
