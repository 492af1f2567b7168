// Command-line front end of the training loop (train/train_run.h): flags -> parameters.
// Not here: the loop itself, data preparation (`tandem data prepare`), export.
#include "cli/cmd_train.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
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
        "  --recompute     recompute layer activations in backward (less memory)\n"
        "run:\n"
        "  --out DIR       checkpoint directory    --ckpt-every N (0: only at the end)\n"
        "  --keep N (3)    checkpoints kept        --resume   continue from the newest in --out\n"
        "  --seed N (1)    --threads N (all CPUs)\n");
}

int td_cmd_train(int argc, char **argv) {
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
    double min_lr = -1;
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
        else if (!strcmp(a, "--untied")) p.cfg.tie_embeddings = false;
        else if (!strcmp(a, "--bf16")) p.model.precision = TD_TRAIN_BF16;
        else if (!strcmp(a, "--recompute")) p.model.recompute = 1;
        else if (!strcmp(a, "--resume")) p.resume = 1;
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
    td_err err = {0};
    td_train_run_result r;
    p.val_shards = n_val ? vals : NULL;
    p.n_val_shards = n_val;
    td_status st = td_train_run(&p, &r, &err);
    free(shards);
    free(vals);
    if (st) {
        fprintf(stderr, "tandem train: %s\n", err.msg);
        return 1;
    }
    printf("done: %ld steps, loss %.4f -> %.4f\n", r.steps_done, r.first_loss, r.last_loss);
    return 0;
}
