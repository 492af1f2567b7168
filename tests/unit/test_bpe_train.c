// BPE trainer tests: (1) the learned merges equal an independent slow Python reimplementation of
// the training rule (tests/reference/bpe_train_ref.py) on small corpora; (2) a 600-token vocabulary
// trained on ~300 KB of Brown text loads in Hugging Face tokenizers (node oracle
// tests/oracle/bpe_encode_oracle.js) and in td_tokenizer, which produce the same ids for a varied
// text set (with and without the BOS post-processor), and decoding round-trips the text;
// (3) bad parameters are refused. Needs .cache/brown.txt (node bench/brown_text.js), node with
// tests/oracle/node_modules and /usr/bin/python3; fails (does not skip) without them.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/file.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/bpe_train.h"

static char dir[1024];

static int write_file(const char *path, const char *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = fwrite(p, 1, n, f);
    return fclose(f) == 0 && w == n;
}

static cJSON *read_json(const char *path) {
    char *s;
    size_t n;
    td_err err = {0};
    if (td_read_file(path, 0, &s, &n, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return NULL;
    }
    cJSON *j = cJSON_Parse(s);
    free(s);
    return j;
}

// Trains on `text` with the given sizes and writes into sub-directory `name`; returns 1 on success.
static int train_to(const char *name, const char *text, size_t len, int vocab, int min_freq,
                    char *out, size_t cap) {
    td_bpe_params p = td_bpe_default_params();
    p.vocab_size = vocab;
    p.min_frequency = min_freq;
    td_bpe_trainer *t = NULL;
    td_err err = {0};
    td_status st = td_bpe_trainer_new(&p, &t, &err);
    // Feed in two pieces (at a line break) to exercise accumulation across calls.
    const char *mid = memchr(text + len / 2, '\n', len - len / 2);
    size_t k = mid ? (size_t)(mid - text) + 1 : len;
    if (!st) st = td_bpe_feed(t, text, k, &err);
    if (!st) st = td_bpe_feed(t, text + k, len - k, &err);
    if (!st) st = td_bpe_train(t, &err);
    snprintf(out, cap, "%s/%s", dir, name);
    if (!st) st = td_bpe_write(t, out, &err);
    CHECK(st == TD_OK, "%s: %s", name, err.msg);
    if (!st)
        CHECK(td_bpe_vocab_size(t) <= vocab, "%s: vocab %d > %d", name, td_bpe_vocab_size(t),
              vocab);
    td_bpe_trainer_free(t);
    return st == TD_OK;
}

// Trains with tandem and with the Python reference; the merge lists must be identical.
static void check_against_reference(const char *name, const char *text, size_t len, int vocab,
                                    int min_freq) {
    char out[1200], corpus[1300], ref[1300], cmd[4200], tj[1300];
    if (!train_to(name, text, len, vocab, min_freq, out, sizeof out)) return;
    snprintf(corpus, sizeof corpus, "%s/corpus.txt", out);
    snprintf(ref, sizeof ref, "%s/ref.json", out);
    write_file(corpus, text, len);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/bpe_train_ref.py '%s' %d %d 2 '%s'",
             corpus, vocab, min_freq, ref);
    CHECK(system(cmd) == 0, "%s: python reference failed: %s", name, cmd);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", out);
    cJSON *a = read_json(tj), *b = read_json(ref);
    CHECK(a && b, "%s: cannot read outputs", name);
    if (a && b) {
        cJSON *ma = cJSON_GetObjectItem(cJSON_GetObjectItem(a, "model"), "merges");
        cJSON *mb = cJSON_GetObjectItem(b, "merges");
        int na = cJSON_GetArraySize(ma), nb = cJSON_GetArraySize(mb), i = 0;
        while (
            i < na && i < nb &&
            !strcmp(cJSON_GetArrayItem(ma, i)->valuestring, cJSON_GetArrayItem(mb, i)->valuestring))
            i++;
        CHECK(na == nb && i == na,
              "%s: merges differ at %d (tandem %d merges, reference %d): '%s' vs '%s'", name, i, na,
              nb, i < na ? cJSON_GetArrayItem(ma, i)->valuestring : "-",
              i < nb ? cJSON_GetArrayItem(mb, i)->valuestring : "-");
        CHECK(na > 50, "%s: only %d merges", name, na);
    }
    cJSON_Delete(a);
    cJSON_Delete(b);
}

