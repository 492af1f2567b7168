// Data-parallel training against one rank, in one process: N ranks (threads over the in-process
// communicator, comm_local) each with its own model and CPU backend, one micro-batch of B/N
// sequences per rank per step, against one rank accumulating the same N micro-batches in the same
// order. Accumulation folds separately computed gradients ((g_0 + g_1) + g_2 ...) and every
// reduction folds in rank order, so the losses and the weights after several steps must be equal
// BIT FOR BIT, for plain DP (all-reduce), ZeRO-1 and ZeRO-2, at N = 2, 3 and 4, with buckets small
// enough that a step has several, clipping active, and BF16 too. The gradient norm differs only in
// how its double sum is grouped (by bucket and rank): within 1e-12 relative. With two micro-batches
// per rank the fold order differs from one rank's ((g_0 + g_1) + (g_2 + g_3) vs ((g_0 + g_1) + g_2)
// + g_3): f32 reassociation of a few terms, so weights after the steps agree to 1e-5 (a tenth of an
// update at lr 1e-3 ... measured ~1e-7). ZeRO's memory: the optimizer state is the shard's.
// ZeRO-2's gradient ring (grad_ring): the same bits as one rank untied (N = 2, 4, rings of 1 and
// 2) and, at 2 micro-batches per rank, as ZeRO-2 through the full-size buffer; tied (N = 2, 3, 4,
// BF16, through td_trainer_step_with too), within test_ring's derived tolerance, since the tied
// embedding's two gradient parts are reduced separately; the model's gradient buffer freed and given back; the
// gradient bytes equal to the formula and shrinking with N; the default taking the ring only where
// it is smaller; a stalled peer failing the ring's wait at the deadline.
// The same equivalence over MPI processes: test_train_mpi.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "test_util.h"
#include "train/model_train.h"
#include "train/trainer.h"

enum { B = 8, T = 16, STEPS = 3, MAXR = 4 };  // B: the global batch (sequences per step)

static td_model_config config(int tied) {
    td_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = TD_ARCH_LLAMA;
    c.vocab_size = 61, c.dim = 32, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 8;
    c.ffn_dim = 48, c.max_pos = 64, c.norm_eps = 1e-5f, c.rope_theta = 10000.0f;
    c.rope_style = TD_ROPE_NEOX, c.rope_scaling = TD_ROPE_SCALING_NONE, c.bos_id = -1;
    c.qkv_bias = 1;
    c.tie_embeddings = tied != 0;
    return c;
}

// Tokens and targets of global step s, sequence q (of B per step): a fixed pseudo-random stream.
static void sequence(int s, int q, int32_t *tok, int32_t *tgt) {
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(s * 131 + q + 1);
    for (int i = 0; i < T; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        tok[i] = (int32_t)(x % 61);
        tgt[i] = (i % 7 == 5) ? -1 : (int32_t)((x >> 20) % 61);
    }
}

typedef struct run {
    int world, rank, zero, accum, bf16;  // accum: micro-batches per rank per step
    int ring, tied;                      // td_trainer_params.grad_ring; tied embeddings
    int stall_ms;                        // > 0: rank 1 sleeps this long before its first backward
    int with;                            // 1: steps through td_trainer_step_with (RL's entry)
    int timeout_ms;                      // > 0: the communicator's deadline
    int bad_rank;                        // >= 0: that rank's step 1 has an out-of-range token
    size_t bucket;
    td_comm *comm;
    double loss[STEPS], norm[STEPS];
    float *weights;  // after the steps (malloc'd)
    size_t n;
    td_trainer_memory mem;
    size_t model_grads, model_grads_after;  // the model's gradient bytes with the trainer, and after it
    td_status st;
    char msg[512];
} run;

