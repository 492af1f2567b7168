// The training loop on tiny token shards: the training and validation losses fall on a learnable
// (periodic) stream; checkpoints carry the config; a run cut at a checkpoint and resumed ends with
// the same weights and optimizer state, bit for bit, as the uninterrupted run; bf16 +
// recomputation + accumulation also learn; bad inputs are errors.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_compare.h"
#include "test_util.h"
#include "train/ckpt.h"
#include "train/gemm.h"
#include "train/plot.h"
#include "train/shards.h"
#include "train/train_run.h"

static char dir[256];

static td_train_run_params tiny(const char *const *shards, int n) {
    td_train_run_params p = td_train_run_default_params();
    p.shards = shards, p.n_shards = n;
    p.cfg.dim = 32, p.cfg.n_layers = 2, p.cfg.n_heads = 4, p.cfg.n_kv_heads = 2, p.cfg.head_dim = 8;
    p.cfg.ffn_dim = 64;
    p.model.batch = 2, p.model.seq_len = 16, p.model.n_threads = 2;
    p.trainer.lr =
        (td_lr_schedule){.max_lr = 1e-2f, .min_lr = 1e-3f, .warmup_steps = 3, .total_steps = 40};
    p.steps = 40;
    p.init_std = 0.1f;
    return p;
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/train_run_test", td_test_data_dir());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    CHECK(system(cmd) == 0, "mkdir %s", dir);
    // A stream with period 7 over a vocabulary of 29: predictable after a few tokens.
    enum { NTOK = 4000 };
    static int32_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (int32_t)((i % 7) * 4 + (i / 7) % 2);
    char shard[300];
    snprintf(shard, sizeof shard, "%s/s0.tdsh", dir);
    td_err err = {0};
    CHECK(td_shard_write(shard, 29, ids, NTOK, 1, &err) == TD_OK, "shard: %s", err.msg);
    const char *shards[] = {shard};

    // A validation shard of the same stream, shifted.
    char val[300];
    snprintf(val, sizeof val, "%s/v0.tdsh", dir);
    CHECK(td_shard_write(val, 29, ids + 3, 1000, 1, &err) == TD_OK, "val shard: %s", err.msg);
    const char *vals[] = {val};

    // Learns; the validation loss falls too.
    char mpath[300];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", dir);
    td_train_run_params p = tiny(shards, 1);
    p.val_shards = vals, p.n_val_shards = 1, p.eval_every = 20, p.eval_batches = 4;
    p.metrics_path = mpath;
    td_train_run_result r;
    CHECK(td_train_run(&p, &r, &err) == TD_OK, "run: %s", err.msg);
    printf("fp32: loss %.4f -> %.4f in %ld steps, val %.4f\n", r.first_loss, r.last_loss,
           r.steps_done, r.val_loss);
    CHECK(r.steps_done == 40 && r.first_loss > 3.0 && r.last_loss < 1.0, "loss %g -> %g",
          r.first_loss, r.last_loss);
    CHECK(r.val_loss < 1.0, "val loss %g", r.val_loss);
    // The metrics log, read by `tandem plot`'s reader: 40 steps, validation at 20 and 40.
    const char *metrics[] = {"loss", "val_loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"};
    td_plot_log *lg = NULL;
    CHECK(td_plot_log_read(mpath, metrics, 6, &lg, &err) == TD_OK, "metrics: %s", err.msg);
    if (lg) {
        CHECK(lg->lines == 40 && lg->malformed == 0 && lg->n[0] == 40 && lg->n[1] == 2 &&
                  lg->n[2] == 40 && lg->n[3] == 40 && lg->n[4] == 40 && lg->n[5] == 40,
              "metrics: %zu lines, %zu malformed, %zu losses, %zu val", lg->lines, lg->malformed,
              lg->n[0], lg->n[1]);
        CHECK(lg->n[1] == 2 && lg->x[1][0] == 20 && lg->x[1][1] == 40 &&
                  fabs(lg->y[1][1] - r.val_loss) < 1e-5 && fabs(lg->y[0][39] - r.last_loss) < 1e-5,
              "metrics values");
    }
    td_plot_log_free(lg);

    // bf16, recomputation, accumulation 2.
    p = tiny(shards, 1);
    p.model.precision = TD_TRAIN_BF16, p.model.recompute = 1, p.trainer.grad_accum = 2;
    CHECK(td_train_run(&p, &r, &err) == TD_OK, "bf16 run: %s", err.msg);
    printf("bf16+recompute+accum2: loss %.4f -> %.4f\n", r.first_loss, r.last_loss);
    CHECK(r.last_loss < 1.0, "bf16 loss %g -> %g", r.first_loss, r.last_loss);

    // oneDNN GEMM (when built in) learns as well.
    if (td_gemm_available()) {
        p = tiny(shards, 1);
        p.model.gemm = TD_TRAIN_GEMM_DNNL, p.model.n_threads = 1;
        CHECK(td_train_run(&p, &r, &err) == TD_OK, "dnnl run: %s", err.msg);
        printf("dnnl: loss %.4f -> %.4f\n", r.first_loss, r.last_loss);
        CHECK(r.last_loss < 1.0, "dnnl loss %g -> %g", r.first_loss, r.last_loss);
    }

    // Resume: 12 steps straight vs 6 + resume to 12 (the schedule spans 12 in both).
    char da[300], db[300], fa[400], fb[400];
    snprintf(da, sizeof da, "%s/a", dir), snprintf(db, sizeof db, "%s/b", dir);
    p = tiny(shards, 1);
    p.trainer.lr.total_steps = 12, p.steps = 12, p.out_dir = da, p.ckpt_every = 6;
    CHECK(td_train_run(&p, &r, &err) == TD_OK, "run a: %s", err.msg);
    p.out_dir = db, p.steps = 6;
    CHECK(td_train_run(&p, &r, &err) == TD_OK && r.steps_done == 6, "run b1: %s", err.msg);
    p.steps = 12, p.resume = 1;
    CHECK(td_train_run(&p, &r, &err) == TD_OK && r.steps_done == 6 && r.last_step == 11,
          "run b2: %s", err.msg);
    snprintf(fa, sizeof fa, "%s/ckpt-000012.tdck", da),
        snprintf(fb, sizeof fb, "%s/ckpt-000012.tdck", db);
    CHECK(same_tensors(fa, fb), "resumed run differs from the uninterrupted one");
    td_ckpt *ck = NULL;
    CHECK(td_ckpt_open(fb, &ck, &err) == TD_OK && strstr(td_ckpt_meta(ck), "\"step\":12,"),
          "checkpoint metadata: %s", ck ? td_ckpt_meta(ck) : err.msg);
    if (ck) {  // the config and weights an exporter reads back
        td_model_config c;
        CHECK(td_train_ckpt_config(ck, &c, &err) == TD_OK, "ckpt config: %s", err.msg);
        CHECK(c.dim == 32 && c.n_layers == 2 && c.n_heads == 4 && c.n_kv_heads == 2 &&
                  c.head_dim == 8 && c.ffn_dim == 64 && c.vocab_size == 29 && c.tie_embeddings &&
                  c.arch == TD_ARCH_LLAMA && c.norm_eps == 1e-5f && c.rope_theta == 10000.0f,
              "ckpt config values");
        static float e[29 * 32];
        const td_ckpt_tensor *t = td_ckpt_find(ck, "param.model.embed_tokens.weight");
        CHECK(td_train_ckpt_get(ck, "model.embed_tokens.weight", e, 29 * 32, &err) == TD_OK && t &&
                  !memcmp(e, t->data, sizeof e),
              "ckpt get: %s", err.msg);
        CHECK(td_train_ckpt_get(ck, "model.embed_tokens.weight", e, 28 * 32, &err) ==
                  TD_ERR_NOT_FOUND,
              "ckpt get accepted a wrong size");
        CHECK(td_train_ckpt_get(ck, "lm_head.weight", e, 29 * 32, &err) == TD_ERR_NOT_FOUND,
              "tied checkpoint has lm_head");
    }
    td_ckpt_close(ck);
    snprintf(fa, sizeof fa, "%s/ckpt-000006.tdck", da);
    CHECK(!same_tensors(fa, fb), "checkpoints of different steps are equal");

    // Errors: vocabulary too small for the shards; no shards; resume without a directory.
    p = tiny(shards, 1);
    p.cfg.vocab_size = 10;
    CHECK(td_train_run(&p, &r, &err) == TD_ERR_INVALID, "vocab 10 accepted for a 29-token shard");
    p = tiny(shards, 0);
    CHECK(td_train_run(&p, &r, &err) == TD_ERR_INVALID, "no shards accepted");
    p = tiny(shards, 1);
    p.resume = 1;
    CHECK(td_train_run(&p, &r, &err) == TD_ERR_INVALID, "resume without out_dir accepted");
    TEST_DONE();
}
