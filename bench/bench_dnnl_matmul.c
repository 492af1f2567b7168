// tandem's BF16 prefill matmul (the avx512-int8 set's vdpbf16ps tiles, through the CPU backend: on
// W as stored, and on W packed once as the forward packs it, TD_PACK_VNNI16) side by side with
// oneDNN's bf16 matmul (Debian libdnnl; its brgemm kernels) on the same shapes: y[M, N]
// = x[M, K] W[N, K]^T, W bf16, y f32. oneDNN runs twice: on W as it is stored (strides) and on W
// reordered once into the blocked layout it prefers (format any; the reorder is not timed, as a
// repack at load time would not be). Its activations are given as bf16 (the rounding is not timed);
// tandem's timing includes its own rounding. Interleaved, best of the repetitions, wall clock.
// Usage: bench_dnnl_matmul [n_threads=2] [reps=5]; run with OMP_NUM_THREADS=n_threads (oneDNN uses
// OpenMP). Not a test; numbers depend on the machine and its load.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/log.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"

#ifdef TANDEM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

#define DN(call)                                                                   \
    do {                                                                           \
        dnnl_status_t s_ = (call);                                                 \
        if (s_ != dnnl_success) {                                                  \
            fprintf(stderr, "bench_dnnl_matmul: %s failed (%d)\n", #call, (int)s_); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

typedef struct {
    const char *name;
    int M, N, K;
} shape;

static const shape SHAPES[] = {
    {"llama110m.ffn_up", 512, 2048, 768},  {"llama110m.ffn_down", 512, 768, 2048},
    {"qwen0.5b.ffn_up", 512, 4864, 896},   {"qwen0.5b.ffn_down", 512, 896, 4864},
    {"llama1b.ffn_up", 512, 8192, 2048},
};

typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} dn_mm;

// A oneDNN matmul on bf16 x[M, K] and W[N, K] (given as B = W^T with strides), f32 y; with
// any_weights, W is reordered once into the primitive's preferred layout.
static void dn_create(dn_mm *m, dnnl_engine_t eng, dnnl_stream_t st, int M, int N, int K, uint16_t *xa, uint16_t *w,
                      float *y, int any_weights) {
    dnnl_memory_desc_t a_md, b_md, b_plain, c_md;
    dnnl_dims_t ad = {M, K}, bd = {K, N}, cd = {M, N}, bs = {1, K};
    DN(dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_bf16, dnnl_ab));
    DN(dnnl_memory_desc_init_by_strides(&b_plain, 2, bd, dnnl_bf16, bs));
    if (any_weights)
        DN(dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_bf16, dnnl_format_tag_any));
    else
        b_md = b_plain;
    DN(dnnl_memory_desc_init_by_tag(&c_md, 2, cd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    DN(dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md));
    dnnl_primitive_desc_t pd;
    DN(dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL));
    DN(dnnl_primitive_create(&m->prim, pd));
    const dnnl_memory_desc_t *wq = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    DN(dnnl_memory_create(&m->a, &a_md, eng, xa));
    DN(dnnl_memory_create(&m->c, &c_md, eng, y));
    dnnl_memory_t plain;
    DN(dnnl_memory_create(&plain, &b_plain, eng, w));
    if (any_weights) {
        DN(dnnl_memory_create(&m->b, wq, eng, DNNL_MEMORY_ALLOCATE));
        dnnl_primitive_desc_t rpd;
        DN(dnnl_reorder_primitive_desc_create(&rpd, &b_plain, eng, wq, eng, NULL));
        dnnl_primitive_t r;
        DN(dnnl_primitive_create(&r, rpd));
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, m->b}};
        DN(dnnl_primitive_execute(r, st, 2, ra));
        DN(dnnl_stream_wait(st));
        dnnl_primitive_destroy(r);
        dnnl_primitive_desc_destroy(rpd);
        dnnl_memory_destroy(plain);
    } else {
        m->b = plain;
    }
    dnnl_primitive_desc_destroy(pd);
}

static double dn_run(dn_mm *m, dnnl_stream_t st) {
    dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, m->a}, {DNNL_ARG_WEIGHTS, m->b}, {DNNL_ARG_DST, m->c}};
    const double t0 = td_now();
    DN(dnnl_primitive_execute(m->prim, st, 3, args));
    DN(dnnl_stream_wait(st));
    return td_now() - t0;
}

static void dn_free(dn_mm *m) {
    dnnl_primitive_destroy(m->prim);
    dnnl_memory_destroy(m->a), dnnl_memory_destroy(m->b), dnnl_memory_destroy(m->c);
}

