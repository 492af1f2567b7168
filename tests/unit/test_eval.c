// Tests td_eval (src/train/eval.h) and `tandem eval` against the PyTorch oracle: the reference
// models' saved log-softmax rows (tests/reference/make_models.py) give, through
// tests/reference/eval_oracle.py, the NLL of windows equal to prefixes of the 300-token prompt.
// Also: several windows per batch == one at a time, and bad input (missing or corrupt shard,
// vocabulary mismatch, seq_len beyond the context, bad ids, usage errors) refused clearly.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "model/model.h"
#include "kernel_choice.h"
#include "test_util.h"
#include "train/eval.h"
#include "train/shards.h"

#define TOL 1e-4  // mean NLL, nats: the oracle's float64 vs tandem's f32 forward (test_oracle.c)

static char ref_dir[1024], work[1024];
static int32_t prompt[300];
static int n_prompt;

typedef struct {
    const char *name;  // as in oracle.json
    char path[1100];
    double sum299, sum64, sum32;  // oracle NLL sums of windows prompt[0..T]
} ref_model;

static ref_model models[2] = {{.name = "llama2"}, {.name = "qwen3-q8_0.gguf"}};

// Runs cmd and returns its stdout (malloc'd, NUL-terminated) and exit status.
static char *run_cmd(const char *cmd, int *status) {
    FILE *p = popen(cmd, "r");
    if (!p) {
        *status = -1;
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (n + 1 == cap) buf = realloc(buf, cap *= 2);
    }
    buf[n] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

static int load_oracle(void) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 tests/reference/eval_oracle.py '%s' len300 llama2,qwen3-q8_0.gguf "
             "299,64,32",
             ref_dir);
    int status;
    char *out = run_cmd(cmd, &status);
    CHECK(out && status == 0, "eval_oracle.py failed (status %d); run /usr/bin/python3 "
                              "tests/reference/make_models.py first", status);
    if (!out || status) {
        free(out);
        return 0;
    }
    cJSON *root = cJSON_Parse(out);
    free(out);
    CHECK(root != NULL, "eval_oracle.py: not JSON");
    if (!root) return 0;
    const cJSON *pr = cJSON_GetObjectItem(root, "prompt"), *e;
    n_prompt = 0;
    cJSON_ArrayForEach(e, pr) if (n_prompt < 300) prompt[n_prompt++] = (int32_t)e->valuedouble;
    CHECK(n_prompt == 300, "prompt has %d tokens", n_prompt);
    for (int i = 0; i < 2; i++) {
        const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "models"), models[i].name);
        const cJSON *s = cJSON_GetObjectItem(m, "sum");
        td_path_join(models[i].path, sizeof models[i].path, ref_dir,
                     cJSON_GetStringValue(cJSON_GetObjectItem(m, "path")));
        models[i].sum299 = cJSON_GetNumberValue(cJSON_GetObjectItem(s, "299"));
        models[i].sum64 = cJSON_GetNumberValue(cJSON_GetObjectItem(s, "64"));
        models[i].sum32 = cJSON_GetNumberValue(cJSON_GetObjectItem(s, "32"));
        CHECK(isfinite(models[i].sum299) && models[i].sum299 > 0, "%s: no oracle sums", models[i].name);
    }
    cJSON_Delete(root);
    return n_prompt == 300;
}

static td_eval *make_eval(const td_model *m, int T, int batch, int max_batch_tokens) {
    td_eval_params p = td_eval_default_params();
    p.seq_len = T;
    p.batch = batch;
    p.max_batch_tokens = max_batch_tokens;
    p.n_threads = 2;
    td_eval *e = NULL;
    td_err err = {0};
    td_status st = td_eval_create_for_model(m, &p, &e, &err);
    CHECK(st == TD_OK, "eval create T=%d B=%d: %s", T, batch, err.msg);
    return e;
}

