// PNG encoding of 8-bit RGB images (colour type 2, no interlace) with zlib for the deflate stream
// and the CRCs. Not here: decoding, palettes, alpha, 16-bit samples.
#ifndef TD_BASE_PNG_H
#define TD_BASE_PNG_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

// Encodes rgb[h][w][3] into a malloc'd PNG file image (*out, *len; the caller frees *out).
// Rows are written with filter 0 (none), compressed at zlib level 6. TD_ERR_INVALID for sizes
// outside 1..32768, TD_ERR_NOMEM on allocation or zlib failure.
td_status td_png_encode(const uint8_t *rgb, int w, int h, uint8_t **out, size_t *len, td_err *err);

// Encodes and writes path (replaced if present). TD_ERR_IO naming the path on failure.
td_status td_png_write(const char *path, const uint8_t *rgb, int w, int h, td_err *err);

#endif