int main(int argc, char **argv) {
    const int nt = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 5;
    if (nt < 1 || reps < 1) return fprintf(stderr, "usage: bench_dnnl_matmul [n_threads] [reps]\n"), 2;
    if (!td_kernels_available("avx512-int8")) {
        printf("bench_dnnl_matmul: this CPU lacks AVX512-VNNI/BF16: tandem's bf16 tiles do not run here\n");
        return 0;
    }
    td_backend_cpu_params bp = td_backend_cpu_default_params();
    bp.n_threads = nt;
    bp.kernels = "avx512-int8";
    td_backend *be;
    td_err err;
    if (td_backend_cpu_create(&bp, &be, &err) != TD_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    dnnl_engine_t eng;
    dnnl_stream_t st;
    DN(dnnl_engine_create(&eng, dnnl_cpu, 0));
    DN(dnnl_stream_create(&st, eng, dnnl_stream_default_flags));
    printf("%-20s %5s %5s %5s %14s %14s %14s %14s %10s\n", "shape", "M", "N", "K", "tandem GF/s", "packed GF/s",
           "dnnl GF/s", "dnnl-blk GF/s", "max|dy|");
    for (size_t s = 0; s < sizeof SHAPES / sizeof SHAPES[0]; s++) {
        const shape *sh = &SHAPES[s];
        const size_t nx = (size_t)sh->M * sh->K, nw = (size_t)sh->N * sh->K, ny = (size_t)sh->M * sh->N;
        float *x = malloc(nx * 4), *y0 = malloc(ny * 4), *y1 = malloc(ny * 4), *y2 = malloc(ny * 4), *y3 = malloc(ny * 4);
        uint16_t *w = malloc(nw * 2), *xb = malloc(nx * 2);
        if (!x || !y0 || !y1 || !y2 || !y3 || !w || !xb) return fprintf(stderr, "out of memory\n"), 1;
        uint64_t r = 0x2545F4914F6CDD1DULL + s;
        for (size_t i = 0; i < nx; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            x[i] = (float)((double)(r >> 11) / 9007199254740992.0 - 0.5);
            xb[i] = td_f32_to_bf16(x[i]);
        }
        for (size_t i = 0; i < nw; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            w[i] = td_f32_to_bf16((float)((double)(r >> 11) / 9007199254740992.0 - 0.5) * 0.1f);
        }
        td_tensor wt = {.type = TD_BF16, .ndim = 2, .ne = {sh->N, sh->K}, .data = w, .nbytes = nw * 2};
        const size_t pb = td_backend_pack_bytes(be, &wt);
        void *pk = pb ? aligned_alloc(64, (pb + 63) & ~(size_t)63) : NULL;
        if (!pk) return fprintf(stderr, "no packed layout or out of memory\n"), 1;
        const td_tensor wp = td_backend_pack(be, &wt, pk);
        dn_mm plain, blk;
        dn_create(&plain, eng, st, sh->M, sh->N, sh->K, xb, w, y1, 0);
        dn_create(&blk, eng, st, sh->M, sh->N, sh->K, xb, w, y2, 1);
        double bt = 1e30, bk = 1e30, bp_ = 1e30, bb = 1e30;
        for (int i = 0; i <= reps; i++) {  // the first pass warms up
            double t0 = td_now();
            td_backend_matmul(be, &wt, NULL, x, y0, sh->M);
            double t = td_now() - t0;
            t0 = td_now();
            td_backend_matmul(be, &wp, NULL, x, y3, sh->M);
            double tk = td_now() - t0, tp = dn_run(&plain, st), tb = dn_run(&blk, st);
            if (i) bt = fmin(bt, t), bk = fmin(bk, tk), bp_ = fmin(bp_, tp), bb = fmin(bb, tb);
        }
        double md = 0;
        for (size_t i = 0; i < ny; i++)
            md = fmax(md, fmax(fmax(fabs(y0[i] - y1[i]), fabs(y0[i] - y2[i])), fabs(y3[i] - y1[i])));
        const double fl = 2.0 * sh->M * sh->N * sh->K / 1e9;
        printf("%-20s %5d %5d %5d %14.1f %14.1f %14.1f %14.1f %10.2e\n", sh->name, sh->M, sh->N, sh->K, fl / bt,
               fl / bk, fl / bp_, fl / bb, md);
        dn_free(&plain), dn_free(&blk);
        free(x), free(y0), free(y1), free(y2), free(y3), free(w), free(xb), free(pk);
    }
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    td_backend_free(be);
    return 0;
}
#else
int main(void) {
    printf("bench_dnnl_matmul: built without oneDNN (libdnnl-dev)\n");
    return 0;
}
#endif
