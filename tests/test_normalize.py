"""Numbers and symbols become words before the LM sees them."""

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voiceagent.text import english
from voiceagent.text.normalize import chinese_number, english_number, english_ordinal, normalize
from voiceagent.train import corpus, spoken


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


# -- English as a call-center agent reads it (voiceagent/text/english.py) ----------------


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # years after a month and day, a month, or "in"/"since"/"by"...
        (
            "My date of birth is July 13th, 1955.",
            "My date of birth is July thirteenth, nineteen fifty-five.",
        ),
        ("It started on March 3, 2024.", "It started on March third, twenty twenty-four."),
        ("Your card expires in May 2027.", "Your card expires in May twenty twenty-seven."),
        (
            "He moved here in 1990 and has worked with us since 2019.",
            "He moved here in nineteen ninety and has worked with us since twenty nineteen.",
        ),
        (
            "The policy started on 12/05/2008.",
            "The policy started on December fifth, two thousand eight.",
        ),
        ("Rates rose from 2019 to 2021.", "Rates rose from twenty nineteen to twenty twenty-one."),
        ("Music of the 1990s and the '80s.", "Music of the nineteen nineties and the eighties."),
        # codes: a run of five or more digits, or digits with a leading zero, digit by digit
        (
            "The verification code we sent you is 880270.",
            "The verification code we sent you is eight eight zero two seven zero.",
        ),
        ("My zip code is 02134.", "My zip code is zero two one three four."),
        ("Your agent number is 007.", "Your agent number is zero zero seven."),
        # after "ends in", "extension", "PIN", "code", four digits are digits too
        ("The one that ends in 2996.", "The one that ends in two nine nine six."),
        (
            "Call extension 1234 or ext. 567.",
            "Call extension one two three four or extension five six seven.",
        ),
        ("The offer ends in 2025.", "The offer ends in twenty twenty-five."),
        # letters and digits mixed, and capitals that are not a word, letter by letter
        ("Your booking reference is 6W7EKQ.", "Your booking reference is six W seven E K Q."),
        ("Your confirmation code is FVGMJ.", "Your confirmation code is F V G M J."),
        ("The tracking number ends in 4VCF.", "The tracking number ends in four V C F."),
        ("The IRS sent two PDFs.", "The I R S sent two P D Fs."),
        # phone numbers in the groups they are read in
        (
            "Is (332) 555-0163 still the best number for you?",
            "Is three three two, five five five, zero one six three still the best number for you?",
        ),
        (
            "Call 332-555-0163 or 332.555.0163.",
            "Call three three two, five five five, zero one six three"
            " or three three two, five five five, zero one six three.",
        ),
        ("Call +1 332 555 0163.", "Call one, three three two, five five five, zero one six three."),
        (
            "Our toll free number is 1-800-555-0105.",
            "Our toll free number is one eight hundred, five five five, zero one zero five.",
        ),
        ("Dial 555-0163, or 911.", "Dial five five five, zero one six three, or nine one one."),
        # clock times with A M / P M
        ("Your appointment is at 9:08 PM.", "Your appointment is at nine oh eight P M."),
        ("We open at 9:00 AM and close at 6 p.m.", "We open at nine A M and close at six P M."),
        ("Call back after 10am.", "Call back after ten A M."),
        # titles, and street abbreviations in an address
        ("Mrs. Stewart will call you back.", "Missus Stewart will call you back."),
        (
            "Mr. Lee, Ms. Rivera and Dr. Patel are here.",
            "Mister Lee, Miz Rivera and Doctor Patel are here.",
        ),
        (
            "We moved to 5577 Church Dr., Savannah.",
            "We moved to fifty-five seventy-seven Church Drive, Savannah.",
        ),
        (
            "Please ship it to 403 River Blvd. in Portland.",
            "Please ship it to four oh three River Boulevard in Portland.",
        ),
        (
            "The closest store is on 232 Washington Ave.",
            "The closest store is on two thirty-two Washington Avenue.",
        ),
        ("Visit St. Louis.", "Visit Saint Louis."),
        # house and unit numbers with a letter
        ("I live at 58 Elm Lane, Unit 21B.", "I live at fifty-eight Elm Lane, Unit twenty-one B."),
        ("Your seat is 12A, near gate B7.", "Your seat is twelve A, near gate B seven."),
    ],
)
def test_english_is_read_the_way_an_agent_says_it(written, said):
    assert normalize(written, "en") == said
    assert normalize(written, "auto") == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("I have 3 cats.", "I have three cats."),
        (
            "Pay $1,250.50 today.",
            "Pay one thousand two hundred fifty dollars and fifty cents today.",
        ),
        ("It's 25% off.", "It's twenty-five percent off."),
        ("Go to the 3rd floor.", "Go to the third floor."),
        ("We expect 1,000 people.", "We expect one thousand people."),
        ("You have 2024 reward points.", "You have two thousand twenty-four reward points."),
        ("We have stores in 1500 cities.", "We have stores in one thousand five hundred cities."),
        ("It took 10000 steps.", "It took ten thousand steps."),
        ("Gate 305, gate 12.", "Gate three hundred five, gate twelve."),
        ("Please do NOT share your PIN with NASA.", "Please do NOT share your PIN with NASA."),
        ("CALL NOW FOR A FREE QUOTE.", "CALL NOW FOR A FREE QUOTE."),
        ("World War II and Henry VIII.", "World War II and Henry VIII."),
        ("He said OK and I am fine.", "He said OK and I am fine."),
        (
            "Half is 1/2, pages 100-120.",
            "Half is one half, pages one hundred to one hundred twenty.",
        ),
        ("The score was 3-2.", "The score was three-two."),
    ],
)
def test_ordinary_numbers_and_words_keep_their_readings(written, said):
    assert normalize(written, "en") == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # What an outside audit saw (2026-12-05), each the reading before in a comment.
        # A debit read as a credit: "-forty-five dollars and twenty cents".
        ("Your balance is -$45.20.", "Your balance is minus forty-five dollars and twenty cents."),
        ("It was $-45.20 then.", "It was minus forty-five dollars and twenty cents then."),
        ("A change of -2% today.", "A change of minus two percent today."),
        ("It is −5 degrees.", "It is minus five degrees."),
        # a range read as a phone number: "five zero zero, one zero zero zero dollars"
        ("Prices range 500-1000 dollars.", "Prices range five hundred to one thousand dollars."),
        ("Take 3-5 days off.", "Take three to five days off."),
        ("Call 555-1234 today.", "Call five five five, one two three four today."),
        # digits glued to letters: "jsmithforty-two at gmail.com", "fivekg"
        (
            "Write to jsmith42@gmail.com today.",
            "Write to jsmith four two at gmail dot com today.",
        ),
        (
            "Go to https://www.acme-bank.com/help now.",
            "Go to w w w dot acme dash bank dot com slash help now.",
        ),
        ("It weighs 5kg.", "It weighs five kilograms."),
        ("Update to v3.2 first.", "Update to v three point two first."),
        # dates in more forms: "two thousand twenty-four-three-fifteen", "Jan fifteen"
        ("It is due on 2024-03-15.", "It is due on March fifteenth, twenty twenty-four."),
        ("It is due on 3/15/24.", "It is due on March fifteenth, twenty twenty-four."),
        ("It is due Jan 15 at noon.", "It is due January fifteenth at noon."),
        # amounts with a scale or no dollars: "one dollar and fifty cents million"
        ("They raised $1.5 million.", "They raised one point five million dollars."),
        ("A $5k deposit.", "A five thousand dollar deposit."),
        ("It costs $0.50 each.", "It costs fifty cents each."),
        ("It costs $.99 each.", "It costs ninety-nine cents each."),
        ("Gas is $3.999 a gallon.", "Gas is three point nine nine nine dollars a gallon."),
        # huge numbers: "one million trillion trillion"; 5,000 digits raised ValueError
        (
            "It is 1000000000000000000000000000000.",
            "It is " + " ".join(["one"] + ["zero"] * 30) + ".",
        ),
        ("Press # to repeat or * to go back.", "Press pound to repeat or star to go back."),
        ("We are open 24/7.", "We are open twenty-four seven."),
        # grouped digits read as amounts: "one hundred twenty-three-forty-five-six thousand..."
        ("My SSN is 123-45-6789.", "My S S N is one two three, four five, six seven eight nine."),
        ("ZIP 94105-1234.", "ZIP nine four one zero five, one two three four."),
        (
            "Card 4111 1111 1111 1111.",
            "Card four one one one, one one one one, one one one one, one one one one.",
        ),
        ("It is 5 * 3.", "It is five times three."),
        # street types after a street's name, with no house number
        ("It is on Main St Suite 5.", "It is on Main Street Suite five."),
        ("Turn onto 5th Ave. then left.", "Turn onto fifth Avenue then left."),
        ("Call ext 45 now.", "Call extension forty-five now."),
        # time ranges kept their hyphen: "nine o'clock-five o'clock"; international
        # numbers were read as amounts: "plus forty-four twenty seven thousand..."
        ("Open 9:00-5:00 daily.", "Open nine o'clock to five o'clock daily."),
        ("Open 9am-5pm.", "Open nine A M to five P M."),
        ("From 10:30 - 11:15 AM.", "From ten thirty to eleven fifteen A M."),
        ("Meet 10-11 am.", "Meet ten to eleven A M."),
        (
            "Call +44 20 7946 0958 today.",
            "Call plus four four, two zero, seven nine four six, zero nine five eight today.",
        ),
    ],
)
def test_what_an_audit_heard_misread_is_read_right(written, said):
    assert normalize(written, "en") == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # each read before as letters, or as a number and an abbreviation:
        # "one two G B", "twenty-five mph", "seventy-two°F"
        ("Your plan has 12GB of data.", "Your plan has twelve gigabytes of data."),
        ("It ships at 25 mph.", "It ships at twenty-five miles per hour."),
        (
            "It is 72°F, or -5°C inside.",
            "It is seventy-two degrees Fahrenheit, or minus five degrees Celsius inside.",
        ),
        ("The box is 1 lb, the bag 3 lbs.", "The box is one pound, the bag three pounds."),
        ("Wait 3-5 min, or 1 min more.", "Wait three to five minutes, or one minute more."),
        (
            "It is 1.5 km away at 2.4 GHz.",
            "It is one point five kilometers away at two point four gigahertz.",
        ),
        # not units: a code that ends in letters, a million, 5G
        ("Your code is YT9MB.", "Your code is Y T nine M B."),
        ("A $5m loan on 5G.", "A five million dollar loan on five G."),
    ],
)
def test_a_unit_after_a_number_is_said_by_its_name(written, said):
    assert normalize(written) == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # read before as "one-eight hundred-F L O W E R S"
        ("Call 1-800-FLOWERS now.", "Call one eight hundred, flowers now."),
        ("Call 1-800-GOT-JUNK today.", "Call one eight hundred, got junk today."),
        ("Call 888-ALL-4-YOU.", "Call eight eight eight, all four you."),
        # a real number beside it keeps its groups
        ("Or 1-800-555-0105.", "Or one eight hundred, five five five, zero one zero five."),
    ],
)
def test_a_toll_free_number_spelled_as_words_is_said_as_them(written, said):
    assert normalize(written) == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # what an LLM writes in a support answer; each read before as in the comment
        # "four dollars and ninety-nine cents/month"
        ("The fee is $4.99/month.", "The fee is four dollars and ninety-nine cents per month."),
        (
            "From $20/mo. or $200/yr. Call now.",
            "From twenty dollars per month or two hundred dollars per year. Call now.",
        ),
        # "Mon-Fri"
        ("We are open Mon.-Fri., 9am-5pm.", "We are open Monday to Friday, nine A M to five P M."),
        ("Open Tuesday–Saturday.", "Open Tuesday to Saturday."),
        # "sixty-seven" (the star was taken for emphasis), "Press , then pound."
        ("Dial *67 first.", "Dial star six seven first."),
        ("Press *, then #.", "Press star, then pound."),
        # "#A one two three four five"
        ("Order #A12345 shipped.", "Order number A one two three four five shipped."),
        # "four point five/five", "etc." and "i.e." read as letters
        ("Rated 4.5/5 stars.", "Rated four point five out of five stars."),
        ("Cats, dogs, etc. are fine.", "Cats, dogs, et cetera are fine."),
        ("Bring an ID, i.e. a passport.", "Bring an ID, that is a passport."),
        ("E.g. a bill w/ your name.", "For example a bill with your name."),
        ("It is approx. 20 mins away.", "It is approximately twenty minutes away."),
        # "five hundred fifty-five point one two three.four thousand ..."
        ("Call 555.123.4567 now.", "Call five five five, one two three, four five six seven now."),
        ("Or (555) 123-4567.", "Or five five five, one two three, four five six seven."),
        # "U S D fifty", "¥five hundred"
        ("It costs USD 50, or 20 EUR.", "It costs fifty dollars, or twenty euros."),
        ("It is ¥500 or ₹1,200.", "It is five hundred yen or one thousand two hundred rupees."),
        # "ninety s", "Q four two thousand twenty-five", "four hundred one(k)"
        ("The 90s, the '80s.", "The nineties, the eighties."),
        ("In Q4 2025 and FY2024.", "In Q four twenty twenty-five and F Y twenty twenty-four."),
        ("Your 401(k) plan.", "Your four oh one k plan."),
        # "AB-one thousand two hundred thirty-four-CD", "two x"
        ("Ref: AB-1234-CD.", "Ref: A B, one two three four, C D."),
        ("Get 2x points.", "Get two times points."),
        # left alone: a slash with no date word before it, a pair of words, a name with a
        # number
        ("Ratio 12/25 and/or later.", "Ratio twelve/twenty-five and/or later."),
        ("COVID-19 rules.", "COVID-nineteen rules."),
    ],
)
def test_an_llms_shorthand_is_said_in_full(written, said):
    assert normalize(written) == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # a month and day after a word that expects a date; read before as
        # "twelve/twenty-five", "one half"
        ("Payment is due 12/25.", "Payment is due December twenty-fifth."),
        (
            "Closed from 12/24 - 12/26.",
            "Closed from December twenty-fourth to December twenty-sixth.",
        ),
        ("It ships by 1/2.", "It ships by January second."),
        ("Add 1/2 cup.", "Add one half cup."),
        # flight, room and route numbers in pairs; read before as "one thousand two hundred
        # thirty-four", "U A one two three four"
        ("Flight UA 1234 is on time.", "Flight U A twelve thirty-four is on time."),
        ("Your flight DL415 boards.", "Your flight D L four fifteen boards."),
        ("Go to room 1204.", "Go to room twelve oh four."),
        ("Room 12 is free.", "Room twelve is free."),
        ("It is 1000 Main St.", "It is one thousand Main Street."),
        # "no. five thousand ..."
        ("Order no. 5521 shipped.", "Order number five five two one shipped."),
        ("No. 5 is open.", "Number five is open."),
        # read before as "eleven/thirty", "Tue", "Sat and Sun", "N Y", "~five"
        ("Your balance as of 11/30.", "Your balance as of November thirtieth."),
        ("See you Tue, Dec 8.", "See you Tuesday, December eighth."),
        ("Or Wed 12/9.", "Or Wednesday December ninth."),
        ("On Tue. Dec. 8 at noon.", "On Tuesday December eighth at noon."),
        ("Open Sat & Sun. Call us.", "Open Saturday and Sunday. Call us."),
        ("I Sat down in the Sun.", "I Sat down in the Sun."),
        (
            "Mail it to New York, NY 10001.",
            "Mail it to New York, New York one zero zero zero one.",
        ),
        ("The wait is ~5 minutes.", "The wait is about five minutes."),
        # "two point zero.one", "one hundred ninety-two point one hundred sixty-eight..."
        ("Update to version 2.0.1 now.", "Update to version two point zero point one now."),
        ("Ping 192.168.1.1 first.", "Ping one nine two dot one six eight dot one dot one first."),
        # read before as "#C L M, ...", "seventeen o'clock", "five'eleven"", "****one
        # thousand ...", "Dept.", "pound: eight ..."
        (
            "Claim #CLM-2024-00123 is paid.",
            "Claim number C L M, two zero two four, zero zero one two three is paid.",
        ),
        ("We close at 17:30 today.", "We close at five thirty P M today."),
        ("He is 5'11\" tall.", "He is five foot eleven tall."),
        ("Card ****1234 or XXXX-XXXX-5678.", "Card one two three four or five six seven eight."),
        ("Call the Dept. of Labor.", "Call the Department of Labor."),
        ("Ref #: 88123, P.O. Box 12.", "Ref number: eight eight one two three, P O Box twelve."),
        # read before as "fifteen percentminus twenty percent", "fifty to sixty%", "fifty
        # dollars-one hundred dollars", "US$twenty", "one:one", "Jan-Mar", "ET"
        (
            "You save 15%-20%, or 50-60% off.",
            "You save fifteen to twenty percent, or fifty to sixty percent off.",
        ),
        (
            "It costs $50-$100, or US$20.",
            "It costs fifty dollars to one hundred dollars, or twenty dollars.",
        ),
        ("A 1:1 match at 1:30.", "A one to one match at one thirty."),
        ("Open Jan-Mar, 9 AM to 5 PM ET.", "Open January to March, nine A M to five P M E T."),
    ],
)
def test_dates_days_places_and_versions_are_said_as_people_say_them(written, said):
    assert normalize(written) == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # After "a" and before the noun it describes, an amount is said in the singular
        # (read before as "a fifty dollars gift card", "an eight feet wall").
        ("A $50 gift card is yours.", "A fifty dollar gift card is yours."),
        (
            "You get a $5 credit and an $8 refund.",
            "You get a five dollar credit and an eight dollar refund.",
        ),
        ("It is a $1.5 million deal.", "It is a one point five million dollar deal."),
        ("There is a $0.50 fee.", "There is a fifty cent fee."),
        ("There is a $2.50 fee.", "There is a two dollar fifty fee."),
        ("It is an 8 ft wall and a 2 lb bag.", "It is an eight foot wall and a two pound bag."),
        (
            "Pick a 5 GB plan for a 100 mph ride.",
            "Pick a five gigabyte plan for a one hundred mile per hour ride.",
        ),
        # not after an article, not before a noun, or a plan's name: as before
        ("We charge $50 for that.", "We charge fifty dollars for that."),
        ("Plan A $50 a month.", "Plan A fifty dollars a month."),
        ("It costs a total of $50.", "It costs a total of fifty dollars."),
        ("Add a 5 GB.", "Add a five gigabytes."),
        ("That is a $1 fee.", "That is a one dollar fee."),
        # "No." after what is numbered is "number" (read before as "Account. No.")
        ("Your Acct. No. is 55.", "Your Account number is fifty-five."),
        ("Give me the Policy No. please.", "Give me the Policy number please."),
        ("Say your Order No.", "Say your Order number."),
        ("No. That is not it.", "No. That is not it."),
        ("Model # XR-500", "Model number X R, five zero zero"),
        # (the rule that says what "ends in" a number belongs to, kept: not a year)
        ("Your account number ends in 1890.", "Your account number ends in one eight nine zero."),
        # a code after a numbered thing, and a word spelled with hyphens: as the corpus
        # says them (was "thirty-six fifty-four G", "C-A-R-T-E-R")
        (
            "Your confirmation number is 3654G.",
            "Your confirmation number is three six five four G.",
        ),
        ("Reference number: 3968S.", "Reference number: three nine six eight S."),
        ("That's Carter, spelled C-A-R-T-E-R.", "That's Carter, spelled C A R T E R."),
        # a scale letter after a number (was "one.two M people"); 4K stays
        (
            "About 1.2M people, 10M users, 1.5K steps.",
            "About one point two million people, ten million users, one point five thousand steps.",
        ),
        (
            "A 4K TV for a 5K run, by 3.5B.",
            "A four K TV for a five K run, by three point five billion.",
        ),
        ("He's 35 y/o.", "He's thirty-five years old."),
        # was "zero by eight ...", 'ten" x twelve"', "three euros,fifty", "thx"
        ("Error 0x80070005.", "Error zero x eight zero zero seven zero zero zero five."),
        ('It is 10" x 12", a 1" gap.', "It is ten inches by twelve inches, a one inch gap."),
        ('Press the "5" key.', 'Press the "five" key.'),
        ("It is €3,50 or €1,000.", "It is three euros and fifty cents or one thousand euros."),
        ("Call me, thx. Pls wait.", "Call me, thanks. Please wait."),
        # was "M-F nine-five", "(...four thousand ...)", "reference pound is", "() minus
        # one thousand ...", "MM/DD/Y Y Y Y"
        (
            "Open M-F 9-5 EST, daily 8-4.",
            "Open Monday to Friday nine to five E S T, daily eight to four.",
        ),
        ("The score was 3-2.", "The score was three-two."),
        ("Checking (...4821) or …9910.", "Checking (four eight two one) or nine nine one zero."),
        ("Your reference # is A7-K2-9Q.", "Your reference number is A seven, K two, nine Q."),
        (
            "A code went to (***) ***-1234, SSN ***-**-6789.",
            "A code went to one two three four, S S N six seven eight nine.",
        ),
        ("Your DOB (MM/DD/YYYY), please.", "Your D O B (month, day, year), please."),
        (
            "The number is 150, an e-mail, A-B tests.",
            "The number is one hundred fifty, an e-mail, A-B tests.",
        ),
        # letters, a hyphen and three or more digits: a code (was "I N C-four thousand
        # eight hundred twenty-one"); two digits stay a number
        (
            "Ticket INC-4821, error E-404.",
            "Ticket I N C, four eight two one, error E, four zero four.",
        ),
        ("Take I-95 north.", "Take I-ninety-five north."),
        # a year between "my", "the" ... and what it dates (was "two thousand nineteen")
        (
            "My 2019 Honda and the 2020 election.",
            "My twenty nineteen Honda and the twenty twenty election.",
        ),
        ("Our 2024 plan", "Our twenty twenty-four plan"),
        (
            "The 1999 students and 2019 cars.",
            "The one thousand nine hundred ninety-nine students and two thousand nineteen cars.",
        ),
        # a country code, then a pause (was "one four one five, ..."); an even split
        ("Call +1 (415) 555-0100.", "Call one, four one five, five five five, zero one zero zero."),
        ("Call 1-800-555-0105.", "Call one eight hundred, five five five, zero one zero five."),
        ("That is 50/50.", "That is fifty-fifty."),
        # was "twelve/fifteen", "six' tall", "Ch. five", "Mt. Hood", "a.k.a."
        ("I booked it for 12/15 at 3pm.", "I booked it for December fifteenth at three P M."),
        ("I am 6' tall, by a 2' gap.", "I am six feet tall, by a two foot gap."),
        ("Read Ch. 5, pp. 10-12.", "Read Chapter five, pages ten to twelve."),
        (
            "Mt. Hood, a.k.a. Wy'east, and Martin Jr.",
            "Mount Hood, also known as Wy'east, and Martin Junior.",
        ),
        ("It's '6' or '7'.", "It's 'six' or 'seven'."),
        # a 24-hour range's morning start, and midnight's hour (was "eight o'clock to
        # five P M", "zero thirty")
        ("Hours: 8:00-17:00, or 00:30.", "Hours: eight A M to five P M, or twelve thirty A M."),
        ("Open 9:00 to 11:30.", "Open nine o'clock to eleven thirty."),
        # was "abc one hundred twenty-three", "Suite two hundred ten", "x eighty-nine",
        # "cents/lb", "a four hundred one k"
        ("Password: abc123, user jsmith42.", "Password: abc one two three, user jsmith four two."),
        ("It's in Suite 210.", "It's in Suite two ten."),
        (
            "Call (555) 123-4567 x89.",
            "Call five five five, one two three, four five six seven extension eight nine.",
        ),
        (
            "It is $12.50/lb or 2/kg.",
            "It is twelve dollars and fifty cents per pound or two per kilogram.",
        ),
        ("Open a 401k or a 403b.", "Open a four oh one k or a four oh three b."),
        (
            "A 1920x1080 screen, 5 x 3.",
            "A one thousand nine hundred twenty by one thousand eighty screen, five by three.",
        ),
    ],
)
def test_amounts_codes_years_and_numbered_things_are_said_as_people_say_them(written, said):
    assert normalize(written) == said


