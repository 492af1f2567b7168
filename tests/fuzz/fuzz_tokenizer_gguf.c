// libFuzzer target for the GGUF tokenizer loader: input = a GGUF file (metadata only matters).
// If it parses and yields a tokenizer, a fixed string is encoded, decoded and streamed.
// Seeds: tests/fuzz/corpus/tokenizer_gguf/ (tests/tokenizer/make_small_tokenizers.py writes them).
#include <stdint.h>
#include <stdlib.h>
#include "format/gguf.h"
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    td_gguf *g = NULL;
    if (td_gguf_open_mem(data, size, "fuzz.gguf", &g, NULL) != TD_OK) return 0;
    td_tokenizer *t = NULL;
    if (td_tokenizer_from_gguf(g, &t, NULL) == TD_OK) {
        static const char text[] = "Hello, world! <s> <|im_start|>  12345 caf\xc3\xa9 \xf0\x9f\x91\x8b\r\n\t\xff end";
        td_tokens ids = {0};
        for (int sp = 0; sp < 2; sp++) {
            if (td_tokenizer_encode(t, text, sizeof text - 1, sp, &ids, NULL) != TD_OK) continue;
            char *out = NULL;
            size_t ol;
            if (td_tokenizer_decode(t, ids.ids, ids.n, sp, &out, &ol, NULL) == TD_OK) free(out);
            td_detok *d = td_detok_new(t, sp);
            size_t pl;
            for (size_t i = 0; d && i < ids.n; i++) td_detok_push(d, ids.ids[i], &pl);
            if (d) td_detok_flush(d, &pl);
            td_detok_free(d);
        }
        td_tokens_free(&ids);
        td_tokenizer_free(t);
    }
    td_gguf_close(g);
    return 0;
}
