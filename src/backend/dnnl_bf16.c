// oneDNN bf16 matmul for BF16 prefill (see dnnl_bf16.h).
#include "backend/dnnl_bf16.h"

#include <stdlib.h>
#include <string.h>

#include "tensor/dtype.h"

#ifdef TANDEM_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>

enum { MAX_SHAPES = 32 };  // weight shapes of one model: a handful

typedef struct {
    int64_t n, k;
    dnnl_primitive_t prim;
} shape_prim;

struct td_dnnl_bf16 {
    dnnl_engine_t eng;
    dnnl_stream_t st;
    shape_prim shapes[MAX_SHAPES];
    int n_shapes;
    uint16_t *xb;  // bf16 activations, grown to the largest M * K seen
    size_t xb_cap;
};

td_status td_dnnl_bf16_create(td_dnnl_bf16 **out, td_err *err) {
    *out = NULL;
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx512bf16"))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "oneDNN bf16 matmul: this CPU lacks AVX512-BF16");
#endif
    td_dnnl_bf16 *d = calloc(1, sizeof *d);
    if (!d) return td_err_set(err, TD_ERR_NOMEM, "oneDNN bf16 matmul: out of memory");
    if (dnnl_engine_create(&d->eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&d->st, d->eng, dnnl_stream_default_flags) != dnnl_success) {
        td_dnnl_bf16_free(d);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "oneDNN bf16 matmul: no CPU engine");
    }
    *out = d;
    return TD_OK;
}

void td_dnnl_bf16_free(td_dnnl_bf16 *d) {
    if (!d) return;
    for (int i = 0; i < d->n_shapes; i++) dnnl_primitive_destroy(d->shapes[i].prim);
    if (d->st) dnnl_stream_destroy(d->st);
    if (d->eng) dnnl_engine_destroy(d->eng);
    free(d->xb);
    free(d);
}

// Memory descriptors of x [m, k] (m may be DNNL_RUNTIME_DIM_VAL), W^T [k, n] (W row-major) and y.
static int descs(int64_t m, int64_t n, int64_t k, dnnl_memory_desc_t *a, dnnl_memory_desc_t *b, dnnl_memory_desc_t *c) {
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n}, as = {k, 1}, bs = {1, k}, cs = {n, 1};
    return dnnl_memory_desc_init_by_strides(a, 2, ad, dnnl_bf16, as) == dnnl_success &&
           dnnl_memory_desc_init_by_strides(b, 2, bd, dnnl_bf16, bs) == dnnl_success &&
           dnnl_memory_desc_init_by_strides(c, 2, cd, dnnl_f32, cs) == dnnl_success;
}

static dnnl_primitive_t prim_for(td_dnnl_bf16 *d, int64_t n, int64_t k) {
    for (int i = 0; i < d->n_shapes; i++)
        if (d->shapes[i].n == n && d->shapes[i].k == k) return d->shapes[i].prim;
    if (d->n_shapes == MAX_SHAPES) return NULL;
    dnnl_memory_desc_t a, b, c;
    if (!descs(DNNL_RUNTIME_DIM_VAL, n, k, &a, &b, &c)) return NULL;
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t p;
    if (dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) != dnnl_success) return NULL;
    if (dnnl_primitive_desc_create(&pd, &md, NULL, d->eng, NULL) != dnnl_success) return NULL;
    const dnnl_status_t s = dnnl_primitive_create(&p, pd);
    dnnl_primitive_desc_destroy(pd);
    if (s != dnnl_success) return NULL;
    d->shapes[d->n_shapes++] = (shape_prim){n, k, p};
    return p;
}

int td_dnnl_bf16_matmul(td_dnnl_bf16 *d, const uint16_t *w, int64_t N, int64_t K, const float *x, int64_t M,
                        const float *bias, float *y) {
    dnnl_primitive_t p = prim_for(d, N, K);
    if (!p) return -1;
    const size_t need = (size_t)M * (size_t)K;
    if (need > d->xb_cap) {
        uint16_t *nb = realloc(d->xb, need * sizeof *nb);
        if (!nb) return -1;
        d->xb = nb, d->xb_cap = need;
    }
    td_from_f32(TD_BF16, x, d->xb, (int64_t)need);  // round to nearest even, as the tiles do
    dnnl_memory_desc_t a, b, c;
    if (!descs(M, N, K, &a, &b, &c)) return -1;
    dnnl_memory_t am = NULL, bm = NULL, cm = NULL;
    int rc = -1;
    if (dnnl_memory_create(&am, &a, d->eng, d->xb) == dnnl_success &&
        dnnl_memory_create(&bm, &b, d->eng, (void *)w) == dnnl_success &&
        dnnl_memory_create(&cm, &c, d->eng, y) == dnnl_success) {
        dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
        if (dnnl_primitive_execute(p, d->st, 3, args) == dnnl_success && dnnl_stream_wait(d->st) == dnnl_success)
            rc = 0;
    }
    if (am) dnnl_memory_destroy(am);
    if (bm) dnnl_memory_destroy(bm);
    if (cm) dnnl_memory_destroy(cm);
    if (rc == 0 && bias)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) y[i * N + j] += bias[j];
    return rc;
}

#else
td_status td_dnnl_bf16_create(td_dnnl_bf16 **out, td_err *err) {
    *out = NULL;
    return td_err_set(err, TD_ERR_UNSUPPORTED, "oneDNN bf16 matmul: built without oneDNN (libdnnl-dev)");
}
void td_dnnl_bf16_free(td_dnnl_bf16 *d) { (void)d; }
int td_dnnl_bf16_matmul(td_dnnl_bf16 *d, const uint16_t *w, int64_t N, int64_t K, const float *x, int64_t M,
                        const float *bias, float *y) {
    (void)d, (void)w, (void)N, (void)K, (void)x, (void)M, (void)bias, (void)y;
    return -1;
}
#endif
