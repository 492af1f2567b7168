// The training loop: loader -> trainer steps -> checkpoints, with resume (see train_run.h).
#include "train/train_run.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/afile.h"
#include "base/file.h"
#include "base/log.h"
#include "model/model.h"
#include "train/ckpt.h"
#include "train/eval.h"
#include "train/loader.h"

td_train_run_params td_train_run_default_params(void) {
    td_train_run_params p;
    memset(&p, 0, sizeof p);
    td_model_config_init(&p.cfg);
    p.cfg.arch = TD_ARCH_LLAMA;
    p.cfg.dim = 128;
    p.cfg.n_layers = 4;
    p.cfg.n_heads = 4;
    p.cfg.n_kv_heads = 4;
    p.cfg.head_dim = 32;
    p.cfg.ffn_dim = 384;
    p.cfg.norm_eps = 1e-5f;
    p.cfg.rope_theta = 10000.0f;
    p.cfg.tie_embeddings = true;
    p.model = td_tmodel_default_params();
    p.model.batch = 4;
    p.model.seq_len = 128;
    p.trainer = td_trainer_default_params();
    p.trainer.lr =
        (td_lr_schedule){.max_lr = 3e-4f, .min_lr = 3e-5f, .warmup_steps = 50, .total_steps = 1000};
    p.steps = 1000;
    p.seed = 1;
    p.init_std = 0.02f;
    p.keep = 3;
    p.eval_batches = 8;
    return p;
}

// The model's hyper-parameters as an HF config.json object (what td_config_from_hf_json reads).
cJSON *td_train_config_json(const td_model_config *c) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "model_type", td_arch_name(c->arch));
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "hidden_size", c->dim);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "intermediate_size", c->ffn_dim);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_pos);
    cJSON_AddNumberToObject(o, "rms_norm_eps", c->norm_eps);
    cJSON_AddNumberToObject(o, "rope_theta", c->rope_theta);
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_embeddings);
    if (c->rope_scaling != TD_ROPE_SCALING_NONE) {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        const int l3 = c->rope_scaling == TD_ROPE_SCALING_LLAMA3;
        cJSON_AddStringToObject(rs, "rope_type", l3 ? "llama3" : "linear");
        cJSON_AddNumberToObject(rs, "factor", c->rope_factor);
        if (l3) {
            cJSON_AddNumberToObject(rs, "low_freq_factor", c->rope_low_freq_factor);
            cJSON_AddNumberToObject(rs, "high_freq_factor", c->rope_high_freq_factor);
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_max_pos);
        }
    }
    if (c->bos_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", c->bos_id);
    if (c->n_eos > 0) cJSON_AddNumberToObject(o, "eos_token_id", c->eos_ids[0]);
    return o;
}

td_status td_train_ckpt_config(const td_ckpt *ck, td_model_config *out, td_err *err) {
    cJSON *root = cJSON_Parse(td_ckpt_meta(ck));
    const cJSON *c = root ? cJSON_GetObjectItemCaseSensitive(root, "config") : NULL;
    char *text = cJSON_IsObject(c) ? cJSON_PrintUnformatted(c) : NULL;
    cJSON_Delete(root);
    if (!text) return td_err_set(err, TD_ERR_FORMAT, "checkpoint: metadata has no config object");
    td_model_config_init(out);
    td_status st = td_config_from_hf_json(out, text, strlen(text), "checkpoint config", err);
    free(text);
    return st;
}

td_status td_train_ckpt_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err) {
    char nm[128];
    snprintf(nm, sizeof nm, "param.%s", hf_name);
    const td_ckpt_tensor *t = td_ckpt_find((const td_ckpt *)ctx, nm);
    if (!t || t->dtype != TD_F32 || t->nbytes != (size_t)n * sizeof(float))
        return td_err_set(err, TD_ERR_NOT_FOUND, "checkpoint: no f32 tensor %s of %lld elements",
                          nm, (long long)n);
    memcpy(dst, t->data, t->nbytes);
    return TD_OK;
}

static cJSON *string_array(const char *const *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && v && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateString(v[i]));
    return a;
}

