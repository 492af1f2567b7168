// The OpenCL backend's training slots (opencl/train.cl): the backward of every forward slot,
// cross-entropy, bf16 rounding and the optimizer, each as the CPU reference computes it, in a
// fixed order (deterministic, no float atomics). Launch shapes only: the arithmetic is in the
// kernels. Not here: scratch of its own (the slots use the buffers they are given).
#include "backend/opencl_impl.h"

enum { TWG = 64, MM_T = 4, MM_O = 4 };  // train.cl's TWG, MM_T, MM_O

void ocl_round_bf16(void *ctx, const td_round_bf16_args *a) {
    ocl_call k = ocl_begin(ctx, "td_round_bf16");
    ocl_arg_ptr(&k, a->x);
    ocl_arg_ptr(&k, a->y);
    ocl_arg_long(&k, a->n);
    const size_t g[1] = {(size_t)a->n};
    ocl_run(&k, 1, g, NULL);
}

// dx, then dW, then db: three kernels that read dy and write disjoint buffers.
void ocl_mm_bwd(void *ctx, const td_mm_bwd_args *a) {
    if (a->dx) {
        ocl_call k = ocl_begin(ctx, "td_mm_bwd_x");
        ocl_arg_ptr(&k, a->w);
        ocl_arg_ptr(&k, a->dy);
        ocl_arg_ptr(&k, a->dx);
        ocl_arg_int(&k, a->n_tok);
        ocl_arg_int(&k, a->n_out);
        ocl_arg_int(&k, a->n_in);
        ocl_arg_int(&k, a->accumulate);
        const size_t g[2] = {(size_t)a->n_in, ocl_div_up((size_t)a->n_tok, MM_T)};
        ocl_run(&k, 2, g, NULL);
    }
    if (a->dw) {
        ocl_call k = ocl_begin(ctx, "td_mm_bwd_w");
        ocl_arg_ptr(&k, a->x);
        ocl_arg_ptr(&k, a->dy);
        ocl_arg_ptr(&k, a->dw);
        ocl_arg_int(&k, a->n_tok);
        ocl_arg_int(&k, a->n_out);
        ocl_arg_int(&k, a->n_in);
        const size_t g[2] = {(size_t)a->n_in, ocl_div_up((size_t)a->n_out, MM_O)};
        ocl_run(&k, 2, g, NULL);
    }
    if (a->db) {
        ocl_call k = ocl_begin(ctx, "td_mm_bwd_b");
        ocl_arg_ptr(&k, a->dy);
        ocl_arg_ptr(&k, a->db);
        ocl_arg_int(&k, a->n_tok);
        ocl_arg_int(&k, a->n_out);
        const size_t g[1] = {(size_t)a->n_out};
        ocl_run(&k, 1, g, NULL);
    }
}

void ocl_rmsnorm_bwd(void *ctx, const td_rmsnorm_bwd_args *a) {
    if (a->n_rows <= 0) return;
    ocl_call k = ocl_begin(ctx, "td_rmsnorm_bwd_x");
    ocl_arg_ptr(&k, a->x);
    ocl_arg_ptr(&k, a->w);
    ocl_arg_ptr(&k, a->dy);
    ocl_arg_ptr(&k, a->dx);
    ocl_arg_ptr(&k, a->rstd);
    ocl_arg_int(&k, a->n);
    ocl_arg_float(&k, a->eps);
    ocl_arg_int(&k, a->accumulate);
    const size_t g[1] = {(size_t)a->n_rows * TWG}, l[1] = {TWG};
    ocl_run(&k, 1, g, l);
    if (!a->dw) return;
    ocl_call kw = ocl_begin(ctx, "td_rmsnorm_bwd_w");  // after bwd_x in stream order: rstd is written
    ocl_arg_ptr(&kw, a->x);
    ocl_arg_ptr(&kw, a->dy);
    ocl_arg_ptr(&kw, a->rstd);
    ocl_arg_ptr(&kw, a->dw);
    ocl_arg_int(&kw, a->n_rows);
    ocl_arg_int(&kw, a->n);
    const size_t gw[1] = {(size_t)a->n};
    ocl_run(&kw, 1, gw, NULL);
}

