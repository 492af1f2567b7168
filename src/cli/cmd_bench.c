// `tandem bench pp|tg|batched|ceilings`: inference speed in the llama-bench convention on random
// token ids (no tokenizer, no sampling), through td_forward, plus the machine's ceilings.
// Not a test: it never judges a number, it prints them (a table, or one JSON object with --json).
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/log.h"
#include "cli/bench_ceil.h"
#include "base/opts.h"
#include "cli/cli.h"
#include "kernels/kernels.h"
#include "cli/cmd_bench.h"
#include "model/forward.h"
#include "model/model.h"

#define MAX_REPS 100
#define MAX_BATCHES 16

#define BENCH_USAGE                                                                                 \
    "usage: tandem bench pp N MODEL [options]      prompt processing: N tokens in one batch\n"         \
    "       tandem bench tg N MODEL [options]      generation: N tokens one at a time\n"               \
    "       tandem bench batched MODEL [options]   B sequences decoding together\n"                    \
    "       tandem bench ceilings [options]        memory bandwidth, FP32 FMA / int8 / BF16 peaks\n"   \
    "  MODEL                     .gguf file or model directory (also -m MODEL)\n"

static void bench_epilog(FILE *f) {
    fprintf(f,
            "pp/tg: like llama-bench -p N / -n N (tg starts from an empty cache; every generated\n"
            "token's logits are computed, pp computes only the last one's). See docs/bench.md.\n");
    fprintf(f, "backends in this build: %s\n", td_backend_names());
}

typedef struct {
    const char *sub, *model, *backend;
    long n, reps, threads, prompt, ceil_mib;
    double ceil_gbs, ceil_gflops, ceil_int8, ceil_bf16;
    bool json, no_ceil;
    int batches[MAX_BATCHES], n_batches;
    td_dtype kv_dtype;
} bench_opts;

static int parse_batches(const char *v, bench_opts *o) {
    int *ids = NULL;
    long n = td_arg_ids(v, &ids);
    if (n <= 0 || n > MAX_BATCHES) {
        free(ids);
        fprintf(stderr, "tandem bench: --batch expects 1 to %d comma-separated sizes\n", MAX_BATCHES);
        return 0;
    }
    for (long i = 0; i < n; i++) {
        if (ids[i] < 1 || ids[i] > 4096) {
            free(ids);
            fprintf(stderr, "tandem bench: --batch sizes must be in [1, 4096]\n");
            return 0;
        }
        o->batches[i] = ids[i];
    }
    o->n_batches = (int)n;
    free(ids);
    return 1;
}

static bool opt_kv_dtype(void *ctx, const td_opt *opt, const char *v) {
    (void)opt;
    return td_arg_kv_dtype("--kv-cache-dtype", v, &((bench_opts *)ctx)->kv_dtype);
}