def test_thousands_of_digits_are_read_digit_by_digit_without_raising():
    said = normalize("9" * 5000 + " and " + "1" + "0" * 5000, "en")
    assert said.split().count("nine") == 5000 and said.split().count("zero") == 5000


RUNS = [*"-.,1aA /:'\"$#*|()x_\n", "1-", "1.", "1,", "A-", "X-", "a ", "1 ", "A1", "1A", "- "]
RUNS += [". ", "1:", "$1", "1/", "Mt. ", "a $1 ", "1'", '1"', "| ", "--- | ", "-- ", "1 x", "€1,"]


@pytest.mark.timeout(60)
def test_no_run_of_one_pattern_takes_exponential_time():
    """What was seen: 40 x's (or asterisks) in a turn's text held the event loop for
    seconds, 50 for minutes: the masked-number pattern split the run every way it could
    (so did a table rule's on a run of dashes). A segment is at most 200 characters."""
    for unit in RUNS:
        for end in ("", "!", "x", "1", "."):
            for language in ("en", "zh"):
                assert normalize(unit * (200 // len(unit)) + end, language) is not None
    for text in ("-" * 200 + "x", "| " + "--- | " * 200 + "x", "|" + " a |" * 5000):
        assert normalize(text, "en")


def test_a_spoken_form_is_left_as_it_is():
    """The LM's training reads the corpus's spoken forms through normalize again."""
    for said in (
        "six W seven E K Q, nine oh eight P M, Missus Stewart",
        "three three two, five five five, zero one six three",
    ):
        assert normalize(said, "en") == said


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # An LLM's markdown: its symbols reached the LM as tokens it never learned
        ("**Great news.** Your refund is ready.", "Great news. Your refund is ready."),
        ("**Great news.", "Great news."),  # a bold cut by the segmenter
        ("It is _really_ done.", "It is really done."),
        ("# Your order", "Your order"),
        ("- Bring your ID", "Bring your ID"),
        ("Run `reset` now.", "Run reset now."),
        ("See [our help page](https://example.com/help).", "See our help page."),
        (
            "Keep snake_case and 5*3 and press * now.",
            "Keep snake_case and five times three and press star now.",
        ),
        # a table: its rule line goes, its cells are read with a pause between
        ("| Plan | Price |\n|---|:---:|\n| Basic | $5 |", "Plan, Price\nBasic, five dollars"),
        # emoji are no speech
        ("Sure! 😊 I can help 👍🏽.", "Sure! I can help."),
    ],
)
def test_markdown_is_read_as_the_words_it_marks(written, said):
    assert normalize(written, "en") == said


