// `tandem bench serve`: option parsing (names of `vllm bench serve` where they exist), model
// discovery through GET /v1/models, warm-up, the timed run, the table and the result JSON.
// Lives in the library (not src/cli/) so that tests drive exactly what the command does.
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loadgen/lg_http.h"
#include "loadgen/loadgen.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: tandem bench serve [options]\n"
            "\n"
            "Load generator for any OpenAI-compatible server; metrics as `vllm bench serve`.\n"
            "\n"
            "server:\n"
            "  --base-url URL            server URL, http:// or https:// (default http://127.0.0.1:8000)\n"
            "  --host H --port P         instead of --base-url\n"
            "  --endpoint PATH           /v1/completions (default) or /v1/chat/completions\n"
            "  --model NAME              model name (default: first id from GET /v1/models); also\n"
            "    --served-model-name NAME\n"
            "  --api-key KEY             sent as 'Authorization: Bearer KEY' (default $OPENAI_API_KEY)\n"
            "  --header 'NAME: VALUE'    an extra header on every request (repeatable; NAME=VALUE too)\n"
            "  --cacert FILE             https: trust the CA certificates in this PEM file\n"
            "  --insecure                https: do not verify the server's certificate\n"
            "workload (random dataset):\n"
            "  --dataset-name random     the only dataset\n"
            "  --num-prompts N           requests (default 1000)\n"
            "  --random-input-len N      prompt tokens (default 1024); alias --input-len\n"
            "  --random-output-len N     max_tokens (default 128); alias --output-len\n"
            "  --random-range-ratio R    lengths uniform in [L(1-R), L(1+R)], R in [0,1) (default 0)\n"
            "  --random-vocab-size V     prompt ids uniform in [offset, offset+V) (default 1000)\n"
            "  --random-vocab-offset O   lowest prompt id (default 1000)\n"
            "  --random-prefix-len N     a shared random prefix of N tokens before each prompt (default 0)\n"
            "  --ignore-eos              send \"ignore_eos\": true\n"
            "  --temperature T           send a temperature (default: not sent)\n"
            "  --extra-body JSON         members added to every request body\n"
            "  --seed S                  lengths, prompts and arrivals (default 0)\n"
            "traffic:\n"
            "  --request-rate R          requests/s, Poisson arrivals; inf = all at once (default)\n"
            "  --burstiness B            gamma shape of inter-arrival gaps (default 1 = Poisson)\n"
            "  --max-concurrency C       requests in flight at most (default: no cap)\n"
            "  --num-warmups N           untimed requests first (default 0)\n"
            "  --request-timeout S       seconds per request (default 600)\n"
            "  --no-keep-alive           a new connection per request\n"
            "  --require-text            a chunk carries a token only with non-empty text (older vLLM)\n"
            "report:\n"
            "  --goodput KEY:MS ...      SLOs for goodput; KEY in ttft, tpot, e2el\n"
            "  --percentile-metrics L    sections printed (default ttft,tpot,itl,e2el)\n"
            "  --metric-percentiles L    percentiles reported (default 99)\n"
            "  --save-result             write the result JSON\n"
            "  --result-filename F       its name (default tandem-<rate>qps[-concurrency<C>]-<model>-<date>.json)\n"
            "  --result-dir D            its directory\n"
            "  --json                    also print the result JSON on stdout\n");
}

typedef struct {
    td_lg_params p;
    td_lg_slo slo;
    double pcts[TD_LG_MAX_PCT];
    int n_pct;
    int which;
    int save_result, print_json;
    const char *result_filename, *result_dir;
    const char *host, *port;
    char url_buf[600];
    const char *headers[64];  // --header values (argv strings)
} cli_opts;

static int bad(const char *name, const char *v, const char *what) {
    fprintf(stderr, "tandem bench serve: %s: %s '%s'\n", name, what, v ? v : "(missing)");
    return 0;
}

static int get_long(const char *name, const char *v, long lo, long hi, long *out) {
    if (!v) return bad(name, v, "needs a value");
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) return bad(name, v, "expects an integer in range, got");
    *out = x;
    return 1;
}