// Returns 1 to run, 0 to exit 0 (help), -1 on a usage error.
static int parse_opts(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->reps = 3;
    o->threads = 2;
    o->n = -1;
    o->ceil_mib = 512;
    o->batches[0] = 1, o->batches[1] = 4, o->batches[2] = 16, o->batches[3] = 64;
    o->n_batches = 4;
    if (argc < 2) return fprintf(stderr, "tandem bench: expected pp, tg, batched, ceilings or serve\n"), -1;
    o->sub = argv[1];
    if (!strcmp(o->sub, "--help") || !strcmp(o->sub, "-h")) return fputs(BENCH_USAGE, stdout), bench_epilog(stdout), 0;
    bool positional_n = !strcmp(o->sub, "pp") || !strcmp(o->sub, "tg");
    if (!positional_n && strcmp(o->sub, "batched") && strcmp(o->sub, "ceilings"))
        return fprintf(stderr, "tandem bench: unknown benchmark '%s'\n", o->sub), -1;
    const char *batch = NULL;
    const td_opt opts[] = {
        {TD_OPT_S("model", &o->model, "MODEL", "the model, as the MODEL argument"), .shorts = "m"},
        {TD_OPT_I("reps", &o->reps, 1, MAX_REPS, "R", "timed repetitions (default 3), after one untimed warm-up"), .shorts = "r"},
        {TD_OPT_I("threads", &o->threads, 1, 1024, "T", "worker threads (default 2)"), .shorts = "t"},
        {TD_OPT_S("backend", &o->backend, "NAME",
                  "cpu, or a device backend of this build (listed below); default\n"
                  "$TANDEM_BACKEND, else cpu")},
        {TD_OPT_B("json", &o->json, "print one JSON object")},
        {TD_OPT_S("batch", &batch, "1,4,16,64", "batched: sequences per forward batch (default 1,4,16,64)")},
        {TD_OPT_I("n-gen", &o->n, 1, 1 << 20, "N", "batched: decode steps per sequence (default 32)"), .shorts = "n"},
        {TD_OPT_I("n-prompt", &o->prompt, 0, 1 << 20, "P",
                  "batched: prompt tokens per sequence, prefilled untimed (default 0)"), .shorts = "p"},
        {TD_OPT_B("no-ceil", &o->no_ceil, "skip measuring the ceilings (no fractions reported)")},
        {TD_OPT_F("ceil-gbs", &o->ceil_gbs, 1e-3, 1e6, "X", "use X GB/s as the bandwidth ceiling instead of measuring")},
        {TD_OPT_F("ceil-gflops", &o->ceil_gflops, 1e-3, 1e9, "X", "use X GFLOP/s as the FP32 FMA ceiling instead of measuring")},
        {TD_OPT_F("ceil-int8-giops", &o->ceil_int8, 1e-3, 1e9, "X",
                  "... X GOP/s as the int8 VNNI ceiling (with --ceil-gbs and --ceil-gflops)")},
        {TD_OPT_F("ceil-bf16-gflops", &o->ceil_bf16, 1e-3, 1e9, "X", "... X GFLOP/s as the BF16 dot-product ceiling (likewise)")},
        {TD_OPT_I("ceil-mib", &o->ceil_mib, 16, 1 << 16, "M", "read-bandwidth buffer size in MiB (default 512)")},
        {TD_OPT_CB("kv-cache-dtype", opt_kv_dtype, true, "T", "KV cache element type: auto (= f32), f32, f16 or bf16")},
    };
    char prog[64];
    snprintf(prog, sizeof prog, "tandem bench %s", o->sub);
    const td_opts t = {.prog = prog,
                       .usage = BENCH_USAGE,
                       .opts = opts,
                       .n = (int)(sizeof opts / sizeof opts[0]),
                       .epilog_fn = bench_epilog,
                       .ctx = o,
                       .max_pos = positional_n ? 2 : strcmp(o->sub, "ceilings") ? 1 : 0};
    int n_pos = 0, pr = td_opts_parse(&t, argc - 1, argv + 1, &n_pos);
    if (pr <= 0) return pr;
    if (batch && !parse_batches(batch, o)) return -1;
    int k = 0;
    if (positional_n && k < n_pos && o->n < 0) {
        long n;
        if (!td_arg_int("N", argv[2 + k++], 1, 1 << 20, &n)) return -1;
        o->n = n;
    }
    if (k < n_pos) {
        if (o->model) return fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[2 + k]), -1;
        o->model = argv[2 + k++];
    }
    if (k < n_pos) return fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[2 + k]), -1;
    if (positional_n && o->n < 0) return fprintf(stderr, "tandem bench %s: expected N\n", o->sub), -1;
    if (!strcmp(o->sub, "batched") && o->n < 0) o->n = 32;
    if (strcmp(o->sub, "ceilings") && !o->model)
        return fprintf(stderr, "tandem bench %s: expected a MODEL path\n", o->sub), -1;
    return 1;
}

// ---------------------------------------------------------------- model accounting

typedef struct {
    double params;        // every weight element, embeddings included
    double mat_params;    // elements of the per-layer matrices (the per-token matmuls)
    double weight_bytes;  // bytes a decode step reads: layer matrices + norms + output head
    double head_params;   // vocab x dim of the output head
    const char *dtype;    // stored type of the layer matrices
} model_cost;

static double tbytes(const td_tensor *t) { return td_tensor_present(t) ? (double)t->nbytes : 0.0; }
static double telems(const td_tensor *t) { return td_tensor_present(t) ? (double)td_tensor_nelem(t) : 0.0; }

