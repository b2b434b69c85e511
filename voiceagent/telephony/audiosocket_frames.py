"""Asterisk AudioSocket packets, sans I/O (checked against res/res_audiosocket.c).

    offset size  field
    0      1     kind (Kind below)
    1      2     payload length, big-endian unsigned
    3      n     payload

Asterisk connects to our TCP server and first sends UUID (the 16 raw bytes of the UUID
given to AudioSocket()/Dial), then one audio packet per channel frame (usually 20 ms)
and a DTMF packet per digit. Audio is signed 16-bit mono PCM in Asterisk's "slin" byte
order, which is the host's: little-endian on every machine Asterisk runs on. The kind
gives the rate; 0x11-0x18 arrived in Asterisk 20.17, 21.12, 22.7 and 23.0 (0x10 only
before). Asterisk accepts only HANGUP and audio kinds from us: anything else, or an
audio packet with no payload, ends the call. It plays what we send as it arrives (no
queue), so the server paces its frames. On a hangup Asterisk just closes the socket.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from enum import IntEnum, IntFlag

HEADER = struct.Struct("!BH")
MAX_PAYLOAD = 0xFFFF  # the length field's limit
DTMF_DIGITS = "0123456789*#ABCDabcd"


class Kind(IntEnum):
    HANGUP = 0x00
    UUID = 0x01
    DTMF = 0x03
    SLIN = 0x10  # 8 kHz
    SLIN12 = 0x11
    SLIN16 = 0x12
    SLIN24 = 0x13
    SLIN32 = 0x14
    SLIN44 = 0x15  # 44.1 kHz
    SLIN48 = 0x16
    SLIN96 = 0x17
    SLIN192 = 0x18
    ERROR = 0xFF


class ErrorCode(IntFlag):
    """Bit flags an ERROR payload may carry (the protocol's documentation; the Asterisk
    source itself never sends ERROR)."""

    HANGUP = 0x01  # the calling party hung up
    FRAME_FORWARDING = 0x02
    MEMORY = 0x04


SLIN_RATES: dict[Kind, int] = {
    Kind.SLIN: 8000,
    Kind.SLIN12: 12000,
    Kind.SLIN16: 16000,
    Kind.SLIN24: 24000,
    Kind.SLIN32: 32000,
    Kind.SLIN44: 44100,
    Kind.SLIN48: 48000,
    Kind.SLIN96: 96000,
    Kind.SLIN192: 192000,
}
_RATE_KINDS = {rate: kind for kind, rate in SLIN_RATES.items()}

# What each side may send: Asterisk hangs up on any other kind from the server.
FROM_ASTERISK = frozenset({Kind.UUID, Kind.DTMF, *SLIN_RATES})
TO_ASTERISK = frozenset({Kind.HANGUP, *SLIN_RATES})


class AudioSocketError(ValueError):
    """A byte stream that is not AudioSocket: the connection cannot continue."""


class UnknownKindError(AudioSocketError):
    pass


class BadLengthError(AudioSocketError):
    pass


def slin_kind(sample_rate: int) -> Kind:
    """The audio kind for a rate (8000 -> Kind.SLIN)."""
    try:
        return _RATE_KINDS[sample_rate]
    except KeyError:
        rates = ", ".join(map(str, _RATE_KINDS))
        raise ValueError(f"no AudioSocket kind for {sample_rate} Hz; one of {rates}") from None


def slin_rate(kind: int) -> int:
    """The sample rate of an audio kind (Kind.SLIN16 -> 16000)."""
    try:
        return SLIN_RATES[Kind(kind)]
    except (KeyError, ValueError):
        raise ValueError(f"kind 0x{kind:02x} is not audio") from None


def frame_bytes(sample_rate: int, ms: int = 20) -> int:
    """Payload bytes of one `ms` frame of 16-bit mono audio (8 kHz, 20 ms -> 320)."""
    return sample_rate * ms // 1000 * 2


@dataclass(frozen=True)
class Packet:
    kind: Kind
    payload: bytes = b""

    @property
    def is_audio(self) -> bool:
        return self.kind in SLIN_RATES

    @property
    def sample_rate(self) -> int:
        return slin_rate(self.kind)

    @property
    def uuid(self) -> str:
        return parse_uuid(self.payload)

    @property
    def digit(self) -> str:
        """A DTMF packet's digit; ValueError if its byte is not one."""
        digit = self.payload.decode("latin-1")
        if len(digit) != 1 or digit not in DTMF_DIGITS:
            raise ValueError(f"not a DTMF digit: {self.payload!r}")
        return digit


