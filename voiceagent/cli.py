"""Streaming TTS server and tools; `voiceagent COMMAND --help` lists a command's flags."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import config
from .audio.format import MODEL_RATE
from .auth.commands import add_commands as add_auth_commands
from .engine.lm_engine import EngineError
from .engine.memory import retain_freed_memory
from .model.checkpoint import CheckpointError, load_model
from .model.tiny import checkpoint as tiny
from .ops.logs import LEVELS, configure_logging
from .train.commands import add_commands as add_train_commands

if TYPE_CHECKING:
    from .engine.embedded import EmbeddedEngine
    from .model.speech_model import SpeechModel

log = logging.getLogger("voiceagent")


def _settings(args: argparse.Namespace) -> config.Loaded | None:
    try:
        return config.load(args.config, config.flag_values(args))
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return None


def build_engine(settings: config.Settings, model: SpeechModel) -> EmbeddedEngine:
    """The engine `serve` runs: the [engine] settings over `model`."""

    from .engine.embedded import EmbeddedEngine

    engine_settings = settings.engine
    lm = None
    if engine_settings.kind == "sglang":
        from .engine.sglang.client import SGLangLM

        # the embedded LM's own settings: SGLang has its own (its launch flags)
        unused = [
            f"engine.{key}"
            for key in ("max_batch", "lm_int8", "lm_precision", "cuda_graphs")
            if getattr(engine_settings, key) != type(engine_settings).model_fields[key].default
        ]
        if unused:
            log.warning(
                "with engine.kind sglang, %s do nothing: SGLang runs the LM", ", ".join(unused)
            )

        lm = SGLangLM(
            model,
            engine_settings.sglang_url,
            Path(engine_settings.sglang_export),
            engine_settings.sglang_timeout_s,
        )
    return EmbeddedEngine(model, lm=lm, **settings.engine_options(model))


def _serve(args: argparse.Namespace) -> int:
    import uvloop

    from .server.app import VoiceServer, serve

    loaded = _settings(args)
    if loaded is None:
        return 2
    settings = loaded.settings
    configure_logging(settings.log.level, settings.log.format)
    if loaded.file:
        log.info("settings from %s", loaded.file)
    engine = build_engine(settings, load_model(settings.model.path or None, settings.model.device))
    server_config = settings.server_config()
    log.info("serving on ws://%s:%d/v1/ws", server_config.host, server_config.port)
    uvloop.run(serve(VoiceServer(engine, server_config), settings.log.level))
    return 0


def _config(args: argparse.Namespace) -> int:
    loaded = _settings(args)
    if loaded is None:
        return 2
    print(config.render(loaded), end="")
    return 0


def _say(args: argparse.Namespace) -> int:
    from .audio.codecs import OpusEncoder
    from .audio.ogg import OggOpusWriter
    from .audio.wav import write_wav
    from .engine.embedded import EmbeddedEngine
    from .model.sampling import SamplingParams
    from .pipeline.turn import FrameFormat, Turn, TurnFailed, TurnSettings

    model = load_model(args.model, args.device)
    args.voice = args.voice or next(iter(model.voices), "")
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
    if not out.parent.is_dir():  # said before the synthesis, not after it
        print(f"error: {out.parent} is not a folder to write {out.name} in", file=sys.stderr)
        return 2
    if not args.text.strip():
        print("error: nothing to say: the text is empty", file=sys.stderr)
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
            if isinstance(item, TurnFailed):
                raise RuntimeError(str(item))
            if isinstance(item, np.ndarray):  # (not a segment's timing)
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
    return config.voices_folder(args.voices, args.model)


def _voice_add(args: argparse.Namespace) -> int:
    from .auth.keys import check_tenant
    from .model.contract import Voice
    from .model.cosyvoice2.prompt_frontend import PromptFrontend
    from .model.voice_store import check_name, save_voice

    try:
        check_name(args.name)
        if args.tenant:
            check_tenant(args.tenant)
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
    folder = voices_dir(args) / args.tenant if args.tenant else voices_dir(args)
    try:
        path = save_voice(folder, voice, args.text)
    except OSError as exc:
        print(f"error: could not save voice '{args.name}': {exc.strerror or exc}", file=sys.stderr)
        return 2
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
    p.add_argument(
        "--log-level",
        choices=LEVELS,
        help="debug, info, warning or error (default: info); for serve, key log.level",
    )
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the server (WebSocket, WebRTC, /health, web page)")
    config.add_flags(s)
    s.set_defaults(func=_serve)

    s = sub.add_parser(
        "config", help="print the settings serve would run with, as TOML, and where each came from"
    )
    config.add_flags(s)
    s.set_defaults(func=_config)

    s = sub.add_parser("export-sglang", help="write the LM as a Qwen2 checkpoint for SGLang")
    s.add_argument(
        "--model",
        help="model directory, or `tiny` for the random test model (default: voiceagent's "
        "own voice where this copy ships one, else the tiny model)",
    )
    s.add_argument("--out", required=True, help="directory to write")
    s.set_defaults(func=_export_sglang)

    s = sub.add_parser("say", help="synthesize text to an Ogg Opus or WAV file")
    s.add_argument("text")
    s.add_argument("-o", "--output", required=True, help="out.ogg, out.opus or out.wav")
    s.add_argument("--model")
    s.add_argument("--voice", help="one of the model's voices (default: its first)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--speed", type=float, default=1.0)
    s.add_argument("--bitrate", type=int, default=32000)
    s.add_argument("--device", default="auto")
    s.set_defaults(func=_say)

    s = sub.add_parser("bench", help="measure the server: TTFA, RTF, barge-in, CPU")
    s.add_argument(
        "--scenario",
        choices=[
            "ws",
            "webrtc",
            "telephony",
            "flood",
            "cutoff",
            "chunk-cost",
            "first-packet",
            "soak",
            "tenants",
            "isolation",
            "openai",
            "intelligibility",
        ],
        default="ws",
        help="ws: sessions over WebSocket; webrtc: real-time sessions and barge-in latency "
        "over WebRTC; telephony: simulated Twilio calls with bots and barge-in; flood: another "
        "session's TTFA and late frames while clients flood the server; cutoff: "
        "work spent on a turn a barge-in cuts off; chunk-cost: flow+vocoder time of chunk "
        "1 vs 20; first-packet: time to the first packet cut into slices, baseline vs "
        "optimized; soak: server memory, fds, threads and tasks over many sessions; tenants: "
        "one tenant's TTFA while another floods up to its quotas; isolation: invariant vs "
        "batched acoustic, cost and bit differences; openai: POST /v1/audio/speech, time to "
        "the first byte vs to the whole file, per format; intelligibility: pocketsphinx WER of "
        "the held-out sentences spoken by the server next to the teacher's, with TTFA and RTF",
    )
    s.add_argument("--model")
    s.add_argument(
        "--sessions",
        help="concurrency levels (ws, isolation: 1,8; webrtc, telephony: 1,2,4,8,12,16); soak: "
        "WebSocket sessions at once in the mixed load (4)",
    )
    s.add_argument("--turns", type=int, default=3, help="turns per session (telephony: per call)")
    s.add_argument(
        "--repeats", type=int, default=1, help="chunk-cost, isolation: runs (median taken)"
    )
    s.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    s.add_argument("--lead-ms", type=int, default=200, help="pacing lead, as in serve")
    s.add_argument(
        "--max-speech-s",
        type=float,
        help="as in serve (ws: 60, webrtc, telephony: 3, intelligibility: 15)",
    )
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
    s.add_argument("--cycles", type=int, default=10000, help="soak: sessions opened and closed")
    s.add_argument("--minutes", type=float, default=30.0, help="soak: minutes of mixed load")
    s.add_argument(
        "--webrtc-sessions", type=int, default=1, help="soak: WebRTC peers in the mixed load"
    )
    s.add_argument("--out", help="soak: folder for samples.csv, soak.png, summary.json")
    s.add_argument(
        "--sentences",
        type=int,
        default=100,
        help="intelligibility: N held-out sentences to speak, spread over the set",
    )
    s.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="intelligibility: speak each sentence with sampling seeds 0 to N-1 (the WER "
        "pools them; how far each seed's WER strays is the bench's own noise)",
    )
    s.add_argument(
        "--work",
        help="intelligibility: the training work directory, as `train --out` "
        "(default: ~/.cache/voiceagent/train)",
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

    s.add_argument("--tenant", help="the tenant whose voice it is (default: shared by all)")
    s.set_defaults(func=_voice_add)

    add_auth_commands(sub)
    add_train_commands(sub)

    s = sub.add_parser("make-tiny", help="write a random-weight tiny checkpoint directory")
    s.add_argument("directory")
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_make_tiny)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.func in (_serve, _say, _bench):
        # a process-wide choice, so the program makes it, before any engine thread
        # allocates; a library user (the tests' in-process servers) keeps its own malloc
        retain_freed_memory()
    if args.func not in (_serve, _config):  # those two know the level once settings load
        configure_logging(args.log_level or "info")
    try:
        return int(args.func(args))
    except (CheckpointError, EngineError, OSError, ValueError) as exc:
        # a missing file, a port in use, a bad number: one line, no traceback (the debug
        # log level keeps it, for a bug that shows this way)
        logging.getLogger(__name__).debug("%s failed", args.func.__name__, exc_info=True)
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
