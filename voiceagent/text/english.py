"""How a call-center agent reads English numbers, codes and abbreviations aloud: one set
of rules for the server (voiceagent/text/normalize.py applies them to what it is sent)
and the training corpus (voiceagent/train/spoken.py and templates.py write spoken forms
with them), so the LM learns the readings the server gives it.

Each function returns words only. Letters in a reading are single capitals ("K seven
X"): one word per letter, read as its name.
"""

from __future__ import annotations

# fmt: off
ONES = (
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
MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
TITLES = {"Mr": "Mister", "Ms": "Miz", "Mrs": "Missus", "Dr": "Doctor"}  # before a name
# Toll-free area codes said as a number rather than digit by digit ("one eight hundred").
_AREA_AS_NUMBER = {"800": "eight hundred"}

# A unit's abbreviation after a number, said as its name (singular after exactly 1).
# Only abbreviations that mean nothing else after a number: not m (million or metres),
# g (5G), in, L or h.
UNITS = {
    "kg": ("kilogram", "kilograms"), "mg": ("milligram", "milligrams"),
    "lb": ("pound", "pounds"), "lbs": ("pound", "pounds"), "oz": ("ounce", "ounces"),
    "km": ("kilometer", "kilometers"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "mi": ("mile", "miles"), "ft": ("foot", "feet"),
    "mph": ("mile per hour", "miles per hour"),
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "kph": ("kilometer per hour", "kilometers per hour"),
    "ml": ("milliliter", "milliliters"), "mL": ("milliliter", "milliliters"),
    "KB": ("kilobyte", "kilobytes"), "MB": ("megabyte", "megabytes"),
    "GB": ("gigabyte", "gigabytes"), "TB": ("terabyte", "terabytes"),
    "Mbps": ("megabit per second", "megabits per second"),
    "Gbps": ("gigabit per second", "gigabits per second"),
    "kHz": ("kilohertz", "kilohertz"), "MHz": ("megahertz", "megahertz"),
    "GHz": ("gigahertz", "gigahertz"),
    "hr": ("hour", "hours"), "hrs": ("hour", "hours"), "min": ("minute", "minutes"),
    "mins": ("minute", "minutes"), "sec": ("second", "seconds"), "secs": ("second", "seconds"),
    "ms": ("millisecond", "milliseconds"),
    "kW": ("kilowatt", "kilowatts"), "kWh": ("kilowatt hour", "kilowatt hours"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°C": ("degree Celsius", "degrees Celsius"), "°": ("degree", "degrees"),
}  # fmt: skip

# Abbreviations an LLM writes, said in full.
ABBREVIATIONS = {
    "etc.": "et cetera", "e.g.": "for example", "i.e.": "that is", "vs.": "versus",
    "approx.": "approximately", "w/o": "without", "w/": "with", "dept.": "department",
    "appt.": "appointment", "acct.": "account", "qty.": "quantity", "qty": "quantity",
    "p.o. box": "P O Box", "a.k.a.": "also known as", "jr.": "junior", "sr.": "senior",
    "mt.": "mount", "ch.": "chapter", "pp.": "pages", "thx": "thanks", "pls": "please",
    "plz": "please",
}  # fmt: skip
BEFORE_A_NAME = frozenset({"mt.", "a.k.a."})  # a capital after them starts no sentence
# a state's postal code before a ZIP code ('Austin, TX 78701') is said as its name
STATES = {
    "AL": "Alabama", "AK": "Alaska", "AZ": "Arizona", "AR": "Arkansas", "CA": "California",
    "CO": "Colorado", "CT": "Connecticut", "DE": "Delaware", "DC": "D C", "FL": "Florida",
    "GA": "Georgia", "HI": "Hawaii", "ID": "Idaho", "IL": "Illinois", "IN": "Indiana",
    "IA": "Iowa", "KS": "Kansas", "KY": "Kentucky", "LA": "Louisiana", "ME": "Maine",
    "MD": "Maryland", "MA": "Massachusetts", "MI": "Michigan", "MN": "Minnesota",
    "MS": "Mississippi", "MO": "Missouri", "MT": "Montana", "NE": "Nebraska", "NV": "Nevada",
    "NH": "New Hampshire", "NJ": "New Jersey", "NM": "New Mexico", "NY": "New York",
    "NC": "North Carolina", "ND": "North Dakota", "OH": "Ohio", "OK": "Oklahoma",
    "OR": "Oregon", "PA": "Pennsylvania", "RI": "Rhode Island", "SC": "South Carolina",
    "SD": "South Dakota", "TN": "Tennessee", "TX": "Texas", "UT": "Utah", "VT": "Vermont",
    "VA": "Virginia", "WA": "Washington", "WV": "West Virginia", "WI": "Wisconsin",
    "WY": "Wyoming", "PR": "Puerto Rico",
}  # fmt: skip
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# '$5/mo': what a slash before these means, and their full names
PER = {
    "month": "month", "mo": "month", "year": "year", "yr": "year", "week": "week",
    "wk": "week", "day": "day", "hour": "hour", "hr": "hour", "minute": "minute",
    "min": "minute", "night": "night", "person": "person", "user": "user", "seat": "seat",
    "lb": "pound", "kg": "kilogram", "oz": "ounce", "gal": "gallon", "gallon": "gallon",
    "item": "item", "unit": "unit",
}  # fmt: skip

# All-caps words said as words, not spelled: acronyms read as words, and common words a
# writer puts in capitals for emphasis ("do NOT share it"). Any other all-caps word of
# three or more letters is spelled letter by letter (PBX, IRS, FVGMJ).
# fmt: off
_SAID_AS_WORDS = """
    AIDS ASCII CAPTCHA COBOL COVID DAHDI DARPA FAQ FEMA FICO GIF HIPAA HUD IKEA JPEG LASER LED
    LEGO MEDICARE NAFTA NASA NASDAQ NATO OPEC OSHA PIN PINS RADAR SCUBA SIM SIP SONAR SWAT
    UNESCO UNICEF WIFI YAML ZIP
    ABOUT AFTER AGAIN ALL ALSO ALWAYS AND ANY ARE ASK ATTENTION AWAY BACK BAD BEFORE BEST
    BIG BOTH BUT BUY CALL CAN CANNOT CAUTION CHECK CLOSED DAY DID DOES DONE DUE END EVER
    EVERY EXACTLY FAST FINAL FIRST FOR FREE FROM FULL GET GOOD GREAT HAS HAVE HELLO HELP
    HER HERE HIM HIS HOT HOW IMPORTANT INTO ITS JUST KEEP LAST LATE LESS LIVE LOT MORE
    MOST MUST NEED NEVER NEW NEXT NONE NOT NOTE NOTICE NOW OFF OKAY OLD ONE ONLY OPEN OUR
    OUT OVER PLEASE READ REAL REALLY SAFE SALE SAME SAVE SEE SENT SHE SHOULD SOON STILL
    STOP SURE TAKE THAN THANK THANKS THAT THE THEM THEN THERE THESE THEY THIS TODAY TOO
    TOTAL TRUE TRY URGENT USE VERY WAIT WANT WARNING WAS WAY WELL WERE WHAT WHEN WHERE
    WHICH WHO WHY WILL WITH WITHOUT WON WORK WOULD YES YET YOU YOUR
"""
# fmt: on
SAID_AS_WORDS = frozenset(_SAID_AS_WORDS.split())


def number(n: int) -> str:
    """A cardinal: 1234 -> 'one thousand two hundred thirty-four'."""
    if n < 0:
        return "minus " + number(-n)
    if n < 20:
        return ONES[n]
    if n < 100:
        tens, rest = divmod(n, 10)
        return _TENS[tens] + ("-" + ONES[rest] if rest else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return ONES[hundreds] + " hundred" + (" " + number(rest) if rest else "")
    for value, name in _SCALES:
        if n >= value:
            head, rest = divmod(n, value)
            return number(head) + " " + name + (" " + number(rest) if rest else "")
    raise AssertionError("unreachable")


def ordinal(n: int) -> str:
    """21 -> 'twenty-first', 100 -> 'one hundredth'."""
    words = number(n)
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


def digits(s: str, zero: str = "zero") -> str:
    """'5550142' -> 'five five five zero one four two' (`zero` may be 'oh')."""
    return " ".join(zero if d == "0" else ONES[int(d)] for d in s)


def spell(code: str) -> str:
    """'K7X29Q' -> 'K seven X two nine Q': letters as capitals, digits as words."""
    out = []
    for ch in code:
        if ch.isdigit():
            out.append(ONES[int(ch)])
        elif ch.isalpha():
            out.append(ch.upper())
        else:
            raise ValueError(f"cannot spell {ch!r} in {code!r}")
    return " ".join(out)


def _two_digits(n: int) -> str:
    """The second half of a paired reading: 5 -> 'oh five', 0 -> 'hundred'."""
    if n == 0:
        return "hundred"
    return f"oh {number(n)}" if n < 10 else number(n)


def year(n: int) -> str:
    """1999 -> 'nineteen ninety-nine', 1905 -> 'nineteen oh five', 1900 -> 'nineteen
    hundred', 2005 -> 'two thousand five', 2024 -> 'twenty twenty-four' (the usual
    American readings)."""
    if 2000 <= n < 2010:
        return number(n)
    head, tail = divmod(n, 100)
    return f"{number(head)} {_two_digits(tail)}"


def decade(n: int) -> str:
    """The '1990s': 1990 -> 'nineteen nineties', 2000 -> 'two thousands'."""
    words = year(n)
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def house_number(n: int) -> str:
    """How an address's number is said: 12 -> 'twelve', 315 -> 'three fifteen',
    1420 -> 'fourteen twenty', 1405 -> 'fourteen oh five', 2008 -> 'two thousand eight',
    3000 -> 'three thousand', longer ones digit by digit. Flights and rooms are said so too."""
    if n < 100 or n in range(1000, 10000, 1000):
        return number(n)
    if n < 1000:
        head, tail = divmod(n, 100)
        return f"{number(head)} {_two_digits(tail)}"
    if n < 10000:
        if n % 1000 < 10 and n % 1000 != 0:  # 2008: 'two thousand eight'
            return number(n)
        head, tail = divmod(n, 100)
        return f"{number(head)} {_two_digits(tail)}"
    return digits(str(n))


def clock(hour: int, minute: int, meridiem: str | None = None) -> str:
    """A clock time: (9, 5) -> 'nine oh five', (10, 0) -> 'ten o'clock', (2, 30, 'PM')
    -> 'two thirty P M', (9, 0, 'AM') -> 'nine A M' (no "o'clock" before A M / P M)."""
    if minute == 0:
        words = number(hour) if meridiem else f"{number(hour)} o'clock"
    elif minute < 10:
        words = f"{number(hour)} oh {number(minute)}"
    else:
        words = f"{number(hour)} {number(minute)}"
    return f"{words} {' '.join(meridiem.upper())}" if meridiem else words


def phone(area: str, exchange: str, line: str, country: str = "") -> str:
    """A US number in the groups it is read in, a comma (a short pause) between groups:
    ('415', '555', '0142') -> 'four one five, five five five, zero one four two';
    country '1' -> 'one, four one five, ...', but with area '800' 'one eight hundred,
    ...'. No area: 'five five five, zero one four two'."""
    head = country and digits(country)
    if area:
        if area in _AREA_AS_NUMBER:  # 'one eight hundred': one group
            head = f"{head} {_AREA_AS_NUMBER[area]}".strip()
        else:  # 'one, four one five': two
            head = ", ".join(x for x in (head, digits(area)) if x)
        head += ","
    return f"{head} {digits(exchange)}, {digits(line)}".strip()


def vanity(area: str, word: str, country: str = "") -> str:
    """A toll-free number spelled as a word: ('800', 'GOT-JUNK', '1') -> 'one eight
    hundred, got junk'. Letters are said as the word they spell, digits one by one."""
    head = f"{digits(country)} " if country else ""
    parts = [digits(p) if p.isdigit() else p.lower() for p in word.split("-")]
    return f"{head}{_AREA_AS_NUMBER.get(area) or digits(area)}, {' '.join(parts)}"


def unit(n: int, letter: str) -> str:
    """A house, unit or seat number with a letter: (21, 'B') -> 'twenty-one B'."""
    return f"{house_number(n)} {letter.upper()}"


def date(month: int, day: int, year_: int | None = None) -> str:
    """(12, 5, 1990) -> 'December fifth, nineteen ninety'."""
    words = f"{MONTHS[month - 1]} {ordinal(day)}"
    return words if year_ is None else f"{words}, {year(year_)}"
