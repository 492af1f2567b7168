// libFuzzer target for the BPE trainer: input = training text (any bytes, invalid UTF-8 included);
// a 300-token vocabulary is learned with min_frequency 1 and the counts are checked for sanity.
// Seeds: tests/fuzz/corpus/bpe_train/.
#include <stdint.h>

#include "train/bpe_train.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 16) return 0;
    td_bpe_params p = td_bpe_default_params();
    p.vocab_size = 300;
    p.min_frequency = 1;
    td_bpe_trainer *t = NULL;
    if (td_bpe_trainer_new(&p, &t, NULL) != TD_OK) __builtin_trap();
    if (td_bpe_feed(t, (const char *)data, size, NULL) == TD_OK && td_bpe_train(t, NULL) == TD_OK) {
        if (td_bpe_vocab_size(t) > 300 || td_bpe_merge_count(t) < td_bpe_vocab_size(t) - 258)
            __builtin_trap();
    }
    td_bpe_trainer_free(t);
    return 0;
}