// A cross-entropy micro-batch that on rank 1 sleeps stall_ms between forward and backward: its
// peers' backward must wait for its reductions (ZeRO-2's ring buffers) and hit their deadline.
typedef struct stall_micro {
    const run *r;
    const int32_t *tok, *tgt;
    size_t n;  // tokens per micro-batch
} stall_micro;

static td_status stall_fn(void *ctx, int k, td_tmodel *tm, float dscale, double *loss_sum, td_err *err) {
    const stall_micro *x = ctx;
    td_status st = td_tmodel_forward(tm, x->tok + (size_t)k * x->n, x->tgt + (size_t)k * x->n, loss_sum, NULL, err);
    if (!st && x->r->rank == 1 && x->r->stall_ms > 0) usleep((useconds_t)x->r->stall_ms * 1000);
    return st ? st : td_tmodel_backward(tm, dscale, err);
}

static void *train(void *arg) {
    run *r = arg;
    const td_model_config c = config(r->tied);
    td_tmodel_params mp = td_tmodel_default_params();
    const int seqs = B / (r->world * r->accum);  // sequences per micro-batch
    mp.batch = seqs, mp.seq_len = T, mp.n_threads = 1;
    mp.precision = r->bf16 ? TD_TRAIN_BF16 : TD_TRAIN_FP32;
    td_tmodel *tm = NULL;
    td_trainer *tr = NULL;
    td_err err = {0};
    int32_t *tok = malloc(sizeof(int32_t) * B * T), *tgt = malloc(sizeof(int32_t) * B * T);
    if ((r->st = td_tmodel_create(&c, &mp, &tm, &err))) goto done;
    td_tmodel_init_random(tm, 7, 0.2f);
    td_trainer_params tp = td_trainer_default_params();
    tp.grad_accum = r->accum;
    tp.grad_clip = 0.5f;  // active: the norms here are ~1-3
    tp.lr = (td_lr_schedule){.max_lr = 1e-2f, .min_lr = 1e-3f, .warmup_steps = 1, .total_steps = STEPS};
    tp.comm = r->comm, tp.zero = r->zero, tp.bucket_elems = r->bucket, tp.grad_ring = r->ring;
    if (r->timeout_ms > 0) td_comm_set_timeout(r->comm, r->timeout_ms);
    if ((r->st = td_trainer_create(tm, &tp, &tr, &err))) goto done;
    r->mem = td_trainer_memory_of(tr);
    r->model_grads = td_tmodel_grads_bytes(tm);

    for (int s = 0; s < STEPS; s++) {
        // This rank's micro-batches: global sequence q = (k * world + rank) * seqs + j, so that the
        // one-rank run (world 1, accum = world * accum) meets the same micro-batches in the same order.
        for (int k = 0; k < r->accum; k++)
            for (int j = 0; j < seqs; j++) {
                const int q = (k * r->world + r->rank) * seqs + j;
                sequence(s, q, tok + (size_t)(k * seqs + j) * T, tgt + (size_t)(k * seqs + j) * T);
            }
        if (s == 1 && r->rank == r->bad_rank) tok[3] = 1000;
        td_step_stats ss;
        if (r->stall_ms > 0 || r->with) {
            long count = 0;
            for (int i = 0; i < r->accum * seqs * T; i++) count += tgt[i] >= 0;
            stall_micro x = {r, tok, tgt, (size_t)seqs * T};
            if ((r->st = td_trainer_step_with(tr, stall_fn, &x, count, &ss, &err))) goto done;
        } else if ((r->st = td_trainer_step(tr, tok, tgt, &ss, &err))) {
            goto done;
        }
        r->loss[s] = ss.loss, r->norm[s] = ss.grad_norm;
    }
    float *w = td_tmodel_params_buf(tm, &r->n);
    r->weights = malloc(r->n * sizeof(float));
    memcpy(r->weights, w, r->n * sizeof(float));
done:
    if (r->st) snprintf(r->msg, sizeof r->msg, "%s", err.msg);
    td_trainer_free(tr);
    if (tm) r->model_grads_after = td_tmodel_grads_bytes(tm);
    td_tmodel_free(tm);
    free(tok), free(tgt);
    return NULL;
}