// The settings a resumed run must share with the checkpoint it continues (td_train_run_params's
// allow_changed relaxes this): what decides the optimisation from here on. The batch counts as
// sequences per optimizer step (global batch x accumulation), so a run may resume on another
// world size or split of the batch. Flat dotted keys; stored in every checkpoint's metadata.
static cJSON *run_settings(const td_train_run_params *p) {
    const td_trainer_params *tp = &p->trainer;
    char seed[20];
    snprintf(seed, sizeof seed, "%016" PRIx64, p->seed);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "sequences_per_step", (double)p->model.batch * tp->grad_accum);
    cJSON_AddNumberToObject(o, "seq_len", p->model.seq_len);
    cJSON_AddNumberToObject(o, "lr_schedule.max_lr", tp->lr.max_lr);
    cJSON_AddNumberToObject(o, "lr_schedule.min_lr", tp->lr.min_lr);
    cJSON_AddNumberToObject(o, "lr_schedule.warmup_steps", tp->lr.warmup_steps);
    cJSON_AddNumberToObject(o, "lr_schedule.total_steps", tp->lr.total_steps);
    cJSON_AddNumberToObject(o, "grad_clip", tp->grad_clip);
    cJSON_AddNumberToObject(o, "adamw.beta1", tp->adam.beta1);
    cJSON_AddNumberToObject(o, "adamw.beta2", tp->adam.beta2);
    cJSON_AddNumberToObject(o, "adamw.eps", tp->adam.eps);
    cJSON_AddNumberToObject(o, "adamw.weight_decay", tp->adam.weight_decay);
    cJSON_AddStringToObject(o, "seed", seed);
    cJSON_AddStringToObject(o, "precision", p->model.precision == TD_TRAIN_BF16 ? "bf16" : "fp32");
    return o;
}

// A JSON scalar as text ("%.9g" for numbers: the settings are floats or small integers).
static void scalar_text(const cJSON *v, char *buf, size_t cap) {
    if (cJSON_IsNumber(v)) snprintf(buf, cap, "%.9g", v->valuedouble);
    else if (cJSON_IsString(v)) snprintf(buf, cap, "%.60s", v->valuestring);
    else if (cJSON_IsBool(v)) snprintf(buf, cap, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else snprintf(buf, cap, "(none)");
}

static int scalar_equal(const cJSON *a, const cJSON *b) {
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b))  // the floats compare as floats: the JSON text keeps 15 digits
        return a->valuedouble == floor(a->valuedouble) && b->valuedouble == floor(b->valuedouble)
                   ? a->valuedouble == b->valuedouble
                   : (float)a->valuedouble == (float)b->valuedouble;
    if (cJSON_IsString(a) && cJSON_IsString(b)) return !strcmp(a->valuestring, b->valuestring);
    if (cJSON_IsBool(a) && cJSON_IsBool(b)) return cJSON_IsTrue(a) == cJSON_IsTrue(b);
    return 0;
}

// Appends "key old -> new" for each of keys (NULL-ended; every key of now when NULL) whose value in
// was (the checkpoint's) differs from now's, to msg, and {"key", "old", "new"} to changes (if not
// NULL). A key absent from was (an older checkpoint) is not compared. Returns the count.
static int diff_settings(const cJSON *was, const cJSON *now, const char *const *keys, char *msg, size_t cap,
                         cJSON *changes) {
    int n = 0;
    const cJSON *it = keys ? NULL : now->child;
    for (int k = 0; keys ? keys[k] != NULL : it != NULL; k++, it = it ? it->next : NULL) {
        const char *key = keys ? keys[k] : it->string;
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(was, key), *b = cJSON_GetObjectItemCaseSensitive(now, key);
        if (!a || scalar_equal(a, b)) continue;
        char va[80], vb[80];
        scalar_text(a, va, sizeof va), scalar_text(b, vb, sizeof vb);
        size_t l = strlen(msg);
        snprintf(msg + l, cap - l, "%s%s %s -> %s", n ? ", " : "", key, va, vb);
        if (changes) {
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "key", key);
            cJSON_AddItemToObject(c, "old", cJSON_Duplicate(a, 1));
            cJSON_AddItemToObject(c, "new", cJSON_Duplicate(b, 1));
            cJSON_AddItemToArray(changes, c);
        }
        n++;
    }
    return n;
}

