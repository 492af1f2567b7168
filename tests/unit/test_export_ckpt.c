// `tandem export` end to end: a tiny model is trained a few steps (td_train_run on shards made
// with a BPE tokenizer trained here), its checkpoint exported to an HF directory (f32) and a GGUF
// file (f32) by `$TANDEM_BIN export` (without the binary a failure; the export API it wraps then
// still writes both, so that the rest runs), both loaded with td_model_load; the engine's
// per-token log-probabilities on a batch equal the trainer's own forward from the same checkpoint
// within 1e-4; config, tokenizer and special ids carried over; `tandem run` loads both; usage and
// input errors.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/file.h"
#include "model/export.h"
#include "model/forward.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "train/bpe_train.h"
#include "train/ckpt.h"
#include "train/model_train.h"
#include "train/shards.h"
#include "train/train_run.h"

enum { B = 2, T = 16 };

static const char *TEXT =
    "The jury said it did find that many of the registration and election laws are outmoded. "
    "It recommended that the legislators act to have these laws studied and revised. "
    "The grand jury commented on a number of other topics, among them the purchasing departments. "
    "Merger proposed: the jury said a proposal to merge the two offices would save money. ";

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// Per-token log-probabilities of tgt under row-major logits [n, V], into lp[n].
static void logprobs(const float *logits, const int32_t *tgt, int n, int V, double *lp) {
    for (int i = 0; i < n; i++) {
        const float *r = logits + (size_t)i * V;
        double mx = r[0], s = 0;
        for (int v = 1; v < V; v++) mx = r[v] > mx ? r[v] : mx;
        for (int v = 0; v < V; v++) s += exp((double)r[v] - mx);
        lp[i] = (double)r[tgt[i]] - mx - log(s);
    }
}

// The engine's log-probabilities on the batch for the model at `path` vs the trainer's (want).
static void check_engine(const char *path, const char *what, const int32_t *tok, const int32_t *tgt,
                         const double *want, const td_model_config *ref) {
    td_model *m = NULL;
    td_err err = {0};
    if (td_model_load(path, &m, &err) != TD_OK) {
        CHECK(0, "%s: load: %s", what, err.msg);
        return;
    }
    const int V = m->cfg.vocab_size;
    CHECK(V == ref->vocab_size && m->cfg.dim == ref->dim && m->cfg.n_layers == ref->n_layers &&
              m->cfg.n_heads == ref->n_heads && m->cfg.n_kv_heads == ref->n_kv_heads &&
              m->cfg.ffn_dim == ref->ffn_dim && m->cfg.tie_embeddings == ref->tie_embeddings,
          "%s: config differs from the checkpoint's", what);
    td_forward *f = NULL;
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = T, fp.max_ctx = T, fp.n_threads = 2;
    float *lg = malloc((size_t)T * V * sizeof *lg);
    double lp[T], worst = 0;
    if (td_forward_create(m, &fp, &f, &err) != TD_OK) {
        CHECK(0, "%s: forward: %s", what, err.msg);
        goto done;
    }
    for (int b = 0; b < B; b++) {
        int32_t pos[T], seq[T];
        for (int t = 0; t < T; t++) pos[t] = t, seq[t] = 0;
        td_forward_seq_clear(f, 0);
        td_batch bt = {.n_tokens = T, .tokens = tok + b * T, .pos = pos, .seq_id = seq};
        CHECK(td_forward_run(f, &bt, lg, &err) == TD_OK, "%s: run: %s", what, err.msg);
        logprobs(lg, tgt + b * T, T, V, lp);
        for (int t = 0; t < T; t++) worst = fmax(worst, fabs(lp[t] - want[b * T + t]));
    }
    printf("%-5s max |log-prob diff| vs the trainer's forward: %.3g\n", what, worst);
    CHECK(worst <= 1e-4, "%s: engine vs trainer log-probabilities differ by %g", what, worst);
done:
    free(lg);
    td_forward_free(f);
    td_model_free(m);
}

