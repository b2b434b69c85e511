"""Minimal Ogg Opus muxer (RFC 3533 pages, RFC 7845 Opus mapping), mono only."""

from __future__ import annotations

import secrets
import struct
from typing import BinaryIO

from .format import MODEL_RATE as SOURCE_RATE

VENDOR = "voiceagent"
# Several 20 ms packets per page keeps the ~28-byte page overhead small while
# staying far below RFC 7845's 1 s per page guideline.
PACKETS_PER_PAGE = 10

_FLAG_BOS = 0x02
_FLAG_EOS = 0x04


def _make_crc_table() -> list[int]:
    table = []
    for i in range(256):
        r = i << 24
        for _ in range(8):
            r = ((r << 1) ^ 0x04C11DB7) if r & 0x80000000 else (r << 1)
        table.append(r & 0xFFFFFFFF)
    return table


_CRC_TABLE = _make_crc_table()


def ogg_crc32(data: bytes) -> int:
    """Ogg's CRC-32: poly 0x04C11DB7, MSB-first, init 0, no final xor."""
    crc = 0
    for b in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC_TABLE[((crc >> 24) ^ b) & 0xFF]
    return crc


def _lacing(size: int) -> bytes:
    # A packet is 255-byte segments closed by one segment < 255 (possibly 0).
    return b"\xff" * (size // 255) + bytes([size % 255])


class OggOpusWriter:
    """Write Opus packets as a single-stream Ogg Opus file.

    Granule positions count 48 kHz samples from the very first decoded sample
    (pre-skip included), as RFC 7845 requires. The caller owns `fileobj`;
    `close()` finishes the stream but does not close the file.
    """

    def __init__(
        self,
        fileobj: BinaryIO,
        pre_skip: int,
        serial: int | None = None,
        input_sample_rate: int = SOURCE_RATE,
    ) -> None:
        if not 0 <= pre_skip <= 0xFFFF:
            raise ValueError(f"pre_skip must fit in 16 bits, got {pre_skip}")
        self._f = fileobj
        self.pre_skip = pre_skip
        self.serial = secrets.randbits(32) if serial is None else serial & 0xFFFFFFFF
        self._seq = 0
        self._granule = 0  # samples of all packets handed in so far
        self._written_granule = 0  # granule of the last page already written
        self._page: list[bytes] = []  # packets not yet written (the last page stays open)
        self._closed = False

        head = b"OpusHead" + struct.pack("<BBHIhB", 1, 1, pre_skip, input_sample_rate, 0, 0)
        vendor = VENDOR.encode()
        tags = b"OpusTags" + struct.pack("<I", len(vendor)) + vendor + struct.pack("<I", 0)
        # Both header packets must sit alone on their own pages with granule 0.
        self._write_page([head], 0, _FLAG_BOS)
        self._write_page([tags], 0, 0)

    def _write_page(self, packets: list[bytes], granule: int, flags: int) -> None:
        table = b"".join(_lacing(len(p)) for p in packets)
        if len(table) > 255:
            raise ValueError("packets do not fit in one Ogg page")
        header = struct.pack(
            "<4sBBqIIIB", b"OggS", 0, flags, granule, self.serial, self._seq, 0, len(table)
        )
        page = bytearray(header + table + b"".join(packets))
        struct.pack_into("<I", page, 22, ogg_crc32(bytes(page)))
        self._f.write(bytes(page))
        self._seq += 1

    def write_packet(self, packet: bytes, samples48k: int = 960) -> None:
        """Queue one Opus packet that decodes to `samples48k` samples."""
        if self._closed:
            raise ValueError("write_packet() after close()")
        if not packet:
            raise ValueError("empty Opus packet")
        segments = sum(len(_lacing(len(p))) for p in self._page)
        if self._page and (
            len(self._page) >= PACKETS_PER_PAGE or segments + len(_lacing(len(packet))) > 255
        ):
            # More data follows, so this page is not the last one: no EOS.
            self._write_page(self._page, self._granule, 0)
            self._written_granule = self._granule
            self._page = []
        self._page.append(packet)
        self._granule += samples48k

    def close(self, valid_samples48k: int | None = None) -> None:
        """Write the final (EOS) page.

        `valid_samples48k`, if given, is how many real 48 kHz samples follow
        the pre-skip; the final granule is set to pre_skip + that, so players
        trim the padding at the end of the last packet (RFC 7845 section 4.4).
        """
        if self._closed:
            return
        granule = self._granule
        if valid_samples48k is not None:
            end = self.pre_skip + valid_samples48k
            # Trimming may only cut into the final page, never below the previous one.
            if not self._written_granule <= end <= self._granule:
                raise ValueError(
                    f"end granule {end} outside the last page "
                    f"({self._written_granule}..{self._granule})"
                )
            granule = end
        self._closed = True
        self._write_page(self._page, granule, _FLAG_EOS)
        self._page = []
