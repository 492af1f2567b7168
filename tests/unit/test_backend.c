// The backend's memory interface and the slots the forward added to it, on the CPU backend: host
// buffers (alignment, bounds, set/get/copy/clear, failure to allocate reported, not fatal),
// asynchronous copies and synchronize, weight placement (as-is bytes, f32 conversion of every
// dtype against td_to_f32), rewriting a placed weight from f32 values (td_from_f32's bytes, and a
// packed copy redone equal to a fresh pack of the new values), get_rows against a plain gather,
// and the training slots against the reference kernels run directly.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "kernels/backward.h"
#include "test_util.h"

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x800000 - 1.0f;
}

static void test_buffers(void) {
    td_buft *bt = td_host_buft();
    CHECK(bt->iface->is_host && bt->iface->alignment == 64, "host buffer type: host, 64-byte aligned");
    td_buffer *b = NULL, *c = NULL;
    td_err err = {0};
    CHECK(td_buffer_alloc(bt, 0, "test", &b, &err) == TD_ERR_INVALID && !b, "0 bytes refused");
    CHECK(td_buffer_alloc(bt, SIZE_MAX / 2, "huge test", &b, &err) == TD_ERR_NOMEM && !b && strstr(err.msg, "huge test"),
          "an impossible size is an error naming what: %s", err.msg);
    CHECK(td_buffer_alloc(bt, 1000, "test", &b, &err) == TD_OK && b && b->size == 1000, "alloc: %s", err.msg);
    CHECK(td_buffer_alloc(bt, 1000, "test", &c, &err) == TD_OK && c, "alloc 2");
    if (!b || !c) return;
    CHECK(((uintptr_t)b->base & 63) == 0 && td_buffer_is_host(b), "aligned host memory");
    uint8_t src[1000], dst[1000];
    for (int i = 0; i < 1000; i++) src[i] = (uint8_t)(i * 37 + 1);
    td_buffer_set(b, 0, src, 1000);
    td_buffer_get(b, 3, dst, 997);
    CHECK(!memcmp(dst, src + 3, 997), "set then get at an offset");
    td_buffer_clear(c, 0xab);
    td_buffer_copy(c, 10, b, 100, 50);
    td_buffer_get(c, 0, dst, 1000);
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= dst[i] == (i >= 10 && i < 60 ? src[100 + i - 10] : 0xab);
    CHECK(ok, "copy of 50 bytes into a cleared buffer, the rest untouched");
    td_buffer_free(b), td_buffer_free(c), td_buffer_free(NULL);
}

static td_backend *cpu(const char *kernels) {
    td_backend_cpu_params p = td_backend_cpu_default_params();
    p.n_threads = 2, p.kernels = kernels;
    td_backend *be = NULL;
    td_err err = {0};
    return td_backend_cpu_create(&p, &be, &err) == TD_OK ? be : NULL;
}

static void test_async(td_backend *be) {
    td_buffer *b = NULL;
    td_err err = {0};
    CHECK(td_backend_alloc(be, 4096, "async", &b, &err) == TD_OK && td_backend_is_host(be), "backend alloc");
    if (!b) return;
    int32_t in[256], out[256];
    for (int i = 0; i < 256; i++) in[i] = i * i - 7;
    td_backend_set_async(be, b, 1024, in, sizeof in);
    td_backend_get_async(be, b, 1024, out, sizeof out);
    td_backend_synchronize(be);
    CHECK(!memcmp(in, out, sizeof in), "async set, get, synchronize");
    td_buffer_free(b);
}

