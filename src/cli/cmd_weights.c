// `tandem weights push URL CHECKPOINT_OR_MODEL` and `tandem weights get URL`: argument parsing
// and source opening (a training checkpoint as `tandem export` reads it, or a model directory /
// .gguf through td_model_load) over rl/push.h. Exit status 0 on success, 1 on a runtime error
// (message on stderr), 2 on a usage error. Not here: the protocol (push.c, server/wsync.c).
#include "cli/cmd_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/opts.h"
#include "base/log.h"
#include "cli/cli.h"
#include "model/export.h"
#include "model/model.h"
#include "rl/push.h"
#include "train/ckpt.h"
#include "train/train_run.h"

#define WEIGHTS_USAGE                                                                                   \
    "usage: tandem weights push URL SOURCE [--api-key KEY] [--bucket-mb N] [--timeout S] [--shm]\n"        \
    "                                      [--f32-source] [--repeat N]\n"                                 \
    "       tandem weights get URL [--api-key KEY] [--timeout S]\n"                                        \
    "  push: sends every weight of SOURCE to a server started with --enable-weight-sync, which\n"         \
    "        applies them between two engine steps (docs/server.md, \"Weight sync\")\n"                   \
    "  get:  prints the server's weights version, checksum and dtype as JSON\n"                           \
    "  URL                       the server, e.g. http://127.0.0.1:8000\n"                                \
    "  SOURCE                    a training checkpoint (ckpt-<step>.tdck, a sharded checkpoint\n"         \
    "                            directory, or a checkpoint directory: its newest valid one), or a\n"     \
    "                            model directory (config.json + safetensors) or .gguf file; its\n"        \
    "                            config must be the served model's\n"

// A source of weights: a checkpoint or a loaded model.
typedef struct source {
    td_ckpt *ck;
    td_model *m;
    td_model_config cfg;
} source;

static int open_source(const char *path, source *s) {
    memset(s, 0, sizeof *s);
    td_err err = {0};
    char probe[4200];
    td_status st;
    snprintf(probe, sizeof probe, "%s/config.json", path);
    bool model_dir = td_is_dir(path) && td_file_exists(probe);
    size_t n = strlen(path);
    bool gguf = n > 5 && !strcmp(path + n - 5, ".gguf");
    if (model_dir || gguf) {
        if ((st = td_model_load(path, &s->m, &err))) return fprintf(stderr, "tandem weights: %s\n", err.msg), 1;
        s->cfg = s->m->cfg;
        return 0;
    }
    snprintf(probe, sizeof probe, "%s/manifest.json", path);
    int64_t step = -1;
    if (td_is_dir(path) && td_file_exists(probe)) st = td_ckpt_open(path, &s->ck, &err);
    else if (td_is_dir(path)) st = td_ckpt_dir_load_latest(path, &s->ck, &step, &err);
    else if (td_file_exists(path)) st = td_ckpt_open(path, &s->ck, &err);
    else return fprintf(stderr, "tandem weights: %s: no such file or directory\n", path), 1;
    if (st) return fprintf(stderr, "tandem weights: %s\n", err.msg), 1;
    if (step >= 0) fprintf(stderr, "tandem weights: %s: newest valid checkpoint is step %lld\n", path, (long long)step);
    if ((st = td_train_ckpt_config(s->ck, &s->cfg, &err))) {
        fprintf(stderr, "tandem weights: %s: %s\n", path, err.msg);
        td_ckpt_close(s->ck);
        return 1;
    }
    return 0;
}

// --f32-source: every tensor read once into f32 memory; get is then a memcpy, as from the
// trainer's parameters.
typedef struct f32_copy {
    int n;
    td_export_tensor *ts;
    float **v;
} f32_copy;

static void f32_copy_free(f32_copy *c) {
    for (int i = 0; c->v && i < c->n; i++) free(c->v[i]);
    free(c->v);
    free(c->ts);
}

static int64_t n_of(const td_export_tensor *t) { return t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0]; }

