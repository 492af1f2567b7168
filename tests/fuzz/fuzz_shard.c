// libFuzzer target for the token shard reader: input = shard file bytes (through a memfd, since
// td_shard_open maps a path). If it verifies, all tokens are read and checked against the
// vocabulary. Seeds: tests/fuzz/corpus/shard/.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "train/shards.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz_shard", 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    td_shard *s = NULL;
    if (td_shard_open(path, &s, NULL) != TD_OK) return 0;
    size_t n = (size_t)td_shard_tokens(s);
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (ids) {
        td_shard_read(s, 0, n, ids);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= td_shard_vocab(s)) __builtin_trap();
        free(ids);
    }
    td_shard_close(s);
    return 0;
}