static model_cost cost_of(const td_model *m) {
    model_cost c = {0};
    const td_model_config *cfg = &m->cfg;
    for (int l = 0; l < cfg->n_layers; l++) {
        const td_layer_weights *w = &m->layers[l];
        const td_tensor *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        const td_tensor *small[] = {&w->attn_norm, &w->ffn_norm, &w->bq, &w->bk, &w->bv, &w->q_norm, &w->k_norm};
        for (size_t i = 0; i < sizeof mats / sizeof *mats; i++) {
            c.mat_params += telems(mats[i]);
            c.weight_bytes += tbytes(mats[i]);
        }
        for (size_t i = 0; i < sizeof small / sizeof *small; i++) {
            c.params += telems(small[i]);
            c.weight_bytes += tbytes(small[i]);
        }
    }
    c.params += c.mat_params + telems(&m->tok_embd) + telems(&m->out_norm);
    if (!cfg->tie_embeddings) c.params += telems(&m->output);
    c.head_params = telems(&m->output);
    c.weight_bytes += tbytes(&m->output) + tbytes(&m->out_norm);
    c.dtype = cfg->n_layers > 0 ? td_dtype_name(m->layers[0].wq.type) : "?";
    return c;
}

// FLOPs of a batch in which token i of a sequence sits at position p0 + i: the matmuls, the
// attention scores and weighted values over p + 1 cached positions, and the output head for the
// tokens that want logits.
static double run_flops(const td_model_config *cfg, const model_cost *c, long p0, long n_tok, long n_logits) {
    double qdim = (double)cfg->n_heads * cfg->head_dim;
    double ctx_sum = (double)n_tok * p0 + (double)n_tok * (n_tok + 1) / 2.0;  // sum of (p + 1)
    return 2.0 * c->mat_params * n_tok + 4.0 * qdim * cfg->n_layers * ctx_sum +
           2.0 * c->head_params * n_logits;
}

// KV cache bytes that attention reads for n_tok single tokens at positions p0 .. p0+n_tok-1
// (keys and values of elem_bytes each, as td_forward caches them).
static double kv_read_bytes(const td_model_config *cfg, size_t elem_bytes, long p0, long n_tok) {
    double row = 2.0 * cfg->n_layers * cfg->n_kv_heads * cfg->head_dim * (double)elem_bytes;
    return row * ((double)n_tok * p0 + (double)n_tok * (n_tok + 1) / 2.0);
}

// ---------------------------------------------------------------- statistics and output

typedef struct {
    double ts[MAX_REPS];  // tokens/s of each repetition
    double sec[MAX_REPS];
    int n;
} samples;

static void stats(const samples *s, double *mean, double *sd) {
    double m = 0, v = 0;
    for (int i = 0; i < s->n; i++) m += s->ts[i];
    m /= s->n;
    for (int i = 0; i < s->n; i++) v += (s->ts[i] - m) * (s->ts[i] - m);
    *mean = m;
    *sd = s->n > 1 ? sqrt(v / (s->n - 1)) : 0.0;  // sample std, as llama-bench
}

static double median_sec(const samples *s) {
    double t[MAX_REPS];
    memcpy(t, s->sec, sizeof(double) * s->n);
    for (int i = 1; i < s->n; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    return s->n % 2 ? t[s->n / 2] : 0.5 * (t[s->n / 2 - 1] + t[s->n / 2]);
}

static cJSON *samples_json(const samples *s) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < s->n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(s->ts[i]));
    return a;
}

static int measure_ceilings(const bench_opts *o, td_bench_ceil *c) {
    memset(c, 0, sizeof *c);
    c->n_threads = (int)o->threads;
    if (o->no_ceil) return 0;
    if (o->ceil_gbs > 0 && o->ceil_gflops > 0) {
        c->read_gbs = o->ceil_gbs;
        c->fma_gflops = o->ceil_gflops;
        c->int8_giops = o->ceil_int8;
        c->bf16_gflops = o->ceil_bf16;
        c->fma_isa = "given";
        return 0;
    }
    if (td_bench_ceilings((int)o->threads, (size_t)o->ceil_mib, c) != 0) {
        fprintf(stderr, "tandem bench: could not measure the ceilings (out of memory?)\n");
        return -1;
    }
    if (o->ceil_gbs > 0) c->read_gbs = o->ceil_gbs;
    if (o->ceil_gflops > 0) c->fma_gflops = o->ceil_gflops;
    if (o->ceil_int8 > 0) c->int8_giops = o->ceil_int8;
    if (o->ceil_bf16 > 0) c->bf16_gflops = o->ceil_bf16;
    return 0;
}

