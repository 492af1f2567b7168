// Tokenizer files copied beside shards and checkpoints, with the hash the checkpoint records
// (tok_record.h). Small files (a few MB): read whole, written through td_afile.
#include "train/tok_record.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/afile.h"
#include "base/file.h"

#define TOK_MAX (256u << 20)  // bytes: the largest tokenizer file copied

int td_tok_record_dir(const char *path, char *dir, size_t cap) {
    if (td_is_dir(path)) return (size_t)snprintf(dir, cap, "%s", path) < cap;
    size_t n = strlen(path), k = strlen("tokenizer.json");
    if (n < k || strcmp(path + n - k, "tokenizer.json") || (n > k && path[n - k - 1] != '/')) return 0;
    if (!td_file_exists(path)) return 0;
    if (n == k) return (size_t)snprintf(dir, cap, ".") < cap;
    return (size_t)snprintf(dir, cap, "%.*s", (int)(n - k - 1), path) < cap;
}

static td_status copy_one(const char *src, const char *dst, uint64_t *hash, td_err *err) {
    char *text = NULL;
    size_t len = 0;
    td_status st = td_read_file(src, TOK_MAX, &text, &len, err);
    if (st) return st;
    if (hash) *hash = XXH3_64bits(text, len);
    char rs[PATH_MAX], rd[PATH_MAX];
    if (realpath(src, rs) && realpath(dst, rd) && !strcmp(rs, rd)) {  // the same file: keep it
        free(text);
        return TD_OK;
    }
    td_afile f;
    st = td_afile_open(&f, dst, err);
    if (!st) st = td_afile_write(&f, text, len, err);
    if (!st) st = td_afile_commit(&f, err);
    else td_afile_abort(&f);
    free(text);
    return st;
}

td_status td_tok_record_copy(const char *src_dir, const char *dst_dir, char hex[17], td_err *err) {
    char s[4096], d[4096];
    if (mkdir(dst_dir, 0755) != 0 && errno != EEXIST)
        return td_err_set(err, TD_ERR_IO, "cannot create %s: %s", dst_dir, strerror(errno));
    uint64_t h = 0;
    if (!td_path_join(s, sizeof s, src_dir, "tokenizer.json") || !td_path_join(d, sizeof d, dst_dir, "tokenizer.json"))
        return td_err_set(err, TD_ERR_INVALID, "path too long");
    td_status st = copy_one(s, d, &h, err);
    if (st) return st;
    snprintf(hex, 17, "%016" PRIx64, h);
    if (td_path_join(s, sizeof s, src_dir, "tokenizer_config.json") && td_file_exists(s) &&
        td_path_join(d, sizeof d, dst_dir, "tokenizer_config.json"))
        st = copy_one(s, d, NULL, err);
    return st;
}

td_status td_tok_record_check(const char *dir, const char *hex, td_err *err) {
    char path[4096];
    if (!td_path_join(path, sizeof path, dir, "tokenizer.json")) return td_err_set(err, TD_ERR_INVALID, "path too long");
    if (!td_file_exists(path))
        return td_err_set(err, TD_ERR_NOT_FOUND, "the checkpoint records a tokenizer but %s is missing", path);
    char *text = NULL;
    size_t len = 0;
    td_status st = td_read_file(path, TOK_MAX, &text, &len, err);
    if (st) return st;
    char got[17];
    snprintf(got, sizeof got, "%016" PRIx64, (uint64_t)XXH3_64bits(text, len));
    free(text);
    if (strcmp(got, hex))
        return td_err_set(err, TD_ERR_FORMAT, "%s has changed since training (XXH3-64 %s, the checkpoint records %.16s)",
                          path, got, hex);
    return TD_OK;
}
