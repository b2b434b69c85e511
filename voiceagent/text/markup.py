"""Speech markup a client may put in its text, read as the words it marks.

SSML (what ElevenLabs, Google and Azure clients write: `<speak>`, `<break/>`,
`<emphasis>`, `<prosody>`, `<say-as>`, `<sub alias="...">`, `<phoneme>`, ...) and
Cartesia's (`<break/>`, `<spell>`, `<emotion/>`, `<speed/>`, `<volume/>`). This model has
no controls for them, and would read a tag out loud, so the tags go and the words inside
stay. Two keep their sense: `<sub alias="...">` says its alias instead of the words it
wraps, and a `<break/>` is a pause. A turn cuts its text after each break
(text/segmenter.py) and adds the break's silence there (`trailing_break`, `break_ms`: at
most `MAX_BREAK_MS`); where a break is left inside text (the `whole` baseline's turns),
`without_markup` makes it a comma.
"""

from __future__ import annotations

import bisect
import re

_NAMES = (
    "speak|break|emphasis|prosody|say-as|sub|phoneme|lang|voice|mark|audio|p|s|w|paragraph"
    "|sentence|spell|emotion|speed|volume"
)
_TAG = re.compile(rf"</?(?:{_NAMES})(?:\s[^<>]*)?/?>", re.IGNORECASE)
_ALIAS = re.compile(r"""^<sub\s[^<>]*?\balias\s*=\s*(["'])([^"'<>]*)\1""", re.IGNORECASE)
_SUB_END = re.compile(r"</sub\s*>", re.IGNORECASE)
_STOPS = ".,!?;:…。，！？；："
# a whole break tag, and its length: time="1.5s" / "500ms", or a strength
BREAK_TAG = re.compile(r"<break(?:\s[^<>]*)?/?>", re.IGNORECASE)
_TRAILING_BREAK = re.compile(r"<break(?:\s[^<>]*)?/?>\s*\Z", re.IGNORECASE)
_TIME = re.compile(r"""\btime\s*=\s*["']?\s*(\d+(?:\.\d+)?)\s*(ms|s)\b""", re.IGNORECASE)
_STRENGTH = re.compile(r"""\bstrength\s*=\s*["']?([a-z-]+)""", re.IGNORECASE)
_STRENGTHS = {"none": 0, "x-weak": 100, "weak": 250, "medium": 500, "strong": 750}
_STRENGTHS["x-strong"] = 1000
MAX_BREAK_MS = 5000  # longer breaks are cut to this (a caller would think the line dropped)


def break_ms(tag: str) -> int:
    """A break tag's pause: its `time` ('1.5s', '500ms'), else its `strength` (SSML's
    names, 'none' to 'x-strong': 0 to 1,000 ms), else 500 ms; at most MAX_BREAK_MS."""
    if time := _TIME.search(tag):
        ms = float(time[1]) * (1000 if time[2].lower() == "s" else 1)
    elif strength := _STRENGTH.search(tag):
        ms = _STRENGTHS.get(strength[1].lower(), _STRENGTHS["medium"])
    else:
        ms = _STRENGTHS["medium"]
    return round(min(ms, MAX_BREAK_MS))


def trailing_break(segment: str) -> tuple[str, int]:
    """A segment as the segmenter cuts it -> (its text before a final break tag, the
    break's ms); (segment, 0) when it does not end in one."""
    if (tag := _TRAILING_BREAK.search(segment)) is None:
        return segment, 0
    return segment[: tag.start()], break_ms(tag[0])


def without_markup(text: str) -> str:
    """'Hello <break time="1s"/> there, <emphasis>now</emphasis>.' -> 'Hello, there,
    now.' A tag between two letters or digits becomes a space (it was all that kept two
    words apart); anywhere else it simply goes. One pass over the text: a client's
    20,000 characters of unclosed tags cost no more than any other text."""
    if "<" not in text:
        return text
    ends = [m.start() for m in _SUB_END.finditer(text)]  # where each </sub> starts
    said, at, skip_to = "", 0, -1
    for m in _TAG.finditer(text):
        if m.start() < skip_to:
            continue  # inside a <sub alias>: its words are replaced
        said += text[at : m.start()]
        at = m.end()
        after = text[at : at + 1]
        if BREAK_TAG.fullmatch(m[0]):
            kept = said.rstrip()
            if kept and kept[-1] not in _STOPS:  # a pause where no stop makes one
                said = kept + ("," if not after.isalnum() else ", ")
        elif (alias := _ALIAS.match(m[0])) and (end := _next(ends, at)) is not None:
            said += alias[2]
            at = skip_to = end  # the </sub> itself goes as a tag
        elif said[-1:].isalnum() and after.isalnum():
            said += " "
    return said + text[at:]


def _next(ends: list[int], at: int) -> int | None:
    """The first of the sorted `ends` at or after `at`."""
    k = bisect.bisect_left(ends, at)
    return ends[k] if k < len(ends) else None
