// `tandem run --kv-cache-dtype f16|bf16` end to end against the PyTorch oracle (tests/reference/
// make_models.py): the log-probabilities of a 300-token prompt (--echo, prefilled in chunks of 64
// so later chunks read the 16-bit cache) stay within a stated bound of the oracle's for the f32
// reference model of every architecture; f32 and auto keep the exact path; bad values are usage
// errors in run, serve and bench.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/file.h"
#include "run_cmd.h"
#include "test_util.h"

static const char *g_bin, *g_ref;

// Bounds on max |logprob - oracle| over the prompt, per cache type. f32 is the exact path (the
// tolerance test_cli_run holds it to). A 16-bit cache perturbs every key and value by a relative
// u (f16 2^-11, bf16 2^-8, 8x apart); through the layers of these random-weight models that moved
// log-probabilities by at most 3.9e-3 (f16) and 2.6e-2 (bf16) when measured (docs/engine.md,
// worst of 5 models x 299 positions): the bounds are ~2.5x that, and an f16 cache that held bf16
// precision would land outside its bound.
static const struct {
    const char *name;
    double bound;
} dts[] = {{"f32", 1e-4}, {"f16", 1e-2}, {"bf16", 6e-2}};

static const char *ids_str(const cJSON *arr) {
    static char out[8192];
    size_t n = 0;
    const cJSON *x;
    out[0] = 0;
    cJSON_ArrayForEach(x, arr) n += (size_t)snprintf(out + n, sizeof out - n, "%s%d", n ? "," : "", x->valueint);
    return out;
}

// Max |logprob - oracle| over the prompt's positions for one model and cache type; the raw JSON
// text in *raw (malloc'd). -1 on failure.
static double echo_err(const char *path, const cJSON *prompt, const float *rows, int V, const char *dt, char **raw) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "%s run %s/%s --prompt-ids %s -n 1 --temperature 0 --echo --batch 64 --json%s%s 2>/dev/null",
             g_bin, g_ref, path, ids_str(prompt), dt ? " --kv-cache-dtype " : "", dt ? dt : "");
    int st;
    *raw = td_test_run(cmd, &st);
    cJSON *j = *raw ? cJSON_Parse(*raw) : NULL;
    CHECK(st == 0 && j, "%s --kv-cache-dtype %s: exited %d", path, dt ? dt : "(default)", st);
    if (!j) return -1;
    const cJSON *pl = cJSON_GetObjectItem(j, "prompt_logprobs");
    const int n = cJSON_GetArraySize(prompt);
    CHECK(cJSON_GetArraySize(pl) == n - 1, "%s: %d prompt logprobs, want %d", path, cJSON_GetArraySize(pl), n - 1);
    double maxd = 0;
    for (int i = 0; i + 1 < n && i < cJSON_GetArraySize(pl); i++) {
        const int tok = cJSON_GetArrayItem(prompt, i + 1)->valueint;
        const double d = fabs(cJSON_GetObjectItem(cJSON_GetArrayItem(pl, i), "logprob")->valuedouble -
                              rows[(size_t)i * V + tok]);
        if (d > maxd) maxd = d;
    }
    cJSON_Delete(j);
    return maxd;
}

