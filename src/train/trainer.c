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
// accumulation needs no full-size buffer; and with the gradient ring (plan_grads) the model has
// no full-size gradient buffer either: backward writes each bucket into one of a few bucket-sized
// buffers, the bucket's reduce-scatter takes this rank's block from there into the gradient
// shard, and the buffer takes the next bucket but n_slots once that reduction is done. The
// buckets, the values and the reduction order are those of the full-size buffer, so the bits are
// too, except for a tied embedding: cut into pieces along rows, each written twice (the head's
// part at the start of backward, the embedding's at the end), whose two parts are reduced
// separately and added ((sum h) + (sum e) against one process's sum (h + e): f32 regrouping).
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
    size_t lo, n;     // elements [lo, lo + n) of the gradient layout
    size_t count;     // ZeRO: the block each rank owns (n / world)
    size_t shard_off; // ZeRO: where this bucket's block (then its tail) starts in the shard state
    // ZeRO 2: where the reduced block and tail this rank keeps lie (elements of own): in place in
    // the full-size gradient buffer or the tied buffer, else out of place in the gradient shard.
    td_buffer *own;
    size_t own_blk, own_tail;
    int slot;         // ZeRO 2's ring: the ring buffer this bucket is written in (-1: none)
    // A piece of a tied embedding (td_tmodel_set_tied_split): written twice per backward, the
    // head's contribution in ring buffer slot_h (reduced into the shard), then the embedding's in
    // slot (reduced in place there, then added to the shard).
    bool tied;
    int slot_h;
} bucket;

typedef struct pending_req {
    td_comm_req *r;
    int slot;    // the ring buffer it reads (-1: none)
    int bucket;  // the bucket it reduces (-1: none)
} pending_req;

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
    // ZeRO 2 over N > 1 with the ring (ringed): the model has no gradient buffer; backward writes
    // each bucket into a ring buffer (the i-th bucket written in this backward into b_slot[i %
    // n_slots], each as large as the largest bucket it takes); the reduction takes the owned
    // elements into b_gshard. A tied embedding is cut into pieces along rows (the last n_tied
    // buckets), each written twice (bucket.tied).
    bool ringed;
    int n_slots, n_tied;
    td_buffer **b_slot;  // [n_slots]
    td_buffer *b_gshard; // [every bucket's block and tail]
    float **bk_store;    // [n_buckets] each bucket's storage (element lo) in this backward, or NULL
    unsigned char *bk_phase;  // [n_buckets] a tied piece in this backward: 1, 2 its head part handed out,
                              // reduced; 3, 4 its embedding part handed out, reduced
    int slot_add[TD_TRAINER_MAX_RING];  // the tied piece whose embedding part, reduced in the slot,
                                        // is still to be added to the shard (-1: none)
    // Within one step.
    pending_req pending[MAX_PENDING];
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
static float *own_blk(const bucket *k) { return (float *)k->own->base + k->own_blk; }
static float *own_tail(const bucket *k) { return (float *)k->own->base + k->own_tail; }
static td_status ring_store(void *ctx, size_t off, size_t n, float **out, td_err *err);
static void plan_shard(td_trainer *t);

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
            t->buckets[t->n_buckets++] = (bucket){.lo = starts[i], .n = hi - starts[i], .slot = -1};
            hi = starts[i];
        }
    }
    free(starts);
    plan_shard(t);
    return TD_OK;
}

// The shard: bucket b's block [lo + rank count, + count) then its tail [lo + world count, lo + n).
static void plan_shard(td_trainer *t) {
    size_t off = 0;
    for (int b = 0; b < t->n_buckets; b++) {
        bucket *k = &t->buckets[b];
        k->count = k->n / (size_t)t->world;
        k->shard_off = off;
        off += k->count + (k->n - k->count * (size_t)t->world);
    }
    t->n_shard = off;
}

