// The forward pass on in-memory random models: matches a naive double-precision reference for
// every weight dtype and the architecture features (GQA, head_dim != dim/n_heads, q/k/v bias,
// q/k norm, both RoPE styles, llama3/linear scaling, rope_freqs, tied head); several sequences in
// one batch equal each alone; chunked prompts equal whole prompts; invalid batches are rejected.
#include <stdio.h>

#include "model/forward.h"
#include "test_forward_model.h"
#include "kernel_choice.h"
#include "test_util.h"

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

// Runs one prompt as a single sequence (seq 0, from position 0), all logits.
static td_status run_prompt(td_forward *f, const int32_t *toks, int n, float *logits) {
    int32_t pos[64], seq[64];
    for (int i = 0; i < n; i++) pos[i] = i, seq[i] = 0;
    td_forward_seq_clear(f, 0);
    td_batch b = {.n_tokens = n, .tokens = toks, .pos = pos, .seq_id = seq};
    return td_forward_run(f, &b, logits, NULL);
}

static td_forward *make_fwd(const td_model *m, int max_batch, int max_seqs, int max_ctx, int threads) {
    td_forward_params p = td_forward_default_params();
    p.max_batch_tokens = max_batch, p.max_seqs = max_seqs, p.max_ctx = max_ctx, p.n_threads = threads;
    td_forward *f = NULL;
    td_err err = {0};
    td_status st = td_forward_create(m, &p, &f, &err);
    CHECK(st == TD_OK && f, "create: %s", err.msg);
    return f;
}

// Forward vs the naive reference on one prompt; tolerance by dtype of the weights is not needed:
// the reference dequantizes the same weights, so only f32 rounding separates them.
static void check_vs_reference(const char *what, const td_model *m) {
    enum { N = 11 };
    const int V = m->cfg.vocab_size;
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 7 + 3) % V;
    td_forward *f = make_fwd(m, 16, 1, 64, 2);
    if (!f) return;
    float *got = malloc((size_t)N * V * sizeof *got);
    double *want = malloc((size_t)N * V * sizeof *want);
    CHECK(run_prompt(f, toks, N, got) == TD_OK, "%s: run", what);
    fm_reference(m, toks, N, want);
    double d = 0, mag = 0;
    for (size_t i = 0; i < (size_t)N * V; i++) d = fmax(d, fabs(got[i] - want[i])), mag = fmax(mag, fabs(want[i]));
    CHECK(d < 1e-4 * fmax(1.0, mag), "%s: max |logit diff| %g (max |logit| %g)", what, d, mag);
    free(got), free(want);
    td_forward_free(f);
}

