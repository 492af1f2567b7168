// The training loop behind `tandem train`: token shards -> deterministic batches (loader.h) ->
// trainer steps (trainer.h) -> rotating atomic checkpoints (ckpt.h) with resume, and a progress
// line per step. From scratch (HF-style random init) or from a model directory.
// Not here: argument parsing (cli/cmd_train.c), export to HF/GGUF, data-parallel ranks.
#ifndef TD_TRAIN_TRAIN_RUN_H
#define TD_TRAIN_TRAIN_RUN_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "model/config.h"
#include "train/model_train.h"
#include "train/trainer.h"

typedef struct td_train_run_params {
    const char *const *shards;  // token shard files (shards.h)
    int n_shards;
    const char
        *model_dir;       // start from these weights (HF dir or .gguf); NULL: from scratch with cfg
    td_model_config cfg;  // used from scratch; vocab_size 0 = the shards' vocabulary
    td_tmodel_params model;  // batch, seq_len, threads, precision, recompute
    td_trainer_params trainer;
    long steps;           // optimizer steps in total (a resumed run continues up to this)
    uint64_t seed;        // initialisation and data order
    float init_std;       // 0.02
    const char *out_dir;  // checkpoints (ckpt-<step>.tdck); NULL: none
    long ckpt_every;      // steps between checkpoints (and one at the end); <= 0: only the end
    int keep;             // checkpoints kept (<= 0: all)
    int resume;           // continue from the newest checkpoint in out_dir if there is one
    int allow_changed;    // resume: accept settings that differ from the checkpoint's (warned, recorded)
    FILE *log;            // progress lines (NULL: none)
    const char *const *val_shards;  // validation shards (NULL: no evaluation)
    int n_val_shards;
    long eval_every;   // steps between evaluations (and one at the end); <= 0: only the end
    int eval_batches;  // batches of B x T per evaluation, from the start of the val shards (8)
    const char *metrics_path;  // JSON lines appended per step (`tandem plot`); NULL: none
    const char *tokenizer_xxh3;  // XXH3-64 (16 hex digits) of out_dir/tokenizer.json, the tokenizer
                                 // of the shards, recorded in every checkpoint; NULL: none known
} td_train_run_params;

// Defaults: a small llama (dim 128, 4 layers, 4 heads, ffn 384, tied), batch 4 x 128, accumulation
// 1, 1000 steps, lr 3e-4 -> 3e-5 over the run with 50 warm-up steps, clip 1, seed 1, keep 3.
td_train_run_params td_train_run_default_params(void);

typedef struct td_train_run_result {
    long steps_done;    // steps taken by this call
    long last_step;     // index of the last step (total steps so far - 1)
    double first_loss;  // loss of this call's first step
    double last_loss;   // loss of the last step
    double val_loss;    // mean loss of the last evaluation (NAN if none)
} td_train_run_result;

// Runs the loop. Progress: "step S/N | loss L | lr R | norm G | T tok/s" (one line per step; on a
// terminal one line rewritten in place, kept at evaluations, checkpoints and the end), and "val S | loss L"
// after evaluations (the same first eval_batches windows every time, in order, no shuffling; the
// per-token loss of td_eval_token_nll, as `tandem eval`). metrics_path gets one JSON object per
// step: {"step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"[, "val_loss"]}; loss and
// grad_norm with 17 significant digits (the double exactly, so runs compare bit for bit).
// out_dir gets train_config.json at the start of every run: every resolved option (model config,
// batch, schedule, AdamW, precision, threads, shards, checkpointing, resumed_from_step).
// A checkpoint holds every parameter by HF name ("param.<name>", f32), the AdamW moments
// ("adam.m", "adam.v", flat) and metadata {"step", "loader", "seed", "config": {HF config.json
// keys}[, "tokenizer": {"file": "tokenizer.json", "xxh3": tokenizer_xxh3}]}; resuming restores them and the data position, so a run cut at a checkpoint and resumed
// equals the uninterrupted run bit for bit. out may be NULL.
td_status td_train_run(const td_train_run_params *p, td_train_run_result *out, td_err *err);

// The final (or any) weights of a run's trainable model, for tests and export: opens a
// checkpoint written by td_train_run and copies its parameters into tm (same layout).
td_status td_train_load_ckpt_params(td_tmodel *tm, const char *ckpt_path, td_err *err);

// For export (model/export.h's td_export_get_fn shape): the model config stored in a checkpoint's
// metadata (parsed as an HF config.json), and the f32 values of parameter hf_name (ctx: the
// opened const td_ckpt *; TD_ERR_NOT_FOUND for an absent tensor or another size).
struct td_ckpt;
struct td_ckpt_tensor;
// The tensors of a one-file checkpoint of tm, as td_train_run writes them (also the RL loop's):
// "param.<hf name>" (f32, from the host view: sync it first) for every parameter, then "adam.m"
// and "adam.v" (am, av: [n_params] each). ts has room for td_tmodel_n_tensors(tm) + 2 entries and
// names for td_tmodel_n_tensors(tm) * TD_TRAIN_CKPT_NAME bytes; returns the count written.
#define TD_TRAIN_CKPT_NAME 80
int td_train_ckpt_tensors(td_tmodel *tm, const float *am, const float *av, struct td_ckpt_tensor *ts, char *names);
// Every "param.<name>" of an opened checkpoint into tm's host view, then uploaded; TD_ERR_FORMAT
// naming `what` and the tensor when one is missing or of another size.
td_status td_train_ckpt_load_params(td_tmodel *tm, const struct td_ckpt *ck, const char *what, td_err *err);
// The model's hyper-parameters as an HF config.json object (what td_config_from_hf_json reads):
// the "config" of a checkpoint's metadata. Owned by the caller (cJSON_Delete); NULL out of memory.
struct cJSON;
struct cJSON *td_train_config_json(const td_model_config *c);
td_status td_train_ckpt_config(const struct td_ckpt *ck, td_model_config *out, td_err *err);
td_status td_train_ckpt_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err);

#endif