static void add_ceil_json(cJSON *j, const td_bench_ceil *c) {
    if (c->read_gbs <= 0) return;
    cJSON *o = cJSON_AddObjectToObject(j, "ceilings");
    cJSON_AddNumberToObject(o, "threads", c->n_threads);
    cJSON_AddNumberToObject(o, "read_gbs", c->read_gbs);
    cJSON_AddNumberToObject(o, "fma_gflops", c->fma_gflops);
    cJSON_AddStringToObject(o, "fma_isa", c->fma_isa ? c->fma_isa : "?");
    if (c->int8_giops > 0) cJSON_AddNumberToObject(o, "int8_giops", c->int8_giops);
    if (c->bf16_gflops > 0) cJSON_AddNumberToObject(o, "bf16_gflops", c->bf16_gflops);
}

// The compute ceiling a prompt on this model meets: the kernel set's int8 (Q8_0/Q4_0 weights
// against int8 activations) or bf16 dot products (BF16 weights) where it uses them, else FP32
// FMA. Sets *name to the ceiling's JSON key; returns 0 if it was not measured.
static double pp_ceiling(const td_bench_ceil *c, const char *dtype, const char **name) {
    const td_kernels *k = td_kernels_get(NULL);
    const int lowp = k && (!strcmp(k->name, "avx512-int8") || !strcmp(k->name, "amx") || !strcmp(k->name, "amx-emu"));
    static const char *const int8_types[] = {"Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K"};  // int8 activations
    for (size_t i = 0; lowp && c->int8_giops > 0 && i < sizeof int8_types / sizeof *int8_types; i++)
        if (!strcmp(dtype, int8_types[i])) return *name = "int8_giops", c->int8_giops;
    if (lowp && !strcmp(dtype, "BF16") && c->bf16_gflops > 0) return *name = "bf16_gflops", c->bf16_gflops;
    *name = "fma_gflops";
    return c->fma_gflops;
}

static void print_json(cJSON *j) {
    char *s = cJSON_PrintUnformatted(j);
    if (s) printf("%s\n", s);
    free(s);
    cJSON_Delete(j);
}

// ---------------------------------------------------------------- runs

typedef struct {
    td_forward *fwd;
    int32_t *tok, *pos, *seq;
    uint8_t *want;
    float *logits;
    int vocab;
    uint64_t rng;
} bench_run;

static int32_t next_token(bench_run *r) {  // xorshift64*: ids spread over the whole vocabulary
    r->rng ^= r->rng >> 12, r->rng ^= r->rng << 25, r->rng ^= r->rng >> 27;
    return (int32_t)((r->rng * 2685821657736338717ULL >> 33) % (uint64_t)r->vocab);
}

static void run_free(bench_run *r) {
    td_forward_free(r->fwd);
    free(r->tok), free(r->pos), free(r->seq), free(r->want), free(r->logits);
    memset(r, 0, sizeof *r);
}

// Creates a forward for max_tok tokens per batch, max_seqs sequences, max_ctx positions and
// buffers for max_tok tokens with max_logits logit rows.
static int run_init(bench_run *r, const td_model *m, const bench_opts *o, int max_tok, int max_seqs,
                    int max_ctx, int max_logits) {
    memset(r, 0, sizeof *r);
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = max_tok;
    fp.max_seqs = max_seqs;
    fp.max_ctx = max_ctx;
    fp.n_threads = (int)o->threads;
    fp.backend_name = o->backend;
    fp.kv_dtype = o->kv_dtype;
    td_err err;
    if (td_forward_create(m, &fp, &r->fwd, &err) != TD_OK) {
        fprintf(stderr, "tandem bench: %s\n", err.msg);
        return -1;
    }
    r->vocab = m->cfg.vocab_size;
    r->rng = 0x9E3779B97F4A7C15ULL;
    r->tok = malloc(sizeof(int32_t) * max_tok);
    r->pos = malloc(sizeof(int32_t) * max_tok);
    r->seq = malloc(sizeof(int32_t) * max_tok);
    r->want = malloc((size_t)max_tok);
    r->logits = malloc(sizeof(float) * (size_t)max_logits * (size_t)r->vocab);
    if (!r->tok || !r->pos || !r->seq || !r->want || !r->logits) {
        fprintf(stderr, "tandem bench: out of memory\n");
        run_free(r);
        return -1;
    }
    return 0;
}

