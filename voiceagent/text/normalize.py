"""Spell out numbers and symbols so the LM reads words, not digits.

English, the way a call-center agent reads it (docs/protocol.md, "English readings"):
cardinals, decimals, ordinals (1st, 22nd), percentages, currency ($, €, £, ¥, ₹, USD 50),
clock times (9:40, 9:08 PM), US phone numbers in their groups, dates and years in date
contexts (July 13th, 1955; since 2019; due 12/25), codes digit by digit or letter by
letter (880270, 6W7EKQ, FVGMJ), house, unit, flight and room numbers (1420 Oak Dr., Unit
21B, Flight UA 1234), titles (Mrs. Stewart), units after a number (5kg, 12GB, 72°F),
toll-free numbers spelled as words (1-800-FLOWERS), an LLM's shorthand ($5/mo, Mon-Fri,
etc., e.g.) and a few symbols (&, +, =, @). The readings are voiceagent/text/english.py's,
which the training corpus uses too; this module finds where each applies. Chinese: the
same quantities as Chinese numerals (text/chinese.py). Text with any CJK character is
treated as Chinese unless a language is given. In every language, speech markup
(text/markup.py) and an LLM's markdown are read as the words they mark.

Over 500 lines: one ordered list of patterns, each beside its small handler, and the
order is the meaning (normalize_english); split, the order would be out of sight.
"""

from __future__ import annotations

import re

from . import english as en
from .chinese import chinese_number, normalize_chinese
from .english import number as english_number
from .english import ordinal as english_ordinal
from .markup import without_markup

__all__ = ["chinese_number", "english_number", "english_ordinal", "normalize", "normalize_english"]

_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", "sen", "sen"),
    "₹": ("rupee", "rupees", "paisa", "paise"),
}
_CURRENCY_CODES = {"USD": "$", "EUR": "€", "GBP": "£", "JPY": "¥", "INR": "₹"}
# 'USD 50', '50 USD': the amount as its symbol writes it
_CODE_AMOUNT = re.compile(
    r"\b(USD|EUR|GBP|JPY|INR)\s?(\d[\d,]*(?:\.\d+)?)\b"
    r"|(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s?(USD|EUR|GBP|JPY|INR)\b"
)
_EN_SYMBOLS = {"&": " and ", "+": " plus ", "=": " equals ", "@": " at "}

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")

# -- English: the patterns, in the order normalize_english applies them ------------------