// The run's full resolved configuration (every option after defaults, the shards' vocabulary and
// the thread count are resolved) as out_dir/train_config.json, written atomically at the start of
// every run, so a checkpoint directory says how it was made. resumed_from: the step the run
// continues from (-1: from scratch or model_dir).
static td_status write_config(const td_train_run_params *p, td_tmodel *tm, long resumed_from, int world,
                              const cJSON *changes, td_err *err) {
    if (!td_is_dir(p->out_dir) && mkdir(p->out_dir, 0755) != 0 && errno != EEXIST)
        return td_err_set(err, TD_ERR_IO, "%s: cannot create directory: %s", p->out_dir,
                          strerror(errno));
    const td_tmodel_params mp = td_tmodel_get_params(tm);
    const td_trainer_params *tp = &p->trainer;
    char seed[20];
    snprintf(seed, sizeof seed, "%016" PRIx64, p->seed);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "model", td_train_config_json(td_tmodel_config(tm)));
    if (p->model_dir)
        cJSON_AddStringToObject(o, "model_dir", p->model_dir);
    else
        cJSON_AddNullToObject(o, "model_dir");
    cJSON_AddNumberToObject(o, "init_std", p->init_std);
    cJSON_AddStringToObject(o, "seed", seed);
    cJSON_AddNumberToObject(o, "batch", (double)mp.batch * world);  // global: every rank's sequences
    cJSON_AddNumberToObject(o, "batch_per_rank", mp.batch);
    cJSON_AddNumberToObject(o, "world_size", world);
    cJSON_AddNumberToObject(o, "zero", world > 1 ? tp->zero : 0);
    cJSON_AddNumberToObject(o, "bucket_elems", (double)tp->bucket_elems);
    cJSON_AddNumberToObject(o, "seq_len", mp.seq_len);
    cJSON_AddNumberToObject(o, "grad_accum", tp->grad_accum);
    cJSON_AddNumberToObject(o, "tokens_per_step", (double)mp.batch * world * mp.seq_len * tp->grad_accum);
    cJSON_AddStringToObject(o, "backend", td_backend_name(td_tmodel_backend(tm)));
    cJSON_AddNumberToObject(o, "threads", td_backend_n_slices(td_tmodel_backend(tm)));
    cJSON_AddStringToObject(o, "precision", mp.precision == TD_TRAIN_BF16 ? "bf16" : "fp32");
    cJSON_AddBoolToObject(o, "recompute", mp.recompute != 0);
    cJSON_AddStringToObject(o, "gemm", mp.gemm == TD_TRAIN_GEMM_DNNL ? "dnnl" : "kernels");
    cJSON_AddNumberToObject(o, "steps", (double)p->steps);
    cJSON *lr = cJSON_AddObjectToObject(o, "lr_schedule");
    cJSON_AddNumberToObject(lr, "max_lr", tp->lr.max_lr);
    cJSON_AddNumberToObject(lr, "min_lr", tp->lr.min_lr);
    cJSON_AddNumberToObject(lr, "warmup_steps", tp->lr.warmup_steps);
    cJSON_AddNumberToObject(lr, "total_steps", tp->lr.total_steps);
    cJSON_AddNumberToObject(o, "grad_clip", tp->grad_clip);
    cJSON *ad = cJSON_AddObjectToObject(o, "adamw");
    cJSON_AddNumberToObject(ad, "beta1", tp->adam.beta1);
    cJSON_AddNumberToObject(ad, "beta2", tp->adam.beta2);
    cJSON_AddNumberToObject(ad, "eps", tp->adam.eps);
    cJSON_AddNumberToObject(ad, "weight_decay", tp->adam.weight_decay);
    cJSON_AddItemToObject(o, "shards", string_array(p->shards, p->n_shards));
    cJSON_AddItemToObject(o, "val_shards", string_array(p->val_shards, p->n_val_shards));
    cJSON_AddNumberToObject(o, "eval_every", (double)p->eval_every);
    cJSON_AddNumberToObject(o, "eval_batches", p->eval_batches);
    cJSON_AddStringToObject(o, "out_dir", p->out_dir);
    cJSON_AddNumberToObject(o, "ckpt_every", (double)p->ckpt_every);
    cJSON_AddNumberToObject(o, "keep", p->keep);
    cJSON_AddBoolToObject(o, "resume", p->resume != 0);
    cJSON_AddNumberToObject(o, "resumed_from_step", (double)resumed_from);
    if (changes) cJSON_AddItemToObject(o, "resume_changes", cJSON_Duplicate(changes, 1));
    if (p->metrics_path)
        cJSON_AddStringToObject(o, "metrics", p->metrics_path);
    else
        cJSON_AddNullToObject(o, "metrics");
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return td_err_set(err, TD_ERR_NOMEM, "train: out of memory");
    char path[TD_AFILE_PATH_MAX];
    td_status st = TD_OK;
    if (!td_path_join(path, sizeof path, p->out_dir, "train_config.json")) {
        st = td_err_set(err, TD_ERR_INVALID, "%s: path too long", p->out_dir);
    } else {
        td_afile f;
        if (!(st = td_afile_open(&f, path, err))) {
            st = td_afile_write(&f, text, strlen(text), err);
            if (!st) st = td_afile_write(&f, "\n", 1, err);
            if (st)
                td_afile_abort(&f);
            else
                st = td_afile_commit(&f, err);
        }
    }
    free(text);
    return st;
}