static int forward(bench_run *r, int n_tok) {
    td_batch b = {.n_tokens = n_tok, .tokens = r->tok, .pos = r->pos, .seq_id = r->seq, .want_logits = r->want};
    td_err err;
    if (td_forward_run(r->fwd, &b, r->logits, &err) != TD_OK) {
        fprintf(stderr, "tandem bench: forward failed: %s\n", err.msg);
        return -1;
    }
    return 0;
}

// One prompt of n tokens at positions 0..n-1 in one batch; logits of the last token only (what
// llama-bench's pp test asks for).
static int pp_once(bench_run *r, int n) {
    td_forward_seq_clear(r->fwd, 0);
    for (int i = 0; i < n; i++) {
        r->tok[i] = next_token(r), r->pos[i] = i, r->seq[i] = 0, r->want[i] = i == n - 1;
    }
    return forward(r, n);
}

// n single-token steps from an empty cache, logits every step (llama-bench's tg test).
static int tg_once(bench_run *r, int n) {
    td_forward_seq_clear(r->fwd, 0);
    for (int i = 0; i < n; i++) {
        r->tok[0] = next_token(r), r->pos[0] = i, r->seq[0] = 0, r->want[0] = 1;
        if (forward(r, 1)) return -1;
    }
    return 0;
}

static int bench_single(const bench_opts *o, const td_model *m, const td_bench_ceil *ceil) {
    const td_model_config *cfg = &m->cfg;
    bool pp = !strcmp(o->sub, "pp");
    int n = (int)o->n;
    if (n > cfg->max_pos && cfg->max_pos > 0) {
        fprintf(stderr, "tandem bench: N=%d exceeds the model's context (%d)\n", n, cfg->max_pos);
        return 2;
    }
    model_cost c = cost_of(m);
    bench_run r;
    if (run_init(&r, m, o, pp ? n : 1, 1, n, 1)) return 1;
    // Warm-up (untimed): pages the weights in and wakes the workers; a short run suffices.
    int warm = n < 16 ? n : 16;
    if (pp ? pp_once(&r, warm) : tg_once(&r, warm < 4 ? warm : 4)) return run_free(&r), 1;
    samples s = {.n = (int)o->reps};
    for (int i = 0; i < s.n; i++) {
        double t0 = td_now();
        if (pp ? pp_once(&r, n) : tg_once(&r, n)) return run_free(&r), 1;
        s.sec[i] = td_now() - t0;
        s.ts[i] = n / s.sec[i];
    }
    run_free(&r);

    double mean, sd;
    stats(&s, &mean, &sd);
    double flops = pp ? run_flops(cfg, &c, 0, n, 1) : run_flops(cfg, &c, 0, n, n);
    const size_t kv_elem = td_kv_elem_bytes(o->kv_dtype);
    double bytes = (double)n * c.weight_bytes + kv_read_bytes(cfg, kv_elem, 0, n);  // tg: read per run
    double med = median_sec(&s);
    double gflops = flops / med / 1e9, gbs = bytes / med / 1e9;
    const char *pp_ceil_name;
    const double pp_ceil = pp_ceiling(ceil, c.dtype, &pp_ceil_name);
    double frac = pp ? (pp_ceil > 0 ? gflops / pp_ceil : -1) : (ceil->read_gbs > 0 ? gbs / ceil->read_gbs : -1);
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "test", o->sub);
        cJSON_AddNumberToObject(j, "n", n);
        cJSON_AddStringToObject(j, "model", o->model);
        cJSON_AddStringToObject(j, "arch", td_arch_name(cfg->arch));
        cJSON_AddStringToObject(j, "type", c.dtype);
        cJSON_AddStringToObject(j, "kv_dtype", td_dtype_name(o->kv_dtype));
        cJSON_AddNumberToObject(j, "params", c.params);
        cJSON_AddNumberToObject(j, "weight_bytes", c.weight_bytes);
        cJSON_AddNumberToObject(j, "threads", (double)o->threads);
        cJSON_AddNumberToObject(j, "reps", s.n);
        cJSON_AddItemToObject(j, "samples_ts", samples_json(&s));
        cJSON_AddNumberToObject(j, "avg_ts", mean);
        cJSON_AddNumberToObject(j, "stddev_ts", sd);
        cJSON_AddNumberToObject(j, "median_s", med);
        cJSON_AddNumberToObject(j, "flops", flops);
        cJSON_AddNumberToObject(j, "gflops", gflops);
        cJSON_AddNumberToObject(j, "bytes", bytes);
        cJSON_AddNumberToObject(j, "gbs", gbs);
        if (frac >= 0) cJSON_AddNumberToObject(j, "frac_ceiling", frac);
        cJSON_AddStringToObject(j, "ceiling", pp ? pp_ceil_name : "read_gbs");
        add_ceil_json(j, ceil);
        print_json(j);
    } else {
        printf("| model | type | params | threads | test | t/s | %s | of ceiling |\n", pp ? "GFLOP/s" : "GB/s");
        printf("|---|---|---:|---:|---|---:|---:|---:|\n");
        printf("| %s | %s | %.1fM | %ld | %s%d | %.2f ± %.2f | %.2f | ", o->model, c.dtype, c.params / 1e6,
               o->threads, o->sub, n, mean, sd, pp ? gflops : gbs);
        if (frac >= 0)
            printf("%.1f%% of %.1f %s |\n", 100 * frac, pp ? pp_ceil : ceil->read_gbs,
                   !pp ? "GB/s" : !strcmp(pp_ceil_name, "int8_giops") ? "GOP/s int8" : !strcmp(pp_ceil_name, "bf16_gflops") ? "GFLOP/s bf16" : "GFLOP/s");
        else
            printf("- |\n");
    }
    return 0;
}