def test_chinese_years_and_long_numbers_are_read_digit_by_digit():
    assert normalize("2024年，电话13812345678，共1,234元", "zh") == (
        "二零二四年，电话一三八一二三四五六七八，共一千二百三十四元"
    )


@pytest.mark.parametrize(
    ("written", "said"),
    [
        # each read before as a cardinal, or with its symbols left in:
        # "一千二百三十四万五千六百七十八", "¥九十九点五零", "三:三十", "四百-一百二十三-..."
        ("您的订单号是12345678。", "您的订单号是一二三四五六七八。"),
        ("验证码：482913，尾号0042", "验证码：四八二九一三，尾号零零四二"),
        ("金额为¥99.50，或￥20", "金额为九十九点五元，或二十元"),
        (
            "会议在下午3:30开始，9:05结束，10:00见",
            "会议在下午三点三十分开始，九点零五分结束，十点见",
        ),
        (
            "请拨打400-123-4567或010-12345678",
            "请拨打四零零，一二三，四五六七或零一零，一二三四五六七八",
        ),
        ("温度是-5°C，水温25°C", "温度是零下五摄氏度，水温二十五摄氏度"),
        ("余额-20元", "余额负二十元"),
        ("日期2024-03-15，或2024/3/5", "日期二零二四年三月十五日，或二零二四年三月五日"),
        ("需要3-5天", "需要三到五天"),
        ("价格$5，或€10", "价格五美元，或十欧元"),
        ("比分是3:2，时间2:45:30", "比分是三比二，时间两点四十五分三十秒"),
        ("3号楼，3月5号，房间号是1204", "三号楼，三月五号，房间号是一二零四"),
    ],
)
def test_chinese_is_read_as_a_chinese_agent_says_it(written, said):
    assert normalize(written, "zh") == said


