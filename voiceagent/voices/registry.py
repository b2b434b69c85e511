"""The voice registry behind /v1/voices: a tenant makes a voice from a few seconds of
reference audio, lists, reads and deletes its voices.

A voice is made once: the reference is checked and cleaned (reference.py), the model's
prompt frontend (speech tokens, prompt mel, speaker vector) runs on a worker thread, and
only those features are saved, to `voices_dir/TENANT/NAME.pt` (voice_store.py), with
metadata. The reference audio itself is not kept. The server's rescan then registers the
file as "TENANT/NAME" at once, and refreshes every catalog (server/app.py), so the voice
is usable by name in the next session of that tenant.

Tenants see the shared voices (the model's own and `voices_dir/*.pt`) and their own,
never another tenant's: an id that is not in the caller's catalog is `unknown_voice`,
whoever owns it, so ids do not leak. Shared voices cannot be deleted here (`forbidden`):
they belong to the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from ..auth.gate import Principal
from ..model.contract import Voice
from ..model.cosyvoice2.loader import FRONTEND_FILES
from ..model.cosyvoice2.prompt_frontend import PromptFrontend
from ..model.speech_model import SpeechModel
from ..model.voice_store import check_name, read_voice_file, save_voice
from ..protocol.errors import ErrorCode
from ..protocol.messages import LANGUAGES
from ..protocol.session import Catalog
from ..text.normalize import normalize
from .reference import Reference, prepare_reference

log = logging.getLogger(__name__)

MAX_TRANSCRIPT_CHARS = 1000
# Voices made at once; more wait their turn (each holds a CPU core for about a second).
MAX_CONCURRENT_CREATES = 2
# A tenant's voices being made or waiting their turn (one-off ones included): each holds
# its upload and decoded audio, so a burst beyond this is refused, not queued.
MAX_WAITING_PER_TENANT = 4
# A transcript this dense cannot be what the reference says (fast speech is ~20 chars/s).
MAX_CHARS_PER_S = 30.0
TOKENS_PER_S = 25  # speech tokens


class VoiceError(Exception):
    """A refused registry operation: a stable code and a message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class VoiceHost(Protocol):
    """What the registry needs of the server (server/app.py's VoiceServer)."""

    @property
    def model(self) -> SpeechModel: ...

    @property
    def voices_dir(self) -> Path | None: ...

    def rescan_voices(self) -> None: ...

    def catalog_for(self, principal: Principal) -> Catalog: ...

    def forget_voice(self, key: str) -> None: ...

    def voice_quota(self, tenant: str) -> int:
        """How many voices of its own the tenant may keep (0: no limit)."""
        ...


@dataclass(frozen=True)
class VoiceInfo:
    id: str  # the name the tenant uses (a session's `voice`)
    owner: Literal["shared", "tenant"]
    created_at: int | None = None  # Unix seconds; None for voices made elsewhere
    duration_s: float | None = None  # the prompt's length
    language: str | None = None
    transcript: str | None = None  # None: made without one (the LM gets no prompt)
    source_sample_rate: int | None = None
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.id,
            "owner": self.owner,
            "created_at": self.created_at,
            "duration_s": self.duration_s,
            "language": self.language,
            "transcript": self.transcript,
            "source_sample_rate": self.source_sample_rate,
            "warnings": list(self.warnings),
        }


def new_voice_id() -> str:
    return f"voice_{secrets.token_hex(6)}"


def check_fields(name: str | None, transcript: str | None, language: str) -> None:
    if name is not None:
        try:
            check_name(name)
        except ValueError as exc:
            raise VoiceError(ErrorCode.INVALID_PARAMETER, str(exc)) from None
    if transcript is not None and len(transcript) > MAX_TRANSCRIPT_CHARS:
        raise VoiceError(
            ErrorCode.INVALID_PARAMETER,
            f"'transcript' has {len(transcript)} characters; at most {MAX_TRANSCRIPT_CHARS}",
        )
    if language not in LANGUAGES:
        raise VoiceError(
            ErrorCode.INVALID_PARAMETER, f"'language' must be one of {', '.join(LANGUAGES)}"
        )