static void test_reference_matches(void) {
    const td_dtype all[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0};
    for (int d = 0; d < 5; d++) {
        // GQA 4/2, head_dim 16 while dim/n_heads = 16; dims multiples of 32 for the block types
        td_model_config c = fm_config(50, 64, 2, 4, 2, 16, 96);
        fm_model fm;
        fm_random(&fm, &c, all[d], 11 + d);
        char what[64];
        snprintf(what, sizeof what, "llama %s", td_dtype_name(all[d]));
        check_vs_reference(what, &fm.m);
        fm_free(&fm);
    }
    td_model_config c;
    fm_model fm;
    // Qwen2: q/k/v bias, tied embeddings, GQA 6/2, head_dim 8 with dim 40 (not n_heads*head_dim)
    c = fm_config(37, 40, 2, 6, 2, 8, 72);
    c.arch = TD_ARCH_QWEN2, c.qkv_bias = true, c.tie_embeddings = true, c.rope_theta = 1e6f;
    fm_random(&fm, &c, TD_F32, 5);
    check_vs_reference("qwen2 bias tied", &fm.m);
    fm_free(&fm);
    // Qwen3: q/k norm, head_dim 32 > dim / n_heads
    c = fm_config(41, 48, 2, 4, 1, 32, 80);
    c.arch = TD_ARCH_QWEN3, c.qk_norm = true, c.norm_eps = 1e-6f;
    fm_random(&fm, &c, TD_F32, 6);
    check_vs_reference("qwen3 qk_norm", &fm.m);
    fm_free(&fm);
    // GGUF llama: adjacent-pair RoPE and rope_freqs divisors
    c = fm_config(33, 32, 2, 2, 2, 16, 64);
    c.rope_style = TD_ROPE_NORM;
    fm_random(&fm, &c, TD_F32, 7);
    {
        float ff[8];
        for (int i = 0; i < 8; i++) ff[i] = 1.0f + 0.5f * i;
        fm.m.rope_freqs = fm_vec(&fm, 8, ff, 0, 0);
    }
    check_vs_reference("llama norm-rope rope_freqs", &fm.m);
    fm_free(&fm);
    // Llama 3 scaling (theta 500000, factor 8, low 1, high 4, original 8192 as in Llama 3.1 but
    // with a small original context so the three bands all occur for head_dim 32)
    c = fm_config(29, 64, 1, 2, 1, 32, 64);
    c.rope_theta = 500000.0f, c.rope_scaling = TD_ROPE_SCALING_LLAMA3, c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 4.0f, c.rope_orig_max_pos = 64;
    fm_random(&fm, &c, TD_F32, 8);
    check_vs_reference("llama3 scaling", &fm.m);
    fm_free(&fm);
    // linear scaling
    c = fm_config(29, 32, 1, 2, 2, 16, 32);
    c.rope_scaling = TD_ROPE_SCALING_LINEAR, c.rope_factor = 4.0f;
    fm_random(&fm, &c, TD_F32, 9);
    check_vs_reference("linear scaling", &fm.m);
    fm_free(&fm);
}

