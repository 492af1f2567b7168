// Q4_K / Q6_K (GGUF k-quants) and Q5_0 (their fallback): the block layout checked against an independent numpy decoder
// (tests/reference/gguf_writer.py, written from the format description) bit for bit, the
// quantizers' error on Gaussian data against Q4_0 / Q8_0, edge cases, the Q4_K_M recipe of
// `tandem quantize` on the llamak / qwen3k reference files, and malformed k-quant tensors.
// Kernels are tested in test_kernels_simd.c, whole models against PyTorch in test_oracle.c.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "run_cmd.h"
#include "tensor/dtype.h"
#include "test_util.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next_u64(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float gauss(void) {  // Box-Muller
    const double u = ((next_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    const double v = ((next_u64() >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}

// Relative RMS error of quantize -> dequantize of x[n] in type t.
static double rel_rms(td_dtype t, const float *x, int64_t n) {
    void *q = malloc(td_row_bytes(t, n));
    float *y = malloc((size_t)n * sizeof *y);
    td_from_f32(t, x, q, n);
    td_to_f32(t, q, y, n);
    double se = 0, sx = 0;
    for (int64_t i = 0; i < n; i++) se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]), sx += (double)x[i] * x[i];
    free(q), free(y);
    return sqrt(se / sx);
}

static void test_sizes(void) {
    CHECK(td_dtype_block(TD_Q4_K) == 256 && td_dtype_block(TD_Q6_K) == 256, "block sizes");
    CHECK(td_dtype_block_bytes(TD_Q4_K) == 144 && td_dtype_block_bytes(TD_Q6_K) == 210, "block bytes");
    CHECK(td_row_bytes(TD_Q4_K, 512) == 288 && td_row_bytes(TD_Q6_K, 768) == 630, "row bytes");
    CHECK(td_row_bytes(TD_Q4_K, 100) == 0 && td_row_bytes(TD_Q6_K, 288) == 0, "rows not a multiple of 256");
    CHECK(!strcmp(td_dtype_name(TD_Q4_K), "Q4_K") && !strcmp(td_dtype_name(TD_Q6_K), "Q6_K"), "names");
    CHECK(!strcmp(td_ggml_type_name(TD_GGML_Q4_K), "Q4_K") && !strcmp(td_ggml_type_name(TD_GGML_Q6_K), "Q6_K"),
          "ggml names");
}

// Gaussian rows: the k-quants beat the same-size legacy types and order as their bits.
static void test_error(void) {
    const int64_t n = 256 * 256;
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = gauss();
    const double e40 = rel_rms(TD_Q4_0, x, n), e4k = rel_rms(TD_Q4_K, x, n), e6k = rel_rms(TD_Q6_K, x, n),
                 e80 = rel_rms(TD_Q8_0, x, n);
    printf("relative RMS error on N(0,1) rows: Q4_0 %.4f  Q4_K %.4f  Q6_K %.4f  Q8_0 %.4f\n", e40, e4k, e6k, e80);
    CHECK(e4k < 0.9 * e40, "Q4_K %.4f not clearly better than Q4_0 %.4f", e4k, e40);
    CHECK(e4k < 0.11, "Q4_K error %.4f", e4k);  // 4 bits + scales: ~2^-4 of the range
    CHECK(e6k < e4k / 3 && e6k < 0.03, "Q6_K error %.4f (Q4_K %.4f)", e6k, e4k);
    CHECK(e80 < e6k, "Q8_0 %.4f vs Q6_K %.4f", e80, e6k);
    // Shifted data (all positive): Q4_K's mins carry the offset, Q6_K's symmetric scale cannot.
    for (int64_t i = 0; i < n; i++) x[i] = 3.0f + 0.5f * gauss();
    const double s4k = rel_rms(TD_Q4_K, x, n), s40 = rel_rms(TD_Q4_0, x, n);
    printf("relative RMS error on N(3,0.5) rows: Q4_0 %.4f  Q4_K %.4f\n", s40, s4k);
    CHECK(s4k < s40 / 2, "Q4_K with mins %.4f vs Q4_0 %.4f", s4k, s40);
    free(x);
}

// Constant, zero and one-outlier super-blocks decode sanely (no NaN, zeros stay zero).
static void test_edges(void) {
    float x[512], y[512];
    uint8_t q[2 * 210];
    const td_dtype ts[] = {TD_Q4_K, TD_Q6_K};
    for (int k = 0; k < 2; k++) {
        memset(x, 0, sizeof x);
        td_from_f32(ts[k], x, q, 512);
        td_to_f32(ts[k], q, y, 512);
        int ok = 1;
        for (int i = 0; i < 512; i++) ok &= y[i] == 0.0f;
        CHECK(ok, "%s: zeros", td_dtype_name(ts[k]));
        for (int i = 0; i < 512; i++) x[i] = i < 256 ? 1.5f : -0.25f;
        td_from_f32(ts[k], x, q, 512);
        td_to_f32(ts[k], q, y, 512);
        double worst = 0;
        for (int i = 0; i < 512; i++) worst = fmax(worst, fabs(y[i] - x[i]) / fabs(x[i]));
        CHECK(worst < 0.02, "%s: constant blocks off by %.3g", td_dtype_name(ts[k]), worst);
        for (int i = 0; i < 512; i++) x[i] = 0.01f * gauss();
        x[77] = 50.0f, x[300] = -80.0f;
        td_from_f32(ts[k], x, q, 512);
        td_to_f32(ts[k], q, y, 512);
        ok = 1;
        for (int i = 0; i < 512; i++) ok &= isfinite(y[i]);
        CHECK(ok && fabsf(y[77] - 50.0f) < 2.0f && fabsf(y[300] + 80.0f) < 2.0f, "%s: outliers %g %g",
              td_dtype_name(ts[k]), y[77], y[300]);
    }
}

static int write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    const int ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

// C quantizes (Gaussian rows, and blocks of random bytes for every bit pattern of scales and
// quants); numpy decodes from the format description; both decodes must agree bit for bit.
static void test_python_layout(const char *dir) {
    const td_dtype ts[] = {TD_Q4_K, TD_Q6_K, TD_Q5_0};
    const char *names[] = {"q4_k", "q6_k", "q5_0"};
    const int nb = 64;  // blocks of 256: half quantized, half random bytes
    for (int k = 0; k < 3; k++) {
        const size_t bb = td_dtype_block_bytes(ts[k]) * (ts[k] == TD_Q5_0 ? 8 : 1);  // 256 elements
        uint8_t *q = malloc(bb * nb);
        float *x = malloc(sizeof(float) * 256 * nb), *y = malloc(sizeof(float) * 256 * nb);
        for (int i = 0; i < 256 * nb / 2; i++) x[i] = gauss() * (1.0f + (float)(i / 256));
        td_from_f32(ts[k], x, q, 256 * nb / 2);
        for (size_t i = bb * nb / 2; i < bb * nb; i++) q[i] = (uint8_t)next_u64();
        for (int b = nb / 2; b < nb; b++) {  // finite f16 scales (exponent < 31) keep the comparison exact
            if (ts[k] == TD_Q5_0) {
                for (int s = 0; s < 8; s++) ((td_block_q5_0 *)q)[8 * b + s].d &= 0xbfff;
                continue;
            }
            uint16_t *d = ts[k] == TD_Q4_K ? &((td_block_q4_k *)q)[b].d : &((td_block_q6_k *)q)[b].d;
            d[0] = (uint16_t)(d[0] & 0xbfff);
            if (ts[k] == TD_Q4_K) d[1] = (uint16_t)(d[1] & 0xbfff);
        }
        td_to_f32(ts[k], q, y, 256 * nb);
        char in[1024], out[1024], cmd[4096];
        snprintf(in, sizeof in, "%s/%s.bin", dir, names[k]);
        snprintf(out, sizeof out, "%s/%s.f32", dir, names[k]);
        CHECK(write_file(in, q, bb * nb), "write %s", in);
        remove(out);
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/gguf_writer.py dequant %s %s %s", names[k], in, out);
        int st;
        char *o = td_test_run(cmd, &st);
        free(o);
        CHECK(st == 0, "%s: exit %d", cmd, st);
        char *py = NULL;
        size_t len = 0;
        td_err err;
        if (td_read_file(out, 0, &py, &len, &err) == TD_OK) {
            CHECK(len == sizeof(float) * 256 * nb, "%s: %zu bytes", out, len);
            int first = -1;
            for (int i = 0; len == sizeof(float) * 256 * nb && i < 256 * nb && first < 0; i++)
                if (memcmp(py + 4 * (size_t)i, &y[i], 4)) first = i;
            float pv = 0;
            if (first >= 0) memcpy(&pv, py + 4 * (size_t)first, 4);
            CHECK(first < 0, "%s: C and numpy decode differ first at element %d (block %d): %g vs %g", names[k], first,
                  first / 256, first >= 0 ? y[first] : 0.0f, pv);
            free(py);
        } else {
            CHECK(0, "%s", err.msg);
        }
        free(q), free(x), free(y);
    }
}

// `tandem quantize` with q4_k_m on the k-quant reference models (F32): llama.cpp's recipe.
static int check_types(const char *path, const char *const *names, const uint32_t *want, int n) {
    td_gguf *g = NULL;
    td_err err;
    if (td_gguf_open(path, &g, &err) != TD_OK) {
        CHECK(0, "%s", err.msg);
        return 0;
    }
    int ok = 1;
    for (int i = 0; i < n; i++) {
        uint32_t got = UINT32_MAX;
        for (int64_t j = 0; j < td_gguf_n_tensors(g); j++) {
            td_gguf_str s = td_gguf_tensor_name(g, j);
            if (s.len == strlen(names[i]) && !memcmp(s.ptr, names[i], s.len)) got = td_gguf_tensor_ggml_type(g, j);
        }
        CHECK(got == want[i], "%s: %s is %s, want %s", path, names[i], td_ggml_type_name(got), td_ggml_type_name(want[i]));
        ok &= got == want[i];
        td_tensor t;
        CHECK(td_gguf_get_tensor(g, names[i], &t, &err) == TD_OK, "%s", err.msg);
    }
    int64_t v = -1;
    CHECK(td_gguf_get_i64(g, "general.file_type", &v, &err) == TD_OK && v == 15, "file_type %lld", (long long)v);
    td_gguf_close(g);
    return ok;
}

static void test_quantize_cli(const char *dir) {
    const char *bin = td_test_bin();
    char ref[512], src[1024], dst[1024], cmd[4096];
    td_path_join(ref, sizeof ref, td_test_data_dir(), "ref");
    if (!bin) return;
    snprintf(src, sizeof src, "%s/llamak-f32.gguf", ref);
    if (!td_file_exists(src)) {
        CHECK(0, "%s missing: run /usr/bin/python3 tests/reference/make_models.py", src);
        return;
    }
    // llamak: 2 layers (use_more_bits: layer 1), dim 256, ffn 544 (ffn_down falls back), output.weight.
    snprintf(dst, sizeof dst, "%s/llamak-q4_k_m.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s q4_k_m 2>&1", bin, src, dst);
    int st;
    char *o = td_test_run(cmd, &st);
    CHECK(st == 0, "%s: %s", cmd, o ? o : "");
    free(o);
    {
        const char *n[] = {"token_embd.weight", "output.weight", "blk.0.attn_v.weight", "blk.1.attn_v.weight",
                           "blk.0.attn_q.weight", "blk.1.ffn_up.weight", "blk.0.ffn_down.weight",
                           "blk.1.ffn_down.weight", "blk.0.attn_norm.weight"};
        const uint32_t w[] = {TD_GGML_Q4_K, TD_GGML_Q6_K, TD_GGML_Q4_K, TD_GGML_Q6_K, TD_GGML_Q4_K,
                              TD_GGML_Q4_K, TD_GGML_Q5_0, TD_GGML_Q8_0, TD_GGML_F32};
        check_types(dst, n, w, 9);
    }
    // qwen3k: tied head (token_embd Q6_K), 3 layers (layer 2 more bits), ffn 768.
    snprintf(src, sizeof src, "%s/qwen3k-f32.gguf", ref);
    snprintf(dst, sizeof dst, "%s/qwen3k-q4_k_m.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s Q4_K_M 2>&1", bin, src, dst);
    o = td_test_run(cmd, &st);
    CHECK(st == 0, "%s: %s", cmd, o ? o : "");
    free(o);
    {
        const char *n[] = {"token_embd.weight", "blk.1.attn_v.weight", "blk.2.attn_v.weight", "blk.2.ffn_down.weight",
                           "blk.0.ffn_down.weight", "blk.2.ffn_gate.weight", "blk.0.attn_q_norm.weight"};
        const uint32_t w[] = {TD_GGML_Q6_K, TD_GGML_Q4_K, TD_GGML_Q6_K, TD_GGML_Q6_K, TD_GGML_Q4_K, TD_GGML_Q4_K,
                              TD_GGML_F32};
        check_types(dst, n, w, 7);
    }
    // The quantized file runs (tandem run through the CLI path), and plain q6_k / q4_k files load.
    snprintf(cmd, sizeof cmd, "%s run %s --prompt 'Once upon' -n 4 --temperature 0 --threads 2 >/dev/null 2>&1", bin, dst);
    o = td_test_run(cmd, &st);
    CHECK(st == 0, "%s: exit %d", cmd, st);
    free(o);
    const char *plain[] = {"q4_k", "q6_k"};
    for (int k = 0; k < 2; k++) {
        snprintf(dst, sizeof dst, "%s/qwen3k-%s.gguf", dir, plain[k]);
        snprintf(cmd, sizeof cmd, "%s quantize %s %s %s 2>&1", bin, src, dst, plain[k]);
        o = td_test_run(cmd, &st);
        CHECK(st == 0, "%s: %s", cmd, o ? o : "");
        free(o);
        td_gguf *g = NULL;
        td_err err;
        td_tensor t;
        CHECK(td_gguf_open(dst, &g, &err) == TD_OK, "%s", err.msg);
        if (g) {
            CHECK(td_gguf_get_tensor(g, "blk.0.ffn_down.weight", &t, &err) == TD_OK &&
                      t.type == (k ? TD_Q6_K : TD_Q4_K) && t.nbytes == td_row_bytes(t.type, 768) * 256,
                  "%s ffn_down: %s", plain[k], td_dtype_name(t.type));
            td_gguf_close(g);
        }
    }
    snprintf(cmd, sizeof cmd, "%s quantize %s %s/x.gguf q5_k 2>&1", bin, src, dir);
    o = td_test_run(cmd, &st);
    CHECK(st == 2 && o && strstr(o, "q4_k_m"), "unknown type refused listing the known ones: %s", o ? o : "");
    free(o);
}

// A GGUF of one Q4_K tensor "blk.0.kq" [2, 256], then broken: inner dimension 100 (not a multiple
// of 256) and a truncated data section; both refused naming the tensor.
static void test_bad_files(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/kq_ok.gguf", dir);
    td_gguf_writer *w = td_gguf_w_new();
    td_err err;
    const int64_t ne[2] = {2, 256};
    float x[512];
    uint8_t q[288];
    for (int i = 0; i < 512; i++) x[i] = gauss();
    td_from_f32(TD_Q4_K, x, q, 512);
    CHECK(td_gguf_w_tensor(w, "blk.0.kq", TD_GGML_Q4_K, 2, ne, &err) == TD_OK, "%s", err.msg);
    const int64_t bad_ne[2] = {2, 100};
    CHECK(td_gguf_w_tensor(w, "blk.0.bad", TD_GGML_Q6_K, 2, bad_ne, &err) == TD_ERR_INVALID &&
              strstr(err.msg, "blk.0.bad") && strstr(err.msg, "256"),
          "writer refuses a Q6_K row of 100: %s", err.msg);
    CHECK(td_gguf_w_begin(w, path, &err) == TD_OK && td_gguf_w_data(w, q, sizeof q, &err) == TD_OK &&
              td_gguf_w_finish(w, &err) == TD_OK,
          "%s", err.msg);
    td_gguf_w_free(w);
    char *buf = NULL;
    size_t len = 0;
    if (td_read_file(path, 0, &buf, &len, &err) != TD_OK) {
        CHECK(0, "%s", err.msg);
        return;
    }
    td_gguf *g = NULL;
    td_tensor t;
    CHECK(td_gguf_open_mem((const uint8_t *)buf, len, "kq_ok", &g, &err) == TD_OK, "%s", err.msg);
    if (g) {
        CHECK(td_gguf_get_tensor(g, "blk.0.kq", &t, &err) == TD_OK && t.type == TD_Q4_K && t.nbytes == 288 &&
                  !memcmp(t.data, q, 288),
              "round trip");
        td_gguf_close(g);
    }
    // ne[0] is stored innermost first: name, n_dims (u32), then 256 as a u64.
    const char *nm = NULL;
    for (size_t i = 0; i + 8 <= len && !nm; i++)
        if (!memcmp(buf + i, "blk.0.kq", 8)) nm = buf + i;
    CHECK(nm != NULL, "tensor name in file");
    if (nm) {
        uint64_t v;
        size_t off = (size_t)(nm - buf) + 8 + 4;
        memcpy(&v, buf + off, 8);
        CHECK(v == 256, "ne[0] at the expected offset");
        char *b2 = malloc(len);
        memcpy(b2, buf, len);
        v = 100;
        memcpy(b2 + off, &v, 8);
        CHECK(td_gguf_open_mem((const uint8_t *)b2, len, "bad_ne", &g, &err) != TD_OK && strstr(err.msg, "blk.0.kq") &&
                  strstr(err.msg, "Q4_K"),
              "row of 100: %s", err.msg);
        free(b2);
    }
    CHECK(td_gguf_open_mem((const uint8_t *)buf, len - 10, "truncated", &g, &err) != TD_OK &&
              strstr(err.msg, "blk.0.kq"),
          "truncated: %s", err.msg);
    free(buf);
}

int main(void) {
    char dir[512];
    td_path_join(dir, sizeof dir, td_test_data_dir(), "kquant");
    mkdir(td_test_data_dir(), 0755);
    mkdir(dir, 0755);
    test_sizes();
    test_error();
    test_edges();
    test_python_layout(dir);
    test_quantize_cli(dir);
    test_bad_files(dir);
    TEST_DONE();
}
