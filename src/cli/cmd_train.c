// Command-line front end of the training loop (train/train_run.h): flags -> parameters.
// Not here: the loop itself, data preparation (`tandem data prepare`), export.
#include "cli/cmd_train.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/file.h"
#include "cli/cli.h"
#include "dist/world.h"
#include "train/tok_record.h"
#include "train/train_run.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: tandem train [options] SHARD...\n"
        "  Trains on token shards (from `tandem data prepare`) and writes checkpoints to --out.\n"
        "model (from scratch unless --model):\n"
        "  --model DIR         start from an HF model directory or .gguf file\n"
        "  --dim N (128)  --layers N (4)  --heads N (4)  --kv-heads N (= heads)  --head-dim N "
        "(dim/heads)\n"
        "  --ffn N (3 * dim)   --vocab N (the shards')  --untied  --rope-theta X (10000)\n"
        "  --init-std X        normal init std (0.02)\n"
        "step:\n"
        "  --batch N (4)  --seq-len N (128)  --accum N (1)  --steps N (1000)\n"
        "  --lr X (3e-4)  --min-lr X (lr/10)  --warmup N (steps/20)  --clip X (1.0; 0 = off)\n"
        "  --wd X (0.1)  --beta1 X (0.9)  --beta2 X (0.95)  --eps X (1e-8)\n"
        "  --bf16          bf16 matmul operands, f32 accumulation and master weights\n"
        "data parallel (under mpirun -np N; docs/training.md):\n"
        "  --batch is the global batch (divided among the ranks); --accum is per rank\n"
        "  --zero S (0)    0: all-reduce gradients; 1: shard the optimizer state (ZeRO-1);\n"
        "                  2: also the gradients and their accumulator (ZeRO-2)\n"
        "  --bucket-mb X (25)  gradient bucket size: each bucket's reduction overlaps backward\n"
        "  --grad-ring N (0)  ZeRO-2: backward writes buckets into N bucket-sized buffers instead of a\n"
        "                  full-size gradient (0: 2 where that is smaller; -1: the full-size one)\n"
        "  --comm-timeout S (300)  seconds any wait on another rank may take before the job fails\n"
        "  --recompute     recompute layer activations in backward (less memory)\n"
        "config:\n"
        "  --config FILE   a JSON object of options: keys are the flag names without '--'\n"
        "                  ({\"dim\": 256, \"bf16\": true, \"shards\": [\"a.tdsh\"], \"val\": [...]});\n"
        "                  flags on the command line override it\n"
        "run:\n"
        "  --out DIR       checkpoint directory    --ckpt-every N (0: only at the end)\n"
        "  --keep N (3)    checkpoints kept        --resume   continue from the newest in --out\n"
        "  --allow-changed-config  --resume with batch x accum, seq-len, lr schedule, AdamW, clip,\n"
        "                  seed or precision unlike the checkpoint's: warn and record (else refused)\n"
        "  --seed N (1)    --threads N (all CPUs; the cpu backend's)\n"
        "  --backend NAME  where the model, gradients, activations and optimizer state live and\n"
        "                  every slot runs (default $TANDEM_BACKEND, else cpu); this build has:\n"
        "                  %s. Checkpoints are the same files whichever backend wrote them\n",
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
        if (!strcmp(argv[i], "--config")) {
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

static int td_cmd_train_args(int argc, char **argv) {
    td_train_run_params p = td_train_run_default_params();
    const char **shards = calloc((size_t)argc + 1, sizeof *shards);
    const char **vals = calloc((size_t)argc + 1, sizeof *vals);
    if (!shards || !vals) {
        free(shards);
        free(vals);
        return 1;
    }
    int n_val = 0;
    int n = 0, kv = 0, hd = 0, ffn = 0, warm = -1;
    double min_lr = -1, bucket_mb = 25, comm_timeout = TD_COMM_DEFAULT_TIMEOUT_MS / 1000.0;
    int ok = 1;
    for (int i = 1; ok && i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x = 0;
        double d = 0;
#define INT(flag, lo, hi, dst)             \
    else if (!strcmp(a, flag)) {           \
        ok = td_arg_int(a, v, lo, hi, &x); \
        dst = x;                           \
        i++;                               \
    }
#define FLT(flag, lo, hi, dst)               \
    else if (!strcmp(a, flag)) {             \
        ok = td_arg_float(a, v, lo, hi, &d); \
        dst = d;                             \
        i++;                                 \
    }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(shards);
            free(vals);
            return 0;
        }
        INT("--dim", 2, 1 << 16, p.cfg.dim)
        INT("--layers", 1, 1024, p.cfg.n_layers)
        INT("--heads", 1, 1024, p.cfg.n_heads)
        INT("--kv-heads", 1, 1024, kv)
        INT("--head-dim", 2, 512, hd)
        INT("--ffn", 1, 1 << 20, ffn)
        INT("--vocab", 1, 1 << 24, p.cfg.vocab_size)
        FLT("--rope-theta", 1, 1e9, p.cfg.rope_theta)
        FLT("--init-std", 0, 10, p.init_std)
        INT("--batch", 1, 1 << 16, p.model.batch)
        INT("--seq-len", 1, 1 << 20, p.model.seq_len)
        INT("--accum", 1, 1 << 16, p.trainer.grad_accum)
        INT("--steps", 1, 1L << 30, p.steps)
        FLT("--lr", 0, 10, p.trainer.lr.max_lr)
        FLT("--min-lr", 0, 10, min_lr)
        INT("--warmup", 0, 1L << 30, warm)
        FLT("--clip", 0, 1e9, p.trainer.grad_clip)
        FLT("--wd", 0, 10, p.trainer.adam.weight_decay)
        FLT("--beta1", 0, 0.999999, p.trainer.adam.beta1)
        FLT("--beta2", 0, 0.999999999, p.trainer.adam.beta2)
        FLT("--eps", 0, 1, p.trainer.adam.eps)
        INT("--ckpt-every", 0, 1L << 40, p.ckpt_every)
        INT("--keep", 0, 1 << 20, p.keep)
        INT("--eval-every", 0, 1L << 40, p.eval_every)
        INT("--eval-batches", 1, 1 << 20, p.eval_batches)
        INT("--seed", 0, 1L << 62, p.seed)
        INT("--threads", 0, 4096, p.model.n_threads)
        INT("--zero", 0, 2, p.trainer.zero)
        FLT("--bucket-mb", 0.001, 1 << 20, bucket_mb)
        INT("--grad-ring", -1, TD_TRAINER_MAX_RING, p.trainer.grad_ring)
        FLT("--comm-timeout", 0.001, 1e6, comm_timeout)
        else if (!strcmp(a, "--untied")) p.cfg.tie_embeddings = false;
        else if (!strcmp(a, "--bf16")) p.model.precision = TD_TRAIN_BF16;
        else if (!strcmp(a, "--recompute")) p.model.recompute = 1;
        else if (!strcmp(a, "--resume")) p.resume = 1;
        else if (!strcmp(a, "--allow-changed-config")) p.allow_changed = 1;
        else if (!strcmp(a, "--gemm")) {
            if (v && !strcmp(v, "dnnl")) {
                p.model.gemm = TD_TRAIN_GEMM_DNNL;
            } else if (v && !strcmp(v, "kernels")) {
                p.model.gemm = TD_TRAIN_GEMM_KERNELS;
            } else {
                fprintf(stderr, "tandem: --gemm expects kernels or dnnl\n");
                ok = 0;
            }
            i++;
        }
        else if (!strcmp(a, "--val")) {
            if (!v || !*v) {
                fprintf(stderr, "tandem: --val needs a value\n");
                ok = 0;
            } else {
                vals[n_val++] = v;
            }
            i++;
        }
        else if (!strcmp(a, "--metrics")) {
            if (!v || !*v) {
                fprintf(stderr, "tandem: --metrics needs a value\n");
                ok = 0;
            } else {
                p.metrics_path = v;
            }
            i++;
        }
        else if (!strcmp(a, "--backend")) {
            if (!v || !*v) {
                fprintf(stderr, "tandem: --backend needs a value\n");
                ok = 0;
            } else {
                p.model.backend_name = v;
            }
            i++;
        }
        else if (!strcmp(a, "--model") || !strcmp(a, "--out")) {
            if (!v || !*v) {
                fprintf(stderr, "tandem: %s needs a value\n", a);
                ok = 0;
            } else if (a[2] == 'm') {
                p.model_dir = v;
            } else {
                p.out_dir = v;
            }
            i++;
        }
        else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tandem train: unknown option '%s'\n", a);
            ok = 0;
        }
        else {
            shards[n++] = a;
        }
#undef INT
#undef FLT
    }
    if (ok && n == 0) {
        fprintf(stderr, "tandem train: no shard files given\n");
        ok = 0;
    }
    if (!ok) {
        usage(stderr);
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
