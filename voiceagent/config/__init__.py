"""The server's one configuration: a TOML file, environment variables and `serve` flags,
merged and validated before anything starts (no model is loaded for a bad value).

Precedence: flag > environment > file > default. The file is `--config FILE` or
$VOICEAGENT_CONFIG; a variable is VOICEAGENT_<SECTION>__<KEY> (VOICEAGENT_SERVER__PORT).
Every value remembers where it came from, so that an error and `voiceagent config` can
say so. Keys that mean "unset" take "" or 0: TOML has no null.
"""

from .flags import add_flags, flag_values
from .load import ConfigError, Loaded, load, render, toml_value
from .schema import (
    CONFIG_ENV,
    ENV_PREFIX,
    TWILIO_TOKEN_ALIAS,
    KeyInfo,
    Settings,
    schema_keys,
    voices_folder,
)

__all__ = [
    "CONFIG_ENV",
    "ENV_PREFIX",
    "TWILIO_TOKEN_ALIAS",
    "ConfigError",
    "KeyInfo",
    "Loaded",
    "Settings",
    "add_flags",
    "flag_values",
    "load",
    "render",
    "schema_keys",
    "toml_value",
    "voices_folder",
]