static void free_runs(run *rs, int n) {
    for (int i = 0; i < n; i++) free(rs[i].weights);
}

// The options of a run beyond world, zero stage and micro-batches per rank.
typedef struct opts {
    int bf16, bad_rank, ring, tied, stall_ms, timeout_ms, with;
    size_t bucket;
} opts;

// world ranks of `accum` micro-batches each, ZeRO stage zero; results in rs[0..world).
static bool run_world_opts(run *rs, int world, int zero, int accum, opts o) {
    td_comm *comms[MAXR] = {0};
    td_err err = {0};
    if (world > 1 && td_comm_local_create(world, comms, &err) != TD_OK) {
        CHECK(0, "comm: %s", err.msg);
        return false;
    }
    pthread_t th[MAXR];
    for (int r = 0; r < world; r++) {
        rs[r] = (run){.world = world, .rank = r, .zero = zero, .accum = accum, .bf16 = o.bf16, .bucket = o.bucket,
                      .comm = comms[r], .bad_rank = o.bad_rank, .ring = o.ring, .tied = o.tied,
                      .stall_ms = o.stall_ms, .timeout_ms = o.timeout_ms, .with = o.with};
        pthread_create(&th[r], NULL, train, &rs[r]);
    }
    bool ok = true;
    for (int r = 0; r < world; r++) {
        pthread_join(th[r], NULL);
        if (o.bad_rank < 0 && o.stall_ms <= 0)
            CHECK(rs[r].st == TD_OK, "world %d zero %d rank %d: %s", world, zero, r, rs[r].msg);
        ok &= rs[r].st == TD_OK;
    }
    for (int r = 0; r < world; r++) td_comm_free(comms[r]);
    return ok;
}
static bool run_world_bad(run *rs, int world, int zero, int accum, int bf16, size_t bucket, int bad_rank) {
    return run_world_opts(rs, world, zero, accum, (opts){.bf16 = bf16, .bucket = bucket, .bad_rank = bad_rank});
}
static bool run_world(run *rs, int world, int zero, int accum, int bf16, size_t bucket) {
    return run_world_bad(rs, world, zero, accum, bf16, bucket, -1);
}

// One rank's bad input fails the step on every rank, with a message, and nobody hangs.
static void test_bad_rank(void) {
    run rs[3];
    run_world_bad(rs, 3, 1, 1, 0, 700, 2);
    int ok = 1;
    for (int r = 0; r < 3; r++) ok &= rs[r].st == TD_ERR_INVALID && strstr(rs[r].msg, "out of range");
    CHECK(ok, "rank 2's out-of-range token: every rank's step is TD_ERR_INVALID (%s / %s)", rs[0].msg, rs[2].msg);
    free_runs(rs, 3);
}