static void hex(const char *s, size_t n, char *out) {
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", (unsigned char)s[i]);
    out[2 * n] = 0;
}

static int ids_equal(const td_tokens *t, const cJSON *arr, int *at) {
    int n = cJSON_GetArraySize(arr);
    for (int i = 0; i < n; i++) {
        if ((size_t)i >= t->n || t->ids[i] != (int32_t)cJSON_GetArrayItem(arr, i)->valuedouble) {
            *at = i;
            return 0;
        }
    }
    *at = n;
    return (size_t)n == t->n;
}

static void check_against_hf(const char *brown, size_t blen) {
    size_t train_len = blen < 300000 ? blen : 300000;
    while (train_len < blen && brown[train_len - 1] != '\n') train_len++;
    char out[1200];
    if (!train_to("brown600", brown, train_len, 600, 2, out, sizeof out)) return;
    // The varied text set: prose (also unseen Brown text), digits, punctuation, unicode, whitespace
    // runs, contractions, CRLF, special tokens inside text, long repeats, the empty string.
    static char unseen[6000];
    size_t off = blen > 1000000 ? 1000000 : blen / 2, ul = blen - off < 5000 ? blen - off : 5000;
    memcpy(unseen, brown + off, ul);
    unseen[ul] = 0;
    const char *texts[] = {
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
        "election.",
        "Numbers: 0 7 42 123 1234 12345678 3.14159 1,000,000 -17 2nd 1990s",
        "Punctuation!!! ?? ... ;-) (parens) [brackets] {braces} \"quotes\" 'single' `tick` -- dash",
        "Unicode: café naïve façade Zürich Ωμέγα Привет 日本語のテキスト 🙂👍🏽 "
        "e\xcc\x81",
        "   leading spaces, trailing   \n\n\n\ttabs\t\tand  runs    of   spaces      \n  \n",
        "I'm sure they'LL say we'd've done it; DON'T ' s 'S",
        "line one\r\nline two\r\n\r\nthree\n",
        "<|bos|>special tokens <|eos|> inside<|eos|>text<|bos|>",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbbbbbbbbbbbbb",
        "",
        " ",
        "\n",
        unseen,
    };
    int nt = (int)(sizeof texts / sizeof texts[0]);
    // Oracle input.
    size_t cap = 64;
    for (int i = 0; i < nt; i++) cap += 2 * strlen(texts[i]) + 8;
    char *js = malloc(cap), *h = malloc(2 * sizeof unseen + 1);
    size_t n = 0;
    n += (size_t)sprintf(js + n, "[");
    for (int i = 0; i < nt; i++) {
        hex(texts[i], strlen(texts[i]), h);
        n += (size_t)sprintf(js + n, "%s\"%s\"", i ? "," : "", h);
    }
    n += (size_t)sprintf(js + n, "]");
    char in[1300], res[1300], tj[1300], cmd[4200];
    snprintf(in, sizeof in, "%s/texts.json", out);
    snprintf(res, sizeof res, "%s/hf.json", out);
    snprintf(tj, sizeof tj, "%s/tokenizer.json", out);
    write_file(in, js, n);
    free(js);
    snprintf(cmd, sizeof cmd, "node tests/oracle/bpe_encode_oracle.js '%s' '%s' '%s'", tj, in, res);
    CHECK(system(cmd) == 0, "HF oracle failed (npm ci --prefix tests/oracle?): %s", cmd);
    cJSON *hf = read_json(res);
    CHECK(hf && cJSON_GetArraySize(hf) == nt, "HF oracle output missing or short");
    td_tokenizer *tok = NULL;
    td_err err = {0};
    CHECK(td_tokenizer_load(out, &tok, &err) == TD_OK, "td_tokenizer_load: %s", err.msg);
    if (hf && tok && cJSON_GetArraySize(hf) == nt) {
        CHECK(td_tokenizer_vocab_size(tok) == 600, "vocab %d", td_tokenizer_vocab_size(tok));
        CHECK(td_tokenizer_bos_id(tok) == 598 && td_tokenizer_eos_id(tok) == 599, "bos %d eos %d",
              td_tokenizer_bos_id(tok), td_tokenizer_eos_id(tok));
        size_t total = 0;
        for (int i = 0; i < nt; i++) {
            const cJSON *r = cJSON_GetArrayItem(hf, i);
            td_tokens t = {0};
            int at;
            for (int special = 0; special < 2; special++) {
                CHECK(td_tokenizer_encode(tok, texts[i], strlen(texts[i]), special, &t, &err) ==
                          TD_OK,
                      "encode: %s", err.msg);
                const cJSON *want = cJSON_GetObjectItem(r, special ? "ids_special" : "ids");
                CHECK(ids_equal(&t, want, &at),
                      "text %d (special %d): ids differ from HF at %d (%zu vs %d)", i, special, at,
                      t.n, cJSON_GetArraySize(want));
                if (special) CHECK(t.n >= 1 && t.ids[0] == 598, "text %d: no BOS", i);
            }
            total += t.n;
            // HF decodes its ids back to the input exactly (byte-level BPE is lossless).
            hex(texts[i], strlen(texts[i]), h);
            CHECK(!strcmp(cJSON_GetObjectItem(r, "decoded_hex")->valuestring, h),
                  "text %d: HF decode differs", i);
            char *dec;
            size_t dl;
            CHECK(td_tokenizer_decode(tok, t.ids, t.n, false, &dec, &dl, &err) == TD_OK,
                  "decode: %s", err.msg);
            CHECK(dl == strlen(texts[i]) + 7 && !memcmp(dec, "<|bos|>", 7) &&
                      !memcmp(dec + 7, texts[i], dl - 7),
                  "text %d: tandem decode differs from <|bos|> + text", i);
            free(dec);
            td_tokens_free(&t);
        }
        CHECK(total > 1000, "only %zu tokens", total);
    }
    td_tokenizer_free(tok);
    cJSON_Delete(hf);
    free(h);
    // The config names the special tokens and has a template.
    char cfgp[1300];
    snprintf(cfgp, sizeof cfgp, "%s/tokenizer_config.json", out);
    cJSON *cfg = read_json(cfgp);
    CHECK(cfg && !strcmp(cJSON_GetObjectItem(cfg, "bos_token")->valuestring, "<|bos|>") &&
              !strcmp(cJSON_GetObjectItem(cfg, "eos_token")->valuestring, "<|eos|>") &&
              cJSON_IsString(cJSON_GetObjectItem(cfg, "chat_template")) &&
              cJSON_GetObjectItem(cfg, "model_max_length")->valuedouble == 2048,
          "tokenizer_config.json fields");
    cJSON_Delete(cfg);
}

