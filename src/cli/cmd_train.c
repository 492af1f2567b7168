// Command-line front end of the training loop (train/train_run.h): flags -> parameters.
// Not here: the loop itself, data preparation (`tandem data prepare`), export.
#include "cli/cmd_train.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/file.h"
#include "base/opts.h"
#include "cli/cli.h"
#include "dist/world.h"
#include "train/tok_record.h"
#include "train/train_run.h"

static void train_epilog(FILE *f) {
    fprintf(f, "backends in this build: %s. Checkpoints are the same files whichever backend wrote them\n",
            td_backend_names());
}

static int td_cmd_train_args(int argc, char **argv);

// Expands --config FILE into flags placed before the command line's own (so those override it):
// numbers and strings become "--key VALUE", true becomes "--key", false is dropped, arrays repeat
// the flag ("shards" entries become positional arguments). Returns a malloc'd argv (strings in
// *store, freed by the caller with cJSON_Delete) or NULL after printing the problem.
static char **expand_config(int argc, char **argv, int *out_argc, cJSON **store) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++)
        if (!strncmp(argv[i], "--config=", 9)) {
            path = argv[i] + 9;
        } else if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tandem train: --config needs a file\n");
                return NULL;
            }
            path = argv[i + 1];
        }
    *store = NULL;
    cJSON *cfg = NULL;
    if (path) {
        char *text;
        td_err err;
        if (td_read_file(path, 1 << 20, &text, NULL, &err) != TD_OK) {
            fprintf(stderr, "tandem train: %s\n", err.msg);
            return NULL;
        }
        cfg = cJSON_Parse(text);
        free(text);
        if (!cJSON_IsObject(cfg)) {
            fprintf(stderr, "tandem train: %s: not a JSON object\n", path);
            cJSON_Delete(cfg);
            return NULL;
        }
    }
    // Worst case two tokens per value; arrays count their elements.
    size_t cap = (size_t)argc + 1;
    const cJSON *it;
    cJSON_ArrayForEach(it, cfg) cap += 2 * (size_t)(cJSON_IsArray(it) ? cJSON_GetArraySize(it) : 1);
    char **out = calloc(cap, sizeof *out);
    cJSON *strs = cJSON_CreateArray();  // owns the formatted strings
    if (!out || !strs) {
        free(out);
        cJSON_Delete(strs);
        cJSON_Delete(cfg);
        return NULL;
    }
    int n = 0;
    out[n++] = argv[0];
    int bad = 0;
    cJSON_ArrayForEach(it, cfg) {
        char flag[128];
        snprintf(flag, sizeof flag, "--%s", it->string);
        const int positional = !strcmp(it->string, "shards");
        const cJSON *vals = it;
        int count = cJSON_IsArray(it) ? cJSON_GetArraySize(it) : 1;
        for (int j = 0; j < count && !bad; j++) {
            const cJSON *v = cJSON_IsArray(it) ? cJSON_GetArrayItem(vals, j) : it;
            char buf[64];
            const char *val = NULL;
            if (cJSON_IsBool(v)) {
                if (cJSON_IsFalse(v)) continue;
            } else if (cJSON_IsNumber(v)) {
                snprintf(buf, sizeof buf, "%.17g", v->valuedouble);
                val = buf;
            } else if (cJSON_IsString(v)) {
                val = v->valuestring;
            } else {
                fprintf(stderr, "tandem train: %s: \"%s\" must be a number, string, boolean or array of those\n",
                        path, it->string);
                bad = 1;
                break;
            }
            if (!positional) {
                cJSON_AddItemToArray(strs, cJSON_CreateString(flag));
                out[n++] = cJSON_GetArrayItem(strs, cJSON_GetArraySize(strs) - 1)->valuestring;
            }
            if (val) {
                cJSON_AddItemToArray(strs, cJSON_CreateString(val));
                out[n++] = cJSON_GetArrayItem(strs, cJSON_GetArraySize(strs) - 1)->valuestring;
            }
        }
    }
    cJSON_Delete(cfg);
    if (bad) {
        free(out);
        cJSON_Delete(strs);
        return NULL;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            i++;
            continue;
        }
        if (!strncmp(argv[i], "--config=", 9)) continue;
        out[n++] = argv[i];
    }
    *out_argc = n;
    *store = strs;
    return out;
}

