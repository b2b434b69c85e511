"""The configuration as an operator meets it: a TOML file, VOICEAGENT_* variables and
`serve` flags, one winning over the other, checked before anything starts.

Real files in tmp_path, the real environment (monkeypatch), the real command line
(`voiceagent.cli.main`, and one subprocess).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from voiceagent import cli, config
from voiceagent.cli import main
from voiceagent.engine.sglang.export import export_sglang

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "deploy" / "voiceagent.example.toml"


@pytest.fixture(autouse=True)
def no_voiceagent_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts from an environment without VOICEAGENT_* variables."""
    for name in list(os.environ):
        if name.upper().startswith("VOICEAGENT_"):
            monkeypatch.delenv(name)


def toml_file(tmp_path: Path, text: str, name: str = "voiceagent.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def shown(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict, list[str]]:
    """`voiceagent [argv...] config ...`: the printed settings, parsed, and its lines."""
    code, out, err = run(argv, capsys)
    assert code == 0, err
    return tomllib.loads(out), out.splitlines()


def line_of(lines: list[str], key: str) -> str:
    return next(line for line in lines if line.startswith(f"{key} = "))


# -- precedence: flag > environment > file > default ------------------------------------


def test_each_layer_overrides_the_one_below_it(tmp_path, monkeypatch, capsys):
    file = toml_file(
        tmp_path, "[server]\nport = 9001\nmax_sessions = 5\n[session]\nmax_turns = 3\n"
    )

    values, _ = shown(["config"], capsys)
    assert values["server"]["port"] == 8000  # the default

    values, _ = shown(["config", "--config", str(file)], capsys)
    assert values["server"]["port"] == 9001  # the file over the default

    monkeypatch.setenv("VOICEAGENT_SERVER__PORT", "9002")
    values, _ = shown(["config", "--config", str(file)], capsys)
    assert values["server"]["port"] == 9002  # the environment over the file

    values, lines = shown(["config", "--config", str(file), "--port", "9003"], capsys)
    assert values["server"]["port"] == 9003  # the flag over the environment
    # each key on its own: the flag for port leaves the file's other keys in effect
    assert values["server"]["max_sessions"] == 5 and values["session"]["max_turns"] == 3
    assert line_of(lines, "port").endswith("# flag --port")
    assert line_of(lines, "max_sessions").endswith(f"# file {file}")
    assert line_of(lines, "host").endswith("# default")


def test_a_list_a_choice_and_the_global_log_level_follow_the_same_order(
    tmp_path, monkeypatch, capsys
):
    file = toml_file(tmp_path, '[playout]\nchunks = [2, 4]\n[log]\nlevel = "warning"\n')
    monkeypatch.setenv("VOICEAGENT_LOG__LEVEL", "error")
    monkeypatch.setenv("VOICEAGENT_PLAYOUT__CHUNKS", "3,6,9")  # a list in a variable
    values, lines = shown(["config", "--config", str(file)], capsys)
    assert values["playout"]["chunks"] == [3, 6, 9]
    assert values["log"]["level"] == "error"
    assert line_of(lines, "chunks").endswith("# env VOICEAGENT_PLAYOUT__CHUNKS")

    # --log-level goes before the command, and is log.level's flag
    values, lines = shown(["--log-level", "debug", "config", "--chunks", "5,10"], capsys)
    assert values["log"]["level"] == "debug" and values["playout"]["chunks"] == [5, 10]
    assert line_of(lines, "level").endswith("# flag --log-level")


def test_the_file_may_be_named_by_VOICEAGENT_CONFIG(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VOICEAGENT_CONFIG", str(toml_file(tmp_path, '[model]\ndevice = "cpu"\n')))
    values, _ = shown(["config"], capsys)
    assert values["model"]["device"] == "cpu"


def test_the_old_twilio_variable_still_sets_the_token_and_the_new_name_wins(monkeypatch):
    monkeypatch.setenv("VOICEAGENT_TWILIO_AUTH_TOKEN", "old-name")
    loaded = config.load()
    assert loaded.settings.telephony.twilio_auth_token.get_secret_value() == "old-name"
    assert loaded.sources["telephony.twilio_auth_token"] == "env VOICEAGENT_TWILIO_AUTH_TOKEN"

    monkeypatch.setenv("VOICEAGENT_TELEPHONY__TWILIO_AUTH_TOKEN", "new-name")
    token = config.load().settings.telephony.twilio_auth_token
    assert token.get_secret_value() == "new-name"


def test_serve_help_shows_the_real_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default: 8000; key: server.port" in text
    assert "default: 4,8,16,25; key: playout.chunks" in text


# -- validation: every bad key named, with its value and source -------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        pytest.param(
            '[server]\nport = "eighty"\n',
            'server.port = "eighty" (from {file}): '
            "Input should be a valid integer, unable to parse string as an integer",
            id="wrong type",
        ),
        pytest.param(
            "[server]\nport = 70000\n",
            "server.port = 70000 (from {file}): Input should be less than or equal to 65535",
            id="out of range",
        ),
        pytest.param(
            "[session]\nmax_turns = 0\n",
            "session.max_turns = 0 (from {file}): Input should be greater than or equal to 1",
            id="not positive",
        ),
        pytest.param(
            "[server]\nprot = 8000\n",
            "server.prot = \"***\" (from {file}): unknown key; did you mean 'port'?",
            id="unknown key",
        ),
        pytest.param(  # what was seen: a misspelt secret printed in clear
            '[auth]\ntoken_secrt = "hunter2-very-secret"\n',
            "auth.token_secrt = \"***\" (from {file}): unknown key; did you mean 'token_secret'?",
            id="a misspelt secret",
        ),
        pytest.param(
            "[servr]\nport = 8000\n",
            "servr (from {file}): unknown section; did you mean 'server'?",
            id="unknown section",
        ),
        pytest.param(
            '[log]\nformat = "xml"\n',
            "log.format = \"xml\" (from {file}): Input should be 'text' or 'json'",
            id="bad choice",
        ),
        pytest.param(
            '[engine]\nkind = "sglang"\nsglang_export = "/models/x"\n',
            'engine.kind = "sglang" (from {file}): needs engine.sglang_url',
            id="sglang without its url",
        ),
        pytest.param(
            "[playout]\nchunks = [4, 0]\n",
            "playout.chunks = [4, 0] (from {file}): [1] Input should be greater than 0",
            id="a bad list item",
        ),
        pytest.param(
            "[server]\nport = true\n",
            "server.port = true (from {file}): Input should not be true or false",
            id="a boolean for a number",
        ),
        # what was seen: accepted, then serve failed with an OverflowError traceback
        pytest.param(
            "[playout]\nmax_speech_s = inf\n",
            "playout.max_speech_s = inf (from {file}): Input should be a finite number",
            id="infinity",
        ),
        # what was seen: `voiceagent config` output read back made "***" the token secret,
        # with which anyone could sign a token for any tenant
        pytest.param(
            '[auth]\ntoken_secret = "***"\n',
            'auth.token_secret = "***" (from {file}): is the mask `voiceagent config` '
            "prints; give the secret itself",
            id="the mask as a secret",
        ),
    ],
)
def test_a_bad_value_names_its_key_its_value_and_where_it_came_from(tmp_path, capsys, text, error):
    file = toml_file(tmp_path, text)
    code, out, err = run(["config", "--config", str(file)], capsys)
    assert code == 2 and not out
    assert err == f"config error: {error.format(file=file)}\n"