// Writes params, AdamW state and metadata as dir/ckpt-<step + 1>.tdck (the number of steps done),
// from the host views (downloaded first where the backend's memory is not the host's).
// One rank: one file (dir/ckpt-<steps>.tdck). Data parallel: a sharded checkpoint (ckpt.h), every
// rank writing what it owns, collectively; am and av are then unused (the pieces carry the state).
// am and av: the AdamW moments in parameter order (the host view).
static td_status save(const td_train_run_params *p, td_tmodel *tm, td_trainer *tr, td_loader *ld,
                      const float *am, const float *av, FILE *log, const cJSON *changes, td_err *err) {
    const int nt = td_tmodel_n_tensors(tm);
    td_tmodel_params_to_host(tm);
    td_ckpt_tensor *ts = calloc((size_t)nt + 2, sizeof *ts);
    char *names = calloc((size_t)nt, TD_TRAIN_CKPT_NAME);
    if (!ts || !names) {
        free(ts);
        free(names);
        return td_err_set(err, TD_ERR_NOMEM, "train: out of memory");
    }
    td_train_ckpt_tensors(tm, am, av, ts, names);
    size_t n;
    td_tmodel_params_buf(tm, &n);
    char pos[160];
    td_loader_pos lp = td_loader_tell(ld);
    td_loader_pos_format(&lp, pos, sizeof pos);
    const long steps = td_trainer_step_count(tr);
    char seed[20];
    snprintf(seed, sizeof seed, "%016" PRIx64, p->seed);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "step", (double)steps);
    cJSON_AddItemToObject(root, "loader", cJSON_Parse(pos));
    cJSON_AddStringToObject(root, "seed", seed);
    cJSON_AddItemToObject(root, "config", td_train_config_json(td_tmodel_config(tm)));
    cJSON_AddItemToObject(root, "settings", run_settings(p));
    if (changes) cJSON_AddItemToObject(root, "resume_changes", cJSON_Duplicate(changes, 1));
    if (p->tokenizer_xxh3) {  // a copy beside the checkpoints (cmd_train.c); export checks the hash
        cJSON *tk = cJSON_AddObjectToObject(root, "tokenizer");
        cJSON_AddStringToObject(tk, "file", "tokenizer.json");
        cJSON_AddStringToObject(tk, "xxh3", p->tokenizer_xxh3);
    }
    td_comm *comm = p->trainer.comm && td_comm_size(p->trainer.comm) > 1 ? p->trainer.comm : NULL;
    td_ckpt_piece *pieces = NULL;
    int n_pieces = 0;
    if (comm) {  // sharded: the manifest says how to assemble the parameter order
        cJSON_AddNumberToObject(root, "n_params", (double)n);
        cJSON_AddNumberToObject(root, "zero", p->trainer.zero);
        cJSON *tt = cJSON_AddArrayToObject(root, "tensors");
        for (int i = 0; i < nt; i++) {
            const td_tparam *t = td_tmodel_tensor(tm, i);
            cJSON *e = cJSON_CreateArray();
            cJSON_AddItemToArray(e, cJSON_CreateString(t->name));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)t->offset));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)t->rows));
            cJSON_AddItemToArray(e, cJSON_CreateNumber((double)t->cols));
            cJSON_AddItemToArray(tt, e);
        }
        const int cap = 2 * (td_tmodel_config(tm)->n_layers + 2);
        pieces = calloc((size_t)cap, sizeof *pieces);
        if (pieces) n_pieces = td_trainer_ckpt_pieces(tr, pieces, cap);
    }
    char *meta = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!meta || (comm && !pieces)) {
        free(meta);
        free(pieces);
        free(ts);
        free(names);
        return td_err_set(err, TD_ERR_NOMEM, "train: out of memory");
    }
    char path[1024];
    td_status st = comm ? td_ckpt_sharded_save(comm, p->out_dir, steps, pieces, n_pieces, meta, p->keep, path,
                                               sizeof path, err)
                        : td_ckpt_dir_save(p->out_dir, steps, ts, nt + 2, meta, p->keep, path, sizeof path, err);
    if (st == TD_OK && log) fprintf(log, "checkpoint %s\n", path);
    free(pieces);
    free(meta);
    free(ts);
    free(names);
    return st;
}

int td_train_ckpt_tensors(td_tmodel *tm, const float *am, const float *av, td_ckpt_tensor *ts, char *names) {
    const int nt = td_tmodel_n_tensors(tm);
    for (int i = 0; i < nt; i++) {
        const td_tparam *t = td_tmodel_tensor(tm, i);
        char *nm = names + (size_t)i * TD_TRAIN_CKPT_NAME;
        snprintf(nm, TD_TRAIN_CKPT_NAME, "param.%s", t->name);
        ts[i] = (td_ckpt_tensor){.name = nm,
                                 .dtype = TD_F32,
                                 .ndim = t->rows == 1 ? 1 : 2,
                                 .shape = {t->rows == 1 ? t->cols : t->rows, t->cols},
                                 .data = t->host,
                                 .nbytes = (size_t)(t->rows * t->cols) * sizeof(float)};
    }
    size_t n;
    td_tmodel_params_buf(tm, &n);
    ts[nt] = (td_ckpt_tensor){.name = "adam.m",
                              .dtype = TD_F32,
                              .ndim = 1,
                              .shape = {(int64_t)n},
                              .data = am,
                              .nbytes = n * sizeof(float)};
    ts[nt + 1] = (td_ckpt_tensor){.name = "adam.v",
                                  .dtype = TD_F32,
                                  .ndim = 1,
                                  .shape = {(int64_t)n},
                                  .data = av,
                                  .nbytes = n * sizeof(float)};
    return nt + 2;
}