static td_status f32_copy_load(f32_copy *c, const td_model_config *cfg, td_export_get_fn get, void *ctx, td_err *err) {
    c->n = td_export_tensor_list(cfg, NULL, 0);
    c->ts = calloc((size_t)c->n, sizeof *c->ts);
    c->v = calloc((size_t)c->n, sizeof *c->v);
    if (!c->ts || !c->v) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    td_export_tensor_list(cfg, c->ts, c->n);
    for (int i = 0; i < c->n; i++) {
        c->v[i] = malloc((size_t)n_of(&c->ts[i]) * sizeof(float));
        if (!c->v[i]) return td_err_set(err, TD_ERR_NOMEM, "out of memory for the f32 copy of %s", c->ts[i].name);
        td_status st = get(ctx, c->ts[i].name, c->v[i], n_of(&c->ts[i]), err);
        if (st) return st;
    }
    return TD_OK;
}

static td_status f32_copy_get(void *ctx, const char *name, float *dst, int64_t n, td_err *err) {
    f32_copy *c = ctx;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->ts[i].name, name)) {
            if (n != n_of(&c->ts[i])) return td_err_set(err, TD_ERR_INVALID, "%s: %lld values asked", name, (long long)n);
            memcpy(dst, c->v[i], (size_t)n * sizeof(float));
            return TD_OK;
        }
    return td_err_set(err, TD_ERR_NOT_FOUND, "no tensor %s", name);
}

// Straight from the f32 copy into the bucket in the wire dtype (no f32 scratch copy).
static td_status f32_copy_get_typed(void *ctx, const char *name, td_dtype type, void *dst, int64_t n, td_err *err) {
    f32_copy *c = ctx;
    if (type != TD_F32 && type != TD_BF16 && type != TD_F16) return TD_ERR_UNSUPPORTED;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->ts[i].name, name)) {
            if (n != n_of(&c->ts[i])) return td_err_set(err, TD_ERR_INVALID, "%s: %lld values asked", name, (long long)n);
            td_from_f32(type, c->v[i], dst, n);
            return TD_OK;
        }
    return td_err_set(err, TD_ERR_NOT_FOUND, "no tensor %s", name);
}

static void close_source(source *s) {
    td_ckpt_close(s->ck);
    td_model_free(s->m);
}