// Placement of a [rows, cols] tensor of every dtype: as-is bytes and f32 values.
static void test_place(td_backend *be) {
    enum { ROWS = 5, COLS = 256 };
    uint64_t seed = 1;
    float *vals = malloc(ROWS * COLS * sizeof *vals), *want = malloc(ROWS * COLS * sizeof *want);
    for (int i = 0; i < ROWS * COLS; i++) vals[i] = frand(&seed);
    const td_dtype types[] = {TD_F32, TD_F16, TD_BF16, TD_Q8_0, TD_Q4_0, TD_Q5_0, TD_Q4_K, TD_Q6_K};
    for (size_t k = 0; k < sizeof types / sizeof *types; k++) {
        const td_dtype t = types[k];
        const size_t nb = td_row_bytes(t, COLS) * ROWS;
        void *enc = malloc(nb);
        td_from_f32(t, vals, enc, ROWS * COLS);
        td_tensor src = {.type = t, .ndim = 2, .ne = {ROWS, COLS}, .data = enc, .nbytes = nb};
        const size_t b_as = td_backend_tensor_bytes(be, &src, TD_PLACE_AS_IS),
                     b_f32 = td_backend_tensor_bytes(be, &src, TD_PLACE_F32);
        CHECK(b_as >= nb && b_as % 64 == 0 && b_f32 == ROWS * COLS * 4, "%s: sizes %zu / %zu", td_dtype_name(t), b_as,
              b_f32);
        td_buffer *b = NULL;
        td_err err = {0};
        if (td_backend_alloc(be, 64 + b_as + b_f32, "place", &b, &err) != TD_OK) {
            CHECK(0, "alloc: %s", err.msg);
            free(enc);
            continue;
        }
        td_tensor as = td_backend_tensor_place(be, &src, TD_PLACE_AS_IS, b, 64);
        td_tensor f = td_backend_tensor_place(be, &src, TD_PLACE_F32, b, 64 + b_as);
        CHECK(as.buf == b && as.type == t && as.data == td_buffer_at(b, 64) && !memcmp(as.data, enc, nb),
              "%s: placed as is", td_dtype_name(t));
        td_to_f32(t, enc, want, ROWS * COLS);
        CHECK(f.buf == b && f.type == TD_F32 && !memcmp(f.data, want, (size_t)ROWS * COLS * 4), "%s: placed as f32",
              td_dtype_name(t));
        float row[COLS];
        td_backend_tensor_get_async(be, &f, row, (size_t)2 * COLS * 4, sizeof row);
        td_backend_synchronize(be);
        CHECK(!memcmp(row, want + 2 * COLS, sizeof row), "%s: tensor get of row 2", td_dtype_name(t));
        // New values: the placed copy is re-encoded in place, as td_from_f32 encodes them.
        for (int i = 0; i < ROWS * COLS; i++) want[i] = vals[i] * -0.5f + 0.01f;
        td_backend_tensor_update_f32(be, &as, want, ROWS * COLS, NULL);
        td_from_f32(t, want, enc, ROWS * COLS);
        CHECK(!memcmp(as.data, enc, nb), "%s: update_f32 writes td_from_f32's bytes", td_dtype_name(t));
        td_buffer_free(b);
        free(enc);
    }
    free(vals), free(want);
}

// A pretend device buffer type (not host: the placement paths that stage through host memory run)
// whose memory is plain malloc underneath, so the test can read it back through get.
static void dev_free(td_buffer *b) { free(b->ctx), free(b); }
static void dev_set(td_buffer *b, size_t off, const void *src, size_t n) { memcpy((char *)b->ctx + off, src, n); }
static void dev_get(const td_buffer *b, size_t off, void *dst, size_t n) { memcpy(dst, (const char *)b->ctx + off, n); }
static void dev_clear(td_buffer *b, uint8_t v) { memset(b->ctx, v, b->size); }
static void dev_copy(td_buffer *b, size_t d, const td_buffer *s, size_t o, size_t n) {
    memcpy((char *)b->ctx + d, (const char *)s->ctx + o, n);
}
static const td_buffer_iface dev_iface = {dev_free, dev_set, dev_get, dev_clear, dev_copy};
static td_buffer *dev_alloc(td_buft *bt, size_t size) {
    td_buffer *b = calloc(1, sizeof *b);
    void *m = malloc(size);
    if (!b || !m) return free(b), free(m), NULL;
    // base is an opaque "device address": never dereferenced by the host code under test
    *b = (td_buffer){.iface = &dev_iface, .buft = bt, .base = (void *)(uintptr_t)0x1000, .size = size, .ctx = m};
    return b;
}
static const td_buft_iface dev_buft_iface = {.name = "pretend-device", .alloc = dev_alloc, .alignment = 64};
static td_buft dev_buft = {.iface = &dev_buft_iface};