int td_cmd_train(int argc, char **argv) {
    cJSON *store = NULL;
    char **full = expand_config(argc, argv, &argc, &store);
    if (!full) return 2;
    argv = full;
    int rc = td_cmd_train_args(argc, argv);
    free(full);
    cJSON_Delete(store);
    return rc;
}

typedef struct {
    const char **vals;
    int n_val;
} train_ctx;

static bool opt_val(void *ctx, const td_opt *opt, const char *v) {
    train_ctx *c = ctx;
    if (!*v) return fprintf(stderr, "tandem train: --%s needs a value\n", opt->name), false;
    c->vals[c->n_val++] = v;
    return true;
}

static int td_cmd_train_args(int argc, char **argv) {
    td_train_run_params p = td_train_run_default_params();
    const char **shards = calloc((size_t)argc + 1, sizeof *shards);
    const char **vals = calloc((size_t)argc + 1, sizeof *vals);
    if (!shards || !vals) {
        free(shards);
        free(vals);
        return 1;
    }
    int n = 0, kv = 0, hd = 0, ffn = 0, warm = -1, gemm = -1;
    double min_lr = -1, bucket_mb = 25, comm_timeout = TD_COMM_DEFAULT_TIMEOUT_MS / 1000.0;
    bool untied = false, bf16 = false, recompute = false, resume = false, allow_changed = false;
    const char *config = NULL;
    train_ctx tc = {.vals = vals};
    const td_opt opts[] = {
        {TD_OPT_SEC("model (from scratch unless --model):")},
        {TD_OPT_S("model", &p.model_dir, "DIR", "start from an HF model directory or .gguf file")},
        {TD_OPT_I("dim", &p.cfg.dim, 2, 1 << 16, "N", "model width (128)")},
        {TD_OPT_I("layers", &p.cfg.n_layers, 1, 1024, "N", "layers (4)")},
        {TD_OPT_I("heads", &p.cfg.n_heads, 1, 1024, "N", "attention heads (4)")},
        {TD_OPT_I("kv-heads", &kv, 1, 1024, "N", "key/value heads (= heads)")},
        {TD_OPT_I("head-dim", &hd, 2, 512, "N", "per-head width (dim/heads)")},
        {TD_OPT_I("ffn", &ffn, 1, 1 << 20, "N", "MLP width (3 * dim)")},
        {TD_OPT_I("vocab", &p.cfg.vocab_size, 1, 1 << 24, "N", "vocabulary (the shards')")},
        {TD_OPT_B("untied", &untied, "an output head of its own (default: tied to the embeddings)")},
        {TD_OPT_F("rope-theta", &p.cfg.rope_theta, 1, 1e9, "X", "RoPE base (10000)")},
        {TD_OPT_F("init-std", &p.init_std, 0, 10, "X", "normal init std (0.02)")},
        {TD_OPT_SEC("step:")},
        {TD_OPT_I("batch", &p.model.batch, 1, 1 << 16, "N", "sequences per step (4)")},
        {TD_OPT_I("seq-len", &p.model.seq_len, 1, 1 << 20, "N", "tokens per sequence (128)")},
        {TD_OPT_I("accum", &p.trainer.grad_accum, 1, 1 << 16, "N", "gradient accumulation micro-steps (1)")},
        {TD_OPT_I("steps", &p.steps, 1, 1L << 30, "N", "optimizer steps (1000)")},
        {TD_OPT_F("lr", &p.trainer.lr.max_lr, 0, 10, "X", "peak learning rate (3e-4)")},
        {TD_OPT_F("min-lr", &min_lr, 0, 10, "X", "final learning rate of the cosine schedule (lr/10)")},
        {TD_OPT_I("warmup", &warm, 0, 1L << 30, "N", "linear warmup steps (steps/20)")},
        {TD_OPT_F("clip", &p.trainer.grad_clip, 0, 1e9, "X", "gradient norm clip (1.0; 0 = off)")},
        {TD_OPT_F("wd", &p.trainer.adam.weight_decay, 0, 10, "X", "AdamW weight decay (0.1)")},
        {TD_OPT_F("beta1", &p.trainer.adam.beta1, 0, 0.999999, "X", "AdamW beta1 (0.9)")},
        {TD_OPT_F("beta2", &p.trainer.adam.beta2, 0, 0.999999999, "X", "AdamW beta2 (0.95)")},
        {TD_OPT_F("eps", &p.trainer.adam.eps, 0, 1, "X", "AdamW epsilon (1e-8)")},
        {TD_OPT_B("bf16", &bf16, "bf16 matmul operands, f32 accumulation and master weights")},
        {TD_OPT_C("gemm", &gemm, "kernels dnnl", "G",
                  "matmuls: kernels (default: tandem's own) or dnnl (oneDNN, when built in)")},
        {TD_OPT_SEC("data parallel (under mpirun -np N; docs/training.md):\n"
                    "  --batch is the global batch (divided among the ranks); --accum is per rank")},
        {TD_OPT_I("zero", &p.trainer.zero, 0, 2, "S",
                  "0: all-reduce gradients (default); 1: shard the optimizer state\n"
                  "(ZeRO-1); 2: also the gradients and their accumulator (ZeRO-2)")},
        {TD_OPT_F("bucket-mb", &bucket_mb, 0.001, 1 << 20, "X",
                  "gradient bucket size (25): each bucket's reduction overlaps backward")},
        {TD_OPT_I("grad-ring", &p.trainer.grad_ring, -1, TD_TRAINER_MAX_RING, "N",
                  "ZeRO-2: backward writes buckets into N bucket-sized buffers instead\n"
                  "of a full-size gradient (0, default: 2 where that is smaller;\n"
                  "-1: the full-size one)")},
        {TD_OPT_F("comm-timeout", &comm_timeout, 0.001, 1e6, "S",
                  "seconds any wait on another rank may take before the job fails (300)")},
        {TD_OPT_B("recompute", &recompute, "recompute layer activations in backward (less memory)")},
        {TD_OPT_SEC("config:")},
        {TD_OPT_S("config", &config, "FILE",
                  "a JSON object of options: keys are the flag names without '--'\n"
                  "({\"dim\": 256, \"bf16\": true, \"shards\": [\"a.tdsh\"], \"val\": [...]});\n"
                  "flags on the command line override it")},
        {TD_OPT_SEC("evaluation:")},
        {TD_OPT_CB("val", opt_val, true, "SHARD", "a validation shard (repeat for more)")},
        {TD_OPT_I("eval-every", &p.eval_every, 0, 1L << 40, "N", "validation loss every N steps and at the end (0, default: only\n"
                  "at the end; with --val)")},
        {TD_OPT_I("eval-batches", &p.eval_batches, 1, 1 << 20, "N", "batches of B x T per validation pass, from the start of the val\n"
                  "shards (8)")},
        {TD_OPT_S("metrics", &p.metrics_path, "FILE", "also write one JSON line of metrics per step to FILE")},
        {TD_OPT_SEC("run:")},
        {TD_OPT_S("out", &p.out_dir, "DIR", "checkpoint directory")},
        {TD_OPT_I("ckpt-every", &p.ckpt_every, 0, 1L << 40, "N", "checkpoint every N steps (0: only at the end)")},
        {TD_OPT_I("keep", &p.keep, 0, 1 << 20, "N", "checkpoints kept (3)")},
        {TD_OPT_B("resume", &resume, "continue from the newest checkpoint in --out")},
        {TD_OPT_B("allow-changed-config", &allow_changed,
                  "--resume with batch x accum, seq-len, lr schedule, AdamW, clip,\n"
                  "seed or precision unlike the checkpoint's: warn and record (else refused)")},
        {TD_OPT_I("seed", &p.seed, 0, 1L << 62, "N", "initialization and data order seed (1)")},
        {TD_OPT_I("threads", &p.model.n_threads, 0, 4096, "N", "the cpu backend's threads (all CPUs)")},
        {TD_OPT_S("backend", &p.model.backend_name, "NAME",
                  "where the model, gradients, activations and optimizer state live and\n"
                  "every slot runs (default $TANDEM_BACKEND, else cpu)")},
    };
    const td_opts t = {.prog = "tandem train",
                       .usage = "usage: tandem train [options] SHARD...\n"
                                "  Trains on token shards (from `tandem data prepare`) and writes checkpoints to --out.\n",
                       .opts = opts,
                       .n = (int)(sizeof opts / sizeof opts[0]),
                       .epilog_fn = train_epilog,
                       .ctx = &tc,
                       .max_pos = -1};
    int pr = td_opts_parse(&t, argc, argv, &n);
    int ok = pr > 0;
    if (pr == 0) {
        free(shards);
        free(vals);
        return 0;
    }
    for (int i = 0; ok && i < n; i++) shards[i] = argv[1 + i];
    const char *empty = !p.model_dir || *p.model_dir ? (!p.out_dir || *p.out_dir ? NULL : "--out") : "--model";
    if (ok && (empty || (p.metrics_path && !*p.metrics_path) || (p.model.backend_name && !*p.model.backend_name))) {
        fprintf(stderr, "tandem train: %s needs a value\n",
                empty ? empty : p.metrics_path && !*p.metrics_path ? "--metrics" : "--backend");
        ok = 0;
    }
    if (untied) p.cfg.tie_embeddings = false;
    if (bf16) p.model.precision = TD_TRAIN_BF16;
    if (recompute) p.model.recompute = 1;
    if (allow_changed) p.allow_changed = 1;
    if (resume) p.resume = 1;
    if (gemm >= 0) p.model.gemm = gemm == 1 ? TD_TRAIN_GEMM_DNNL : TD_TRAIN_GEMM_KERNELS;
    int n_val = tc.n_val;
    if (ok && n == 0) {
        fprintf(stderr, "tandem train: no shard files given\n");
        ok = 0;
    }
    if (!ok) {
        td_opts_help(&t, stderr);
        free(shards);
        free(vals);
        return 2;
    }
    p.cfg.n_kv_heads = kv ? kv : p.cfg.n_heads;
    p.cfg.head_dim = hd ? hd : p.cfg.dim / p.cfg.n_heads;
    p.cfg.ffn_dim = ffn ? ffn : 3 * p.cfg.dim;
    p.trainer.lr.min_lr = min_lr >= 0 ? (float)min_lr : p.trainer.lr.max_lr / 10;
    p.trainer.lr.warmup_steps = warm >= 0 ? warm : (int)(p.steps / 20);
    p.trainer.lr.total_steps = (int)p.steps;
    p.shards = shards;
    p.n_shards = n;
    p.log = stdout;
    p.trainer.bucket_elems = (size_t)(bucket_mb * 1048576.0 / sizeof(float));
    if (!p.trainer.bucket_elems) p.trainer.bucket_elems = 1;
    td_err err = {0};
    td_train_run_result r;
    // The shards' tokenizer (copied beside them by `data prepare`) goes beside the checkpoints,
    // its hash into each of them, so that `tandem export` needs no --tokenizer.
    char tok_hex[17], shard_dir[4096];
    const char *slash = strrchr(shards[0], '/');
    snprintf(shard_dir, sizeof shard_dir, "%.*s", slash ? (int)(slash - shards[0]) : 1, slash ? shards[0] : ".");
    char tok_json[4200];
    snprintf(tok_json, sizeof tok_json, "%s/tokenizer.json", shard_dir);
    if (!p.out_dir) {
        fprintf(stderr, "tandem train: no --out DIR: no checkpoint will be written\n");
    } else if (!td_file_exists(tok_json)) {
        fprintf(stderr, "tandem train: note: no tokenizer.json beside %s: the checkpoints record no tokenizer "
                        "(`tandem export` will need --tokenizer)\n", shards[0]);
    } else if (td_tok_record_copy(shard_dir, p.out_dir, tok_hex, &err)) {
        fprintf(stderr, "tandem train: copying the tokenizer: %s\n", err.msg);
        free(shards);
        free(vals);
        return 1;
    } else {
        p.tokenizer_xxh3 = tok_hex;
    }
    p.val_shards = n_val ? vals : NULL;
    p.n_val_shards = n_val;
    // Every process of an mpirun job is one data-parallel rank; alone, the only one.
    td_comm *world = NULL;
    td_status st = td_comm_world_create(&world, &err);
    if (st == TD_OK) {
        td_comm_set_timeout(world, (int)(comm_timeout * 1000.0 + 0.5) > 0 ? (int)(comm_timeout * 1000.0 + 0.5) : 1);
        p.trainer.comm = world;
        if (td_comm_rank(world) != 0) p.log = NULL;  // rank 0 speaks for the job
        st = td_train_run(&p, &r, &err);
    }
    const int rank = world ? td_comm_rank(world) : 0, size = world ? td_comm_size(world) : 1;
    if (st && size > 1) td_comm_abort(world, err.msg);  // the others stop too
    td_comm_free(world);
    free(shards);
    free(vals);
    if (st) {
        if (size > 1)
            fprintf(stderr, "tandem train: rank %d of %d: %s\n", rank, size, err.msg);
        else
            fprintf(stderr, "tandem train: %s\n", err.msg);
        return 1;
    }
    if (rank == 0) printf("done: %ld steps, loss %.4f -> %.4f\n", r.steps_done, r.first_loss, r.last_loss);
    return 0;
}