_MONTH = rf"(?:{'|'.join(en.MONTHS)}|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.?)"
_MONTHS = {m[:3]: m for m in en.MONTHS}
_MONTH_SHORT = re.compile(r"\b(Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Oct|Nov|Dec)t?(?:\.|\b)")
_STREET_TYPES = {
    "Street": "Street", "St": "Street", "Avenue": "Avenue", "Ave": "Avenue",
    "Road": "Road", "Rd": "Road", "Drive": "Drive", "Dr": "Drive", "Lane": "Lane",
    "Ln": "Lane", "Boulevard": "Boulevard", "Blvd": "Boulevard", "Court": "Court",
    "Ct": "Court", "Way": "Way", "Place": "Place", "Pl": "Place", "Parkway": "Parkway",
    "Pkwy": "Parkway", "Circle": "Circle", "Cir": "Circle", "Terrace": "Terrace",
    "Highway": "Highway", "Hwy": "Highway", "Trail": "Trail", "Square": "Square",
}  # fmt: skip
_STREET_TYPE = "|".join(sorted(_STREET_TYPES, key=len, reverse=True))
# a house number, one to three words of a street name (W, North, Oak, 5th), a street type
_ADDRESS = re.compile(
    rf"(?<![\w.,$#-])(\d{{1,5}})((?:\s+(?:[NSEW]\.?|[A-Z][a-z]+|\d+(?:st|nd|rd|th))){{1,3}}?)"
    rf"\s+({_STREET_TYPE})\b(\.)?"
)
_UNIT_WORD = re.compile(r"\s+(?:Suite|Ste|Apt|Apartment|Unit|Floor|Building|Room)\b")
# a street named by an ordinal: 5th Ave., 1st St.
_ORDINAL_STREET = re.compile(rf"\b(\d{{1,3}})(?:st|nd|rd|th)\s+({_STREET_TYPE})\b(\.)?")
_TITLE = re.compile(r"\b(Mrs|Mr|Ms|Dr|St)\b(\.)?(?=(\s+[A-Z])?)")
# US numbers: (332) 555-0163, 332-555-0163, 332.555.0163, 332 555 0163, +1 ..., 1-800-...;
# any exchange, since 555-123-4567 is every example's number
_PHONE = re.compile(
    r"(?<![\w+$.,-])(?:(\+?1)[\s.-]?)?(?:\(([2-9]\d\d)\)\s?|([2-9]\d\d)[\s.-])(\d{3})[\s.-](\d{4})"
    r"(?![\w-]|[.,]\d)"
)
_PHONE_E164 = re.compile(r"(?<![\w+])\+1([2-9]\d\d)([2-9]\d\d)(\d{4})\b")
# 1-800-FLOWERS, 1-800-GOT-JUNK: a toll-free number spelled as words
_VANITY = re.compile(
    r"(?<![\w+-])(?:(\+?1)[\s.-]?)?(8(?:00|33|44|55|66|77|88))[\s.-]"
    r"([A-Z]{2,}[A-Z\d]*(?:-[A-Z\d]+)*)(?![\w-])"
)
_PHONE_LOCAL = re.compile(r"(?<![\w+$.,-])([2-9]\d\d)-(\d{4})(?![\w-]|[.,]\d)")
_MERIDIEM_TIME = re.compile(r"\b(\d{1,2})(?::(\d{2}))?\s?([AaPp])\.?\s?[Mm]\b(\.)?")
_TIME = re.compile(r"\b(\d{1,2}):(\d{2})\b")
# ****1234, ••••4321, XXXX-1234: the last digits of a masked number, one by one
# (from a run's first mark only: a search from each mark of a long run is quadratic)
_MASKED = re.compile(
    r"(?:\([*•●xX]{3}\)\s?)?(?<![*•●xX])[*•●xX]{2,}+(?:[\s-][*•●xX]{2,}+)*+[\s-]?(\d{2,6})\b"
    r"|(?<=[(\s])(?:\.{3}|…)(\d{4})\b"  # (...4821): an account's last digits
)
_HEIGHT = re.compile(r"\b([1-8])'\s?(1[01]|\d)(?:\"|'')")  # 5'11": five foot eleven
_FEET = re.compile(r"(?<![\w.'’])(\d{1,3})'(?=[\s,.;!?]|$)")  # 6' tall: six feet
_YEAR = r"(1[1-9]\d\d|20\d\d)\b(?![.,]\d|\s*%)"
_SLASH_DATE = re.compile(r"(?<![\w/.-])(1[0-2]|0?[1-9])/(3[01]|[12]\d|0?[1-9])/(\d{4})(?![\w/])")
_DATE_WITH_YEAR = re.compile(rf"\b({_MONTH}\s+)(\d{{1,2}})(?:st|nd|rd|th)?\b(,?\s+){_YEAR}")
_DATE = re.compile(rf"\b({_MONTH}\s+)(\d{{1,2}})(?:st|nd|rd|th)?\b(?![:.,]?\d|%)")
_MONTH_YEAR = re.compile(rf"\b({_MONTH},?\s+(?:of\s+)?){_YEAR}")
_PREPOSITION = r"(?i:in|since|by|until|till|before|after|during|from|through|of|year|circa)"
_YEAR_AFTER = re.compile(rf"\b({_PREPOSITION}\s+){_YEAR}")
# 'my 2019 Honda', 'the 2020 election': a year between a determiner and what it dates
# (a plural after it is counted: 'the 1999 students')
_YEAR_BEFORE = re.compile(
    r"\b((?i:my|your|our|their|his|her|its|the|a|this|that|last|next)\s+)(19\d\d|20\d\d)"
    r"(?=\s+(?:[A-Z]|[a-z]*[a-rt-z]\b))"
)
# 'between 1990 and 2000', 'from 2019 to 2021', 'in 1990-1995'
_YEARS = re.compile(
    rf"\b((?i:between|{_PREPOSITION})\s+){_YEAR}(\s*(?:-|–|and|to|or|through|until)\s*){_YEAR}"
)
_NOT_A_NOUN = frozenset({"was", "is", "has", "as", "this", "its", "his", "us", "always"})
_DECADE = re.compile(r"\b(1[1-9]\d0|20\d0)s\b")
_SHORT_DECADE = re.compile(r"(?<![\w'])'?([2-9]0)s\b")  # the '80s, the 90s
# a number or code said digit by digit after these words ("ends in 2996")
_DIGITS_AFTER = re.compile(
    r"\b((?i:ends?\s+(?:in|with)|ending\s+(?:in|with)|extension|pin(?:\s+number)?"
    r"(?:\s+is)?|code(?:\s+is)?|last\s+(?:four|4)(?:\s+digits)?(?:\s+(?:is|are))?"
    r"|(?:confirmation|reference|booking|tracking|order|account|member|policy|claim|ticket"
    r"|case)\s+number(?:\s+is)?):?\s*)"
    r"(?=[A-Z\d]*\d)([A-Z\d]{3,})\b(?![.,]\d)"
)
# what "ends in" can be said of that ends in digits, not in a year
_NUMBERED = re.compile(
    r"(?i:number|card|account|digits|one|code|ID|phone|line|policy|order|ticket|reference"
    r"|tracking|plate|serial|it)\b[^.!?]*$"
)
_CODE = re.compile(r"(?<![\w'])(?=[A-Z\d]*[A-Z])(?=[A-Z\d]*\d)[A-Z\d]{2,}(?![\w'])")
_CAPS = re.compile(r"(?<![\w'])([A-Z]{3,}|[A-Z]{2,}(?=s))(s?)(?![\w'])")
_CAPS_BEFORE = re.compile(r"\b[A-Z]{2,}[,;:]?\s+$")
_CAPS_AFTER = re.compile(r"^[,;:]?\s+[A-Z]{2,}\b")
_DIGIT_STRING = re.compile(r"(?<![\w.,$€£¥₹-])(\d{5,}|0\d+)(?![\w%]|[.,]\d)")
_MAX_CARDINAL = 15  # digits: a longer number is read digit by digit (and never int()-ed)
# $5, -$45.20, $-45.20, $.99, $1,250.50, $1.5 million, $2.5B, $5k
_AMOUNT = re.compile(
    r"(?<![\w.])([-−])?([$€£¥₹])([-−])?(\d{1,3}(?:,\d{3})+|\d+|(?=\.\d))(?:\.(\d+))?"
    r"(?:\s?(thousand|million|billion|trillion)\b|([kKmMbB])\b)?"
)
_SCALE_LETTERS = {"k": "thousand", "m": "million", "b": "billion"}
# 1.2M people, 10M users, 1.5K steps: a scale letter after a number
_SCALED = re.compile(r"(?<![\w.])(\d{1,3})(\.\d{1,2})?([MBK])\b(?!\.\d)")
_LOWER_WORD_NEXT = re.compile(r"\s+[a-z]")
_PLACE_BEFORE = re.compile(
    r"(?i:unit|apt|apartment|suite|ste|room|seat|gate|floor|building|row|no|number|#)\.?\s*$"
)
# 'a $50 gift card', 'an 8 ft wall': "a" (a capital one only where a sentence starts,
# not 'Plan A') before an amount, and a word after it
_ARTICLE = re.compile(r"(?<![\w'’])(?:(a|an|An)|(A)) $")
# 'Acct. No.', 'Policy No.': what is numbered, then "number" (not the word "no")
_NUMBER_SIGN_AFTER = re.compile(
    r"\b((?i:acct\.?|account|policy|order|invoice|claim|ref\.?|reference|case|ticket|serial"
    r"|tracking|confirmation|member|model|part|item|phone|tel\.?))\s+(?:No(\.)|#)(?=[\s,;:]|$)"
)
_EMAIL = re.compile(r"(?<![\w.+-])([A-Za-z0-9][\w.+-]*)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)")
_URL = re.compile(
    r"(?<![\w@/.-])(?:https?://)?((?:www\.)?[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*"
    r"\.(?:com|org|net|gov|edu|io|co|us|info|ai|app|biz))\b(/[\w/.-]*[\w/])?"
)
_SAID_SYMBOLS = {".": "dot", "_": "underscore", "+": "plus", "-": "dash", "/": "slash"}
_ISO_DATE = re.compile(r"(?<![\w/.-])(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?![\w/-])")
# 'due 12/25', 'from 3/1 to 3/15': a month and day (US order) where a date is expected
_DAY_SHORT = r"(?:Mon|Tue|Tues|Wed|Thu|Thur|Thurs|Fri|Sat|Sun)"
_DAY_END = r"(?:day|sday|nesday|rsday|urday)?"
_DAY = rf"({_DAY_SHORT}){_DAY_END}"
_DATE_WORD = (
    r"(?:(?i:on|by|due|until|till|before|after|from|through|starting|expires?|effective"
    rf"|as\s+of)|{_DAY_SHORT}{_DAY_END}\.?,?)"
)
_MONTH_DAY = re.compile(
    rf"\b({_DATE_WORD}\s+)(1[0-2]|0?[1-9])/(3[01]|[12]\d|0?[1-9])"
    r"(?:(\s*(?:-|–|to|through|and)\s*)(1[0-2]|0?[1-9])/(3[01]|[12]\d|0?[1-9]))?(?![\w/])"
)
# 'for 12/15 at 3pm': a month and day before a time
_MONTH_DAY_AT = re.compile(
    r"(?<![\w/.])(1[0-2]|0?[1-9])/(3[01]|[12]\d|0?[1-9])(?=\s+(?:at|@)\s*\d)"
)
# 'Flight UA 1234', 'flight 415', 'Room 1204': said in pairs, "twelve thirty-four"
_PAIRED_NUMBER = re.compile(
    r"\b((?i:flight|room|suite|bus|route|train)\s+)([A-Z]{2}(?=\s?\d)|[A-Z]\d(?=\s)|\d[A-Z](?=\s))?"
    r"\s?([1-9]\d{2,3})(?![\w-]|[.,]\d)"
)
_SHORT_DATE = re.compile(r"(?<![\w/.-])(1[0-2]|0?[1-9])/(3[01]|[12]\d|0?[1-9])/(\d\d)(?![\w/])")
# 3-5, 500-1000, 2019-2020; a first number above the second is a score (3-2), kept
_RANGE = re.compile(r"(?<![\w.,:$€£¥₹/-])(\d{1,4})\s?[-–]\s?(\d{1,4})(?![\w/:-]|[.,]\d)")
_RANGE_WORDS = re.compile(r"(?i:\b(?:range[sd]?|ranging|from|between|pages?|ages?|aged)\b)")
_MINUS = re.compile(r"(?<![\w.,:)\]/-])[-−](?=\d)")
_FRACTIONS = {"1/2": "one half", "1/3": "one third", "2/3": "two thirds"}
_FRACTIONS |= {"1/4": "one quarter", "3/4": "three quarters", "24/7": "twenty-four seven"}
_FRACTION = re.compile(rf"(?<![\w/.])({'|'.join(_FRACTIONS)})(?![\w/])")
# 123-45-6789, 94105-1234, 4111 1111 1111 1111: groups of digits, each read digit by digit
_DIGIT_GROUPS = re.compile(
    r"(?<![\w.,-])(?:\d+(?:-\d+){2,}|\d{5}-\d{4}|\d{4}(?: \d{4}){2,3})(?![\w-]|[.,]\d)"
)
# 9:00-5:00, 9am-5pm, 10:30 - 11:15 AM: the hyphen between two times is "to"
_CLOCK = r"\d{1,2}(?::\d{2}\s?(?:[AaPp]\.?[Mm]\b\.?)?|\s?[AaPp]\.?[Mm]\b\.?)"
_MERIDIEM = r"\s?[AaPp]\.?[Mm]\b\.?"
_TIME_RANGE = re.compile(
    rf"\b({_CLOCK}|\d{{1,2}}(?::\d{{2}})?(?=\s?[-–]\s?\d{{1,2}}(?::\d{{2}})?{_MERIDIEM}))"
    rf"\s?[-–]\s?(?={_CLOCK})"
)
# +44 20 7946 0958: a number outside the US, digit by digit in its groups
_PHONE_INTL = re.compile(r"(?<![\w+])\+([2-9]\d{0,2})((?:[\s.-]\d{1,4}){2,5})\b")
_TIMES = re.compile(r"(?<=\d) ?[*×] ?(?=\d)")
_KEYS = re.compile(r"(?<![\w#*])#(?![\w#*])|(?<=\S\s)\*(?=[\s.,;!?]|$)")  # a phone's keys
_UNIT_NAMES = "|".join(map(re.escape, sorted(en.UNITS, key=len, reverse=True)))
_UNIT = re.compile(rf"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s?({_UNIT_NAMES})(?![\w/°])")
# '$4.99/mo', '20 GB/month': a slash before a unit of time or a head is "per"
_PER = re.compile(rf"(?<=[\w%])\s?/\s?({'|'.join(en.PER)})\b(\.)?")
# 'rated 4.5/5', '9/10 stars': "out of"
_RATING = re.compile(
    r"\b((?i:rated|rating(?:\s+of)?|scored?(?:\s+of)?)\s+)?(\d+(?:\.\d+)?)\s?/\s?(\d+)\b"
    r"(?=(\s+stars?\b)?)"
)
_DAYS = re.compile(rf"\b{_DAY}\.?\s?[-–]\s?{_DAY}(?![\w-])(\.)?")
_WEEKDAYS = re.compile(r"\bM\s?[-–]\s?F\b")  # 'M-F'
# 'open 9-5', 'M-F 8-4': a range of hours, though its end is the smaller number
_HOURS_BEFORE = re.compile(r"(?i:\b(?:open|hours|daily|weekdays|Friday|Sunday)\b)[\s:,]*$")
# 'Jan-Mar': a range of months
_MONTHS_RANGE = re.compile(
    r"\b(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)[a-z]*\.?\s?[-–]\s?"
    r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)[a-z]*(?![\w-])(\.)?"
)
# '15%-20%', '50-60%': one "percent", after the range
_PERCENT_RANGE = re.compile(r"(?<![\w.,])(\d+(?:\.\d+)?)%?\s?[-–]\s?(\d+(?:\.\d+)?)%(?![\w%])")
_AMOUNTS_RANGE = re.compile(r"(?<=\d)\s?[-–]\s?(?=[$€£¥₹]\d)")  # '$50-$100': "to"
_RATIO = re.compile(r"(?<![\d:.])(\d{1,3}):(\d)(?![\d:])")  # 1:1, 3:2 (a time has 2 digits)
_TIME_ZONE = re.compile(r"(?<=\b[AP] M )([ECMP][SD]?T)\b")  # '5 PM ET'
_DAY_NAMES = {d[:3]: d for d in en.WEEKDAYS}
# 'Tue, Dec 8', 'Sat & Sun': a weekday's abbreviation beside a date or another day
_DAY_LIST = re.compile(
    rf"\b{_DAY_SHORT}\b\.?(?:(?:\s*[&,]\s*|\s+(?:and|or)\s+){_DAY_SHORT}\b\.?)+"
    rf"|\b{_DAY_SHORT}\b\.?(?=,?\s+(?:{_MONTH}|\d))"
)
_STATE_ZIP = re.compile(rf"(?<=,\s)({'|'.join(en.STATES)})(?=\s+\d{{5}}(?:-\d{{4}})?\b)")
# 'version 2.0.1', 'v3.2.1': a point between each part; 192.168.1.1: digits and "dot"
_VERSION = re.compile(r"(?<![\w.])(v?)(\d{1,2}(?:\.\d{1,3}){2})(?![\w]|\.\d)")
_IP = re.compile(r"(?<![\w.])\d{1,3}(?:\.\d{1,3}){3}(?![\w]|\.\d)")
_ABBREVIATION = re.compile(
    rf"(?<![\w.])(?i:{'|'.join(map(re.escape, en.ABBREVIATIONS))})(?=[\s,;:)!?]|\.(?!\w)|$)"
)
_STAR_CODE = re.compile(r"(?<![\w*])\*(\d{2,3})(?![\d*])")  # *67: dialled, "star six seven"
# 2x, 10x: a multiple
_MULTIPLE = re.compile(r"(?<![\w.])(\d+)x(?=[\s,.!?;:]|$)")
# C-A-R-T-E-R: a word spelled out, letter by letter
_SPELLED = re.compile(r"(?<![\w-])[A-Za-z](?:-[A-Za-z]){2,}(?![\w-])")
# AB-1234-CD: three or more groups of capitals and digits, read group by group; and
# INC-4821: capitals, then three or more digits (I-95 keeps its number)
_HYPHEN_CODE = re.compile(
    r"(?<![\w-])(?:(?=[\w-]*[A-Z])(?=[\w-]*\d)[A-Z\d]+(?:-[A-Z\d]+){2,}|[A-Z]{1,4}-\d{3,})"
    r"(?![\w-])"
)
_RETIREMENT = re.compile(r"\b(40[13])(?:\(([kb])\)|([kb])\b)")  # 401(k), 403(b), 401k
_QUARTER_YEAR = re.compile(rf"\b((?:Q[1-4]|H[12]|FY)\s?){_YEAR}")
_GLUED = re.compile(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])")  # 5kg, v3, jsmith42
# jsmith42, abc123: a name or a password, whose digits are said one by one
_WORD_DIGITS = re.compile(r"\b([a-z]{2,})(\d{2,})\b")
# 555-1234 x89: an extension; 1920x1080, 5 x 3: dimensions, "by"
_EXTENSION_X = re.compile(r"(?<=\d{4}) x(?=\d{1,5}\b)")
_BY = re.compile(r"(?<=\d)(\"?) ?x ?(?=\d)")
_HEX = re.compile(r"(?<![\w.])0x")  # 0x8007: hexadecimal, not dimensions
# 10", a 1" gap: inches ('the "5" key' is a quotation)
_INCHES = re.compile(r"(?<![\w.\"“])(\d+(?:\.\d+)?)\"(?=[\s,.;:!?]|$)")


