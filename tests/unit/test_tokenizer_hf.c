// Exactness against Hugging Face tokenizers: ids (with and without special tokens), decode (with
// and without skip_special) and streaming detok for the Llama 2, Llama 3 and Qwen3 tokenizer.json
// files, and the same ids from vocab-only GGUF files built from them.
// Needs `node tests/oracle/tokenize_oracle.js` and `/usr/bin/python3 tests/reference/make_tokenizer_gguf.py`;
// fails (does not skip) when their output is missing.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <time.h>
#include <string.h>
#include "base/file.h"
#include "format/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

static char *unhex(const char *h, size_t *n) {
    size_t l = strlen(h) / 2;
    char *o = malloc(l + 1);
    for (size_t i = 0; i < l; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        o[i] = (char)v;
    }
    o[l] = 0;
    *n = l;
    return o;
}

static int ids_equal(const td_tokens *t, const cJSON *arr, size_t *at) {
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        if (i >= t->n || t->ids[i] != (int32_t)x->valuedouble) {
            *at = i;
            return 0;
        }
        i++;
    }
    *at = n;
    return n == t->n;
}

static void check_ids(const td_tokenizer *tok, const char *model, const char *variant, const cJSON *c,
                      const char *key, bool add_special) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    size_t n;
    char *in = unhex(cJSON_GetObjectItem(c, "input_hex")->valuestring, &n);
    td_tokens t = {0};
    td_err err = {0};
    td_status st = td_tokenizer_encode(tok, in, n, add_special, &t, &err);
    CHECK(st == TD_OK, "%s/%s %s: encode failed: %s", model, variant, name, err.msg);
    const cJSON *want = cJSON_GetObjectItem(c, key);
    size_t at;
    int eq = ids_equal(&t, want, &at);
    CHECK(eq, "%s/%s %s (%s): ids differ at %zu of %zu/%d: got %d want %d", model, variant, name, key, at, t.n,
          cJSON_GetArraySize(want), at < t.n ? t.ids[at] : -1,
          at < (size_t)cJSON_GetArraySize(want) ? (int)cJSON_GetArrayItem(want, (int)at)->valuedouble : -1);
    td_tokens_free(&t);
    free(in);
}

static void check_decode(const td_tokenizer *tok, const char *model, const char *variant, const cJSON *c) {
    const char *name = cJSON_GetObjectItem(c, "name")->valuestring;
    const cJSON *ids = cJSON_GetObjectItem(c, "ids_special"), *x;
    size_t n = (size_t)cJSON_GetArraySize(ids), i = 0;
    int32_t *v = malloc((n + 1) * sizeof *v);
    cJSON_ArrayForEach(x, ids) v[i++] = (int32_t)x->valuedouble;
    for (int skip = 0; skip < 2; skip++) {
        size_t wl;
        char *want = unhex(cJSON_GetObjectItem(c, skip ? "decode_skip" : "decode")->valuestring, &wl);
        char *got = NULL;
        size_t gl = 0;
        td_err err = {0};
        td_status st = td_tokenizer_decode(tok, v, n, skip, &got, &gl, &err);
        CHECK(st == TD_OK && gl == wl && !memcmp(got, want, wl), "%s/%s %s: decode(skip=%d) differs:\n got  [%.*s]\n want [%.*s]",
              model, variant, name, skip, (int)(gl > 300 ? 300 : gl), got ? got : "", (int)(wl > 300 ? 300 : wl), want);
        // Streaming: pushes + flush concatenate to the full decode and never split a character.
        td_detok *d = td_detok_new(tok, skip);
        char *acc = malloc(gl * 2 + 64);
        size_t al = 0;
        int partial = 0;
        for (size_t k = 0; k < n; k++) {
            size_t pl;
            const char *p = td_detok_push(d, v[k], &pl);
            if (pl && ((unsigned char)p[0] & 0xC0) == 0x80) partial++;
            if (pl && (unsigned char)p[pl - 1] >= 0xC0) partial++;
            if (al + pl < gl * 2 + 64) memcpy(acc + al, p, pl);
            al += pl;
        }
        size_t fl;
        const char *f = td_detok_flush(d, &fl);
        if (al + fl < gl * 2 + 64) memcpy(acc + al, f, fl);
        al += fl;
        CHECK(al == gl && got && !memcmp(acc, got, gl), "%s/%s %s: streamed detok (skip=%d) != decode", model, variant, name, skip);
        CHECK(!partial, "%s/%s %s: detok emitted a partial character", model, variant, name);
        td_detok_free(d);
        free(acc), free(got), free(want);
    }
    free(v);
}

int main(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer_oracle.json", td_test_data_dir());
    char *js;
    size_t jl;
    td_err err = {0};
    if (td_read_file(path, 0, &js, &jl, &err)) {
        fprintf(stderr, "missing oracle %s: run `node tests/oracle/tokenize_oracle.js`\n", path);
        CHECK(0, "oracle output missing");
        TEST_DONE();
    }
    cJSON *root = cJSON_Parse(js);
    free(js);
    CHECK(root != NULL, "oracle JSON parses");
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(root, "models")) {
        const char *name = cJSON_GetObjectItem(m, "name")->valuestring;
        const char *dir = cJSON_GetObjectItem(m, "path")->valuestring;
        const cJSON *cases = cJSON_GetObjectItem(m, "cases"), *c;
        td_tokenizer *tok = NULL;
        double t0 = (double)clock() / CLOCKS_PER_SEC;
        td_status st = td_tokenizer_load(dir, &tok, &err);
        CHECK(st == TD_OK, "load %s: %s", dir, err.msg);
        if (!tok) continue;
        printf("%s: loaded %d ids in %.2f s\n", name, td_tokenizer_vocab_size(tok), (double)clock() / CLOCKS_PER_SEC - t0);
        cJSON_ArrayForEach(c, cases) {
            check_ids(tok, name, "json", c, "ids", false);
            check_ids(tok, name, "json", c, "ids_special", true);
            check_decode(tok, name, "json", c);
        }
        // Decode-only id lists: byte tokens making valid/truncated/invalid UTF-8, random ids.
        const cJSON *dc = cJSON_GetObjectItem(m, "decode_cases");
        CHECK(cJSON_GetArraySize(dc) >= 4, "%s: decode cases present", name);
        cJSON_ArrayForEach(c, dc) check_decode(tok, name, "json", c);
        td_tokenizer_free(tok);
        if (!cJSON_IsTrue(cJSON_GetObjectItem(m, "gguf"))) continue;

        // Vocab-only GGUF built from the same tokenizer.json.
        snprintf(path, sizeof path, "%s/tok_%s.gguf", td_test_data_dir(), name);
        st = td_tokenizer_load(path, &tok, &err);
        CHECK(st == TD_OK, "load %s: %s (run /usr/bin/python3 tests/reference/make_tokenizer_gguf.py)", path, err.msg);
        if (!tok) continue;
        cJSON_ArrayForEach(c, cases) {
            check_ids(tok, name, "gguf", c, "ids", false);
            check_ids(tok, name, "gguf", c, "ids_special", true);
            check_decode(tok, name, "gguf", c);
        }
        td_tokenizer_free(tok);
    }
    cJSON_Delete(root);
    TEST_DONE();
}
