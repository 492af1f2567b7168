// libFuzzer target for the checkpoint reader: input = checkpoint file bytes (through a memfd, since
// td_ckpt_open maps a path). If it verifies, every tensor and the metadata are touched.
// Seeds: tests/fuzz/corpus/ckpt/.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "train/ckpt.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("fuzz_ckpt", 0);
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
    td_ckpt *c = NULL;
    if (td_ckpt_open(path, &c, NULL) != TD_OK) return 0;
    volatile uint8_t sink = (uint8_t)strlen(td_ckpt_meta(c));
    for (int i = 0; i < td_ckpt_count(c); i++) {
        const td_ckpt_tensor *t = td_ckpt_get(c, i);
        for (size_t k = 0; k < t->nbytes; k++) sink ^= ((const uint8_t *)t->data)[k];
        if (td_ckpt_find(c, t->name) == NULL) __builtin_trap();
    }
    (void)sink;
    td_ckpt_close(c);
    return 0;
}