def _number(written: str) -> str:
    """A cardinal from its digits (commas allowed); past _MAX_CARDINAL digits, digit by
    digit (a 5,000-digit string is no amount, and int() refuses it)."""
    plain = written.replace(",", "")
    return en.digits(plain) if len(plain) > _MAX_CARDINAL else en.number(int(plain))


def _keep_stop(m: re.Match[str], dot: int) -> str:
    """A full stop that ended an abbreviation ('p.m.', 'Ave.') also ends the sentence when
    the text ends after it or a capital follows: keep it then."""
    return "." if m.group(dot) and _ends_sentence(m) else ""


_TEXT_END = re.compile(r"\s*$")
_CAPITAL_NEXT = re.compile(r"\s+[A-Z]")


def _ends_text(m: re.Match[str]) -> bool:
    return _TEXT_END.match(m.string, m.end()) is not None


def _ends_sentence(m: re.Match[str]) -> bool:
    """Whether the text ends after the match or a capital follows."""
    return _ends_text(m) or _CAPITAL_NEXT.match(m.string, m.end()) is not None


def _describes(m: re.Match[str]) -> bool:
    """Whether an amount is said as a word that describes the noun after it: after "a"
    and before a word ('a $50 gift card' is 'a fifty dollar gift card')."""
    start = m.start()
    article = _ARTICLE.search(m.string, max(0, start - 5), start)
    if article is None or _LOWER_WORD_NEXT.match(m.string, m.end()) is None:
        return False
    if article[2] is None:
        return True
    at = article.start()
    return re.search(r"(?:^|[.!?:])\s*$", m.string[max(0, at - 3) : at]) is not None