static int get_double(const char *name, const char *v, double lo, double hi, double *out) {
    if (!v) return bad(name, v, "needs a value");
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno == ERANGE || end == v || *end || !(x >= lo && x <= hi)) return bad(name, v, "expects a number in range, got");
    *out = x;
    return 1;
}

static int parse_goodput(cli_opts *o, const char *v) {
    const char *colon = strchr(v, ':');
    if (!colon) return bad("--goodput", v, "expects KEY:MILLISECONDS, got");
    double x;
    if (!get_double("--goodput", colon + 1, 0, 1e12, &x)) return 0;
    size_t kl = (size_t)(colon - v);
    if (kl == 4 && !strncmp(v, "ttft", 4)) o->slo.ttft = x;
    else if (kl == 4 && !strncmp(v, "tpot", 4)) o->slo.tpot = x;
    else if (kl == 4 && !strncmp(v, "e2el", 4)) o->slo.e2el = x;
    else return bad("--goodput", v, "metric must be ttft, tpot or e2el, got");
    return 1;
}

static int parse_metrics(cli_opts *o, const char *v) {
    o->which = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        if (!strcmp(t, "ttft")) o->which |= TD_LG_METRIC_TTFT;
        else if (!strcmp(t, "tpot")) o->which |= TD_LG_METRIC_TPOT;
        else if (!strcmp(t, "itl")) o->which |= TD_LG_METRIC_ITL;
        else if (!strcmp(t, "e2el")) o->which |= TD_LG_METRIC_E2EL;
        else return bad("--percentile-metrics", t, "unknown metric");
    }
    return 1;
}

static int parse_pcts(cli_opts *o, const char *v) {
    o->n_pct = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        if (o->n_pct == TD_LG_MAX_PCT) return bad("--metric-percentiles", v, "too many percentiles in");
        double x;
        if (!get_double("--metric-percentiles", t, 0, 100, &x)) return 0;
        o->pcts[o->n_pct++] = x;
    }
    return 1;
}