static void test_equivalence(int world, int zero, int bf16) {
    run one, many[MAXR];
    const size_t bucket = 700;  // elements: several buckets per step (the model has ~14k parameters)
    if (!run_world(&one, 1, 0, world, bf16, bucket) || !run_world(many, world, zero, 1, bf16, bucket)) {
        free_runs(&one, 1), free_runs(many, world);
        return;
    }
    int same_loss = 1, same_w = 1, norm_ok = 1;
    for (int s = 0; s < STEPS; s++)
        for (int r = 0; r < world; r++) {
            same_loss &= memcmp(&many[r].loss[s], &one.loss[s], sizeof(double)) == 0;
            norm_ok &= fabs(many[r].norm[s] - one.norm[s]) <= 1e-12 * one.norm[s];
        }
    for (int r = 0; r < world; r++) same_w &= many[r].n == one.n && !memcmp(many[r].weights, one.weights, one.n * sizeof(float));
    CHECK(same_loss, "%d ranks, ZeRO %d%s: the losses equal one rank's bit for bit", world, zero, bf16 ? ", bf16" : "");
    CHECK(norm_ok, "%d ranks, ZeRO %d: the gradient norms within 1e-12 of one rank's", world, zero);
    CHECK(same_w, "%d ranks, ZeRO %d%s: the weights after %d steps equal one rank's bit for bit (every rank)", world, zero,
          bf16 ? ", bf16" : "", STEPS);
    if (zero > 0) {  // the optimizer state is the shard's: about 1/world of it, plus the tails
        const run *m = &many[0];
        CHECK(m->mem.n_owned < one.n / world + 64 && m->mem.optim_bytes == 2 * m->mem.n_owned * sizeof(float),
              "ZeRO %d on %d ranks: rank 0 owns %zu of %zu parameters, optimizer %zu bytes", zero, world, m->mem.n_owned,
              one.n, m->mem.optim_bytes);
        size_t total = 0;
        for (int r = 0; r < world; r++) total += many[r].mem.n_owned;
        CHECK(total >= one.n && total < one.n + 64 * (size_t)world, "the shards cover the parameters once (+ tails)");
    }
    printf("%d ranks, ZeRO %d%s: losses %.6f %.6f %.6f, bit-identical to one rank\n", world, zero, bf16 ? ", bf16" : "",
           many[0].loss[0], many[0].loss[1], many[0].loss[2]);
    free_runs(&one, 1), free_runs(many, world);
}

// Two micro-batches per rank: one rank's fold order differs (reassociation): close, not equal.
static void test_accum_per_rank(int zero) {
    run one, many[2];
    if (!run_world(&one, 1, 0, 4, 0, 700) || !run_world(many, 2, zero, 2, 0, 700)) {
        free_runs(&one, 1), free_runs(many, 2);
        return;
    }
    double dw = 0, dl = 0;
    for (size_t i = 0; i < one.n; i++) dw = fmax(dw, fabs((double)many[0].weights[i] - one.weights[i]));
    for (int s = 0; s < STEPS; s++) dl = fmax(dl, fabs(many[0].loss[s] - one.loss[s]) / one.loss[s]);
    CHECK(dw <= 1e-5 && dl <= 1e-6, "2 ranks x 2 micro-batches, ZeRO %d: weights within 1e-5 (%.2e), losses 1e-6 (%.2e)",
          zero, dw, dl);
    CHECK(!memcmp(many[0].weights, many[1].weights, one.n * sizeof(float)), "both ranks hold the same weights");
    free_runs(&one, 1), free_runs(many, 2);
}

