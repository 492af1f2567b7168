"""Independent PNG decoder and plot checker for tests/unit/test_plot.c.

Parses the file itself (signature, chunk CRCs with binascii.crc32, IHDR, zlib-decompressed IDAT,
all five row filters) for 8-bit RGB/RGBA images, and, when Pillow is installed, checks that Pillow
decodes the same pixels. Then checks expectations, one per line in EXPECT (optional):
    px py RRGGBB kind       kind: line   some pixel within 2 px is that colour blended over white
                                         with coverage >= 0.4
                                  marker the same with coverage >= 0.95 (a filled disc)
                                  absent no pixel within 2 px has coverage >= 0.3 of that colour
usage: png_check.py PNG WIDTH HEIGHT [EXPECT]      exit 0 = all good, 1 = a check failed
"""
import binascii
import struct
import sys
import zlib


def fail(msg):
    print("png_check: " + msg)
    sys.exit(1)


def decode(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("bad signature")
    pos, chunks = 8, []
    while pos < len(data):
        if pos + 12 > len(data):
            fail("truncated chunk at %d" % pos)
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        typ, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])
        if binascii.crc32(typ + body) & 0xFFFFFFFF != crc:
            fail("CRC mismatch in %r chunk" % typ)
        chunks.append((typ, body))
        pos += 12 + n
        if typ == b"IEND":
            break
    if pos != len(data):
        fail("%d bytes after IEND" % (len(data) - pos))
    if chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        fail("IHDR must come first and IEND last")
    w, h, depth, ctype, comp, filt, inter = struct.unpack(">IIBBBBB", chunks[0][1])
    if depth != 8 or ctype not in (2, 6) or comp or filt or inter:
        fail("unsupported IHDR: depth %d type %d" % (depth, ctype))
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(b for t, b in chunks if t == b"IDAT"))
    stride = w * bpp
    if len(raw) != h * (stride + 1):
        fail("IDAT holds %d bytes, expected %d" % (len(raw), h * (stride + 1)))
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 0:
                p = 0
            elif f == 1:
                p = a
            elif f == 2:
                p = b
            elif f == 3:
                p = (a + b) // 2
            elif f == 4:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                p = a if pa <= pb and pa <= pc else b if pb <= pc else c
            else:
                fail("bad filter type %d in row %d" % (f, y))
            line[i] = (line[i] + p) & 255
        rows.append(bytes(line))
        prev = line
    px = [[tuple(r[x * bpp:x * bpp + 3]) for x in range(w)] for r in rows]
    return w, h, px


def coverage(pix, col):
    """Coverage a with pix = white + a * (col - white), or -1 when pix is not such a blend."""
    est = [(255 - p) / (255 - c) for p, c in zip(pix, col) if c < 200]
    if not est:
        return -1
    a = sum(est) / len(est)
    pred = [round(255 + a * (c - 255)) for c in col]
    return a if max(abs(p - q) for p, q in zip(pix, pred)) <= 6 else -1


def main():
    path, W, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    w, h, px = decode(path)
    if (w, h) != (W, H):
        fail("size %dx%d, expected %dx%d" % (w, h, W, H))
    try:
        from PIL import Image
    except ImportError:
        Image = None
    if Image is not None:
        im = Image.open(path).convert("RGB")
        if im.size != (w, h) or list(im.getdata()) != [p for row in px for p in row]:
            fail("Pillow decodes different pixels")
    bad = 0
    if len(sys.argv) > 4:
        for ln in open(sys.argv[4]):
            if not ln.strip():
                continue
            x, y, hexcol, kind = ln.split()
            x, y = float(x), float(y)
            col = tuple(int(hexcol[i:i + 2], 16) for i in (0, 2, 4))
            best = -1
            for yy in range(int(y) - 2, int(y) + 4):
                for xx in range(int(x) - 2, int(x) + 4):
                    if (xx - x) ** 2 + (yy - y) ** 2 <= 4.5 and 0 <= xx < w and 0 <= yy < h:
                        best = max(best, coverage(px[yy][xx], col))
            need = {"line": 0.4, "marker": 0.95}.get(kind)
            ok = best < 0.3 if kind == "absent" else best >= need
            if not ok:
                bad += 1
                if bad <= 10:
                    print("png_check: %s at (%.1f, %.1f) colour %s: best coverage %.2f" % (kind, x, y, hexcol, best))
    if bad:
        fail("%d expectation(s) failed" % bad)
    print("png_check: ok %dx%d%s" % (w, h, " (Pillow agrees)" if Image else ""))


if __name__ == "__main__":
    main()