// Several sequences interleaved in one batch, prompts in chunks, want_logits subsets, truncation.
static void test_batching(td_dtype dt) {
    td_model_config c = fm_config(45, 64, 2, 4, 2, 16, 96);
    c.qkv_bias = true;
    fm_model fm;
    fm_random(&fm, &c, dt, 21);
    const int V = c.vocab_size;
    enum { LA = 9, LB = 5, LC = 7 };
    int32_t A[LA], B[LB], C[LC];
    for (int i = 0; i < LA; i++) A[i] = (i * 5 + 1) % V;
    for (int i = 0; i < LB; i++) B[i] = (i * 11 + 2) % V;
    for (int i = 0; i < LC; i++) C[i] = (i * 13 + 4) % V;
    float *la = malloc(LA * V * sizeof(float)), *lb = malloc(LB * V * sizeof(float)),
          *lc = malloc(LC * V * sizeof(float)), *got = malloc(32 * V * sizeof(float));
    td_forward *f = make_fwd(&fm.m, 32, 4, 40, 2);
    if (!f) goto done;
    CHECK(run_prompt(f, A, LA, la) == TD_OK, "A");
    CHECK(run_prompt(f, B, LB, lb) == TD_OK, "B");
    CHECK(run_prompt(f, C, LC, lc) == TD_OK, "C");

    // interleave A (seq 3), B (seq 0), C (seq 2) round-robin in one batch
    {
        int32_t tok[32], pos[32], seq[32];
        const float *want[32];
        int n = 0, ia = 0, ib = 0, ic = 0;
        while (ia < LA || ib < LB || ic < LC) {
            if (ia < LA) tok[n] = A[ia], pos[n] = ia, seq[n] = 3, want[n++] = la + (size_t)ia++ * V;
            if (ib < LB) tok[n] = B[ib], pos[n] = ib, seq[n] = 0, want[n++] = lb + (size_t)ib++ * V;
            if (ic < LC) tok[n] = C[ic], pos[n] = ic, seq[n] = 2, want[n++] = lc + (size_t)ic++ * V;
        }
        for (int s = 0; s < 4; s++) td_forward_seq_clear(f, s);
        td_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = seq};
        td_err err = {0};
        CHECK(td_forward_run(f, &b, got, &err) == TD_OK, "mixed batch: %s", err.msg);
        double d = 0;
        for (int t = 0; t < n; t++) d = fmax(d, max_abs_diff(got + (size_t)t * V, want[t], V));
        CHECK(d < 1e-5, "%s: mixed batch vs alone: %g", td_dtype_name(dt), d);
        CHECK(td_forward_seq_len(f, 3) == LA && td_forward_seq_len(f, 0) == LB &&
                  td_forward_seq_len(f, 2) == LC && td_forward_seq_len(f, 1) == 0,
              "seq lens after mixed batch");

        // then one decode step for each sequence in one batch, logits only for two of them
        int32_t t2[3] = {7, 8, 9}, p2[3] = {LB, LA, LC}, s2[3] = {0, 3, 2};
        uint8_t wl[3] = {1, 0, 1};
        td_batch b2 = {.n_tokens = 3, .tokens = t2, .pos = p2, .seq_id = s2, .want_logits = wl};
        CHECK(td_forward_run(f, &b2, got, &err) == TD_OK, "decode step: %s", err.msg);
        // compare with the extended prompts alone
        int32_t Bx[LB + 1], Cx[LC + 1];
        memcpy(Bx, B, sizeof B), Bx[LB] = 7;
        memcpy(Cx, C, sizeof C), Cx[LC] = 9;
        td_forward *g = make_fwd(&fm.m, 32, 1, 40, 1);
        float *ref = malloc(16 * V * sizeof(float));
        if (g) {
            run_prompt(g, Bx, LB + 1, ref);
            CHECK(max_abs_diff(got, ref + (size_t)LB * V, V) < 1e-5, "decode B");
            run_prompt(g, Cx, LC + 1, ref);
            CHECK(max_abs_diff(got + V, ref + (size_t)LC * V, V) < 1e-5, "decode C (row 2 of 2)");
        }
        td_forward_free(g);
        free(ref);
    }

    // chunks 3 + 5 + 1 of A vs A at once, asking only for some logits
    {
        td_forward_seq_clear(f, 1);
        const int cut[4] = {0, 3, 8, 9};
        double d = 0;
        for (int k = 0; k < 3; k++) {
            int n = cut[k + 1] - cut[k];
            int32_t pos[8], seq[8];
            for (int i = 0; i < n; i++) pos[i] = cut[k] + i, seq[i] = 1;
            td_batch b = {.n_tokens = n, .tokens = A + cut[k], .pos = pos, .seq_id = seq};
            CHECK(td_forward_run(f, &b, got, NULL) == TD_OK, "chunk %d", k);
            d = fmax(d, max_abs_diff(got, la + (size_t)cut[k] * V, (size_t)n * V));
        }
        CHECK(d < 1e-5, "%s: chunks 3+5+1 vs whole: %g", td_dtype_name(dt), d);
        CHECK(td_forward_seq_len(f, 1) == LA, "len after chunks");
    }

    // truncation: rewrite seq 1 from position 4 with B's tokens; equals a fresh A[0..4) + B
    {
        int32_t pos[LB], seq[LB];
        for (int i = 0; i < LB; i++) pos[i] = 4 + i, seq[i] = 1;
        uint8_t wl[LB] = {0, 0, 0, 0, 1};
        td_batch b = {.n_tokens = LB, .tokens = B, .pos = pos, .seq_id = seq, .want_logits = wl};
        CHECK(td_forward_run(f, &b, got, NULL) == TD_OK, "overwrite");
        CHECK(td_forward_seq_len(f, 1) == 4 + LB, "len after overwrite: %d", td_forward_seq_len(f, 1));
        int32_t AB[4 + LB];
        memcpy(AB, A, 4 * sizeof *A), memcpy(AB + 4, B, sizeof B);
        float *ref = malloc((4 + LB) * V * sizeof(float));
        td_forward *g = make_fwd(&fm.m, 32, 1, 40, 3);
        if (g) {
            run_prompt(g, AB, 4 + LB, ref);
            CHECK(max_abs_diff(got, ref + (size_t)(3 + LB) * V, V) < 1e-5, "overwrite vs fresh");
        }
        td_forward_free(g);
        free(ref);
    }
    td_forward_free(f);