// ZeRO-2's gradient bytes on one rank by trainer.h's accounting, from the bucket plan derived here
// from the layout (the ranges backward reports, merged downwards to `bucket` elements). Untied:
// the ring's buffers (bucket b in buffer b % slots, each the largest it takes) and the shard (every
// bucket's block of n / world and its tail). Tied: the table [0, emb_n) of the last bucket is cut
// into pieces of rows = (the largest other bucket, or `bucket` if that is under 2 rows) / dim - 1
// rows, each a bucket written twice (the second time with one scratch row): backward writes the
// pieces, the other buckets, the pieces again, the i-th into buffer i % slots. So the bytes are
// 4 P / N (the shard, plus the tails) + the ring, and nothing else.
static size_t ring_formula(const td_tmodel *tm, size_t bucket, int world, int ring, int *slots_out) {
    const td_model_config *c = td_tmodel_config(tm);
    size_t n, starts[64], len[600], hi;
    td_tmodel_params_buf((td_tmodel *)tm, &n);
    int ns = 0, nb = 0;
    starts[ns++] = td_tmodel_find(tm, "model.norm.weight")->offset;
    for (int l = c->n_layers - 1; l >= 0; l--) {
        char name[64];
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        starts[ns++] = td_tmodel_find(tm, name)->offset;
    }
    starts[ns++] = 0;
    hi = n;
    for (int i = 0; i < ns; i++)
        if (hi - starts[i] >= bucket || i == ns - 1) len[nb++] = hi - starts[i], hi = starts[i];
    const size_t D = (size_t)c->dim, emb_n = (size_t)c->vocab_size * D;
    int n_tied = 0;
    size_t piece[600], rows = 0;  // the pieces' lengths (descending rows)
    if (c->tie_embeddings) {  // the last bucket: its part above the table, then the pieces
        const size_t above = len[nb - 1] - emb_n;
        if (above) len[nb - 1] = above; else nb--;
        size_t max_n = 0;
        for (int b = 0; b < nb; b++) max_n = len[b] > max_n ? len[b] : max_n;
        const size_t target = max_n >= 2 * D ? max_n : (bucket > 2 * D ? bucket : 2 * D);
        rows = target / D - 1 < (size_t)c->vocab_size ? target / D - 1 : (size_t)c->vocab_size;
        for (size_t r0 = ((size_t)c->vocab_size - 1) / rows * rows;; r0 -= rows) {
            piece[n_tied++] = ((size_t)c->vocab_size - r0 < rows ? (size_t)c->vocab_size - r0 : rows) * D;
            if (r0 == 0) break;
        }
    }
    const int events = n_tied + nb + n_tied, slots = ring < events ? ring : events;
    size_t elems = 0, slot_n[64] = {0};
    int ev = 0;
    for (int i = 0; i < n_tied; i++, ev++)
        slot_n[ev % slots] = piece[i] > slot_n[ev % slots] ? piece[i] : slot_n[ev % slots];
    for (int b = 0; b < nb; b++, ev++) {
        slot_n[ev % slots] = len[b] > slot_n[ev % slots] ? len[b] : slot_n[ev % slots];
        elems += len[b] - len[b] / (size_t)world * (size_t)(world - 1);
    }
    for (int i = 0; i < n_tied; i++, ev++) {
        const size_t need = piece[i] + D;
        slot_n[ev % slots] = need > slot_n[ev % slots] ? need : slot_n[ev % slots];
        elems += piece[i] - piece[i] / (size_t)world * (size_t)(world - 1);
    }
    for (int i = 0; i < slots; i++) elems += slot_n[i];
    *slots_out = slots;
    return elems * sizeof(float);
}