static void test_place_device(td_backend *be) {
    enum { N = 2500 };  // more than one staging chunk, not a multiple of it
    uint64_t seed = 11;
    float vals[N], want[N], got[N];
    for (int i = 0; i < N; i++) vals[i] = frand(&seed);
    uint16_t enc[N];
    td_from_f32(TD_BF16, vals, enc, N);
    td_tensor src = {.type = TD_BF16, .ndim = 1, .ne = {N}, .data = enc, .nbytes = sizeof enc};
    td_buffer *b = NULL;
    td_err err = {0};
    const size_t need = 64 + td_align_up((size_t)N * 4, 64) + td_align_up(sizeof enc, 64);
    if (td_buffer_alloc(&dev_buft, need, "dev", &b, &err) != TD_OK) {
        CHECK(0, "dev alloc: %s", err.msg);
        return;
    }
    td_tensor f = td_backend_tensor_place(be, &src, TD_PLACE_F32, b, 64);
    td_buffer_get(b, 64, got, sizeof got);
    td_to_f32(TD_BF16, enc, want, N);
    CHECK(f.buf == b && !td_buffer_is_host(b) && !memcmp(got, want, sizeof got), "device: f32 placement staged in chunks");
    const size_t off2 = 64 + td_align_up((size_t)N * 4, 64);
    td_tensor as = td_backend_tensor_place(be, &src, TD_PLACE_AS_IS, b, off2);
    uint16_t back[N], scratch[N];
    td_buffer_get(b, off2, back, sizeof back);
    CHECK(!memcmp(back, enc, sizeof enc), "device: as-is placement uploaded");
    for (int i = 0; i < N; i++) want[i] = -2.0f * vals[i];
    td_backend_tensor_update_f32(be, &as, want, N, scratch);
    td_buffer_get(b, off2, back, sizeof back);
    td_from_f32(TD_BF16, want, enc, N);
    CHECK(!memcmp(back, enc, sizeof enc), "device: update_f32 encodes in the scratch, then uploads");
    td_buffer_free(b);
}

// A packed weight rewritten from new values equals a fresh pack of those values.
static void test_repack(void) {
    td_backend *be = cpu("avx512-int8");
    if (!be) {
        printf("skipped: repack (no avx512-int8 kernel set on this CPU)\n");
        return;
    }
    enum { ROWS = 37, COLS = 128 };
    uint64_t seed = 9;
    float *v1 = malloc(ROWS * COLS * 4), *v2 = malloc(ROWS * COLS * 4);
    for (int i = 0; i < ROWS * COLS; i++) v1[i] = frand(&seed), v2[i] = frand(&seed);
    const td_dtype types[] = {TD_Q8_0, TD_Q4_0, TD_BF16};
    for (size_t k = 0; k < 3; k++) {
        const td_dtype t = types[k];
        const size_t nb = td_row_bytes(t, COLS) * ROWS;
        void *e1 = malloc(nb), *e2 = malloc(nb);
        td_from_f32(t, v1, e1, ROWS * COLS);
        td_from_f32(t, v2, e2, ROWS * COLS);
        td_tensor s1 = {.type = t, .ndim = 2, .ne = {ROWS, COLS}, .data = e1, .nbytes = nb};
        td_tensor s2 = s1;
        s2.data = e2;
        const size_t pb = td_backend_pack_bytes(be, &s1);
        CHECK(pb > 0, "%s packs", td_dtype_name(t));
        td_buffer *b = NULL;
        td_err err = {0};
        const size_t ab = td_backend_tensor_bytes(be, &s1, TD_PLACE_AS_IS);
        if (!pb || td_backend_alloc(be, ab + 2 * td_align_up(pb, 64), "repack", &b, &err) != TD_OK) {
            free(e1), free(e2);
            continue;
        }
        td_tensor placed = td_backend_tensor_place(be, &s1, TD_PLACE_AS_IS, b, 0);
        td_tensor packed = td_backend_pack(be, &placed, td_buffer_at(b, ab));
        td_backend_tensor_update_f32(be, &packed, v2, ROWS * COLS, NULL);
        td_tensor fresh = td_backend_pack(be, &s2, td_buffer_at(b, ab + td_align_up(pb, 64)));
        CHECK(packed.packing == fresh.packing && !memcmp(packed.packed, fresh.packed, pb),
              "%s: packed copy redone from the new values", td_dtype_name(t));
        td_buffer_free(b);
        free(e1), free(e2);
    }
    free(v1), free(v2);
    td_backend_free(be);
}