static void check_params(void) {
    td_bpe_params p = td_bpe_default_params();
    td_bpe_trainer *t = NULL;
    td_err err = {0};
    p.vocab_size = 257;  // 256 bytes + 2 specials do not fit
    CHECK(td_bpe_trainer_new(&p, &t, &err) == TD_ERR_INVALID && !t, "small vocab accepted");
    p = td_bpe_default_params();
    p.special[p.n_special++] = "<|eos|>";
    CHECK(td_bpe_trainer_new(&p, &t, &err) == TD_ERR_INVALID && !t, "duplicate special accepted");
    p = td_bpe_default_params();
    p.pattern = "(unclosed";
    CHECK(td_bpe_trainer_new(&p, &t, &err) == TD_ERR_INVALID && strstr(err.msg, "regex"),
          "bad regex: %s", err.msg);
    // Invalid UTF-8 is replaced, not fatal; the trained file still writes.
    p = td_bpe_default_params();
    p.vocab_size = 300;
    CHECK(td_bpe_trainer_new(&p, &t, &err) == TD_OK, "new: %s", err.msg);
    const char bad[] = "ab\xff\xfe cd ab ab \xc3 cd";
    CHECK(td_bpe_feed(t, bad, sizeof bad - 1, &err) == TD_OK, "invalid utf-8: %s", err.msg);
    CHECK(td_bpe_train(t, &err) == TD_OK, "train: %s", err.msg);
    CHECK(td_bpe_train(t, &err) == TD_ERR_INVALID, "second train accepted");
    CHECK(td_bpe_merge_count(t) >= 2, "merges %d", td_bpe_merge_count(t));
    td_bpe_trainer_free(t);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/test_bpe_train", td_test_data_dir());
    mkdir(td_test_data_dir(), 0755);
    mkdir(dir, 0755);
    check_params();
    char bp[1100];
    snprintf(bp, sizeof bp, "%s/brown.txt", td_test_data_dir());
    char *brown = NULL;
    size_t blen = 0;
    td_err err = {0};
    CHECK(td_read_file(bp, 0, &brown, &blen, &err) == TD_OK && blen > 1000000,
          "%s missing: run `node bench/brown_text.js` (%s)", bp, err.msg);
    if (brown) {
        // Reference 1: 30 KB of Brown plus mixed text, vocab 420.
        static char small[40000];
        size_t k = 30000;
        while (brown[k - 1] != '\n') k++;
        memcpy(small, brown, k);
        const char extra[] =
            "Café naïve façade, Zürich's 日本語 text; I'M THEY'LL we'd 12345 3.14 ... !!?\n\n\t  "
            "spaced   out  \r\nend 'twas 2024-01-02\n";
        memcpy(small + k, extra, sizeof extra - 1);
        check_against_reference("ref_brown", small, k + sizeof extra - 1, 420, 2);
        // Reference 2: random words over a two-letter alphabet (many ties, long merge chains).
        static char ab[20000];
        uint32_t s = 12345;
        size_t n = 0;
        while (n < sizeof ab - 40) {
            s = s * 1103515245u + 12345u;
            int len = 1 + (int)((s >> 16) % 14);
            for (int i = 0; i < len; i++) {
                s = s * 1103515245u + 12345u;
                ab[n++] = (s >> 20) & 1 ? 'a' : 'b';
            }
            ab[n++] = (s >> 24) % 7 ? ' ' : '\n';
        }
        check_against_reference("ref_ab", ab, n, 700, 1);
        check_against_hf(brown, blen);
        // Speed guard: the whole Brown corpus to 4000 tokens must take seconds, not minutes (an
        // accidental full recount per merge would take minutes). Release build: ~0.15 s.
        td_bpe_params p = td_bpe_default_params();
        p.vocab_size = 4000;
        td_bpe_trainer *t = NULL;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        CHECK(td_bpe_trainer_new(&p, &t, &err) == TD_OK &&
                  td_bpe_feed(t, brown, blen, &err) == TD_OK && td_bpe_train(t, &err) == TD_OK,
              "brown 4000: %s", err.msg);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        CHECK(t && td_bpe_vocab_size(t) == 4000, "brown vocab %d", t ? td_bpe_vocab_size(t) : -1);
        CHECK(dt < 30, "training 4000 tokens on Brown took %.1f s", dt);
        printf("Brown corpus (%zu bytes) -> 4000 tokens in %.3f s\n", blen, dt);
        td_bpe_trainer_free(t);
    }
    free(brown);
    TEST_DONE();
}
