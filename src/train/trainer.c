// The training step: accumulate gradients over micro-batches, reduce them across data-parallel
// ranks, clip by global norm, AdamW at the scheduled learning rate. The mean is over all counted
// targets of the step on every rank, so k micro-batches on each of N ranks give the gradient of
// one batch k N times larger. The norm, the clipping scale and the update run on the model's
// backend (its sumsq, scale and adamw slots); the optimizer state and the norm's partial sums live
// in its memory, and the host reads back one partial per slice.
//
// Data parallelism (td_trainer_params.comm of size N > 1). Gradients are reduced in buckets: the
// model's backward reports ranges of the gradient buffer as their last contribution is issued
// (td_tmodel_set_grad_hook: the head, layers L-1..0, the embedding); adjacent ranges are merged
// until a bucket holds bucket_elems, and on the step's last micro-batch its reduction is posted
// at once (non-blocking) while backward goes on with the layers below, polled at each later hook
// so the transport progresses. With ZeRO 0 a bucket is all-reduced in place. With ZeRO 1 and 2 it
// is reduce-scattered: rank r receives block r of count = n / N elements of every bucket (the
// last n mod N elements, the tail, are all-reduced and kept by every rank), and owns those
// elements: it keeps AdamW's moments for them only (the shard), updates them, and the updated
// blocks are all-gathered into every rank's parameters. ZeRO 2 also reduces every micro-batch
// (not only the last) and folds the owned elements into a shard-sized accumulator, so gradient
// accumulation needs no full-size buffer.
//
// Accumulation over k > 1 micro-batches folds separately computed gradients in order
// (acc = g_0, acc = acc + g_1, ...), as torch's .grad += does and as a reduction across ranks
// does; so N ranks of one micro-batch each give the bits of one rank accumulating the same N
// micro-batches (docs/training.md: equivalence).
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"

enum { MAX_PENDING = 96 };  // requests in flight before the oldest is waited (the local comm has 128)

typedef struct bucket {
    size_t lo, n;     // elements [lo, lo + n) of the gradient buffer
    size_t count;     // ZeRO: the block each rank owns (n / world)
    size_t shard_off; // ZeRO: where this bucket's block (then its tail) starts in the shard state
} bucket;

struct td_trainer {
    td_tmodel *tm;  // borrowed
    td_trainer_params p;
    td_adamw *opt;
    td_buffer *b_part;  // [td_backend_n_slices] doubles: the gradient norm's partial sums of squares
    double *norm_part;  // the same partials as a host array (b_part's memory on a host backend)
    // Data parallelism (world > 1) and accumulation (grad_accum > 1).
    td_comm *comm;     // p.comm, or NULL with one rank
    int rank, world;
    td_buffer *b_acc;  // grad_accum > 1: the folded gradient ([n_params], or [n_shard] with ZeRO 2)
    bucket *buckets;   // in backward order (descending offsets)
    int n_buckets;
    size_t n_shard;    // ZeRO: elements this rank owns (blocks and tails)
    td_adamw_seg *segs;  // ZeRO: the shard cut at tensor boundaries (the update's segments)
    int n_segs;
    double *bucket_ss;   // ZeRO: [n_buckets * world] owned sums of squares, gathered
    double *bucket_tail; // ZeRO: [n_buckets] the tails' sums of squares
    // Within one step.
    td_comm_req *pending[MAX_PENDING];
    int n_pending;
    int hook_k;        // the micro-batch whose backward is running
    int next_bucket;   // the next bucket the hooks will complete
    size_t hook_lo;    // the lowest offset reported so far in this backward
    td_status comm_st; // the first communication failure of the step
    td_err comm_err;
    double comm_wait_s; // time blocked on communication after backward (the exposed part)
    double comm_bytes;  // bytes of gradients and parameters handed to collectives this step
};

