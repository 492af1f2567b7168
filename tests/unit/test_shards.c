// Token shard tests: uint16/uint32 round trips, every truncation and byte flip refused with a
// message, out-of-range ids refused, and data prepare (document splitting, separators, train/val
// split by documents and by tokens, shard size limits, determinism) with a fake byte encoder,
// plus an end-to-end run with a BPE tokenizer trained on Brown text and decoded back.
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/bpe_train.h"
#include "train/shards.h"

static char dir[1024];

static void rm_dir(const char *d) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", d);
}

static int write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n;
}

static void test_round_trip(void) {
    td_err err = {0};
    char p[1200];
    int vocabs[] = {1000, 65536, 65537, 200000};
    for (int v = 0; v < 4; v++) {
        int vocab = vocabs[v];
        int32_t ids[777];
        for (int i = 0; i < 777; i++)
            ids[i] = (int32_t)(((uint32_t)i * 2654435761u) % (uint32_t)vocab);
        ids[0] = vocab - 1;
        ids[1] = 0;
        snprintf(p, sizeof p, "%s/rt%d.tdsh", dir, v);
        CHECK(td_shard_write(p, vocab, ids, 777, 5, &err) == TD_OK, "write: %s", err.msg);
        td_shard *s = NULL;
        CHECK(td_shard_open(p, &s, &err) == TD_OK, "open: %s", err.msg);
        if (!s) continue;
        CHECK(td_shard_tokens(s) == 777 && td_shard_docs(s) == 5 && td_shard_vocab(s) == vocab,
              "header fields");
        CHECK(td_shard_token_bytes(s) == (vocab <= 65536 ? 2 : 4), "vocab %d: %d-byte tokens",
              vocab, td_shard_token_bytes(s));
        int32_t back[777];
        td_shard_read(s, 0, 777, back);
        CHECK(!memcmp(back, ids, sizeof ids), "vocab %d: tokens differ", vocab);
        td_shard_read(s, 700, 77, back);
        CHECK(!memcmp(back, ids + 700, 77 * sizeof *ids), "vocab %d: offset read differs", vocab);
        struct stat st;
        stat(p, &st);
        CHECK(st.st_size == 64 + 777 * td_shard_token_bytes(s) + 8, "file size %lld",
              (long long)st.st_size);
        td_shard_close(s);
    }
    // An empty shard is valid.
    snprintf(p, sizeof p, "%s/empty.tdsh", dir);
    td_shard *s = NULL;
    CHECK(td_shard_write(p, 10, NULL, 0, 0, &err) == TD_OK && td_shard_open(p, &s, &err) == TD_OK &&
              td_shard_tokens(s) == 0,
          "empty shard: %s", err.msg);
    td_shard_close(s);
    int32_t bad[3] = {1, 10, 2};
    snprintf(p, sizeof p, "%s/bad.tdsh", dir);
    CHECK(
        td_shard_write(p, 10, bad, 3, 1, &err) == TD_ERR_INVALID && strstr(err.msg, "token 1 = 10"),
        "out-of-range id: %s", err.msg);
    CHECK(!td_file_exists(p), "file written for bad ids");
}

static void test_corruption(void) {
    td_err err = {0};
    char p[1200], q[1200];
    int32_t ids[100];
    for (int i = 0; i < 100; i++) ids[i] = i * 7;
    snprintf(p, sizeof p, "%s/c.tdsh", dir);
    snprintf(q, sizeof q, "%s/m.tdsh", dir);
    CHECK(td_shard_write(p, 1000, ids, 100, 1, &err) == TD_OK, "write: %s", err.msg);
    char *orig;
    size_t n;
    CHECK(td_read_file(p, 0, &orig, &n, &err) == TD_OK, "read");
    int trunc = 0, named = 0, flips = 0;
    td_shard *s = NULL;
    for (size_t cut = 0; cut < n; cut++) {
        write_bytes(q, orig, cut);
        trunc += td_shard_open(q, &s, &err) == TD_ERR_FORMAT && !s;
        named += strstr(err.msg, "truncated") || strstr(err.msg, "marker");
    }
    CHECK(trunc == (int)n && named == (int)n, "truncations: %d detected, %d named, of %zu", trunc,
          named, n);
    char *m = malloc(n);
    for (size_t i = 0; i < n; i++) {
        memcpy(m, orig, n);
        m[i] ^= (char)(1 << (i % 8));
        write_bytes(q, m, n);
        flips += td_shard_open(q, &s, &err) == TD_ERR_FORMAT && !s;
    }
    CHECK(flips == (int)n, "%d of %zu byte flips detected", flips, n);
    memcpy(m, orig, n);
    m[64 + 10] ^= 1;
    write_bytes(q, m, n);
    CHECK(td_shard_open(q, &s, &err) == TD_ERR_FORMAT && strstr(err.msg, "payload checksum"), "%s",
          err.msg);
    free(m);
    free(orig);
}

