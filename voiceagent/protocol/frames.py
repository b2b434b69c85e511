"""Binary audio frames: a 16-byte header, then one encoded 20 ms frame.

    offset size  field
    0      1     version (1)
    1      1     codec (1 opus, 2 pcm16, 3 mulaw, 4 alaw)
    2      2     flags (reserved, 0)
    4      4     turn number (as in turn events)
    8      4     sequence number of the frame within the turn, from 0
    12     4     timestamp: milliseconds of audio in the turn before this frame

All fields are big-endian unsigned integers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

VERSION = 1
HEADER = struct.Struct("!BBHIII")
CODEC_IDS = {"opus": 1, "pcm16": 2, "mulaw": 3, "alaw": 4}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items()}


@dataclass(frozen=True)
class AudioFrame:
    codec: str
    turn: int
    seq: int
    pts_ms: int
    payload: bytes


def pack(frame: AudioFrame) -> bytes:
    head = HEADER.pack(VERSION, CODEC_IDS[frame.codec], 0, frame.turn, frame.seq, frame.pts_ms)
    return head + frame.payload


def unpack(data: bytes) -> AudioFrame:
    if len(data) < HEADER.size:
        raise ValueError("frame shorter than its header")
    version, codec, _flags, turn, seq, pts = HEADER.unpack_from(data)
    if version != VERSION or codec not in CODEC_NAMES:
        raise ValueError(f"unknown frame version {version} or codec {codec}")
    return AudioFrame(CODEC_NAMES[codec], turn, seq, pts, data[HEADER.size :])