td_trainer_params td_trainer_default_params(void) {
    return (td_trainer_params){
        .grad_accum = 1,
        .grad_clip = 1.0f,
        .lr = {.max_lr = 3e-4f, .min_lr = 3e-5f, .warmup_steps = 100, .total_steps = 10000},
        .adam = td_adamw_default_params(),
        .bucket_elems = TD_TRAINER_BUCKET_ELEMS,
    };
}

static float *grads(td_trainer *t) { return td_tmodel_grads_buf(t->tm, NULL); }
static float *acc(td_trainer *t) { return t->b_acc ? (float *)t->b_acc->base : NULL; }

// Buckets from the ranges backward reports (the head through the end of the buffer, each layer,
// the embedding), merged downwards until one holds bucket_elems.
static td_status plan_buckets(td_trainer *t, td_err *err) {
    td_tmodel *tm = t->tm;
    size_t n;
    td_tmodel_params_buf(tm, &n);
    const td_model_config *c = td_tmodel_config(tm);
    // Range starts, descending: the head (model.norm.weight's offset), layers L-1..0, the embedding.
    const int nr = c->n_layers + 2;
    size_t *starts = malloc((size_t)nr * sizeof *starts);
    t->buckets = calloc((size_t)nr, sizeof *t->buckets);
    if (!starts || !t->buckets) {
        free(starts);
        return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    }
    starts[0] = td_tmodel_find(tm, "model.norm.weight")->offset;
    for (int l = c->n_layers - 1, i = 1; l >= 0; l--, i++) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        starts[i] = td_tmodel_find(tm, name)->offset;
    }
    starts[nr - 1] = 0;
    size_t hi = n;
    for (int i = 0; i < nr; i++) {
        const bool last = i == nr - 1;
        if (hi - starts[i] >= t->p.bucket_elems || last) {
            t->buckets[t->n_buckets++] = (bucket){.lo = starts[i], .n = hi - starts[i]};
            hi = starts[i];
        }
    }
    free(starts);
    // The shard: bucket b's block [lo + rank count, + count) then its tail [lo + world count, lo + n).
    size_t off = 0;
    for (int b = 0; b < t->n_buckets; b++) {
        bucket *k = &t->buckets[b];
        k->count = k->n / (size_t)t->world;
        k->shard_off = off;
        off += k->count + (k->n - k->count * (size_t)t->world);
    }
    t->n_shard = off;
    return TD_OK;
}

// The shard's pieces cut at tensor boundaries (each piece is one tensor's, for its decay flag).
static td_status plan_segs(td_trainer *t, td_err *err) {
    td_tmodel *tm = t->tm;
    const int nt = td_tmodel_n_tensors(tm);
    t->segs = calloc((size_t)(2 * t->n_buckets + 2) * (size_t)(nt + 1), sizeof *t->segs);
    if (!t->segs) return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    float *w = td_tmodel_params_buf(tm, NULL), *g = grads(t);
    for (int b = 0; b < t->n_buckets; b++) {
        const bucket *k = &t->buckets[b];
        const size_t pieces[2][2] = {{k->lo + (size_t)t->rank * k->count, k->count},
                                     {k->lo + k->count * (size_t)t->world, k->n - k->count * (size_t)t->world}};
        size_t state = k->shard_off;
        for (int pc = 0; pc < 2; pc++) {
            size_t lo = pieces[pc][0], len = pieces[pc][1];
            for (int i = 0; i < nt && len > 0; i++) {
                const td_tparam *tp = td_tmodel_tensor(tm, i);
                const size_t tlo = tp->offset, thi = tp->offset + (size_t)(tp->rows * tp->cols);
                if (thi <= lo || tlo >= lo + len) continue;
                const size_t a = lo > tlo ? lo : tlo, e = lo + len < thi ? lo + len : thi;
                t->segs[t->n_segs++] = (td_adamw_seg){
                    .w = w + a, .g = g + a, .state_off = state + (a - lo), .n = (int64_t)(e - a), .decay = tp->decay};
            }
            state += len;
        }
    }
    return TD_OK;
}

