// Read-only file access helpers.
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

td_status td_map_open(td_map *m, const char *path, td_err *err) {
    m->data = NULL;
    m->size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return td_err_set(err, TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return td_err_set(err, TD_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return td_err_set(err, TD_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return TD_OK;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED) return td_err_set(err, TD_ERR_IO, "%s: mmap failed: %s", path, strerror(e));
    m->data = p;
    m->size = (size_t)st.st_size;
    return TD_OK;
}

void td_map_close(td_map *m) {
    if (m->data) munmap((void *)m->data, m->size);
    m->data = NULL;
    m->size = 0;
}

td_status td_read_file(const char *path, size_t max_bytes, char **out, size_t *len, td_err *err) {
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return td_err_set(err, TD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
    }
    for (;;) {
        if (n == cap) {
            if (max_bytes && cap >= max_bytes) {
                free(buf);
                fclose(f);
                return td_err_set(err, TD_ERR_LIMIT, "%s: larger than %zu bytes", path, max_bytes);
            }
            size_t ncap = cap * 2;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                fclose(f);
                return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return td_err_set(err, TD_ERR_IO, "%s: read error", path);
    }
    if (max_bytes && n > max_bytes) {
        free(buf);
        return td_err_set(err, TD_ERR_LIMIT, "%s: larger than %zu bytes", path, max_bytes);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return TD_OK;
}

int td_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int td_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int td_path_join(char *out, size_t cap, const char *dir, const char *name) {
    int n = snprintf(out, cap, "%s/%s", dir, name);
    return n >= 0 && (size_t)n < cap;
}
