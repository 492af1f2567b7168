// Helpers shared by the format-reader tests (test_gguf, test_safetensors): locating and loading
// the sample files written by tests/reference/make_format_samples.py, and comparing bytes with the
// hex strings its expect.json files record.
#ifndef TD_TEST_FORMAT_SAMPLES_H
#define TD_TEST_FORMAT_SAMPLES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "test_util.h"

static char dir[1024];  // $TANDEM_TEST_DATA/formats, set by fs_init()

static inline void fs_init(void) { snprintf(dir, sizeof dir, "%s/formats", td_test_data_dir()); }

static inline char *path_of(const char *name) {
    static char buf[2048];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

// The whole sample file (malloc'd); exits the test with a hint when the samples are missing.
static inline uint8_t *load(const char *name, size_t *n) {
    char *buf;
    td_err err;
    if (td_read_file(path_of(name), 0, &buf, n, &err)) {
        fprintf(stderr, "cannot read %s: %s (run tests/reference/make_format_samples.py)\n", name, err.msg);
        exit(1);
    }
    return (uint8_t *)buf;
}

static inline int hexval(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

static inline int bytes_eq_hex(const void *p, size_t n, const char *hex) {
    if (strlen(hex) != 2 * n) return 0;
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (uint8_t)(hexval(hex[2 * i]) * 16 + hexval(hex[2 * i + 1]))) return 0;
    return 1;
}

#endif
