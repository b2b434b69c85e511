"""`voiceagent bench --scenario first-packet`: where the time to the first packet goes.

A turn runs through the real engine (`EmbeddedEngine` + `Turn`, Opus 48 kHz frames) and
its first 20 ms packet is encoded and written to a local socket; the turn is then
dropped. Its time to first audio (TTFA: turn created -> first packet sent) is cut into
consecutive slices on its critical path, from the monotonic timestamps the turn, the LM
thread and the acoustic worker keep anyway (`TurnStats`, `ChunkTimes`):

  text_frontend          turn created -> LM request handed over (segmenter, text
                         normalization, tokenizer)
  lm_prefill             -> first speech token (LM queue + prompt prefill + sampling)
  tokens_to_first_chunk  -> the first chunk's tokens (+ lookahead) handed to the worker
  flow_chunk1            -> its mel (worker queue + flow)
  vocoder_hold_back      -> the vocoder starts on the chunk that yields the first audio:
                         ~0 when chunk 1 does; with HiFT's exact 400 ms hold-back it is
                         chunk 2's tokens, flow and chunk 1's silent vocoder pass
  vocoder                -> that chunk's PCM
  resample_encode        24 -> 48 kHz and framing (worker), Opus encode of the packet
  send                   worker -> event loop -> consumer, and the socket write

The slices add up to the TTFA of each turn. Two modes run in one process, turns
interleaved: `baseline` (exact hold-back, no LM prefix cache, float32) and `optimized`
(see `Mode`). Also measured apart: the LM prefill of the same prompt with and without
the voice's prefix cached, and the flow's attention-cache bytes per token of a turn.

Over 500 lines: the bench, its slices, its fidelity measures and its table, which share
the modes and are read together.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, cast

import numpy as np
import torch

from ..audio.codecs import OpusEncoder
from ..engine.acoustic import PromptTail
from ..engine.embedded import EmbeddedEngine, default_threads
from ..engine.lm_prefix import PrefixCache
from ..model.contract import PAD_TOKEN, FlowStage, State, Voice
from ..model.lm import KVPool
from ..model.quantize import FlowPrecision, int8_layers
from ..model.sampling import SamplingParams
from ..model.speech_model import SpeechModel
from ..pipeline.turn import ChunkSchedule, FrameFormat, Turn, TurnSettings, TurnStats
from ..text.normalize import normalize
from ..text.timing import SpokenSegment
from .lm_decode import decode_steps

# The first segment is cut at the comma (a clause mark after >= 12 characters).
TEXT = "Thanks for calling, your order shipped this morning and arrives on Thursday."
SLICES = (
    "text_frontend",
    "lm_prefill",
    "tokens_to_first_chunk",
    "flow_chunk1",
    "vocoder_hold_back",
    "vocoder",
    "resample_encode",
    "send",
)


@dataclass(frozen=True)
class Mode:
    """What a turn runs with. `hold_back`: HiFT's hold-back in mel frames (None: exact)."""

    prefix_cache: bool
    hold_back: int | None
    crossfade: int
    schedule: tuple[int, ...] = (4, 8, 16, 25)
    int8_prefill: bool = False
    int8_decode: bool = False
    flow_dtype: FlowPrecision = "float32"  # (name kept: it is a --json key)
    # torch's intra-op threads while this mode's turns run (process-wide in torch, but
    # the modes' turns never overlap); None: as the process started
    threads: int | None = None
    first_audio_first: bool = False  # EmbeddedEngine(first_audio_first=...)
    flow_window_s: float | None = None  # EmbeddedEngine(flow_window=...), in seconds
    warm: bool = False  # the voice's flow state primed at engine start, as `serve` does
    prompt_tail: PromptTail = "rerun"  # EmbeddedEngine(prompt_tail=...)
    lm_precision: str = "float32"  # EmbeddedEngine(lm_dtype=...)
    cuda_graphs: bool = False  # EmbeddedEngine(lm_graphs=...)


BASELINE = Mode(prefix_cache=False, hold_back=None, crossfade=0)
OPTIMIZED = Mode(
    prefix_cache=True,
    hold_back=4,
    crossfade=0,
    int8_prefill=True,
    int8_decode=True,
    first_audio_first=True,
    threads=default_threads(),  # as `serve` sets them
    flow_window_s=20.0,  # as `serve`'s engine.flow_window_s
    warm=True,
    flow_dtype="int8",
    prompt_tail="primed",
)
# What `serve` runs on a GPU: bfloat16 LM and flow, the LM's decode steps as CUDA graphs
# (the int8 kernels and the thread count are the CPU's).
OPTIMIZED_CUDA = replace(
    OPTIMIZED,
    int8_prefill=False,
    int8_decode=False,
    threads=None,
    flow_dtype="bfloat16",
    lm_precision="bfloat16",
    cuda_graphs=True,
)


