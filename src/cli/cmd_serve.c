// `tandem serve [MODEL]`: loads a model and its tokenizer, starts the engine (engine/engine.h) and
// the OpenAI-compatible HTTP server (server/server.h), and runs until SIGTERM or SIGINT, then stops
// gracefully (server first, engine second) and exits 0. Not the engine and not the HTTP layer.
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/file.h"
#include "base/log.h"
#include "base/opts.h"
#include "cli/cli.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"
#include "server/wsync.h"
#include "tokenizer/tokenizer.h"

static void serve_epilog(FILE *f) { fprintf(f, "backends in this build: %s\n", td_backend_names()); }

typedef struct {
    const char *model, *model_opt, *host, *name, *chat_template, *backend;
    long port, max_batched, max_seqs, max_len, block_size, threads, shutdown_s, max_logprobs;
    long long seed;
    size_t kv_bytes;
    double gpu_util;
    bool no_prefix, has_seed, has_gpu_util, has_max_logprobs, has_api_key, logprobs_processed;
    int logprobs_mode, tool_parser, ws_dtype_idx, pooling;
    bool no_normalize;
    td_dtype kv_dtype;
    const char *api_key;
    const char *aliases[16];  // --served-model-name's names after the first, and --alias
    int n_aliases;
    const char *allowed_origins, *tool_call_parser;
    bool log_prompts;
    bool weight_sync, ws_shm;
    td_dtype ws_dtype;
    long ws_bucket_mb, ws_timeout_s;
} serve_opts;

static bool opt_kv_dtype(void *ctx, const td_opt *opt, const char *v) {
    serve_opts *o = ctx;
    char name[64];
    snprintf(name, sizeof name, "--%s", opt->name);
    return td_arg_kv_dtype(name, v, &o->kv_dtype);
}

// Comma-separated names (and, vLLM's form, several arguments); the first --served-model-name
// names the engine, the rest alias it. argv is writable: strtok_r splits it in place.
static bool opt_names(void *ctx, const td_opt *opt, const char *v) {
    serve_opts *o = ctx;
    if (!*v) return fprintf(stderr, "tandem serve: --%s needs a value\n", opt->name), false;
    const bool served = !strcmp(opt->name, "served-model-name");
    for (char *save = NULL, *t = strtok_r((char *)v, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!*t) continue;
        if (!o->name && served) {
            o->name = t;
        } else if (o->n_aliases < (int)(sizeof o->aliases / sizeof o->aliases[0])) {
            o->aliases[o->n_aliases++] = t;
        } else {
            return fprintf(stderr, "tandem serve: at most 16 model aliases\n"), false;
        }
    }
    return true;
}

static const char *const tool_parsers[] = {"auto", "hermes", "llama3_json", "none"};

