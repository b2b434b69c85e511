"""Streaming TTS server and tools; `voiceagent COMMAND --help` lists a command's flags."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

import numpy as np

from .audio.format import FRAME_MS, MODEL_RATE
from .model.checkpoint import CheckpointError, load_model
from .model.tiny import checkpoint as tiny

log = logging.getLogger("voiceagent")


def _serve(args: argparse.Namespace) -> int:
    import uvloop

    from .engine.embedded import EmbeddedEngine
    from .pipeline.turn import ChunkSchedule
    from .protocol.session import Limits
    from .server.app import DEFAULT_WEB_DIR, ServerConfig, VoiceServer, serve
    from .session.playout import PlayoutConfig
    from .telephony.call import TelephonyConfig
    from .transport.webrtc import WebRtcConfig

    model = load_model(args.model, args.device)
    lm = None
    if args.engine == "sglang":
        from .engine.sglang.client import SGLangLM

        if not args.sglang_url or not args.sglang_export:
            print("error: --engine sglang needs --sglang-url and --sglang-export", file=sys.stderr)
            return 2
        lm = SGLangLM(model, args.sglang_url, Path(args.sglang_export), args.sglang_timeout)
    engine = EmbeddedEngine(model, max_batch=args.max_batch, threads=args.threads, lm=lm)
    config = ServerConfig(
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        limits=Limits(
            max_message_bytes=args.max_message_bytes,
            max_text_chars=args.max_text_chars,
            max_turns=args.max_turns,
        ),
        playout=PlayoutConfig(
            lead_ms=args.lead_ms,
            schedule=ChunkSchedule(tuple(int(x) for x in args.chunks.split(","))),
            max_segment_tokens=int(args.max_speech_s * 25),
            max_ahead_ms=args.max_ahead_ms,
        ),
        voices_dir=voices_dir(args),
        webrtc=WebRtcConfig(track_buffer_frames=max(1, args.webrtc_buffer_ms // FRAME_MS)),
        telephony=TelephonyConfig(
            attach_timeout_s=args.bot_attach_timeout,
            twilio_auth_token=os.environ.get("VOICEAGENT_TWILIO_AUTH_TOKEN") or None,
            public_url=args.public_url,
            audiosocket_port=args.audiosocket_port,
        ),
        web_dir=Path(args.web) if args.web else DEFAULT_WEB_DIR,
    )
    log.info("serving on ws://%s:%d/v1/ws", args.host, args.port)
    uvloop.run(serve(VoiceServer(engine, config), args.log_level))
    return 0


def _say(args: argparse.Namespace) -> int:
    from .audio.codecs import OpusEncoder
    from .audio.ogg import OggOpusWriter
    from .audio.wav import write_wav
    from .engine.embedded import EmbeddedEngine
    from .model.sampling import SamplingParams
    from .pipeline.turn import FrameFormat, Turn, TurnSettings

    model = load_model(args.model, args.device)
    if args.voice not in model.voices:
        print(
            f"unknown voice '{args.voice}'; available: {', '.join(model.voices)}", file=sys.stderr
        )
        return 2
    if not 0.5 <= args.speed <= 2.0 or not 6000 <= args.bitrate <= 510000:
        print("--speed must be in 0.5..2.0 and --bitrate in 6000..510000", file=sys.stderr)
        return 2
    out = Path(args.output)
    if out.suffix not in (".ogg", ".opus", ".wav"):
        print("output must end in .ogg, .opus or .wav", file=sys.stderr)
        return 2
    engine = EmbeddedEngine(model)
    encoder = OpusEncoder(args.bitrate)
    settings = TurnSettings(
        voice=model.voices[args.voice],
        sampling=SamplingParams(seed=args.seed),
        speed=args.speed,
        frames=FrameFormat(encoder.sample_rate, encoder.tail_samples),
    )

    async def run() -> tuple[list[bytes], np.ndarray]:
        turn = Turn("say", settings, engine, record_pcm=True)
        turn.start()
        turn.push_text(args.text)
        turn.end_text()
        frames = []
        while (item := await turn.output.get()) is not None:
            if not isinstance(item, np.ndarray):
                raise RuntimeError(str(item))
            frames.append(encoder.encode(item))
        return frames, np.concatenate(turn.pcm or [np.zeros(0, np.float32)])

    engine.start()
    try:
        frames, pcm = asyncio.run(run())
    finally:
        engine.stop()
    if out.suffix == ".wav":
        write_wav(out, pcm, MODEL_RATE)
    else:
        with out.open("wb") as f:
            writer = OggOpusWriter(f, pre_skip=encoder.tail_samples)
            for packet in frames:
                writer.write_packet(packet)
            writer.close(valid_samples48k=len(pcm) * 2)
    print(f"wrote {out} ({len(pcm) / MODEL_RATE:.2f} s of audio)")
    return 0


def voices_dir(args: argparse.Namespace) -> Path:
    """Where `voice add` writes and `serve` reads added voices."""
    if args.voices:
        return Path(args.voices)
    base = Path(args.model) if args.model else tiny.default_tiny_dir()
    return base / "voices"


def _voice_add(args: argparse.Namespace) -> int:
    from .model.contract import Voice
    from .model.cosyvoice2.prompt_frontend import PromptFrontend
    from .model.voice_store import check_name, save_voice

    try:
        check_name(args.name)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.model:
        print("error: voice add needs --model (a CosyVoice2 directory)", file=sys.stderr)
        return 2
    model_dir = Path(args.model)
    model = load_model(args.model, "cpu")
    onnx = [model_dir / "campplus.onnx", model_dir / "speech_tokenizer_v2.onnx"]
    missing = [str(p) for p in onnx if not p.is_file()]
    if missing:
        print(
            f"error: this model has no prompt frontend files: {', '.join(missing)}", file=sys.stderr
        )
        return 2
    frontend = PromptFrontend(onnx[0], onnx[1])
    try:
        prompt = frontend.make_prompt(Path(args.audio), model.tokenizer.encode(args.text))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    voice = Voice(name=args.name, **prompt)
    model.check_voice(voice)
    path = save_voice(voices_dir(args), voice, args.text)
    seconds = len(voice.prompt_tokens) / 25
    print(f"voice '{args.name}' saved to {path} ({seconds:.1f} s of prompt)")
    return 0


def _export_sglang(args: argparse.Namespace) -> int:
    from .engine.sglang.export import export_sglang

    meta = export_sglang(load_model(args.model, "cpu"), Path(args.out))
    print(
        f"wrote {args.out}: Qwen2ForCausalLM, speech tokens at {meta['speech_offset']}+; serve "
        "it with sglang.launch_server --skip-tokenizer-init --model-path " + args.out
    )
    return 0


def _make_tiny(args: argparse.Namespace) -> int:
    tiny.save(tiny.build_random(seed=args.seed), Path(args.directory))
    print(f"wrote a random-weight tiny checkpoint to {args.directory}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="voiceagent", description=__doc__)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the server (WebSocket, WebRTC, /health, web page)")
    s.add_argument("--model", help="model directory (default: the random-weight tiny model)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--max-sessions", type=int, default=64)
    s.add_argument("--max-turns", type=int, default=8, help="live turns per session")
    s.add_argument("--max-message-bytes", type=int, default=64 * 1024)
    s.add_argument("--max-text-chars", type=int, default=20_000, help="per turn")
    s.add_argument("--lead-ms", type=int, default=200, help="audio sent ahead of real time")
    s.add_argument(
        "--max-ahead-ms",
        type=int,
        default=5000,
        help="audio a turn may synthesize ahead of sending (0: no bound)",
    )
    s.add_argument(
        "--webrtc-buffer-ms",
        type=int,
        default=200,
        help="WebRTC: audio queued on the track ahead of real time (a cancel drops it)",
    )
    s.add_argument("--chunks", default="4,8,16,25", help="tokens per flow chunk, in order")
    s.add_argument(
        "--max-speech-s", type=float, default=60.0, help="ceiling on one segment's speech"
    )
    s.add_argument("--max-batch", type=int, default=16, help="LM decode batch (KV slots)")
    s.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (auto: cuda if present)")
    s.add_argument("--voices", help="folder of added voices (default: MODEL/voices)")
    s.add_argument("--web", help="the demo page folder served at / (default: the checkout's web/)")
    s.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    s.add_argument("--engine", choices=["embedded", "sglang"], default="embedded")
    s.add_argument("--sglang-url", help="SGLang server, e.g. http://127.0.0.1:30000")
    s.add_argument("--sglang-export", help="the directory written by export-sglang")
    s.add_argument("--sglang-timeout", type=float, default=30.0, help="seconds per request")
    s.add_argument(
        "--public-url",
        help="telephony: the https:// URL carriers reach this server by (Twilio signs it); "
        "set VOICEAGENT_TWILIO_AUTH_TOKEN to check X-Twilio-Signature",
    )
    s.add_argument(
        "--audiosocket-port", type=int, help="telephony: Asterisk AudioSocket TCP port (off)"
    )
    s.add_argument(
        "--bot-attach-timeout",
        type=float,
        default=10.0,
        help="telephony: seconds a call waits for its bot (and a bot for its call)",
    )
    s.set_defaults(func=_serve)

    s = sub.add_parser("export-sglang", help="write the LM as a Qwen2 checkpoint for SGLang")
    s.add_argument("--model", help="model directory (default: the tiny model)")
    s.add_argument("--out", required=True, help="directory to write")
    s.set_defaults(func=_export_sglang)

    s = sub.add_parser("say", help="synthesize text to an Ogg Opus or WAV file")
    s.add_argument("text")
    s.add_argument("-o", "--output", required=True, help="out.ogg, out.opus or out.wav")
    s.add_argument("--model")
    s.add_argument("--voice", default="agent")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--speed", type=float, default=1.0)
    s.add_argument("--bitrate", type=int, default=32000)
    s.add_argument("--device", default="auto")
    s.set_defaults(func=_say)

    s = sub.add_parser("bench", help="measure the server: TTFA, RTF, barge-in, CPU")
    s.add_argument(
        "--scenario",
        choices=["ws", "webrtc", "telephony", "cutoff", "chunk-cost"],
        default="ws",
        help="ws: sessions over WebSocket; webrtc: real-time sessions and barge-in latency "
        "over WebRTC; telephony: simulated Twilio calls with bots and barge-in; cutoff: "
        "work spent on a turn a barge-in cuts off; chunk-cost: flow+vocoder time of chunk "
        "1 vs 20",
    )
    s.add_argument("--model")
    s.add_argument(
        "--sessions",
        help="concurrency levels (ws: 1,8; webrtc, telephony: 1,2,4,8,12,16)",
    )
    s.add_argument("--turns", type=int, default=3, help="turns per session (telephony: per call)")
    s.add_argument("--repeats", type=int, default=1, help="chunk-cost: runs (median taken)")
    s.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    s.add_argument("--lead-ms", type=int, default=200, help="pacing lead, as in serve")
    s.add_argument("--max-speech-s", type=float, help="as in serve (ws: 60, webrtc, telephony: 3)")
    s.add_argument("--sglang-url", help="ws scenario: also measure with this SGLang server")
    s.add_argument("--sglang-export", help="the export-sglang directory it serves")
    s.add_argument(
        "--client-prefetch",
        type=int,
        default=1,
        help="webrtc: frames the client's jitter buffer holds (aiortc's default: 4)",
    )
    s.add_argument(
        "--max-ahead-ms", type=int, default=5000, help="webrtc, telephony, cutoff: as in serve"
    )
    s.add_argument("--device", default="auto")
    s.set_defaults(func=_bench)

    s = sub.add_parser("voice", help="manage voices (voice add: one from a short clip)")
    vsub = s.add_subparsers(dest="voice_command", required=True)
    s = vsub.add_parser("add", help="make a voice from a few seconds of reference audio")
    s.add_argument("name")
    s.add_argument("audio", help="reference clip (wav, mp3, ...), ideally 3-10 s of speech")
    s.add_argument("--text", required=True, help="what is said in the clip")
    s.add_argument("--model", help="the model directory the voice is for")
    s.add_argument("--voices", help="folder of added voices (default: MODEL/voices)")
    s.set_defaults(func=_voice_add)

    s = sub.add_parser("make-tiny", help="write a random-weight tiny checkpoint directory")
    s.add_argument("directory")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_make_tiny)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args))
    except CheckpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
