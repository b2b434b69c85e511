"""The schema: every key of the server's configuration, its default, meaning, flag and
range, one pydantic model per [section] of the TOML file, and what the server and the
engine are built with from them.

Over 500 lines: one key after another, each with its meaning and range, which read best
in one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

if TYPE_CHECKING:
    from ..model.speech_model import SpeechModel
    from ..server.app import ServerConfig

ENV_PREFIX = "VOICEAGENT_"
CONFIG_ENV = "VOICEAGENT_CONFIG"  # the file, when --config is not given
# The variable that held the Twilio token before there was a config; still read.
TWILIO_TOKEN_ALIAS = "VOICEAGENT_TWILIO_AUTH_TOKEN"

Key = str  # "section.key", as in the file's [section] key = value


def setting(default: Any, meaning: str, flag: str | None = None, **rules: Any) -> Any:
    """One key: its default, a one-line meaning, its `serve` flag if it has one, and the
    range pydantic checks (ge=, le=, ...)."""
    extra: dict[str, Any] | None = {"flag": flag} if flag else None
    return Field(default, description=meaning, json_schema_extra=extra, **rules)


MASK = "***"  # how `voiceagent config` prints a secret that is set


class Section(BaseModel):
    # inf and nan: no key here means anything by them (0 says "never" where it can)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic would read `port = true` as 1; no key here is a switch
        if isinstance(value, bool):
            raise PydanticCustomError("no_bool", "Input should not be true or false")
        # `voiceagent config`'s output read back: the mask would become the secret
        field = cls.model_fields[info.field_name or ""]
        if field.annotation is SecretStr and value == MASK:
            raise PydanticCustomError(
                "masked", "is the mask `voiceagent config` prints; give the secret itself"
            )
        return value


def _url(value: str, schemes: tuple[str, ...]) -> str:
    if value and not value.startswith(schemes):
        raise PydanticCustomError("url", "should start with {s}", {"s": " or ".join(schemes)})
    return value


class ServerSection(Section):
    host: str = setting("127.0.0.1", "address to bind (0.0.0.0: all interfaces)", "--host")
    port: int = setting(8000, "HTTP, WebSocket and WebRTC signaling port", "--port", ge=1, le=65535)
    max_sessions: int = setting(
        64, "concurrent sessions, WebSocket and WebRTC together", "--max-sessions", ge=1
    )
    max_live_turns: int = setting(
        128, "live turns across all sessions; beyond it a turn gets server_busy", ge=1
    )
    drain_timeout_s: float = setting(
        30.0, "on SIGTERM, seconds live turns may finish before sessions close", ge=0
    )
    web: str = setting("", "demo page folder served at / (empty: the checkout's web/)", "--web")
    voices: str = setting("", "folder of added voices (empty: MODEL/voices)", "--voices")
    roles: str = setting("", "TOML file of roles: names for a voice and its defaults", "--roles")

    @field_validator("host")
    @classmethod
    def _host_not_empty(cls, value: str) -> str:
        if not value:
            raise PydanticCustomError("host", "should not be empty")
        return value


class SessionSection(Section):
    max_turns: int = setting(8, "live turns per session", "--max-turns", ge=1)
    max_message_bytes: int = setting(
        64 * 1024, "largest client JSON message, in UTF-8 bytes", "--max-message-bytes", ge=1
    )
    max_text_chars: int = setting(
        20_000, "most text per turn, in characters", "--max-text-chars", ge=1
    )


class PlayoutSection(Section):
    lead_ms: int = setting(200, "audio sent ahead of real time, in ms", "--lead-ms", ge=0)
    max_ahead_ms: int = setting(
        5000, "audio a turn may synthesize ahead of sending, in ms (0: no bound)", "--max-ahead-ms"
    )
    # NoDecode: the environment and the flag say "4,8,16,25", not only JSON
    chunks: Annotated[tuple[Annotated[int, Field(gt=0)], ...], NoDecode] = setting(
        (4, 8, 16, 25), "speech tokens per acoustic chunk, in order; the last repeats", "--chunks"
    )
    max_speech_s: float = setting(
        60.0, "ceiling on one text segment's speech, in seconds", "--max-speech-s", ge=0.04
    )  # 0.04 s: one speech token
    vocoder_hold_back: int = setting(
        4,
        "mel frames (20 ms each) the vocoder holds back for right context: fewer give audio "
        "sooner, approximately; -1: the model's exact hold-back (HiFT: 20 frames)",
        "--vocoder-hold-back",
        ge=-1,
    )
    webrtc_buffer_ms: int = setting(
        200, "WebRTC: audio queued on a track ahead of real time, in ms", "--webrtc-buffer-ms", ge=0
    )

    @field_validator("max_ahead_ms")
    @classmethod
    def _not_negative(cls, value: int) -> int:
        if value < 0:
            raise PydanticCustomError("ahead", "should be 0 (no bound) or more")
        return value

    @field_validator("chunks", mode="before")
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            items = value.strip().removeprefix("[").removesuffix("]").split(",")
            value = [item.strip() for item in items if item.strip()]
        if isinstance(value, list | tuple) and not value:
            raise PydanticCustomError("chunks", "should name at least one chunk size")
        return value


class ModelSection(Section):
    path: str = setting(
        "",
        "model directory (empty: voiceagent's own voice; tiny: the random-weight test model)",
        "--model",
    )
    device: str = setting(
        "auto", "cpu, cuda or cuda:N (auto: cuda if torch sees a GPU)", "--device"
    )

    @field_validator("device")
    @classmethod
    def _known_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
            raise PydanticCustomError("device", "should be auto, cpu, cuda or cuda:N")
        return value


class EngineSection(Section):
    kind: Literal["embedded", "sglang"] = setting(
        "embedded", "where the LM runs: embedded (in process) or sglang", "--engine"
    )
    max_batch: int = setting(16, "LM decode batch (KV slots)", "--max-batch", ge=1)
    threads: int = setting(
        0,
        "torch CPU threads (0: half the cores, the LM and acoustic threads side by side)",
        "--threads",
        ge=0,
    )
    acoustic_batching: Literal["invariant", "batched"] = setting(
        "invariant",
        "invariant: each turn's chunks run alone, its audio bit-identical whatever runs "
        "beside it; batched: chunks of several turns run as one batch",
        "--acoustic-batching",
    )
    lm_int8: Literal["off", "prefill", "all"] = setting(
        "off",
        "embedded LM on CPU: run prompt prefills (prefill) or prefills and decode steps (all) "
        "through int8 copies of its layers; faster, approximate (bench first-packet reports "
        "how far the logits move)",
        "--lm-int8",
    )
    lm_precision: Literal["auto", "float32", "bfloat16"] = setting(
        "auto",
        "embedded LM weights and KV slots: bfloat16 halves their memory and reading "
        "(approximate); auto: bfloat16 on CUDA, float32 on the CPU",
        "--lm-precision",
    )
    cuda_graphs: Literal["on", "off"] = setting(
        "on",
        "on CUDA, the embedded LM's decode steps replay CUDA graphs captured at start (one "
        "per batch and length bucket): no per-kernel launch cost",
        "--cuda-graphs",
    )
    flow_precision: Literal["float32", "bfloat16", "int8"] = setting(
        "float32",
        "the acoustic worker's flow: bfloat16 halves its per-turn cache; int8 (CPU) runs "
        "its estimator in int8 (its convolutions as matrix products), a faster first "
        "chunk, its attention caches in bfloat16 (half the per-turn cache too); both "
        "approximate",
        "--flow-precision",
    )
    flow_window_s: float = setting(
        20.0,
        "seconds of a turn's own past audio the flow reads back (0: all): bounds its "
        "per-turn state; approximate past it (not with acoustic_batching batched)",
        "--flow-window",
        ge=0,
    )
    flow_prompt_tail: Literal["rerun", "primed"] = setting(
        "rerun",
        "rerun: a turn's first chunk runs the voice prompt's last 3 tokens again, with the "
        "turn's first tokens as their lookahead (exact); primed: the prompt is primed to "
        "its end and the first chunk runs its own tokens only (cheaper, approximate)",
        "--flow-prompt-tail",
    )
    priority: Literal["first-audio", "fair"] = setting(
        "first-audio",
        "first-audio: while a turn's first chunk is on the acoustic worker, the embedded LM "
        "works only for turns with no audio out yet either, and while the acoustic worker "
        "is idle the LM uses its threads too; fair: the LM never sits out and keeps its "
        "own threads",
        "--priority",
    )
    sglang_url: str = setting(
        "", "SGLang server, e.g. http://127.0.0.1:30000 (kind sglang)", "--sglang-url"
    )
    sglang_export: str = setting(
        "", "the directory export-sglang wrote (kind sglang)", "--sglang-export"
    )
    sglang_timeout_s: float = setting(
        30.0, "seconds per request to SGLang", "--sglang-timeout", gt=0
    )

    @field_validator("sglang_url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _url(value, ("http://", "https://"))

    @model_validator(mode="after")
    def _int8_is_float32s(self) -> EngineSection:
        if self.lm_int8 != "off" and self.lm_precision == "bfloat16":
            raise PydanticCustomError(
                "lm_int8",
                "int8 layers are made from the float32 LM: not with lm_precision bfloat16",
                {"key": "lm_int8"},
            )
        return self

    @model_validator(mode="after")
    def _sglang_needs_its_server(self) -> EngineSection:
        missing = [f"engine.{k}" for k in ("sglang_url", "sglang_export") if not getattr(self, k)]
        if self.kind == "sglang" and missing:
            # "key" names the key the error is reported under (see _problem)
            raise PydanticCustomError(
                "sglang", "needs {missing}", {"key": "kind", "missing": " and ".join(missing)}
            )
        return self


class TelephonySection(Section):
    public_url: str = setting(
        "", "the https:// URL carriers reach this server by (Twilio signs it)", "--public-url"
    )
    audiosocket_port: int = setting(
        0, "Asterisk AudioSocket TCP port (0: off)", "--audiosocket-port", ge=0, le=65535
    )
    audiosocket_host: str = setting(
        "",
        "address AudioSocket listens on (empty: server.host); it has no credentials: "
        "keep it on a private interface",
        "--audiosocket-host",
    )
    bot_attach_timeout_s: float = setting(
        10.0,
        "seconds a call waits for its bot (and a bot for its call)",
        "--bot-attach-timeout",
        gt=0,
    )
    twilio_auth_token: SecretStr = setting(
        SecretStr(""),
        "when set, X-Twilio-Signature is checked (a secret: keep it in the environment)",
    )

    @field_validator("public_url")
    @classmethod
    def _https(cls, value: str) -> str:
        return _url(value, ("https://",))


class GuardSection(Section):
    """Per-client protection (transport/guard.py); docs/security.md."""

    messages_per_s: float = setting(
        200.0,
        "messages per second read from one connection; faster ones are read at this rate",
        gt=0,
    )
    message_burst: int = setting(
        400, "messages one connection may send at once above that rate", ge=1
    )
    flood_close_s: float = setting(
        5.0, "seconds a connection may be held back at its rate without a pause, then closed", gt=0
    )
    start_timeout_s: float = setting(
        10.0, "seconds a socket may wait before session.start, then closed", gt=0
    )
    idle_timeout_s: float = setting(
        0.0, "seconds without a message or a live turn before closing (0: never)", ge=0
    )
    send_timeout_s: float = setting(
        10.0, "seconds a send may block on a client that stopped reading", gt=0
    )
    connections_per_s: float = setting(
        20.0, "new connections per second from one address (loopback exempt)", gt=0
    )
    connection_burst: int = setting(
        40, "new connections one address may open at once above that rate", ge=1
    )


class AuthSection(Section):
    mode: Literal["auto", "on", "off"] = setting(
        "auto", "auto (on unless server.host is loopback), on or off", "--auth"
    )
    keys_file: str = setting(
        "", "API keys and tenants' quotas, TOML (re-read when it changes)", "--keys-file"
    )
    token_secret: SecretStr = setting(
        SecretStr(""), "HMAC secret of session tokens (empty: random per process)"
    )
    token_ttl_s: int = setting(3600, "longest life of a session token, in seconds", ge=1)
    metrics: Literal["open", "required"] = setting(
        "open", "/metrics: open, or required (a credential, like /v1/)"
    )


class LogSection(Section):
    level: Literal["debug", "info", "warning", "error"] = setting(
        "info", "debug, info, warning or error", "--log-level"
    )
    format: Literal["text", "json"] = setting(
        "text", "text (readable lines) or json (one object per line), on stderr", "--log-format"
    )


class Settings(BaseSettings):
    """Every setting of `voiceagent serve`, one section per [table] of the file."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerSection = ServerSection()
    session: SessionSection = SessionSection()
    playout: PlayoutSection = PlayoutSection()
    model: ModelSection = ModelSection()
    engine: EngineSection = EngineSection()
    telephony: TelephonySection = TelephonySection()
    guard: GuardSection = GuardSection()
    auth: AuthSection = AuthSection()
    log: LogSection = LogSection()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load() reads file, environment and flags itself, to know where each value came
        # from; the model only validates what it is given.
        return (init_settings,)

    def voices_dir(self) -> Path:
        return voices_folder(self.server.voices or None, self.model.path or None)

    def engine_options(self, model: SpeechModel) -> dict[str, Any]:
        """The embedded engine's options over `model` (all but the LM backend, which the
        caller builds: SGLang's client)."""
        from ..engine.embedded import default_threads, lm_dtype

        e = self.engine
        return {
            "max_batch": e.max_batch,
            "threads": e.threads or default_threads(),
            "acoustic_batching": e.acoustic_batching,
            "int8_prefill": e.lm_int8 != "off",
            "int8_decode": e.lm_int8 == "all",
            "flow_precision": e.flow_precision,
            "first_audio_first": e.priority == "first-audio",
            "flow_window": round(e.flow_window_s * 25) or None,  # 25 tokens/s
            "prompt_tail": e.flow_prompt_tail,
            "lm_dtype": lm_dtype(e.lm_precision, model.device, e.lm_int8 != "off"),
            "lm_graphs": e.cuda_graphs == "on" and model.device.type == "cuda",
            # the model's first voice, what a session speaks in when it names none
            "warm": list(model.voices.values())[:1],
            "warm_hold_backs": [h] if (h := self.playout.vocoder_hold_back) >= 0 else [],
        }

    def server_config(self) -> ServerConfig:
        """The server's runtime configuration (the engine is built by the caller)."""
        from ..audio.format import FRAME_MS
        from ..auth.gate import AuthConfig
        from ..pipeline.turn import ChunkSchedule
        from ..protocol.session import Limits
        from ..server.app import DEFAULT_WEB_DIR, ServerConfig
        from ..session.playout import PlayoutConfig
        from ..telephony.call import TelephonyConfig
        from ..transport.guard import GuardConfig
        from ..transport.webrtc import WebRtcConfig

        server, playout, phone = self.server, self.playout, self.telephony
        return ServerConfig(
            host=server.host,
            port=server.port,
            max_sessions=server.max_sessions,
            max_live_turns=server.max_live_turns,
            drain_timeout_s=server.drain_timeout_s,
            limits=Limits(
                max_message_bytes=self.session.max_message_bytes,
                max_text_chars=self.session.max_text_chars,
                max_turns=self.session.max_turns,
            ),
            playout=PlayoutConfig(
                lead_ms=playout.lead_ms,
                schedule=ChunkSchedule(playout.chunks),
                max_segment_tokens=int(playout.max_speech_s * 25),
                max_ahead_ms=playout.max_ahead_ms,
                hold_back=None if playout.vocoder_hold_back < 0 else playout.vocoder_hold_back,
            ),
            voices_dir=self.voices_dir(),
            roles_file=Path(server.roles) if server.roles else None,
            webrtc=WebRtcConfig(track_buffer_frames=max(1, playout.webrtc_buffer_ms // FRAME_MS)),
            telephony=TelephonyConfig(
                attach_timeout_s=phone.bot_attach_timeout_s,
                twilio_auth_token=phone.twilio_auth_token.get_secret_value() or None,
                public_url=phone.public_url or None,
                audiosocket_port=phone.audiosocket_port or None,
                audiosocket_host=phone.audiosocket_host or server.host,
            ),
            guard=GuardConfig(**self.guard.model_dump()),
            web_dir=Path(server.web) if server.web else DEFAULT_WEB_DIR,
            auth=AuthConfig(
                mode=self.auth.mode,
                keys_file=Path(self.auth.keys_file) if self.auth.keys_file else None,
                token_secret=self.auth.token_secret.get_secret_value(),
                token_ttl_s=self.auth.token_ttl_s,
                metrics=self.auth.metrics,
            ),
        )


def voices_folder(voices: str | None, model: str | None) -> Path:
    """Where `voice add` writes and `serve` reads added voices: the model directory's
    `voices/`, except for the voice shipped in the package (which may be read-only) and
    `tiny` (a name, not a folder), whose voices go to the user's cache."""
    if voices:
        return Path(voices)
    if model and model != "tiny":
        return Path(model) / "voices"
    from ..model.tiny.checkpoint import default_tiny_dir

    return default_tiny_dir() / "voices"


@dataclass(frozen=True)
class KeyInfo:
    key: Key
    default: Any
    meaning: str
    flag: str | None
    annotation: Any


def schema_keys() -> list[KeyInfo]:
    """Every key of the schema, in file order."""
    found = []
    for section, field in Settings.model_fields.items():
        assert field.annotation is not None
        for name, sub in field.annotation.model_fields.items():
            extra = sub.json_schema_extra if isinstance(sub.json_schema_extra, dict) else {}
            flag = extra.get("flag")
            found.append(
                KeyInfo(
                    f"{section}.{name}",
                    sub.default,
                    sub.description or "",
                    flag if isinstance(flag, str) else None,
                    sub.annotation,
                )
            )
    return found
