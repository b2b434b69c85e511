"""Sentences of our own: call-center phrases, numbers, money, phone numbers, dates and
times, addresses, spelled codes and short questions and answers, filled from word lists
written for this project with seeded randomness (so the same seed gives the same
sentences, and the text is ours to license).

A generator returns (written, spoken): the text as a person types it and as it is said.
Slots give both forms (spoken.py); literal template text is the same in both.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from ..text import english
from ..text.english import number as english_number
from ..text.english import ordinal as english_ordinal
from ..text.normalize import normalize_english
from . import spoken as sp

Pair = tuple[str, str]  # (written, spoken)
Slot = str | Pair

# -- word lists (common names and places; invented companies) ----------------------------

# fmt: off
FIRST = (
    "James", "Mary", "Robert", "Linda", "Michael", "Sarah", "David", "Karen", "Daniel",
    "Emily", "Joseph", "Laura", "Thomas", "Nancy", "Kevin", "Rachel", "Brian", "Megan",
    "Steven", "Olivia", "Anthony", "Grace", "Mark", "Hannah", "Paul", "Sophia", "Andrew",
    "Chloe", "Joshua", "Natalie", "Eric", "Julia", "Jason", "Victoria", "Ryan", "Maria",
    "Carlos", "Priya", "Omar", "Mei", "Ahmed", "Fatima", "Luis", "Aisha", "Peter", "Diane",
    "Gary", "Helen", "Frank", "Ruth", "Sam", "Alex", "Jordan", "Taylor", "Morgan", "Casey",
)
LAST = (
    "Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis", "Wilson",
    "Anderson", "Taylor", "Moore", "Jackson", "Martin", "Lee", "Thompson", "White", "Harris",
    "Clark", "Lewis", "Robinson", "Walker", "Young", "Allen", "King", "Wright", "Scott",
    "Green", "Baker", "Adams", "Nelson", "Hill", "Campbell", "Mitchell", "Roberts", "Carter",
    "Phillips", "Evans", "Turner", "Parker", "Collins", "Edwards", "Stewart", "Morris",
    "Murphy", "Cook", "Rogers", "Patel", "Nguyen", "Kim", "Chen", "Lopez", "Rivera", "Reed",
)
COMPANY = (
    "Northwind Energy", "Bluebird Telecom", "Summit Bank", "Harbor Health", "Maple Insurance",
    "Cedar Home Services", "Brightline Internet", "Redwood Credit Union", "Lakeside Dental",
    "Evergreen Pharmacy", "Silver Lake Travel", "Granite Auto Care", "Pioneer Water",
    "Sunrise Realty", "Oakridge Clinic", "Riverbend Utilities", "Clearview Cable",
    "Starlight Airlines", "Meadow Pet Hospital", "Union Street Bakery",
)
DEPARTMENT = (
    "billing", "technical support", "customer care", "sales", "claims", "the pharmacy",
    "accounts", "scheduling", "the front desk", "returns", "shipping", "member services",
)
PRODUCT = (
    "internet plan", "phone line", "savings account", "credit card", "insurance policy",
    "prescription", "subscription", "router", "appointment", "reservation", "order",
    "membership", "water service", "gas service", "cable box", "warranty", "loan",
)
ITEM = (
    "a replacement card", "a new modem", "a refund", "a paper statement", "a technician",
    "a callback", "a copy of the invoice", "a payment plan", "a rental car", "a window seat",
)
CITY = (
    ("Springfield", "Illinois"), ("Portland", "Oregon"), ("Austin", "Texas"),
    ("Denver", "Colorado"), ("Madison", "Wisconsin"), ("Columbus", "Ohio"),
    ("Raleigh", "North Carolina"), ("Boise", "Idaho"), ("Tucson", "Arizona"),
    ("Albany", "New York"), ("Richmond", "Virginia"), ("Omaha", "Nebraska"),
    ("Tampa", "Florida"), ("Fresno", "California"), ("Spokane", "Washington"),
    ("Savannah", "Georgia"), ("Lexington", "Kentucky"), ("Burlington", "Vermont"),
    ("Santa Fe", "New Mexico"), ("Reno", "Nevada"), ("Des Moines", "Iowa"),
    ("Hartford", "Connecticut"), ("Provo", "Utah"), ("Mobile", "Alabama"),
)
STREET = (
    "Maple", "Oak", "Pine", "Cedar", "Elm", "Washington", "Lincoln", "Park", "Lake", "Hill",
    "Main", "Church", "River", "Sunset", "Highland", "Franklin", "Jefferson", "Walnut",
    "Chestnut", "Willow", "Meadow", "Forest", "Spring", "Madison", "Jackson", "Ridge",
)
STREET_TYPE = (  # (as often written, as said)
    ("Street", "Street"), ("St.", "Street"), ("Avenue", "Avenue"), ("Ave.", "Avenue"),
    ("Road", "Road"), ("Rd.", "Road"), ("Drive", "Drive"), ("Dr.", "Drive"),
    ("Lane", "Lane"), ("Boulevard", "Boulevard"), ("Blvd.", "Boulevard"), ("Court", "Court"),
    ("Way", "Way"), ("Place", "Place"),
)
WEEKDAY = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
CODE_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I or O: codes avoid them (1 and 0)
# fmt: on
MONTH = english.MONTHS
TITLE = tuple((f"{short}.", said) for short, said in english.TITLES.items())


def fill(template: str, slots: Mapping[str, Slot]) -> Pair:
    """Put each slot's written form into the written text and its spoken form into the
    spoken one."""
    written = {k: v if isinstance(v, str) else v[0] for k, v in slots.items()}
    spoken = {k: v if isinstance(v, str) else v[1] for k, v in slots.items()}
    return template.format(**written), template.format(**spoken)


def _cardinal(n: int) -> Pair:
    return f"{n:,}", english_number(n)


def _ordinal(n: int) -> Pair:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}", english_ordinal(n)


def _date(rng: random.Random) -> Pair:
    return fill("{m} {d}", {"m": rng.choice(MONTH), "d": _ordinal(rng.randint(1, 28))})


def _time(rng: random.Random) -> Pair:
    minute = rng.choice((0, 0, 15, 30, 45, rng.randint(1, 59)))
    return sp.clock(rng.randint(1, 12), minute, rng.choice(("AM", "PM", None)))


def _code(rng: random.Random, n: int) -> Pair:
    chars = "".join(rng.choice(CODE_LETTERS + "23456789") for _ in range(n))
    return chars, sp.spell(chars)


def _digit_string(rng: random.Random, n: int) -> Pair:
    s = "".join(rng.choice("0123456789") for _ in range(n))
    return s, sp.digits(s)


def _name(rng: random.Random) -> str:
    return rng.choice(FIRST)


def _full_name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


# -- generators, one per kind of sentence ---------------------------------------------

CALL = (
    "Thank you for calling {company}, this is {name}.",
    "Thank you for calling {company}. How can I help you today?",
    "Hi, my name is {name}, and I'll be helping you today.",
    "Please hold while I transfer you to {dept}.",
    "I'm going to connect you with {dept} now.",
    "Could you please verify the name on the account?",
    "I can help you with your {product}.",
    "Let me pull up your {product} real quick.",
    "I see the problem with your {product}, and I can fix it.",
    "Your {product} has been updated.",
    "I'm sorry for the wait, and thank you for your patience.",
    "Is there anything else I can help you with today?",
    "Thanks for calling {company}, and have a great {weekday}.",
    "I've noted that on your account, {name}.",
    "One moment while I look that up for you.",
    "Can you hear me clearly?",
    "I'm sorry, could you repeat that for me?",
    "The system is a little slow today, so bear with me.",
    "I'll send {item} to the address on file.",
    "We can send {item} by the end of the week.",
    "Would you like me to schedule {item}?",
    "Your request for {item} has been approved.",
    "All of our agents in {dept} are busy right now.",
    "Please stay on the line, and someone will be with you shortly.",
    "{title} {last} will call you back before the end of the day.",
    "{title} {last} from {dept} left you a message.",
    "{title} {last} has an opening next {weekday}.",
    "I've cancelled your {product} as you asked.",
    "For quality purposes, this call may be recorded.",
    "Your feedback helps us improve our service.",
    "I understand how frustrating that must be, {name}.",
    "Let me check whether a technician is available on {weekday}.",
    "Your {product} will renew automatically next month.",
    "I've reset your password, so you can log in now.",
    "You should receive a text message with a link shortly.",
    "We noticed some unusual activity on your {product}.",
)


def call_phrase(rng: random.Random) -> Pair:
    return fill(
        rng.choice(CALL),
        {
            "company": rng.choice(COMPANY),
            "name": _name(rng),
            "last": rng.choice(LAST),
            "dept": rng.choice(DEPARTMENT),
            "product": rng.choice(PRODUCT),
            "item": rng.choice(ITEM),
            "weekday": rng.choice(WEEKDAY),
            "title": rng.choice(TITLE),
        },
    )


NUMBER = (
    "You have {n} unread messages.",
    "There are {n} callers ahead of you.",
    "Your account has {n} reward points.",
    "We shipped {n} items in your last order.",
    "The package weighs about {n} pounds.",
    "Your plan includes {n} minutes each month.",
    "You are the {o} caller in line.",
    "This is your {o} payment on this loan.",
    "Your appointment is on the {o} floor.",
    "Please take the {o} exit after the bridge.",
    "Your rate will go down by {p} percent.",
    "About {p} percent of your data is used.",
)


def numbers(rng: random.Random) -> Pair:
    n = rng.choice((rng.randint(2, 20), rng.randint(21, 999), rng.randint(1000, 99999)))
    return fill(
        rng.choice(NUMBER),
        {"n": _cardinal(n), "o": _ordinal(rng.randint(1, 40)), "p": _cardinal(rng.randint(2, 90))},
    )


MONEY = (
    "Your balance is {amount}.",
    "The total comes to {amount}.",
    "Your next payment of {amount} is due on {date}.",
    "We received your payment of {amount}, thank you.",
    "A refund of {amount} will appear in three to five days.",
    "The late fee is {amount}, but I can waive it this time.",
    "Your monthly bill will go up to {amount}.",
    "The deductible for this claim is {amount}.",
    "That upgrade costs {amount} a month.",
    "I see a charge of {amount} from {weekday}.",
)


def money(rng: random.Random) -> Pair:
    cents = rng.choice((rng.randint(100, 9999), rng.randint(1, 500) * 100, rng.randint(1, 250000)))
    return fill(
        rng.choice(MONEY),
        {"amount": sp.money(cents), "date": _date(rng), "weekday": rng.choice(WEEKDAY)},
    )


PHONE = (
    "You can reach us at {phone}.",
    "Please call {phone} to speak with {dept}.",
    "Is {phone} still the best number for you?",
    "The number on file is {phone}.",
    "For {dept}, dial {phone}.",
    "Call us back at {phone} any time.",
    "Our toll free number is {tollfree}.",
)


def phone_number(rng: random.Random) -> Pair:
    area = str(rng.randint(201, 989))
    line = f"01{rng.randint(0, 99):02d}"  # 555-0100 to 0199: numbers reserved for fiction
    return fill(
        rng.choice(PHONE),
        {
            "phone": sp.phone(area, "555", line),
            "tollfree": sp.phone("800", "555", line, country="1"),
            "dept": rng.choice(DEPARTMENT),
        },
    )


DATE = (
    "Your appointment is on {weekday}, {date} at {time}.",
    "We're open until {time} tonight.",
    "The technician will arrive between {time} and {time2}.",
    "Your order should arrive on {date}.",
    "Your policy started on {date}, {year}.",
    "I have you down for {weekday} at {time}.",
    "The office opens at {time} on {weekday}.",
    "Your card expires in {month} {year}.",
    "Is {weekday} at {time} good for you?",
    "Your last payment was on {date}.",
    "Can you confirm your date of birth?",
    "My date of birth is {date}, {byear}.",
    "The offer ends on {date}.",
    "We'll call you back tomorrow at {time}.",
)


def dates_times(rng: random.Random) -> Pair:
    y = rng.randint(2015, 2031)
    by = rng.randint(1940, 2006)
    return fill(
        rng.choice(DATE),
        {
            "weekday": rng.choice(WEEKDAY),
            "date": _date(rng),
            "time": _time(rng),
            "time2": _time(rng),
            "month": rng.choice(MONTH),
            "year": (str(y), sp.year(y)),
            "byear": (str(by), sp.year(by)),
        },
    )


ADDRESS = (
    "The address on file is {street}.",
    "I live at {street}, {apt}.",
    "Please ship it to {street} in {city}.",
    "Our office is at {street}, {city}, {state}.",
    "Is your billing address still {street}?",
    "The zip code there is {zip}.",
    "My zip code is {zip}.",
    "We moved to {street}, {city}.",
    "The closest store is on {street}.",
)


def address(rng: random.Random) -> Pair:
    n = rng.choice((rng.randint(1, 99), rng.randint(100, 999), rng.randint(1000, 9999)))
    kind_w, kind_s = rng.choice(STREET_TYPE)
    name = rng.choice(STREET)
    street = (f"{n} {name} {kind_w}", f"{sp.house_number(n)} {name} {kind_s}")
    unit, letter = rng.randint(1, 30), rng.choice("ABCD")
    apt_w, apt_s = rng.choice((("Apartment",) * 2, ("Apt.", "Apartment"), ("Unit",) * 2))
    apt = (f"{apt_w} {unit}{letter}", f"{apt_s} {english.unit(unit, letter)}")
    city, state = rng.choice(CITY)
    return fill(
        rng.choice(ADDRESS),
        {
            "street": street,
            "apt": apt,
            "city": city,
            "state": state,
            "zip": _digit_string(rng, 5),
        },
    )


CODE = (
    "Your confirmation code is {code}.",
    "Your confirmation number is {code}.",
    "Please write down this reference number: {code}.",
    "The tracking number ends in {code4}.",
    "Your account number ends in {digits4}.",
    "Your order number is {digits}.",
    "The verification code we sent you is {digits6}.",
    "Your booking reference is {code}.",
    "That's {last}, spelled {spelled}.",
    "The promo code is {code}.",
)


def codes(rng: random.Random) -> Pair:
    last = rng.choice(LAST)
    return fill(
        rng.choice(CODE),
        {
            "code": _code(rng, rng.randint(5, 7)),
            "code4": _code(rng, 4),
            "digits4": _digit_string(rng, 4),
            "digits6": _digit_string(rng, 6),
            "digits": _digit_string(rng, rng.randint(6, 8)),
            "last": last,
            "spelled": ("-".join(last.upper()), sp.spell(last)),
        },
    )


QA = (
    "Can I have your full name, please?",
    "Sure, it's {full}.",
    "What's the best number to reach you?",
    "How long have you had this problem?",
    "About {n} days now.",
    "Did you try restarting the {device}?",
    "Yes, I restarted it twice.",
    "Do you want to pay the full amount today?",
    "No, just the minimum, please.",
    "Is the account under your name?",
    "No, it's under my {relative}'s name, {full}.",
    "Would you like a receipt by email?",
    "Yes, please send it to my email.",
    "What time works best for you?",
    "Anytime after {time} is fine.",
    "Where should we send the replacement?",
    "Just send it to my home address.",
    "How many people are in your party?",
    "There will be {n} of us.",
    "Will that be all for today?",
    "That's everything, thanks for your help.",
    "Which {product} are you calling about?",
    "The one that ends in {digits4}.",
)


def questions_answers(rng: random.Random) -> Pair:
    return fill(
        rng.choice(QA),
        {
            "full": _full_name(rng),
            "n": _cardinal(rng.randint(2, 12)),
            "device": rng.choice(("router", "modem", "phone", "computer", "cable box")),
            "relative": rng.choice(("wife", "husband", "mother", "father", "son", "daughter")),
            "time": _time(rng),
            "product": rng.choice(PRODUCT),
            "digits4": _digit_string(rng, 4),
        },
    )


# kind -> (share of the generated sentences, generator)
KINDS: dict[str, tuple[float, Callable[[random.Random], Pair]]] = {
    "call": (0.22, call_phrase),
    "number": (0.10, numbers),
    "money": (0.12, money),
    "phone": (0.10, phone_number),
    "date": (0.14, dates_times),
    "address": (0.10, address),
    "code": (0.12, codes),
    "qa": (0.10, questions_answers),
}


def generate(rng: random.Random) -> tuple[str, str, str]:
    """One (kind, written, spoken); the spoken form is passed through the server's own
    normaliser as a safety net (a no-op when every slot gave words)."""
    kinds = list(KINDS)
    kind = rng.choices(kinds, weights=[KINDS[k][0] for k in kinds])[0]
    written, spoken = KINDS[kind][1](rng)
    return kind, written, normalize_english(spoken)
