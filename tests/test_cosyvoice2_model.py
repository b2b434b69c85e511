"""A CosyVoice2 directory in the released layout (random weights, scaled-down sizes written
by the suite) loads through the real loader and streams through the server.

The weights are random, so nothing here says the audio is intelligible; that needs the
released weights (see README). The ONNX frontends are fakes with the released interface
(tests/onnx_fakes.py).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import run
from onnx_fakes import write_fake_campplus, write_fake_speech_tokenizer

from voiceagent.bench.clients import Client, connect
from voiceagent.bench.clips import espeak_wav, have_espeak
from voiceagent.engine.embedded import EmbeddedEngine
from voiceagent.model import checkpoint
from voiceagent.model.checkpoint import CheckpointError
from voiceagent.model.cosyvoice2.loader import EMBED, HEAD, REQUIRED
from voiceagent.model.cosyvoice2.random_checkpoint import write_random_cosyvoice2
from voiceagent.model.sampling import SamplingParams
from voiceagent.model.speech_model import SpeechModel
from voiceagent.ops.logs import configure_logging
from voiceagent.pipeline.turn import ChunkSchedule, FrameFormat, Turn, TurnFailed, TurnSettings
from voiceagent.server.app import ServerConfig
from voiceagent.server.background import BackgroundServer, free_port
from voiceagent.session.playout import PlayoutConfig

TOL = 1e-4  # float32 attention over differently batched caches; PCM in [-1, 1]


@pytest.fixture(scope="module")
def cv2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_cosyvoice2(tmp_path_factory.mktemp("cosyvoice2") / "CosyVoice2-small")


@pytest.fixture(scope="module")
def cv2_model(cv2_dir: Path) -> SpeechModel:
    return checkpoint.load(cv2_dir)


def test_the_released_layout_loads_with_its_voices(cv2_model):
    assert cv2_model.random_weights and "noise" in (cv2_model.warning or "")
    assert set(cv2_model.voices) == {"agent", "narrator"}
    voice = cv2_model.voices["agent"]
    assert voice.prompt_mel is not None and voice.prompt_mel.shape == (
        2 * len(voice.prompt_tokens),
        80,
    )
    assert voice.embedding.shape == (192,)
    assert cv2_model.tokenizer.encode("hello") and cv2_model.pre_lookahead == 3


@pytest.mark.parametrize("missing", REQUIRED)
def test_a_missing_file_is_named(tmp_path, cv2_dir, missing):
    copy = tmp_path / "m"
    shutil.copytree(cv2_dir, copy)
    (copy / missing).unlink()
    with pytest.raises(CheckpointError, match=Path(missing).name.replace(".", r"\.")):
        checkpoint.load(copy)


@pytest.mark.parametrize("name", ["llm.pt", "flow.pt", "hift.pt"])
def test_a_corrupted_or_partial_weight_file_is_named(tmp_path, cv2_dir, name):
    copy = tmp_path / "m"
    shutil.copytree(cv2_dir, copy)
    (copy / name).write_bytes(b"not torch")
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.")):
        checkpoint.load(copy)
    state = torch.load(cv2_dir / name, weights_only=True)
    state.pop(sorted(state)[-1])  # (a missing tied lm_head would be rebuilt, so not [0])
    torch.save(state, copy / name)
    with pytest.raises(CheckpointError, match="missing"):
        checkpoint.load(copy)


def test_a_yaml_that_does_not_fit_the_weights_is_refused(tmp_path, cv2_dir):
    copy = tmp_path / "m"
    shutil.copytree(cv2_dir, copy)
    text = (copy / "cosyvoice2.yaml").read_text().replace("num_blocks: 2", "num_blocks: 3")
    (copy / "cosyvoice2.yaml").write_text(text)
    with pytest.raises(CheckpointError, match=r"flow\.pt"):
        checkpoint.load(copy)


def test_a_streamed_turn_equals_the_offline_pass_with_the_same_blocks(cv2_model):
    schedule = ChunkSchedule((4, 8, 16, 25))
    engine = EmbeddedEngine(cv2_model)
    engine.start()

    async def go() -> Turn:
        voice = cv2_model.voices["narrator"]
        settings = TurnSettings(voice, SamplingParams(seed=3), 1.0, FrameFormat(24000))
        turn = Turn("t", settings, engine, schedule=schedule, record_pcm=True)
        turn.start()
        turn.push_text("A short sentence.")
        turn.end_text()
        while (item := await turn.output.get()) is not None:
            assert not isinstance(item, TurnFailed), item
        return turn

    try:
        turn = asyncio.run(go())
    finally:
        engine.stop()
    assert turn.stats.chunks >= 3
    streamed = np.concatenate(turn.pcm or [])
    voice = cv2_model.voices["narrator"]
    flow, hift = cv2_model.flow, cv2_model.vocoder
    n = len(turn.tokens)
    with torch.inference_mode():
        blocks = flow.stream_blocks(len(voice.prompt_tokens), schedule.sizes, n)  # type: ignore[attr-defined]
        mel = flow.synthesize(  # type: ignore[attr-defined]
            torch.tensor([turn.tokens]),
            torch.tensor([voice.prompt_tokens]),
            voice.prompt_mel[None],
            voice.embedding[None],
            blocks=blocks,
        )
        offline = hift(mel)[0].numpy()
    assert streamed.shape == offline.shape
    assert np.abs(streamed - offline).max() < TOL
    assert np.abs(offline).max() > 1e-3


def test_the_server_streams_a_cosyvoice2_voice(cv2_model):
    config = ServerConfig(port=free_port(), playout=PlayoutConfig(lead_ms=100_000))
    with BackgroundServer(cv2_model, config) as server:

        async def go():
            async with connect(server.url) as ws:
                c = Client(ws)
                created = await c.start(voice="agent")
                return created, await c.speak("Hi there.")

        created, turn = run(go())
    assert created["model"]["random_weights"] is True
    assert turn.frames and turn.event("turn.done")["timings"]["tokens"] > 0


def _voice_add(
    tmp_path: Path, cv2_dir: Path, name: str
) -> tuple[Path, subprocess.CompletedProcess]:
    """`voiceagent voice add NAME` on a copy of the model with (fake) frontend files."""
    copy = tmp_path / "m"
    if not (copy / "config.json").exists():
        shutil.copytree(cv2_dir, copy, dirs_exist_ok=True)
        write_fake_campplus(copy / "campplus.onnx")
        write_fake_speech_tokenizer(copy / "speech_tokenizer_v2.onnx")
    clip = tmp_path / "clip.wav"
    if not have_espeak():
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    espeak_wav(clip, "Thanks for calling, how can I help?")
    cmd = [sys.executable, "-m", "voiceagent.cli", "voice", "add", name, str(clip)]
    cmd += ["--text", "Thanks for calling, how can I help?", "--model", str(copy)]
    return copy, subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_voice_add_makes_a_voice_the_model_accepts(tmp_path, cv2_dir):
    copy, proc = _voice_add(tmp_path, cv2_dir, "caller")
    assert proc.returncode == 0, proc.stderr
    model = checkpoint.load(copy)
    from voiceagent.model.voice_store import load_voice

    voice = load_voice(copy / "voices" / "caller.pt")
    model.check_voice(voice)
    assert len(voice.prompt_tokens) > 25 and voice.prompt_mel is not None
    assert voice.prompt_text_ids == tuple(
        model.tokenizer.encode("Thanks for calling, how can I help?")
    )


def test_voice_add_on_a_full_disk_says_so_and_leaves_nothing_behind(
    tmp_path, cv2_dir, monkeypatch, capsys
):
    """The voice file is written next to its final name first, under a name of its own
    (fixed here); here that file is /dev/full, so the kernel answers ENOSPC as a full
    disk does. In this process, to fix that name."""
    from voiceagent import cli
    from voiceagent.model import voice_store

    copy, proc = _voice_add(tmp_path, cv2_dir, "first")  # the model copy, and a voice
    assert proc.returncode == 0, proc.stderr
    voices = copy / "voices"
    monkeypatch.setattr(voice_store, "secrets", SimpleNamespace(token_hex=lambda n: "fixed"))
    (voices / ".caller.fixed.tmp").symlink_to("/dev/full")
    args = ["voice", "add", "caller", str(tmp_path / "clip.wav"), "--model", str(copy)]
    try:
        rc = cli.main([*args, "--text", "Thanks for calling, how can I help?"])
    finally:
        configure_logging("warning", "text")
    err = capsys.readouterr().err
    assert rc == 2
    assert "could not save voice 'caller': No space left on device" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in voices.iterdir()) == ["first.pt"]  # no partial file


def test_the_text_embedding_and_head_are_tied_as_in_the_reference(tmp_path, cv2_dir):
    """The released Qwen config ties them; the reference loads llm.pt into a tied Qwen2
    with load_state_dict, embedding first and head last, so a file with two different
    tensors ends with the head's values in both. The writer saves them tied."""
    written = torch.load(cv2_dir / "llm.pt", weights_only=True)
    embed, head = written[EMBED], written[HEAD]
    assert torch.equal(embed, head)  # the writer ties them, as the released file is

    copy = tmp_path / "m"
    shutil.copytree(cv2_dir, copy)
    different = {**written, HEAD: torch.randn_like(head)}
    torch.save(different, copy / "llm.pt")
    lm = checkpoint.load(copy).lm.llm.model
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # one tensor in memory
    assert torch.equal(lm.model.embed_tokens.weight, different[HEAD])

    torch.save({k: v for k, v in written.items() if k != HEAD}, copy / "llm.pt")
    only_embedding = checkpoint.load(copy).lm.llm.model
    assert torch.equal(only_embedding.lm_head.weight, embed)
