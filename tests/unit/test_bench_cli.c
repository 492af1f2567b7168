// `tandem bench pp|tg|batched|ceilings` end to end on the small reference models
// (tests/reference/make_models.py): the JSON it prints, its FLOP/byte/parameter accounting checked
// against counts worked out here from the models' published shapes (not from tandem's loader), and
// usage errors. Speed itself is not judged (benchmarks never fail for being slow).
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run_cmd.h"
#include "test_util.h"

// CHECK_NEAR with a formatted message; prints both values on failure.
#define NEAR(a, b, tol, ...)                                                              \
    do {                                                                                  \
        double a_ = (a), b_ = (b);                                                        \
        CHECK(fabs(a_ - b_) <= (tol), __VA_ARGS__);                                       \
        if (!(fabs(a_ - b_) <= (tol))) fprintf(stderr, "  got %.9g, want %.9g\n", a_, b_); \
    } while (0)

static const char *g_bin;
static char g_ref[1024];

static cJSON *bench_json(const char *args, int *status) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s bench %s --json 2>/dev/null", g_bin, args);
    char *out = td_test_run(cmd, status);
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    free(out);
    return j;
}

static double num(const cJSON *j, const char *k) {
    const cJSON *x = cJSON_GetObjectItem(j, k);
    return cJSON_IsNumber(x) ? x->valuedouble : NAN;
}

// A reference model's shape, as make_models.py's VARIANTS table writes it.
typedef struct {
    const char *file;
    int dim, layers, heads, kv, hd, ffn, vocab, tied, bias;
    double elem_bytes;  // bytes per element of the 2-D tensors (Q8_0: 34/32)
} shape;

static double mat_params(const shape *s) {
    double q = (double)s->heads * s->hd, k = (double)s->kv * s->hd;
    return s->layers * (s->dim * q + 2 * s->dim * k + q * s->dim + 3.0 * s->dim * s->ffn);
}

static double small_params(const shape *s) {  // norms and biases, stored f32
    double per = 2.0 * s->dim + (s->bias ? (double)(s->heads + 2 * s->kv) * s->hd : 0);
    return s->layers * per;
}

static void check_single(const shape *s) {
    char path[1200], args[1400];
    snprintf(path, sizeof path, "%s/%s", g_ref, s->file);
    double head = (double)s->vocab * s->dim;
    double params = mat_params(s) + small_params(s) + head * (s->tied ? 1 : 2) + s->dim;
    double wbytes = mat_params(s) * s->elem_bytes + small_params(s) * 4 + head * s->elem_bytes + s->dim * 4;
    double qdim = (double)s->heads * s->hd;

    int n = 9, st;
    snprintf(args, sizeof args, "pp %d %s -r 2 -t 1 --no-ceil", n, path);
    cJSON *j = bench_json(args, &st);
    CHECK(st == 0 && j, "%s: bench pp exited %d", s->file, st);
    if (j) {
        CHECK(!strcmp(cJSON_GetObjectItem(j, "test")->valuestring, "pp"), "%s: test", s->file);
        CHECK(num(j, "n") == n && num(j, "reps") == 2 && num(j, "threads") == 1, "%s: n/reps/threads", s->file);
        const cJSON *samp = cJSON_GetObjectItem(j, "samples_ts");
        CHECK(cJSON_GetArraySize(samp) == 2, "%s: %d samples", s->file, cJSON_GetArraySize(samp));
        double mean = 0;
        for (int i = 0; i < cJSON_GetArraySize(samp); i++) {
            double v = cJSON_GetArrayItem(samp, i)->valuedouble;
            CHECK(v > 0 && isfinite(v), "%s: sample %g", s->file, v);
            mean += v / 2;
        }
        NEAR(num(j, "avg_ts"), mean, 1e-9 * mean, "%s: avg_ts", s->file);
        CHECK(num(j, "stddev_ts") >= 0, "%s: stddev", s->file);
        NEAR(num(j, "params"), params, 0.5, "%s: params", s->file);
        NEAR(num(j, "weight_bytes"), wbytes, 0.5, "%s: weight bytes", s->file);
        // 2 x matmul params per token + QK and AV over p+1 positions + one output row
        double flops = 2 * mat_params(s) * n + 4 * qdim * s->layers * (n * (n + 1) / 2.0) + 2 * head;
        NEAR(num(j, "flops"), flops, 1e-6 * flops, "%s: flops", s->file);
        CHECK(cJSON_GetObjectItem(j, "frac_ceiling") == NULL, "%s: --no-ceil still gave a fraction", s->file);
        cJSON_Delete(j);
    }

    n = 5;
    snprintf(args, sizeof args, "tg %d %s -r 1 -t 2 --ceil-gbs 10 --ceil-gflops 100", n, path);
    j = bench_json(args, &st);
    CHECK(st == 0 && j, "%s: bench tg exited %d", s->file, st);
    if (j) {
        double kv = 2.0 * s->layers * s->kv * s->hd * 4 * (n * (n + 1) / 2.0);  // f32 K and V read
        double bytes = n * wbytes + kv;
        NEAR(num(j, "bytes"), bytes, 1e-6 * bytes, "%s: tg bytes", s->file);
        double gbs = bytes / num(j, "median_s") / 1e9;
        NEAR(num(j, "gbs"), gbs, 1e-6 * gbs, "%s: gbs", s->file);
        NEAR(num(j, "frac_ceiling"), gbs / 10, 1e-6 * gbs, "%s: fraction of the given ceiling", s->file);
        cJSON_Delete(j);
    }
}

