"""Line charts as PNG files, with the standard library only (zlib and struct).

`--log-dir` ends a run with a plot of the loss and every metric against the
step. No plotting library is needed: `Canvas` draws lines and a 3x5 pixel
font on an RGB raster, and `encode_png` writes it as an 8-bit RGB PNG (one
IHDR, one zlib-compressed IDAT of filter-0 scanlines, IEND).
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field
from typing import Sequence

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GREY: Color = (200, 200, 200)
PALETTE: tuple[Color, ...] = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189))

# 3x5 glyphs, rows top to bottom, "1" = ink.
_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", "A": "010101111101101", "B": "110101110101110",
    "C": "011100100100011", "D": "110101101101110", "E": "111100110100111", "F": "111100110100100",
    "G": "011100101101011", "H": "101101111101101", "I": "111010010010111", "J": "001001001101010",
    "K": "101101110101101", "L": "100100100100111", "M": "101111111101101", "N": "110101101101101",
    "O": "010101101101010", "P": "110101110100100", "Q": "010101101110011", "R": "110101110101101",
    "S": "011100010001110", "T": "111010010010010", "U": "101101101101111", "V": "101101101101010",
    "W": "101101111111101", "X": "101101010101101", "Y": "101101010010010", "Z": "111001010100111",
    ".": "000000000000010", "-": "000000111000000", ":": "000010000010000", "_": "000000000000111",
    "/": "001001010100100", "(": "010100100100010", ")": "010001001001010", "+": "000010111010000",
    " ": "000000000000000", "?": "111001010000010",
}  # fmt: skip


class Canvas:
    """An RGB raster, white to start with; (0, 0) is the top left."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(b"\xff" * (width * height * 3))

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = (y * self.width + x) * 3
            self.pixels[i : i + 3] = bytes(color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Bresenham's line, both ends included."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        error = dx + dy
        while True:
            self.set(x0, y0, color)
            if x0 == x1 and y0 == y1:
                return
            double = 2 * error
            if double >= dy:
                error += dy
                x0 += sx
            if double <= dx:
                error += dx
                y0 += sy

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """The outline of a rectangle."""
        for a, b, c, d in ((x0, y0, x1, y0), (x1, y0, x1, y1), (x1, y1, x0, y1), (x0, y1, x0, y0)):
            self.line(a, b, c, d, color)

    def text(self, x: int, y: int, text: str, color: Color, scale: int = 2) -> int:
        """Draw `text` (upper-cased) with its top left at (x, y); returns the x after it."""
        for char in text.upper():
            glyph = _GLYPHS.get(char, _GLYPHS["?"])
            for i, ink in enumerate(glyph):
                if ink == "1":
                    gx, gy = x + (i % 3) * scale, y + (i // 3) * scale
                    for px in range(scale):
                        for py in range(scale):
                            self.set(gx + px, gy + py, color)
            x += 4 * scale
        return x


def encode_png(canvas: Canvas) -> bytes:
    """The canvas as PNG bytes: 8-bit RGB, no interlace, filter 0 on every row."""
    stride = canvas.width * 3
    raw = b"".join(
        b"\x00" + bytes(canvas.pixels[row * stride : (row + 1) * stride]) for row in range(canvas.height)
    )
    header = struct.pack(">IIBBBBB", canvas.width, canvas.height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(raw, 9))
        + _chunk(b"IEND", b"")
    )


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]  # (x, y); points with a non-finite y are not drawn


@dataclass(frozen=True)
class Panel:
    title: str
    series: Sequence[Series] = field(default_factory=tuple)


def line_chart(panels: Sequence[Panel], width: int = 720, panel_height: int = 180) -> bytes:
    """Panels stacked top to bottom, each with its series, y range and x range; as PNG bytes."""
    margin, title_height = 70, 22
    height = len(panels) * (panel_height + title_height + 20) + 10
    canvas = Canvas(width, max(height, 1))
    top = 10
    for panel in panels:
        _draw_panel(canvas, panel, margin, top, width - 20, top + title_height + panel_height)
        top += panel_height + title_height + 20
    return encode_png(canvas)


def _draw_panel(canvas: Canvas, panel: Panel, left: int, top: int, right: int, bottom: int) -> None:
    x = canvas.text(left, top, panel.title, BLACK)
    for color, series in zip(_colors(), panel.series):
        x = canvas.text(x + 16, top, series.name, color)
    plot_top = top + 22
    canvas.rect(left, plot_top, right, bottom, GREY)
    points = [p for s in panel.series for p in s.points if math.isfinite(p[1])]
    if not points:
        return
    x_lo, x_hi = min(p[0] for p in points), max(p[0] for p in points)
    y_lo, y_hi = min(p[1] for p in points), max(p[1] for p in points)
    if y_hi == y_lo:
        y_lo, y_hi = y_lo - 0.5, y_hi + 0.5
    canvas.text(4, plot_top, f"{y_hi:.4g}", BLACK)
    canvas.text(4, bottom - 10, f"{y_lo:.4g}", BLACK)
    canvas.text(left, bottom + 4, f"{x_lo:g}", BLACK)
    label = f"{x_hi:g}"
    canvas.text(right - 8 * len(label), bottom + 4, label, BLACK)

    def to_pixel(point: tuple[float, float]) -> tuple[int, int]:
        fx = 0.5 if x_hi == x_lo else (point[0] - x_lo) / (x_hi - x_lo)
        fy = (point[1] - y_lo) / (y_hi - y_lo)
        return left + 1 + round(fx * (right - left - 2)), bottom - 1 - round(fy * (bottom - plot_top - 2))

    for color, series in zip(_colors(), panel.series):
        pixels = [to_pixel(p) for p in series.points if math.isfinite(p[1])]
        for a, b in zip(pixels, pixels[1:]):
            canvas.line(*a, *b, color)
        if len(pixels) == 1:  # a lone point would be invisible as a line
            px, py = pixels[0]
            canvas.rect(px - 1, py - 1, px + 1, py + 1, color)


def _colors() -> Sequence[Color]:
    return PALETTE * 4


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
