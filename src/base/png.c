// Minimal PNG writer: signature, IHDR, one IDAT (zlib stream of filter-0 rows), IEND; the chunk
// CRCs come from zlib's crc32. Not a general PNG library (no reading, no other colour types).
#include "base/png.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

// Writes one chunk at p: length, type, data (already at p + 8 when data is NULL), CRC over type
// and data. Returns the bytes written (12 + n).
static size_t chunk(uint8_t *p, const char type[4], const uint8_t *data, uint32_t n) {
    put32(p, n);
    memcpy(p + 4, type, 4);
    if (data) memcpy(p + 8, data, n);
    uLong crc = crc32(0L, p + 4, 4 + n);
    put32(p + 8 + n, (uint32_t)crc);
    return 12 + (size_t)n;
}

td_status td_png_encode(const uint8_t *rgb, int w, int h, uint8_t **out, size_t *len, td_err *err) {
    *out = NULL;
    *len = 0;
    if (w < 1 || h < 1 || w > 32768 || h > 32768)
        return td_err_set(err, TD_ERR_INVALID, "png: image size %dx%d outside 1..32768", w, h);
    const size_t row = (size_t)w * 3 + 1, raw_len = row * (size_t)h;  // bytes, filter byte first
    uint8_t *raw = malloc(raw_len);
    uLongf zcap = compressBound((uLong)raw_len);
    // signature 8 + IHDR 25 + IDAT 12 + data + IEND 12
    uint8_t *png = malloc(8 + 25 + 12 + (size_t)zcap + 12);
    if (!raw || !png) {
        free(raw);
        free(png);
        return td_err_set(err, TD_ERR_NOMEM, "png: out of memory for %dx%d", w, h);
    }
    for (int y = 0; y < h; y++) {
        raw[(size_t)y * row] = 0;
        memcpy(raw + (size_t)y * row + 1, rgb + (size_t)y * (size_t)w * 3, (size_t)w * 3);
    }
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    memcpy(png, sig, 8);
    size_t o = 8;
    uint8_t ihdr[13];
    put32(ihdr, (uint32_t)w);
    put32(ihdr + 4, (uint32_t)h);
    ihdr[8] = 8;   // bits per sample
    ihdr[9] = 2;   // colour type: RGB
    ihdr[10] = 0;  // deflate
    ihdr[11] = 0;  // adaptive filtering (each row says which filter)
    ihdr[12] = 0;  // no interlace
    o += chunk(png + o, "IHDR", ihdr, 13);
    uLongf zlen = zcap;
    int zr = compress2(png + o + 8, &zlen, raw, (uLong)raw_len, 6);
    free(raw);
    if (zr != Z_OK) {
        free(png);
        return td_err_set(err, TD_ERR_NOMEM, "png: zlib compress2 failed (%d)", zr);
    }
    o += chunk(png + o, "IDAT", NULL, (uint32_t)zlen);
    o += chunk(png + o, "IEND", NULL, 0);
    *out = png;
    *len = o;
    return TD_OK;
}

td_status td_png_write(const char *path, const uint8_t *rgb, int w, int h, td_err *err) {
    uint8_t *png;
    size_t len;
    td_status st = td_png_encode(rgb, w, h, &png, &len, err);
    if (st) return st;
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(png);
        return td_err_set(err, TD_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t wr = fwrite(png, 1, len, f);
    int cl = fclose(f);
    free(png);
    if (wr != len || cl != 0) return td_err_set(err, TD_ERR_IO, "%s: write failed", path);
    return TD_OK;
}