class VoiceRegistry:
    def __init__(self, host: VoiceHost) -> None:
        self.host = host
        self._frontend: PromptFrontend | None = None
        self._frontend_lock = threading.Lock()
        self._creating: set[Path] = set()  # names reserved by creations in progress
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_CREATES)
        # one creation at a time per tenant: a tenant's burst waits behind itself, and
        # the other slot stays for other tenants (and for one-off voices); one lock per
        # tenant that ever made a voice (the keys file's tenants)
        self._tenant_turn: dict[str, asyncio.Lock] = {}
        self._waiting: dict[str, int] = {}  # per tenant: in its turn or waiting for it
        self._meta: dict[Path, tuple[float, tuple[str, dict[str, Any]]]] = {}

    # -- reading ---------------------------------------------------------------------------

    async def list(self, principal: Principal) -> list[VoiceInfo]:
        """The caller's voices; their files' metadata is read off the event loop (a
        tenant's first listing after a restart may read thousands)."""
        catalog = self.host.catalog_for(principal)
        names = tuple(catalog.voices)
        return await asyncio.to_thread(lambda: [self._info(catalog, name) for name in names])

    def get(self, principal: Principal, voice_id: str) -> VoiceInfo:
        catalog = self.host.catalog_for(principal)
        if voice_id not in catalog.voices:
            raise _unknown(voice_id)
        return self._info(catalog, voice_id)

    def _info(self, catalog: Catalog, name: str) -> VoiceInfo:
        key = catalog.voice_key(name)
        voice = self.host.model.voices.get(key)
        path = self._path_of(key)
        text, meta = self._read_meta(path) if path is not None else ("", {})
        duration = meta.get("duration_s")
        if duration is None and voice is not None and voice.prompt_tokens:
            duration = round(len(voice.prompt_tokens) / TOKENS_PER_S, 2)
        return VoiceInfo(
            id=name,
            owner="tenant" if "/" in key else "shared",
            created_at=meta.get("created_at"),
            duration_s=duration,
            language=meta.get("language"),
            transcript=text or None,
            source_sample_rate=meta.get("source_sample_rate"),
            warnings=tuple(meta.get("warnings", ())),
        )

    def _path_of(self, key: str) -> Path | None:
        folder = self.host.voices_dir
        if folder is None:
            return None
        path = folder / f"{key}.pt"  # "acme/anna" -> voices_dir/acme/anna.pt
        return path if path.is_file() else None

    def _read_meta(self, path: Path) -> tuple[str, dict[str, Any]]:
        """A voice file's transcript and metadata, read once per version of the file."""
        try:
            mtime = path.stat().st_mtime
            cached = self._meta.get(path)
            if cached is None or cached[0] != mtime:
                _, text, meta = read_voice_file(path)
                cached = self._meta[path] = (mtime, (text, meta))
            return cached[1]
        except Exception as exc:  # a file replaced or removed meanwhile: no metadata
            log.debug("no metadata for %s: %s", path, exc)
            return "", {}

    # -- writing ---------------------------------------------------------------------------

    async def create(
        self,
        principal: Principal,
        audio: bytes,
        name: str | None = None,
        transcript: str | None = None,
        language: str = "auto",
    ) -> VoiceInfo:
        """Make a voice of the caller's tenant; raises VoiceError or ReferenceAudioError."""
        transcript = (transcript or "").strip() or None
        check_fields(name, transcript, language)
        model, folder = self.host.model, self.host.voices_dir
        self._check_can_clone()
        if folder is None:
            raise VoiceError(
                ErrorCode.VOICE_CLONING_UNSUPPORTED,
                "this server has no voices folder to keep voices in (server.voices)",
            )
        tenant = principal.tenant
        voice_id = name or new_voice_id()
        path = folder / tenant / f"{voice_id}.pt"
        if path in self._creating or f"{tenant}/{voice_id}" in model.voices:
            raise VoiceError(ErrorCode.VOICE_EXISTS, f"voice {voice_id!r} already exists")
        if path.exists():  # a file the rescan could not load
            raise VoiceError(
                ErrorCode.VOICE_EXISTS,
                f"voice {voice_id!r} already exists, but its file cannot be loaded by this "
                "model; DELETE it to use the name again",
            )
        self._check_quota(tenant)
        self._creating.add(path)
        try:
            async with self._turn_of(tenant):
                ref = await asyncio.to_thread(prepare_reference, audio)
                info = await asyncio.to_thread(
                    self._make, path, voice_id, ref, transcript, language
                )
        finally:
            self._creating.discard(path)
        self.host.rescan_voices()  # registers "TENANT/NAME" and refreshes the catalogs
        log.info(
            "voice '%s/%s' made from %.1f s of audio at %d Hz",
            tenant,
            voice_id,
            ref.duration_s,
            ref.source_rate,
        )
        return info

    def _check_quota(self, tenant: str) -> None:
        """Its voices, those being made included, against its quota."""
        limit = self.host.voice_quota(tenant)
        if not limit:
            return
        prefix = f"{tenant}/"
        kept = sum(1 for key in self.host.model.voices if key.startswith(prefix))
        making = sum(1 for path in self._creating if path.parent.name == tenant)
        if kept + making >= limit:
            raise VoiceError(
                ErrorCode.QUOTA_EXCEEDED,
                f"tenant '{tenant}' is at its quota of {limit} voices; delete one first",
            )

    def _make(
        self,
        path: Path,
        voice_id: str,
        ref: Reference,
        transcript: str | None,
        language: str,
    ) -> VoiceInfo:
        """On a worker thread: the prompt features, then the file."""
        voice = self._voice(voice_id, ref, transcript, language)
        warnings = list(ref.warnings)
        if transcript is not None and len(transcript) > MAX_CHARS_PER_S * ref.duration_s:
            warnings.append(
                f"the transcript has {len(transcript)} characters for {ref.duration_s:.1f} s "
                "of audio: check that it is what the reference says"
            )
        meta: dict[str, Any] = {
            "created_at": int(time.time()),
            "duration_s": round(ref.duration_s, 2),
            "speech_s": round(ref.speech_s, 2),
            "language": language,
            "source_sample_rate": ref.source_rate,
            "warnings": warnings,
        }
        try:
            save_voice(path.parent, voice, transcript or "", meta, replace=False)
        except FileExistsError:  # made meanwhile by another server sharing the folder
            raise VoiceError(ErrorCode.VOICE_EXISTS, f"voice {voice_id!r} already exists") from None
        except OSError as exc:  # a read-only or full volume: the operator's to fix
            log.error("voice %s not saved: %s", path, exc)
            raise VoiceError(
                ErrorCode.VOICE_STORAGE_FAILED,
                "the server cannot store voices now (its voices folder cannot be written); "
                "the operator has been told in the log",
            ) from None
        return VoiceInfo(
            id=voice_id,
            owner="tenant",
            created_at=meta["created_at"],
            duration_s=meta["duration_s"],
            language=language,
            transcript=transcript,
            source_sample_rate=ref.source_rate,
            warnings=tuple(warnings),
        )

    def _voice(self, name: str, ref: Reference, transcript: str | None, language: str) -> Voice:
        """The prompt features of a checked reference (on a worker thread)."""
        model = self.host.model
        text_ids = model.tokenizer.encode(normalize(transcript, language)) if transcript else []
        prompt = self._prompt_frontend().prompt_from_pcm(ref.pcm, 24000, text_ids)
        voice = Voice(name=name, **prompt, lm_prompt=transcript is not None)
        model.check_voice(voice)
        return voice

    async def one_off(
        self, principal: Principal, audio: bytes, transcript: str | None, language: str
    ) -> Voice:
        """A voice for one request (`POST /v1/tts` with inline reference audio): made as
        `create` makes one, in the tenant's turn as its creations are, never saved or
        listed; its name is unique. Raises VoiceError or ReferenceAudioError."""
        transcript = (transcript or "").strip() or None
        check_fields(None, transcript, language)
        self._check_can_clone()
        async with self._turn_of(principal.tenant):
            ref = await asyncio.to_thread(prepare_reference, audio)
            return await asyncio.to_thread(
                self._voice, f"one-off-{secrets.token_hex(8)}", ref, transcript, language
            )

    @contextlib.asynccontextmanager
    async def _turn_of(self, tenant: str) -> AsyncIterator[None]:
        """The tenant's turn to make a voice, and one of the server's slots for it."""
        if self._waiting.get(tenant, 0) >= MAX_WAITING_PER_TENANT:
            raise VoiceError(
                ErrorCode.RATE_LIMITED,
                f"{MAX_WAITING_PER_TENANT} voices of this tenant are being made or waiting; "
                "send this again when one is done",
            )
        self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        try:
            async with self._tenant_turn.setdefault(tenant, asyncio.Lock()), self._slots:
                yield
        finally:
            self._waiting[tenant] -= 1

    def _check_can_clone(self) -> None:
        model = self.host.model
        if model.frontend_dir is None:
            raise VoiceError(
                ErrorCode.VOICE_CLONING_UNSUPPORTED,
                f"model '{model.name}' cannot make voices from audio: that needs a CosyVoice2 "
                f"directory with its prompt frontend files ({', '.join(FRONTEND_FILES)})",
            )

    def _prompt_frontend(self) -> PromptFrontend:
        with self._frontend_lock:  # built once, by the first voice made
            if self._frontend is None:
                folder = self.host.model.frontend_dir
                assert folder is not None
                try:
                    self._frontend = PromptFrontend(*(folder / f for f in FRONTEND_FILES))
                except (OSError, ValueError) as exc:
                    raise VoiceError(
                        ErrorCode.VOICE_CLONING_UNSUPPORTED,
                        f"the model's prompt frontend cannot be loaded: {exc}",
                    ) from None
            return self._frontend

    def delete(self, principal: Principal, voice_id: str) -> None:
        catalog = self.host.catalog_for(principal)
        if voice_id not in catalog.voices:
            if not self._delete_unloadable(principal.tenant, voice_id):
                raise _unknown(voice_id)
            return
        key = catalog.voice_key(voice_id)
        if "/" not in key:
            raise VoiceError(
                ErrorCode.FORBIDDEN,
                f"voice {voice_id!r} is shared by every tenant; only the operator removes it "
                "(its file in the voices folder, or the model's own voices)",
            )
        path = self._path_of(key)
        if path is not None:
            path.unlink(missing_ok=True)
            self._meta.pop(path, None)
        self.host.rescan_voices()  # forgets the voice and refreshes the catalogs
        self.host.model.voices.pop(key, None)  # also if its file was already gone
        self.host.forget_voice(key)
        log.info("voice '%s' deleted", key)

    def _delete_unloadable(self, tenant: str, voice_id: str) -> bool:
        """A tenant's voice file the server could not load (made for another model, or
        damaged) is not a voice, but its name is taken until it is deleted."""
        folder = self.host.voices_dir
        try:
            check_name(voice_id)
        except ValueError:
            return False
        path = None if folder is None else folder / tenant / f"{voice_id}.pt"
        if path is None or not path.is_file():
            return False
        path.unlink(missing_ok=True)
        self._meta.pop(path, None)
        log.info("voice file %s deleted (the server could not load it)", path)
        return True


def _unknown(voice_id: str) -> VoiceError:
    return VoiceError(ErrorCode.UNKNOWN_VOICE, f"unknown voice {voice_id[:64]!r}")