// Into the host view, then uploaded.
td_status td_train_ckpt_load_params(td_tmodel *tm, const td_ckpt *ck, const char *what, td_err *err) {
    for (int i = 0; i < td_tmodel_n_tensors(tm); i++) {
        const td_tparam *t = td_tmodel_tensor(tm, i);
        char nm[96];
        snprintf(nm, sizeof nm, "param.%s", t->name);
        const td_ckpt_tensor *c = td_ckpt_find(ck, nm);
        const size_t nb = (size_t)(t->rows * t->cols) * sizeof(float);
        if (!c || c->dtype != TD_F32 || c->nbytes != nb)
            return td_err_set(err, TD_ERR_FORMAT, "%s: %s is missing or does not match the model",
                              what, nm);
        memcpy(t->host, c->data, nb);
    }
    td_tmodel_params_from_host(tm);
    return TD_OK;
}

td_status td_train_load_ckpt_params(td_tmodel *tm, const char *path, td_err *err) {
    td_ckpt *ck = NULL;
    td_status st = td_ckpt_open(path, &ck, err);
    if (st) return st;
    st = td_train_ckpt_load_params(tm, ck, path, err);
    td_ckpt_close(ck);
    return st;
}

// Restores params, AdamW state, step and data position from the newest checkpoint in out_dir.
// *found = 0 when there is none.
// The model's shape must equal the checkpoint's (always refused otherwise); the settings
// (run_settings) too unless p->allow_changed, when each change is warned about on p->log and
// stderr and *changes gets them (recorded in train_config.json and the checkpoints that follow).
static td_status restore(const td_train_run_params *p, td_tmodel *tm, td_trainer *tr, td_loader *ld,
                         int *found, cJSON **changes, td_err *err) {
    *found = 0;
    td_ckpt *ck = NULL;
    int64_t step = 0;
    td_status st = td_ckpt_dir_load_latest(p->out_dir, &ck, &step, err);
    if (st == TD_ERR_NOT_FOUND) return TD_OK;
    if (st) return st;
    {
        static const char *const shape[] = {"model_type", "vocab_size", "hidden_size", "num_hidden_layers",
                                            "num_attention_heads", "num_key_value_heads", "head_dim",
                                            "intermediate_size", "tie_word_embeddings", NULL};
        cJSON *meta = cJSON_Parse(td_ckpt_meta(ck));
        cJSON *cfg_now = td_train_config_json(td_tmodel_config(tm)), *set_now = run_settings(p);
        cJSON *ch = cJSON_CreateArray();
        char msg[TD_ERR_MSG_MAX - 160] = "";
        const cJSON *cfg_was = meta ? cJSON_GetObjectItemCaseSensitive(meta, "config") : NULL;
        const cJSON *set_was = meta ? cJSON_GetObjectItemCaseSensitive(meta, "settings") : NULL;
        if (cfg_was && diff_settings(cfg_was, cfg_now, shape, msg, sizeof msg, NULL)) {
            st = td_err_set(err, TD_ERR_INVALID, "%s: the model's shape cannot change on resume: %s", p->out_dir, msg);
        } else if (set_was && diff_settings(set_was, set_now, NULL, msg, sizeof msg, ch)) {
            if (!p->allow_changed)
                st = td_err_set(err, TD_ERR_INVALID,
                                "%s: resuming with changed settings: %s (--allow-changed-config accepts them)",
                                p->out_dir, msg);
            else {
                fprintf(stderr, "tandem train: warning: resuming at step %lld with changed settings: %s\n",
                        (long long)step, msg);
                if (p->log && p->log != stderr)
                    fprintf(p->log, "warning: resuming at step %lld with changed settings: %s\n", (long long)step, msg);
                *changes = ch;
                ch = NULL;
            }
        }
        cJSON_Delete(ch);
        cJSON_Delete(meta);
        cJSON_Delete(cfg_now);
        cJSON_Delete(set_now);
        if (st) goto done;
    }
    if ((st = td_train_ckpt_load_params(tm, ck, p->out_dir, err))) goto done;
    td_adamw *o = td_trainer_adamw(tr);
    const td_ckpt_tensor *m = td_ckpt_find(ck, "adam.m"), *v = td_ckpt_find(ck, "adam.v");
    size_t np;
    td_tmodel_params_buf(tm, &np);
    const size_t nb = np * sizeof(float);  // in parameter order whatever the sharding (any world size)
    if (!m || !v || m->nbytes != nb || v->nbytes != nb || m->dtype != TD_F32 ||
        v->dtype != TD_F32) {
        st = td_err_set(err, TD_ERR_FORMAT, "%s: optimizer state missing or of another size",
                        p->out_dir);
        goto done;
    }
    td_trainer_state_from_full(tr, m->data, v->data);
    cJSON *root = cJSON_Parse(td_ckpt_meta(ck));
    const cJSON *js = root ? cJSON_GetObjectItemCaseSensitive(root, "step") : NULL;
    const cJSON *jl = root ? cJSON_GetObjectItemCaseSensitive(root, "loader") : NULL;
    char *lt = jl ? cJSON_PrintUnformatted(jl) : NULL;
    td_loader_pos pos;
    if (!cJSON_IsNumber(js) || js->valuedouble != (double)step || !lt) {
        st = td_err_set(err, TD_ERR_FORMAT, "%s: checkpoint metadata lacks step or loader",
                        p->out_dir);
    } else if ((st = td_loader_pos_parse(lt, &pos, err)) == TD_OK &&
               (st = td_loader_seek(ld, &pos, err)) == TD_OK) {
        td_adamw_set_step_count(o, (long)step);
        *found = 1;
    }
    free(lt);
    cJSON_Delete(root);
done:
    td_ckpt_close(ck);
    return st;
}

