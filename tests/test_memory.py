"""The engine keeps freed memory in the process (engine/memory.py): buffers a turn frees
are reused by the next one instead of coming back as new pages, each a page fault."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

# A thread that, five times over, reserves 200 buffers of 5 MB and writes a few frames of
# each, as a flow's first chunk writes its keys/values (`flow_encoder.append`), and frees
# them: the page faults of each round, in a fresh process.
PROBE = """
import json, resource, threading, torch
from voiceagent.engine.memory import retain_freed_memory
kept = retain_freed_memory()
faults = []
def rounds():
    for _ in range(5):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        room = [torch.empty(2, 8, 1250, 64) for _ in range(200)]
        for r in room:
            r[:, :, :14] = 1.0
        del room
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
t = threading.Thread(target=rounds)
t.start()
t.join()
print(json.dumps({"kept": kept, "faults": faults}))
"""


def probe(malloc: str | None) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "VOICEAGENT_MALLOC"}
    if malloc:
        env["VOICEAGENT_MALLOC"] = malloc
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_buffers_come_back_without_page_faults():
    kept, system = probe(None), probe("system")
    assert kept["kept"] is True and system["kept"] is False
    first, *later = kept["faults"]
    _, *later_system = system["faults"]
    # the first round touches new pages either way (a page for each of a buffer's 16 rows)
    assert first > 3000
    # later rounds reuse them: measured 1,000-2,300 faults in all against 7,500 with
    # glibc's defaults, which return emptied heaps to the system
    assert sum(later) < 0.5 * sum(later_system)


def test_the_programs_that_run_an_engine_make_the_choice_and_other_commands_do_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_dir: Path
) -> None:
    """A process-wide malloc setting is made by `serve`, `say` and `bench`, not by code
    that embeds the engine (the tests' own in-process servers keep glibc's defaults)."""
    from voiceagent import cli

    calls: list[str] = []
    monkeypatch.setattr(cli, "retain_freed_memory", lambda: calls.append("kept") or True)
    out = str(tmp_path / "x.wav")
    # (an unknown voice ends `say` once the model is loaded, before any synthesis)
    assert cli.main(["say", "hi", "-o", out, "--model", str(tiny_dir), "--voice", "nobody"]) == 2
    assert calls == ["kept"]
    assert cli.main(["make-tiny", str(tmp_path / "tiny")]) == 0
    assert calls == ["kept"]
