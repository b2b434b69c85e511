"""`voiceagent bench`: one module per scenario, and the clients they (and the tests) use.

ws.py       --scenario ws: TTFA and RTF over WebSocket, streaming vs the baseline
webrtc.py   --scenario webrtc: real-time sessions and barge-in latency over WebRTC
telephony.py --scenario telephony: simulated Twilio calls with bots, barge-in, CPU
flood.py    --scenario flood: another session's TTFA and late frames during a flood
cutoff.py   --scenario cutoff: the work a turn costs when a barge-in cuts it off
soak.py     --scenario soak: server RSS, fds, threads, tasks over many sessions and hours
chunks.py   --scenario chunk-cost: flow + vocoder time of an early vs a late chunk
first_packet.py --scenario first-packet: TTFA cut into slices, baseline vs optimized
tenants.py  --scenario tenants: one tenant's TTFA while another floods up to its quotas
isolation.py --scenario isolation: invariant vs batched acoustic, cost and bit differences
speech_api.py --scenario openai: POST /v1/audio/speech, first byte vs whole file
intelligibility.py --scenario intelligibility: held-out sentences' WER, ours vs the teacher
clients.py  WebSocket client, aiortc peer, paced microphone track
clips.py    speech to send: espeak-ng, a synthetic vowel
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..model.checkpoint import load_model


def run_bench(args: argparse.Namespace) -> int:
    for name in ("voiceagent", "aioice", "aiortc", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if args.scenario == "chunk-cost":
        from . import chunks

        model = load_model(args.model or str(chunks.ensure_full_random()), args.device)
        report = chunks.measure(model, repeats=args.repeats)
        text = chunks.table(report)
    elif args.scenario == "first-packet":
        from . import chunks, first_packet

        model = load_model(args.model or str(chunks.ensure_full_random()), args.device)
        report = first_packet.measure(model, turns=args.turns)
        text = first_packet.table(report)
    elif args.scenario == "isolation":
        from . import isolation

        model = load_model(args.model, args.device)
        levels = [int(x) for x in (args.sessions or "1,8").split(",")]
        report = isolation.measure(model, levels, args.turns, args.lead_ms, args.repeats)
        text = isolation.table(report)
    elif args.scenario == "cutoff":
        from . import cutoff

        model = load_model(args.model, args.device)
        report = cutoff.measure(model, max_ahead_ms=args.max_ahead_ms)
        text = cutoff.table(report)
    elif args.scenario == "telephony":
        from . import telephony

        model = load_model(args.model, args.device)
        levels = [int(x) for x in (args.sessions or "1,2,4,8,12,16").split(",")]
        report = telephony.measure(
            model,
            levels,
            telephony.Options(turns=args.turns),
            lead_ms=args.lead_ms,
            max_speech_s=args.max_speech_s or 3.0,
            max_ahead_ms=args.max_ahead_ms,
        )
        text = telephony.table(report)
    elif args.scenario == "flood":
        from . import flood

        report = flood.measure(args.model, turns=args.turns)
        text = flood.table(report)
    elif args.scenario == "soak":
        from . import soak

        soak_opts = soak.Options(
            cycles=args.cycles,
            minutes=args.minutes,
            sessions=int(args.sessions or 4),
            webrtc_sessions=args.webrtc_sessions,
            max_speech_s=args.max_speech_s or 1.5,
            max_ahead_ms=args.max_ahead_ms,
        )
        report = soak.measure(args.model, soak_opts, Path(args.out) if args.out else None)
        text = soak.table(report)
        if args.json:
            print(f"soak output: {report['out']}", file=sys.stderr)
    elif args.scenario == "tenants":
        from . import tenants

        report = tenants.measure(load_model(args.model, args.device), turns=args.turns)
        text = tenants.table(report)
    elif args.scenario == "openai":
        from . import speech_api

        report = speech_api.measure(load_model(args.model, args.device), turns=args.turns)
        text = speech_api.table(report)
    elif args.scenario == "intelligibility":
        from ..train.commands import DEFAULT_WORK
        from . import intelligibility

        work = Path(args.work) if args.work else DEFAULT_WORK
        try:
            intelligibility.heldout(work, args.sentences)  # before loading a model
            intelligibility.check_recognizer()
            report = intelligibility.measure(
                load_model(args.model, args.device),
                work,
                sentences=args.sentences,
                max_speech_s=args.max_speech_s or intelligibility.MAX_SPEECH_S,
                seeds=args.seeds,
            )
        except intelligibility.BenchError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        text = intelligibility.table(report)
    elif args.scenario == "webrtc":
        from . import webrtc

        levels = [int(x) for x in (args.sessions or "1,2,4,8,12,16").split(",")]
        opts = webrtc.Options(client_prefetch=args.client_prefetch, max_ahead_ms=args.max_ahead_ms)
        report = webrtc.measure(args.model, levels, opts, args.max_speech_s or 3.0)
        text = webrtc.table(report)
    else:
        from ..engine.sglang.client import SGLangLM
        from . import ws

        model = load_model(args.model, args.device)
        levels = [int(x) for x in (args.sessions or "1,8").split(",")]
        factory = None
        if args.sglang_url:
            url, export = args.sglang_url, Path(args.sglang_export)

            def factory() -> SGLangLM:
                return SGLangLM(model, url, export)

        max_segment_tokens = int((args.max_speech_s or 60.0) * 25)
        report = ws.measure(model, levels, args.turns, args.lead_ms, max_segment_tokens, factory)
        text = ws.table(report)
    print(json.dumps(report) if args.json else text)
    sys.stdout.flush()
    return 0