// The whole prompt as one window (T = 299), through the shard path and the CLI.
static void test_oracle_window(const ref_model *rm, const char *shard) {
    td_model *m = NULL;
    td_err err = {0};
    if (td_model_load(rm->path, &m, &err) != TD_OK) {
        CHECK(0, "%s: %s", rm->path, err.msg);
        return;
    }
    td_eval *e = make_eval(m, 299, 1, 0);
    if (e) {
        td_eval_result r;
        const char *paths[1] = {shard};
        td_status st = td_eval_shards(e, paths, 1, 0, &r, &err);
        CHECK(st == TD_OK, "%s: %s", rm->name, err.msg);
        CHECK(r.windows == 1 && r.tokens == 299, "%s: %llu windows, %llu tokens", rm->name,
              (unsigned long long)r.windows, (unsigned long long)r.tokens);
        double want = rm->sum299 / 299;
        CHECK_NEAR(r.nll, want, TOL, rm->name);
        CHECK_NEAR(r.ppl, exp(want), TOL * exp(want), "perplexity");
        printf("%-16s T=299: nll %.6f (oracle %.6f, diff %.2g), ppl %.3f, %.0f tokens/s\n", rm->name,
               r.nll, want, fabs(r.nll - want), r.ppl, r.tokens_per_s);
        td_eval_free(e);
    }
    // Three copies of prompt[0..64] in one batch: each window's sum equals the oracle's.
    e = make_eval(m, 64, 3, 0);
    if (e) {
        int32_t w[3 * 65];
        for (int j = 0; j < 3; j++) memcpy(w + j * 65, prompt, 65 * sizeof(int32_t));
        double per[3], sum = 0;
        td_status st = td_eval_nll(e, w, 3, per, &sum, &err);
        CHECK(st == TD_OK, "%s: %s", rm->name, err.msg);
        for (int j = 0; j < 3; j++) CHECK_NEAR(per[j] / 64, rm->sum64 / 64, TOL, "batched copy");
        CHECK_NEAR(sum / 192, rm->sum64 / 64, TOL, "batched copies, mean");
        td_eval_free(e);
    }
    td_model_free(m);
}

// Windows of T = 32 over the 300-token shard (9 windows): B windows per batch with slices that
// cut through windows equal one window at a time; the first window equals the oracle.
static void test_batching(const ref_model *rm, const char *shard) {
    td_model *m = NULL;
    td_err err = {0};
    if (td_model_load(rm->path, &m, &err) != TD_OK) {
        CHECK(0, "%s: %s", rm->path, err.msg);
        return;
    }
    const int T = 32, nw = (300 - 1) / T;  // 9
    int32_t *w = malloc(sizeof(int32_t) * (size_t)nw * (T + 1));
    for (int j = 0; j < nw; j++) memcpy(w + j * (T + 1), prompt + j * T, sizeof(int32_t) * (T + 1));
    double one[9], many[9], s1 = 0, s2 = 0;
    td_eval *e1 = make_eval(m, T, 1, 0), *e4 = make_eval(m, T, 4, 50);
    if (e1 && e4) {
        CHECK(td_eval_nll(e1, w, (size_t)nw, one, &s1, &err) == TD_OK, "%s", err.msg);
        CHECK(td_eval_nll(e4, w, (size_t)nw, many, &s2, &err) == TD_OK, "%s", err.msg);
        double worst = 0;
        for (int j = 0; j < nw; j++) worst = fmax(worst, fabs(one[j] - many[j]) / T);
        CHECK(worst < 1e-5, "%s: batched vs single windows differ by %.3g nats/token", rm->name, worst);
        CHECK_NEAR(one[0] / T, rm->sum32 / T, TOL, "first window vs oracle");
        // Windows at later offsets are real windows, not the prefix (sanity: they differ).
        CHECK(fabs(one[1] - one[0]) > 1e-3, "windows 0 and 1 give the same NLL");
        // The shard path gives the same windows, and --max-tokens cuts whole windows.
        td_eval_result r;
        const char *paths[1] = {shard};
        CHECK(td_eval_shards(e4, paths, 1, 0, &r, &err) == TD_OK, "%s", err.msg);
        CHECK(r.windows == 9 && r.tokens == 288, "%llu windows", (unsigned long long)r.windows);
        CHECK_NEAR(r.nll, s1 / (nw * T), 1e-9, "shards vs windows");
        CHECK(td_eval_shards(e4, paths, 1, 100, &r, &err) == TD_OK, "%s", err.msg);
        CHECK(r.windows == 3, "max_tokens 100 at T 32: %llu windows", (unsigned long long)r.windows);
        CHECK_NEAR(r.nll_sum, one[0] + one[1] + one[2], 1e-6, "max_tokens windows");
        // Two shards: windows never cross files, counts add.
        const char *two[2] = {shard, shard};
        CHECK(td_eval_shards(e4, two, 2, 0, &r, &err) == TD_OK, "%s", err.msg);
        CHECK(r.windows == 18, "two shards: %llu windows", (unsigned long long)r.windows);
        // An id outside the vocabulary is refused before anything runs.
        w[5] = 384;
        CHECK(td_eval_nll(e1, w, 1, NULL, &s1, &err) == TD_ERR_INVALID && strstr(err.msg, "vocabulary"),
              "bad id: %s", err.msg);
    }
    td_eval_free(e1);
    td_eval_free(e4);
    free(w);
    td_model_free(m);
}