def _check_length(kind: Kind, length: int, max_payload: int) -> None:
    if kind is Kind.UUID and length != 16:
        raise BadLengthError(f"UUID payload must be 16 bytes, got {length}")
    if kind is Kind.DTMF and length != 1:
        raise BadLengthError(f"DTMF payload must be 1 byte, got {length}")
    if kind in SLIN_RATES and length == 0:
        raise BadLengthError("empty audio payload (Asterisk hangs up on it)")
    if length > max_payload:
        raise BadLengthError(f"{kind.name} payload of {length} bytes exceeds {max_payload}")


def encode(kind: int, payload: bytes = b"") -> bytes:
    """One packet. Raises ValueError on an unknown kind or a payload the kind forbids."""
    try:
        k = Kind(kind)
    except ValueError:
        raise UnknownKindError(f"unknown AudioSocket kind 0x{kind:02x}") from None
    _check_length(k, len(payload), MAX_PAYLOAD)
    return HEADER.pack(k, len(payload)) + payload


def encode_uuid(call_id: str | uuid.UUID) -> bytes:
    """The first packet Asterisk sends: the call's UUID as 16 raw bytes."""
    value = call_id if isinstance(call_id, uuid.UUID) else uuid.UUID(call_id)
    return encode(Kind.UUID, value.bytes)


def encode_audio(pcm: bytes, sample_rate: int = 8000) -> bytes:
    """Little-endian int16 mono bytes (e.g. `array.astype('<i2').tobytes()`) at a rate."""
    return encode(slin_kind(sample_rate), pcm)


def encode_dtmf(digit: str) -> bytes:
    if len(digit) != 1 or digit not in DTMF_DIGITS:
        raise ValueError(f"not a DTMF digit: {digit!r}")
    return encode(Kind.DTMF, digit.encode("ascii"))


def encode_hangup() -> bytes:
    return encode(Kind.HANGUP)


def parse_uuid(payload: bytes) -> str:
    """16 raw bytes -> the canonical string form ('40325ec2-5efd-...')."""
    if len(payload) != 16:
        raise BadLengthError(f"UUID payload must be 16 bytes, got {len(payload)}")
    return str(uuid.UUID(bytes=bytes(payload)))


class AudioSocketDecoder:
    """Bytes as TCP delivers them (any split) in, whole packets out.

    `kinds` limits what is accepted (e.g. TO_ASTERISK to check a server the way Asterisk
    does); `max_payload` bounds a packet. Both are checked from the header alone, so a
    bad stream fails before its payload arrives. After an error the decoder stays failed.
    """

    def __init__(self, kinds: Collection[int] = tuple(Kind), max_payload: int = MAX_PAYLOAD):
        self.kinds = frozenset(kinds)
        self.max_payload = max_payload
        self._buf = bytearray()
        self._failed: AudioSocketError | None = None

    @property
    def pending(self) -> int:
        """Bytes held back waiting for the rest of a packet."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[Packet]:
        if self._failed is not None:
            raise self._failed
        self._buf += data
        packets: list[Packet] = []
        pos = 0
        while len(self._buf) - pos >= HEADER.size:
            raw_kind, length = HEADER.unpack_from(self._buf, pos)
            try:
                kind = self._check(raw_kind, length)
            except AudioSocketError as err:
                self._failed = err
                raise
            end = pos + HEADER.size + length
            if end > len(self._buf):
                break
            packets.append(Packet(kind, bytes(self._buf[pos + HEADER.size : end])))
            pos = end
        del self._buf[:pos]
        return packets

    def _check(self, raw_kind: int, length: int) -> Kind:
        if raw_kind not in self.kinds:
            known = raw_kind in Kind._value2member_map_
            what = f"{Kind(raw_kind).name} packet not accepted here" if known else "unknown kind"
            raise UnknownKindError(f"{what} (0x{raw_kind:02x})")
        kind = Kind(raw_kind)
        _check_length(kind, length, self.max_payload)
        return kind
