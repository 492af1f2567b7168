// rl.json -> td_rl_config (see rl.h and docs/rl.md for the keys). Every key is checked: an unknown
// one, or a value of the wrong type, is an error naming it.
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "rl/rl.h"

typedef struct ctx {
    td_err *err;
    const char *path;
    td_status st;
} ctx;

// Fails unless every key of o is in keys (NULL-terminated).
static bool known(ctx *c, const cJSON *o, const char *where, const char *const *keys) {
    if (c->st) return false;
    if (!cJSON_IsObject(o)) {
        c->st = td_err_set(c->err, TD_ERR_INVALID, "%s: %s must be an object", c->path, where);
        return false;
    }
    for (const cJSON *k = o->child; k; k = k->next) {
        bool ok = false;
        for (int i = 0; keys[i] && !ok; i++) ok = !strcmp(k->string, keys[i]);
        if (!ok) {
            c->st = td_err_set(c->err, TD_ERR_INVALID, "%s: unknown key \"%s\" in %s", c->path, k->string, where);
            return false;
        }
    }
    return true;
}

static const cJSON *item(const cJSON *o, const char *k) { return o ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

static void num(ctx *c, const cJSON *o, const char *k, double lo, double hi, double *out) {
    const cJSON *v = item(o, k);
    if (c->st || !v) return;
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        c->st = td_err_set(c->err, TD_ERR_INVALID, "%s: \"%s\" must be a number in [%g, %g]", c->path, k, lo, hi);
        return;
    }
    *out = v->valuedouble;
}
#define NUM_AS(c, o, k, lo, hi, dst, T)            \
    do {                                           \
        double v_ = (double)(dst);                 \
        num(c, o, k, lo, hi, &v_);                 \
        (dst) = (T)v_;                             \
    } while (0)

static void str(ctx *c, const cJSON *o, const char *k, const char **out) {
    const cJSON *v = item(o, k);
    if (c->st || !v) return;
    if (!cJSON_IsString(v)) {
        c->st = td_err_set(c->err, TD_ERR_INVALID, "%s: \"%s\" must be a string", c->path, k);
        return;
    }
    *out = v->valuestring;
}

static void boolean(ctx *c, const cJSON *o, const char *k, bool *out) {
    const cJSON *v = item(o, k);
    if (c->st || !v) return;
    if (!cJSON_IsBool(v)) {
        c->st = td_err_set(c->err, TD_ERR_INVALID, "%s: \"%s\" must be true or false", c->path, k);
        return;
    }
    *out = cJSON_IsTrue(v);
}