static void test_get_rows(td_backend *be) {
    enum { R = 11, N = 37, J = 6 };
    float x[R * N], y[J * N];
    uint64_t seed = 3;
    for (int i = 0; i < R * N; i++) x[i] = frand(&seed);
    const int32_t rows[J] = {10, 0, 3, 3, 7, 1};
    td_backend_get_rows(be, x, rows, y, J, N);
    int ok = 1;
    for (int j = 0; j < J; j++) ok &= !memcmp(y + j * N, x + rows[j] * N, N * sizeof(float));
    CHECK(ok, "get_rows gathers the rows in order (repeats included)");
}

// The training slots compute what the reference kernels compute run alone (one slice).
static void test_training_slots(td_backend *be) {
    enum { T = 7, NI = 33, NO = 19 };
    uint64_t seed = 5;
    float w[NO * NI], x[T * NI], dy[T * NO];
    for (int i = 0; i < NO * NI; i++) w[i] = frand(&seed);
    for (int i = 0; i < T * NI; i++) x[i] = frand(&seed);
    for (int i = 0; i < T * NO; i++) dy[i] = frand(&seed);
    float dx1[T * NI], dx2[T * NI], dw1[NO * NI] = {0}, dw2[NO * NI] = {0}, db1[NO] = {0}, db2[NO] = {0};
    td_mm_bwd_args a = {.w = w, .x = x, .dy = dy, .dx = dx1, .dw = dw1, .db = db1, .n_tok = T, .n_out = NO, .n_in = NI};
    td_backend_mm_bwd(be, &a);
    td_mm_bwd_args r = a;
    r.dx = dx2, r.dw = dw2, r.db = db2;
    td_ref_mm_bwd_x(&r, 0, 1);
    td_ref_mm_bwd_w(&r, 0, 1);
    CHECK(!memcmp(dx1, dx2, sizeof dx1) && !memcmp(dw1, dw2, sizeof dw1) && !memcmp(db1, db2, sizeof db1),
          "mm_bwd slot = reference kernels (dx, dW, db) bit for bit");

    float lg1[T * NO], lg2[T * NO], l1[T], l2[T];
    memcpy(lg1, dy, sizeof lg1), memcpy(lg2, dy, sizeof lg2);
    int32_t tg[T] = {0, 3, -1, 18, 5, 5, 2};
    td_xent_args xa = {.logits = lg1, .targets = tg, .loss = l1, .n_tok = T, .vocab = NO, .dscale = 0.25f, .want_grad = 1};
    td_backend_xent(be, &xa);
    td_xent_args xr = xa;
    xr.logits = lg2, xr.loss = l2;
    td_ref_xent(&xr, 0, 1);
    CHECK(!memcmp(lg1, lg2, sizeof lg1) && !memcmp(l1, l2, sizeof l1), "xent slot = reference kernel");
}

int main(void) {
    test_buffers();
    td_backend *be = cpu("ref");
    CHECK(be != NULL, "cpu backend");
    if (be) {
        test_async(be);
        test_place(be);
        test_place_device(be);
        test_get_rows(be);
        test_training_slots(be);
        td_backend_free(be);
    }
    test_repack();
    TEST_DONE();
}