def test_a_bad_environment_variable_or_flag_is_named_as_such(monkeypatch, capsys):
    monkeypatch.setenv("VOICEAGENT_SERVER__PORT", "0")
    code, _, err = run(["config", "--engine", "sglang", "--sglang-url", "x"], capsys)
    assert code == 2
    assert err.splitlines() == [
        'config error: server.port = "0" (from env VOICEAGENT_SERVER__PORT): '
        "Input should be greater than or equal to 1",
        'config error: engine.sglang_url = "x" (from flag --sglang-url): '
        "should start with http:// or https://",
    ]


def test_an_environment_variable_with_a_misspelt_section_is_an_error(monkeypatch, capsys):
    # what was seen: VOICEAGENT_SERVR__PORT=9001 left the port at 8000, without a word
    monkeypatch.setenv("VOICEAGENT_SERVR__PORT", "9001")
    code, out, err = run(["config"], capsys)
    assert code == 2 and not out
    assert "VOICEAGENT_SERVR__PORT" in err and "did you mean 'server'" in err


def test_all_errors_are_reported_at_once_one_line_per_key(tmp_path, monkeypatch, capsys):
    file = toml_file(
        tmp_path,
        '[server]\nport = 70000\nhots = "x"\n[playout]\nchunks = [0, "a"]\n[log]\nlevel = "loud"\n',
    )
    monkeypatch.setenv("VOICEAGENT_SESSION__MAX_TEXT_CHARS", "-1")
    code, _, err = run(["config", "--config", str(file)], capsys)
    keys = [line.split()[2] for line in err.splitlines()]
    assert code == 2
    assert keys == [
        "server.port",
        "server.hots",
        "session.max_text_chars",
        "playout.chunks",  # two bad items, one line
        "log.level",
    ]