// Returns 1 ok, 0 usage error, -1 help printed.
static int parse_args(int argc, char **argv, cli_opts *o) {
    o->p = td_lg_default_params();
    o->slo = (td_lg_slo){-1, -1, -1};
    o->pcts[0] = 99;
    o->n_pct = 1;
    o->which = TD_LG_METRIC_TTFT | TD_LG_METRIC_TPOT | TD_LG_METRIC_ITL | TD_LG_METRIC_E2EL;
    o->p.api_key = getenv("OPENAI_API_KEY");
    o->p.headers = o->headers;
    for (int i = 1; i < argc; i++) {
        char name[64];
        const char *a = argv[i], *v = NULL;
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq && (size_t)(eq - a) < sizeof name) {  // --name=value
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = 0;
            v = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", a);
        }
#define VAL() (v ? v : (i + 1 < argc ? argv[++i] : NULL))
        long x;
        double d;
        if (!strcmp(name, "-h") || !strcmp(name, "--help")) {
            usage(stdout);
            return -1;
        } else if (!strcmp(name, "--base-url")) {
            if (!(o->p.base_url = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--host")) {
            if (!(o->host = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--port")) {
            if (!(o->port = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--endpoint")) {
            if (!(o->p.endpoint = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--model") || !strcmp(name, "--served-model-name")) {
            if (!(o->p.model = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--dataset-name")) {
            const char *s = VAL();
            if (!s || strcmp(s, "random")) return bad(name, s, "only 'random' is supported, got");
        } else if (!strcmp(name, "--num-prompts")) {
            if (!get_long(name, VAL(), 1, 10000000, &x)) return 0;
            o->p.num_prompts = (int)x;
        } else if (!strcmp(name, "--random-input-len") || !strcmp(name, "--input-len")) {
            if (!get_long(name, VAL(), 1, 10000000, &x)) return 0;
            o->p.input_len = (int)x;
        } else if (!strcmp(name, "--random-output-len") || !strcmp(name, "--output-len")) {
            if (!get_long(name, VAL(), 1, 10000000, &x)) return 0;
            o->p.output_len = (int)x;
        } else if (!strcmp(name, "--random-range-ratio")) {
            if (!get_double(name, VAL(), 0, 0.999999, &o->p.range_ratio)) return 0;
        } else if (!strcmp(name, "--random-vocab-size")) {
            if (!get_long(name, VAL(), 1, 100000000, &x)) return 0;
            o->p.vocab_size = (int)x;
        } else if (!strcmp(name, "--random-prefix-len")) {
            if (!get_long(name, VAL(), 0, 10000000, &x)) return 0;
            o->p.prefix_len = (int)x;
        } else if (!strcmp(name, "--random-vocab-offset")) {
            if (!get_long(name, VAL(), 0, 100000000, &x)) return 0;
            o->p.vocab_offset = (int)x;
        } else if (!strcmp(name, "--max-concurrency")) {
            if (!get_long(name, VAL(), 1, 1000000, &x)) return 0;
            o->p.max_concurrency = (int)x;
        } else if (!strcmp(name, "--request-rate")) {
            const char *s = VAL();
            if (s && (!strcmp(s, "inf") || !strcmp(s, "Infinity"))) o->p.request_rate = INFINITY;
            else if (!get_double(name, s, 1e-9, 1e9, &o->p.request_rate)) return 0;
        } else if (!strcmp(name, "--burstiness")) {
            const char *s = VAL();
            if (s && !strcmp(s, "inf")) o->p.burstiness = INFINITY;
            else if (!get_double(name, s, 1e-6, 1e6, &o->p.burstiness)) return 0;
        } else if (!strcmp(name, "--ignore-eos")) {
            o->p.ignore_eos = 1;
        } else if (!strcmp(name, "--temperature")) {
            if (!get_double(name, VAL(), 0, 100, &o->p.temperature)) return 0;
        } else if (!strcmp(name, "--extra-body")) {
            if (!(o->p.extra_body = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--seed")) {
            if (!get_long(name, VAL(), 0, 0x7fffffffL, &x)) return 0;
            o->p.seed = (uint64_t)x;
        } else if (!strcmp(name, "--num-warmups")) {
            if (!get_long(name, VAL(), 0, 1000000, &x)) return 0;
            o->p.num_warmups = (int)x;
        } else if (!strcmp(name, "--request-timeout")) {
            if (!get_double(name, VAL(), 0.001, 1e7, &d)) return 0;
            o->p.timeout_s = d;
        } else if (!strcmp(name, "--require-text")) {
            o->p.require_text = 1;
        } else if (!strcmp(name, "--api-key")) {
            if (!(o->p.api_key = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--header")) {
            const char *h = VAL();
            char line[8192];
            td_err herr;
            if (!h) return bad(name, NULL, "needs 'NAME: VALUE'");
            if (!td_lg_header_line(h, line, sizeof line, &herr)) return fprintf(stderr, "tandem bench serve: %s\n", herr.msg), 0;
            if (o->p.n_headers == (int)(sizeof o->headers / sizeof *o->headers)) return bad(name, h, "too many headers at");
            o->headers[o->p.n_headers++] = h;
        } else if (!strcmp(name, "--cacert")) {
            if (!(o->p.cacert = VAL())) return bad(name, NULL, "needs a file");
        } else if (!strcmp(name, "--insecure")) {
            o->p.insecure = 1;
        } else if (!strcmp(name, "--no-keep-alive")) {
            o->p.keep_alive = 0;
        } else if (!strcmp(name, "--goodput")) {  // one or more KEY:VALUE words
            int n = 0;
            if (v) {
                if (!parse_goodput(o, v)) return 0;
                n++;
            }
            while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
                if (!parse_goodput(o, argv[++i])) return 0;
                n++;
            }
            if (!n) return bad(name, NULL, "needs KEY:MILLISECONDS");
        } else if (!strcmp(name, "--percentile-metrics")) {
            const char *s = VAL();
            if (!s) return bad(name, NULL, "needs a value");
            if (!parse_metrics(o, s)) return 0;
        } else if (!strcmp(name, "--metric-percentiles")) {
            const char *s = VAL();
            if (!s) return bad(name, NULL, "needs a value");
            if (!parse_pcts(o, s)) return 0;
        } else if (!strcmp(name, "--save-result")) {
            o->save_result = 1;
        } else if (!strcmp(name, "--result-filename")) {
            if (!(o->result_filename = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--result-dir")) {
            if (!(o->result_dir = VAL())) return bad(name, NULL, "needs a value");
        } else if (!strcmp(name, "--json")) {
            o->print_json = 1;
        } else {
            fprintf(stderr, "tandem bench serve: unknown option '%s' (see --help)\n", a);
            return 0;
        }
#undef VAL
    }
    if (o->host || o->port) {
        snprintf(o->url_buf, sizeof o->url_buf, "http://%s:%s", o->host ? o->host : "127.0.0.1",
                 o->port ? o->port : "8000");
        o->p.base_url = o->url_buf;
    }
    return 1;
}

// The first model id from GET /v1/models; malloc'd, or NULL with err set.
static char *first_model(const td_lg_url *url, const td_lg_params *p, td_err *err) {
    int status;
    char *body;
    if (td_lg_http_simple(url, p, "GET", "/v1/models", NULL, 30.0, 1 << 20, &status, &body, err) != TD_OK) return NULL;
    char *id = NULL;
    cJSON *j = cJSON_Parse(body);
    const cJSON *data = j ? cJSON_GetObjectItemCaseSensitive(j, "data") : NULL;
    const cJSON *m0 = cJSON_IsArray(data) ? cJSON_GetArrayItem(data, 0) : NULL;
    const cJSON *idj = m0 ? cJSON_GetObjectItemCaseSensitive(m0, "id") : NULL;
    const cJSON *e = j ? cJSON_GetObjectItemCaseSensitive(j, "error") : NULL;
    const cJSON *em = cJSON_IsObject(e) ? cJSON_GetObjectItemCaseSensitive(e, "message") : NULL;
    if (status != 200)
        td_err_set(err, TD_ERR_IO, "GET /v1/models: HTTP %d%s%.200s", status, cJSON_IsString(em) ? ": " : "",
                   cJSON_IsString(em) ? em->valuestring : "");
    else if (!cJSON_IsString(idj)) td_err_set(err, TD_ERR_FORMAT, "GET /v1/models: no data[0].id in the reply");
    else id = strdup(idj->valuestring);
    cJSON_Delete(j);
    free(body);
    return id;
}

static int write_json(const char *path, const cJSON *o) {
    char *s = cJSON_Print(o);
    if (!s) return 0;
    FILE *f = fopen(path, "w");
    int ok = f && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f) != 0) ok = 0;
    free(s);
    return ok;
}

int td_lg_bench_main(int argc, char **argv) {
    cli_opts o;
    memset(&o, 0, sizeof o);
    int pr = parse_args(argc, argv, &o);
    if (pr < 0) return 0;
    if (pr == 0) return 2;
    td_lg_params *p = &o.p;
    td_err err = {0};
    td_lg_url url;
    if (td_lg_url_parse(p->base_url, &url, &err) != TD_OK) {
        fprintf(stderr, "tandem bench serve: %s\n", err.msg);
        return 2;
    }
    char *model = p->model ? strdup(p->model) : first_model(&url, p, &err);
    if (!model) {
        fprintf(stderr, "tandem bench serve: cannot find the model (give --model): %s\n", err.msg);
        return 1;
    }
    td_lg_workload w = {0};
    td_lg_run run = {0};
    td_lg_metrics m = {0};
    int rc = 1;
    if (td_lg_workload_build(p, model, &w, &err) != TD_OK) {
        fprintf(stderr, "tandem bench serve: %s\n", err.msg);
        rc = err.status == TD_ERR_INVALID ? 2 : 1;
        goto out;
    }
    if (p->num_warmups > 0) {  // the first requests again, all at once under the cap; discarded
        printf("Warming up with %d requests...\n", p->num_warmups);
        td_lg_workload ww = {.n = p->num_warmups, .url = w.url, .reqs = malloc((size_t)p->num_warmups * sizeof *ww.reqs)};
        if (!ww.reqs) goto out;
        for (int i = 0; i < ww.n; i++) ww.reqs[i] = w.reqs[i % w.n];
        td_lg_params wp = *p;
        wp.request_rate = INFINITY;
        td_lg_run wr;
        td_status st = td_lg_run_workload(&wp, &ww, &wr, &err);
        free(ww.reqs);
        if (st != TD_OK) {
            fprintf(stderr, "tandem bench serve: warm-up: %s\n", err.msg);
            goto out;
        }
        td_lg_run_free(&wr);
    }
    printf("Model: %s\nTraffic request rate: %s", model, isinf(p->request_rate) ? "inf" : "");
    if (!isinf(p->request_rate)) printf("%g", p->request_rate);
    printf("\nBurstiness factor: %g (%s)\n", p->burstiness, p->burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
    if (p->max_concurrency > 0) printf("Maximum request concurrency: %d\n", p->max_concurrency);
    else printf("Maximum request concurrency: None\n");
    fflush(stdout);
    if (td_lg_run_workload(p, &w, &run, &err) != TD_OK) {
        fprintf(stderr, "tandem bench serve: %s\n", err.msg);
        goto out;
    }
    if (td_lg_metrics_compute(&run, &o.slo, o.pcts, o.n_pct, &m, &err) != TD_OK) {
        fprintf(stderr, "tandem bench serve: %s\n", err.msg);
        goto out;
    }
    if (m.failed > 0) {
        printf("Failed requests during benchmark run detected (capping to 10):\n");
        for (int i = 0, shown = 0; i < run.n && shown < 10; i++)
            if (!run.res[i].success) printf("Error %d: %s\n", shown++, run.res[i].error);
    }
    td_lg_report_print(stdout, p, &m, o.which);
    rc = m.completed > 0 ? 0 : 1;
    if (o.save_result || o.print_json) {
        cJSON *j = td_lg_report_json(p, model, &run, &m);
        if (!j) {
            fprintf(stderr, "tandem bench serve: out of memory for the result JSON\n");
            rc = 1;
            goto out;
        }
        if (o.print_json) {
            char *s = cJSON_PrintUnformatted(j);
            if (s) printf("%s\n", s);
            free(s);
        }
        if (o.save_result) {
            char fname[1024], path[2048];
            if (o.result_filename) {
                snprintf(fname, sizeof fname, "%s", o.result_filename);
            } else {
                const char *base = strrchr(model, '/');
                base = base ? base + 1 : model;
                char rate[32], conc[32] = "", date[32];
                if (isinf(p->request_rate)) snprintf(rate, sizeof rate, "inf");
                else snprintf(rate, sizeof rate, "%g", p->request_rate);
                if (p->max_concurrency > 0) snprintf(conc, sizeof conc, "-concurrency%d", p->max_concurrency);
                time_t now = time(NULL);
                struct tm tm;
                localtime_r(&now, &tm);
                strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm);
                snprintf(fname, sizeof fname, "tandem-%sqps%s-%s-%s.json", rate, conc, base, date);
            }
            if (o.result_dir) snprintf(path, sizeof path, "%s/%s", o.result_dir, fname);
            else snprintf(path, sizeof path, "%s", fname);
            if (!write_json(path, j)) {
                fprintf(stderr, "tandem bench serve: cannot write %s: %s\n", path, strerror(errno));
                rc = 1;
            } else {
                fprintf(stderr, "result written to %s\n", path);
            }
        }
        cJSON_Delete(j);
    }
out:
    td_lg_metrics_free(&m);
    td_lg_run_free(&run);
    td_lg_workload_free(&w);
    free(model);
    fflush(stdout);
    return rc;
}