td_status td_trainer_create(td_tmodel *tm, const td_trainer_params *pp, td_trainer **out,
                            td_err *err) {
    *out = NULL;
    td_trainer_params p = pp ? *pp : td_trainer_default_params();
    if (!tm) return td_err_set(err, TD_ERR_INVALID, "trainer: no model");
    if (p.grad_accum < 1)
        return td_err_set(err, TD_ERR_INVALID, "trainer: grad_accum %d < 1", p.grad_accum);
    if (!(p.lr.max_lr >= 0.0f) || !(p.lr.min_lr >= 0.0f))
        return td_err_set(err, TD_ERR_INVALID, "trainer: learning rates must be >= 0");
    if (p.zero < 0 || p.zero > 2) return td_err_set(err, TD_ERR_INVALID, "trainer: zero stage %d is not 0, 1 or 2", p.zero);
    if (p.bucket_elems == 0) p.bucket_elems = TD_TRAINER_BUCKET_ELEMS;
    td_trainer *t = calloc(1, sizeof *t);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    t->tm = tm;
    t->p = p;
    t->comm = p.comm && td_comm_size(p.comm) > 1 ? p.comm : NULL;
    t->rank = t->comm ? td_comm_rank(t->comm) : 0;
    t->world = t->comm ? td_comm_size(t->comm) : 1;
    size_t n;
    td_tmodel_params_buf(tm, &n);
    td_backend *be = td_tmodel_backend(tm);
    td_status st;
    if (t->comm && !td_backend_is_host(be)) {
        st = td_err_set(err, TD_ERR_UNSUPPORTED,
                        "trainer: data parallelism over the %s backend needs a communicator for its memory "
                        "(the %s communicator moves host memory)", td_backend_name(be), td_comm_name(t->comm));
        td_trainer_free(t);
        return st;
    }
    const bool zero = t->comm && p.zero > 0;
    if ((st = plan_buckets(t, err)) || (zero && (st = plan_segs(t, err)))) {
        td_trainer_free(t);
        return st;
    }
    if ((st = td_adamw_create_on(be, zero ? t->n_shard : n, &p.adam, &t->opt, err))) {
        td_trainer_free(t);
        return st;
    }
    if (p.grad_accum > 1) {
        const size_t acc_n = zero && p.zero == 2 ? t->n_shard : n;
        if ((st = td_backend_alloc(be, (acc_n ? acc_n : 1) * sizeof(float), "trainer gradient accumulation", &t->b_acc, err))) {
            td_trainer_free(t);
            return st;
        }
        float *a = acc(t), *w0 = td_tmodel_params_buf(tm, NULL);
        if (zero) {  // the update reads the accumulator: ZeRO 1's full one, ZeRO 2's shard one
            for (int i = 0; i < t->n_segs; i++)
                t->segs[i].g = p.zero == 2 ? a + t->segs[i].state_off : a + (t->segs[i].w - w0);
        } else {  // one segment per tensor, reading the accumulator at the tensor's offset
            const int nt = td_tmodel_n_tensors(tm);
            if (!(t->segs = calloc((size_t)nt, sizeof *t->segs))) {
                td_trainer_free(t);
                return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
            }
            for (int i = 0; i < nt; i++) {
                const td_tparam *tp = td_tmodel_tensor(tm, i);
                t->segs[i] = (td_adamw_seg){.w = tp->data, .g = a + tp->offset, .state_off = tp->offset,
                                            .n = tp->rows * tp->cols, .decay = tp->decay};
            }
            t->n_segs = nt;
        }
    }
    const size_t part_bytes = (size_t)td_backend_n_slices(be) * sizeof(double);
    if ((st = td_backend_alloc(be, part_bytes, "trainer norm partials", &t->b_part, err))) {
        td_trainer_free(t);
        return st;
    }
    t->norm_part = td_buffer_is_host(t->b_part) ? t->b_part->base : malloc(part_bytes);
    if (zero) {
        t->bucket_ss = calloc((size_t)t->n_buckets * (size_t)t->world, sizeof(double));
        t->bucket_tail = calloc((size_t)t->n_buckets, sizeof(double));
    }
    if (!t->norm_part || (zero && (!t->bucket_ss || !t->bucket_tail))) {
        td_trainer_free(t);
        return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    }
    *out = t;
    return TD_OK;
}