// ZeRO-2 through the gradient ring against one rank accumulating the same micro-batches: untied,
// the same bits (losses, weights) at N ranks with 1 and 2 ring buffers. Tied, the embedding's
// gradient is reduced in two parts, the head's h and the embedding's e: per element (sum over
// ranks of h) + (sum of e) where one rank folds (h_0 + e_0) + (h_1 + e_1) ..., the same 2N f32
// terms regrouped, so per step an element differs by at most about 2N ulp of its largest partial
// sum (2N 2^-24, 5e-7 relative at N = 4). The gradient norm (the double sum of these) then agrees
// to 1e-6 relative, the losses to 1e-6, and the weights, moved by AdamW's lr m / (sqrt v + eps)
// (lr 1e-2 here: scale-free, so a relative change of the gradient changes an update by about as
// much, more only where an element's gradient is near cancellation), to 1e-5 after the 3 steps:
// test_accum_per_rank's bound for the same reassociation. The model holds no gradient buffer while
// the trainer lives (and has it back after), and the trainer's gradient bytes are the formula's.
static void test_ring(int world, int tied, int ring, int bf16, int with) {
    run one = {0}, many[MAXR] = {0};
    const size_t bucket = 700;
    if (!run_world_opts(&one, 1, 0, world, (opts){.bf16 = bf16, .bucket = bucket, .bad_rank = -1, .tied = tied}) ||
        !run_world_opts(many, world, 2, 1,
                        (opts){.bf16 = bf16, .bucket = bucket, .bad_rank = -1, .tied = tied, .ring = ring, .with = with})) {
        free_runs(&one, 1), free_runs(many, world);
        return;
    }
    int same_loss = 1, same_w = 1, norm_ok = 1;
    double dl = 0, dn = 0, dw = 0;
    for (int s = 0; s < STEPS; s++)
        for (int r = 0; r < world; r++) {
            same_loss &= memcmp(&many[r].loss[s], &one.loss[s], sizeof(double)) == 0;
            norm_ok &= fabs(many[r].norm[s] - one.norm[s]) <= 1e-12 * one.norm[s];
            dl = fmax(dl, fabs(many[r].loss[s] - one.loss[s]) / one.loss[s]);
            dn = fmax(dn, fabs(many[r].norm[s] - one.norm[s]) / one.norm[s]);
        }
    for (int r = 0; r < world; r++) {
        same_w &= many[r].n == one.n && !memcmp(many[r].weights, one.weights, one.n * sizeof(float));
        for (size_t i = 0; i < one.n && many[r].n == one.n; i++)
            dw = fmax(dw, fabs((double)many[r].weights[i] - one.weights[i]));
    }
    const char *what = tied ? "tied" : "untied";
    if (!tied)
        CHECK(same_loss && norm_ok && same_w,
              "%d ranks, ZeRO 2, ring of %d, %s%s%s: losses, norms (1e-12) and weights equal one rank's bit for bit", world,
              ring, what, bf16 ? ", bf16" : "", with ? ", td_trainer_step_with" : "");
    else
        CHECK(dl <= 1e-6 && dn <= 1e-6 && dw <= 1e-5,
              "%d ranks, ZeRO 2, ring of %d, %s%s%s: losses (%.2e), norms (%.2e) within 1e-6, weights within 1e-5 (%.2e) "
              "of one rank's", world, ring, what, bf16 ? ", bf16" : "", with ? ", td_trainer_step_with" : "", dl, dn, dw);
    // The memory: what is allocated against the formula, on every rank.
    td_tmodel *tm = NULL;
    td_err err = {0};
    const td_model_config c = config(tied);
    td_tmodel_params mp = td_tmodel_default_params();
    mp.batch = 1, mp.seq_len = T, mp.n_threads = 1;
    if (td_tmodel_create(&c, &mp, &tm, &err)) {
        CHECK(0, "model: %s", err.msg);
    } else {
        int slots = 0;
        const size_t want = ring_formula(tm, bucket, world, ring, &slots);
        int ok = 1;
        for (int r = 0; r < world; r++) {
            const td_trainer_memory *m = &many[r].mem;
            ok &= many[r].model_grads == 0 && many[r].model_grads_after == one.n * sizeof(float);
            ok &= m->grads_bytes == want && m->ring_slots == slots &&
                  m->grads_bytes == m->grads_shard_bytes + m->grads_ring_bytes;
            // the shard is 4 P / N (+ the tails: under world elements a bucket)
            ok &= m->grads_shard_bytes >= one.n / (size_t)world * sizeof(float) &&
                  m->grads_shard_bytes < (one.n / (size_t)world + 64 * (size_t)world) * sizeof(float);
        }
        CHECK(ok, "%d ranks, ring of %d, %s: no model gradient buffer (restored after: %zu bytes), gradients %zu bytes "
              "= shard %zu (4P/N %zu) + ring %zu, the formula's %zu",
              world, ring, what, many[0].model_grads_after, many[0].mem.grads_bytes, many[0].mem.grads_shard_bytes,
              one.n / (size_t)world * sizeof(float), many[0].mem.grads_ring_bytes, want);
        td_tmodel_free(tm);
    }
    if (tied)
        printf("%d ranks, ZeRO 2, ring of %d, tied: losses %.1e, norms %.1e, weights %.1e from one rank's; gradients %zu "
               "bytes (full: %zu)\n", world, ring, dl, dn, dw, many[0].mem.grads_bytes, one.n * sizeof(float));
    else
        printf("%d ranks, ZeRO 2, ring of %d, untied: bit-identical to one rank; gradients %zu bytes (full: %zu)\n", world,
               ring, many[0].mem.grads_bytes, one.n * sizeof(float));
    free_runs(&one, 1), free_runs(many, world);
}

