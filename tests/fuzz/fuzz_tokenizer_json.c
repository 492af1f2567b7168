// libFuzzer target for the tokenizer.json loader: input = tokenizer.json bytes, optionally
// followed by a NUL and a text to encode. If it loads, a fixed string and the text are encoded,
// decoded and streamed through the detokenizer. Seeds: tests/fuzz/corpus/tokenizer_json/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"

static void exercise(const td_tokenizer *t, const char *text, size_t len) {
    td_tokens ids = {0};
    for (int sp = 0; sp < 2; sp++) {
        if (td_tokenizer_encode(t, text, len, sp, &ids, NULL) != TD_OK) continue;
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
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *json = (const char *)data;
    const char *nul = memchr(data, 0, size);
    size_t jl = nul ? (size_t)(nul - json) : size;
    td_tokenizer *t = NULL;
    if (td_tokenizer_from_json(json, jl, NULL, 0, "fuzz", &t, NULL) != TD_OK) return 0;
    static const char fixed[] = "Hello, world! <s> <|im_start|>  12345 caf\xc3\xa9 \xf0\x9f\x91\x8b\r\n\t\xff end";
    exercise(t, fixed, sizeof fixed - 1);
    if (nul) exercise(t, nul + 1, size - jl - 1);
    int32_t junk[] = {-1, 0, 1, 2, 3, 1 << 20, td_tokenizer_vocab_size(t) - 1};
    char *out = NULL;
    size_t ol;
    if (td_tokenizer_decode(t, junk, 7, false, &out, &ol, NULL) == TD_OK) free(out);
    char piece[64];
    for (int i = 0; i < 4; i++) td_tokenizer_id_to_piece(t, i, piece, sizeof piece);
    td_tokenizer_free(t);
    return 0;
}
