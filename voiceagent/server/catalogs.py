"""The voices and roles a session may choose, by whom it serves: the model's own voices,
the voices folder's (`voices_dir/NAME.pt`, shared; `voices_dir/TENANT/NAME.pt`, that
tenant's alone) and the roles file's. A running server rescans them (`rescan`), so that
voices added, replaced or deleted on disk, and roles edited, apply without a restart."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from ..auth.gate import Principal
from ..engine.embedded import EmbeddedEngine
from ..model.voice_store import load_voice
from ..protocol.messages import Sampling
from ..protocol.roles import Role, parse_roles
from ..protocol.session import Catalog

log = logging.getLogger(__name__)


class Catalogs:
    def __init__(
        self, engine: EmbeddedEngine, voices_dir: Path | None, roles_file: Path | None
    ) -> None:
        self.engine = engine
        self.voices_dir = voices_dir
        self.roles_file = roles_file
        model = engine.model
        temperature, top_k, top_p = model.sampling.drawing
        # what every tenant sees (sessions without auth: all of it)
        self.shared = Catalog(
            voices=tuple(model.voices),
            model={
                "name": model.name,
                "random_weights": model.random_weights,
                "warning": model.warning,
                "engine": engine.name,
            },
            default_voice=next(iter(model.voices), ""),
            sampling=Sampling(temperature, top_k, top_p),
        )
        self._voice_files: dict[Path, float] = {}
        self._catalogs: dict[tuple[str, str | None], Catalog] = {}
        self.roles: dict[str, Role] = {}
        self._roles_seen: float | None = -1.0  # the roles file's mtime (None: missing)
        self.rescan()

    def _changed_voice_files(self) -> list[Path]:
        """Voice files new or changed since the last look: `voices_dir/NAME.pt` are shared
        by every tenant, `voices_dir/TENANT/NAME.pt` are that tenant's alone."""
        folder = self.voices_dir
        if folder is None or not folder.is_dir():
            return []
        files = [*folder.glob("*.pt"), *folder.glob("*/*.pt")]
        return [p for p in files if self._voice_files.get(p) != p.stat().st_mtime]

    def rescan(self) -> None:
        """Pick up voices added (or replaced) in `voices_dir` since the last look, and
        forget those whose file was deleted; reread the roles file if it changed."""
        changed = self._reread_roles()
        for path in [p for p in self._voice_files if not p.exists()]:
            del self._voice_files[path]
            key = self._voice_key(path)
            if self.engine.model.voices.pop(key, None) is not None:
                self.engine.acoustic.forget_voice(key)  # and its cached flow state
                log.info("voice '%s' removed (%s was deleted)", key, path)
                changed = True
        for path in self._changed_voice_files():
            self._voice_files[path] = path.stat().st_mtime
            try:
                voice = load_voice(path)
                self.engine.model.check_voice(voice)
            except Exception as exc:
                log.warning("voice file %s is not usable with this model: %s", path, exc)
                continue
            key = self._voice_key(path)
            # the engine caches per voice name: a tenant's voice is named by its key
            self.engine.model.voices[key] = dataclasses.replace(voice, name=key)
            log.info("voice '%s' loaded from %s", key, path)
            changed = True
        if not changed:  # every 2 s: with thousands of tenants' catalogs, only if needed
            return
        self.shared.voices = tuple(v for v in self.engine.model.voices if "/" not in v)
        self.shared.roles = self._roles_of(self.shared.voices)
        if not self.shared.default_voice and self.shared.voices:
            self.shared.default_voice = self.shared.voices[0]
        owned = self._voices_by_tenant()
        for (tenant, scope), catalog in self._catalogs.items():
            self._fill(catalog, owned.get(tenant, {}), scope)

    def _reread_roles(self) -> bool:
        """Whether the roles changed."""
        path = self.roles_file
        if path is None:
            return False
        try:
            seen = path.stat().st_mtime
        except OSError:
            seen = None  # missing: said once, until it is back
        if seen == self._roles_seen:
            return False
        self._roles_seen = seen
        try:
            self.roles = parse_roles(path.read_text(encoding="utf-8"), str(path))
        except (OSError, ValueError) as exc:
            log.warning("roles not (re)loaded, keeping %d: %s", len(self.roles), exc)
            return False
        log.info("roles loaded from %s: %s", path, ", ".join(self.roles) or "none")
        return True

    def _roles_of(self, voices: tuple[str, ...]) -> dict[str, Role]:
        """The roles whose voice is among `voices` (a role never shadows a voice)."""
        return {
            name: role
            for name, role in self.roles.items()
            if role.voice in voices and name not in voices
        }

    def _voice_key(self, path: Path) -> str:
        """`voices_dir/anna.pt` is the shared "anna"; `voices_dir/acme/anna.pt` is "acme/anna"."""
        shared = path.parent == self.voices_dir
        return path.stem if shared else f"{path.parent.name}/{path.stem}"

    def for_principal(self, principal: Principal) -> Catalog:
        """The shared voices and the tenant's own (a voice-scoped token: that one only);
        kept current by the rescan, like the shared catalog."""
        tenant, scope = principal.tenant, principal.voice
        catalog = self._catalogs.get((tenant, scope))
        if catalog is None:
            catalog = Catalog(
                (), self.shared.model, "", tenant=tenant, sampling=self.shared.sampling
            )
            own = self._voices_by_tenant([tenant]).get(tenant, {})
            self._catalogs[(tenant, scope)] = self._fill(catalog, own, scope)
        return catalog

    def _voices_by_tenant(self, tenants: list[str] | None = None) -> dict[str, dict[str, str]]:
        """Tenant (all, or those named) -> its voices' names -> keys ({"anna": "acme/anna"})."""
        owned: dict[str, dict[str, str]] = {}
        for key in self.engine.model.voices:
            tenant, slash, name = key.partition("/")
            if slash and (tenants is None or tenant in tenants):
                owned.setdefault(tenant, {})[name] = key
        return owned

    def _fill(self, catalog: Catalog, own: dict[str, str], scope: str | None) -> Catalog:
        """`catalog` set to the shared voices and `own` (a tenant's, by name: their keys)."""
        names = [*(v for v in self.shared.voices if v not in own), *own]
        if scope is not None:
            names = [v for v in names if v == scope]
        catalog.voices = tuple(names)
        catalog.keys = own
        catalog.roles = self._roles_of(catalog.voices)
        default = self.shared.default_voice
        catalog.default_voice = default if default in names else next(iter(names), "")
        return catalog
