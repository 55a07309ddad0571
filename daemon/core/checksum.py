"""The checksum every transcript row carries, so that a changed byte is found when it is read.

Pure: CRC-32 (zlib's, which runs at gigabytes a second and lets go of the GIL for large
buffers) over a canonical encoding of a row's values in column order. Each value is a type tag,
its length where it has one, then its bytes, so neither a value moved across a column boundary
nor ``NULL`` against ``""`` nor ``1`` against ``"1"`` can give the same input. The store
computes it in Python for every row it writes, the event rows (whose bytes it holds already) and
the small rows too, and checks it on every read.

CRC-32 finds every flipped bit and every pair of flipped bits in a row (rows stay far below
its 512 MiB period), every burst of up to 32 changed bits, and misses any other change with
odds of about 1 in 4 billion: it is there to find damage (disk, filesystem, a careless copy),
not tampering.
"""

from __future__ import annotations

from typing import Final
from zlib import crc32

__all__ = ["row_crc"]

_NULL: Final = b"\x00"


def row_crc(*values: object) -> int:
    """CRC-32 of ``values`` (each ``None``, ``int``, ``str`` or ``bytes``), as a non-negative
    int below 2**32. Raises ``TypeError`` for anything else (a float never reaches a row)."""
    crc = 0
    for value in values:
        if value is None:
            crc = crc32(_NULL, crc)
        elif isinstance(value, bytes | bytearray | memoryview):
            crc = crc32(b"\x03%d:" % len(value), crc)
            crc = crc32(value, crc)
        elif isinstance(value, str):
            data = value.encode("utf-8", "surrogatepass")
            crc = crc32(b"\x02%d:" % len(data), crc)
            crc = crc32(data, crc)
        elif isinstance(value, int) and not isinstance(value, bool):
            crc = crc32(b"\x01%d;" % value, crc)
        else:
            raise TypeError(f"a transcript row holds no {type(value).__name__}")
    return crc
