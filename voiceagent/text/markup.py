"""Speech markup a client may put in its text, read as the words it marks.

SSML (what ElevenLabs, Google and Azure clients write: `<speak>`, `<break/>`,
`<emphasis>`, `<prosody>`, `<say-as>`, `<sub alias="...">`, `<phoneme>`, ...) and
Cartesia's (`<break/>`, `<spell>`, `<emotion/>`, `<speed/>`, `<volume/>`). This model has
no controls for them, and would read a tag out loud, so the tags go and the words inside
stay. Two keep their sense: a `<break/>` becomes a comma (a short pause: its `time` is
not honored) and `<sub alias="...">` says its alias instead of the words it wraps.
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
_BREAK = re.compile(r"<break\b", re.IGNORECASE)
_STOPS = ".,!?;:…。，！？；："


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
        if _BREAK.match(m[0]):
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