// B sequences each prefilled with P tokens (untimed), then N steps of one batch holding one new
// token per sequence; aggregate tokens/s = B * N / time.
static int bench_batched(const bench_opts *o, const td_model *m, const td_bench_ceil *ceil) {
    const td_model_config *cfg = &m->cfg;
    model_cost c = cost_of(m);
    int n = (int)o->n, p = (int)o->prompt;
    if (cfg->max_pos > 0 && n + p > cfg->max_pos) {
        fprintf(stderr, "tandem bench: -p + -n exceeds the model's context (%d)\n", cfg->max_pos);
        return 2;
    }
    cJSON *arr = o->json ? cJSON_CreateArray() : NULL;
    if (!o->json) {
        printf("| model | type | threads | B | prompt | steps | aggregate t/s | per-seq t/s | GB/s | of ceiling |\n");
        printf("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    }
    for (int bi = 0; bi < o->n_batches; bi++) {
        int B = o->batches[bi];
        int max_tok = B > p ? B : p;
        bench_run r;
        if (run_init(&r, m, o, max_tok, B, p + n, B)) return cJSON_Delete(arr), 1;
        samples s = {.n = (int)o->reps};
        for (int rep = -1; rep < s.n; rep++) {  // rep -1: warm-up with 2 steps
            for (int q = 0; q < B; q++) {
                td_forward_seq_clear(r.fwd, q);
                if (p == 0) continue;
                for (int i = 0; i < p; i++)
                    r.tok[i] = next_token(&r), r.pos[i] = i, r.seq[i] = q, r.want[i] = i == p - 1;
                if (forward(&r, p)) return run_free(&r), cJSON_Delete(arr), 1;
            }
            int steps = rep < 0 ? (n < 2 ? n : 2) : n;
            double t0 = td_now();
            for (int st = 0; st < steps; st++) {
                for (int q = 0; q < B; q++)
                    r.tok[q] = next_token(&r), r.pos[q] = p + st, r.seq[q] = q, r.want[q] = 1;
                if (forward(&r, B)) return run_free(&r), cJSON_Delete(arr), 1;
            }
            if (rep >= 0) {
                s.sec[rep] = td_now() - t0;
                s.ts[rep] = (double)B * n / s.sec[rep];
            }
        }
        run_free(&r);
        double mean, sd;
        stats(&s, &mean, &sd);
        double med = median_sec(&s);
        double bytes = (double)n * c.weight_bytes + B * kv_read_bytes(cfg, td_kv_elem_bytes(o->kv_dtype), p, n);
        double gbs = bytes / med / 1e9;
        double frac = ceil->read_gbs > 0 ? gbs / ceil->read_gbs : -1;
        if (o->json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddNumberToObject(j, "batch", B);
            cJSON_AddItemToObject(j, "samples_ts", samples_json(&s));
            cJSON_AddNumberToObject(j, "avg_ts", mean);
            cJSON_AddNumberToObject(j, "stddev_ts", sd);
            cJSON_AddNumberToObject(j, "per_seq_ts", mean / B);
            cJSON_AddNumberToObject(j, "median_s", med);
            cJSON_AddNumberToObject(j, "gbs", gbs);
            if (frac >= 0) cJSON_AddNumberToObject(j, "frac_ceiling", frac);
            cJSON_AddItemToArray(arr, j);
        } else {
            printf("| %s | %s | %ld | %d | %d | %d | %.2f ± %.2f | %.2f | %.2f | ", o->model, c.dtype, o->threads, B, p,
                   n, mean, sd, mean / B, gbs);
            if (frac >= 0)
                printf("%.1f%% |\n", 100 * frac);
            else
                printf("- |\n");
            fflush(stdout);
        }
    }
    if (o->json) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "test", "batched");
        cJSON_AddStringToObject(j, "model", o->model);
        cJSON_AddStringToObject(j, "type", c.dtype);
        cJSON_AddStringToObject(j, "kv_dtype", td_dtype_name(o->kv_dtype));
        cJSON_AddNumberToObject(j, "params", c.params);
        cJSON_AddNumberToObject(j, "weight_bytes", c.weight_bytes);
        cJSON_AddNumberToObject(j, "threads", (double)o->threads);
        cJSON_AddNumberToObject(j, "prompt", p);
        cJSON_AddNumberToObject(j, "steps", n);
        cJSON_AddNumberToObject(j, "reps", (double)o->reps);
        cJSON_AddItemToObject(j, "results", arr);
        add_ceil_json(j, ceil);
        print_json(j);
    }
    return 0;
}

