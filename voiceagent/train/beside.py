"""`train all --side-by-side`: the flow, then the vocoder, train in a second process
while the LM trains in the first (with all the threads once they are done).

The three parts read only the data stages' output, never each other, so none waits for
another. These models are too small to keep two cores busy with torch's threads: on
this project's 2-core machines the LM made 92 steps a minute alone on two threads, and
63 on one thread while the flow made about 120 on the other.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
from pathlib import Path

PARTS = ("flow", "vocoder")  # what the second process trains, in this order


def part_argv(part: str, work: Path, args: argparse.Namespace, threads: int) -> list[str]:
    """The `voiceagent train PART` command line that trains `part` as `train all` would
    with `args` (that part's own budget and step target already in them)."""
    argv = ["train", part, "--out", str(work), "--threads", str(threads)]
    argv += ["--device", str(args.device)]
    if args.budget_min is not None:
        argv += ["--budget-min", str(args.budget_min)]
    if args.until_step is not None:
        argv += ["--until-step", str(args.until_step)]
    if part == "vocoder":
        argv += ["--check", str(args.check)]
    if args.background:
        argv.append("--background")
    return argv


class SideRun:
    """Runs `voiceagent train ...` command lines one after another in child processes
    (their output goes where this process's goes); stops at the first that fails.
    `threads`: this process's share of the threads while they run, and after."""

    def __init__(self, argvs: list[list[str]], threads: tuple[int, int]) -> None:
        self.code = 0
        self._threads = threads
        self._thread = threading.Thread(target=self._run, args=(argvs,), daemon=True)
        self._thread.start()

    def _run(self, argvs: list[list[str]]) -> None:
        for argv in argvs:
            sys.stdout.flush()  # our lines before the child's, where both share a file
            done = subprocess.run([sys.executable, "-m", "voiceagent.cli", *argv], check=False)
            if done.returncode != 0:
                self.code = done.returncode
                return

    def done(self) -> bool:
        return not self._thread.is_alive()

    def threads(self) -> int:
        """The threads this process may train with now."""
        return self._threads[1] if self.done() else self._threads[0]

    def wait(self) -> int:
        """The first failing command's exit code, or 0 once all have succeeded."""
        self._thread.join()
        return self.code
