"""Chinese: numbers as Chinese numerals (一百二十三, 三点一四, 百分之五十); a year before
年, long digit runs (a mobile number), phone numbers and codes after 号, 验证码, 尾号 ...
digit by digit; clock times, dates, amounts, temperatures and ranges as they are said."""

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


_DATE = re.compile(r"(?<!\d)(\d{4})[-/](\d{1,2})[-/](\d{1,2})(?!\d)")  # 2024-03-15
_PHONE = re.compile(r"(?<![\d-])(?:(\d{3,4})-(\d{3,4})-(\d{4})|(0\d{2,3})-(\d{7,8}))(?![\d-])")
# what is read digit by digit after: 订单号是12345678, 验证码：482913, 尾号0042
_CODE = re.compile(r"((?:号码?|编号|验证码|密码|工号|分机号?)(?:[是为])?[:：]?\s*)(\d{3,})")
_CLOCK = re.compile(r"(?<![\d.:])([01]?\d|2[0-3])[:：]([0-5]\d)(?:[:：]([0-5]\d))?(?![\d:])")
_SCORE = re.compile(r"(?<![\d.:])(\d{1,3})[:：](\d)(?![\d:])")  # 3:2, 1:1: 三比二
_CURRENCIES = {"¥": "元", "￥": "元", "$": "美元", "€": "欧元", "£": "英镑"}
_AMOUNT = re.compile(r"([¥￥$€£])(\d+(?:\.\d+)?)")
_TEMPERATURE = re.compile(r"(-)?(\d+(?:\.\d+)?)\s?°([CF])?")


def _zh_clock(m: re.Match[str]) -> str:
    """'3:30' -> '三点三十分', '9:05' -> '九点零五分', '10:00' -> '十点' (2 o'clock: 两点),
    '2:45:30' -> '两点四十五分三十秒'."""
    hour, minute = int(m[1]), int(m[2])
    said = ("两" if hour == 2 else chinese_number(hour)) + "点"
    for value, unit in ((minute, "分"), (int(m[3] or 0), "秒")):
        if value:
            said += ("零" if value < 10 else "") + chinese_number(value) + unit
    return said


def _zh_amount(m: re.Match[str]) -> str:
    """'¥99.50' -> '99.5元' (the numerals follow): a trailing zero of the cents is not said."""
    amount = m[2].rstrip("0").rstrip(".") if "." in m[2] else m[2]
    return amount + _CURRENCIES[m[1]]


def _zh_temperature(m: re.Match[str]) -> str:
    unit = {"C": "摄氏度", "F": "华氏度"}.get(m[3] or "", "度")
    return ("零下" if m[1] else "") + m[2] + unit


def normalize_chinese(text: str) -> str:
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 1,234
    text = _DATE.sub(lambda m: f"{m[1]}年{int(m[2])}月{int(m[3])}日", text)
    text = _PHONE.sub(lambda m: "，".join(_zh_digits(g) for g in m.groups() if g), text)
    text = _CODE.sub(lambda m: m[1] + _zh_digits(m[2]), text)
    text = _CLOCK.sub(_zh_clock, text)
    text = _SCORE.sub(r"\1比\2", text)
    text = _AMOUNT.sub(_zh_amount, text)
    text = _TEMPERATURE.sub(_zh_temperature, text)
    text = re.sub(r"(?<=\d)\s?[-~～]\s?(?=\d)", "到", text)  # 3-5天
    text = re.sub(r"(?<![\dA-Za-z.])-(?=\d)", "负", text)  # (a Chinese character is \w)
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
