"""CosyVoice2's voice-prompt frontend: a few seconds of reference audio and its transcript
-> what a `Voice` carries, as the reference `frontend_zero_shot` builds it:

- speech tokens of the 16 kHz audio from `speech_tokenizer_v2.onnx` (Whisper log-mel in);
- the flow's 80-bin log-mel of the 24 kHz audio, trimmed to exactly 2 frames per token;
- a 192-d CAM++ speaker vector from `campplus.onnx` (mean-normalised Kaldi fbank in).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import numpy as np
import onnxruntime as ort
import torch
from torch import Tensor

from voiceagent.audio.decode import AudioSource, decode_audio, resample, source_name
from voiceagent.audio.features import FBANK_BINS, kaldi_fbank, prompt_mel, whisper_log_mel
from voiceagent.model.contract import SPEECH_CODES

TOKENIZER_RATE = 16000
MEL_RATE = 24000
WHISPER_MELS = 128
# The tokenizer's positional range covers 30 s; the reference refuses longer prompts.
MAX_PROMPT_SECONDS = 30.0
# Shorter clips give a handful of tokens at best: no usable voice.
MIN_PROMPT_SECONDS = 0.5
# Below 16 kHz the 24 kHz prompt mel would lack its top band (the reference refuses too).
MIN_SOURCE_RATE = 16000
TOKEN_MEL_RATIO = 2  # 25 Hz speech tokens, 50 Hz flow mel frames


class Prompt(TypedDict):
    """The fields of a `Voice` that come from its reference clip."""

    prompt_text_ids: tuple[int, ...]
    prompt_tokens: tuple[int, ...]
    prompt_mel: Tensor  # [2 * len(prompt_tokens), 80] float32
    embedding: Tensor  # [192] float32


def _session(path: Path, what: str) -> ort.InferenceSession:
    if not path.is_file():
        raise FileNotFoundError(f"{what} model not found: {path}")
    opts = ort.SessionOptions()
    # One thread each, as the reference: prompts are short, and the server's torch threads
    # must not be starved by a voice being added.
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # onnxruntime raises its own non-standard exception types
        raise ValueError(f"{what} model {path} cannot be loaded: {exc}") from exc


def _check_input(path: Path, arg: ort.NodeArg, dtype: str, rank: int, dims: dict[int, int]) -> None:
    shape = list(arg.shape)
    fixed_ok = all(not isinstance(shape[i], int) or shape[i] == n for i, n in dims.items())
    if arg.type != dtype or len(shape) != rank or not fixed_ok:
        raise ValueError(
            f"{path}: input '{arg.name}' is {arg.type} {shape}, expected {dtype} of rank {rank}"
            + "".join(f", dim {i} = {n}" for i, n in dims.items())
        )


class PromptFrontend:
    """The two ONNX models of a CosyVoice2 directory, run on the CPU."""

    def __init__(self, campplus_path: Path, speech_tokenizer_path: Path) -> None:
        self.campplus_path = Path(campplus_path)
        self.tokenizer_path = Path(speech_tokenizer_path)
        self._campplus = _session(self.campplus_path, "campplus (speaker embedding)")
        self._tokenizer = _session(self.tokenizer_path, "speech tokenizer")
        # Fail here, naming the file, rather than deep in a run (e.g. the two files swapped).
        spk_inputs = self._campplus.get_inputs()
        if len(spk_inputs) != 1:
            raise ValueError(f"{self.campplus_path}: expected 1 input, got {len(spk_inputs)}")
        _check_input(self.campplus_path, spk_inputs[0], "tensor(float)", 3, {2: FBANK_BINS})
        tok_inputs = self._tokenizer.get_inputs()
        if len(tok_inputs) != 2:
            raise ValueError(f"{self.tokenizer_path}: expected 2 inputs, got {len(tok_inputs)}")
        _check_input(self.tokenizer_path, tok_inputs[0], "tensor(float)", 3, {1: WHISPER_MELS})
        _check_input(self.tokenizer_path, tok_inputs[1], "tensor(int32)", 1, {})

    def speaker_embedding(self, wave16k: np.ndarray) -> Tensor:
        """[192] CAM++ speaker vector (not normalised; the flow normalises it)."""
        feat = kaldi_fbank(wave16k)
        feat = feat - feat.mean(axis=0, keepdims=True)
        name = self._campplus.get_inputs()[0].name
        out = self._campplus.run(None, {name: feat[None]})[0]
        return torch.from_numpy(np.asarray(out, dtype=np.float32).reshape(-1).copy())

    def speech_tokens(self, wave16k: np.ndarray) -> list[int]:
        """Speech tokens (25 per second) of at most 30 s of 16 kHz audio."""
        seconds = len(wave16k) / TOKENIZER_RATE
        if seconds > MAX_PROMPT_SECONDS:
            raise ValueError(
                f"prompt audio is {seconds:.1f} s; the speech tokenizer takes at most "
                f"{MAX_PROMPT_SECONDS:g} s"
            )
        mel = whisper_log_mel(wave16k, n_mels=WHISPER_MELS)[None]
        feats, length = (i.name for i in self._tokenizer.get_inputs())
        out = self._tokenizer.run(
            None, {feats: mel, length: np.array([mel.shape[2]], dtype=np.int32)}
        )[0]
        tokens = np.asarray(out).reshape(-1)
        if tokens.size and (
            not np.issubdtype(tokens.dtype, np.integer)
            or tokens.min() < 0
            or tokens.max() >= SPEECH_CODES
        ):
            raise ValueError(
                f"{self.tokenizer_path}: output is not speech tokens in 0..{SPEECH_CODES - 1}"
            )
        return [int(t) for t in tokens]

    def make_prompt(self, wave_path: AudioSource, transcript_ids: list[int]) -> Prompt:
        """A voice prompt from a reference clip (path or encoded bytes) and its transcript's
        text token ids. Raises ValueError for unreadable, too short or too long audio."""
        pcm, rate = decode_audio(wave_path, max_seconds=MAX_PROMPT_SECONDS)
        name = source_name(wave_path)
        if rate < MIN_SOURCE_RATE:
            raise ValueError(f"prompt audio {name} is sampled at {rate} Hz; need >= 16 kHz")
        return self.prompt_from_pcm(pcm, rate, transcript_ids, name)

    def prompt_from_pcm(
        self, pcm: np.ndarray, rate: int, transcript_ids: list[int], name: str = "<pcm>"
    ) -> Prompt:
        """A voice prompt from decoded mono float32 audio at `rate` (no bandwidth check:
        the caller decides whether narrowband audio is acceptable, see voices/reference.py)."""
        if len(pcm) < MIN_PROMPT_SECONDS * rate:
            raise ValueError(
                f"prompt audio {name} lasts {len(pcm) / rate:.2f} s; need >= "
                f"{MIN_PROMPT_SECONDS:g} s"
            )
        # Both rates come from the source, not one from the other, as in the reference.
        wave16k = resample(pcm, rate, TOKENIZER_RATE)
        wave24k = resample(pcm, rate, MEL_RATE)
        tokens = self.speech_tokens(wave16k)
        mel = prompt_mel(wave24k)
        # The flow upsamples tokens by exactly 2: cut both to the shorter of the two.
        n = min(mel.shape[0] // TOKEN_MEL_RATIO, len(tokens))
        if n == 0:
            raise ValueError(f"prompt audio {name} gave no speech tokens")
        return Prompt(
            prompt_text_ids=tuple(int(t) for t in transcript_ids),
            prompt_tokens=tuple(tokens[:n]),
            prompt_mel=torch.from_numpy(np.ascontiguousarray(mel[: TOKEN_MEL_RATIO * n])),
            embedding=self.speaker_embedding(wave16k),
        )
