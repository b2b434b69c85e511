"""Spell out numbers and symbols so the LM reads words, not digits.

English: cardinals, decimals, ordinals (1st, 22nd), percentages, currency ($, €, £),
clock times (9:40) and a few symbols (&, %, +, =). Chinese: the same quantities as
Chinese numerals (一百二十三, 三点一四, 百分之五十). Text with any CJK character is
treated as Chinese unless a language is given.
"""

from __future__ import annotations

import re

# fmt: off
_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
)
_TENS = ("_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
# fmt: on
_SCALES = [(10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand")]
_ORDINAL_WORDS = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
}
_EN_SYMBOLS = {"&": " and ", "+": " plus ", "=": " equals ", "@": " at "}

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def english_number(n: int) -> str:
    if n < 0:
        return "minus " + english_number(-n)
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, rest = divmod(n, 10)
        return _TENS[tens] + ("-" + _ONES[rest] if rest else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return _ONES[hundreds] + " hundred" + (" " + english_number(rest) if rest else "")
    for value, name in _SCALES:
        if n >= value:
            head, rest = divmod(n, value)
            return english_number(head) + " " + name + (" " + english_number(rest) if rest else "")
    raise AssertionError("unreachable")


def english_ordinal(n: int) -> str:
    words = english_number(n)
    head, _, last = words.rpartition(" ")
    if "-" in last:
        pre, _, last = last.rpartition("-")
        head = f"{head} {pre}-".strip() if head else pre + "-"
    if last in _ORDINAL_WORDS:
        last = _ORDINAL_WORDS[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    if head.endswith("-"):
        return head + last
    return f"{head} {last}".strip()


def _digits_en(s: str) -> str:
    return " ".join(_ONES[int(d)] for d in s)


def _en_decimal(m: re.Match[str]) -> str:
    whole, frac = m.group(1).replace(",", ""), m.group(2)
    return f"{english_number(int(whole))} point {_digits_en(frac)}"


def _en_currency(m: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCY[m.group(1)]
    whole = int(m.group(2).replace(",", ""))
    cents = int((m.group(3) or "0").ljust(2, "0")[:2])
    words = f"{english_number(whole)} {one if whole == 1 else many}"
    if cents:
        words += f" and {english_number(cents)} {sub_one if cents == 1 else sub_many}"
    return words


def _en_time(m: re.Match[str]) -> str:
    hours, minutes = int(m.group(1)), int(m.group(2))
    if minutes == 0:
        return f"{english_number(hours)} o'clock"
    if minutes < 10:
        return f"{english_number(hours)} oh {english_number(minutes)}"
    return f"{english_number(hours)} {english_number(minutes)}"


def normalize_english(text: str) -> str:
    text = re.sub(r"([$€£])(\d[\d,]*)(?:\.(\d+))?", _en_currency, text)
    text = re.sub(r"\b(\d{1,2}):(\d{2})\b", _en_time, text)
    text = re.sub(r"(\d[\d,]*)\.(\d+)%", lambda m: _en_decimal(m) + " percent", text)
    text = re.sub(
        r"(\d[\d,]*)%",
        lambda m: english_number(int(m.group(1).replace(",", ""))) + " percent",
        text,
    )
    text = re.sub(r"\b(\d+)(st|nd|rd|th)\b", lambda m: english_ordinal(int(m.group(1))), text)
    text = re.sub(r"(\d[\d,]*)\.(\d+)", _en_decimal, text)
    text = re.sub(
        r"\d{1,3}(?:,\d{3})+|\d+",
        lambda m: english_number(int(m.group(0).replace(",", ""))),
        text,
    )
    for sym, words in _EN_SYMBOLS.items():
        text = text.replace(sym, words)
    return re.sub(r"  +", " ", text)


_ZH_DIGITS = "零一二三四五六七八九"
_ZH_UNITS = ["", "十", "百", "千"]
_ZH_BIG = [(10**8, "亿"), (10**4, "万")]


def chinese_number(n: int) -> str:
    if n < 0:
        return "负" + chinese_number(-n)
    if n == 0:
        return "零"
    for value, name in _ZH_BIG:
        if n >= value:
            head, rest = divmod(n, value)
            tail = ""
            if rest:
                tail = ("零" if rest < value // 10 else "") + chinese_number(rest)
            return chinese_number(head) + name + tail
    out, zero = "", False
    for i, d in enumerate(f"{n:04d}"):
        digit = int(d)
        unit = _ZH_UNITS[3 - i]
        if digit == 0:
            zero = bool(out)
            continue
        if zero:
            out += "零"
            zero = False
        out += _ZH_DIGITS[digit] + unit
    return out[1:] if out.startswith("一十") else out  # 十五, not 一十五


def normalize_chinese(text: str) -> str:
    text = re.sub(
        r"(\d+)\.(\d+)%",
        lambda m: (
            "百分之"
            + chinese_number(int(m.group(1)))
            + "点"
            + "".join(_ZH_DIGITS[int(d)] for d in m.group(2))
        ),
        text,
    )
    text = re.sub(r"(\d+)%", lambda m: "百分之" + chinese_number(int(m.group(1))), text)
    text = re.sub(
        r"(\d+)\.(\d+)",
        lambda m: (
            chinese_number(int(m.group(1))) + "点" + "".join(_ZH_DIGITS[int(d)] for d in m.group(2))
        ),
        text,
    )
    return re.sub(r"\d+", lambda m: chinese_number(int(m.group(0))), text)


def normalize(text: str, language: str = "auto") -> str:
    if language == "zh" or (language == "auto" and _CJK.search(text)):
        return normalize_chinese(text)
    if language in ("en", "auto"):
        return normalize_english(text)
    return text  # other languages: left to the model's own frontend