// Windows at every offset (not only prefixes) against the PyTorch reference run on the f32
// Hugging Face directories (eval_oracle.py windows): batch 4 in 50-token slices.
static void test_windows_torch(const char *name) {
    char dir[1200], cmd[4096];
    td_path_join(dir, sizeof dir, ref_dir, name);
    snprintf(cmd, sizeof cmd,
             "/usr/bin/python3 tests/reference/eval_oracle.py windows '%s' '%s' len300 32", ref_dir,
             dir);
    int status;
    char *out = run_cmd(cmd, &status);
    cJSON *o = out && status == 0 ? cJSON_Parse(out) : NULL;
    free(out);
    const cJSON *sums = cJSON_GetObjectItem(o, "sums");
    CHECK(cJSON_GetArraySize(sums) == 9, "%s: torch windows (status %d)", cmd, status);
    td_model *m = NULL;
    td_err err = {0};
    if (cJSON_GetArraySize(sums) != 9) {
        cJSON_Delete(o);
        return;
    }
    if (td_model_load(dir, &m, &err) != TD_OK) {
        CHECK(0, "%s: %s", dir, err.msg);
        cJSON_Delete(o);
        return;
    }
    const int T = 32, nw = 9;
    int32_t w[9 * 33];
    for (int j = 0; j < nw; j++) memcpy(w + j * (T + 1), prompt + j * T, sizeof(int32_t) * (T + 1));
    double per[9], sum = 0, worst = 0;
    td_eval *e = make_eval(m, T, 4, 50);
    if (e && td_eval_nll(e, w, nw, per, &sum, &err) == TD_OK) {
        for (int j = 0; j < nw; j++) {
            double want = cJSON_GetNumberValue(cJSON_GetArrayItem(sums, j)) / T;
            CHECK_NEAR(per[j] / T, want, TOL, "window vs torch");
            worst = fmax(worst, fabs(per[j] / T - want));
        }
        printf("%-16s T=32, 9 windows, batch 4: worst |nll - torch| %.2g\n", name, worst);
    } else {
        CHECK(0, "%s: %s", name, err.msg);
    }
    td_eval_free(e);
    td_model_free(m);
    cJSON_Delete(o);
}

static void test_errors(const ref_model *rm, const char *shard) {
    td_model *m = NULL;
    td_err err = {0};
    if (td_model_load(rm->path, &m, &err) != TD_OK) {
        CHECK(0, "%s: %s", rm->path, err.msg);
        return;
    }
    char missing[1200], corrupt[1200], bigvocab[1200], shortsh[1200];
    snprintf(missing, sizeof missing, "%s/missing.tdsh", work);
    snprintf(corrupt, sizeof corrupt, "%s/corrupt.tdsh", work);
    snprintf(bigvocab, sizeof bigvocab, "%s/vocab1000.tdsh", work);
    snprintf(shortsh, sizeof shortsh, "%s/short.tdsh", work);
    CHECK(td_shard_write(bigvocab, 1000, prompt, 300, 1, &err) == TD_OK, "%s", err.msg);
    CHECK(td_shard_write(shortsh, 384, prompt, 20, 1, &err) == TD_OK, "%s", err.msg);
    // A corrupt copy: one payload byte flipped.
    char *buf;
    size_t len;
    if (td_read_file(shard, 0, &buf, &len, &err) == TD_OK) {
        buf[64 + 10] ^= 0x5a;
        FILE *f = fopen(corrupt, "wb");
        fwrite(buf, 1, len, f);
        fclose(f);
        free(buf);
    }
    // seq_len beyond the model's context (512 positions).
    td_eval_params p = td_eval_default_params();
    p.seq_len = 600;
    td_eval *e = NULL;
    CHECK(td_eval_create_for_model(m, &p, &e, &err) == TD_ERR_INVALID && !e &&
              strstr(err.msg, "context"), "seq_len 600: %s", err.msg);
    p.seq_len = 0;
    CHECK(td_eval_create_for_model(m, &p, &e, &err) == TD_ERR_INVALID, "seq_len 0 accepted");

    e = make_eval(m, 32, 2, 0);
    if (e) {
        td_eval_result r;
        const char *a[1] = {missing};
        CHECK(td_eval_shards(e, a, 1, 0, &r, &err) != TD_OK && strstr(err.msg, "missing.tdsh"),
              "missing: %s", err.msg);
        a[0] = corrupt;
        CHECK(td_eval_shards(e, a, 1, 0, &r, &err) == TD_ERR_FORMAT && strstr(err.msg, "corrupt.tdsh"),
              "corrupt: %s", err.msg);
        a[0] = bigvocab;
        CHECK(td_eval_shards(e, a, 1, 0, &r, &err) == TD_ERR_INVALID && strstr(err.msg, "vocabulary"),
              "vocab: %s", err.msg);
        a[0] = shortsh;
        CHECK(td_eval_shards(e, a, 1, 0, &r, &err) == TD_ERR_INVALID && strstr(err.msg, "no window"),
              "short: %s", err.msg);
        // A short shard next to a usable one is fine (it simply holds no window).
        const char *b[2] = {shortsh, shard};
        CHECK(td_eval_shards(e, b, 2, 0, &r, &err) == TD_OK && r.windows == 9, "short + full: %s",
              err.msg);
        td_eval_free(e);
    }
    td_model_free(m);
}

