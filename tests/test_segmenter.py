"""The segmenter starts synthesis early and never cuts inside numbers or words."""

from voiceagent.text.segmenter import Segmenter, SegmenterConfig


def feed(pieces, end=True):
    seg = Segmenter()
    out = []
    for p in pieces:
        out += seg.push(p)
    return out + (seg.flush() if end else [])


def test_whole_text_splits_at_sentences():
    assert feed(["Hello there. How are you? Fine!"]) == ["Hello there.", "How are you?", "Fine!"]


def test_first_segment_may_end_at_a_clause_once_long_enough():
    out = feed(["Well, thanks for calling, I can help you with that today. Sure, ok."])
    assert out[0] == "Well, thanks for calling,"
    assert out[1] == "I can help you with that today."
    assert out[2] == "Sure, ok."  # later segments end at sentences only


def test_a_mark_waits_for_the_next_character():
    seg = Segmenter()
    assert seg.push("It costs 3.") == []  # could be 3.5
    assert seg.push("5 dollars. Then") == ["It costs 3.5 dollars."]
    assert seg.flush() == ["Then"]


def test_llm_style_deltas_give_the_same_segments_as_whole_text():
    text = "Sure. Your flight leaves at 9:40, gate 12. Anything else?"
    deltas = [text[i : i + 3] for i in range(0, len(text), 3)]
    assert feed(deltas) == feed([text])


def test_chinese_marks_cut_without_spaces():
    assert feed(["你好。今天天气很好！"]) == ["你好。", "今天天气很好！"]


def test_long_text_without_marks_is_cut_at_a_space():
    seg = Segmenter(SegmenterConfig(max_chars=20))
    out = seg.push("word " * 10)
    assert out and all(len(s) <= 20 for s in out)
    assert " ".join(out + seg.flush()).split() == ["word"] * 10


def test_nothing_is_emitted_for_whitespace():
    assert feed(["   ", "\n "]) == []


def test_a_newline_ends_a_sentence():
    assert feed(["Ok\nNext line"]) == ["Ok", "Next line"]


def test_a_title_or_a_short_month_does_not_end_a_sentence():
    assert feed(["Please ask for Dr. Jones at St. Mary's. Thanks."]) == [
        "Please ask for Dr. Jones at St. Mary's.",
        "Thanks.",
    ]
    out = feed(["Your payment is due Jan. 5. Call us."])
    assert out == ["Your payment is due Jan. 5.", "Call us."]


def test_an_initialism_ends_a_sentence_only_before_a_capital():
    out = feed(["Open until 5 p.m. on weekdays. Bye."])
    assert out == ["Open until 5 p.m. on weekdays.", "Bye."]
    assert feed(["We close at 5 p.m. Call back tomorrow."]) == [
        "We close at 5 p.m.",
        "Call back tomorrow.",
    ]
    seg = Segmenter()
    assert seg.push("Take forms, e.g. ") == []  # what follows decides
    assert seg.push("a letter.") == []
    assert seg.flush() == ["Take forms, e.g. a letter."]


def test_the_comma_of_a_date_or_a_number_pair_is_not_a_clause():
    # the first segment may end at a clause, but not between "July 13th," and its year
    out = feed(["We opened on July 13th, 1955 in Chicago, and never closed."])
    assert out[0] == "We opened on July 13th, 1955 in Chicago,"
    deltas = ["We opened on July 13th,", " ", "1955 in Chicago, and never closed."]
    assert feed(deltas) == out