// Fake encoder: every byte is its own id; counts calls.
static int enc_calls;
static td_status fake_encode(void *ctx, const char *text, size_t len, td_tokens *out, td_err *err) {
    enc_calls++;
    if (out->cap < len) {
        int32_t *nb = realloc(out->ids, (len + 1) * sizeof *nb);
        if (!nb) return td_err_set(err, TD_ERR_NOMEM, "oom");
        out->ids = nb;
        out->cap = len + 1;
    }
    out->n = len;
    for (size_t i = 0; i < len; i++) out->ids[i] = (unsigned char)text[i];
    return TD_OK;
}

// Concatenates every shard <name>-<split>-*.tdsh in order; returns the token count.
static size_t read_split(const char *d, const char *name, const char *split, int32_t *out,
                         size_t cap, int *nshards) {
    size_t n = 0;
    *nshards = 0;
    for (int i = 0;; i++) {
        char p[1300];
        snprintf(p, sizeof p, "%s/%s-%s-%06d.tdsh", d, name, split, i);
        if (!td_file_exists(p)) break;
        td_shard *s = NULL;
        td_err err = {0};
        if (td_shard_open(p, &s, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 0;
        }
        size_t k = td_shard_tokens(s);
        if (n + k <= cap) td_shard_read(s, 0, k, out + n);
        n += k;
        (*nshards)++;
        td_shard_close(s);
    }
    return n;
}

static void test_prepare_fake(void) {
    char d[1200], f1[1300], f2[1300];
    snprintf(d, sizeof d, "%s/prep", dir);
    mkdir(d, 0755);
    snprintf(f1, sizeof f1, "%s/a.txt", d);
    snprintf(f2, sizeof f2, "%s/b.txt", d);
    const char *t1 = "doc one line 1\ndoc one line 2\n\n\ndoc two\r\n  \nthree",
               *t2 = "\n\nfour\nfour b\n";
    write_bytes(f1, t1, strlen(t1));
    write_bytes(f2, t2, strlen(t2));
    const char *files[] = {f1, f2};
    td_shard_prepare_params p = td_shard_prepare_default_params();
    p.out_dir = d;
    p.name = "x";
    p.vocab_size = 257;
    p.sep_id = 256;
    p.encode = fake_encode;
    td_shard_prepare_stats st;
    td_err err = {0};
    CHECK(td_shard_prepare(&p, files, 2, &st, &err) == TD_OK, "prepare: %s", err.msg);
    CHECK(st.docs[0] == 4 && st.docs[1] == 0 && st.shards[0] == 1 && st.shards[1] == 0,
          "docs %llu/%llu", (unsigned long long)st.docs[0], (unsigned long long)st.docs[1]);
    const char *want_docs[] = {"doc one line 1\ndoc one line 2", "doc two", "three",
                               "four\nfour b"};
    int32_t want[256], got[512];
    size_t wn = 0;
    for (int i = 0; i < 4; i++) {
        for (const char *c = want_docs[i]; *c; c++) want[wn++] = (unsigned char)*c;
        want[wn++] = 256;
    }
    int ns;
    size_t gn = read_split(d, "x", "train", got, 512, &ns);
    CHECK(gn == wn && !memcmp(got, want, wn * sizeof *got),
          "blank-line documents + EOS: %zu vs %zu tokens", gn, wn);
    CHECK(st.tokens[0] == wn, "stats tokens");
    // BOS before, line mode, tiny shards: the concatenated stream is the same tokens.
    p.docs = TD_SHARD_DOC_LINE;
    p.sep_before = true;
    p.shard_tokens = 7;
    p.name = "y";
    CHECK(td_shard_prepare(&p, files, 2, &st, &err) == TD_OK, "prepare: %s", err.msg);
    const char *lines[] = {"doc one line 1", "doc one line 2", "doc two", "  ",
                           "three",          "four",           "four b"};
    wn = 0;
    for (int i = 0; i < 7; i++) {
        want[wn++] = 256;
        for (const char *c = lines[i]; *c; c++) want[wn++] = (unsigned char)*c;
    }
    gn = read_split(d, "y", "train", got, 512, &ns);
    CHECK(gn == wn && !memcmp(got, want, wn * sizeof *got), "line documents with BOS: %zu vs %zu",
          gn, wn);
    CHECK(ns == (int)((wn + 6) / 7) && st.shards[0] == ns, "%d shards for %zu tokens", ns, wn);
    // File mode: two documents.
    p.docs = TD_SHARD_DOC_FILE;
    p.name = "z";
    p.shard_tokens = 1 << 20;
    CHECK(td_shard_prepare(&p, files, 2, &st, &err) == TD_OK && st.docs[0] == 2, "file mode");
    // A missing file and a failing encoder are errors naming the problem.
    const char *missing[] = {f1, "/nonexistent/x.txt"};
    CHECK(td_shard_prepare(&p, missing, 2, &st, &err) == TD_ERR_IO &&
              strstr(err.msg, "/nonexistent/x.txt"),
          "%s", err.msg);
    p.vocab_size = 100;  // bytes >= 100 are out of range for the shard
    p.sep_id = 99;
    CHECK(td_shard_prepare(&p, files, 2, &st, &err) == TD_ERR_INVALID &&
              strstr(err.msg, "outside the vocabulary"),
          "%s", err.msg);
}

// Splits of many small documents: by documents (seeded, deterministic) and by tokens.
static void test_split(void) {
    char d[1200], f[1300];
    snprintf(d, sizeof d, "%s/split", dir);
    mkdir(d, 0755);
    snprintf(f, sizeof f, "%s/docs.txt", d);
    static char text[200000];
    size_t n = 0;
    for (int i = 0; i < 2000; i++)
        n += (size_t)sprintf(text + n, "document %d %.*s\n", i, i % 37,
                             "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx");
    write_bytes(f, text, n);
    const char *files[] = {f};
    td_shard_prepare_params p = td_shard_prepare_default_params();
    p.out_dir = d;
    p.vocab_size = 257;
    p.sep_id = 256;
    p.docs = TD_SHARD_DOC_LINE;
    p.encode = fake_encode;
    p.val_fraction = 0.1;
    p.seed = 7;
    p.name = "a";
    td_shard_prepare_stats s1, s2, s3;
    td_err err = {0};
    CHECK(td_shard_prepare(&p, files, 1, &s1, &err) == TD_OK, "%s", err.msg);
    CHECK(s1.docs[0] + s1.docs[1] == 2000 && s1.docs[1] > 150 && s1.docs[1] < 250,
          "val docs %llu of 2000", (unsigned long long)s1.docs[1]);
    p.name = "b";
    CHECK(td_shard_prepare(&p, files, 1, &s2, &err) == TD_OK, "%s", err.msg);
    char a[1300], b[1300];
    snprintf(a, sizeof a, "%s/a-val-000000.tdsh", d);
    snprintf(b, sizeof b, "%s/b-val-000000.tdsh", d);
    char *ta = NULL, *tb = NULL;
    size_t la = 0, lb = 0;
    CHECK(!td_read_file(a, 0, &ta, &la, &err) && !td_read_file(b, 0, &tb, &lb, &err) && la == lb &&
              !memcmp(ta, tb, la),
          "same seed, different validation shards");
    free(ta);
    free(tb);
    p.seed = 8;
    p.name = "c";
    CHECK(td_shard_prepare(&p, files, 1, &s3, &err) == TD_OK, "%s", err.msg);
    CHECK(s3.tokens[1] != s1.tokens[1], "another seed gave the same split (%llu tokens)",
          (unsigned long long)s3.tokens[1]);
    // By tokens: validation holds within one document of 25% of the tokens.
    p.split = TD_SHARD_SPLIT_TOKENS;
    p.val_fraction = 0.25;
    p.name = "d";
    CHECK(td_shard_prepare(&p, files, 1, &s1, &err) == TD_OK, "%s", err.msg);
    double frac = (double)s1.tokens[1] / (double)(s1.tokens[0] + s1.tokens[1]);
    CHECK(frac > 0.245 && frac < 0.255, "token split %.4f", frac);
    p.val_fraction = 0;
    p.name = "e";
    CHECK(
        td_shard_prepare(&p, files, 1, &s1, &err) == TD_OK && s1.docs[1] == 0 && s1.shards[1] == 0,
        "no val");
}

// End to end: train a small BPE tokenizer, prepare Brown text with it, decode each document back.
static void test_prepare_tokenizer(void) {
    char bp[1100];
    snprintf(bp, sizeof bp, "%s/brown.txt", td_test_data_dir());
    char *brown;
    size_t blen;
    td_err err = {0};
    CHECK(td_read_file(bp, 0, &brown, &blen, &err) == TD_OK, "%s (run node bench/brown_text.js)",
          err.msg);
    if (!brown) return;
    size_t k = 200000;
    while (k < blen && brown[k - 1] != '\n') k++;
    char d[1200], tokdir[1300], f[1300];
    snprintf(d, sizeof d, "%s/brown", dir);
    snprintf(tokdir, sizeof tokdir, "%s/tok", d);
    snprintf(f, sizeof f, "%s/in.txt", d);
    mkdir(d, 0755);
    write_bytes(f, brown, k);
    td_bpe_params bp_ = td_bpe_default_params();
    bp_.vocab_size = 512;
    td_bpe_trainer *tr = NULL;
    CHECK(td_bpe_trainer_new(&bp_, &tr, &err) == TD_OK &&
              td_bpe_feed(tr, brown, k, &err) == TD_OK && td_bpe_train(tr, &err) == TD_OK &&
              td_bpe_write(tr, tokdir, &err) == TD_OK,
          "train: %s", err.msg);
    td_bpe_trainer_free(tr);
    td_tokenizer *tok = NULL;
    CHECK(td_tokenizer_load(tokdir, &tok, &err) == TD_OK, "load: %s", err.msg);
    if (!tok) {
        free(brown);
        return;
    }
    td_shard_prepare_params p = td_shard_prepare_default_params();
    p.out_dir = d;
    p.name = "brown";
    p.vocab_size = td_tokenizer_vocab_size(tok);
    p.sep_id = td_tokenizer_eos_id(tok);
    p.docs = TD_SHARD_DOC_LINE;
    p.val_fraction = 0.05;
    p.encode = td_shard_encode_tokenizer;
    p.encode_ctx = tok;
    td_shard_prepare_stats st;
    const char *files[] = {f};
    CHECK(td_shard_prepare(&p, files, 1, &st, &err) == TD_OK, "prepare: %s", err.msg);
    size_t cap = (size_t)(st.tokens[0] + st.tokens[1]) + 16;
    int32_t *ids = malloc(cap * sizeof *ids);
    int ns;
    size_t n = read_split(d, "brown", "train", ids, cap, &ns);
    size_t nv = read_split(d, "brown", "val", ids + n, cap - n, &ns);
    CHECK(n == st.tokens[0] && nv == st.tokens[1] && n > 40000, "%zu + %zu tokens", n, nv);
    // Decode document by document (split at EOS): every decoded line is a line of the input, and
    // the train documents in order are the input lines minus the validation ones.
    size_t start = 0, docs = 0, matched = 0;
    const char *cursor = brown;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] != p.sep_id) continue;
        char *text;
        size_t tl;
        CHECK(td_tokenizer_decode(tok, ids + start, i - start, false, &text, &tl, &err) == TD_OK,
              "decode");
        // Find this line at or after the cursor (validation lines are skipped over).
        for (;;) {
            const char *nl = memchr(cursor, '\n', (size_t)(brown + k - cursor));
            if (!nl) break;
            size_t ll = (size_t)(nl - cursor);
            const char *line = cursor;
            cursor = nl + 1;
            if (ll == tl && !memcmp(line, text, tl)) {
                matched++;
                break;
            }
        }
        free(text);
        docs++;
        start = i + 1;
    }
    CHECK(docs == st.docs[0] && matched == docs,
          "%zu train documents, %zu matched input lines in order", docs, matched);
    // Four encoder threads write byte-identical shards.
    p.n_threads = 4;
    p.name = "brown4";
    td_shard_prepare_stats st4;
    CHECK(td_shard_prepare(&p, files, 1, &st4, &err) == TD_OK, "prepare (4 threads): %s", err.msg);
    const char *sp[] = {"train", "val"};
    for (int v = 0; v < 2; v++) {
        char a[1400], b[1400];
        snprintf(a, sizeof a, "%s/brown-%s-000000.tdsh", d, sp[v]);
        snprintf(b, sizeof b, "%s/brown4-%s-000000.tdsh", d, sp[v]);
        char *ta = NULL, *tb = NULL;
        size_t la = 0, lb = 0;
        td_read_file(a, 0, &ta, &la, &err);
        td_read_file(b, 0, &tb, &lb, &err);
        CHECK(ta && tb && la == lb && !memcmp(ta, tb, la), "%s shard differs with 4 threads",
              sp[v]);
        free(ta);
        free(tb);
    }
    free(ids);
    td_tokenizer_free(tok);
    free(brown);
}