void td_trainer_free(td_trainer *t) {
    if (!t) return;
    for (int i = 0; i < t->n_pending; i++) td_comm_wait(t->pending[i], 0, NULL);
    td_tmodel_set_grad_hook(t->tm, NULL, NULL);
    td_adamw_free(t->opt);
    if (t->b_part && t->norm_part != t->b_part->base) free(t->norm_part);
    td_buffer_free(t->b_part);
    td_buffer_free(t->b_acc);
    free(t->buckets);
    free(t->segs);
    free(t->bucket_ss);
    free(t->bucket_tail);
    free(t);
}

td_adamw *td_trainer_adamw(td_trainer *t) { return t->opt; }
long td_trainer_step_count(const td_trainer *t) { return td_adamw_step_count(t->opt); }

td_trainer_memory td_trainer_memory_of(const td_trainer *t) {
    size_t n;
    td_tmodel_params_buf(t->tm, &n);
    const bool bf = td_tmodel_get_params(t->tm).precision == TD_TRAIN_BF16;
    td_trainer_memory m = {.world = t->world, .zero = t->comm ? t->p.zero : 0, .n_params = n};
    m.params_bytes = n * sizeof(float) * (bf ? 2 : 1);  // f32 master weights (+ their bf16-rounded copy)
    m.grads_bytes = n * sizeof(float);
    m.accum_bytes = t->b_acc ? t->b_acc->size : 0;
    m.optim_bytes = 2 * td_adamw_size(t->opt) * sizeof(float);
    m.n_owned = t->comm && t->p.zero > 0 ? t->n_shard : n;
    return m;
}

// ---- communication within a step

static void comm_fail(td_trainer *t, td_status st, const td_err *e) {
    if (t->comm_st) return;
    t->comm_st = st;
    t->comm_err = *e;
}

static void post(td_trainer *t, td_status st, td_comm_req *r, const td_err *e) {
    if (st) {
        comm_fail(t, st, e);
        return;
    }
    if (t->n_pending == MAX_PENDING) {  // bound what is in flight: wait the oldest
        td_err e2 = {0};
        td_status s2 = td_comm_wait(t->pending[0], 0, &e2);
        if (s2) comm_fail(t, s2, &e2);
        memmove(t->pending, t->pending + 1, (size_t)(MAX_PENDING - 1) * sizeof *t->pending);
        t->n_pending--;
    }
    t->pending[t->n_pending++] = r;
}

// Lets the transport progress (non-blocking collectives move only inside calls) and drops the
// requests that are done.
static void poll_pending(td_trainer *t) {
    int k = 0;
    for (int i = 0; i < t->n_pending; i++) {
        bool done = false;
        td_err e = {0};
        td_status st = td_comm_test(t->pending[i], &done, &e);
        if (st) comm_fail(t, st, &e);
        if (!done) t->pending[k++] = t->pending[i];
    }
    t->n_pending = k;
}

static td_status wait_all(td_trainer *t, td_err *err) {
    const double t0 = td_now();
    for (int i = 0; i < t->n_pending; i++) {
        td_err e = {0};
        td_status st = td_comm_wait(t->pending[i], 0, &e);
        if (st) comm_fail(t, st, &e);
    }
    t->n_pending = 0;
    t->comm_wait_s += td_now() - t0;
    if (t->comm_st) {
        if (err) *err = t->comm_err;
        return t->comm_st;
    }
    return TD_OK;
}

