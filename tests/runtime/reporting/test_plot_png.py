"""The stdlib PNG writer: a valid file (checked by decoding it here) with the pixels drawn."""

from __future__ import annotations

import struct
import zlib

from runtime.reporting.plot_png import BLACK, PALETTE, Canvas, Panel, Series, encode_png, line_chart


def _decode(png: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and RGB rows of an 8-bit RGB, filter-0 PNG; checks every chunk's CRC."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, at = {}, 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, data = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", png[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + data) & 0xFFFFFFFF
        chunks[kind] = data
        at += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, colour, interlace) == (8, 2, 0) and b"IEND" in chunks
    raw = zlib.decompress(chunks[b"IDAT"])
    stride = width * 3 + 1
    rows = [raw[r * stride : (r + 1) * stride] for r in range(height)]
    assert all(row[0] == 0 for row in rows)
    return width, height, [row[1:] for row in rows]


def test_lines_and_text_land_on_the_expected_pixels() -> None:
    canvas = Canvas(20, 10)
    canvas.line(0, 0, 19, 9, BLACK)
    canvas.line(0, 9, 5, 9, PALETTE[0])
    end = canvas.text(10, 0, "1", PALETTE[1], scale=1)
    width, height, rows = _decode(encode_png(canvas))
    assert (width, height, end) == (20, 10, 14)
    pixel = lambda x, y: tuple(rows[y][3 * x : 3 * x + 3])  # noqa: E731
    assert pixel(0, 0) == BLACK and pixel(19, 9) == BLACK
    assert pixel(3, 9) == PALETTE[0] and pixel(19, 0) == (255, 255, 255)
    assert pixel(11, 0) == PALETTE[1] and pixel(10, 0) == (255, 255, 255)  # "1" is 010 on top


def test_a_chart_of_several_panels_is_a_valid_png() -> None:
    loss = Series("train", [(1, 0.7), (2, 0.6), (3, 0.55)])
    panels = [Panel("loss", [loss]), Panel("click auc", [loss, Series("eval", [(3, 0.5)])]), Panel("empty", [])]
    width, height, rows = _decode(line_chart(panels, width=300, panel_height=80))
    assert width == 300 and height == 3 * (80 + 22 + 20) + 10
    colours = {tuple(row[i : i + 3]) for row in rows for i in range(0, len(row), 3)}
    assert PALETTE[0] in colours and PALETTE[1] in colours