static int parse_opts(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->shutdown_s = 5;
    o->api_key = getenv("TANDEM_API_KEY");
    o->ws_dtype = TD_F32;
    o->ws_bucket_mb = 256;
    o->ws_timeout_s = 60;
    o->tool_parser = -1;
    const td_opt opts[] = {
        {TD_OPT_S("model", &o->model_opt, "MODEL", "the model, as the MODEL argument (llama-server's -m)"), .shorts = "m"},
        {TD_OPT_S("host", &o->host, "ADDR", "IPv4 address to bind (default 127.0.0.1)")},
        {TD_OPT_I("port", &o->port, 0, 65535, "N", "TCP port (default 8000; 0 = any free port, printed at start)")},
        {TD_OPT_BYTES_("kv-cache-memory", &o->kv_bytes, "BYTES",
                       "KV cache budget, suffixes K, M, G allowed (default: a quarter of\n"
                       "available memory, at most what --max-seqs full contexts use)")},
        {TD_OPT_F("gpu-memory-utilization", &o->gpu_util, 1e-6, 1, "F",
                  "KV cache budget as a fraction in (0, 1] of the memory available at start\n"
                  "(MemAvailable; device backends too: they report no free memory),\n"
                  "at most what --max-seqs full contexts use (default 0.25);\n"
                  "giving it with --kv-cache-memory is an error"),
         .seen = &o->has_gpu_util},
        {TD_OPT_I("max-batched-tokens", &o->max_batched, 1, 1 << 20, "N",
                  "tokens per engine step, decodes and prefill chunks (default 512)"),
         .aliases = "max-num-batched-tokens"},
        {TD_OPT_I("max-seqs", &o->max_seqs, 1, 4096, "N", "sequences running at once (default 32)"),
         .aliases = "max-num-seqs", .shorts = "np"},
        {TD_OPT_I("max-model-len", &o->max_len, 2, 1 << 24, "N", "context length (default: the model's)"),
         .aliases = "ctx-size", .shorts = "c"},
        {TD_OPT_I("block-size", &o->block_size, 1, 1024, "N", "tokens per KV block (default 16)")},
        {TD_OPT_CB("kv-cache-dtype", opt_kv_dtype, true, "T",
                   "KV cache element type: auto (= f32), f32, f16 or bf16; f16/bf16\n"
                   "hold twice the tokens in the same --kv-cache-memory")},
        {TD_OPT_CB("served-model-name", opt_names, true, "NAME[,NAME...]",
                   "model ids clients use (default: MODEL's last path component);\n"
                   "the first is reported, all are accepted; also vLLM's\n"
                   "space-separated form --served-model-name a b (give MODEL first)"),
         .multi = true},
        {TD_OPT_CB("alias", opt_names, true, "NAME", "one more accepted model id (llama-server's name)")},
        {TD_OPT_S("allowed-origins", &o->allowed_origins, "LIST",
                  "CORS: '*' or comma-separated origins allowed to call the API")},
        {TD_OPT_B("log-prompts", &o->log_prompts, "the per-request log line also carries the prompt text")},
        {TD_OPT_C("tool-call-parser", &o->tool_parser, "auto hermes llama3_json none", "P",
                  "auto (default: chosen from the chat template), hermes,\n"
                  "llama3_json or none")},
        {TD_OPT_S("chat-template", &o->chat_template, "T",
                  "Jinja chat template overriding the tokenizer's: a file, or when no\n"
                  "file of that name exists, the template text itself (as vLLM)")},
        {TD_OPT_B("no-prefix-caching", &o->no_prefix, "do not reuse KV of shared prompt prefixes"),
         .aliases = "no-enable-prefix-caching"},
        {TD_OPT_NB("enable-prefix-caching", &o->no_prefix, "reuse KV of shared prompt prefixes (the default)")},
        {TD_OPT_I("seed", &o->seed, 0, 9.2e18, "N",
                  "requests without \"seed\" get the i-th output of splitmix64 from\n"
                  "state N, i = 0, 1, ... counting such requests, so a server started\n"
                  "again with the same N samples them alike (default: random)"),
         .seen = &o->has_seed},
        {TD_OPT_I("max-logprobs", &o->max_logprobs, 0, 20, "N",
                  "the most logprobs / top_logprobs alternatives a request may ask\n"
                  "(default and most: 20); more is a 400"),
         .seen = &o->has_max_logprobs},
        {TD_OPT_I("threads", &o->threads, 1, 1024, "N", "forward threads (default: all cores)"), .shorts = "t"},
        {TD_OPT_S("backend", &o->backend, "NAME",
                  "where the model runs: cpu, or a device backend of this build\n"
                  "(listed below); default $TANDEM_BACKEND, else cpu;\n"
                  "$TANDEM_DEVICE picks the device")},
        {TD_OPT_I("shutdown-timeout", &o->shutdown_s, 0, 3600, "S",
                  "seconds in-flight requests may finish after SIGTERM (default 5)")},
        {TD_OPT_C("logprobs-mode", &o->logprobs_mode, "raw raw_logprobs processed processed_logprobs", "M",
                  "raw (default: log_softmax of the model's logits) or processed (the\n"
                  "distribution sampled from, after penalties, temperature and\n"
                  "top-k/top-p/min-p); requests override it with \"logprobs_mode\"")},
        {TD_OPT_C("pooling", &o->pooling, "last mean", "P",
                  "POST /v1/embeddings: the final hidden state (after the final norm)\n"
                  "of the last token (default, as vLLM) or the mean over all tokens")},
        {TD_OPT_B("no-normalize", &o->no_normalize, "embeddings are not L2-normalised (default: they are)")},
        {TD_OPT_S("api-key", &o->api_key, "KEY",
                  "require \"Authorization: Bearer KEY\" on every route but /health\n"
                  "(default $TANDEM_API_KEY; none when unset)"),
         .seen = &o->has_api_key},
        {TD_OPT_SEC("weight sync (docs/server.md; `tandem weights push`):")},
        {TD_OPT_B("enable-weight-sync", &o->weight_sync,
                  "accept new weights over /v1/weights/* (costs a copy of the\n"
                  "weights for the engine plus a staging copy in the wire dtype)")},
        {TD_OPT_C("weight-sync-dtype", &o->ws_dtype_idx, "f32 bf16", "T",
                  "wire and staging dtype: f32 (default) or bf16 (half the memory)")},
        {TD_OPT_I("weight-sync-max-bucket-mb", &o->ws_bucket_mb, 1, 1 << 16, "N", "largest bucket body, MiB (default 256)")},
        {TD_OPT_I("weight-sync-timeout", &o->ws_timeout_s, 1, 86400, "S",
                  "an idle sync session expires after S seconds; also the deadline\n"
                  "of applying a commit (default 60)")},
        {TD_OPT_B("weight-sync-shm", &o->ws_shm,
                  "also take buckets by reference to a shared-memory file\n"
                  "/dev/shm/tandem-* (clients on this host: `weights push --shm`)")},
    };
    const td_opts t = {.prog = "tandem serve",
                       .usage = "usage: tandem serve [MODEL] [options]\n"
                                "  MODEL                     model directory (config.json + safetensors) or .gguf file\n"
                                "                            (default: the embedded model, docs/default-model.md)\n",
                       .opts = opts,
                       .n = (int)(sizeof opts / sizeof opts[0]),
                       .epilog_fn = serve_epilog,
                       .ctx = o,
                       .max_pos = 1};
    int n_pos = 0;
    int r = td_opts_parse(&t, argc, argv, &n_pos);
    if (r <= 0) return r;
    if (n_pos) o->model = argv[1];
    if (o->model_opt) {
        if (o->model) return fprintf(stderr, "tandem serve: give the model once: MODEL or -m/--model\n"), -1;
        o->model = o->model_opt;
    }
    if (!*o->host) return fprintf(stderr, "tandem serve: --host needs a value\n"), -1;
    if (o->has_api_key && !*o->api_key) return fprintf(stderr, "tandem serve: --api-key needs a value\n"), -1;
    if (o->tool_parser >= 0) o->tool_call_parser = tool_parsers[o->tool_parser];
    o->logprobs_processed = o->logprobs_mode >= 2;
    o->ws_dtype = o->ws_dtype_idx == 1 ? TD_BF16 : TD_F32;
    if (o->has_gpu_util && o->kv_bytes)
        return fprintf(stderr, "tandem serve: give --kv-cache-memory or --gpu-memory-utilization, not both\n"), -1;
    if (o->max_batched && o->max_seqs && o->max_batched < o->max_seqs)
        return fprintf(stderr, "tandem serve: --max-batched-tokens must be >= --max-seqs\n"), -1;
    return 1;
}