// The command line (the tandem binary: TANDEM_BIN, set by ctest; a failure without it): tokenizer
// train then data prepare on a slice of Brown text, and usage errors exit 2.
static void test_cli(void) {
    const char *bin = td_test_bin();
    if (!bin) return;
    char d[1200], cmd[9000];
    snprintf(d, sizeof d, "%s/cli", dir);
    mkdir(d, 0755);
    snprintf(cmd, sizeof cmd,
             "head -c 100000 '%s/brown.txt' > '%s/in.txt' && '%s' tokenizer train --vocab-size 400 "
             "--special '<|x|>' "
             "--out '%s/tok' '%s/in.txt' && '%s' data prepare --tokenizer '%s/tok' --out '%s' "
             "--docs line "
             "--val-fraction 0.1 --split tokens '%s/in.txt'",
             td_test_data_dir(), d, bin, d, d, bin, d, d, d);
    CHECK(system(cmd) == 0, "command failed: %s", cmd);
    char p[1300];
    snprintf(p, sizeof p, "%s/data-train-000000.tdsh", d);
    td_shard *s = NULL;
    td_err err = {0};
    CHECK(td_shard_open(p, &s, &err) == TD_OK && td_shard_vocab(s) == 400 &&
              td_shard_tokens(s) > 10000,
          "CLI shard: %s", err.msg);
    td_shard_close(s);
    snprintf(cmd, sizeof cmd, "'%s' data prepare --out x >/dev/null 2>&1", bin);
    int rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "usage error exit %d", rc);
    snprintf(cmd, sizeof cmd, "'%s' tokenizer train --vocab-size 12 --out x y >/dev/null 2>&1",
             bin);
    rc = system(cmd);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2, "usage error exit %d", rc);
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/test_shards", td_test_data_dir());
    rm_dir(dir);
    mkdir(td_test_data_dir(), 0755);
    mkdir(dir, 0755);
    test_round_trip();
    test_corruption();
    test_prepare_fake();
    test_split();
    test_prepare_tokenizer();
    test_cli();
    rm_dir(dir);
    TEST_DONE();
}