td_status td_rl_config_load(const char *path, td_rl_config *out, td_rl_config_store *store, td_err *err) {
    store->json = NULL;
    char *text = NULL;
    size_t len = 0;
    td_status st = td_read_file(path, 1 << 20, &text, &len, err);
    if (st) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return td_err_set(err, TD_ERR_INVALID, "%s: not valid JSON", path);
    ctx c = {.err = err, .path = path};
    td_rl_config r = td_rl_config_default();
    static const char *const top[] = {"model", "out_dir", "steps", "prompts_per_step", "samples_per_prompt",
                                      "max_tokens", "max_prompt_tokens", "task", "sampling", "grpo", "optim",
                                      "micro_batch", "mode", "max_staleness", "on_sync", "engine", "threads", "eval",
                                      "ckpt_every", "keep", "seed", "timeout_s", "comment", NULL};
    if (known(&c, root, "the config", top)) {
        str(&c, root, "model", &r.model);
        str(&c, root, "out_dir", &r.out_dir);
        NUM_AS(&c, root, "steps", 1, 1e9, r.steps, long);
        NUM_AS(&c, root, "prompts_per_step", 1, 64, r.prompts_per_step, int);
        NUM_AS(&c, root, "samples_per_prompt", 1, 64, r.samples_per_prompt, int);
        NUM_AS(&c, root, "max_tokens", 1, 4096, r.max_tokens, int);
        NUM_AS(&c, root, "max_prompt_tokens", 1, 4096, r.max_prompt_tokens, int);
        NUM_AS(&c, root, "micro_batch", 0, 4096, r.micro_batch, int);
        NUM_AS(&c, root, "max_staleness", 0, 64, r.max_staleness, int);
        NUM_AS(&c, root, "threads", 0, 1024, r.threads, int);
        NUM_AS(&c, root, "ckpt_every", 0, 1e9, r.ckpt_every, long);
        NUM_AS(&c, root, "keep", 0, 1000, r.keep, int);
        NUM_AS(&c, root, "seed", 0, 9007199254740992.0, r.seed, uint64_t);
        NUM_AS(&c, root, "timeout_s", 1, 86400, r.timeout_s, int);
        const char *mode = NULL, *on_sync = NULL;
        str(&c, root, "mode", &mode);
        str(&c, root, "on_sync", &on_sync);
        if (!c.st && mode && strcmp(mode, "sync") && strcmp(mode, "async"))
            c.st = td_err_set(err, TD_ERR_INVALID, "%s: \"mode\" must be \"sync\" or \"async\"", path);
        if (!c.st && mode && !strcmp(mode, "sync") && r.max_staleness)
            c.st = td_err_set(err, TD_ERR_INVALID, "%s: \"mode\": \"sync\" trains on the current version only; "
                                                   "max_staleness needs \"async\"", path);
        if (!c.st && on_sync && strcmp(on_sync, "continue") && strcmp(on_sync, "drop"))
            c.st = td_err_set(err, TD_ERR_INVALID, "%s: \"on_sync\" must be \"continue\" or \"drop\"", path);
        if (on_sync) r.drop_on_sync = !strcmp(on_sync, "drop");

        static const char *const task_keys[] = {"name", "seed", "min_digits", "max_digits", "prompts", "scorer",
                                                "scorer_timeout_s", "stop", "eval_every", NULL};
        const cJSON *t = item(root, "task");
        if (t && known(&c, t, "task", task_keys)) {
            str(&c, t, "name", &r.task.name);
            NUM_AS(&c, t, "seed", 0, 9007199254740992.0, r.task.seed, uint64_t);
            NUM_AS(&c, t, "min_digits", 1, 18, r.task.min_digits, int);
            NUM_AS(&c, t, "max_digits", 1, 18, r.task.max_digits, int);
            str(&c, t, "prompts", &r.task.prompts);
            str(&c, t, "scorer", &r.task.scorer);
            str(&c, t, "stop", &r.task.stop);
            NUM_AS(&c, t, "eval_every", 2, 1e9, r.task.eval_every, int);
            double ts = r.task.scorer_timeout_ms / 1000.0;
            num(&c, t, "scorer_timeout_s", 0.001, 86400, &ts);
            r.task.scorer_timeout_ms = (int)(ts * 1000);
        }
        static const char *const samp_keys[] = {"temperature", "top_p", "top_k", "min_p", NULL};
        const cJSON *s = item(root, "sampling");
        if (s && known(&c, s, "sampling", samp_keys)) {
            NUM_AS(&c, s, "temperature", 0, 100, r.sp.temperature, float);
            NUM_AS(&c, s, "top_p", 1e-9, 1, r.sp.top_p, float);
            NUM_AS(&c, s, "top_k", -1, 1e9, r.sp.top_k, int);
            NUM_AS(&c, s, "min_p", 0, 1, r.sp.min_p, float);
        }
        static const char *const grpo_keys[] = {"clip_eps", "clip_eps_high", "kl_coef", "is_cap", "std_norm",
                                                "ppo_epochs", NULL};
        const cJSON *g = item(root, "grpo");
        if (g && known(&c, g, "grpo", grpo_keys)) {
            NUM_AS(&c, g, "clip_eps", 1e-6, 0.999, r.grpo.clip_eps, float);
            NUM_AS(&c, g, "clip_eps_high", 0, 100, r.grpo.clip_eps_high, float);
            NUM_AS(&c, g, "kl_coef", 0, 100, r.grpo.kl_coef, float);
            NUM_AS(&c, g, "is_cap", 1, 1e6, r.grpo.is_cap, float);
            bool sn = r.grpo.std_norm != 0;
            boolean(&c, g, "std_norm", &sn);
            r.grpo.std_norm = sn;
            NUM_AS(&c, g, "ppo_epochs", 1, 64, r.grpo.ppo_epochs, int);
        }
        static const char *const opt_keys[] = {"lr", "warmup", "weight_decay", "beta1", "beta2", "grad_clip", NULL};
        const cJSON *o = item(root, "optim");
        if (o && known(&c, o, "optim", opt_keys)) {
            NUM_AS(&c, o, "lr", 0, 10, r.lr, float);
            NUM_AS(&c, o, "warmup", 0, 1e9, r.warmup, long);
            NUM_AS(&c, o, "weight_decay", 0, 10, r.weight_decay, float);
            NUM_AS(&c, o, "beta1", 0, 0.999999, r.beta1, float);
            NUM_AS(&c, o, "beta2", 0, 0.999999, r.beta2, float);
            NUM_AS(&c, o, "grad_clip", 0, 1e9, r.grad_clip, float);
        }
        static const char *const eng_keys[] = {"placement", "urls", "launch", "api_key", NULL};
        const cJSON *e = item(root, "engine");
        if (e && known(&c, e, "engine", eng_keys)) {
            const char *pl = NULL;
            str(&c, e, "placement", &pl);
            if (!c.st && pl && strcmp(pl, "colocated") && strcmp(pl, "remote"))
                c.st = td_err_set(err, TD_ERR_INVALID, "%s: \"placement\" must be \"colocated\" or \"remote\"", path);
            r.remote = pl && !strcmp(pl, "remote");
            NUM_AS(&c, e, "launch", 0, TD_RL_MAX_URLS, r.launch, int);
            str(&c, e, "api_key", &r.api_key);
            const cJSON *u = item(e, "urls");
            if (!c.st && u) {
                if (!cJSON_IsArray(u) || cJSON_GetArraySize(u) > TD_RL_MAX_URLS)
                    c.st = td_err_set(err, TD_ERR_INVALID, "%s: \"urls\" must be an array of at most %d strings",
                                      path, TD_RL_MAX_URLS);
                for (const cJSON *x = u->child; x && !c.st; x = x->next) {
                    if (!cJSON_IsString(x))
                        c.st = td_err_set(err, TD_ERR_INVALID, "%s: \"urls\" must hold strings", path);
                    else
                        r.urls[r.n_urls++] = x->valuestring;
                }
            }
            if (!c.st && !r.remote && (r.n_urls || r.launch))
                c.st = td_err_set(err, TD_ERR_INVALID, "%s: urls and launch need \"placement\": \"remote\"", path);
        }
        static const char *const eval_keys[] = {"every", "problems", "k", "temperature", NULL};
        const cJSON *v = item(root, "eval");
        if (v && known(&c, v, "eval", eval_keys)) {
            NUM_AS(&c, v, "every", 0, 1e9, r.eval_every, long);
            NUM_AS(&c, v, "problems", 1, 1e7, r.eval_problems, int);
            NUM_AS(&c, v, "k", 0, 64, r.eval_k, int);
            NUM_AS(&c, v, "temperature", 1e-6, 100, r.eval_temperature, float);
        }
    }
    if (!c.st && !r.model) c.st = td_err_set(err, TD_ERR_INVALID, "%s: \"model\" is required", path);
    if (c.st) {
        cJSON_Delete(root);
        return c.st;
    }
    store->json = root;
    *out = r;
    return TD_OK;
}

void td_rl_config_release(td_rl_config_store *store) {
    if (!store) return;
    cJSON_Delete(store->json);
    store->json = NULL;
}