def test_a_toml_syntax_error_names_the_file_and_the_line(tmp_path, capsys):
    file = toml_file(tmp_path, '[server]\nhost = "0.0.0.0"\nport 8000\n')
    code, _, err = run(["config", "--config", str(file)], capsys)
    assert code == 2
    assert err.startswith(f"config error: {file}: ") and "line 3" in err


def test_a_missing_file_is_an_error_not_an_empty_config(tmp_path, capsys):
    code, _, err = run(["config", "--config", str(tmp_path / "nope.toml")], capsys)
    assert code == 2 and "nope.toml: No such file" in err


def test_serve_with_a_bad_config_exits_2_before_loading_a_model(tmp_path, monkeypatch, capsys):
    def no_model(*args: object) -> None:
        raise AssertionError("a model was loaded despite a bad configuration")

    monkeypatch.setattr(cli, "load_model", no_model)
    file = toml_file(tmp_path, "[server]\nport = 70000\n")
    code, _, err = run(["serve", "--config", str(file)], capsys)
    assert code == 2
    assert err == (
        f"config error: server.port = 70000 (from {file}): "
        "Input should be less than or equal to 65535\n"
    )


def test_serve_with_a_bad_config_prints_no_traceback(tmp_path):
    file = toml_file(tmp_path, "[engine]\nmax_batch = 0\n")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("VOICEAGENT_")}
    proc = subprocess.run(
        [sys.executable, "-m", "voiceagent.cli", "serve", "--config", str(file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("config error: engine.max_batch = 0 (from ")
    assert "Traceback" not in proc.stderr


# -- `voiceagent config` ----------------------------------------------------------------


def test_config_prints_valid_toml_that_loads_back_as_the_same_settings(tmp_path, capsys):
    file = toml_file(tmp_path, '[server]\nhost = "0.0.0.0"\n[telephony]\naudiosocket_port = 9092\n')
    code, out, _ = run(["config", "--config", str(file), "--max-speech-s", "3"], capsys)
    assert code == 0
    again = config.load(toml_file(tmp_path, out, "printed.toml")).settings
    assert again == config.load(file, {"playout.max_speech_s": 3.0}).settings


def test_config_masks_the_secret_and_says_where_each_value_came_from(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VOICEAGENT_TELEPHONY__TWILIO_AUTH_TOKEN", "s3cret")
    file = toml_file(tmp_path, "[engine]\nmax_batch = 4\n")
    code, out, _ = run(["config", "--config", str(file), "--lead-ms", "100"], capsys)
    lines = out.splitlines()
    assert code == 0 and "s3cret" not in out
    token = line_of(lines, "twilio_auth_token")
    assert token == 'twilio_auth_token = "***"  # env VOICEAGENT_TELEPHONY__TWILIO_AUTH_TOKEN'
    assert line_of(lines, "max_batch") == f"max_batch = 4  # file {file}"
    assert line_of(lines, "lead_ms") == "lead_ms = 100  # flag --lead-ms"
    assert line_of(lines, "threads") == "threads = 0  # default"
    every_key = [line for line in lines if " = " in line and not line.startswith("#")]
    assert len(every_key) == len(config.schema_keys())


def test_an_unset_secret_is_shown_empty(capsys):
    values, _ = shown(["config"], capsys)
    assert values["telephony"]["twilio_auth_token"] == ""


# -- what serve runs with -----------------------------------------------------------------


def test_the_server_is_built_from_the_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("VOICEAGENT_TWILIO_AUTH_TOKEN", "tok")
    file = toml_file(
        tmp_path,
        "[server]\nmax_live_turns = 7\ndrain_timeout_s = 2.5\n"
        "[playout]\nchunks = [2, 5]\nmax_speech_s = 3.0\nwebrtc_buffer_ms = 60\n"
        '[model]\npath = "/models/m"\n',
    )
    server = config.load(file, {"session.max_turns": 2}).settings.server_config()
    assert (server.max_live_turns, server.drain_timeout_s) == (7, 2.5)
    assert server.limits.max_turns == 2
    assert server.playout.schedule.sizes == (2, 5)
    assert server.playout.max_segment_tokens == 75  # 25 speech tokens per second
    assert server.webrtc.track_buffer_frames == 3  # 20 ms frames
    assert server.voices_dir == Path("/models/m/voices")
    assert server.telephony.twilio_auth_token == "tok"
    assert server.telephony.audiosocket_port is None  # 0: off
    assert server.telephony.public_url is None
    # AudioSocket has no credentials: it listens where the server does unless told
    # (what was seen: always every interface, also beside --host 127.0.0.1)
    assert server.telephony.audiosocket_host == "127.0.0.1"
    own = config.load(file, {"telephony.audiosocket_host": "10.0.0.5"}).settings
    assert own.server_config().telephony.audiosocket_host == "10.0.0.5"


def test_added_voices_go_beside_the_model_or_to_the_cache_for_the_built_in_ones(tmp_path):
    from voiceagent.config import voices_folder
    from voiceagent.model.tiny.checkpoint import default_tiny_dir

    assert voices_folder(str(tmp_path / "v"), "/models/x") == tmp_path / "v"
    assert voices_folder(None, "/models/x") == Path("/models/x/voices")
    # the shipped voice lives in the package, and `tiny` is a name, not a folder (what
    # was seen: `--model tiny` put tenants' voices in ./tiny/voices, wherever serve ran)
    assert voices_folder(None, None) == default_tiny_dir() / "voices"
    assert voices_folder(None, "tiny") == default_tiny_dir() / "voices"


def test_the_engine_is_built_from_the_settings(tmp_path, monkeypatch, tiny_model):
    assert config.Settings().engine.acoustic_batching == "invariant"
    monkeypatch.setenv("VOICEAGENT_ENGINE__MAX_BATCH", "3")
    file = toml_file(tmp_path, '[engine]\nacoustic_batching = "batched"\n')
    engine = cli.build_engine(config.load(file).settings, tiny_model)
    assert engine.acoustic.batching == "batched"
    assert engine.lm.max_batch == 3  # type: ignore[attr-defined]
    flag = config.load(file, {"engine.acoustic_batching": "invariant"}).settings
    assert cli.build_engine(flag, tiny_model).acoustic.batching == "invariant"


def test_embedded_lm_settings_given_with_sglang_are_said_to_do_nothing(
    tmp_path, tiny_model, caplog
):
    # what was seen: --max-batch and --lm-int8 with --engine sglang, ignored without a word
    export_sglang(tiny_model, tmp_path)
    flags = {
        "engine.kind": "sglang",
        "engine.sglang_url": "http://127.0.0.1:9",
        "engine.sglang_export": str(tmp_path),
        "engine.max_batch": 4,
        "engine.lm_int8": "all",
    }
    cli.build_engine(config.load(None, flags).settings, tiny_model)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("engine.max_batch, engine.lm_int8 do nothing" in m for m in said), said


def test_the_fast_paths_are_settings(tmp_path, tiny_model):
    default = cli.build_engine(config.Settings(), tiny_model)
    assert default.lm._prefill_layers is None and default.lm._decode_layers is None  # type: ignore[attr-defined]
    assert default.acoustic.flow is tiny_model.flow
    assert default.lm.yield_to is not None  # type: ignore[attr-defined]  # first-audio
    assert config.Settings().server_config().playout.hold_back == 4
    file = toml_file(
        tmp_path,
        '[engine]\nlm_int8 = "all"\nflow_precision = "bfloat16"\npriority = "fair"\n'
        "[playout]\nvocoder_hold_back = -1\n",
    )
    settings = config.load(file).settings
    engine = cli.build_engine(settings, tiny_model)
    assert engine.lm._prefill_layers is not None and engine.lm._decode_layers is not None  # type: ignore[attr-defined]
    assert next(engine.acoustic.flow.parameters()).dtype == torch.bfloat16
    assert engine.lm.yield_to is None  # type: ignore[attr-defined]
    assert settings.server_config().playout.hold_back is None  # the model's exact hold-back


# -- the example file -------------------------------------------------------------------


def test_the_example_file_names_every_key_at_its_default():
    example = tomllib.loads(EXAMPLE.read_text())
    named = {f"{section}.{key}" for section, table in example.items() for key in table}
    assert named == {info.key for info in config.schema_keys()}
    assert config.load(EXAMPLE).settings == config.Settings()