// Weight sync's view of the engine (server/wsync.h): SET_WEIGHTS and a fence, with deadlines.
static td_status ws_apply(void *ctx, td_export_get_fn get, td_export_get_typed_fn typed, void *get_ctx,
                          int timeout_ms, uint64_t *version, td_err *err) {
    td_eng_cmd c = {.type = TD_ENG_CMD_SET_WEIGHTS};
    c.set_weights.get = get;
    c.set_weights.get_typed = typed;
    c.set_weights.ctx = get_ctx;
    td_status st = td_eng_command(ctx, &c, timeout_ms, err);
    if (st == TD_OK) *version = c.set_weights.version;
    return st;
}

static td_status ws_fence(void *ctx, int timeout_ms, uint64_t *version, td_err *err) {
    td_eng_cmd c = {.type = TD_ENG_CMD_REPORT_STATE};
    td_status st = td_eng_command(ctx, &c, timeout_ms, err);
    if (st == TD_OK) *version = c.state.weights_version;
    return st;
}

int td_cmd_serve(int argc, char **argv) {
    serve_opts o;
    int pr = parse_opts(argc, argv, &o);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    char dm[4096];
    if (!o.model) {
        if (!(o.model = td_default_model_path(dm, sizeof dm))) {
            fprintf(stderr, "tandem serve: no MODEL given and the default model is not installed (looked for "
                            TD_DEFAULT_MODEL_HELP "). Usage: tandem serve MODEL\n");
            return 2;
        }
        fprintf(stderr, "tandem serve: no MODEL given: serving the default model %s\n", o.model);
    }

    // SIGINT/SIGTERM are blocked in every thread (the engine's and MHD's inherit the mask) and
    // taken synchronously by sigwait below.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    td_err err = {0};
    td_model *m = NULL;
    td_tokenizer *tok = NULL;
    td_eng *eng = NULL;
    td_server *srv = NULL;
    td_wsync *ws = NULL;
    char *tmpl = NULL;

    if (o.ws_shm && !o.weight_sync) {  // a usage error, before the model is loaded
        fprintf(stderr, "tandem serve: --weight-sync-shm needs --enable-weight-sync\n");
        return 2;
    }
    double t0 = td_now();
    if (td_model_load(o.model, &m, &err) != TD_OK) {
        fprintf(stderr, "tandem serve: %s\n", err.msg);
        goto done;
    }
    if (td_tokenizer_load(m->tokenizer_path ? m->tokenizer_path : o.model, &tok, &err) != TD_OK) {
        fprintf(stderr, "tandem serve: cannot load the tokenizer: %s\n", err.msg);
        goto done;
    }
    if (o.chat_template && access(o.chat_template, F_OK) != 0) {  // not a file: the template text (vLLM)
        if (!(tmpl = strdup(o.chat_template))) goto done;
    } else if (o.chat_template) {
        size_t len = 0;
        if (td_read_file(o.chat_template, 1 << 20, &tmpl, &len, &err) != TD_OK) {
            fprintf(stderr, "tandem serve: --chat-template: %s\n", err.msg);
            goto done;
        }
    }
    td_eng_params ep = td_eng_default_params();
    ep.model_name = o.name;
    ep.kv_cache_bytes = o.kv_bytes;
    if (o.has_gpu_util) ep.kv_cache_fraction = o.gpu_util;
    ep.kv_cache_dtype = o.kv_dtype;
    if (o.max_batched) ep.max_batched_tokens = (int)o.max_batched;
    if (o.max_seqs) ep.max_seqs = (int)o.max_seqs;
    if (ep.max_batched_tokens < ep.max_seqs) ep.max_batched_tokens = ep.max_seqs;
    if (o.max_len) ep.max_model_len = (int)o.max_len;
    if (o.block_size) ep.block_size = (int)o.block_size;
    ep.enable_prefix_cache = !o.no_prefix;
    ep.n_threads = (int)o.threads;
    ep.backend = o.backend;
    ep.chat_template = tmpl;
    ep.updatable_weights = o.weight_sync;
    ep.pooling = o.pooling == 1 ? TD_ENG_POOL_MEAN : TD_ENG_POOL_LAST;
    ep.embed_no_normalize = o.no_normalize;
    if (td_eng_create(m, tok, &ep, &eng, &err) != TD_OK) {
        fprintf(stderr, "tandem serve: %s\n", err.msg);
        goto done;
    }
    if (o.weight_sync) {
        td_wsync_params wp = td_wsync_default_params();
        wp.cfg = &m->cfg;
        wp.dtype = o.ws_dtype;
        wp.max_bucket_bytes = (size_t)o.ws_bucket_mb << 20;
        wp.session_timeout_s = (int)o.ws_timeout_s;
        wp.shm = o.ws_shm;
        wp.engine = (td_wsync_engine){.ctx = eng, .apply = ws_apply, .fence = ws_fence};
        if (td_wsync_create(&wp, &ws, &err) != TD_OK) {
            fprintf(stderr, "tandem serve: %s\n", err.msg);
            goto done;
        }
    }
    td_server_params sp = td_server_default_params();
    sp.host = o.host;
    sp.port = (int)o.port;
    sp.limits.default_logprobs_processed = o.logprobs_processed;
    if (o.has_max_logprobs) sp.limits.max_logprobs = (int)o.max_logprobs;
    sp.has_default_seed = o.has_seed;
    sp.default_seed = (uint64_t)o.seed;
    sp.api_key = o.api_key && *o.api_key ? o.api_key : NULL;
    sp.weight_sync = ws;
    sp.model_aliases = o.aliases;
    sp.n_model_aliases = o.n_aliases;
    sp.allowed_origins = o.allowed_origins;
    sp.log_prompts = o.log_prompts;
    sp.tool_call_parser = o.tool_call_parser;
    srv = td_server_start(&sp, td_eng_iface(eng), &err);
    if (!srv) {
        fprintf(stderr, "tandem serve: %s\n", err.msg);
        goto done;
    }
    td_engine_info info;
    td_eng_info(eng, &info);
    printf("tandem serve: %s (max_model_len %d) listening on http://%s:%d (loaded in %.2f s)\n", info.model_name,
           info.max_model_len, o.host, td_server_port(srv), td_now() - t0);
    fflush(stdout);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {}
    TD_LOGI("serve: signal %d: stopping (up to %ld s for in-flight requests)", sig, o.shutdown_s);
    int cancelled = td_server_stop(srv, (int)(o.shutdown_s * 1000));
    srv = NULL;
    if (cancelled) TD_LOGI("serve: cancelled %d in-flight requests", cancelled);
    rc = 0;

done:
    if (srv) td_server_stop(srv, 0);
    td_wsync_free(ws);  // after the server (which joins a commit in flight), before the engine
    td_eng_free(eng);
    free(tmpl);
    td_tokenizer_free(tok);
    td_model_free(m);
    return rc;
}
