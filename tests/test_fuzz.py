"""Coverage-guided fuzzing of every parser that takes bytes from outside, bounded in time.

Each target in fuzz_targets.py (the session's JSON and binary messages, the WebRTC offer,
the carriers' media streams, AudioSocket, chan_websocket control, a call's bot) runs
under atheris (libFuzzer) in its own process for FUZZ_SECONDS, from its seed corpus in
tests/data/fuzz/<target>/ and the tokens of <target>.dict. A crash (an exception the
parser's contract does not allow, or a failed check) fails the test with the input.

The inputs that once crashed a target are kept below as regression tests, and sit in the
seed corpora too, so each fuzz run starts from them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fuzz_targets import CORPUS, TARGETS

FUZZ_SECONDS = int(os.environ.get("VOICEAGENT_FUZZ_SECONDS", "6"))
MAX_LEN = 8192  # bytes per input: room for JSON nested deeper than Python's recursion limit
SCRIPT = Path(__file__).with_name("fuzz_targets.py")
ROOT = SCRIPT.parent.parent


# What a target once crashed on (minimized by hand where the fuzzer's input was long),
# each fixed since. `found`: by the fuzzer, or by reading the parser while writing its
# target (then the fuzzer's target checks it from its seed on).
REGRESSIONS: list[tuple[str, str, bytes]] = [
    (
        "asterisk_control",
        "found: JSON 1e400 as an integer field (OverflowError from int(inf))",
        b'{"event":"STATUS","queue_length":31e400,"xon_level":800,"xoff_level":900,'
        b'"queue_full":false,"bulk_media":false,"md":true}',
    ),
    (
        "asterisk_control",
        "read: a list where an integer goes (TypeError from int([]))",
        b'{"event":"MEDIA_START","connection_id":"c","channel":"c","format":"ulaw",'
        b'"optimal_frame_size":[160],"ptime":20}',
    ),
    (
        "asterisk_control",
        "read: channel_variables not an object (TypeError from dict(5))",
        b'{"event":"MEDIA_START","connection_id":"c","channel":"c","format":"ulaw",'
        b'"optimal_frame_size":160,"ptime":20,"channel_variables":5}',
    ),
    (
        "asterisk_control",
        "read: JSON nested past the recursion limit (RecursionError)",
        b'{"event":"ERROR","error_text":' + b"[" * 1500 + b"]" * 1500 + b"}",
    ),
    (
        "media_streams",
        "found: Twilio start with sampleRate 1e400 (OverflowError from int(inf))",
        b'\x01{"event":"start","streamSid":"MZ1","start":{"mediaFormat":'
        b'{"encoding":"audio/x-mulaw","sampleRate":1e400}}}',
    ),
    (
        "media_streams",
        "read: a carrier message nested past the recursion limit (RecursionError)",
        b'\x01{"event":"media","media":' + b"[" * 1500 + b"]" * 1500 + b"}",
    ),
    (
        "audiosocket",
        "found: a DTMF packet whose byte is not ASCII (UnicodeDecodeError)",
        b"\xff\x01\x00\x10" + bytes(range(16)) + b"\x03\x00\x01\xb1",
    ),
    (
        "audiosocket",
        "found: an audio packet of odd length (np.frombuffer's ValueError in the call)",
        b"\x02\x01\x00\x10\x00\x01\x00\x00\x00\x16\x06\x00\x04\x00\x00\x00\x00\x00\x00\x00"
        b"\x10\x00\x01\x04\x02\x03\x05\x07\x08\x01",
    ),
    (
        "call_bot",
        "found: session.attach nested past the recursion limit (RecursionError)",
        b'{"type":"session.attach","token":' + b"[" * 1500 + b"]" * 1500 + b"}",
    ),
    (
        "session_text",
        "found (session_json): an integer past 1e308 for a float setting (OverflowError)",
        b'{"type":"session.start","speed":-' + b"9" * 400 + b"}",
    ),
    (
        "session_json",
        "found: the fuzzer's own input for the above, through hostile_json",
        b"\x00\x00\x00\x00+\x87\x8b\x14\\\x8aB\xd8\x84\xcfL\xfd\xa7-\x00\x00\x00\x00\x00"
        b"\x00\x00\x00\x00\x00\xc4\t\x80\x12yyyyyyyWyyyyyyyyyy\xc4\xd6I<\x9d\\6=\xbe1 ",
    ),
]


@pytest.mark.parametrize(
    ("name", "data"), [(r[0], r[2]) for r in REGRESSIONS], ids=[r[1] for r in REGRESSIONS]
)
def test_an_input_that_once_crashed_passes_its_target(name: str, data: bytes) -> None:
    TARGETS[name].setup()(data)
    kept = [p.read_bytes() for p in corpus_files(name) if p.name.startswith("regression-")]
    assert data in kept, f"also keep it in the seed corpus: tests/data/fuzz/{name}/regression-*"


def corpus_files(name: str) -> list[Path]:
    return sorted(p for p in (CORPUS / name).iterdir() if p.is_file())


def _crash_report(log: str) -> str:
    """The traceback and libFuzzer's summary, without the instrumentation chatter."""
    lines = [ln for ln in log.splitlines() if not ln.startswith(("INFO: Instrumenting", "#"))]
    return "\n".join(lines)[-5000:]


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_seed_corpus_passes_its_target(name: str) -> None:
    """Every seed (valid messages, and the inputs that once crashed) passes the checks
    without atheris, so a crash reproduces in a plain test run."""
    check = TARGETS[name].setup()
    files = corpus_files(name)
    assert len(files) >= 3, f"{name}: seed corpus too small"
    for path in files:
        check(path.read_bytes())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_target_finds_no_crash(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("atheris", reason="atheris is in the test extras")
    found = tmp_path / "corpus"  # what this run adds; the seeds stay as they are
    found.mkdir()
    flags = [
        f"-max_total_time={FUZZ_SECONDS}",
        f"-max_len={MAX_LEN}",
        "-timeout=10",  # seconds for one input: a hang is a finding too
        "-rss_limit_mb=2048",
        f"-artifact_prefix={tmp_path}/",
        "-print_final_stats=1",
    ]
    dictionary = CORPUS / f"{name}.dict"
    if dictionary.exists():
        flags.append(f"-dict={dictionary}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPT.parent)])}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), name, *flags, str(found), str(CORPUS / name)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=FUZZ_SECONDS + 120,
    )
    took = time.monotonic() - start
    log = proc.stdout + proc.stderr
    artifacts = sorted(tmp_path.glob("crash-*")) + sorted(tmp_path.glob("timeout-*"))
    artifacts += sorted(tmp_path.glob("oom-*"))
    if artifacts or proc.returncode != 0:
        found_input = artifacts[0].read_bytes() if artifacts else b"(none written)"
        pytest.fail(
            f"fuzz target {name} crashed (exit {proc.returncode}) on input "
            f"{found_input[:400]!r} ({len(found_input)} bytes)\n{_crash_report(log)}"
        )
    runs = re.search(r"Done (\d+) runs in (\d+) second", log)
    assert runs, log[-3000:]
    cov = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", log)
    with capsys.disabled():
        print(
            f"\nfuzz {name}: {int(runs[1])} executions in {runs[2]} s "
            f"({took:.0f} s with start-up), coverage {cov[-1][0] if cov else '?'} edges, "
            f"corpus {cov[-1][2] if cov else '?'} inputs, 0 crashes"
        )
    assert int(runs[1]) > 100, "the target hardly ran"