@dataclass
class _Packet:
    """The consumer's side of the first packet."""

    got: float  # the frame reached the consumer
    encoded: float
    sent: float


async def _first_packet(
    engine: EmbeddedEngine, voice: Voice, mode: Mode, seed: int
) -> tuple[TurnStats, _Packet]:
    encoder = OpusEncoder()
    settings = TurnSettings(
        voice,
        SamplingParams(seed=seed),
        frames=FrameFormat(encoder.sample_rate, encoder.tail_samples),
        hold_back=mode.hold_back,
        crossfade=mode.crossfade,
    )

    async def spoken(_: SpokenSegment) -> None:
        return None

    turn = Turn("first-packet", settings, engine, ChunkSchedule(mode.schedule), on_spoken=spoken)
    turn.push_text(TEXT)
    turn.end_text()
    turn.start()
    a, b = socket.socketpair()
    try:
        item = await turn.output.get()
        got = time.monotonic()
        if not isinstance(item, np.ndarray):
            raise RuntimeError(f"the turn ended without audio: {item!r}")
        packet = encoder.encode(item)
        encoded = time.monotonic()
        a.send(packet)
        sent = _Packet(got, encoded, time.monotonic())
        b.recv(4096)
    finally:
        a.close()
        b.close()
        turn.close()
        await turn.wait()
    await _idle(engine)
    return turn.stats, sent


async def _idle(engine: EmbeddedEngine) -> None:
    """Wait until the dropped turn's work is gone: a no-op job behind it on the acoustic
    worker, and no LM request left."""
    voice = next(iter(engine.model.voices.values()))
    stream = engine.acoustic.new_stream(voice, 1.0, None)
    await engine.acoustic.synthesize(stream, [PAD_TOKEN] * engine.model.pre_lookahead, True)
    while engine.lm.load:
        await asyncio.sleep(0.005)


def slices(st: TurnStats, p: _Packet) -> dict[str, float]:
    """The TTFA slices of a turn that delivered its first packet `p`, in ms."""
    c0, ca = st.first_chunk, st.first_audible
    if c0 is None or ca is None or st.lm_submitted is None or st.first_token is None:
        raise RuntimeError("the turn has no first packet")
    spans = {
        "text_frontend": st.lm_submitted - st.created,
        "lm_prefill": st.first_token - st.lm_submitted,
        "tokens_to_first_chunk": c0.queued - st.first_token,
        "flow_chunk1": c0.flow_end - c0.queued,
        "vocoder_hold_back": ca.vocoder_start - c0.flow_end,
        "vocoder": ca.vocoder_end - ca.vocoder_start,
        "resample_encode": (ca.framed - ca.vocoder_end) + (p.encoded - p.got),
        "send": (p.got - ca.framed) + (p.sent - p.encoded),
    }
    return {**{k: v * 1000 for k, v in spans.items()}, "chunks": st.first_audible_chunk}


def state_bytes(state: State) -> int:
    """Bytes of what a state holds (views: spare room in growing buffers not counted)."""
    return sum(v.nbytes for v in state.values())


def _two_chunks(
    model: SpeechModel, flow: FlowStage, voice: Voice, tokens: int
) -> tuple[State, State, State]:
    """`flow`'s state primed with the voice, after a first chunk of `tokens` tokens and
    after a second: the second's growth is a turn's steady one (a first chunk may also
    rewrite the prompt's last tokens)."""
    look, dev = model.pre_lookahead, model.device
    ids = torch.tensor([[0] * (tokens + look)], device=dev)
    spk = voice.embedding[None].to(dev)
    primed = flow.initial_state(voice)
    _, first = flow.forward_chunk(ids, spk, primed)
    _, second = flow.forward_chunk(ids, spk, first)
    return primed, first, second


@torch.inference_mode()
def flow_cache_bytes_per_token(
    model: SpeechModel, flow: FlowStage, voice: Voice, tokens: int = 20
) -> float:
    """Growth of `flow`'s per-turn state per speech token (its attention caches)."""
    _, first, second = _two_chunks(model, flow, voice, tokens)
    return (state_bytes(second) - state_bytes(first)) / tokens