def test_japanese_and_korean_are_left_to_the_model_not_read_as_english():
    # What was seen: "りんごを3つ" became "りんごをthreeつ"
    assert normalize("りんごを3つ", "auto") == "りんごを3つ"
    assert normalize("사과 3개", "auto") == "사과 3개"


def test_other_languages_keep_their_normalization():
    assert normalize("Mr. Smith, (332) 555-0163, 12/05/1990, FVGMJ.", "de") == (
        "Mr. Smith, (332) 555-0163, 12/05/1990, FVGMJ."
    )
    assert normalize("共12人，1990年", "zh") == "共十二人，一九九零年"  # a year: digit by digit


def _words(text: str) -> list[str]:
    """Lower-case words, punctuation ignored ('twenty-one' is two words)."""
    return re.sub(r"[^a-z' ]", " ", text.lower()).split()


def test_the_server_reads_the_training_corpus_as_the_teacher_says_it():
    """The server's reading of each corpus sentence's written form is its spoken form (what
    the teacher voice says and the LM learned), in at least 95 % of sentences."""
    train, heldout = corpus.build(corpus.Params())
    for sentences in (train, heldout):
        agree = sum(_words(normalize(s.written, "auto")) == _words(s.text) for s in sentences)
        assert agree / len(sentences) >= 0.95


