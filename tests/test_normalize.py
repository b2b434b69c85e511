"""Numbers and symbols become words before the LM sees them."""

import pytest

from voiceagent.text.normalize import chinese_number, english_number, english_ordinal, normalize


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (13, "thirteen"),
        (40, "forty"),
        (42, "forty-two"),
        (100, "one hundred"),
        (101, "one hundred one"),
        (1234, "one thousand two hundred thirty-four"),
        (2_000_005, "two million five"),
        (-7, "minus seven"),
    ],
)
def test_english_cardinals(n, words):
    assert english_number(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (1, "first"),
        (2, "second"),
        (3, "third"),
        (12, "twelfth"),
        (20, "twentieth"),
        (21, "twenty-first"),
        (100, "one hundredth"),
        (123, "one hundred twenty-third"),
    ],
)
def test_english_ordinals(n, words):
    assert english_ordinal(n) == words


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        (
            "Pay $1,234.50 now.",
            "Pay one thousand two hundred thirty-four dollars and fifty cents now.",
        ),
        ("It's 15% off.", "It's fifteen percent off."),
        ("Meet at 9:05 or 10:00.", "Meet at nine oh five or ten o'clock."),
        ("Pi is 3.14", "Pi is three point one four"),
        ("On the 22nd & 23rd", "On the twenty-second and twenty-third"),
        ("Gate 12", "Gate twelve"),
    ],
)
def test_english_text(text, spoken):
    assert normalize(text, "en") == spoken


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "零"),
        (10, "十"),
        (15, "十五"),
        (20, "二十"),
        (105, "一百零五"),
        (1001, "一千零一"),
        (2008, "二千零八"),
        (12345, "一万二千三百四十五"),
        (100000000, "一亿"),
    ],
)
def test_chinese_numerals(n, words):
    assert chinese_number(n) == words


def test_chinese_text_is_detected_and_spelled_out():
    assert (
        normalize("温度是36.5度，打8%折，共12人。")
        == "温度是三十六点五度，打百分之八折，共十二人。"
    )


def test_other_languages_are_left_alone():
    assert normalize("Es kostet 5 Euro.", "de") == "Es kostet 5 Euro."