// Bucket b's gradient (in buf, the full-size buffer being reduced) goes out.
static void reduce_bucket(td_trainer *t, const bucket *k, float *buf) {
    td_err e = {0};
    td_comm_req *r = NULL;
    t->comm_bytes += (double)k->n * sizeof(float);
    if (t->p.zero == 0) {
        td_status st = td_comm_iallreduce(t->comm, buf + k->lo, buf + k->lo, k->n, TD_COMM_F32, TD_COMM_SUM, &r, &e);
        post(t, st, r, &e);
        return;
    }
    float *blk = buf + k->lo;
    if (k->count > 0) {  // in place: this rank's block lands at blk + rank * count
        td_status st = td_comm_ireduce_scatter(t->comm, blk, blk + (size_t)t->rank * k->count, k->count, TD_COMM_F32,
                                               TD_COMM_SUM, &r, &e);
        post(t, st, r, &e);
    }
    const size_t tail = k->n - k->count * (size_t)t->world;
    if (tail > 0) {
        float *tp = blk + k->count * (size_t)t->world;
        td_status st = td_comm_iallreduce(t->comm, tp, tp, tail, TD_COMM_F32, TD_COMM_SUM, &r, &e);
        post(t, st, r, &e);
    }
}

// acc[dst, dst + n) = (k = 0) grads[src, src + n), else += it: one micro-batch folded in. Through
// the backend (a copy in its stream, its add slot), so it holds on a device backend too.
static void fold(td_trainer *t, size_t dst, size_t src, size_t n) {
    if (t->hook_k == 0)
        td_buffer_copy(t->b_acc, dst * sizeof(float), td_tmodel_grads_buffer(t->tm), src * sizeof(float),
                       n * sizeof(float));
    else
        td_backend_add(td_tmodel_backend(t->tm), acc(t) + dst, grads(t) + src, (int64_t)n);
}

static void grad_hook(void *ctx, size_t off, size_t n) {
    td_trainer *t = ctx;
    const bool last = t->hook_k == t->p.grad_accum - 1;
    const bool zero2 = t->comm && t->p.zero == 2;
    if (t->b_acc && !zero2) fold(t, off, off, n);
    t->hook_lo = off;
    if (!t->comm) return;
    poll_pending(t);
    if (!last && !zero2) return;
    float *buf = t->b_acc && !zero2 ? acc(t) : grads(t);
    while (t->next_bucket < t->n_buckets && t->buckets[t->next_bucket].lo >= off) {
        reduce_bucket(t, &t->buckets[t->next_bucket], buf);
        t->next_bucket++;
    }
}

// ZeRO 2 with accumulation: the owned elements of this micro-batch's reduced gradient folded into
// the shard-sized accumulator.
static void fold_shard(td_trainer *t) {
    for (int b = 0; b < t->n_buckets; b++) {
        const bucket *k = &t->buckets[b];
        const size_t tail = k->n - k->count * (size_t)t->world;
        const size_t src[2] = {k->lo + (size_t)t->rank * k->count, k->lo + k->count * (size_t)t->world};
        const size_t len[2] = {k->count, tail};
        size_t dst = k->shard_off;
        for (int pc = 0; pc < 2; pc++) {
            if (len[pc] == 0) continue;
            fold(t, dst, src[pc], len[pc]);
            dst += len[pc];
        }
    }
}

// Sum of squares of x[0, n) in double: the slot's partials added in slice order.
static double sumsq(td_trainer *t, const float *x, size_t n) {
    td_backend *be = td_tmodel_backend(t->tm);
    const td_sumsq_args sq = {.x = x, .n = (int64_t)n, .part = t->b_part->base};
    td_backend_sumsq(be, &sq);
    if (t->norm_part != t->b_part->base)  // a synchronous download of the partials
        td_buffer_get(t->b_part, 0, t->norm_part, (size_t)td_backend_n_slices(be) * sizeof(double));
    double ss = 0.0;  // the partials in slice order: the same total whatever the thread timing
    for (int i = 0; i < td_backend_n_slices(be); i++) ss += t->norm_part[i];
    return ss;
}

// The cross-entropy micro-batch of td_trainer_step.
typedef struct xent_micro {
    const int32_t *tokens, *targets;
    size_t N;
} xent_micro;

