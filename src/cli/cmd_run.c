// `tandem run MODEL`: one prompt in, generated text out, streamed; the stable scripting interface
// (--json) that checks and scripts use. Prompt processing runs in chunks through the KV cache.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/log.h"
#include "base/opts.h"
#include "cli/cli.h"
#include "engine/sampler.h"
#include "model/forward.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

static void run_epilog(FILE *f) { fprintf(f, "backends in this build: %s\n", td_backend_names()); }

typedef struct {
    const char *model, *model_opt, *prompt, *prompt_ids, *backend;
    long max_tokens, top_k, logprobs, threads, batch, ctx;
    double temperature, top_p, min_p;
    bool has_temp, has_top_k, has_top_p, has_min_p, has_seed, ignore_eos, echo, json;
    long long seed;
    td_dtype kv_dtype;
} run_opts;

static bool opt_kv_dtype(void *ctx, const td_opt *opt, const char *v) {
    (void)opt;
    return td_arg_kv_dtype("--kv-cache-dtype", v, &((run_opts *)ctx)->kv_dtype);
}

static int parse_opts(int argc, char **argv, run_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_tokens = 128;
    o->batch = 256;
    const td_opt opts[] = {
        {TD_OPT_S("model", &o->model_opt, "MODEL", "the model, as the MODEL argument (llama.cpp's -m)"), .shorts = "m"},
        {TD_OPT_S("prompt", &o->prompt, "TEXT",
                  "prompt text (encoded with the model's tokenizer, BOS added as the\n"
                  "tokenizer specifies)"), .shorts = "p"},
        {TD_OPT_S("prompt-ids", &o->prompt_ids, "1,2,3", "prompt as token ids, used as given")},
        {TD_OPT_I("max-tokens", &o->max_tokens, 0, 1 << 24, "N", "tokens to generate (default 128)"), .shorts = "n"},
        {TD_OPT_F("temperature", &o->temperature, 0, 100, "T",
                  "0 = greedy (default: generation_config.json's, else greedy)"), .seen = &o->has_temp},
        {TD_OPT_I("top-k", &o->top_k, 0, 1 << 30, "K",
                  "sampling filter (default: generation_config.json's, else off)"), .seen = &o->has_top_k},
        {TD_OPT_F("top-p", &o->top_p, 1e-9, 1, "P",
                  "sampling filter (default: generation_config.json's, else off)"), .seen = &o->has_top_p},
        {TD_OPT_F("min-p", &o->min_p, 0, 1, "P",
                  "sampling filter (default: generation_config.json's, else off)"), .seen = &o->has_min_p},
        {TD_OPT_I("seed", &o->seed, 0, 9.2e18, "S", "sampling seed (default: from the clock, printed on stderr)"),
         .seen = &o->has_seed},
        {TD_OPT_B("ignore-eos", &o->ignore_eos, "do not stop at end-of-sequence tokens")},
        {TD_OPT_I("logprobs", &o->logprobs, 0, 20, "K", "report the top K alternatives of each generated token")},
        {TD_OPT_B("echo", &o->echo, "also report log-probabilities of the prompt tokens")},
        {TD_OPT_B("json", &o->json, "print one JSON object instead of streaming text")},
        {TD_OPT_I("threads", &o->threads, 1, 1024, "N", "worker threads (default: all cores)"), .shorts = "t"},
        {TD_OPT_S("backend", &o->backend, "NAME",
                  "where the model runs: cpu, or a device backend of this build\n"
                  "(listed below); default $TANDEM_BACKEND, else cpu;\n"
                  "$TANDEM_DEVICE picks the device")},
        {TD_OPT_I("batch", &o->batch, 1, 1 << 16, "N", "prompt tokens per forward pass (default 256)"), .shorts = "b"},
        {TD_OPT_I("ctx", &o->ctx, 1, 1 << 24, "N", "context length (default: prompt + max tokens, capped by the model)"),
         .aliases = "ctx-size max-model-len", .shorts = "c"},
        {TD_OPT_CB("kv-cache-dtype", opt_kv_dtype, true, "T",
                   "KV cache element type: auto (= f32), f32, f16 or bf16; f16/bf16\n"
                   "halve the cache's bytes per token (docs/engine.md)")},
    };
    const td_opts t = {.prog = "tandem run",
                       .usage = "usage: tandem run [MODEL] [options]\n"
                                "  MODEL                     model directory (config.json + safetensors) or .gguf file\n"
                                "                            (default: the embedded model, docs/default-model.md)\n",
                       .opts = opts,
                       .n = (int)(sizeof opts / sizeof opts[0]),
                       .epilog_fn = run_epilog,
                       .ctx = o,
                       .max_pos = 1};
    int n_pos = 0;
    int r = td_opts_parse(&t, argc, argv, &n_pos);
    if (r <= 0) return r;
    if (n_pos) o->model = argv[1];
    if (o->model_opt) {
        if (o->model) return fprintf(stderr, "tandem run: give the model once: MODEL or -m/--model\n"), -1;
        o->model = o->model_opt;
    }
    if (!o->prompt == !o->prompt_ids)
        return fprintf(stderr, "tandem run: give exactly one of --prompt or --prompt-ids\n"), -1;
    return 1;
}