int main(void) {
    g_bin = getenv("TANDEM_BIN");
    CHECK(g_bin && access(g_bin, X_OK) == 0, "TANDEM_BIN=%s is not executable", g_bin ? g_bin : "(unset)");
    snprintf(g_ref, sizeof g_ref, "%s/ref", td_test_data_dir());
    char idx[1100];
    snprintf(idx, sizeof idx, "%s/oracle.json", g_ref);
    CHECK(access(idx, R_OK) == 0, "%s missing: run tests/oracle/gen/models.sh first", idx);
    if (!g_bin || access(g_bin, X_OK) || access(idx, R_OK)) TEST_DONE();

    shape llama2 = {"llama2-f32.gguf", 64, 2, 4, 4, 16, 160, 384, 0, 0, 4.0};
    shape qwen2 = {"qwen2-q8_0.gguf", 64, 3, 4, 2, 16, 192, 384, 1, 1, 34.0 / 32};
    check_single(&llama2);
    check_single(&qwen2);

    // batched: one result per batch size, aggregate t/s = B x per-sequence t/s
    char args[1400];
    snprintf(args, sizeof args, "batched %s/%s --batch 1,3 -n 2 -p 3 -r 1 -t 2 --no-ceil", g_ref, qwen2.file);
    int st;
    cJSON *j = bench_json(args, &st);
    CHECK(st == 0 && j, "bench batched exited %d", st);
    if (j) {
        const cJSON *res = cJSON_GetObjectItem(j, "results");
        CHECK(cJSON_GetArraySize(res) == 2, "batched: %d results", cJSON_GetArraySize(res));
        for (int i = 0; i < cJSON_GetArraySize(res); i++) {
            const cJSON *r = cJSON_GetArrayItem(res, i);
            int b = i == 0 ? 1 : 3;
            CHECK(num(r, "batch") == b, "batched: result %d has batch %g", i, num(r, "batch"));
            CHECK(num(r, "avg_ts") > 0, "batched: avg_ts");
            NEAR(num(r, "per_seq_ts") * b, num(r, "avg_ts"), 1e-9 * num(r, "avg_ts"), "batched: per-seq");
        }
        cJSON_Delete(j);
    }

    // TANDEM_PROFILE=1: the slot calls a forward makes, counted from the model's shape (pp: one
    // warm-up + one timed forward, 7 matmuls per layer over the prompt, the head over 1 token).
    {
        char cmd[2000];
        snprintf(cmd, sizeof cmd, "TANDEM_PROFILE=1 %s bench pp 8 %s/%s -r 1 -t 2 --no-ceil 2>&1 >/dev/null", g_bin, g_ref,
                 qwen2.file);
        char *out = td_test_run(cmd, &st);
        CHECK(st == 0 && out && strstr(out, "tandem profile (cpu backend)"), "TANDEM_PROFILE: no profile printed (%d)", st);
        const struct {
            const char *slot;
            long calls;
        } want[] = {{"matmul (batch)", 2L * qwen2.layers * 7}, {"matmul (1 token)", 2},  {"attention", 2L * qwen2.layers},
                    {"rmsnorm", 2L * (2 * qwen2.layers + 1)},  {"rope", 2L * 2 * qwen2.layers}, {"embed", 2}};
        double pct_sum = 0;
        for (size_t i = 0; out && i < sizeof want / sizeof *want; i++) {
            const char *line = strstr(out, want[i].slot);
            double sec = -1, pct = -1;
            long calls = -1;
            CHECK(line && sscanf(line + strlen(want[i].slot), " %lf s %lf %% %ld calls", &sec, &pct, &calls) == 3,
                  "TANDEM_PROFILE: no line for %s", want[i].slot);
            CHECK(calls == want[i].calls, "TANDEM_PROFILE: %s: %ld calls, want %ld", want[i].slot, calls, want[i].calls);
        }
        for (const char *p = out ? strchr(out, '\n') : NULL; p && p[1]; p = strchr(p + 1, '\n')) {
            const char *pc = strstr(p + 1, " %");
            const char *nl = strchr(p + 1, '\n');
            if (!pc || (nl && pc > nl)) continue;
            const char *b = pc;
            while (b > p + 1 && b[-1] != ' ') b--;
            pct_sum += atof(b);
        }
        NEAR(pct_sum, 100.0, 0.6, "TANDEM_PROFILE: the shares sum to %.2f %%", pct_sum);
        free(out);
    }

    j = bench_json("ceilings -t 1 --ceil-mib 32", &st);
    CHECK(st == 0 && j, "bench ceilings exited %d", st);
    if (j) {
        const cJSON *c = cJSON_GetObjectItem(j, "ceilings");
        CHECK(num(c, "read_gbs") > 0 && num(c, "fma_gflops") > 0, "ceilings: %g GB/s %g GFLOP/s", num(c, "read_gbs"),
              num(c, "fma_gflops"));
        CHECK(num(j, "read_bytes") == 32 << 20, "ceilings: buffer %g", num(j, "read_bytes"));
        cJSON_Delete(j);
    }

    // usage and runtime errors: exit 2 for usage, 1 for a model that does not load
    const char *bad2[] = {"pp", "pp 8", "pp x MODEL", "zz MODEL", "tg 4 MODEL -r 0", "batched MODEL --batch 0"};
    for (size_t i = 0; i < sizeof bad2 / sizeof *bad2; i++) {
        char cmd[2000];
        snprintf(cmd, sizeof cmd, "%s bench %s >/dev/null 2>&1", g_bin, bad2[i]);
        int s2 = system(cmd);
        CHECK(WIFEXITED(s2) && WEXITSTATUS(s2) == 2, "'bench %s' exited %d, want 2", bad2[i], WEXITSTATUS(s2));
    }
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "%s bench pp 4 %s/no-such.gguf >/dev/null 2>&1", g_bin, g_ref);
    int s1 = system(cmd);
    CHECK(WIFEXITED(s1) && WEXITSTATUS(s1) == 1, "missing model exited %d, want 1", WEXITSTATUS(s1));
    TEST_DONE();
}
