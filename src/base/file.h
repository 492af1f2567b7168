// Read-only file access: whole-file reads for small text files (JSON) and mmap for weights.
#ifndef TD_BASE_FILE_H
#define TD_BASE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct td_map {
    const uint8_t *data;  // mapped bytes (read-only, MAP_PRIVATE); NULL for an empty file
    size_t size;          // bytes
} td_map;

// Maps `path` read-only. On failure *m is zeroed and err names the path and errno text.
td_status td_map_open(td_map *m, const char *path, td_err *err);
void td_map_close(td_map *m);

// Reads a whole file into a malloc'd buffer with a terminating NUL (not counted in *len).
// Caller frees. max_bytes caps the size (TD_ERR_LIMIT beyond it); 0 means no cap.
td_status td_read_file(const char *path, size_t max_bytes, char **out, size_t *len, td_err *err);

int td_file_exists(const char *path);
int td_is_dir(const char *path);

// Joins dir and name into out (size cap bytes); returns 0 if it did not fit.
int td_path_join(char *out, size_t cap, const char *dir, const char *name);

#endif