def test_the_reading_rules_are_one_implementation_for_server_and_corpus():
    """voiceagent/text never imports voiceagent/train; the corpus's spoken forms come from
    voiceagent/text/english.py."""
    text_dir = Path(english.__file__).parent
    for path in text_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                assert "train" not in module.split("."), f"{path.name} imports {module}"
    for name in ("digits", "spell", "year", "house_number"):
        assert getattr(spoken, name) is getattr(english, name)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                *"0123456789$€£%-−/.,:*#@ aAkMB\n",
                "9" * 40,
                "1" + "0" * 4400,
                " million",
                "Jan ",
                "www.",
            ]
        ),
        max_size=80,
    ).map("".join)
)
def test_any_mix_of_digits_and_symbols_is_read_without_raising(text):
    said = normalize(text, "en")
    assert not any(c.isdigit() for c in said), (text, said)


def test_no_reading_rule_is_defined_twice():
    """Two module-level patterns of one name: the later silently replaces the earlier
    wherever it is used (it once made "ends in 1890" a year)."""
    import ast
    from collections import Counter
    from pathlib import Path

    import voiceagent.text

    for path in Path(voiceagent.text.__file__).parent.glob("*.py"):
        names = Counter(
            target.id
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        )
        assert [n for n, k in names.items() if k > 1] == [], path