@torch.inference_mode()
def turn_state_bytes(
    model: SpeechModel, flow: FlowStage, voice: Voice, seconds: float = 60.0, tokens: int = 20
) -> int:
    """`flow`'s per-turn state after `seconds` of speech: its growth per token over a
    chunk, split into the part a window bounds (the estimator's `s*` keys/values) and
    the rest, extrapolated (25 tokens per second; the window, if any, caps the first)."""
    primed, first, second = _two_chunks(model, flow, voice, tokens)

    def split(st: State) -> tuple[int, int]:
        own = sum(v.nbytes for k, v in st.items() if k.startswith("s") and k.endswith((".k", ".v")))
        return own, state_bytes(st) - own

    (own0, rest0), (own1, rest1), (own2, rest2) = split(primed), split(first), split(second)
    n = round(seconds * 25)
    window = getattr(flow, "window_frames", None)  # mel frames (CosyFlow)
    ratio = getattr(getattr(flow, "cfg", None), "token_mel_ratio", 1)
    kept = n if window is None else min(n, window // ratio)
    # Keys/values grow into buffers with up to a quarter spare (flow_encoder.append): the
    # live bytes measured here, times 1.25, bound what the buffers hold.
    own = (own2 - own1) / tokens * kept * 1.25
    return round(own0 + rest0 + own + (rest2 - rest1) / tokens * n * 1.25)


@torch.inference_mode()
def prefill_ms(model: SpeechModel, voice: Voice, repeats: int = 3) -> dict[str, Any]:
    """The first segment's LM prefill: whole and after the voice's cached prefix, with
    float32 layers and with int8 ones; and how far the int8 prefill moves the logits of
    it and of the 10 decode steps after it (float32 decode on its keys/values)."""
    lm, dev = model.lm, model.device
    text_ids = list(voice.lm_text_ids) + model.tokenizer.encode(normalize(TEXT.split(",")[0]))
    prompt = lm.prompt_embeds(text_ids, list(voice.lm_speech_tokens))
    p = prompt.shape[1]
    pool = KVPool(lm.cfg, 1, p + 10, dev)
    slot = torch.tensor([0], device=dev)
    key = tuple(voice.lm_text_ids)
    kinds = {"": None, "int8_": int8_layers(lm)}
    caches = {kind: PrefixCache() for kind in kinds}
    times: dict[str, list[float]] = {}
    for _ in range(repeats + 1):  # the first round fills the caches, not timed
        for kind, layers in kinds.items():
            if kind and layers is None:
                continue
            for label in ("uncached", "cached"):
                t0 = time.perf_counter()
                start = 0
                if label == "cached":
                    start = caches[kind].fill(lm, key, prompt, pool, 0, layers)[0]
                at = torch.tensor([start], device=dev)
                lm.forward_embeds(prompt[:, start:], pool, slot, at, layers)
                if caches[kind].hits:
                    times.setdefault(kind + label, []).append((time.perf_counter() - t0) * 1000)

    def logits(layers: Any, decode: Any = None) -> torch.Tensor:
        """The prefill's logits and 10 greedy steps' (the float32 run's tokens)."""
        zero = torch.tensor([0], device=dev)
        rows = [lm.forward_embeds(prompt, pool, slot, zero, layers)]
        for i in range(10):
            step = lm.embed_speech(torch.tensor([greedy[i]], device=dev))
            at = torch.tensor([p + i], device=dev)
            rows.append(lm.forward_embeds(step, pool, slot, at, decode))
        return torch.cat(rows).float()

    report: dict[str, Any] = {
        "prompt_positions": p,
        "cached_positions": len(key) + 1,
        **{f"{k}_ms_p50": round(statistics.median(v), 1) for k, v in times.items()},
    }
    greedy = [0] * 10
    exact = logits(None)
    greedy = exact.argmax(1)[:10].tolist()
    exact = logits(None)
    report["logits_max_abs"] = round(float(exact.abs().max()), 3)
    if (q := kinds["int8_"]) is not None:
        for label, approx in (("int8", logits(q)), ("int8_decode", logits(q, q))):
            report[f"{label}_logits_max_abs"] = round(float((approx - exact).abs().max()), 5)
            agree = (approx.argmax(1) == exact.argmax(1)).float().mean()
            report[f"{label}_top1_agreement"] = float(agree)
    return report


@torch.inference_mode()
def hold_back_error(
    model: SpeechModel, voice: Voice, mode: Mode, tokens: int = 60
) -> dict[str, float]:
    """The vocoder's streamed audio with `mode`'s hold-back against the exact stream, on
    the flow's mel of `tokens` random tokens cut as `mode.schedule` cuts a turn: the
    largest sample error, over the whole turn and over the first chunk's audio, and the
    error's RMS relative to the audio's (PCM in [-1, 1])."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 6561, (1, tokens), generator=gen).tolist()[0]
    ids += [PAD_TOKEN] * model.pre_lookahead
    spk = voice.embedding[None].to(model.device)
    mel, _ = model.flow.forward_chunk(
        torch.tensor([ids], device=model.device), spk, model.flow.initial_state(voice)
    )
    sizes = [2 * n for n in mode.schedule]

    def stream(vocoder: Any) -> torch.Tensor:
        state, out, done, i = vocoder.initial_state(), [], 0, 0
        while done < mel.shape[2]:
            n = min(sizes[min(i, len(sizes) - 1)], mel.shape[2] - done)
            pcm, state = vocoder.forward_chunk(
                mel[:, :, done : done + n], state, done + n == mel.shape[2]
            )
            out.append(pcm)
            done, i = done + n, i + 1
        return torch.cat(out, 1)[0]

    exact = stream(model.vocoder)
    approx = (
        stream(model.vocoder.variant(mode.hold_back, mode.crossfade))
        if mode.hold_back is not None
        else exact
    )
    err = (approx - exact).abs()
    first = err[: sizes[0] * 480]
    return {
        "max_abs": float(err.max()),
        "first_chunk_max_abs": float(first.max()),
        "rel_rms": float(err.pow(2).mean().sqrt() / exact.pow(2).mean().sqrt().clamp(min=1e-12)),
    }


def _streamed_mel(
    model: SpeechModel,
    flow: FlowStage,
    voice: Voice,
    ids: list[int],
    schedule: tuple[int, ...],
    grid: bool = False,
) -> torch.Tensor:
    """`flow`'s mel of `ids`, streamed in chunks cut as `schedule` cuts a turn (with a
    grid state and chunks on its grid if `grid`)."""
    look, dev = model.pre_lookahead, model.device
    padded = ids + [PAD_TOKEN] * look
    spk = voice.embedding[None].to(dev)
    state, mels, done, i = flow.initial_state(voice, grid), [], 0, 0
    if grid:
        schedule = tuple(cast(Any, flow).grid_sizes(len(voice.prompt_tokens), len(ids)))
    while done < len(ids):
        n = min(schedule[min(i, len(schedule) - 1)], len(ids) - done)
        chunk = torch.tensor([padded[done : done + n + look]], device=dev)
        mel, state = flow.forward_chunk(chunk, spk, state)
        mels.append(mel.float())
        done, i = done + n, i + 1
    return torch.cat(mels, 2)


def _mel_distance(mel: torch.Tensor, reference: torch.Tensor) -> dict[str, float]:
    """The largest difference, and the RMS of the difference relative to the reference's
    own RMS around its mean (log-mel)."""
    diff = mel - reference
    spread = (reference - reference.mean()).pow(2).mean().sqrt().clamp(min=1e-12)
    return {
        "max_abs": round(float(diff.abs().max()), 5),
        "rel_rms": round(float(diff.pow(2).mean().sqrt() / spread), 5),
    }


def _random_ids(tokens: int) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    return cast(list[int], torch.randint(0, 6561, (tokens,), generator=gen).tolist())


@torch.inference_mode()
def grid_deviation(
    model: SpeechModel,
    voice: Voice,
    schedule: tuple[int, ...],
    stream_flow: FlowStage | None = None,
    tokens: int = 60,
    grid: bool = False,
) -> dict[str, float] | None:
    """The streamed mel (of `stream_flow`, default the model's) with `schedule` against
    the released streaming grid of the model's flow (one pass with the static 25-token
    chunk mask from the first prompt token), on `tokens` random tokens (`_mel_distance`).
    None for a flow without that offline pass. `grid`: a grid state and chunks on the
    grid (`chunking: reference`) instead of `schedule`."""
    flow: Any = model.flow
    if not hasattr(flow, "synthesize") or voice.prompt_mel is None:
        return None
    dev = model.device
    ids = _random_ids(tokens)
    streamed = _streamed_mel(model, stream_flow or flow, voice, ids, schedule, grid)
    reference = flow.synthesize(
        torch.tensor([ids], device=dev),
        torch.tensor([voice.prompt_tokens], device=dev),
        voice.prompt_mel[None].to(dev),
        voice.embedding[None].to(dev),
        blocks=flow.cfg.static_chunk_size,
    )
    return _mel_distance(streamed, reference)


@torch.inference_mode()
def precision_error(
    model: SpeechModel, voice: Voice, schedule: tuple[int, ...], flow: FlowStage, tokens: int = 60
) -> dict[str, float]:
    """`flow` (a mode's reduced precision) against the model's own float32 flow, both
    streamed with `schedule` on `tokens` random tokens (`_mel_distance`)."""
    ids = _random_ids(tokens)
    exact = _streamed_mel(model, model.flow, voice, ids, schedule)
    return _mel_distance(_streamed_mel(model, flow, voice, ids, schedule), exact)


def _summary(turns: list[dict[str, float]], first: dict[str, float]) -> dict[str, Any]:
    return {
        "turns": len(turns),
        "ttfa_ms_p50": round(statistics.median(t["ttfa"] for t in turns), 1),
        "ttfa_ms_first": round(first["ttfa"], 1),
        # each measured turn's, in order: a cost that grows with the engine's age shows
        "ttfa_ms_by_turn": [round(t["ttfa"], 1) for t in turns],
        "slices_ms": {s: round(statistics.median(t[s] for t in turns), 1) for s in SLICES},
        # the first turn after start-up, slice by slice (it should cost what later ones do)
        "slices_ms_first": {s: round(first[s], 1) for s in SLICES},
        # chunks the flow ran before the first audio (the exact hold-back needs two)
        "chunks_to_first_audio": statistics.median(t["chunks"] for t in turns),
    }


def measure(
    model: SpeechModel, turns: int = 5, modes: dict[str, Mode] | None = None
) -> dict[str, Any]:
    """`turns` measured turns per mode, interleaved, after each mode's first turn (which
    also primes the voice's flow state on its engine; reported as `ttfa_ms_first`)."""
    optimized = OPTIMIZED_CUDA if model.device.type == "cuda" else OPTIMIZED
    modes = modes or {"baseline": BASELINE, "optimized": optimized}
    voice = next(iter(model.voices.values()))
    engines = {
        name: EmbeddedEngine(
            model,
            1,
            prefix_cache=m.prefix_cache,
            int8_prefill=m.int8_prefill,
            int8_decode=m.int8_decode,
            flow_precision=m.flow_dtype,
            first_audio_first=m.first_audio_first,
            flow_window=None if m.flow_window_s is None else round(m.flow_window_s * 25),
            warm=[voice] if m.warm else [],
            warm_hold_backs=[m.hold_back] if m.warm and m.hold_back is not None else [],
            prompt_tail=m.prompt_tail,
            lm_dtype=getattr(torch, m.lm_precision),
            lm_graphs=m.cuda_graphs,
        )
        for name, m in modes.items()
    }
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
    first: dict[str, dict[str, float]] = {}

    threads = torch.get_num_threads()

    async def run() -> None:
        for i in range(turns + 1):
            for name, mode in modes.items():
                torch.set_num_threads(mode.threads or threads)
                row = slices(*await _first_packet(engines[name], voice, mode, seed=1))
                row["ttfa"] = sum(row[s] for s in SLICES)
                if i == 0:
                    first[name] = row
                else:
                    rows[name].append(row)

    for name, e in engines.items():
        # A thread takes torch's thread count when it first computes, here the warm-up:
        # set the mode's before it starts.
        torch.set_num_threads(modes[name].threads or threads)
        e.start()
        e.wait_warm()  # as a server warms up before its first session
    try:
        asyncio.run(run())
    finally:
        torch.set_num_threads(threads)
        for e in engines.values():
            e.stop()
    report: dict[str, Any] = {"model": model.name, "text": TEXT, "voice": voice.name}
    for name, mode in modes.items():
        flow = engines[name].acoustic.flow
        report[name] = {
            **_summary(rows[name], first[name]),
            "flow_cache_bytes_per_token": round(flow_cache_bytes_per_token(model, flow, voice)),
            "flow_state_bytes_60s_turn": turn_state_bytes(model, flow, voice),
            "vocoder_error": {
                k: round(v, 6) for k, v in hold_back_error(model, voice, mode).items()
            },
            "mel_vs_reference_grid": grid_deviation(model, voice, mode.schedule, flow),
            "flow_precision_error": precision_error(model, voice, mode.schedule, flow),
            # the primed prompt tail alone (float32); the two errors above include it
            "prompt_tail_error": (
                precision_error(model, voice, mode.schedule, model.flow.primed_tail())
                if mode.prompt_tail == "primed"
                else None
            ),
            "mode": asdict(mode),
        }
    report["lm_prefill"] = prefill_ms(model, voice)
    report["lm_decode"] = decode_steps(model, getattr(torch, optimized.lm_precision))
    report["threads"] = threads
    # `chunking: reference` (float32 flow): the released streaming itself, at the cost
    # of a first chunk that fills the prompt's last grid block
    grid = getattr(model.flow, "grid", None)
    if grid:
        report["reference_chunking"] = {
            "first_chunk_tokens": model.flow.grid_sizes(len(voice.prompt_tokens), 60)[0],
            "mel_vs_reference_grid": grid_deviation(model, voice, (), grid=True),
        }
    return report


def table(report: dict[str, Any]) -> str:
    names = [k for k in report if isinstance(report[k], dict) and "slices_ms" in report[k]]
    lines = [
        f"first packet ({report['model']}, voice {report['voice']}), ms, p50 of "
        f"{report[names[0]]['turns']} turns",
        f"{'slice':<24}" + "".join(f"{n:>12}{'(first)':>10}" for n in names),
    ]
    for s in SLICES:
        lines.append(
            f"{s:<24}"
            + "".join(
                f"{report[n]['slices_ms'][s]:>12}{report[n]['slices_ms_first'][s]:>10}"
                for n in names
            )
        )
    keys = (
        "ttfa_ms_p50",
        "ttfa_ms_first",
        "flow_cache_bytes_per_token",
        "flow_state_bytes_60s_turn",
    )
    for key in keys:
        lines.append(f"{key:<24}" + "".join(f"{report[n][key]:>12}" for n in names))
    for n in names:
        e = report[n]["vocoder_error"]
        lines.append(
            f"{n}: hold-back {report[n]['mode']['hold_back']} frames, audio error vs exact: "
            f"max {e['max_abs']}, first chunk max {e['first_chunk_max_abs']}, "
            f"relative RMS {e['rel_rms']}"
        )
    for n in names:
        g = report[n]["mel_vs_reference_grid"]
        if g is not None:
            lines.append(
                f"{n}: chunks {report[n]['mode']['schedule']}, mel vs the 25-token reference "
                f"grid: max {g['max_abs']}, relative RMS {g['rel_rms']}"
            )
    for n in names:
        f = report[n]["flow_precision_error"]
        lines.append(
            f"{n}: flow {report[n]['mode']['flow_dtype']}, mel vs float32: max "
            f"{f['max_abs']}, relative RMS {f['rel_rms']}"
        )
    for n in names:
        if (t := report[n].get("prompt_tail_error")) is not None:
            lines.append(
                f"{n}: prompt primed to its end, mel vs rerunning its tail: max "
                f"{t['max_abs']}, relative RMS {t['rel_rms']}"
            )
    if (ref := report.get("reference_chunking")) and ref["mel_vs_reference_grid"]:
        lines.append(
            f"chunking reference: first chunk {ref['first_chunk_tokens']} tokens, mel vs the "
            f"grid: max {ref['mel_vs_reference_grid']['max_abs']}"
        )
    pf = report["lm_prefill"]
    lines.append(
        f"LM prefill of {pf['prompt_positions']} positions: {pf['uncached_ms_p50']} ms; "
        f"after {pf['cached_positions']} cached: {pf['cached_ms_p50']} ms"
    )
    if "int8_uncached_ms_p50" in pf:
        lines.append(
            f"  int8 layers: {pf['int8_uncached_ms_p50']} ms; after the cached prefix: "
            f"{pf['int8_cached_ms_p50']} ms; logits moved by at most "
            f"{pf['int8_logits_max_abs']} (of {pf['logits_max_abs']}), top-1 agreement "
            f"{pf['int8_top1_agreement']} over the prefill and 10 steps; with int8 decode "
            f"steps too: {pf['int8_decode_logits_max_abs']}, "
            f"{pf['int8_decode_top1_agreement']}"
        )
    dec = report["lm_decode"]
    steps = ", ".join(
        f"batch {b}: {t['ordinary']} ms, bucketed {t['graphs']} ms"
        for b, t in dec["step_ms"].items()
    )
    lines.append(
        f"LM decode step ({dec['dtype']}, {dec['graphs_captured']} CUDA graphs): {steps}; "
        f"logits apart by at most {dec['graphs_logits_max_abs_diff']}"
    )
    return "\n".join(lines)