// Three passes (train.cl): softmax statistics into dq, dk/dv per key, dq per query. The
// scratch rows are not used.
void ocl_attention_bwd(void *ctx, const td_attention_bwd_args *a) {
    static const char *const pass[3] = {"td_attn_bwd_stats", "td_attn_bwd_dkv", "td_attn_bwd_dq"};
    const size_t rows = (size_t)a->n_seq * a->seq_len;
    for (int p = 0; p < 3; p++) {
        ocl_call k = ocl_begin(ctx, pass[p]);
        ocl_arg_ptr(&k, a->q);
        ocl_arg_ptr(&k, a->k);
        ocl_arg_ptr(&k, a->v);
        ocl_arg_ptr(&k, a->out);
        ocl_arg_ptr(&k, a->dout);
        ocl_arg_ptr(&k, a->dq);
        ocl_arg_ptr(&k, a->dk);
        ocl_arg_ptr(&k, a->dv);
        ocl_arg_int(&k, a->n_seq);
        ocl_arg_int(&k, a->seq_len);
        ocl_arg_int(&k, a->n_heads);
        ocl_arg_int(&k, a->n_kv_heads);
        ocl_arg_int(&k, a->head_dim);
        ocl_arg_float(&k, a->scale);
        const size_t g[1] = {rows * (size_t)(p == 1 ? a->n_kv_heads : a->n_heads)};
        ocl_run(&k, 1, g, NULL);
    }
}

void ocl_swiglu_bwd(void *ctx, const td_swiglu_bwd_args *a) {
    ocl_call k = ocl_begin(ctx, "td_swiglu_bwd");
    ocl_arg_ptr(&k, a->gate);
    ocl_arg_ptr(&k, a->up);
    ocl_arg_ptr(&k, a->dh);
    ocl_arg_ptr(&k, a->dgate);
    ocl_arg_ptr(&k, a->dup);
    ocl_arg_long(&k, a->n);
    const size_t g[1] = {(size_t)a->n};
    ocl_run(&k, 1, g, NULL);
}

void ocl_embed_bwd(void *ctx, const td_embed_bwd_args *a) {
    if (a->n_tok <= 0) return;
    ocl_call k = ocl_begin(ctx, "td_embed_bwd");
    ocl_arg_ptr(&k, a->tokens);
    ocl_arg_ptr(&k, a->dy);
    ocl_arg_ptr(&k, a->dtable);
    ocl_arg_int(&k, a->n_tok);
    ocl_arg_int(&k, a->dim);
    const size_t g[1] = {(size_t)a->dim};
    ocl_run(&k, 1, g, NULL);
}

void ocl_xent(void *ctx, const td_xent_args *a) {
    ocl_call k = ocl_begin(ctx, "td_xent");
    ocl_arg_ptr(&k, a->logits);
    ocl_arg_ptr(&k, a->targets);
    ocl_arg_ptr(&k, a->loss);
    ocl_arg_int(&k, a->vocab);
    ocl_arg_float(&k, a->dscale);
    ocl_arg_int(&k, a->want_grad);
    const size_t g[1] = {(size_t)a->n_tok * TWG}, l[1] = {TWG};
    ocl_run(&k, 1, g, l);
}

void ocl_sumsq(void *ctx, const td_sumsq_args *a) {
    ocl_call k = ocl_begin(ctx, "td_sumsq");
    ocl_arg_ptr(&k, a->x);
    ocl_arg_long(&k, a->n);
    ocl_arg_ptr(&k, a->part);
    ocl_arg_int(&k, OCL_N_SLICES);
    const size_t g[1] = {(size_t)OCL_N_SLICES * TWG}, l[1] = {TWG};
    ocl_run(&k, 1, g, l);
}

void ocl_scale(void *ctx, const td_scale_args *a) {
    ocl_call k = ocl_begin(ctx, "td_scale");
    ocl_arg_ptr(&k, a->x);
    ocl_arg_long(&k, a->n);
    ocl_arg_float(&k, a->s);
    const size_t g[1] = {(size_t)a->n};
    ocl_run(&k, 1, g, NULL);
}

void ocl_adamw(void *ctx, const td_adamw_args *a) {
    ocl_call k = ocl_begin(ctx, "td_adamw");
    ocl_arg_ptr(&k, a->w);
    ocl_arg_ptr(&k, a->g);
    ocl_arg_ptr(&k, a->m);
    ocl_arg_ptr(&k, a->v);
    ocl_arg_long(&k, a->n);
    ocl_arg_float(&k, a->decay);
    ocl_arg_float(&k, a->step_size);
    ocl_arg_float(&k, a->bc2_sqrt);
    ocl_arg_float(&k, a->beta1);
    ocl_arg_float(&k, a->beta2);
    ocl_arg_float(&k, a->eps);
    const size_t g[1] = {(size_t)a->n};
    ocl_run(&k, 1, g, NULL);
}