// With several micro-batches per rank, ZeRO-2 through the ring gives the bits of ZeRO-2 through the
// full-size gradient buffer (grad_ring -1: the same reductions in the same order) untied; tied, the
// ring reduces the embedding's two parts separately: test_ring's tolerance.
static void test_ring_accum(int world, int tied, int accum) {
    run full[MAXR] = {0}, ring[MAXR] = {0};
    const opts o = {.bucket = 700, .bad_rank = -1, .tied = tied};
    opts of = o, orr = o;
    of.ring = -1, orr.ring = 2;
    if (!run_world_opts(full, world, 2, accum, of) || !run_world_opts(ring, world, 2, accum, orr)) {
        free_runs(full, world), free_runs(ring, world);
        return;
    }
    int same = 1;
    double dl = 0, dn = 0, dw = 0;
    for (int r = 0; r < world; r++) {
        same &= !memcmp(full[r].loss, ring[r].loss, sizeof full[r].loss) && !memcmp(full[r].norm, ring[r].norm, sizeof full[r].norm);
        same &= full[r].n == ring[r].n && !memcmp(full[r].weights, ring[r].weights, full[r].n * sizeof(float));
        for (int s = 0; s < STEPS; s++) {
            dl = fmax(dl, fabs(full[r].loss[s] - ring[r].loss[s]) / full[r].loss[s]);
            dn = fmax(dn, fabs(full[r].norm[s] - ring[r].norm[s]) / full[r].norm[s]);
        }
        for (size_t i = 0; i < full[r].n && full[r].n == ring[r].n; i++)
            dw = fmax(dw, fabs((double)full[r].weights[i] - ring[r].weights[i]));
    }
    if (!tied)
        CHECK(same, "%d ranks x %d micro-batches, ZeRO 2, untied: the ring gives the full-size buffer's losses, norms and "
              "weights bit for bit", world, accum);
    else
        CHECK(full[0].n == ring[0].n && dl <= 1e-6 && dn <= 1e-6 && dw <= 1e-5,
              "%d ranks x %d micro-batches, ZeRO 2, tied: the ring within 1e-6 of the full-size buffer's losses (%.2e) and "
              "norms (%.2e), 1e-5 of its weights (%.2e)", world, accum, dl, dn, dw);
    CHECK(full[0].mem.ring_slots == 0 && full[0].model_grads == full[0].n * sizeof(float) && ring[0].mem.ring_slots > 0 &&
              ring[0].model_grads == 0 && ring[0].mem.accum_bytes < full[0].n * sizeof(float),
          "grad_ring -1 keeps the model's buffer, 2 frees it; the accumulator is shard-sized either way");
    free_runs(full, world), free_runs(ring, world);
}

