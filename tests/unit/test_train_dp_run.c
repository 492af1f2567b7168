// The training loop (td_train_run) under data parallelism, in one process: ranks are threads on
// the in-process communicator. --batch is the global batch: N ranks at batch 4 take the loader's
// rank-strided shares of the same windows as one rank at batch 4 / N with N micro-batches, and
// log the same losses bit for bit (metrics lines, which carry world_size); with ZeRO-1 and ZeRO-2
// the checkpoint holds the whole optimizer state, so it is the same file as one rank's, and a run
// stopped at a checkpoint on 4 ranks resumes on 2 and on 1 (and one of 1 on 3: batch 3) with the
// losses of the uninterrupted run. A batch the ranks cannot divide is refused. The model ties its
// embeddings, and ZeRO-2 through the gradient ring over N ranks reduces the tied embedding's two
// gradient parts (the head's, the embedding's) separately ((sum h) + (sum e) where one rank sums
// h + e first: 2N f32 terms regrouped, about 2N ulp an element a step, test_train_dp): its losses
// agree to 1e-6 relative, and the checkpoint's tensors (weights, moments) to 1e-5 of each
// tensor's largest magnitude (measured ~1e-6). Over real MPI processes: test_train_mpi.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist/comm.h"
#include "ckpt_compare.h"
#include "test_util.h"
#include "train/ckpt.h"
#include "train/shards.h"
#include "train/train_run.h"

enum { STEPS = 6, HALF = 3, MAXR = 4 };
static char g_dir[256], g_shard[320];
static int g_ring;  // td_trainer_params.grad_ring of the runs (ZeRO-2's gradient ring; 0: the default)

static td_train_run_params tiny(int batch, int accum, const char *out, const char *metrics, long steps) {
    static const char *shards[1];
    shards[0] = g_shard;
    td_train_run_params p = td_train_run_default_params();
    p.shards = shards, p.n_shards = 1;
    p.cfg.dim = 32, p.cfg.n_layers = 2, p.cfg.n_heads = 4, p.cfg.n_kv_heads = 2, p.cfg.head_dim = 8;
    p.cfg.ffn_dim = 64;
    p.model.batch = batch, p.model.seq_len = 16, p.model.n_threads = 1;
    p.trainer.grad_accum = accum;
    p.trainer.grad_clip = 0.5f;
    p.trainer.bucket_elems = 900;  // several buckets (the model has ~19k parameters)
    p.trainer.lr = (td_lr_schedule){.max_lr = 1e-2f, .min_lr = 1e-3f, .warmup_steps = 2, .total_steps = STEPS};
    p.steps = steps;
    p.init_std = 0.1f;
    p.out_dir = out, p.ckpt_every = HALF, p.keep = 0, p.resume = 1;
    p.metrics_path = metrics;
    return p;
}

typedef struct job {
    td_train_run_params p;
    td_status st;
    char msg[512];
} job;

static void *run_job(void *a) {
    job *j = a;
    td_err err = {0};
    td_train_run_result r;
    j->st = td_train_run(&j->p, &r, &err);
    if (j->st) snprintf(j->msg, sizeof j->msg, "%s", err.msg);
    return NULL;
}

// world ranks of the same run (rank 0 writes out/metrics); TD_OK when every rank finished.
static td_status run_world(int world, int zero, int batch, int accum, const char *out, const char *metrics, long steps,
                           char *msg, size_t cap) {
    td_comm *comms[MAXR] = {0};
    td_err err = {0};
    if (world > 1 && td_comm_local_create(world, comms, &err) != TD_OK) {
        snprintf(msg, cap, "%s", err.msg);
        return TD_ERR_IO;
    }
    job jobs[MAXR];
    pthread_t th[MAXR];
    for (int r = 0; r < world; r++) {
        jobs[r] = (job){.p = tiny(batch, accum, out, metrics, steps)};
        jobs[r].p.trainer.comm = comms[r], jobs[r].p.trainer.zero = zero, jobs[r].p.trainer.grad_ring = g_ring;
        pthread_create(&th[r], NULL, run_job, &jobs[r]);
    }
    td_status st = TD_OK;
    for (int r = 0; r < world; r++) {
        pthread_join(th[r], NULL);
        if (jobs[r].st && !st) {
            st = jobs[r].st;
            snprintf(msg, cap, "rank %d: %s", r, jobs[r].msg);
        }
    }
    for (int r = 0; r < world; r++) td_comm_free(comms[r]);
    return st;
}