// The raw text of one token (for JSON "text" fields); "" without a tokenizer.
static char *token_text(const td_tokenizer *tok, int32_t id) {
    char *s = NULL;
    size_t n = 0;
    if (!tok || td_tokenizer_decode(tok, &id, 1, false, &s, &n, NULL) != TD_OK) return strdup("");
    return s;
}

static cJSON *top_json(const td_tokenizer *tok, const int32_t *ids, const float *lps, int k) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < k; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "id", ids[i]);
        char *t = token_text(tok, ids[i]);
        cJSON_AddStringToObject(o, "text", t);
        free(t);
        cJSON_AddNumberToObject(o, "logprob", lps[i]);
        cJSON_AddItemToArray(arr, o);
    }
    return arr;
}

// One position's record: the chosen token's log-probability under the raw model distribution and
// the top K alternatives.
static cJSON *logprob_json(const td_tokenizer *tok, const float *logits, int vocab, int32_t id, int k,
                           int32_t *ids, float *lps) {
    double lse = td_logsumexp(logits, vocab);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    char *t = token_text(tok, id);
    cJSON_AddStringToObject(o, "text", t);
    free(t);
    cJSON_AddNumberToObject(o, "logprob", (float)((double)logits[id] - lse));
    if (k > 0) {
        td_logprobs_topk(logits, vocab, lse, k, ids, lps);
        cJSON_AddItemToObject(o, "top", top_json(tok, ids, lps, k));
    }
    return o;
}