// Mean loss over the first eval_batches windows of the validation loader (rewound to start).
// With data parallelism every rank evaluates its rank-strided share of the same windows and the
// sums are reduced (rank order), so the windows are those of one rank at the global batch.
static td_status evaluate(const td_train_run_params *p, td_tmodel *tm, td_loader *vl,
                          const td_loader_pos *start, int32_t *win, int32_t *tok, int32_t *tgt,
                          double *mean, td_err *err) {
    const int B = td_tmodel_get_params(tm).batch, T = p->model.seq_len;
    td_status st = td_loader_seek(vl, start, err);
    double sum = 0.0;
    long cnt = 0;
    for (int k = 0; st == TD_OK && k < p->eval_batches; k++) {
        td_loader_next(vl, win);
        for (int b = 0; b < B; b++) {
            memcpy(tok + (size_t)b * T, win + (size_t)b * (T + 1), (size_t)T * sizeof *tok);
            memcpy(tgt + (size_t)b * T, win + (size_t)b * (T + 1) + 1, (size_t)T * sizeof *tgt);
        }
        // The per-token loss of `tandem eval` (train/eval.h) on the trainer's own logits.
        if ((st = td_tmodel_forward(tm, tok, NULL, NULL, NULL, err))) break;
        const float *lg = td_tmodel_host_logits(tm);
        const int V = td_tmodel_config(tm)->vocab_size;
        for (size_t i = 0; i < (size_t)B * T; i++) sum += td_eval_token_nll(lg + i * V, V, tgt[i]);
        cnt += (long)B * T;
    }
    if (st == TD_OK && p->trainer.comm && td_comm_size(p->trainer.comm) > 1) {
        double v[2] = {sum, (double)cnt};
        st = td_comm_allreduce(p->trainer.comm, v, v, 2, TD_COMM_F64, TD_COMM_SUM, err);
        sum = v[0], cnt = (long)v[1];
    }
    *mean = cnt ? sum / (double)cnt : NAN;
    return st;
}

