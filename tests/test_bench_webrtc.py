"""The WebRTC bench's barge-in rule: when the bot counts as cut off by the person."""

from voiceagent.bench.webrtc import CUT_FRAMES, SILENT_RMS, cut_time

LOUD, QUIET = 0.1, SILENT_RMS / 2


def test_the_bot_is_cut_at_the_first_of_enough_silent_frames_after_it_was_heard() -> None:
    levels = [LOUD] * 5 + [QUIET] * 2 + [LOUD] + [QUIET] * CUT_FRAMES
    assert cut_time(levels) == 8  # the short gap at 5-6 is a pause, not the cut


def test_a_bot_not_yet_silent_for_long_enough_is_not_cut() -> None:
    assert cut_time([LOUD] * 3 + [QUIET] * (CUT_FRAMES - 1)) is None


def test_a_track_that_had_run_dry_at_the_onset_is_no_cut() -> None:
    """Silence first (the server's track ran dry on a busy machine), then the bot, then
    its cut: timed from the cut after it was heard, not from the dry spell."""
    assert cut_time([QUIET] * CUT_FRAMES + [LOUD] * 2 + [QUIET] * CUT_FRAMES) == CUT_FRAMES + 2
    assert cut_time([QUIET] * (3 * CUT_FRAMES)) is None  # never heard: cannot be timed
