"""Chinese: numbers as Chinese numerals (一百二十三, 三点一四, 百分之五十); a year before
年 and long digit runs (a mobile number) digit by digit."""

from __future__ import annotations

import re

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


def _zh_digits(s: str) -> str:
    return "".join(_ZH_DIGITS[int(d)] for d in s)


def _zh_digits_of(m: re.Match[str]) -> str:
    return _zh_digits(m[0])


def normalize_chinese(text: str) -> str:
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,234
    # digit by digit: a year (2024年), a mobile number (138...), any run of 12 or more
    text = re.sub(r"\d{4}(?=年)|(?<![\d.])(?:1\d{10}|\d{12,})(?![\d.%])", _zh_digits_of, text)
    text = re.sub(
        r"(\d+)\.(\d+)%",
        lambda m: "百分之" + chinese_number(int(m.group(1))) + "点" + _zh_digits(m.group(2)),
        text,
    )
    text = re.sub(r"(\d+)%", lambda m: "百分之" + chinese_number(int(m.group(1))), text)
    text = re.sub(
        r"(\d+)\.(\d+)",
        lambda m: chinese_number(int(m.group(1))) + "点" + _zh_digits(m.group(2)),
        text,
    )
    return re.sub(r"\d+", lambda m: chinese_number(int(m.group(0))), text)