td_status td_train_run(const td_train_run_params *p, td_train_run_result *out, td_err *err) {
    td_train_run_result res = {0};
    res.val_loss = NAN;
    if (!p || !p->shards || p->n_shards <= 0)
        return td_err_set(err, TD_ERR_INVALID, "train: no shards");
    if ((p->resume || p->ckpt_every > 0) && !p->out_dir)
        return td_err_set(err, TD_ERR_INVALID, "train: checkpoints need an output directory");
    const int T = p->model.seq_len, K = p->trainer.grad_accum;
    if (p->model.batch <= 0 || T <= 0 || K <= 0)
        return td_err_set(err, TD_ERR_INVALID,
                          "train: batch, seq_len and accumulation must be > 0");
    // Data parallelism: the batch is the global one; rank r takes the r-th run of B / world of
    // every B windows (loader.h); logs, metrics and checkpoint files come from rank 0.
    td_comm *comm = p->trainer.comm && td_comm_size(p->trainer.comm) > 1 ? p->trainer.comm : NULL;
    const int world = comm ? td_comm_size(comm) : 1, rank = comm ? td_comm_rank(comm) : 0;
    if (p->model.batch % world)
        return td_err_set(err, TD_ERR_INVALID, "train: the batch (%d sequences, global) is not divisible by the %d ranks",
                          p->model.batch, world);
    const int B = p->model.batch / world;  // this rank's sequences per micro-batch
    FILE *log = rank == 0 ? p->log : NULL;
    const int tty = log && isatty(fileno(log));  // progress rewritten in place on a terminal
    td_tmodel_params mparams = p->model;
    mparams.batch = B;

    td_loader_params lp = td_loader_default_params();
    lp.paths = p->shards, lp.n_paths = p->n_shards, lp.B = B, lp.T = T, lp.seed = p->seed;
    lp.rank = rank, lp.world = world;
    td_loader *ld = NULL, *vl = NULL;
    td_loader_pos vstart = {0};
    td_model *m = NULL;
    td_tmodel *tm = NULL;
    td_trainer *tr = NULL;
    int32_t *win = NULL, *tok = NULL, *tgt = NULL;
    FILE *metrics = NULL;
    cJSON *changes = NULL;  // settings changed on resume (p->allow_changed), recorded with the run
    const double t_start = td_now();
    td_status st = td_loader_open(&lp, &ld, err);
    if (st) return st;
    if (p->val_shards && p->n_val_shards > 0 && p->eval_batches > 0) {
        td_loader_params vp = lp;
        vp.paths = p->val_shards;
        vp.n_paths = p->n_val_shards;
        vp.shuffle = false;
        if ((st = td_loader_open(&vp, &vl, err))) {
            td_err_prefix(err, "validation shards: ");
            goto done;
        }
        vstart = td_loader_tell(vl);
    }

    td_model_config cfg = p->cfg;
    if (p->model_dir) {
        if ((st = td_model_load(p->model_dir, &m, err))) goto done;
        cfg = m->cfg;
    } else if (cfg.vocab_size <= 0) {
        cfg.vocab_size = td_loader_vocab(ld);
    }
    if (cfg.max_pos < T) cfg.max_pos = T;
    if (vl && td_loader_vocab(vl) > cfg.vocab_size) {
        st = td_err_set(err, TD_ERR_INVALID,
                        "train: the validation shards' vocabulary (%d) exceeds the model's (%d)",
                        td_loader_vocab(vl), cfg.vocab_size);
        goto done;
    }
    if (td_loader_vocab(ld) > cfg.vocab_size) {
        st = td_err_set(err, TD_ERR_INVALID,
                        "train: the shards' vocabulary (%d) exceeds the model's (%d)",
                        td_loader_vocab(ld), cfg.vocab_size);
        goto done;
    }
    if ((st = td_tmodel_create(&cfg, &mparams, &tm, err))) goto done;
    if (m) {
        if ((st = td_tmodel_load(tm, m, err))) goto done;
        td_model_free(m);
        m = NULL;
    } else {
        td_tmodel_init_random(tm, p->seed, p->init_std);
    }
    if ((st = td_trainer_create(tm, &p->trainer, &tr, err))) goto done;
    int resumed = 0;
    if (p->resume && (st = restore(p, tm, tr, ld, &resumed, &changes, err))) goto done;
    if (rank == 0 && p->out_dir &&
        (st = write_config(p, tm, resumed ? td_trainer_step_count(tr) : -1, world, changes, err)))
        goto done;
    size_t np;
    td_tmodel_params_buf(tm, &np);
    const size_t N = (size_t)B * T;
    win = malloc((size_t)B * (T + 1) * sizeof *win);
    tok = malloc(N * K * sizeof *tok);
    tgt = malloc(N * K * sizeof *tgt);
    if (!win || !tok || !tgt) {
        st = td_err_set(err, TD_ERR_NOMEM, "train: out of memory");
        goto done;
    }
    if (rank == 0 && p->metrics_path && !(metrics = fopen(p->metrics_path, "a"))) {
        st = td_err_set(err, TD_ERR_IO, "train: cannot open %s for appending", p->metrics_path);
        goto done;
    }
    if (log) {
        fprintf(log,
                "train: %zu parameters, %d layers, dim %d, vocab %d, batch %d x %d x %d, %s, %s%s%s\n",
                np, cfg.n_layers, cfg.dim, cfg.vocab_size, K, B * world, T, td_backend_name(td_tmodel_backend(tm)),
                p->model.precision == TD_TRAIN_BF16 ? "bf16" : "fp32",
                p->model.recompute ? ", recompute" : "", resumed ? ", resumed" : "");
        const td_trainer_memory mm = td_trainer_memory_of(tr);
        // Per rank, against the ZeRO paper's accounting for f32 Adam (trainer.h).
        const double MiB = 1048576.0;
        char gdetail[200] = "";
        if (mm.grads_shard_bytes)  // ZeRO-2's ring: paper 4P/N, plus what is in flight
            snprintf(gdetail, sizeof gdetail,
                     " (shard %.2f + ring %.2f in %d buffer%s = %zu bytes; paper 4P/N: %.2f MiB)",
                     mm.grads_shard_bytes / MiB, mm.grads_ring_bytes / MiB, mm.ring_slots, mm.ring_slots == 1 ? "" : "s",
                     mm.grads_bytes, 4.0 * (double)mm.n_params / world / MiB);
        fprintf(log,
                "train: world_size %d, ZeRO %d, per rank: parameters %.1f MiB, gradients %.1f MiB%s, accumulator "
                "%.1f MiB, optimizer %.1f MiB (%zu of %zu parameters' state; paper: %.1f MiB)\n",
                world, mm.zero, mm.params_bytes / MiB, mm.grads_bytes / MiB, gdetail, mm.accum_bytes / MiB,
                mm.optim_bytes / MiB, mm.n_owned, mm.n_params, 8.0 * (double)mm.n_params / (mm.zero ? world : 1) / MiB);
    }
    for (long s = td_trainer_step_count(tr); s < p->steps; s++) {
        const double t0 = td_now();
        for (int k = 0; k < K; k++) {
            td_loader_next(ld, win);
            for (int b = 0; b < B; b++) {
                memcpy(tok + k * N + (size_t)b * T, win + (size_t)b * (T + 1),
                       (size_t)T * sizeof *tok);
                memcpy(tgt + k * N + (size_t)b * T, win + (size_t)b * (T + 1) + 1,
                       (size_t)T * sizeof *tgt);
            }
        }
        td_step_stats ss;
        if ((st = td_trainer_step(tr, tok, tgt, &ss, err))) goto done;
        const double dt = td_now() - t0;
        const double tps = dt > 0 ? (double)(N * K) * world / dt : 0.0;  // every rank's tokens
        if (res.steps_done == 0) res.first_loss = ss.loss;
        res.steps_done++;
        res.last_step = ss.step;
        res.last_loss = ss.loss;
        const int last = s + 1 == p->steps;
        const int eval = vl && ((p->eval_every > 0 && (s + 1) % p->eval_every == 0) || last);
        const int ckpt = p->out_dir && ((p->ckpt_every > 0 && (s + 1) % p->ckpt_every == 0) || last);
        if (log) {
            // Remaining time from this run's mean step time so far (steps resumed from a
            // checkpoint are not counted). On a terminal the line is rewritten in place ("\r",
            // then erase to the end of the line) and kept only before other output and at the end.
            const double elapsed = td_now() - t_start;
            const double eta = elapsed / (double)res.steps_done * (double)(p->steps - s - 1);
            const int keep_line = !tty || last || eval || ckpt || !isfinite(ss.loss);
            fprintf(log,
                    "%sstep %ld/%ld | loss %.4f | lr %.3e | norm %.3f | %.0f tok/s | world %d | %.0fs elapsed, "
                    "%.0fs left%s",
                    tty ? "\r" : "", ss.step + 1, p->steps, ss.loss, (double)ss.lr, ss.grad_norm, tps, world, elapsed,
                    eta, tty ? (keep_line ? "\033[K\n" : "\033[K") : "\n");
            if (tty) fflush(log);
        }
        if (!isfinite(ss.loss)) {
            st = td_err_set(err, TD_ERR_INVALID, "train: the loss is not finite at step %ld",
                            ss.step + 1);
            goto done;
        }
        if (eval) {
            if ((st = evaluate(p, tm, vl, &vstart, win, tok, tgt, &res.val_loss, err))) goto done;
            if (log) fprintf(log, "val %ld | loss %.4f\n", ss.step + 1, res.val_loss);
        }
        if (metrics) {  // JSON lines for `tandem plot` (docs/eval.md)
            fprintf(metrics,
                    "{\"step\":%ld,\"loss\":%.17g,\"lr\":%.9g,\"grad_norm\":%.17g,"
                    "\"tokens_per_s\":%.1f,\"elapsed_s\":%.3f,\"world_size\":%d,\"comm_wait_s\":%.6f,"
                    "\"comm_bytes\":%.0f,\"step_s\":%.6f",
                    ss.step + 1, ss.loss, (double)ss.lr, ss.grad_norm, tps, td_now() - t_start, world,
                    ss.comm_wait_s, ss.comm_bytes, dt);
            if (eval) fprintf(metrics, ",\"val_loss\":%.6f", res.val_loss);
            fputs("}\n", metrics);
            fflush(metrics);
        }
        if (ckpt) {
            td_adamw *o = td_trainer_adamw(tr);
            if (!comm) td_adamw_state_to_host(o);
            if ((st = save(p, tm, tr, ld, td_adamw_host_m(o), td_adamw_host_v(o), log, changes, err))) goto done;
        }
    }
done:
    if (metrics) fclose(metrics);
    cJSON_Delete(changes);
    free(win);
    free(tok);
    free(tgt);
    td_trainer_free(tr);
    td_tmodel_free(tm);
    td_model_free(m);
    td_loader_close(ld);
    td_loader_close(vl);
    if (out) *out = res;
    return st;
}