static double json_num(const char *text, const char *key) {
    cJSON *o = cJSON_Parse(text);
    double v = o ? cJSON_GetNumberValue(cJSON_GetObjectItem(o, key)) : NAN;
    cJSON_Delete(o);
    return v;
}

static void test_cli(const char *shard) {
    const char *bin = td_test_bin();
    if (!bin) return;
    char cmd[4096];
    int status;
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "'%s' eval '%s' --data '%s' --seq-len 299 --threads 2 --json", bin,
                 models[i].path, shard);
        char *out = run_cmd(cmd, &status);
        CHECK(status == 0, "%s: exit %d", cmd, status);
        double nll = out ? json_num(out, "nll") : NAN, tokens = out ? json_num(out, "tokens") : NAN;
        CHECK_NEAR(nll, models[i].sum299 / 299, TOL, "CLI nll");
        CHECK(tokens == 299, "CLI tokens %g", tokens);
        free(out);
    }
    // Text output names the numbers.
    snprintf(cmd, sizeof cmd, "'%s' eval '%s' --data '%s' '%s' --seq-len 32 --batch 3", bin,
             models[0].path, shard, shard);
    char *out = run_cmd(cmd, &status);
    CHECK(status == 0 && out && strstr(out, "perplexity") && strstr(out, "tokens/s") &&
              strstr(out, "576"), "text output: %s", out ? out : "");
    free(out);
    // Errors: runtime 1 with a message, usage 2.
    struct {
        const char *args;
        int want;
        const char *msg;
    } bad[] = {
        {"--data %s/missing.tdsh", 1, "missing.tdsh"},
        {"--data %s/corrupt.tdsh", 1, "corrupt.tdsh"},
        {"--data %s/vocab1000.tdsh", 1, "vocabulary"},
        {"--data %s/x.tdsh --seq-len 600", 1, "context"},
        {"--seq-len 32 %s", 2, "--data"},
        {"--data %s/x.tdsh --batch 0", 2, "--batch"},
        {"--data %s/x.tdsh --bogus", 2, "unknown option"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[2400];
        snprintf(args, sizeof args, bad[i].args, work);
        snprintf(cmd, sizeof cmd, "'%s' eval '%s' %s 2>&1", bin, models[0].path, args);
        out = run_cmd(cmd, &status);
        CHECK(status == bad[i].want && out && strstr(out, bad[i].msg), "%s: exit %d: %s", cmd, status,
              out ? out : "");
        free(out);
    }
}

int main(void) {
    // NLL against the dequantized oracle at 1e-4: exact kernels (avx512-int8 rounds activations; test_oracle covers it)
    printf("kernel set %s\n", tk_pin_exact());
    td_path_join(ref_dir, sizeof ref_dir, td_test_data_dir(), "ref");
    td_path_join(work, sizeof work, td_test_data_dir(), "eval-test");
    mkdir(td_test_data_dir(), 0755);
    mkdir(work, 0755);
    if (!load_oracle()) TEST_DONE();
    char shard[1200];
    snprintf(shard, sizeof shard, "%s/len300.tdsh", work);
    td_err err = {0};
    CHECK(td_shard_write(shard, 384, prompt, 300, 1, &err) == TD_OK, "%s", err.msg);
    for (int i = 0; i < 2; i++) {
        test_oracle_window(&models[i], shard);
        test_batching(&models[i], shard);
    }
    test_windows_torch("llama2");
    test_windows_torch("qwen3");
    test_errors(&models[0], shard);
    test_cli(shard);
    TEST_DONE();
}