static td_status xent_micro_fn(void *ctx, int k, td_tmodel *tm, float dscale, double *loss_sum, td_err *err) {
    const xent_micro *x = ctx;
    td_status st = td_tmodel_forward(tm, x->tokens + k * x->N, x->targets + k * x->N, loss_sum, NULL, err);
    return st ? st : td_tmodel_backward(tm, dscale, err);
}

static td_status step_core(td_trainer *t, td_trainer_micro_fn fn, void *ctx, long count, td_status st,
                           td_step_stats *stats, td_err *err);

td_status td_trainer_step(td_trainer *t, const int32_t *tokens, const int32_t *targets,
                          td_step_stats *stats, td_err *err) {
    if (!t || !tokens || !targets)
        return td_err_set(err, TD_ERR_INVALID, "trainer: no tokens or targets");
    td_tmodel *tm = t->tm;
    const td_tmodel_params mp = td_tmodel_get_params(tm);
    const size_t N = (size_t)mp.batch * mp.seq_len;
    const int V = td_tmodel_config(tm)->vocab_size;
    const int K = t->p.grad_accum;
    long count = 0;
    td_status st = TD_OK;
    for (size_t i = 0; i < N * (size_t)K; i++) {
        if (tokens[i] < 0 || tokens[i] >= V || targets[i] < -1 || targets[i] >= V) {
            st = td_err_set(err, TD_ERR_INVALID, "trainer: token or target %zu is out of range", i);
            break;
        }
        count += targets[i] >= 0;
    }
    xent_micro x = {tokens, targets, N};
    return step_core(t, xent_micro_fn, &x, count, st, stats, err);
}

td_status td_trainer_step_with(td_trainer *t, td_trainer_micro_fn fn, void *ctx, long n_targets,
                               td_step_stats *stats, td_err *err) {
    if (!t || !fn) return td_err_set(err, TD_ERR_INVALID, "trainer: no micro-batch function");
    td_status st = n_targets < 0 ? td_err_set(err, TD_ERR_INVALID, "trainer: negative target count") : TD_OK;
    return step_core(t, fn, ctx, n_targets, st, stats, err);
}

