// libFuzzer target for the embeddings request parser (td_api_parse_embeddings) and the base64
// encoder of its answers: the first byte picks the limits, the rest is the body. Must never crash,
// leak or read out of bounds; an accepted request satisfies its documented invariants, and the
// base64 of the body's bytes decodes back to them. Seeds: tests/fuzz/corpus/embed_request/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/openai.h"

static int b64_val(char c) {
    const char *tab = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = c ? strchr(tab, c) : NULL;
    return p ? (int)(p - tab) : -1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    td_api_limits lim = td_api_default_limits();
    lim.max_model_len = (data[0] & 2) ? 256 : 0;
    lim.vocab_size = (data[0] & 4) ? 259 : 0;
    const char *served = (data[0] & 8) ? "m" : NULL;
    td_srv_arena *a = td_srv_arena_create(512);
    if (!a) return 0;
    td_api_embed_request r;
    td_api_error e;
    memset(&e, 0, sizeof e);
    if (td_api_parse_embeddings((const char *)data + 1, size - 1, &lim, served, a, &r, &e)) {
        if (r.n_inputs < 1 || r.n_inputs > TD_API_MAX_EMBED_INPUTS || r.dimensions < 0) abort();
        for (int i = 0; i < r.n_inputs; i++) {
            const td_api_prompt *p = &r.inputs[i];
            if (!p->text && !p->ids) abort();
            if (p->text && p->text_len == 0) abort();
            if (p->ids && p->n_ids < 1) abort();
            for (int k = 0; k < p->n_ids; k++)
                if (p->ids[k] < 0 || (lim.vocab_size && p->ids[k] >= lim.vocab_size)) abort();
        }
    } else {
        if (e.http_status != 400 && e.http_status != 404 && e.http_status != 500) abort();
        free(td_api_error_json(&e));
    }
    td_srv_arena_destroy(a);
    // base64 round trip of the raw input (an independent decoder).
    size_t n = size < 4096 ? size : 4096;
    char *b = malloc(4 * ((n + 2) / 3) + 1);
    unsigned char *back = malloc(n + 3);
    if (b && back) {
        td_api_base64(data, n, b);
        size_t len = strlen(b), m = 0;
        if (len != 4 * ((n + 2) / 3)) abort();
        uint32_t acc = 0;
        int bits = 0;
        for (size_t i = 0; i < len && b[i] != '='; i++) {
            int v = b64_val(b[i]);
            if (v < 0) abort();
            acc = acc << 6 | (uint32_t)v;
            bits += 6;
            if (bits >= 8) bits -= 8, back[m++] = (unsigned char)(acc >> bits);
        }
        if (m != n || memcmp(back, data, n)) abort();
    }
    free(b);
    free(back);
    return 0;
}