int td_cmd_weights(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(WEIGHTS_USAGE, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    bool push = !strcmp(sub, "push");
    if (!push && strcmp(sub, "get")) {
        fprintf(stderr, "tandem weights: unknown subcommand '%s' (push or get)\n", sub);
        return 2;
    }
    const char *pos[2] = {NULL, NULL};
    td_pusher_params pp = td_pusher_default_params();
    pp.api_key = getenv("TANDEM_API_KEY");
    long mb = 64, timeout_s = 60, repeat = 1;
    bool f32_source = false;
    const td_opt opts[] = {
        {TD_OPT_S("api-key", &pp.api_key, "KEY", "the server's --api-key (default $TANDEM_API_KEY)")},
        {TD_OPT_I("bucket-mb", &mb, 1, 1 << 16, "N", "push: tensor data per request, MiB (default 64)")},
        {TD_OPT_I("timeout", &timeout_s, 1, 86400, "S", "limit of every request, seconds (default 60)")},
        {TD_OPT_B("shm", &pp.shm,
                  "push, same host: pass buckets through a shared-memory file\n"
                  "/dev/shm/tandem-push-* instead of HTTP bodies (the server needs\n"
                  "--weight-sync-shm; without it the push falls back to bodies, with\n"
                  "a warning)")},
        {TD_OPT_B("f32-source", &f32_source,
                  "push: read every tensor of SOURCE into f32 memory first and push from\n"
                  "there (what the RL loop pushes: the trainer's f32 parameters)")},
        {TD_OPT_I("repeat", &repeat, 1, 1000, "N", "push N times (timings of each on stderr; JSON of the last)")},
    };
    const td_opts ot = {.prog = push ? "tandem weights push" : "tandem weights get",
                        .usage = WEIGHTS_USAGE,
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = push ? 2 : 1};
    int npos = 0, pr = td_opts_parse(&ot, argc - 1, argv + 1, &npos);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    for (int i = 0; i < npos; i++) pos[i] = argv[2 + i];
    if (npos < (push ? 2 : 1)) {
        fprintf(stderr, "tandem weights %s: %s\n", sub, npos == 0 ? "no server URL given" : "no SOURCE given");
        td_opts_help(&ot, stderr);
        return 2;
    }
    pp.url = pos[0];
    pp.bucket_bytes = (size_t)mb << 20;
    pp.timeout_ms = (int)(timeout_s * 1000);
    td_err err = {0};
    td_pusher *p = NULL;
    if (td_pusher_create(&pp, &p, &err)) {
        fprintf(stderr, "tandem weights: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (!push) {
        td_push_info in;
        if (td_pusher_query(p, &in, &err)) {
            fprintf(stderr, "tandem %s\n", err.msg);
            rc = 1;
        } else {
            char ck[20] = "null";
            if (in.has_checksum) snprintf(ck, sizeof ck, "\"%016llx\"", (unsigned long long)in.checksum);
            printf("{\"version\": %llu, \"checksum\": %s, \"dtype\": \"%s\", \"tensors\": %d, \"bytes\": %llu, "
                   "\"syncing\": %s}\n",
                   (unsigned long long)in.version, ck, in.dtype == TD_BF16 ? "bf16" : "f32", in.n_tensors,
                   (unsigned long long)in.bytes, in.syncing ? "true" : "false");
        }
        td_pusher_free(p);
        return rc;
    }
    source src;
    if (open_source(pos[1], &src)) {
        td_pusher_free(p);
        return 1;
    }
    td_export_get_fn get = src.ck ? td_train_ckpt_get : td_export_model_get;
    td_export_get_typed_fn typed = src.ck ? NULL : td_export_model_get_typed;
    void *gctx = src.ck ? (void *)src.ck : (void *)src.m;
    f32_copy copy = {0};
    if (f32_source && f32_copy_load(&copy, &src.cfg, get, gctx, &err)) {
        fprintf(stderr, "tandem weights: %s\n", err.msg);
        f32_copy_free(&copy);
        close_source(&src);
        td_pusher_free(p);
        return 1;
    }
    if (f32_source) get = f32_copy_get, typed = f32_copy_get_typed, gctx = &copy;
    td_push_result r;
    for (long k = 0; k < repeat && !rc; k++) {
        td_status st = td_pusher_push_typed(p, &src.cfg, get, typed, gctx, &r, &err);
        if (st) {
            fprintf(stderr, "tandem %s\n", err.msg);
            rc = 1;
            break;
        }
        fprintf(stderr,
                "tandem weights push: version %llu, checksum %016llx: %.1f MB in %d buckets (%s) in %.3f s: buckets "
                "%.3f s (packing %.3f s, transfer %.3f s, overlapped), commit %.3f s of which the engine update "
                "%.3f s\n",
                (unsigned long long)r.version, (unsigned long long)r.checksum, r.bytes / 1e6, r.n_buckets,
                r.shm ? "shared memory" : "HTTP bodies", r.seconds, r.bucket_seconds, r.pack_seconds, r.transfer_seconds,
                r.commit_seconds, r.apply_seconds);
    }
    if (!rc)
        printf("{\"version\": %llu, \"checksum\": \"%016llx\", \"bytes\": %llu, \"buckets\": %d, \"shm\": %s, "
               "\"seconds\": %.6f, \"bucket_seconds\": %.6f, \"pack_seconds\": %.6f, \"transfer_seconds\": %.6f, "
               "\"commit_seconds\": %.6f, \"apply_seconds\": %.6f}\n",
               (unsigned long long)r.version, (unsigned long long)r.checksum, (unsigned long long)r.bytes, r.n_buckets,
               r.shm ? "true" : "false", r.seconds, r.bucket_seconds, r.pack_seconds, r.transfer_seconds,
               r.commit_seconds, r.apply_seconds);
    f32_copy_free(&copy);
    close_source(&src);
    td_pusher_free(p);
    return rc;
}