// The "loss" and "grad_norm" texts (17 digits: the doubles exactly) of every metrics line, and
// the world_size fields.
static int read_metrics(const char *path, char loss[][48], int cap, int *world) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\":"), *w = strstr(line, "\"world_size\":");
        if (!l || !w) continue;
        l += 7;
        size_t k = strcspn(l, ",}");
        snprintf(loss[n], 48, "%.*s", (int)k, l);
        world[n++] = atoi(w + 13);
    }
    fclose(f);
    return n;
}

static char ref_loss[STEPS][48];

// N ranks at the global batch against the reference (one rank, batch 4 / N... see main).
static void check_world(int world, int zero) {
    char out[400], met[400], msg[600] = "";
    snprintf(out, sizeof out, "%s/w%d_z%d%s", g_dir, world, zero, g_ring ? "_ring" : "");
    snprintf(met, sizeof met, "%s/w%d_z%d%s.jsonl", g_dir, world, zero, g_ring ? "_ring" : "");
    td_status st = run_world(world, zero, 4, 1, out, met, STEPS, msg, sizeof msg);
    CHECK(st == TD_OK, "%d ranks, ZeRO %d: %s", world, zero, msg);
    char loss[STEPS + 2][48];
    int w[STEPS + 2];
    const int n = read_metrics(met, loss, STEPS + 2, w);
    char a[500], b[500];
    snprintf(a, sizeof a, "%s/ckpt-%06d", out, STEPS);  // a sharded checkpoint (a directory)
    snprintf(b, sizeof b, "%s/ref%d/ckpt-%06d.tdck", g_dir, world, STEPS);
    if (zero < 2 || !g_ring) {  // (this model's ZeRO-2 default is the full-size buffer: the same reductions)
        int same = n == STEPS;
        for (int i = 0; same && i < n; i++) same = !strcmp(loss[i], ref_loss[i]) && w[i] == world;
        CHECK(same, "%d ranks, ZeRO %d: %d metrics lines, the losses of one rank accumulating the same micro-batches "
                    "bit for bit, world_size %d (first %s vs %s)", world, zero, n, world, n ? loss[0] : "-", ref_loss[0]);
        CHECK(same_tensors(a, b), "%d ranks, ZeRO %d: the final checkpoint (weights, whole optimizer state) equals one rank's",
              world, zero);
        return;
    }
    int ok = n == STEPS;
    double worst = 0;
    for (int i = 0; ok && i < n; i++) {
        const double x = atof(loss[i]), y = atof(ref_loss[i]);
        worst = fmax(worst, fabs(x - y) / y);
        ok = w[i] == world;
    }
    CHECK(ok && worst <= 1e-6, "%d ranks, ZeRO 2%s: %d metrics lines, the losses within 1e-6 (%.2e) of one rank "
          "accumulating the same micro-batches, world_size %d", world, g_ring ? ", ring of 1" : "", n, worst, world);
    const double d = tensors_diff(a, b);
    CHECK(d <= 1e-5, "%d ranks, ZeRO 2%s: the final checkpoint (weights, whole optimizer state) within 1e-5 of one "
          "rank's (%.2e)", world, g_ring ? ", ring of 1" : "", d);
    printf("%d ranks, ZeRO 2%s: losses within %.1e, checkpoint tensors within %.1e of one rank's\n", world,
           g_ring ? ", ring of 1" : "", worst, d);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "%s/train_dp_run_test", td_test_data_dir());
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    CHECK(system(cmd) == 0, "mkdir %s", g_dir);
    enum { NTOK = 6000 };
    static int32_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (int32_t)((i * 7 + i / 13) % 29);
    snprintf(g_shard, sizeof g_shard, "%s/s0.tdsh", g_dir);
    td_err err = {0};
    CHECK(td_shard_write(g_shard, 29, ids, NTOK, 1, &err) == TD_OK, "shard: %s", err.msg);

    // N ranks at batch 4 equal one rank at batch 4 / N with N micro-batches (the same windows in
    // the same order, the same fold).
    char msg[600] = "";
    for (int world = 2; world <= 4; world += 2) {
        char out[400], met[400];
        snprintf(out, sizeof out, "%s/ref%d", g_dir, world);
        snprintf(met, sizeof met, "%s/ref%d.jsonl", g_dir, world);
        td_status st = run_world(1, 0, 4 / world, world, out, met, STEPS, msg, sizeof msg);
        CHECK(st == TD_OK, "reference run: %s", msg);
        int w[STEPS + 2];
        CHECK(read_metrics(met, ref_loss, STEPS, w) == STEPS && w[0] == 1, "reference metrics");
        for (int zero = 0; zero <= 2; zero++) check_world(world, zero);
        g_ring = 1;  // ZeRO-2 through a ring of one buffer (this model's default is the full-size buffer)
        check_world(world, 2);
        g_ring = 0;
    }

    // Resharding on resume: 4 ranks (ZeRO-2) stop at step 3; 2 ranks (ZeRO-1) go on to 6 and must
    // log the uninterrupted 4-rank run's losses (= ref4's); the same from 2 ranks to 1. The ZeRO-2
    // runs write their gradients through the ring.
    {
        g_ring = 1;
        char out[400], met[400];
        snprintf(out, sizeof out, "%s/reshard", g_dir);
        snprintf(met, sizeof met, "%s/reshard.jsonl", g_dir);
        td_status st = run_world(4, 2, 4, 1, out, met, HALF, msg, sizeof msg);
        CHECK(st == TD_OK, "4 ranks to step %d: %s", HALF, msg);
        st = run_world(2, 1, 4, 1, out, met, STEPS, msg, sizeof msg);  // 2 ranks x 1 micro-batch of 2
        CHECK(st == TD_OK, "resumed on 2 ranks: %s", msg);
        char loss[STEPS + 2][48], ref[STEPS + 2][48];
        int w[STEPS + 2], wr[STEPS + 2];
        char rm[400];
        snprintf(rm, sizeof rm, "%s/ref4.jsonl", g_dir);
        const int n = read_metrics(met, loss, STEPS + 2, w), nr = read_metrics(rm, ref, STEPS + 2, wr);
        // After the resume a rank's micro-batch holds 2 sequences where the 4-rank run (and its
        // one-rank reference) had 1: the same gradient summed in another grouping, so the losses
        // from there on agree to f32 reassociation, not bit for bit; before it they agree to
        // ZeRO-2's tied tolerance (1e-6, above).
        int first = n >= HALF && nr >= HALF && w[0] == 4;
        double before = 0;
        for (int i = 0; first && i < HALF; i++) before = fmax(before, fabs(atof(loss[i]) - atof(ref[i])) / atof(ref[i]));
        CHECK(first && before <= 1e-6, "4 ranks: the first %d losses within 1e-6 of one rank's (%.2e)", HALF, before);
        double worst = 0;
        for (int i = HALF; i < n && i < nr; i++) {
            const double a = atof(loss[i]), b = atof(ref[i]), d = a > b ? (a - b) / b : (b - a) / b;
            if (d > worst) worst = d;
        }
        CHECK(n == STEPS && w[HALF] == 2 && worst < 1e-5,
              "resumed on 2 ranks (ZeRO-1) after 4 (ZeRO-2): %d lines, losses within 1e-5 of the uninterrupted run (%.2e)",
              n, worst);
        // 1 rank on from a 2-rank checkpoint: copy the 2-rank run's step-3 state and resume alone.
        char out1[400], met1[400];
        snprintf(out1, sizeof out1, "%s/reshard1", g_dir);
        snprintf(met1, sizeof met1, "%s/reshard1.jsonl", g_dir);
        st = run_world(2, 2, 4, 1, out1, met1, HALF, msg, sizeof msg);
        CHECK(st == TD_OK, "2 ranks to step %d: %s", HALF, msg);
        st = run_world(1, 0, 2, 2, out1, met1, STEPS, msg, sizeof msg);  // one rank, batch 2 x 2 = the same windows
        CHECK(st == TD_OK, "resumed on 1 rank: %s", msg);
        char r2[400];
        snprintf(r2, sizeof r2, "%s/ref2.jsonl", g_dir);
        const int n1 = read_metrics(met1, loss, STEPS + 2, w), n2 = read_metrics(r2, ref, STEPS + 2, wr);
        // The 2-rank ZeRO-2 half within its tolerance; the 1-rank half goes on from that state.
        int eq = n1 == STEPS && n2 == STEPS && w[0] == 2 && w[HALF] == 1;
        double d1 = 0;
        for (int i = 0; eq && i < n1; i++) d1 = fmax(d1, fabs(atof(loss[i]) - atof(ref[i])) / atof(ref[i]));
        CHECK(eq && d1 <= 1e-6, "2 ranks (ZeRO-2) to step %d, resumed on 1 rank to %d: every loss within 1e-6 of the "
              "uninterrupted run's (%.2e)", HALF, STEPS, d1);
        g_ring = 0;
    }
    // 1 rank to step 3, then 3 ranks (batch 3 = 3 x 1): the loader position and the whole state
    // carry over; the losses after the resume match one rank at batch 1 x 3 exactly.
    {
        char out[400], met[400], ro[400], rm[400];
        snprintf(out, sizeof out, "%s/to3", g_dir);
        snprintf(met, sizeof met, "%s/to3.jsonl", g_dir);
        snprintf(ro, sizeof ro, "%s/ref3", g_dir);
        snprintf(rm, sizeof rm, "%s/ref3.jsonl", g_dir);
        td_status st = run_world(1, 0, 1, 3, ro, rm, STEPS, msg, sizeof msg);
        CHECK(st == TD_OK, "reference 1 x 3: %s", msg);
        st = run_world(1, 0, 1, 3, out, met, HALF, msg, sizeof msg);
        CHECK(st == TD_OK, "1 rank to step %d: %s", HALF, msg);
        st = run_world(3, 1, 3, 1, out, met, STEPS, msg, sizeof msg);
        CHECK(st == TD_OK, "resumed on 3 ranks: %s", msg);
        char loss[STEPS + 2][48], ref[STEPS + 2][48];
        int w[STEPS + 2], wr[STEPS + 2];
        const int n = read_metrics(met, loss, STEPS + 2, w), nr = read_metrics(rm, ref, STEPS + 2, wr);
        int eq = n == STEPS && nr == STEPS && w[HALF] == 3;
        for (int i = 0; eq && i < n; i++) eq = !strcmp(loss[i], ref[i]);
        CHECK(eq, "1 rank to step %d, resumed on 3 ranks (ZeRO-1): every loss equals the uninterrupted run's", HALF);
    }
    // Faults in sharded checkpoints (w2_z1: 2 ranks, checkpoints at steps 3 and 6): a corrupt shard
    // of the newest is named and the previous checkpoint loads; a missing shard likewise; without
    // its manifest a directory is no checkpoint; and training resumes from the previous one with
    // the uninterrupted run's losses.
    {
        char fd[400], s6[500], sh[600];
        snprintf(fd, sizeof fd, "%s/faults", g_dir);
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/w2_z1' '%s'", fd, g_dir, fd);
        CHECK(system(cmd) == 0, "copy a sharded run");
        snprintf(s6, sizeof s6, "%s/ckpt-%06d", fd, STEPS);
        snprintf(sh, sizeof sh, "%s/shard-00001-of-00002.tdck", s6);
        td_ckpt *ck = NULL;
        CHECK(td_ckpt_open(s6, &ck, &err) == TD_OK, "the sharded checkpoint opens: %s", err.msg);
        td_ckpt_close(ck);
        snprintf(cmd, sizeof cmd, "cp '%s' '%s.orig' && printf 'X' | dd of='%s' bs=1 seek=200 conv=notrunc 2>/dev/null", sh,
                 sh, sh);
        CHECK(system(cmd) == 0, "corrupt a byte of shard 1");
        CHECK(td_ckpt_open(s6, &ck, &err) == TD_ERR_FORMAT && strstr(err.msg, "shard-00001-of-00002.tdck"),
              "a corrupt shard is named: %s", err.msg);
        int64_t step = -1;
        CHECK(td_ckpt_dir_load_latest(fd, &ck, &step, &err) == TD_OK && step == HALF,
              "the previous complete checkpoint (step %d) loads instead (got %lld)", HALF, (long long)step);
        td_ckpt_close(ck);
        snprintf(cmd, sizeof cmd, "mv '%s.orig' '%s' && rm '%s/shard-00000-of-00002.tdck'", sh, sh, s6);
        CHECK(system(cmd) == 0, "restore shard 1, delete shard 0");
        CHECK(td_ckpt_open(s6, &ck, &err) == TD_ERR_FORMAT && strstr(err.msg, "shard-00000-of-00002.tdck is missing"),
              "a missing shard is named: %s", err.msg);
        CHECK(td_ckpt_dir_load_latest(fd, &ck, &step, &err) == TD_OK && step == HALF, "and the previous one loads");
        td_ckpt_close(ck);
        snprintf(cmd, sizeof cmd, "rm '%s/manifest.json'", s6);
        CHECK(system(cmd) == 0, "remove the manifest");
        int64_t steps[8];
        CHECK(td_ckpt_dir_list(fd, steps, 8) == 1 && steps[0] == HALF, "without a manifest it is no checkpoint");
        char met[400];
        snprintf(met, sizeof met, "%s/faults.jsonl", g_dir);
        td_status st = run_world(2, 1, 4, 1, fd, met, STEPS, msg, sizeof msg);
        CHECK(st == TD_OK, "resumed past the broken checkpoint: %s", msg);
        char loss[STEPS + 2][48], ref[STEPS + 2][48], rp[400];
        int w[STEPS + 2], wr[STEPS + 2];
        snprintf(rp, sizeof rp, "%s/ref2.jsonl", g_dir);
        const int n = read_metrics(met, loss, STEPS + 2, w), nr = read_metrics(rp, ref, STEPS + 2, wr);
        int eq = n == STEPS - HALF && nr == STEPS;
        for (int i = 0; eq && i < n; i++) eq = !strcmp(loss[i], ref[HALF + i]);
        CHECK(eq, "the steps after the previous checkpoint log the uninterrupted losses (%d lines)", n);
    }
    // A global batch the ranks cannot divide.
    {
        char out[400];
        snprintf(out, sizeof out, "%s/bad", g_dir);
        td_status st = run_world(3, 0, 4, 1, out, NULL, STEPS, msg, sizeof msg);
        CHECK(st == TD_ERR_INVALID && strstr(msg, "not divisible by the 3 ranks"), "batch 4 on 3 ranks refused: %s", msg);
    }
    TEST_DONE();
}