int td_cmd_run(int argc, char **argv) {
    run_opts o;
    int pr = parse_opts(argc, argv, &o);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    char dm[4096];
    if (!o.model && !(o.model = td_default_model_path(dm, sizeof dm))) {
        fprintf(stderr, "tandem run: no MODEL given and the default model is not installed (looked for "
                        TD_DEFAULT_MODEL_HELP "). Usage: tandem run MODEL --prompt TEXT\n");
        return 2;
    }

    int rc = 1;
    td_err err = {0};
    td_model *m = NULL;
    td_tokenizer *tok = NULL;
    td_forward *fwd = NULL;
    td_sampler *smp = NULL;
    td_detok *dt = NULL;
    int32_t *prompt = NULL, *out_ids = NULL, *top_ids = NULL;
    float *logits = NULL, *top_lps = NULL;
    cJSON *root = NULL, *jtokens = NULL, *jprompt_lp = NULL;
    char *gen_text = NULL;
    size_t gen_len = 0, gen_cap = 0;

    double t0 = td_now();
    if (td_model_load(o.model, &m, &err) != TD_OK) {
        fprintf(stderr, "tandem run: %s\n", err.msg);
        goto done;
    }
    const td_model_config *c = &m->cfg;
    if (td_tokenizer_load(m->tokenizer_path ? m->tokenizer_path : o.model, &tok, &err) != TD_OK) {
        if (o.prompt) {
            fprintf(stderr, "tandem run: cannot load the tokenizer: %s\n", err.msg);
            goto done;
        }
        TD_LOGW("no tokenizer (%s): printing token ids", err.msg);
        tok = NULL;
    }

    // Prompt.
    long n_prompt;
    if (o.prompt) {
        td_tokens tt = {0};
        if (td_tokenizer_encode(tok, o.prompt, strlen(o.prompt), true, &tt, &err) != TD_OK) {
            fprintf(stderr, "tandem run: cannot encode the prompt: %s\n", err.msg);
            goto done;
        }
        prompt = tt.ids;
        n_prompt = (long)tt.n;
    } else {
        int *ids;
        n_prompt = td_arg_ids(o.prompt_ids, &ids);
        if (n_prompt < 0) {
            fprintf(stderr, "tandem run: --prompt-ids: expected comma-separated non-negative integers\n");
            goto done;
        }
        prompt = (int32_t *)ids;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "tandem run: the prompt is empty (no tokens)\n");
        goto done;
    }
    for (long i = 0; i < n_prompt; i++) {
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size) {
            fprintf(stderr, "tandem run: prompt token %d at position %ld is outside the vocabulary (size %d)\n",
                    prompt[i], i, c->vocab_size);
            goto done;
        }
    }
    long ctx = o.ctx ? o.ctx : n_prompt + o.max_tokens;
    if (ctx > c->max_pos) ctx = c->max_pos;
    if (n_prompt > ctx) {
        fprintf(stderr, "tandem run: the prompt has %ld tokens, more than the context (%ld)\n", n_prompt, ctx);
        goto done;
    }
    long max_new = o.max_tokens;
    if (n_prompt + max_new > ctx) max_new = ctx - n_prompt;

    // Forward state: the chunk size bounds activations; with --echo every prompt position's
    // logits are needed, so chunks also bound the logits buffer.
    int V = c->vocab_size;
    long chunk = o.batch < n_prompt ? o.batch : n_prompt;
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = (int)chunk;
    fp.max_seqs = 1;
    fp.max_ctx = (int)ctx;
    fp.n_threads = (int)o.threads;
    fp.backend_name = o.backend;
    fp.kv_dtype = o.kv_dtype;
    if (td_forward_create(m, &fp, &fwd, &err) != TD_OK) {
        fprintf(stderr, "tandem run: %s\n", err.msg);
        goto done;
    }
    long n_logit_rows = o.echo ? chunk : 1;
    logits = malloc((size_t)n_logit_rows * V * sizeof(float));
    out_ids = malloc((size_t)(max_new + 1) * sizeof(int32_t));
    top_ids = malloc(21 * sizeof(int32_t));
    top_lps = malloc(21 * sizeof(float));
    smp = td_sampler_create(V);
    if (!logits || !out_ids || !top_ids || !top_lps || !smp) {
        fprintf(stderr, "tandem run: out of memory\n");
        goto done;
    }
    if (tok) dt = td_detok_new(tok, true);
    double t_load = td_now() - t0;

    // Sampling parameters: flags, else generation_config.json, else greedy.
    td_sampling_params sp = td_sampling_default_params();
    sp.temperature = o.has_temp ? (float)o.temperature : c->gen_temperature >= 0 ? c->gen_temperature : 0.0f;
    sp.top_k = o.has_top_k ? (int)o.top_k : c->gen_top_k >= 0 ? c->gen_top_k : 0;
    sp.top_p = o.has_top_p ? (float)o.top_p : c->gen_top_p > 0 ? c->gen_top_p : 1.0f;
    sp.min_p = o.has_min_p ? (float)o.min_p : c->gen_min_p >= 0 ? c->gen_min_p : 0.0f;
    unsigned long long seed = o.has_seed ? (unsigned long long)o.seed : (unsigned long long)time(NULL) ^ (unsigned long long)clock();
    td_rng rng;
    td_rng_seed(&rng, seed);
    if (sp.temperature > 0 && !o.has_seed && !o.json) TD_LOGI("seed %llu", seed);

    if (o.json) {
        root = cJSON_CreateObject();
        cJSON *pid = cJSON_AddArrayToObject(root, "prompt_ids");
        for (long i = 0; i < n_prompt; i++) cJSON_AddItemToArray(pid, cJSON_CreateNumber(prompt[i]));
        if (o.echo) jprompt_lp = cJSON_AddArrayToObject(root, "prompt_logprobs");
        jtokens = cJSON_AddArrayToObject(root, "tokens");
    }

    // Prompt processing, chunk by chunk.
    double t1 = td_now();
    int32_t *pos = malloc((size_t)chunk * sizeof(int32_t)), *sid = calloc((size_t)chunk, sizeof(int32_t));
    uint8_t *want = calloc((size_t)chunk, 1);
    if (!pos || !sid || !want) {
        free(pos), free(sid), free(want);
        fprintf(stderr, "tandem run: out of memory\n");
        goto done;
    }
    bool ok = true;
    for (long s = 0; s < n_prompt && ok; s += chunk) {
        long n = n_prompt - s < chunk ? n_prompt - s : chunk;
        for (long i = 0; i < n; i++) {
            pos[i] = (int32_t)(s + i);
            want[i] = o.echo || s + i == n_prompt - 1;
        }
        td_batch b = {.n_tokens = (int)n, .tokens = prompt + s, .pos = pos, .seq_id = sid, .want_logits = want};
        if (td_forward_run(fwd, &b, logits, &err) != TD_OK) {
            fprintf(stderr, "tandem run: %s\n", err.msg);
            ok = false;
            break;
        }
        if (o.echo && o.json) {
            // Row i predicts position s+i+1.
            for (long i = 0; i < n && s + i + 1 < n_prompt; i++)
                cJSON_AddItemToArray(jprompt_lp, logprob_json(tok, logits + i * V, V, prompt[s + i + 1],
                                                              (int)o.logprobs, top_ids, top_lps));
        }
        if (o.echo && s + n >= n_prompt) memmove(logits, logits + (n - 1) * V, (size_t)V * sizeof(float));
    }
    free(pos), free(sid), free(want);
    if (!ok) goto done;
    double t_prompt = td_now() - t1;

    if (!o.json && o.echo && o.prompt) fputs(o.prompt, stdout);

    // Generation.
    double t2 = td_now();
    long n_gen = 0;
    const char *finish = "length";
    float *scratch = malloc((size_t)V * sizeof(float));
    if (!scratch) goto done;
    while (n_gen < max_new) {
        memcpy(scratch, logits, (size_t)V * sizeof(float));
        int32_t next = td_sampler_sample(smp, &sp, scratch, prompt, (int)n_prompt, out_ids, (int)n_gen, &rng);
        out_ids[n_gen++] = next;
        if (o.json) cJSON_AddItemToArray(jtokens, logprob_json(tok, logits, V, next, (int)o.logprobs, top_ids, top_lps));
        // Text: streamed to stdout, or collected for --json.
        const char *piece = NULL;
        size_t plen = 0;
        char idbuf[24];
        if (dt) {
            piece = td_detok_push(dt, next, &plen);
        } else {
            plen = (size_t)snprintf(idbuf, sizeof idbuf, "%s%d", n_gen > 1 ? " " : "", next);
            piece = idbuf;
        }
        bool is_eos = false;
        for (int e = 0; e < c->n_eos; e++) is_eos |= next == c->eos_ids[e];
        if (tok && td_tokenizer_eos_id(tok) == next) is_eos = true;
        if (is_eos && !o.ignore_eos) {
            finish = "stop";
            break;  // the EOS token's own text is not emitted
        }
        if (plen) {
            if (o.json) {
                if (gen_len + plen + 1 > gen_cap) {
                    gen_cap = (gen_len + plen + 1) * 2;
                    char *nb = realloc(gen_text, gen_cap);
                    if (!nb) goto done;
                    gen_text = nb;
                }
                memcpy(gen_text + gen_len, piece, plen);
                gen_len += plen;
            } else {
                fwrite(piece, 1, plen, stdout);
                fflush(stdout);
            }
        }
        if (n_gen == max_new) break;
        int32_t p = (int32_t)(n_prompt + n_gen - 1), s0 = 0;
        td_batch b = {.n_tokens = 1, .tokens = &next, .pos = &p, .seq_id = &s0, .want_logits = NULL};
        if (td_forward_run(fwd, &b, logits, &err) != TD_OK) {
            fprintf(stderr, "\ntandem run: %s\n", err.msg);
            free(scratch);
            goto done;
        }
    }
    free(scratch);
    if (dt) {
        size_t tl = 0;
        const char *tail = td_detok_flush(dt, &tl);
        if (tl) {
            if (o.json) {
                char *nb = realloc(gen_text, gen_len + tl + 1);
                if (!nb) goto done;
                gen_text = nb;
                memcpy(gen_text + gen_len, tail, tl);
                gen_len += tl;
            } else {
                fwrite(tail, 1, tl, stdout);
            }
        }
    }
    double t_gen = td_now() - t2;

    if (o.json) {
        if (gen_text) gen_text[gen_len] = 0;
        cJSON_AddStringToObject(root, "text", gen_text ? gen_text : "");
        cJSON_AddStringToObject(root, "finish_reason", finish);
        cJSON *u = cJSON_AddObjectToObject(root, "usage");
        cJSON_AddNumberToObject(u, "prompt_tokens", (double)n_prompt);
        cJSON_AddNumberToObject(u, "completion_tokens", (double)n_gen);
        char *s = cJSON_PrintUnformatted(root);
        if (!s) goto done;
        puts(s);
        free(s);
    } else {
        putchar('\n');
    }
    fflush(stdout);
    fprintf(stderr,
            "tandem: load %.2f s | prompt %ld tokens, %.2f s, %.1f tok/s | generated %ld tokens, %.2f s, %.1f tok/s\n",
            t_load, n_prompt, t_prompt, t_prompt > 0 ? n_prompt / t_prompt : 0.0, n_gen, t_gen,
            t_gen > 0 ? n_gen / t_gen : 0.0);
    rc = 0;

done:
    cJSON_Delete(root);
    free(gen_text);
    td_detok_free(dt);
    td_sampler_free(smp);
    free(logits), free(out_ids), free(top_ids), free(top_lps), free(prompt);
    td_forward_free(fwd);
    td_tokenizer_free(tok);
    td_model_free(m);
    return rc;
}