int main(void) {
    g_bin = getenv("TANDEM_BIN");
    if (!g_bin) g_bin = "build/tandem";
    static char ref[1024];
    snprintf(ref, sizeof ref, "%s/ref", td_test_data_dir());
    g_ref = ref;
    char path[1100];
    snprintf(path, sizeof path, "%s/oracle.json", g_ref);
    char *text;
    td_err err;
    if (td_read_file(path, 0, &text, NULL, &err) != TD_OK) {
        fprintf(stderr, "missing oracle (run tests/reference/make_models.py): %s\n", err.msg);
        return 1;
    }
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *models = cJSON_GetObjectItem(o, "models");
    const cJSON *prompt = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "prompts"), "len300");
    CHECK(prompt && cJSON_GetArraySize(prompt) > 64, "oracle has the len300 prompt");
    const cJSON *m;
    int n_models = 0;
    double worst[3] = {0};
    cJSON_ArrayForEach(m, models) {
        // The f32 model directory of each architecture (its name has no format suffix).
        const char *name = cJSON_GetObjectItem(m, "name")->valuestring, *mp = cJSON_GetObjectItem(m, "path")->valuestring;
        const cJSON *lpf = cJSON_GetObjectItem(cJSON_GetObjectItem(m, "logprobs"), "len300");
        if (strcmp(cJSON_GetObjectItem(m, "dtype")->valuestring, "F32") || strchr(name, '-') || !lpf || !prompt) continue;
        snprintf(path, sizeof path, "%s/%s", g_ref, lpf->valuestring);
        char *buf;
        size_t len;
        if (td_read_file(path, 0, &buf, &len, NULL) != TD_OK) {
            CHECK(0, "%s: oracle file %s", name, path);
            continue;
        }
        const float *rows = (const float *)buf;
        const int V = (int)(len / 4 / (size_t)cJSON_GetArraySize(prompt));
        char *raw[4] = {0};
        double e[3];
        for (int d = 0; d < 3; d++) {
            e[d] = echo_err(mp, prompt, rows, V, dts[d].name, &raw[d]);
            CHECK(e[d] >= 0 && e[d] <= dts[d].bound, "%s --kv-cache-dtype %s: max |logprob - oracle| %g > %g", name,
                  dts[d].name, e[d], dts[d].bound);
            if (e[d] > worst[d]) worst[d] = e[d];
        }
        // auto and the default are the f32 path, bit for bit; a 16-bit cache really is used.
        double e_auto = echo_err(mp, prompt, rows, V, "auto", &raw[3]);
        CHECK(raw[0] && raw[3] && !strcmp(raw[0], raw[3]), "%s: auto differs from f32", name);
        char *def = NULL;
        echo_err(mp, prompt, rows, V, NULL, &def);
        CHECK(raw[0] && def && !strcmp(raw[0], def), "%s: the default differs from f32", name);
        CHECK(raw[1] && raw[0] && strcmp(raw[0], raw[1]) && strcmp(raw[1], raw[2]), "%s: f16/bf16 give f32's output",
              name);
        printf("%-8s max |logprob - oracle| over %d prompt tokens: f32 %.2e, f16 %.2e, bf16 %.2e (auto %.2e)\n", name,
               cJSON_GetArraySize(prompt) - 1, e[0], e[1], e[2], e_auto);
        for (int i = 0; i < 4; i++) free(raw[i]);
        free(def), free(buf);
        n_models++;
    }
    CHECK(n_models >= 5, "only %d f32 reference models", n_models);
    printf("worst: f32 %.2e, f16 %.2e, bf16 %.2e\n", worst[0], worst[1], worst[2]);

    // Bad values: a usage error (exit 2) naming the flag, before any model is loaded.
    static const char *const bad[] = {
        "run %s/llama2 --prompt-ids 1 --kv-cache-dtype q8_0",
        "run %s/llama2 --prompt-ids 1 --kv-cache-dtype",
        "run %s/llama2 --prompt-ids 1 --kv-cache-dtype F8",
        "serve %s/llama2 --port 0 --kv-cache-dtype fp16x",
        "bench tg 4 %s/llama2 --no-ceil --kv-cache-dtype int8",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char a2[2048], cmd[8192];
        snprintf(a2, sizeof a2, bad[i], g_ref);
        snprintf(cmd, sizeof cmd, "%s %s 2>&1 >/dev/null", g_bin, a2);
        int st;
        char *errout = td_test_run(cmd, &st);
        CHECK(st == 2, "'%s' exited %d, want 2", a2, st);
        CHECK(errout && strstr(errout, "--kv-cache-dtype"), "'%s' error '%s' lacks the flag", a2, errout ? errout : "");
        free(errout);
    }
    cJSON_Delete(o);
    TEST_DONE();
}