done:
    free(la), free(lb), free(lc), free(got);
    fm_free(&fm);
}

static void test_invalid(void) {
    td_model_config c = fm_config(20, 32, 1, 2, 1, 16, 32);
    fm_model fm;
    fm_random(&fm, &c, TD_Q8_0, 3);
    td_forward *f = make_fwd(&fm.m, 8, 2, 16, 2);
    if (!f) return;
    float logits[16 * 20];
    int32_t tok[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, pos[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
            seq[10] = {0};
    td_batch ok = {.n_tokens = 3, .tokens = tok, .pos = pos, .seq_id = seq};
    CHECK(td_forward_run(f, &ok, logits, NULL) == TD_OK, "valid batch");
    float before[20];
    memcpy(before, logits + 2 * 20, sizeof before);

    struct {
        const char *what;
        int n, tok0, pos0, seq0, pos1;
    } bad[] = {
        {"token id = vocab", 2, 20, 3, 0, 4},
        {"negative token", 2, -1, 3, 0, 4},
        {"seq_id out of range", 2, 1, 0, 2, 1},
        {"negative seq_id", 2, 1, 0, -1, 1},
        {"pos >= max_ctx", 1, 1, 16, 0, 0},
        {"negative pos", 1, 1, -1, 0, 0},
        {"pos skips ahead of cache", 2, 1, 4, 0, 5},
        {"positions not consecutive", 2, 1, 3, 0, 5},
        {"positions decreasing", 2, 1, 3, 0, 2},
        {"too many tokens", 9, 1, 3, 0, 4},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t t[10], p[10], s[10];
        for (int j = 0; j < 10; j++) t[j] = 1, p[j] = 3 + j, s[j] = 0;
        t[0] = bad[i].tok0, p[0] = bad[i].pos0, s[0] = bad[i].seq0, p[1] = bad[i].pos1;
        td_batch b = {.n_tokens = bad[i].n, .tokens = t, .pos = p, .seq_id = s};
        td_err err = {0};
        td_status st = td_forward_run(f, &b, logits, &err);
        CHECK(st == TD_ERR_INVALID && err.msg[0], "%s: status %d", bad[i].what, st);
    }
    {
        td_batch b = {.n_tokens = 1, .tokens = tok, .pos = pos, .seq_id = NULL};
        CHECK(td_forward_run(f, &b, logits, NULL) == TD_ERR_INVALID, "NULL seq_id");
        td_batch b2 = {.n_tokens = 1, .tokens = tok + 3, .pos = pos + 3, .seq_id = seq};
        CHECK(td_forward_run(f, &b2, NULL, NULL) == TD_ERR_INVALID, "NULL logits");
    }
    CHECK(td_forward_seq_len(f, 0) == 3, "failed batches left the cache alone");
    // the cache still continues correctly: recompute position 2 by overwriting it
    td_batch again = {.n_tokens = 1, .tokens = tok + 2, .pos = pos + 2, .seq_id = seq};
    CHECK(td_forward_run(f, &again, logits, NULL) == TD_OK, "continue after errors");
    CHECK(max_abs_diff(logits, before, 20) == 0, "same logits after rejected batches");
    // an empty batch is fine and needs no logits buffer
    td_batch empty = {.n_tokens = 0};
    CHECK(td_forward_run(f, &empty, NULL, NULL) == TD_OK, "empty batch");
    td_forward_free(f);

    // bad models / params are rejected at create
    td_forward_params p = td_forward_default_params();
    td_forward *g = NULL;
    td_err err = {0};
    p.max_seqs = 0;
    CHECK(td_forward_create(&fm.m, &p, &g, &err) == TD_ERR_INVALID && !g, "max_seqs 0");
    p = td_forward_default_params();
    fm.m.layers[0].wk.ne[0] = 17;
    CHECK(td_forward_create(&fm.m, &p, &g, &err) == TD_ERR_INVALID && !g && strstr(err.msg, "wk"),
          "bad wk shape: %s", err.msg);
    fm.m.layers[0].wk.ne[0] = 16;
    fm.m.out_norm.ndim = 0;
    CHECK(td_forward_create(&fm.m, &p, &g, &err) != TD_OK && !g, "missing output_norm");
    fm_free(&fm);
}

// llama.cpp's GGUF conversion of a Llama checkpoint permutes the rows of each Q/K head from
// HF's halves layout (i, i + hd/2) to adjacent pairs (2i, 2i+1) and stores llama3 scaling as
// rope_freqs divisors. Such a model with TD_ROPE_NORM must give the HF model's logits.
static void test_gguf_layout_equivalence(void) {
    td_model_config c = fm_config(31, 64, 2, 4, 2, 32, 96);
    c.rope_theta = 500000.0f, c.rope_scaling = TD_ROPE_SCALING_LLAMA3, c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f, c.rope_high_freq_factor = 4.0f, c.rope_orig_max_pos = 64;
    fm_model hf, gg;
    fm_random(&hf, &c, TD_F32, 99);
    td_model_config cg = c;
    cg.rope_style = TD_ROPE_NORM, cg.rope_scaling = TD_ROPE_SCALING_NONE;
    fm_random(&gg, &cg, TD_F32, 99);  // same draws; then overwrite Q/K with permuted copies
    const int hd = c.head_dim, half = hd / 2;
    for (int l = 0; l < c.n_layers; l++) {
        const td_tensor *src[2] = {&hf.m.layers[l].wq, &hf.m.layers[l].wk};
        td_tensor *dst[2] = {&gg.m.layers[l].wq, &gg.m.layers[l].wk};
        for (int k = 0; k < 2; k++) {
            const int rows = (int)src[k]->ne[0], cols = (int)src[k]->ne[1];
            const float *a = src[k]->data;
            float *b = (float *)dst[k]->data;
            for (int r = 0; r < rows; r++) {
                int h = r / hd, j = r % hd;  // new row h*hd + 2i + two = old row h*hd + two*half + i
                int old = h * hd + (j % 2) * half + j / 2;
                memcpy(b + (size_t)r * cols, a + (size_t)old * cols, (size_t)cols * sizeof(float));
            }
        }
    }
    // rope_freqs = base inv_freq / llama3 inv_freq (what llama.cpp writes)
    {
        double scaled[256], base[256];
        fm_inv_freq(&hf.m, scaled);
        fm_inv_freq(&gg.m, base);
        float ff[256];
        for (int i = 0; i < half; i++) ff[i] = (float)(base[i] / scaled[i]);
        gg.m.rope_freqs = fm_vec(&gg, half, ff, 0, 0);
    }
    enum { N = 13 };
    int32_t toks[N];
    for (int i = 0; i < N; i++) toks[i] = (i * 3 + 2) % c.vocab_size;
    float *a = malloc((size_t)N * c.vocab_size * sizeof *a), *b = malloc((size_t)N * c.vocab_size * sizeof *b);
    td_forward *fa = make_fwd(&hf.m, N, 1, 32, 2), *fb = make_fwd(&gg.m, N, 1, 32, 2);
    if (fa && fb) {
        CHECK(run_prompt(fa, toks, N, a) == TD_OK && run_prompt(fb, toks, N, b) == TD_OK, "runs");
        double d = max_abs_diff(a, b, (size_t)N * c.vocab_size);
        CHECK(d < 1e-4, "HF layout + llama3 vs GGUF layout + rope_freqs: %g", d);
    }
    td_forward_free(fa), td_forward_free(fb);
    free(a), free(b);
    fm_free(&hf), fm_free(&gg);
}

int main(void) {
    // matches a float64 reference at 1e-4: exact kernels (avx512-int8 rounds activations; test_oracle covers it)
    printf("kernel set %s\n", tk_pin_exact());
    test_gguf_layout_equivalence();
    test_reference_matches();
    test_batching(TD_F32);
    test_batching(TD_Q4_0);
    test_invalid();
    TEST_DONE();
}
