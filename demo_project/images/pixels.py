"""Tiny binary PPM (P6) images: enough to make and shrink pictures without Pillow."""

from __future__ import annotations

import random


def make_ppm(width: int, height: int, seed: int) -> bytes:
    """A gradient picture with a random tint."""
    rng = random.Random(seed)
    r0, g0, b0 = rng.randrange(256), rng.randrange(256), rng.randrange(256)
    pixels = bytearray()
    for y in range(height):
        for x in range(width):
            pixels += bytes(((r0 + x) % 256, (g0 + y) % 256, (b0 + x + y) % 256))
    return b"P6 %d %d 255\n" % (width, height) + bytes(pixels)


def parse_ppm(data: bytes) -> tuple[int, int, bytes]:
    """``(width, height, rgb bytes)`` of a P6 image."""
    header, _, pixels = data.partition(b"\n")
    magic, width, height, _maxval = header.split()
    if magic != b"P6":
        raise ValueError("not a binary PPM image")
    return int(width), int(height), pixels


def thumbnail(data: bytes, size: int = 32) -> bytes:
    """Shrink to at most ``size`` pixels a side by sampling (nearest neighbour)."""
    width, height, pixels = parse_ppm(data)
    step = max(1, -(-max(width, height) // size))
    out = bytearray()
    rows = range(0, height, step)
    cols = range(0, width, step)
    for y in rows:
        for x in cols:
            i = 3 * (y * width + x)
            out += pixels[i : i + 3]
    return b"P6 %d %d 255\n" % (len(cols), len(rows)) + bytes(out)