// The default (grad_ring 0) takes the ring only where it holds fewer bytes than the full-size
// buffer: not for the 2-layer model in buckets of a layer (2 buffers of a layer + the shard > P),
// but for 8 layers; and the gradient bytes shrink with the ranks. Trainers are only created (the
// plan needs no communication).
static void test_ring_auto(void) {
    td_err err = {0};
    for (int layers = 2; layers <= 8; layers += 6) {
        td_model_config c = config(1);
        c.n_layers = layers;
        size_t prev = 0;
        for (int world = 2; world <= 4; world += 2) {
            td_comm *comms[MAXR] = {0};
            td_tmodel *tm = NULL;
            td_trainer *tr = NULL;
            td_tmodel_params mp = td_tmodel_default_params();
            mp.batch = 1, mp.seq_len = T, mp.n_threads = 1;
            td_trainer_params tp = td_trainer_default_params();
            tp.zero = 2, tp.bucket_elems = 700;
            if (td_comm_local_create(world, comms, &err) || td_tmodel_create(&c, &mp, &tm, &err) ||
                ((tp.comm = comms[world - 1]), td_trainer_create(tm, &tp, &tr, &err))) {
                CHECK(0, "%s", err.msg);
            } else {
                size_t n;
                td_tmodel_params_buf(tm, &n);
                const td_trainer_memory m = td_trainer_memory_of(tr);
                int slots = 0;
                const size_t want = ring_formula(tm, 700, world, 2, &slots);
                if (layers == 2)
                    CHECK(want >= n * sizeof(float) && m.ring_slots == 0 && m.grads_bytes == n * sizeof(float) &&
                              td_tmodel_grads_bytes(tm) == n * sizeof(float),
                          "%d layers, %d ranks: the ring (%zu bytes) would not be smaller: the full-size buffer", layers,
                          world, want);
                else
                    CHECK(want < n * sizeof(float) && m.ring_slots == 2 && m.grads_bytes == want &&
                              td_tmodel_grads_bytes(tm) == 0 && (prev == 0 || m.grads_bytes < prev),
                          "%d layers, %d ranks: the ring, %zu bytes of gradients (the formula's %zu, the full %zu, at "
                          "half the ranks %zu)",
                          layers, world, m.grads_bytes, want, n * sizeof(float), prev);
                prev = m.grads_bytes;
                if (layers > 2) {  // the ring holds the model's gradients: a second trainer is refused
                    td_trainer *t2 = NULL;
                    td_err e2 = {0};
                    CHECK(td_trainer_create(tm, &tp, &t2, &e2) == TD_ERR_INVALID && !t2 && strstr(e2.msg, "gradient buffer"),
                          "a second trainer on a model whose gradients a ring holds: %s", e2.msg);
                }
            }
            td_trainer_free(tr);
            td_tmodel_free(tm);
            for (int r = 0; r < world; r++) td_comm_free(comms[r]);
        }
    }
}

// A rank that stops in the middle of its backward: the peer waiting to reuse a ring buffer (the
// reduction that reads it needs the stalled rank) fails at its deadline with TD_ERR_TIMEOUT naming
// that rank, and the stalled one then fails too; nobody hangs.
static void test_ring_timeout(void) {
    run rs[2];
    run_world_opts(rs, 2, 2, 1, (opts){.bucket = 700, .bad_rank = -1, .ring = 1, .stall_ms = 1500, .timeout_ms = 300});
    CHECK(rs[0].st == TD_ERR_TIMEOUT && strstr(rs[0].msg, "1"), "rank 0 times out waiting for rank 1 (%d: %s)",
          (int)rs[0].st, rs[0].msg);
    CHECK(rs[1].st != TD_OK, "the stalled rank's step fails too (%s)", rs[1].msg);
    free_runs(rs, 2);
}

int main(void) {
    for (int world = 2; world <= 4; world++)
        for (int zero = 0; zero <= 2; zero++) test_equivalence(world, zero, 0);
    test_equivalence(2, 1, 1);
    test_equivalence(4, 2, 1);
    for (int zero = 0; zero <= 2; zero++) test_accum_per_rank(zero);
    for (int world = 2; world <= 4; world += 2)
        for (int tied = 0; tied <= 1; tied++) {
            test_ring(world, tied, 1, 0, 0);
            test_ring(world, tied, 2, 0, 0);
            test_ring_accum(world, tied, 2);
        }
    test_ring(3, 1, 2, 0, 0);
    test_ring(4, 1, 2, 1, 0);
    test_ring(2, 1, 2, 0, 1);  // the micro-batches through td_trainer_step_with (RL's step)
    test_ring_auto();
    test_ring_timeout();
    test_bad_rank();
    TEST_DONE();
}
