// Helper of bench/bench_train.sh: writes a shard of uniformly random token ids (the training
// benchmark needs data of a given vocabulary, e.g. 32000, without a tokenizer).
// Usage: bench_train_data OUT.tdsh VOCAB N_TOKENS [SEED=1]. Not a benchmark by itself.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "train/shards.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_train_data OUT.tdsh VOCAB N_TOKENS [SEED]\n");
        return 2;
    }
    const int vocab = atoi(argv[2]);
    const long n = atol(argv[3]);
    uint64_t x = argc > 4 ? strtoull(argv[4], NULL, 10) : 1;
    if (vocab < 2 || n < 1) {
        fprintf(stderr, "bench_train_data: bad vocab or token count\n");
        return 2;
    }
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids) return 1;
    for (long i = 0; i < n; i++) {  // splitmix64
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        ids[i] = (int32_t)((z ^ (z >> 31)) % (uint64_t)vocab);
    }
    td_err err = {0};
    td_status st = td_shard_write(argv[1], vocab, ids, (size_t)n, 1, &err);
    free(ids);
    if (st) {
        fprintf(stderr, "bench_train_data: %s\n", err.msg);
        return 1;
    }
    return 0;
}
