"""Prometheus metrics (prometheus-client), one registry per server.

Labels stay low-cardinality: a transport name, an outcome, an error code, a pipeline
stage. Never a session or turn id: those belong in logs. The session runner feeds the
turn and error metrics from the protocol events it sends (`observe_event`), so what an
operator counts is exactly what clients were told.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_LATEST  # of the text exposition format

# Time to first audio: fine steps where a voice agent lives (50-500 ms), coarse beyond.
TTFA_BUCKETS = (
    0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3,
    0.35, 0.4, 0.45, 0.5, 0.6, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
)  # fmt: skip
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0)
# (up to 5 s: CosyVoice2-0.5B's first flow chunk takes 1-2 s on a CPU, and a batch more)
CHUNK_BUCKETS = (
    0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0,
)  # fmt: skip
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def turn_outcome(event: dict[str, Any]) -> str | None:
    """The outcome of the turn a protocol event ends (None: the event ends no turn):
    done, cancelled (by the client), barge_in (the listener's speech) or failed. A turn
    dropped because its session closed is counted as "closed" by the runner."""
    kind = event.get("type")
    if kind == "turn.done":
        return "done"
    if kind == "turn.cancelled":
        return "barge_in" if event.get("reason") == "barge_in" else "cancelled"
    if kind == "error" and event.get("turn_id") is not None:
        return "failed"
    return None


class GpuMemory(Collector):
    """Memory torch holds on each CUDA device (nothing on a CPU-only machine)."""

    def collect(self) -> Iterable[Metric]:
        import torch

        if not torch.cuda.is_available():
            return []
        family = GaugeMetricFamily(
            "voiceagent_gpu_memory_bytes",
            "GPU memory held by this process's torch, by device and kind",
            labels=["device", "kind"],
        )
        for i in range(torch.cuda.device_count()):
            family.add_metric([str(i), "allocated"], torch.cuda.memory_allocated(i))
            family.add_metric([str(i), "reserved"], torch.cuda.memory_reserved(i))
        return [family]


class Runtime(Collector):
    """Threads alive in the process, and tasks of the event loop /metrics is served on.

    The task count needs the loop's thread: asyncio.all_tasks() is not thread-safe and
    another thread has no running loop; collected from elsewhere (a test, a scrape thread)
    the family is simply left out, as with the GPU gauge on a CPU machine."""

    def collect(self) -> Iterable[Metric]:
        threads = GaugeMetricFamily("voiceagent_threads", "Threads alive in the process")
        threads.add_metric([], threading.active_count())
        try:
            tasks = len(asyncio.all_tasks())  # raises RuntimeError without a running loop
        except RuntimeError:
            return [threads]
        family = GaugeMetricFamily(
            "voiceagent_asyncio_tasks", "Unfinished asyncio tasks of the server's event loop"
        )
        family.add_metric([], tasks)
        return [threads, family]


class Metrics:
    """Every metric voiceagent exports. Thread-safe (the LM and acoustic threads write)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes, cpu seconds, fds
        r.register(GpuMemory())
        r.register(Runtime())
        self.info = Info("voiceagent", "Model and engine this server runs", registry=r)

        # sessions and admission
        self.sessions_active = Gauge(
            "voiceagent_sessions_active", "Open sessions", ["transport"], registry=r
        )
        self.sessions = Counter("voiceagent_sessions", "Sessions opened", ["transport"], registry=r)
        self.refused = Counter(
            "voiceagent_admission_refused",
            "Sessions or turns refused at admission, by reason",
            ["reason"],
            registry=r,
        )
        self.closed = Counter(
            "voiceagent_sessions_closed",
            "Sessions the server closed on its own, by reason (rate_limited, "
            "session_start_timeout, idle_timeout, slow_consumer)",
            ["reason"],
            registry=r,
        )
        self.turns_active = Gauge(
            "voiceagent_turns_active", "Live turns (synthesizing or playing)", registry=r
        )
        self.ready = Gauge("voiceagent_ready", "1 while /readyz says ready, else 0", registry=r)
        self.draining = Gauge(
            "voiceagent_draining", "1 after SIGTERM, while live turns finish", registry=r
        )

        # turns, as clients saw them
        self.ttfa = Histogram(
            "voiceagent_ttfa_seconds",
            "Time from a turn's first text to its first audio frame sent",
            ["transport"],
            buckets=TTFA_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "voiceagent_turn_rtf",
            "Real-time factor of finished turns (synthesis time / audio time)",
            buckets=RTF_BUCKETS,
            registry=r,
        )
        self.turns = Counter(
            "voiceagent_turns", "Turns ended, by outcome", ["transport", "outcome"], registry=r
        )
        self.audio_seconds = Counter(
            "voiceagent_audio_sent_seconds",
            "Seconds of audio sent to listeners",
            ["transport"],
            registry=r,
        )
        self.underruns = Counter(
            "voiceagent_playout_underruns",
            "Times a playing turn's audio reached the listener later than real time",
            ["transport"],
            registry=r,
        )
        self.barge_ins = Counter(
            "voiceagent_barge_ins",
            "Listener speech that cancelled or ducked a playing turn",
            ["transport"],
            registry=r,
        )
        self.errors = Counter(
            "voiceagent_errors", "Error events sent to clients, by code", ["code"], registry=r
        )

        # the LM tier (embedded engine or SGLang)
        self.lm_tokens = Counter("voiceagent_lm_tokens", "Speech tokens generated", registry=r)
        self.lm_batch = Histogram(
            "voiceagent_lm_batch_size",
            "Requests in each embedded-engine decode step",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.lm_waiting = Gauge(
            "voiceagent_lm_queue_depth", "LM requests waiting for a KV slot", registry=r
        )
        self.lm_wait = Histogram(
            "voiceagent_lm_queue_wait_seconds",
            "Time an LM request waited before its prefill",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.sglang_latency = Histogram(
            "voiceagent_sglang_request_seconds",
            "SGLang requests: time to the first tokens (phase=first_token) and to the end "
            "(phase=total)",
            ["phase"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.sglang_failures = Counter(
            "voiceagent_sglang_failures",
            "SGLang requests that failed, by reason",
            ["reason"],
            registry=r,
        )

        # the acoustic worker (flow matching + vocoder)
        self.acoustic_waiting = Gauge(
            "voiceagent_acoustic_queue_depth",
            "Chunks waiting for the acoustic worker",
            registry=r,
        )
        self.acoustic_wait = Histogram(
            "voiceagent_acoustic_queue_wait_seconds",
            "Time a chunk waited for the acoustic worker",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.chunk_seconds = Histogram(
            "voiceagent_acoustic_chunk_seconds",
            "Compute time of one chunk or one batch of chunks, by stage (flow, vocoder)",
            ["stage"],
            buckets=CHUNK_BUCKETS,
            registry=r,
        )

    def exposition(self) -> bytes:
        """The registry in Prometheus text format (what GET /metrics returns)."""
        return generate_latest(self.registry)

    def observe_event(self, transport: str, event: dict[str, Any]) -> None:
        """Count a protocol event a session sent: turn ends, errors."""
        if event.get("type") == "error":
            self.errors.labels(str(event.get("code"))).inc()
        outcome = turn_outcome(event)
        if outcome is None:
            return
        self.turns.labels(transport, outcome).inc()
        if outcome == "done":  # (TTFA is observed as the first frame leaves: every turn)
            rtf = (event.get("timings") or {}).get("rtf")
            if rtf is not None:
                self.rtf.observe(rtf)
            self.audio_seconds.labels(transport).inc(event.get("sent_ms", 0) / 1000)
        elif outcome in ("cancelled", "barge_in"):
            self.audio_seconds.labels(transport).inc(event.get("played_ms", 0) / 1000)
