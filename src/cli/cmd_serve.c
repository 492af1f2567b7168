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
#include "cli/cli.h"
#include "engine/engine.h"
#include "model/model.h"
#include "server/server.h"
#include "server/wsync.h"
#include "tokenizer/tokenizer.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: tandem serve [MODEL] [options]\n"
            "  MODEL                    model directory (config.json + safetensors) or .gguf file\n"
            "                           (default: the embedded model, docs/default-model.md)\n"
            "  --host ADDR              IPv4 address to bind (default 127.0.0.1)\n"
            "  --port N                 TCP port (default 8000; 0 = any free port, printed at start)\n"
            "  --kv-cache-memory BYTES  KV cache budget, suffixes K, M, G allowed (default: a quarter of\n"
            "                           available memory, at most what --max-seqs full contexts use)\n"
            "  --max-batched-tokens N   tokens per engine step, decodes and prefill chunks (default 512)\n"
            "  --max-seqs N             sequences running at once (default 32)\n"
            "  --max-model-len N        context length (default: the model's)\n"
            "  --block-size N           tokens per KV block (default 16)\n"
            "  --kv-cache-dtype T       KV cache element type: auto (= f32), f32, f16 or bf16; f16/bf16\n"
            "                           hold twice the tokens in the same --kv-cache-memory\n"
            "  --served-model-name NAME[,NAME...]  model ids clients use (default: MODEL's last path\n"
            "                           component); the first is reported, all are accepted\n"
            "  --alias NAME             one more accepted model id (llama-server's name)\n"
            "  --allowed-origins LIST   CORS: '*' or comma-separated origins allowed to call the API\n"
            "  --log-prompts            the per-request log line also carries the prompt text\n"
            "  --tool-call-parser P     auto (default: chosen from the chat template), hermes,\n"
            "                           llama3_json or none\n"
            "  --chat-template FILE     Jinja chat template overriding the tokenizer's\n"
            "  --no-prefix-caching      do not reuse KV of shared prompt prefixes\n"
            "  --threads N              forward threads (default: all cores)\n"
            "  --backend NAME           where the model runs: cpu, or a device backend of this build\n"
            "                           (listed below); default $TANDEM_BACKEND, else cpu;\n"
            "                           $TANDEM_DEVICE picks the device\n"
            "  --shutdown-timeout S     seconds in-flight requests may finish after SIGTERM (default 5)\n"
            "  --logprobs-mode M        raw (default: log_softmax of the model's logits) or processed (the\n"
            "                           distribution sampled from, after penalties, temperature and\n"
            "                           top-k/top-p/min-p); requests override it with \"logprobs_mode\"\n"
            "  --api-key KEY            require \"Authorization: Bearer KEY\" on every route but /health\n"
            "                           (default $TANDEM_API_KEY; none when unset)\n"
            "weight sync (docs/server.md; `tandem weights push`):\n"
            "  --enable-weight-sync     accept new weights over /v1/weights/* (costs a copy of the\n"
            "                           weights for the engine plus a staging copy in the wire dtype)\n"
            "  --weight-sync-dtype T    wire and staging dtype: f32 (default) or bf16 (half the memory)\n"
            "  --weight-sync-max-bucket-mb N  largest bucket body, MiB (default 256)\n"
            "  --weight-sync-timeout S  an idle sync session expires after S seconds; also the deadline\n"
            "                           of applying a commit (default 60)\n"
            "  --weight-sync-shm        also take buckets by reference to a shared-memory file\n"
            "                           /dev/shm/tandem-* (clients on this host: `weights push --shm`)\n");
    fprintf(f, "backends in this build: %s\n", td_backend_names());
}