// The step after the input checks: st is this rank's verdict on its input (its message in err),
// count its targets.
static td_status step_core(td_trainer *t, td_trainer_micro_fn fn, void *ctx, long count, td_status st,
                           td_step_stats *stats, td_err *err) {
    td_tmodel *tm = t->tm;
    const int K = t->p.grad_accum;
    if (t->comm) {  // every rank learns the global count (and whether a rank's input was bad)
        int64_t v[2] = {st ? 1 : 0, count}, r[2];
        td_err e = {0};
        td_status cs = td_comm_allreduce(t->comm, v, r, 2, TD_COMM_I64, TD_COMM_SUM, &e);
        if (cs) {
            if (!st) *err = e;
            return st ? st : cs;
        }
        if (!st && r[0]) return td_err_set(err, TD_ERR_INVALID, "trainer: another rank's tokens or targets are out of range");
        count = (long)r[1];
    }
    if (st) return st;
    if (count == 0) return td_err_set(err, TD_ERR_INVALID, "trainer: the step has no targets");

    size_t n;
    float *g = td_tmodel_grads_buf(tm, &n);
    td_backend *be = td_tmodel_backend(tm);
    const bool hooked = t->comm || t->b_acc;
    if (hooked) td_tmodel_set_grad_hook(tm, grad_hook, t);
    t->comm_st = TD_OK;
    t->comm_wait_s = 0;
    t->comm_bytes = 0;
    double loss_sum = 0.0;
    for (int k = 0; k < K; k++) {
        double s = 0.0;
        td_tmodel_zero_grad(tm);
        t->hook_k = k;
        t->next_bucket = 0;
        if ((st = fn(ctx, k, tm, (float)(1.0 / (double)count), &s, err))) {
            if (hooked) td_tmodel_set_grad_hook(tm, NULL, NULL);
            if (t->comm) {  // the others would wait for this rank's reductions: fail them now
                td_comm_abort(t->comm, err->msg);
                wait_all(t, NULL);
            }
            return st;
        }
        loss_sum += s;
        if (t->comm && t->p.zero == 2) {
            if ((st = wait_all(t, err))) break;
            if (t->b_acc) fold_shard(t);
        }
    }
    if (hooked) td_tmodel_set_grad_hook(tm, NULL, NULL);
    if (!st && t->comm) st = wait_all(t, err);
    if (!st && t->comm) {
        td_err e = {0};
        st = td_comm_allreduce(t->comm, &loss_sum, &loss_sum, 1, TD_COMM_F64, TD_COMM_SUM, &e);
        if (st) *err = e;
    }
    if (st) return st;

    const bool zero = t->comm && t->p.zero > 0;
    // The gradient the update reads: the accumulator, or this micro-batch's buffer.
    float *fg = t->b_acc && !(zero && t->p.zero == 2) ? acc(t) : g;
    double ss = 0.0;
    if (!zero) {
        ss = sumsq(t, fg, n);
    } else {
        // Owned sums of squares, gathered, added in (bucket, rank) order; tails (the same on every
        // rank) once per bucket.
        const float *src = t->b_acc && t->p.zero == 2 ? acc(t) : NULL;  // the shard accumulator
        const float *full = t->b_acc && t->p.zero == 1 ? acc(t) : g;        // else a full-size gradient
        double *mine = t->bucket_ss + (size_t)t->rank * t->n_buckets;
        for (int b = 0; b < t->n_buckets; b++) {
            const bucket *k = &t->buckets[b];
            const size_t tail = k->n - k->count * (size_t)t->world;
            const float *blk = src ? src + k->shard_off : full + k->lo + (size_t)t->rank * k->count;
            const float *tl = src ? src + k->shard_off + k->count : full + k->lo + k->count * (size_t)t->world;
            mine[b] = k->count ? sumsq(t, blk, k->count) : 0.0;
            t->bucket_tail[b] = tail ? sumsq(t, tl, tail) : 0.0;
        }
        td_err e = {0};
        if ((st = td_comm_allgather(t->comm, mine, t->bucket_ss, (size_t)t->n_buckets, TD_COMM_F64, &e))) {
            *err = e;
            return st;
        }
        for (int b = 0; b < t->n_buckets; b++) {
            for (int r = 0; r < t->world; r++) ss += t->bucket_ss[(size_t)r * t->n_buckets + b];
            ss += t->bucket_tail[b];
        }
    }
    const double norm = sqrt(ss);
    const long step = td_adamw_step_count(t->opt);
    const float lr = td_lr_at(&t->p.lr, step);
    if (stats)
        *stats = (td_step_stats){.loss = loss_sum / count,
                                 .grad_norm = norm,
                                 .lr = lr,
                                 .step = step,
                                 .n_targets = count,
                                 .world_size = t->world,
                                 .comm_wait_s = t->comm_wait_s,
                                 .comm_bytes = t->comm_bytes};
    if (!isfinite(norm))  // a NaN/inf gradient would poison the weights and both moments
        return td_err_set(err, TD_ERR_INVALID,
                          "trainer: the gradient norm is not finite at step %ld; no update", step);
    const double coef = t->p.grad_clip > 0.0f ? t->p.grad_clip / (norm + 1e-6) : 1.0;  // as torch's clip_grad_norm_
    if (!zero) {
        if (coef < 1.0) {
            const td_scale_args sc = {.x = fg, .n = (int64_t)n, .s = (float)coef};
            td_backend_scale(be, &sc);
        }
        if (fg == g)
            td_adamw_update(t->opt, td_tmodel_tensor(tm, 0), td_tmodel_n_tensors(tm), lr, be);
        else  // the accumulator in the gradient's place (segments made at create)
            td_adamw_update_segs(t->opt, t->segs, t->n_segs, lr, be);
        return TD_OK;
    }
    // ZeRO: scale and update the owned elements, then gather every rank's updated blocks.
    if (coef < 1.0)
        for (int i = 0; i < t->n_segs; i++) {
            const td_scale_args sc = {.x = (float *)t->segs[i].g, .n = t->segs[i].n, .s = (float)coef};
            td_backend_scale(be, &sc);
        }
    td_adamw_update_segs(t->opt, t->segs, t->n_segs, lr, be);
    float *w = td_tmodel_params_buf(tm, NULL);
    for (int b = 0; b < t->n_buckets; b++) {
        const bucket *k = &t->buckets[b];
        if (!k->count) continue;
        td_err e = {0};
        td_comm_req *r = NULL;
        st = td_comm_iallgather(t->comm, w + k->lo + (size_t)t->rank * k->count, w + k->lo, k->count, TD_COMM_F32, &r, &e);
        post(t, st, r, &e);
        t->comm_bytes += (double)k->count * (size_t)t->world * sizeof(float);
    }
    st = wait_all(t, err);
    if (stats) stats->comm_bytes = t->comm_bytes, stats->comm_wait_s = t->comm_wait_s;
    return st;
}