int main(void) {
    char dir[512], tokdir[600], shard[600], ckdir[600], hfdir[600], gguf[600], cmd[4096];
    snprintf(dir, sizeof dir, "%s/export_ckpt_test", td_test_data_dir());
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    CHECK(sh(cmd) == 0, "mkdir %s", dir);
    snprintf(tokdir, sizeof tokdir, "%s/tok", dir);
    snprintf(shard, sizeof shard, "%s/train.tdsh", dir);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", dir);
    snprintf(hfdir, sizeof hfdir, "%s/hf", dir);
    snprintf(gguf, sizeof gguf, "%s/model.gguf", dir);
    td_err err = {0};

    // A 300-token byte-level BPE tokenizer and one shard of the text, repeated.
    td_bpe_params bp = td_bpe_default_params();
    bp.vocab_size = 300;
    bp.min_frequency = 1;
    td_bpe_trainer *bt = NULL;
    CHECK(td_bpe_trainer_new(&bp, &bt, &err) == TD_OK && td_bpe_feed(bt, TEXT, strlen(TEXT), &err) == TD_OK &&
              td_bpe_train(bt, &err) == TD_OK && td_bpe_write(bt, tokdir, &err) == TD_OK,
          "bpe: %s", err.msg);
    td_bpe_trainer_free(bt);
    td_tokenizer *tk = NULL;
    td_tokens ids = {0};
    CHECK(td_tokenizer_load(tokdir, &tk, &err) == TD_OK, "tokenizer: %s", err.msg);
    if (!tk) TEST_DONE();
    const int V = td_tokenizer_vocab_size(tk), eos = td_tokenizer_eos_id(tk), bos = td_tokenizer_bos_id(tk);
    CHECK(td_tokenizer_encode(tk, TEXT, strlen(TEXT), false, &ids, &err) == TD_OK && ids.n > 40, "encode: %s",
          err.msg);
    enum { NTOK = 2000 };
    static int32_t stream[NTOK];
    for (int i = 0; i < NTOK; i++) stream[i] = (i + 1) % ((int)ids.n + 1) == 0 ? eos : ids.ids[i % (ids.n + 1)];
    CHECK(td_shard_write(shard, V, stream, NTOK, 1, &err) == TD_OK, "shard: %s", err.msg);

    // A few steps of a tiny GQA model (tied embeddings) on it.
    td_train_run_params p = td_train_run_default_params();
    const char *shards[] = {shard};
    p.shards = shards, p.n_shards = 1;
    p.cfg.dim = 32, p.cfg.n_layers = 2, p.cfg.n_heads = 4, p.cfg.n_kv_heads = 2, p.cfg.head_dim = 8;
    p.cfg.ffn_dim = 64;
    p.model.batch = 2, p.model.seq_len = T, p.model.n_threads = 2;
    p.trainer.lr = (td_lr_schedule){.max_lr = 1e-2f, .min_lr = 1e-3f, .warmup_steps = 2, .total_steps = 8};
    p.steps = 8, p.init_std = 0.1f, p.out_dir = ckdir, p.ckpt_every = 4;
    td_train_run_result r;
    CHECK(td_train_run(&p, &r, &err) == TD_OK, "train: %s", err.msg);
    printf("trained: loss %.4f -> %.4f\n", r.first_loss, r.last_loss);

    // The trainer's own forward from the newest checkpoint.
    char ckpath[700];
    snprintf(ckpath, sizeof ckpath, "%s/ckpt-000008.tdck", ckdir);
    td_ckpt *ck = NULL;
    td_model_config cfg;
    CHECK(td_ckpt_open(ckpath, &ck, &err) == TD_OK && td_train_ckpt_config(ck, &cfg, &err) == TD_OK,
          "checkpoint: %s", err.msg);
    td_ckpt_close(ck);
    td_tmodel_params tp = td_tmodel_default_params();
    tp.batch = B, tp.seq_len = T, tp.n_threads = 2;
    td_tmodel *tm = NULL;
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = stream[100 + i], tgt[i] = stream[101 + i];
    static double want[B * T];
    int ok = td_tmodel_create(&cfg, &tp, &tm, &err) == TD_OK && td_train_load_ckpt_params(tm, ckpath, &err) == TD_OK &&
             td_tmodel_forward(tm, tok, tgt, NULL, NULL, &err) == TD_OK;
    CHECK(ok, "trainer forward: %s", err.msg);
    if (ok) logprobs(td_tmodel_logits(tm), tgt, B * T, cfg.vocab_size, want);
    td_tmodel_free(tm);

    // Export: the CLI (directory -> newest checkpoint; tokenizer copied); the API without it.
    const char *bin = td_test_bin();
    if (bin) {
        snprintf(cmd, sizeof cmd, "'%s' export '%s' --to hf -o '%s' --tokenizer '%s' 2>/dev/null", bin, ckdir, hfdir,
                 tokdir);
        CHECK(sh(cmd) == 0, "%s", cmd);
        snprintf(cmd, sizeof cmd, "'%s' export '%s' --to gguf --type f32 -o '%s' --tokenizer '%s' 2>/dev/null", bin,
                 ckpath, gguf, tokdir);
        CHECK(sh(cmd) == 0, "%s", cmd);
    } else {
        printf("no tandem binary (a failure): exporting through the API for the checks below\n");
        td_export_params ep = td_export_default_params();
        ep.tokenizer = tokdir;
        cfg.bos_id = bos, cfg.eos_ids[0] = eos, cfg.n_eos = 1;  // what the CLI takes from the tokenizer
        CHECK(td_ckpt_open(ckpath, &ck, &err) == TD_OK, "%s", err.msg);
        CHECK(td_export_hf(hfdir, &cfg, &ep, td_train_ckpt_get, ck, &err) == TD_OK, "hf: %s", err.msg);
        CHECK(td_export_gguf(gguf, &cfg, &ep, td_train_ckpt_get, ck, &err) == TD_OK, "gguf: %s", err.msg);
        td_ckpt_close(ck);
    }
    check_engine(hfdir, "hf", tok, tgt, want, &cfg);
    check_engine(gguf, "gguf", tok, tgt, want, &cfg);

    // Special ids and the tokenizer travel with the model.
    td_model *m = NULL;
    if (td_model_load(hfdir, &m, &err) == TD_OK) {
        CHECK(m->cfg.bos_id == bos && m->cfg.n_eos >= 1 && m->cfg.eos_ids[0] == eos, "hf: bos %d eos %d, want %d %d",
              m->cfg.bos_id, m->cfg.n_eos ? m->cfg.eos_ids[0] : -1, bos, eos);
        td_model_free(m);
    }
    char tj[700];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", hfdir);
    CHECK(td_file_exists(tj), "no tokenizer.json in the HF export");
    td_tokenizer *tk2 = NULL;
    td_tokens ids2 = {0};
    CHECK(td_tokenizer_load(gguf, &tk2, &err) == TD_OK &&
              td_tokenizer_encode(tk2, TEXT, strlen(TEXT), false, &ids2, &err) == TD_OK && ids2.n == ids.n &&
              !memcmp(ids2.ids, ids.ids, ids.n * sizeof *ids.ids),
          "gguf tokenizer encodes differently: %s", err.msg);
    td_tokens_free(&ids2);
    td_tokenizer_free(tk2);

    if (bin) {
        // `tandem run` loads both and generates.
        const char *paths[] = {hfdir, gguf};
        for (int i = 0; i < 2; i++) {
            snprintf(cmd, sizeof cmd, "'%s' run '%s' --prompt 'The jury' -n 8 --temperature 0 --ignore-eos >/dev/null 2>&1",
                     bin, paths[i]);
            CHECK(sh(cmd) == 0, "%s", cmd);
        }
        // Errors: no checkpoint (1), missing arguments / bad options (2), an empty directory (1).
        snprintf(cmd, sizeof cmd, "'%s' export '%s/nope.tdck' -o '%s/x' 2>/dev/null", bin, dir, dir);
        CHECK(sh(cmd) == 1, "missing checkpoint accepted");
        snprintf(cmd, sizeof cmd, "'%s' export '%s' 2>/dev/null", bin, ckdir);
        CHECK(sh(cmd) == 2, "no -o accepted");
        snprintf(cmd, sizeof cmd, "'%s' export '%s' --to onnx -o '%s/x' 2>/dev/null", bin, ckdir, dir);
        CHECK(sh(cmd) == 2, "--to onnx accepted");
        snprintf(cmd, sizeof cmd, "'%s' export '%s' --to hf --type q8_0 -o '%s/x' 2>/dev/null", bin, ckdir, dir);
        CHECK(sh(cmd) == 2, "hf q8_0 accepted");
        snprintf(cmd, sizeof cmd, "'%s' export '%s' -o '%s/x' 2>/dev/null", bin, tokdir, dir);
        CHECK(sh(cmd) == 1, "a directory without checkpoints accepted");
        snprintf(cmd, sizeof cmd, "'%s' export '%s' -o '%s/x' 2>/dev/null", bin, tj, dir);
        CHECK(sh(cmd) == 1, "a non-checkpoint file accepted");
    }
    td_tokens_free(&ids);
    td_tokenizer_free(tk);
    TEST_DONE();
}
