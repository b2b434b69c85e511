"""What the training stages share (voiceagent/train/update.py): the device they train on."""

from __future__ import annotations

import pytest
import torch

from voiceagent.cli import main
from voiceagent.train.update import train_device


def test_auto_trains_on_cuda_where_torch_sees_it_and_on_the_cpu_elsewhere() -> None:
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert train_device("auto").type == want
    assert train_device().type == want
    assert train_device("cpu") == torch.device("cpu")


def test_cuda_asked_for_is_cuda_or_an_error_never_a_quiet_cpu() -> None:
    if torch.cuda.is_available():
        assert train_device("cuda") == torch.zeros(1, device="cuda").device  # cuda:N
    else:
        with pytest.raises(ValueError, match="no CUDA device"):
            train_device("cuda")
        with pytest.raises(ValueError, match="no CUDA device"):
            train_device("cuda:1")


@pytest.mark.parametrize("name", ["mps", "meta"])
def test_a_device_other_than_cpu_or_cuda_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        train_device(name)


@pytest.mark.parametrize("stage", ["lm", "flow", "vocoder", "all"])
def test_a_training_stage_with_an_unusable_device_says_why_and_exits_2(
    stage: str, tmp_path, capsys
) -> None:
    """Before any work: the stage would otherwise fail hours in, or train on the CPU."""
    (tmp_path / "tokens").mkdir()
    code = main(["train", stage, "--out", str(tmp_path), "--device", "mps"])
    assert code == 2
    assert "--device must be one of auto, cpu, cuda" in capsys.readouterr().err