// ---- the optimizer state in parameter order (checkpoints)

bool td_trainer_sharded(const td_trainer *t) { return t->comm && t->p.zero > 0; }

void td_trainer_state_from_full(td_trainer *t, const float *m, const float *v) {
    td_adamw *o = t->opt;
    float *sm = td_adamw_host_m(o), *sv = td_adamw_host_v(o);
    if (!td_trainer_sharded(t)) {
        memcpy(sm, m, td_adamw_size(o) * sizeof(float));
        memcpy(sv, v, td_adamw_size(o) * sizeof(float));
    } else {
        for (int b = 0; b < t->n_buckets; b++) {
            const bucket *k = &t->buckets[b];
            const size_t tail = k->n - k->count * (size_t)t->world, blk = k->lo + (size_t)t->rank * k->count;
            memcpy(sm + k->shard_off, m + blk, k->count * sizeof(float));
            memcpy(sv + k->shard_off, v + blk, k->count * sizeof(float));
            memcpy(sm + k->shard_off + k->count, m + k->lo + k->count * (size_t)t->world, tail * sizeof(float));
            memcpy(sv + k->shard_off + k->count, v + k->lo + k->count * (size_t)t->world, tail * sizeof(float));
        }
    }
    td_adamw_state_from_host(o);
}

int td_trainer_ckpt_pieces(td_trainer *t, td_ckpt_piece *out, int cap) {
    td_adamw *o = t->opt;
    td_adamw_state_to_host(o);
    td_tmodel_params_to_host(t->tm);
    const float *w = td_tmodel_host_params(t->tm, NULL), *m = td_adamw_host_m(o), *v = td_adamw_host_v(o);
    const bool sharded = td_trainer_sharded(t);
    int n = 0;
    for (int b = 0; b < t->n_buckets; b++) {
        const bucket *k = &t->buckets[b];
        const size_t count = k->n / (size_t)t->world, tail = k->n - count * (size_t)t->world;
        const size_t blk = k->lo + (size_t)t->rank * count, tl = k->lo + count * (size_t)t->world;
        // The block this rank owns (its shard's state under ZeRO; the same region of the full
        // state otherwise), and the tail once, from rank 0.
        if (count && n < cap)
            out[n++] = (td_ckpt_piece){.off = blk, .n = count, .p = w + blk,
                                       .m = sharded ? m + k->shard_off : m + blk, .v = sharded ? v + k->shard_off : v + blk};
        if (tail && t->rank == 0 && n < cap)
            out[n++] = (td_ckpt_piece){.off = tl, .n = tail, .p = w + tl,
                                       .m = sharded ? m + k->shard_off + count : m + tl,
                                       .v = sharded ? v + k->shard_off + count : v + tl};
    }
    return n;
}

int td_trainer_grad_accum(const td_trainer *t) { return t->p.grad_accum; }