int td_cmd_bench(int argc, char **argv) {
    bench_opts o;
    int pr = parse_opts(argc, argv, &o);
    if (pr <= 0) {
        if (pr < 0) fprintf(stderr, "`tandem bench --help` lists the options\n");
        return pr < 0 ? 2 : 0;
    }
    td_bench_ceil ceil;
    if (measure_ceilings(&o, &ceil)) return 1;
    if (!strcmp(o.sub, "ceilings")) {
        if (o.json) {
            cJSON *j = cJSON_CreateObject();
            cJSON_AddStringToObject(j, "test", "ceilings");
            add_ceil_json(j, &ceil);
            cJSON_AddNumberToObject(j, "read_bytes", (double)ceil.read_bytes);
            print_json(j);
        } else {
            printf("threads %d: read bandwidth %.2f GB/s (%zu MiB buffer), FP32 FMA %.1f GFLOP/s (%s)",
                   ceil.n_threads, ceil.read_gbs, ceil.read_bytes >> 20, ceil.fma_gflops,
                   ceil.fma_isa ? ceil.fma_isa : "?");
            if (ceil.int8_giops > 0) printf(", int8 VNNI %.1f GOP/s", ceil.int8_giops);
            if (ceil.bf16_gflops > 0) printf(", BF16 dot %.1f GFLOP/s", ceil.bf16_gflops);
            printf("\n");
        }
        return 0;
    }
    td_model *m = NULL;
    td_err err;
    if (td_model_load(o.model, &m, &err) != TD_OK) {
        fprintf(stderr, "tandem bench: %s\n", err.msg);
        return 1;
    }
    int rc = !strcmp(o.sub, "batched") ? bench_batched(&o, m, &ceil) : bench_single(&o, m, &ceil);
    td_model_free(m);
    return rc;
}