def _en_decimal(m: re.Match[str]) -> str:
    return f"{_number(m.group(1))} point {en.digits(m.group(2))}"


def _en_currency(m: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCY[m[2]]
    if describes := _describes(m):  # 'a $2.50 fee': 'a two dollar fifty fee'
        many, sub_many = one, sub_one
    sign = "minus " if m[1] or m[3] else ""
    whole, frac = (m[4] or "0").replace(",", ""), m[5] or ""
    scale = m[6] or _SCALE_LETTERS.get((m[7] or "").lower())
    if scale or len(frac) > 2 or len(whole) > _MAX_CARDINAL:  # $1.5 million, $3.999
        point = f" point {en.digits(frac)}" if frac else ""
        return f"{sign}{_number(whole)}{point}{' ' + scale if scale else ''} {many}"
    dollars, cents = int(whole), int(frac.ljust(2, "0"))
    cent_words = f"{en.number(cents)} {sub_one if cents == 1 else sub_many}"
    if dollars == 0 and cents:
        return sign + cent_words  # $0.50: 'fifty cents'
    words = f"{en.number(dollars)} {one if dollars == 1 else many}"
    if cents and describes:
        return f"{sign}{words} {en.number(cents)}"
    return sign + words + (f" and {cent_words}" if cents else "")


def _en_scaled(m: re.Match[str]) -> str:
    """'1.2M' -> '1.2 million'; a whole number only before a word and not after a place
    ('10M users', but 'Unit 21B', '4K', '5K run' stay)."""
    if not m[2]:
        if m[3] == "K" or not _LOWER_WORD_NEXT.match(m.string, m.end()):
            return m[0]
        if _PLACE_BEFORE.search(m.string, max(0, m.start() - 12), m.start()):
            return m[0]
    return f"{m[1]}{m[2] or ''} {_SCALE_LETTERS[m[3].lower()]}"


def _say_address(part: str) -> str:
    """An email's or a web address's part: words as written, digits one by one, symbols
    by name ('j.smith42' -> 'j dot smith four two')."""
    pieces = re.findall(r"[A-Za-z]+|\d+|[._+/-]", part)
    return " ".join(_said_piece(x) for x in pieces)


def _said_piece(x: str) -> str:
    if x.isdigit():
        return en.digits(x)
    if x.lower() == "www":
        return "w w w"
    return _SAID_SYMBOLS.get(x, x)


def _en_range(m: re.Match[str]) -> str:
    low, high = m[1], m[2]
    if int(low) >= int(high):
        hours = int(low) <= 12 and _HOURS_BEFORE.search(m.string, max(0, m.start() - 30), m.start())
        return f"{low} to {high}" if hours else m[0]  # else a score, or a pair of codes
    phone_like = len(low) == 3 and len(high) == 4 and m[0] == f"{low}-{high}"
    if phone_like:  # 555-1234 is a number to dial unless what is around says 'range'
        noun = re.match(r"\s+([a-z]+s)\b", m.string[m.end() :])
        plural = noun is not None and noun[1] not in _NOT_A_NOUN
        if not plural and not _RANGE_WORDS.search(m.string[max(0, m.start() - 30) : m.start()]):
            return m[0]
    if all(len(x) == 4 and re.fullmatch(_YEAR, x) for x in (low, high)):
        return f"{en.year(int(low))} to {en.year(int(high))}"
    return f"{en.number(int(low))} to {en.number(int(high))}"


def _en_intl_phone(m: re.Match[str]) -> str:
    groups = [m[1], *re.split(r"[\s.-]", m[2].strip())]
    return "plus " + ", ".join(en.digits(g) for g in groups)


def _en_short_date(m: re.Match[str]) -> str:
    """3/15/24 -> 'March fifteenth, twenty twenty-four' (a two-digit year past 50 is in
    the 1900s)."""
    yy = int(m[3])
    return en.date(int(m[1]), int(m[2]), (1900 if yy > 50 else 2000) + yy)


def _en_month_day(m: re.Match[str]) -> str:
    """'due 12/25' -> 'due December twenty-fifth'; a range's end too."""
    said = m[1] + en.date(int(m[2]), int(m[3]))
    if m[4]:
        joint = " to " if m[4].strip() in ("-", "–") else m[4]
        said += joint + en.date(int(m[5]), int(m[6]))
    return said


def _en_paired_number(m: re.Match[str]) -> str:
    """'Flight UA 1234' -> 'Flight U A twelve thirty-four'."""
    airline = f"{en.spell(m[2])} " if m[2] else ""
    return m[1] + airline + en.house_number(int(m[3]))


def _en_address(m: re.Match[str]) -> str:
    kind = _STREET_TYPES[m.group(3)]
    stop = _keep_stop(m, 4) if m.group(3) != kind else (m.group(4) or "")
    return f"{en.house_number(int(m.group(1)))}{m.group(2)} {kind}{stop}"


def _en_phone(m: re.Match[str]) -> str:
    return en.phone(m.group(2) or m.group(3), m.group(4), m.group(5), (m.group(1) or "")[-1:])


def _en_meridiem(m: re.Match[str]) -> str:
    hour, minute = int(m.group(1)), int(m.group(2) or 0)
    if hour > 12 or minute > 59:
        return m.group(0)
    return en.clock(hour, minute, m.group(3).upper() + "M") + _keep_stop(m, 4)


def _en_number_sign(m: re.Match[str]) -> str:
    """'No. 5' -> 'Number five', '#A12345' -> 'number A one two ...'."""
    return f"{m[1] or 'n'}umber "


_TO_AFTERNOON = re.compile(r"\s+to\s+(?:1[3-9]|2[0-3]):[0-5]\d")


def _en_clock(m: re.Match[str]) -> str:
    """'9:40' -> 'nine forty'; a 24-hour time after noon or before one is said as the
    12-hour one ('17:30' -> 'five thirty P M', '00:30' -> 'twelve thirty A M'), and so is
    the morning start of a range that ends after noon ('8:00-17:00')."""
    hour, minute = int(m[1]), int(m[2])
    if minute > 59 or hour > 23:
        return en.clock(hour, minute)
    if hour >= 13:
        return en.clock(hour - 12, minute, "PM")
    if hour == 0:
        return en.clock(12, minute, "AM")
    if hour < 12 and _TO_AFTERNOON.match(m.string, m.end()):  # 8:00-17:00
        return en.clock(hour, minute, "AM")
    return en.clock(hour, minute)


def _month(said: str) -> str:
    """'Jan. ' -> 'January ': a month's abbreviation in a date is said in full."""
    return _MONTH_SHORT.sub(lambda m: _MONTHS[m[1]], said)


def _en_date(m: re.Match[str]) -> str:
    day = int(m.group(2))
    if not 1 <= day <= 31:
        return m.group(0)
    tail = ""
    if m.re is _DATE_WITH_YEAR:
        tail = m.group(3) + en.year(int(m.group(4)))
    return _month(m.group(1)) + en.ordinal(day) + tail


def _en_slash_date(m: re.Match[str]) -> str:
    """12/05/1990 (month first, as in the US) -> 'December fifth, nineteen ninety'."""
    month, day, year = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if 1100 <= year <= 2099:
        return en.date(month, day, year)
    return f"{en.date(month, day)}, {en.number(year)}"


def _en_year_after(m: re.Match[str]) -> str:
    """'in 1990', 'since 2019': a year; 'in 1500 cases': a quantity."""
    noun = re.match(r"\s+([a-z]+s)\b", m.string[m.end() :])
    if m.re is _YEAR_AFTER and noun and noun.group(1) not in _NOT_A_NOUN:
        return m.group(0)
    if m.re is _YEARS:
        joint = " to " if m[3].strip() in ("-", "–") else m[3]  # 1990-1995: 'to'
        return f"{m[1]}{en.year(int(m[2]))}{joint}{en.year(int(m[4]))}"
    return _month(m.group(1)) + en.year(int(m.group(2)))


def _en_rating(m: re.Match[str]) -> str:
    said, score, scale, stars = m[1], m[2], m[3], m[4]
    if not (said or stars):
        return m[0]  # a date, a fraction or a path: not a rating
    return f"{said or ''}{score} out of {scale}"


def _en_days(m: re.Match[str]) -> str:
    """'Mon-Fri' -> 'Monday to Friday'."""
    return f"{_DAY_NAMES[m[1][:3]]} to {_DAY_NAMES[m[2][:3]]}{_keep_stop(m, 3)}"


def _en_months_range(m: re.Match[str]) -> str:
    """'Jan-Mar' -> 'January to March'."""
    return f"{_MONTHS[m[1][:3]]} to {_MONTHS[m[2][:3]]}{_keep_stop(m, 3)}"


def _en_day_list(m: re.Match[str]) -> str:
    """'Sat & Sun' -> 'Saturday and Sunday'; 'Tue, Dec 8' -> 'Tuesday, Dec 8'."""
    said = re.sub(rf"\b({_DAY_SHORT})\b\.?", lambda d: _DAY_NAMES[d[1][:3]], m[0])
    date_follows = re.match(rf",?\s+(?:{_MONTH}|\d)", m.string[m.end() :])
    ends = m[0].endswith(".") and not date_follows and _ends_sentence(m)
    return said.replace("&", "and") + ("." if ends else "")


def _en_abbreviation(m: re.Match[str]) -> str:
    """'etc.' -> 'et cetera' (and the full stop again when it also ended the sentence);
    'E.g.' -> 'For example'."""
    key = m[0].lower()
    words = en.ABBREVIATIONS[key]
    if m[0][0].isupper():
        words = words[0].upper() + words[1:]
    ends = _ends_text(m) if key in en.BEFORE_A_NAME else _ends_sentence(m)
    return words + ("." if m[0].endswith(".") and ends else "")


def _en_digits_after(m: re.Match[str]) -> str:
    """'ends in 2996', 'extension 1234', 'PIN 4242': digit by digit; but 'the offer ends
    in 2025' is a year."""
    said, code = m.group(1), m.group(2)
    before = m.string[max(0, m.start() - 60) : m.start()]
    is_year = re.fullmatch(_YEAR, code) is not None
    if said.lower().startswith("end") and is_year and not _NUMBERED.search(before):
        return said + en.year(int(code))
    return said + en.spell(code)


def _en_caps(m: re.Match[str]) -> str:
    letters, plural = m.group(1), m.group(2)
    before, after = m.string[: m.start()][-40:], m.string[m.end() :][:40]
    if letters in en.SAID_AS_WORDS or re.fullmatch("[IVX]+", letters):
        return m.group(0)  # a word, or a Roman numeral
    if _CAPS_BEFORE.search(before) or _CAPS_AFTER.match(after):
        return m.group(0)  # a phrase in capitals: shouted words, not a code
    return en.spell(letters) + plural


def _en_code(m: re.Match[str]) -> str:
    code = m.group(0)
    if unit := re.fullmatch(r"([1-9]\d{0,3})([A-Z])", code):  # 21B: a house or unit number
        return en.unit(int(unit.group(1)), unit.group(2))
    if seat := re.fullmatch(r"([A-Z])([1-9]\d?)", code):  # B12: a gate, seat or row
        return f"{seat.group(1)} {en.number(int(seat.group(2)))}"
    return en.spell(code)


def _en_digit_string(m: re.Match[str]) -> str:
    s = m.group(0)
    round_number = len(s) <= _MAX_CARDINAL and s[0] != "0" and int(s) % 1000 == 0
    if round_number:  # 10000 steps: a round number is a quantity
        return s
    return en.digits(s)


def _en_title(m: re.Match[str]) -> str:
    """Mr. Mrs. Ms. before anything; Dr. is Doctor before a name, Drive after a street's
    name; St. is Saint before a name, Street after one."""
    word, name_follows = m.group(1), m.group(3)
    if not m.group(2) and not name_follows:
        return m.group(0)  # 'Dr' or 'St' alone: not an abbreviation we know
    after_name = re.search(r"[A-Z][a-z]+\s+$", m.string[: m.start()]) is not None
    unit_follows = _UNIT_WORD.match(m.string[m.end() :]) is not None
    if word in ("Dr", "St") and after_name and (not name_follows or unit_follows):
        return _STREET_TYPES[word] + _keep_stop(m, 2)
    if word == "St":
        return "Saint" if name_follows else m.group(0)
    return en.TITLES[word]


def normalize_english(text: str) -> str:
    """Spell out English text the way a call-center agent reads it (docs/protocol.md,
    "language"): the rules are voiceagent/text/english.py's, also used by the training
    corpus."""
    text = _EMAIL.sub(lambda m: f"{_say_address(m[1])} at {_say_address(m[2])}", text)
    text = _URL.sub(lambda m: _say_address(m[1] + (m[2] or "")), text)
    text = re.sub(r"(?<![\w~])~\s?(?=[$€£¥₹]?\d)", "about ", text)
    text = text.replace("US$", "$").replace("MM/DD/YYYY", "month, day, year")
    text = re.sub(r"(?<=€)(\d+),(\d\d)(?![\d,])", r"\1.\2", text)  # €3,50
    text = re.sub(r"(?<![\w/.])50/50(?![\w/]|\.\d)", "fifty-fifty", text)
    text = _AMOUNTS_RANGE.sub(" to ", text)
    text = _PERCENT_RANGE.sub(lambda m: f"{m[1]} to {m[2]}%", text)
    text = _CODE_AMOUNT.sub(lambda m: _CURRENCY_CODES[m[1] or m[4]] + (m[2] or m[3]), text)
    text = _AMOUNT.sub(_en_currency, text)
    text = _SCALED.sub(_en_scaled, text)
    text = re.sub(r"(?<=\d) ?y/o\b", " years old", text)
    text = _ISO_DATE.sub(lambda m: en.date(int(m[2]), int(m[3]), int(m[1])), text)
    text = _SHORT_DATE.sub(_en_short_date, text)
    text = _MONTH_DAY.sub(_en_month_day, text)
    text = _MONTH_DAY_AT.sub(lambda m: en.date(int(m[1]), int(m[2])), text)
    text = _FRACTION.sub(lambda m: _FRACTIONS[m[1]], text)
    text = _UNIT.sub(lambda m: f"{m[1]} {en.UNITS[m[2]][m[1] != '1' and not _describes(m)]}", text)
    text = _PER.sub(lambda m: f" per {en.PER[m[1]]}{_keep_stop(m, 2)}", text)
    text = _RATING.sub(_en_rating, text)
    text = _WEEKDAYS.sub("Monday to Friday", text)
    text = _DAYS.sub(_en_days, text)
    text = _MONTHS_RANGE.sub(_en_months_range, text)
    text = _DAY_LIST.sub(_en_day_list, text)
    text = _STATE_ZIP.sub(lambda m: en.STATES[m[1]], text)
    text = _IP.sub(lambda m: " dot ".join(map(en.digits, m[0].split("."))), text)
    text = _VERSION.sub(lambda m: m[1] + " point ".join(m[2].split(".")), text)
    text = _NUMBER_SIGN_AFTER.sub(lambda m: f"{m[1]} number{_keep_stop(m, 2)}", text)
    text = _ABBREVIATION.sub(_en_abbreviation, text)
    text = _ADDRESS.sub(_en_address, text)
    text = _ORDINAL_STREET.sub(
        lambda m: f"{en.ordinal(int(m[1]))} {_STREET_TYPES[m[2]]}{_keep_stop(m, 3)}", text
    )
    text = _TITLE.sub(_en_title, text)
    text = re.sub(r"\b(Apt|Ste)\.", lambda m: {"Apt": "Apartment", "Ste": "Suite"}[m[1]], text)
    text = re.sub(r"\b([Nn])o\.\s?(?=\d)|#(?=[A-Z][A-Z\d-]*\d|\d)", _en_number_sign, text)
    text = re.sub(r"(?<=\w )#(?=:)", "number", text)  # 'Ref #: 88123'
    text = _MASKED.sub(lambda m: en.digits(m[1] or m[2]), text)
    text = _HEIGHT.sub(lambda m: f"{en.number(int(m[1]))} foot {en.number(int(m[2]))}", text)
    text = _FEET.sub(lambda m: f"{m[1]} {en.UNITS['ft'][m[1] != '1' and not _describes(m)]}", text)
    text = _PAIRED_NUMBER.sub(_en_paired_number, text)
    text = _TIMES.sub(" times ", text)
    text = _RETIREMENT.sub(lambda m: f"{en.digits(m[1], zero='oh')} {m[2] or m[3]}", text)
    text = _STAR_CODE.sub(lambda m: f"star {en.digits(m[1])}", text)
    text = _KEYS.sub(lambda m: "pound" if m[0] == "#" else "star", text)
    text = _TIME_RANGE.sub(lambda m: f"{m[1]} to ", text)
    text = _EXTENSION_X.sub(" ext", text)
    text = _PHONE_INTL.sub(_en_intl_phone, text)
    text = _PHONE_E164.sub(lambda m: en.phone(m[1], m[2], m[3], "1"), text)
    text = _VANITY.sub(lambda m: en.vanity(m[2], m[3], (m[1] or "")[-1:]), text)
    text = _PHONE.sub(_en_phone, text)
    text = _RANGE.sub(_en_range, text)
    text = _PHONE_LOCAL.sub(lambda m: en.phone("", m[1], m[2]), text)
    text = _MINUS.sub("minus ", text)
    text = _DIGIT_GROUPS.sub(lambda m: ", ".join(map(en.digits, re.split("[ -]", m[0]))), text)
    text = _SPELLED.sub(lambda m: " ".join(m[0].upper().split("-")), text)
    text = _HYPHEN_CODE.sub(lambda m: ", ".join(map(en.spell, m[0].split("-"))), text)
    text = _MERIDIEM_TIME.sub(_en_meridiem, text)
    text = _TIME_ZONE.sub(lambda m: en.spell(m[1]), text)
    text = _RATIO.sub(lambda m: f"{m[1]} to {m[2]}", text)
    text = _TIME.sub(_en_clock, text)
    text = re.sub(r"\bext\.?(?=\s*\d)", "extension", text)
    text = _DIGITS_AFTER.sub(_en_digits_after, text)
    text = _SLASH_DATE.sub(_en_slash_date, text)
    text = _DATE_WITH_YEAR.sub(_en_date, text)
    text = _DATE.sub(_en_date, text)
    text = _MONTH_YEAR.sub(_en_year_after, text)
    text = _YEARS.sub(_en_year_after, text)
    text = _QUARTER_YEAR.sub(lambda m: f"{en.spell(m[1].strip())} {en.year(int(m[2]))}", text)
    text = _YEAR_AFTER.sub(_en_year_after, text)
    text = _YEAR_BEFORE.sub(_en_year_after, text)
    text = _DECADE.sub(lambda m: en.decade(int(m[1])), text)
    text = _SHORT_DECADE.sub(lambda m: en.decade(1900 + int(m[1]))[len("nineteen ") :], text)
    text = re.sub(r"(?<![\w.,-])911(?![\w]|[.,]\d)", "nine one one", text)
    text = _CODE.sub(_en_code, text)
    text = _CAPS.sub(_en_caps, text)
    text = re.sub(r"(\d[\d,]*)\.(\d+)%", lambda m: _en_decimal(m) + " percent", text)
    text = re.sub(r"(\d[\d,]*)%", lambda m: _number(m[1]) + " percent", text)
    text = re.sub(r"\b(\d{1,15})(st|nd|rd|th)\b", lambda m: en.ordinal(int(m[1])), text)
    text = _MULTIPLE.sub(lambda m: f"{m[1]} times", text)
    text = _BY.sub(lambda m: m[0] if _HEX.match(m.string, m.start() - 1) else m[1] + " by ", text)
    text = _INCHES.sub(
        lambda m: f"{m[1]} {'inch' if m[1] == '1' or _describes(m) else 'inches'}", text
    )
    text = _WORD_DIGITS.sub(lambda m: f"{m[1]} {en.digits(m[2])}", text)
    text = _GLUED.sub(" ", text)
    text = re.sub(r"(\d[\d,]*)\.(\d+)", _en_decimal, text)
    text = _DIGIT_STRING.sub(_en_digit_string, text)
    text = re.sub(r"\d{1,3}(?:,\d{3})+|\d+", lambda m: _number(m[0]), text)
    for sym, words in _EN_SYMBOLS.items():
        text = text.replace(sym, words)
    return re.sub(r"  +", " ", text)


_KANA_HANGUL = re.compile(r"[\u3040-\u30ff\uac00-\ud7af]")
# An LLM's markdown: a link's text, and emphasis, code, heading and bullet marks dropped.
_MD_LINK = re.compile(r"\[([^\]\n]+)\]\([^)\s]*\)")
_MD_MARKS = re.compile(
    # emphasis (a lone * before a digit or a stop is a phone's key: *67, "press *."; a
    # mask, '(***) ***-1234', has a bracket or a hyphen where emphasis has a word)
    r"(?<![\w*_])(?:[*_]{2,3}|_|\*(?![\d,.;:!?]))(?=[^\s*_)-])|(?<=[^\s*_(-])[*_]{1,3}(?![\w*_])"
    r"|`+|^[ \t]*(?:#{1,6}|[-*+])[ \t]+",  # code, a heading's or a bullet's mark
    re.MULTILINE,
)


# a table's rule line ('|---|:---:|'), and a row's cells ('| Basic | $5 |')
_MD_TABLE_RULE = re.compile(
    r"^[ \t]*+(?:\|[ \t]*+)?:?-{3,}+:?[ \t]*+(?:\|[ \t]*+:?-{3,}+:?[ \t]*+)*+\|?[ \t]*(?:\n|$)",
    re.MULTILINE,
)
_MD_TABLE_ROW = re.compile(r"^[ \t]*\|(.*)\|[ \t]*$", re.MULTILINE)


def strip_markdown(text: str) -> str:
    """'**Great** news, see [the page](https://...)' -> 'Great news, see the page'; a
    table's rows are read as their cells, a comma between."""
    text = _MD_TABLE_RULE.sub("", text)
    text = _MD_TABLE_ROW.sub(lambda m: ", ".join(c.strip() for c in m[1].split("|")), text)
    return _MD_MARKS.sub("", _MD_LINK.sub(r"\1", text))


def said_text(text: str) -> str:
    """The words a client's text asks to be said, before any reading rule: its speech
    markup (`text/markup.py`) and an LLM's markdown out. Captions show this."""
    return strip_markdown(without_markup(text))


# emoji, their skin tones and joiners: no speech
_EMOJI = re.compile(r"(?<![ \t])[ \t]*+[\U0001F000-\U0001FAFF\u2600-\u27BF\uFE0F\u200D]+")


def normalize(text: str, language: str = "auto") -> str:
    text = _EMOJI.sub("", said_text(text))
    if language == "auto" and _KANA_HANGUL.search(text):
        return text  # Japanese or Korean: left to the model's own frontend
    if language == "zh" or (language == "auto" and _CJK.search(text)):
        return normalize_chinese(text)
    if language in ("en", "auto"):
        return normalize_english(text)
    return text  # other languages: left to the model's own frontend