typedef struct {
    const char *model, *host, *name, *chat_template, *backend;
    long port, max_batched, max_seqs, max_len, block_size, threads, shutdown_s;
    size_t kv_bytes;
    bool no_prefix;
    bool logprobs_processed;
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

static int parse_bytes(const char *name, const char *v, size_t *out) {
    if (!v) return fprintf(stderr, "tandem: %s needs a value\n", name), 0;
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (errno || end == v || *end || !(x > 0) || x * mul > 1e15)
        return fprintf(stderr, "tandem: %s expects a positive byte count (e.g. 268435456 or 256M), got '%s'\n", name, v), 0;
    *out = (size_t)(x * mul);
    return 1;
}

static int parse_opts(int argc, char **argv, serve_opts *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->shutdown_s = 5;
    o->api_key = getenv("TANDEM_API_KEY");
    o->ws_dtype = TD_F32;
    o->ws_bucket_mb = 256;
    o->ws_timeout_s = 60;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() (i++, v)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            serve_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--host")) {
            if (!v) return fprintf(stderr, "tandem: --host needs a value\n"), -1;
            o->host = TAKE();
        } else if (!strcmp(a, "--port")) {
            if (!td_arg_int(a, TAKE(), 0, 65535, &o->port)) return -1;
        } else if (!strcmp(a, "--kv-cache-memory")) {
            if (!parse_bytes(a, TAKE(), &o->kv_bytes)) return -1;
        } else if (!strcmp(a, "--max-batched-tokens") || !strcmp(a, "--max-num-batched-tokens")) {
            if (!td_arg_int(a, TAKE(), 1, 1 << 20, &o->max_batched)) return -1;
        } else if (!strcmp(a, "--max-seqs") || !strcmp(a, "--max-num-seqs")) {
            if (!td_arg_int(a, TAKE(), 1, 4096, &o->max_seqs)) return -1;
        } else if (!strcmp(a, "--max-model-len")) {
            if (!td_arg_int(a, TAKE(), 2, 1 << 24, &o->max_len)) return -1;
        } else if (!strcmp(a, "--kv-cache-dtype")) {
            if (!td_arg_kv_dtype(a, TAKE(), &o->kv_dtype)) return -1;
        } else if (!strcmp(a, "--block-size")) {
            if (!td_arg_int(a, TAKE(), 1, 1024, &o->block_size)) return -1;
        } else if (!strcmp(a, "--threads")) {
            if (!td_arg_int(a, TAKE(), 1, 1024, &o->threads)) return -1;
        } else if (!strcmp(a, "--backend")) {
            if (!v) return fprintf(stderr, "tandem: --backend needs a value\n"), -1;
            o->backend = TAKE();
        } else if (!strcmp(a, "--shutdown-timeout")) {
            if (!td_arg_int(a, TAKE(), 0, 3600, &o->shutdown_s)) return -1;
        } else if (!strcmp(a, "--served-model-name") || !strcmp(a, "--alias")) {
            if (!v || !*v) return fprintf(stderr, "tandem: %s needs a value\n", a), -1;
            // comma-separated names; the first --served-model-name names the engine, the rest alias it
            char *names = argv[++i];  // argv is writable; strtok_r splits it in place
            for (char *save = NULL, *t = strtok_r(names, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                if (!*t) continue;
                if (!o->name && !strcmp(a, "--served-model-name")) {
                    o->name = t;
                } else if (o->n_aliases < (int)(sizeof o->aliases / sizeof o->aliases[0])) {
                    o->aliases[o->n_aliases++] = t;
                } else {
                    return fprintf(stderr, "tandem serve: at most 16 model aliases\n"), -1;
                }
            }
        } else if (!strcmp(a, "--allowed-origins")) {
            if (!v) return fprintf(stderr, "tandem: --allowed-origins needs a value\n"), -1;
            o->allowed_origins = TAKE();
        } else if (!strcmp(a, "--log-prompts")) {
            o->log_prompts = true;
        } else if (!strcmp(a, "--tool-call-parser")) {
            if (!v || (strcmp(v, "auto") && strcmp(v, "hermes") && strcmp(v, "llama3_json") && strcmp(v, "none")))
                return fprintf(stderr, "tandem serve: --tool-call-parser must be auto, hermes, llama3_json or none\n"), -1;
            o->tool_call_parser = TAKE();
        } else if (!strcmp(a, "--chat-template")) {
            if (!v) return fprintf(stderr, "tandem: --chat-template needs a file\n"), -1;
            o->chat_template = TAKE();
        } else if (!strcmp(a, "--no-prefix-caching") || !strcmp(a, "--no-enable-prefix-caching")) {
            o->no_prefix = true;
        } else if (!strcmp(a, "--logprobs-mode")) {
            if (v && (!strcmp(v, "raw") || !strcmp(v, "raw_logprobs"))) o->logprobs_processed = false;
            else if (v && (!strcmp(v, "processed") || !strcmp(v, "processed_logprobs"))) o->logprobs_processed = true;
            else return fprintf(stderr, "tandem serve: --logprobs-mode must be raw or processed\n"), -1;
            i++;
        } else if (!strcmp(a, "--api-key")) {
            if (!v || !*v) return fprintf(stderr, "tandem: --api-key needs a value\n"), -1;
            o->api_key = TAKE();
        } else if (!strcmp(a, "--enable-weight-sync")) {
            o->weight_sync = true;
        } else if (!strcmp(a, "--weight-sync-shm")) {
            o->ws_shm = true;
        } else if (!strcmp(a, "--weight-sync-dtype")) {
            if (!v || (strcmp(v, "f32") && strcmp(v, "bf16")))
                return fprintf(stderr, "tandem: --weight-sync-dtype must be f32 or bf16\n"), -1;
            o->ws_dtype = !strcmp(TAKE(), "bf16") ? TD_BF16 : TD_F32;
        } else if (!strcmp(a, "--weight-sync-max-bucket-mb")) {
            if (!td_arg_int(a, TAKE(), 1, 1 << 16, &o->ws_bucket_mb)) return -1;
        } else if (!strcmp(a, "--weight-sync-timeout")) {
            if (!td_arg_int(a, TAKE(), 1, 86400, &o->ws_timeout_s)) return -1;
        } else if (a[0] == '-') {
            fprintf(stderr, "tandem serve: unknown option '%s' (see tandem serve --help)\n", a);
            return -1;
        } else if (!o->model) {
            o->model = a;
        } else {
            fprintf(stderr, "tandem serve: unexpected argument '%s'\n", a);
            return -1;
        }
#undef TAKE
    }
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
    if (o.chat_template) {
        size_t len = 0;
        if (td_read_file(o.chat_template, 1 << 20, &tmpl, &len, &err) != TD_OK) {
            fprintf(stderr, "tandem serve: --chat-template: %s\n", err.msg);
            goto done;
        }
    }
    td_eng_params ep = td_eng_default_params();
    ep.model_name = o.name;
    ep.kv_cache_bytes = o.kv_bytes;
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