// ZeRO 2 over N > 1: where gradients live. The ring (p.grad_ring > 0 slots; 0: 2 slots where that
// holds fewer bytes than the full-size buffer, else the full-size buffer; < 0: the full-size
// buffer): the i-th bucket backward writes in ring buffer i % n_slots, each bucket's reduced block
// and tail in the gradient shard, and the model's full-size gradient buffer freed
// (td_tmodel_set_grad_store). A tied embedding ([0, emb_n) of the last bucket) is cut into pieces
// of rows rows, each a bucket (td_tmodel_set_tied_split), so that no buffer holds the whole table:
// the pieces are written first (the head's part), then the other buckets, then the pieces again
// (the embedding's part). rows: the largest other bucket less one row (the scratch row of the
// embedding's part), or bucket_elems' rows. Without the ring the reduction is in place in the
// full-size buffer, as under ZeRO 1.
static td_status plan_grads(td_trainer *t, td_err *err) {
    td_tmodel *tm = t->tm;
    size_t n;
    float *g = td_tmodel_grads_buf(tm, &n);
    const td_model_config *c = td_tmodel_config(tm);
    const bool tied = c->tie_embeddings && t->p.grad_ring >= 0;
    const size_t D = (size_t)c->dim, emb_n = td_tmodel_find(tm, "model.layers.0.input_layernorm.weight")->offset;
    const bucket last = t->buckets[t->n_buckets - 1];
    // The buckets other than the tied pieces: all but the last, and the last's part above the table.
    const int n_ring = t->n_buckets - (tied ? 1 : 0) + (tied && last.n > emb_n ? 1 : 0);
    size_t max_n = 0;
    for (int b = 0; b < n_ring; b++) {
        const size_t bn = b < t->n_buckets - 1 || !tied ? t->buckets[b].n : last.n - emb_n;
        if (bn > max_n) max_n = bn;
    }
    size_t target = max_n >= 2 * D ? max_n : (t->p.bucket_elems > 2 * D ? t->p.bucket_elems : 2 * D);
    size_t rows = target / D - 1;
    if (rows > (size_t)c->vocab_size) rows = (size_t)c->vocab_size;
    const int n_tied = tied ? (int)(((size_t)c->vocab_size + rows - 1) / rows) : 0;
    const int nb = n_ring + n_tied;
    bucket *bk = calloc((size_t)nb, sizeof *bk);
    if (!bk) return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    for (int b = 0; b < n_ring; b++) {
        bk[b] = b < t->n_buckets - 1 || !tied ? t->buckets[b] : (bucket){.lo = emb_n, .n = last.n - emb_n};
        bk[b].slot = -1;
    }
    for (int i = 0; i < n_tied; i++) {  // descending rows, the last piece first
        const size_t r0 = (size_t)(n_tied - 1 - i) * rows, left = (size_t)c->vocab_size - r0;
        const size_t nr = left < rows ? left : rows;
        bk[n_ring + i] = (bucket){.lo = r0 * D, .n = nr * D, .slot = -1, .slot_h = -1, .tied = true};
    }
    // The ring: backward writes the pieces (their head part), the other buckets, the pieces again.
    int slots = t->p.grad_ring > 0 ? t->p.grad_ring : 2;
    if (slots > n_ring + 2 * n_tied) slots = n_ring + 2 * n_tied;
    size_t slot_n[TD_TRAINER_MAX_RING] = {0}, total = 0;
    int ev = 0;
    for (int i = 0; i < n_tied; i++, ev++) {
        bucket *k = &bk[n_ring + i];
        k->slot_h = ev % slots;
        if (k->n > slot_n[k->slot_h]) slot_n[k->slot_h] = k->n;
    }
    for (int b = 0; b < nb; b++, ev++) {
        bucket *k = &bk[b];
        k->slot = ev % slots;
        const size_t need = k->n + (k->tied ? D : 0);  // the embedding part's scratch row
        if (need > slot_n[k->slot]) slot_n[k->slot] = need;
    }
    for (int i = 0; i < slots; i++) total += slot_n[i];
    size_t shard_n = 0;
    for (int b = 0; b < nb; b++) shard_n += bk[b].n - bk[b].n / (size_t)t->world * (size_t)(t->world - 1);
    total += shard_n;
    t->ringed = t->p.grad_ring > 0 || (t->p.grad_ring == 0 && total < n);
    if (t->ringed) {  // the buckets become the ring's
        free(t->buckets);
        t->buckets = bk, t->n_buckets = nb, t->n_tied = n_tied;
        plan_shard(t);
    } else {
        free(bk);
    }
    const int nbk = t->n_buckets;
    if (!(t->bk_store = calloc((size_t)nbk, sizeof *t->bk_store)) || !(t->bk_phase = calloc((size_t)nbk, 1)))
        return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    for (int i = 0; i < TD_TRAINER_MAX_RING; i++) t->slot_add[i] = -1;
    if (!t->ringed) {  // in place in the full-size buffer
        for (int b = 0; b < nbk; b++) {
            bucket *k = &t->buckets[b];
            k->own = td_tmodel_grads_buffer(tm);
            k->own_blk = k->lo + (size_t)t->rank * k->count, k->own_tail = k->lo + k->count * (size_t)t->world;
            t->bk_store[b] = g + k->lo;
        }
        return TD_OK;
    }
    td_backend *be = td_tmodel_backend(tm);
    td_status st;
    if (!(t->b_slot = calloc((size_t)(slots ? slots : 1), sizeof *t->b_slot)))
        return td_err_set(err, TD_ERR_NOMEM, "trainer: out of memory");
    for (int i = 0; i < slots; i++, t->n_slots++)
        if ((st = td_backend_alloc(be, slot_n[i] * sizeof(float), "trainer gradient ring", &t->b_slot[i], err)))
            return st;
    if ((st = td_backend_alloc(be, (shard_n ? shard_n : 1) * sizeof(float), "trainer gradient shard", &t->b_gshard,
                               err)))
        return st;
    size_t off = 0;
    for (int b = 0; b < nbk; b++) {
        bucket *k = &t->buckets[b];
        k->own = t->b_gshard, k->own_blk = off, k->own_tail = off + k->count;
        off += k->n - k->count * (size_t)(t->world - 1);
    }
    if ((st = td_tmodel_set_grad_store(tm, ring_store, t, err))) return st;
    return td_tmodel_set_tied_split(tm, n_tied ? (int)rows : 0, err);
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
        // The gradient each piece's update reads: ZeRO 2's reduced owned elements, or ZeRO 1's
        // full-size buffer at the piece.
        float *gp[2] = {t->p.zero == 2 ? own_blk(k) : g + pieces[0][0], t->p.zero == 2 ? own_tail(k) : g + pieces[1][0]};
        size_t state = k->shard_off;
        for (int pc = 0; pc < 2; pc++) {
            size_t lo = pieces[pc][0], len = pieces[pc][1];
            for (int i = 0; i < nt && len > 0; i++) {
                const td_tparam *tp = td_tmodel_tensor(tm, i);
                const size_t tlo = tp->offset, thi = tp->offset + (size_t)(tp->rows * tp->cols);
                if (thi <= lo || tlo >= lo + len) continue;
                const size_t a = lo > tlo ? lo : tlo, e = lo + len < thi ? lo + len : thi;
                t->segs[t->n_segs++] = (td_adamw_seg){
                    .w = w + a, .g = gp[pc] + (a - lo), .state_off = state + (a - lo), .n = (int64_t)(e - a), .decay = tp->decay};
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
    if (!td_tmodel_grads_bytes(tm))  // another trainer's ring holds them (or their restoration failed)
        return td_err_set(err, TD_ERR_INVALID, "trainer: the model has no gradient buffer (is another trainer using it?)");
    if (p.grad_ring > TD_TRAINER_MAX_RING)
        return td_err_set(err, TD_ERR_INVALID, "trainer: a gradient ring of %d buffers (at most %d)", p.grad_ring,
                          TD_TRAINER_MAX_RING);
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
    if ((st = plan_buckets(t, err)) || (zero && p.zero == 2 && (st = plan_grads(t, err))) ||
        (zero && (st = plan_segs(t, err)))) {
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
    for (int i = 0; i < t->n_pending; i++) td_comm_wait(t->pending[i].r, 0, NULL);
    td_tmodel_set_grad_hook(t->tm, NULL, NULL);
    for (int i = 0; i < t->n_slots; i++) td_buffer_free(t->b_slot[i]);
    free(t->b_slot);
    td_buffer_free(t->b_gshard);
    free(t->bk_store);
    free(t->bk_phase);
    td_adamw_free(t->opt);
    if (t->b_part && t->norm_part != t->b_part->base) free(t->norm_part);
    td_buffer_free(t->b_part);
    td_buffer_free(t->b_acc);
    free(t->buckets);
    free(t->segs);
    free(t->bucket_ss);
    free(t->bucket_tail);
    if (t->ringed) {  // the model gets its full-size gradient buffer back, once the rest is freed
        td_err e = {0};
        td_tmodel_set_tied_split(t->tm, 0, &e);
        if (td_tmodel_set_grad_store(t->tm, NULL, NULL, &e))
            TD_LOGW("trainer: the model's gradient buffer could not be restored: %s", e.msg);
    }
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
    m.ring_slots = t->ringed ? t->n_slots : 0;
    for (int i = 0; i < t->n_slots; i++) m.grads_ring_bytes += t->b_slot[i]->size;
    m.grads_shard_bytes = t->b_gshard ? t->b_gshard->size : 0;
    m.grads_bytes = td_tmodel_grads_bytes(t->tm) + m.grads_ring_bytes + m.grads_shard_bytes;
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

// A posted request; slot: the ring buffer it reads (-1: none), which is not reused before it is done.
static void post(td_trainer *t, td_status st, td_comm_req *r, const td_err *e, int slot, int bucket) {
    if (st) {
        comm_fail(t, st, e);
        return;
    }
    if (t->n_pending == MAX_PENDING) {  // bound what is in flight: wait the oldest
        td_err e2 = {0};
        td_status s2 = td_comm_wait(t->pending[0].r, 0, &e2);
        if (s2) comm_fail(t, s2, &e2);
        memmove(t->pending, t->pending + 1, (size_t)(MAX_PENDING - 1) * sizeof *t->pending);
        t->n_pending--;
    }
    t->pending[t->n_pending++] = (pending_req){r, slot, bucket};
}

// Lets the transport progress (non-blocking collectives move only inside calls) and drops the
// requests that are done.
static void poll_pending(td_trainer *t) {
    int k = 0;
    for (int i = 0; i < t->n_pending; i++) {
        bool done = false;
        td_err e = {0};
        td_status st = td_comm_test(t->pending[i].r, &done, &e);
        if (st) comm_fail(t, st, &e);
        if (!done) t->pending[k++] = t->pending[i];
    }
    t->n_pending = k;
}

static td_status wait_all(td_trainer *t, td_err *err) {
    const double t0 = td_now();
    for (int i = 0; i < t->n_pending; i++) {
        td_err e = {0};
        td_status st = td_comm_wait(t->pending[i].r, 0, &e);
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

// Waits (with the communicator's deadline) for the requests that read ring buffer slot (so that
// the next bucket may be written there), or (slot < 0) that reduce bucket.
static td_status wait_slot(td_trainer *t, int slot, int bucket, td_err *err) {
    const double t0 = td_now();
    int k = 0;
    for (int i = 0; i < t->n_pending; i++) {
        if (slot >= 0 ? t->pending[i].slot != slot : t->pending[i].bucket != bucket) {
            t->pending[k++] = t->pending[i];
            continue;
        }
        td_err e = {0};
        td_status st = td_comm_wait(t->pending[i].r, 0, &e);
        if (st) comm_fail(t, st, &e);
    }
    t->n_pending = k;
    t->comm_wait_s += td_now() - t0;
    if (t->comm_st) {
        if (err) *err = t->comm_err;
        return t->comm_st;
    }
    return TD_OK;
}

// Bucket b's gradient (from buf, its element lo: in the full-size buffer being reduced, or ZeRO
// 2's storage of it, ring buffer slot) goes out; in_place: the owned elements stay in buf (a tied
// piece's embedding part, added to the shard later).
static void reduce_bucket(td_trainer *t, int b, float *buf, int slot, bool in_place) {
    const bucket *k = &t->buckets[b];
    td_err e = {0};
    td_comm_req *r = NULL;
    t->comm_bytes += (double)k->n * sizeof(float);
    if (t->p.zero == 0) {
        td_status st = td_comm_iallreduce(t->comm, buf, buf, k->n, TD_COMM_F32, TD_COMM_SUM, &r, &e);
        post(t, st, r, &e, -1, b);
        return;
    }
    // Rank r's block lands at buf + r count (in place: ZeRO 1, ZeRO 2's full-size buffer) or in
    // the gradient shard (ZeRO 2's ring); the tail likewise.
    const bool z2 = t->p.zero == 2 && !in_place;
    const size_t tail = k->n - k->count * (size_t)t->world;
    if (k->count > 0) {
        float *dst = z2 ? own_blk(k) : buf + (size_t)t->rank * k->count;
        td_status st = td_comm_ireduce_scatter(t->comm, buf, dst, k->count, TD_COMM_F32, TD_COMM_SUM, &r, &e);
        post(t, st, r, &e, slot, b);
    }
    if (tail > 0) {
        float *tp = buf + k->count * (size_t)t->world, *dst = z2 ? own_tail(k) : tp;
        td_status st = td_comm_iallreduce(t->comm, tp, dst, tail, TD_COMM_F32, TD_COMM_SUM, &r, &e);
        post(t, st, r, &e, slot, b);
    }
}

// acc[dst, dst + n) = (k = 0) src[off, off + n), else += it: one micro-batch folded in. Through
// the backend (a copy in its stream, its add slot), so it holds on a device backend too.
static void fold(td_trainer *t, size_t dst, td_buffer *src, size_t off, size_t n) {
    if (t->hook_k == 0)
        td_buffer_copy(t->b_acc, dst * sizeof(float), src, off * sizeof(float), n * sizeof(float));
    else
        td_backend_add(td_tmodel_backend(t->tm), acc(t) + dst, (float *)src->base + off, (int64_t)n);
}

static void grad_hook(void *ctx, size_t off, size_t n) {
    td_trainer *t = ctx;
    const bool last = t->hook_k == t->p.grad_accum - 1;
    const bool zero2 = t->comm && t->p.zero == 2;
    if (t->b_acc && !zero2) fold(t, off, td_tmodel_grads_buffer(t->tm), off, n);
    t->hook_lo = off;
    if (!t->comm) return;
    poll_pending(t);
    if (!last && !zero2) return;
    const int n_swept = t->n_buckets - t->n_tied;
    if (t->n_tied && off < t->buckets[n_swept].lo + t->buckets[n_swept].n) {  // a tied piece, once written
        int b = n_swept;
        while (b < t->n_buckets - 1 && t->buckets[b].lo != off) b++;
        const bucket *k = &t->buckets[b];
        if (t->bk_phase[b] == 1) {  // the head's part: into the shard
            reduce_bucket(t, b, t->bk_store[b], k->slot_h, false);
            t->bk_phase[b] = 2;
        } else if (t->bk_phase[b] == 3) {  // the embedding's part: in place, added once reduced
            reduce_bucket(t, b, t->bk_store[b], k->slot, true);
            t->bk_phase[b] = 4;
            t->slot_add[k->slot] = b;
        }
        return;
    }
    while (t->next_bucket < n_swept && t->buckets[t->next_bucket].lo >= off) {
        const int b = t->next_bucket++;
        // ZeRO 2: where backward wrote the bucket; else the full-size buffer being reduced.
        float *buf = zero2 ? t->bk_store[b] : (t->b_acc ? acc(t) : grads(t)) + t->buckets[b].lo;
        reduce_bucket(t, b, buf, t->buckets[b].slot, false);
    }
}

// The tied piece whose embedding part was reduced in ring buffer slot: once its reductions (both
// parts) are done, its owned elements are added to the shard (sum of the head parts + sum of the
// embedding parts), and the slot is free.
static td_status add_tied(td_trainer *t, int slot, td_err *err) {
    const int b = t->slot_add[slot];
    if (b < 0) return TD_OK;
    t->slot_add[slot] = -1;
    td_status st = wait_slot(t, -1, b, err);
    if (st) return st;
    const bucket *k = &t->buckets[b];
    const size_t tail = k->n - k->count * (size_t)t->world;
    const float *src = (const float *)t->b_slot[slot]->base;
    td_backend *be = td_tmodel_backend(t->tm);
    if (k->count) td_backend_add(be, own_blk(k), src + (size_t)t->rank * k->count, (int64_t)k->count);
    if (tail) td_backend_add(be, own_tail(k), src + k->count * (size_t)t->world, (int64_t)tail);
    t->bk_phase[b] = 5;
    return TD_OK;
}

// ZeRO 2's grad store (td_tmodel_set_grad_store) with the ring: the storage of range [off, off +
// n) is its bucket's, handed out at the bucket's first range in this backward: the tied buffer,
// or the bucket's ring buffer once the reductions still reading it (the bucket n_slots earlier)
// are done; zeroed.
static td_status ring_store(void *ctx, size_t off, size_t n, float **out, td_err *err) {
    td_trainer *t = ctx;
    int b = 0;
    while (b < t->n_buckets - 1 && t->buckets[b].lo > off) b++;  // descending lo; the last has lo 0
    const bucket *k = &t->buckets[b];
    TD_ASSERT(off >= k->lo && off + n <= k->lo + k->n);
    // A tied piece: its head part first (slot_h), then, once that is reduced, its embedding part.
    const int phase = k->tied ? t->bk_phase[b] : 0;
    if (!t->bk_store[b] || (k->tied && phase == 2)) {
        const int slot = k->tied && phase == 0 ? k->slot_h : k->slot;
        td_buffer *buf = t->b_slot[slot];
        td_status st = wait_slot(t, slot, -1, err);
        if (!st) st = add_tied(t, slot, err);
        if (st) return st;
        td_buffer_clear(buf, 0);
        t->bk_store[b] = buf->base;
        if (k->tied) t->bk_phase[b] = phase == 0 ? 1 : 3;
    }
    *out = t->bk_store[b] + (off - k->lo);
    return TD_OK;
}

// ZeRO 2 with accumulation: the owned elements of this micro-batch's reduced gradient folded into
// the shard-sized accumulator.
static void fold_shard(td_trainer *t) {
    for (int b = 0; b < t->n_buckets; b++) {
        const bucket *k = &t->buckets[b];
        const size_t tail = k->n - k->count * (size_t)t->world;
        if (k->count) fold(t, k->shard_off, k->own, k->own_blk, k->count);
        if (tail) fold(t, k->shard_off + k->count, k->own, k->own_tail, tail);
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
        if (t->ringed) {  // handed out afresh
            memset(t->bk_store, 0, (size_t)t->n_buckets * sizeof *t->bk_store);
            memset(t->bk_phase, 0, (size_t)t->n_buckets);
            for (int i = 0; i < TD_TRAINER_MAX_RING; i++) t->slot_add[i] = -1;
        }
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
            for (int i = 0; i < t->n_slots && !st; i++) st = add_tied(t, i, err);
            if (st) break;
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
            const float *blk, *tl;  // this rank's reduced block and the tail
            if (src)
                blk = src + k->shard_off, tl = src + k->shard_off + k->count;
            else if (t->p.zero == 2)  // where the reduction left them
                blk = own_blk(k), tl = own_tail(k);
            else
                blk = full + k->lo + (size_t)t->rank * k->count, tl = full + k->lo + k->count * (size_t)t->world;
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
        post(t, st, r, &e, -1, -1);
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
