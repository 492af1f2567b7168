// End-to-end test of the load generator against tests/e2e/mock_openai_server.js (node, started
// here on a free port): exact counts (requests, tokens, the mock's peak concurrency), approximate
// timings (TTFT ~ the mock's first-chunk delay, TPOT ~ its token delay, with generous bounds),
// failures of every kind counted per request, and the command's JSON result keys.
#include <cjson/cJSON.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "loadgen/lg_http.h"
#include "loadgen/loadgen.h"
#include "test_util.h"

typedef struct {
    pid_t pid;
    int port;
    int stdin_fd;
    char url[64];
    char cacert[300];  // https mocks: the certificate to trust; "" for http
} mock;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Starts the mock with the given first-chunk and token delays, over https with tls_dir/key.pem and
// tls_dir/cert.pem when tls_dir is not NULL; 0 on failure.
static int mock_start(mock *m, int first_ms, int token_ms, int eos_at, const char *tls_dir) {
    char key[300] = "", cert[300] = "";
    if (tls_dir) {
        snprintf(key, sizeof key, "%s/key.pem", tls_dir);
        snprintf(cert, sizeof cert, "%s/cert.pem", tls_dir);
    }
    int out[2], in[2];
    if (pipe(out) || pipe(in)) return 0;
    char a1[16], a2[16], a3[16];
    snprintf(a1, sizeof a1, "%d", first_ms);
    snprintf(a2, sizeof a2, "%d", token_ms);
    snprintf(a3, sizeof a3, "%d", eos_at);
    pid_t pid = fork();
    if (pid < 0) return 0;
    if (pid == 0) {
        dup2(out[1], 1);
        dup2(in[0], 0);
        close(out[0]);
        close(out[1]);
        close(in[0]);
        close(in[1]);
        if (tls_dir)
            execlp("node", "node", "tests/e2e/mock_openai_server.js", "--first-delay-ms", a1, "--token-delay-ms", a2,
                   "--eos-at", a3, "--tls-key", key, "--tls-cert", cert, (char *)NULL);
        else
            execlp("node", "node", "tests/e2e/mock_openai_server.js", "--first-delay-ms", a1, "--token-delay-ms", a2,
                   "--eos-at", a3, (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    close(in[0]);
    m->pid = pid;
    m->stdin_fd = in[1];
    char line[128];
    size_t len = 0;
    double deadline = now_s() + 15.0;
    while (len < sizeof line - 1 && now_s() < deadline) {
        struct pollfd pfd = {.fd = out[0], .events = POLLIN};
        if (poll(&pfd, 1, 200) <= 0) continue;
        ssize_t k = read(out[0], line + len, 1);
        if (k <= 0) break;
        len += (size_t)k;
        if (line[len - 1] == '\n') break;
    }
    line[len] = 0;
    close(out[0]);
    if (sscanf(line, "PORT %d", &m->port) != 1) {
        fprintf(stderr, "mock did not start (got '%s')\n", line);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return 0;
    }
    snprintf(m->url, sizeof m->url, "%s://127.0.0.1:%d", tls_dir ? "https" : "http", m->port);
    snprintf(m->cacert, sizeof m->cacert, "%s", cert);
    return 1;
}

static void mock_stop(mock *m) {
    if (m->pid <= 0) return;
    close(m->stdin_fd);
    kill(m->pid, SIGTERM);
    waitpid(m->pid, NULL, 0);
    m->pid = 0;
}

static cJSON *mock_call(mock *m, const char *method, const char *path) {
    td_lg_url u;
    td_err err;
    if (td_lg_url_parse(m->url, &u, &err) != TD_OK) return NULL;
    int status;
    char *body;
    td_lg_params p = td_lg_default_params();
    p.cacert = m->cacert[0] ? m->cacert : NULL;
    if (td_lg_http_simple(&u, &p, method, path, method[0] == 'P' ? "{}" : NULL, 5.0, 1 << 20, &status, &body, &err) != TD_OK) {
        fprintf(stderr, "mock %s %s: %s\n", method, path, err.msg);
        return NULL;
    }
    cJSON *j = status == 200 ? cJSON_Parse(body) : NULL;
    free(body);
    return j;
}

static int stat_int(const cJSON *s, const char *k) {
    const cJSON *x = s ? cJSON_GetObjectItem(s, k) : NULL;
    return x ? x->valueint : -1;
}

typedef struct {
    td_lg_run run;
    td_lg_metrics m;
    cJSON *stats;  // the mock's counters after the run
    double wall;   // s
    int ok;
} outcome;

static void outcome_free(outcome *o) {
    td_lg_run_free(&o->run);
    td_lg_metrics_free(&o->m);
    cJSON_Delete(o->stats);
}

static outcome run_case(mock *mk, const td_lg_params *p, const char *model, const td_lg_slo *slo) {
    outcome o;
    memset(&o, 0, sizeof o);
    cJSON_Delete(mock_call(mk, "POST", "/mock/reset"));
    td_lg_workload w;
    td_err err = {0};
    if (td_lg_workload_build(p, model, &w, &err) != TD_OK) {
        fprintf(stderr, "workload: %s\n", err.msg);
        return o;
    }
    double t = now_s();
    td_status st = td_lg_run_workload(p, &w, &o.run, &err);
    o.wall = now_s() - t;
    td_lg_workload_free(&w);
    if (st != TD_OK) {
        fprintf(stderr, "run: %s\n", err.msg);
        return o;
    }
    double pct[] = {99};
    if (td_lg_metrics_compute(&o.run, slo, pct, 1, &o.m, &err) != TD_OK) {
        fprintf(stderr, "metrics: %s\n", err.msg);
        return o;
    }
    o.stats = mock_call(mk, "GET", "/mock/stats");
    o.ok = 1;
    return o;
}

static int all_errors_contain(const td_lg_run *r, const char *what) {
    for (int i = 0; i < r->n; i++)
        if (r->res[i].success || !strstr(r->res[i].error, what)) {
            fprintf(stderr, "request %d: success %d error '%s' (wanted '%s')\n", i, r->res[i].success,
                    r->res[i].error, what);
            return 0;
        }
    return 1;
}

static td_lg_params base_params(const mock *mk, int n, int in_len, int out_len) {
    td_lg_params p = td_lg_default_params();
    p.base_url = mk->url;
    p.num_prompts = n;
    p.input_len = in_len;
    p.output_len = out_len;
    p.timeout_s = 10;
    return p;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    mock mk = {0};
    if (!mock_start(&mk, 100, 20, 5, NULL)) {
        CHECK(0, "cannot start node tests/e2e/mock_openai_server.js");
        TEST_DONE();
    }

    // A: fixed lengths, all at once under a cap of 4, ignore_eos, keep-alive.
    {
        td_lg_params p = base_params(&mk, 20, 16, 8);
        p.max_concurrency = 4;
        p.ignore_eos = 1;
        outcome o = run_case(&mk, &p, "mock-model", NULL);
        CHECK(o.ok, "case A ran");
        if (o.ok) {
            CHECK(o.m.completed == 20 && o.m.failed == 0, "A: completed %d failed %d (%s)", o.m.completed, o.m.failed,
                  o.run.res[0].error);
            CHECK(o.m.total_input == 320, "A: total input %lld", o.m.total_input);
            CHECK(o.m.total_output == 160, "A: total output %lld", o.m.total_output);
            int ok = 1;
            for (int i = 0; i < o.run.n; i++)
                ok &= o.run.res[i].chunks == 8 && o.run.res[i].n_itl == 7 && o.run.res[i].usage_tokens == 8 &&
                      o.m.output_lens[i] == 8;
            CHECK(ok, "A: 8 chunks, 7 gaps, usage 8 for every request");
            CHECK(stat_int(o.stats, "max_concurrent") == 4, "A: mock saw %d concurrent (cap 4)",
                  stat_int(o.stats, "max_concurrent"));
            CHECK(o.run.max_in_flight == 4, "A: client in flight %d", o.run.max_in_flight);
            CHECK(stat_int(o.stats, "ignore_eos") == 20, "A: ignore_eos sent %d", stat_int(o.stats, "ignore_eos"));
            CHECK(stat_int(o.stats, "include_usage") == 20, "A: include_usage %d", stat_int(o.stats, "include_usage"));
            CHECK(stat_int(o.stats, "connections") <= 8, "A: keep-alive: %d connections", stat_int(o.stats, "connections"));
            CHECK(o.m.ttft.mean > 80 && o.m.ttft.mean < 6000, "A: mean TTFT %.1f ms (mock 100)", o.m.ttft.mean);
            CHECK(o.m.tpot.mean > 15 && o.m.tpot.mean < 1000, "A: mean TPOT %.1f ms (mock 20)", o.m.tpot.mean);
            CHECK(o.m.itl.median > 10 && o.m.itl.median < 1000, "A: median ITL %.1f ms (mock 20)", o.m.itl.median);
            CHECK(o.m.e2el.mean > 200 && o.m.e2el.mean < 12000, "A: mean E2EL %.1f ms (mock 240)", o.m.e2el.mean);
            // 5 waves of 4 requests of ~240 ms
            CHECK(o.m.duration > 1.1 && o.m.duration < 40, "A: duration %.3f s", o.m.duration);
            CHECK(fabs(o.m.request_throughput - 20 / o.m.duration) < 1e-9, "A: request throughput");
            CHECK(fabs(o.m.total_token_throughput - 480 / o.m.duration) < 1e-6, "A: total token throughput");
            CHECK(o.m.max_concurrent_requests >= 3 && o.m.max_concurrent_requests <= 4, "A: peak overlap %d",
                  o.m.max_concurrent_requests);
            const cJSON *lb = cJSON_GetObjectItem(o.stats, "last_body");
            const cJSON *pr = lb ? cJSON_GetObjectItem(lb, "prompt") : NULL;
            CHECK(cJSON_IsArray(pr) && cJSON_GetArraySize(pr) == 16, "A: prompt is 16 token ids");
            int in_range = 1;
            const cJSON *id;
            cJSON_ArrayForEach(id, pr) in_range &= id->valueint >= 1000 && id->valueint < 2000;
            CHECK(in_range, "A: prompt ids in [1000, 2000)");
            CHECK(cJSON_GetObjectItem(lb, "max_tokens") && cJSON_GetObjectItem(lb, "max_tokens")->valueint == 8,
                  "A: max_tokens 8");
        }
        outcome_free(&o);
    }

    // B: without ignore_eos the mock stops after 5 tokens; lengths come from usage.
    {
        td_lg_params p = base_params(&mk, 12, 10, 8);
        p.max_concurrency = 6;
        outcome o = run_case(&mk, &p, "mock-model", NULL);
        CHECK(o.ok && o.m.completed == 12 && o.m.total_output == 60, "B: completed %d output %lld", o.m.completed,
              o.m.total_output);
        CHECK(o.ok && stat_int(o.stats, "ignore_eos") == 0, "B: ignore_eos not sent");
        outcome_free(&o);
    }

    // C: Poisson arrivals at 20 req/s: the last arrives at exactly 1 s.
    {
        td_lg_params p = base_params(&mk, 20, 8, 4);
        p.ignore_eos = 1;
        p.request_rate = 20;
        p.seed = 7;
        outcome o = run_case(&mk, &p, "mock-model", NULL);
        CHECK(o.ok && o.m.completed == 20, "C: completed %d", o.m.completed);
        if (o.ok) {
            double lo = INFINITY, hi = -INFINITY;
            for (int i = 0; i < o.run.n; i++) {
                lo = fmin(lo, o.run.res[i].start);
                hi = fmax(hi, o.run.res[i].start);
            }
            CHECK(o.m.duration >= 1.0 && o.m.duration < 40, "C: duration %.3f s", o.m.duration);
            CHECK(hi - lo > 0.5 && hi - lo < 5, "C: starts spread over %.3f s", hi - lo);
            CHECK(stat_int(o.stats, "max_concurrent") < 20, "C: arrivals spread (peak %d)",
                  stat_int(o.stats, "max_concurrent"));
        }
        outcome_free(&o);
    }

    // D: no keep-alive: one connection per request.
    {
        td_lg_params p = base_params(&mk, 10, 8, 3);
        p.ignore_eos = 1;
        p.keep_alive = 0;
        p.max_concurrency = 5;
        outcome o = run_case(&mk, &p, "mock-model", NULL);
        CHECK(o.ok && o.m.completed == 10 && o.run.connections_opened == 10, "D: completed %d connections %d",
              o.m.completed, o.run.connections_opened);
        CHECK(o.ok && stat_int(o.stats, "connections") == 11, "D: mock saw %d connections (10 + the stats query)",
              stat_int(o.stats, "connections"));
        outcome_free(&o);
    }

    // Q: a reused keep-alive connection that the server closes under a request: sent again on a
    // fresh connection, not counted as a failure.
    {
        td_lg_params p = base_params(&mk, 6, 8, 3);
        p.ignore_eos = 1;
        p.max_concurrency = 1;
        outcome o = run_case(&mk, &p, "mock-drop-reused", NULL);
        CHECK(o.ok && o.m.completed == 6 && o.m.failed == 0, "Q: completed %d failed %d (%s)", o.m.completed,
              o.m.failed, o.ok && o.m.failed ? o.run.res[1].error : "");
        CHECK(o.ok && stat_int(o.stats, "dropped") == 5 && o.run.connections_opened == 6,
              "Q: dropped %d, connections %d", stat_int(o.stats, "dropped"), o.run.connections_opened);
        outcome_free(&o);
    }

    // R: large request bodies (about 5 MB: partial writes) on reused keep-alive connections.
    {
        td_lg_params p = base_params(&mk, 3, 1000000, 2);
        p.ignore_eos = 1;
        p.max_concurrency = 1;
        outcome o = run_case(&mk, &p, "mock-model", NULL);
        CHECK(o.ok && o.m.completed == 3 && o.m.total_input == 3000000 && o.run.connections_opened == 1,
              "R: completed %d input %lld connections %d (%s)", o.m.completed, o.m.total_input,
              o.run.connections_opened, o.ok && o.m.failed ? o.run.res[o.run.n - 1].error : "");
        outcome_free(&o);
    }

    // E: chat endpoint: text prompt of 16 words, input length from usage.
    {
        td_lg_params p = base_params(&mk, 8, 16, 6);
        p.endpoint = "/v1/chat/completions";
        p.ignore_eos = 1;
        outcome o = run_case(&mk, &p, "mock-model", NULL);
        CHECK(o.ok && o.m.completed == 8 && o.m.total_input == 128 && o.m.total_output == 48,
              "E: completed %d input %lld output %lld", o.m.completed, o.m.total_input, o.m.total_output);
        const cJSON *lb = o.stats ? cJSON_GetObjectItem(o.stats, "last_body") : NULL;
        CHECK(lb && cJSON_IsArray(cJSON_GetObjectItem(lb, "messages")), "E: messages sent");
        outcome_free(&o);
    }

    // F: no usage chunk: output tokens = token-carrying chunks.
    {
        td_lg_params p = base_params(&mk, 6, 8, 7);
        p.ignore_eos = 1;
        outcome o = run_case(&mk, &p, "mock-nousage", NULL);
        CHECK(o.ok && o.m.completed == 6 && o.m.total_output == 42, "F: completed %d output %lld", o.m.completed,
              o.m.total_output);
        CHECK(o.ok && o.run.res[0].usage_tokens == 0, "F: no usage seen");
        outcome_free(&o);
    }

    // P: a first chunk with choices but empty text counts as a token (vLLM), unless --require-text.
    {
        td_lg_params p = base_params(&mk, 4, 8, 5);
        p.ignore_eos = 1;
        outcome o = run_case(&mk, &p, "mock-empty", NULL);
        CHECK(o.ok && o.m.completed == 4 && o.run.res[0].chunks == 6 && o.m.total_output == 20,
              "P: chunks %d output %lld", o.ok ? o.run.res[0].chunks : -1, o.m.total_output);
        CHECK(o.ok && o.m.ttft.mean > 90, "P: TTFT %.1f ms at the empty chunk (mock 100)", o.m.ttft.mean);
        outcome_free(&o);
        p.require_text = 1;
        o = run_case(&mk, &p, "mock-empty", NULL);
        CHECK(o.ok && o.m.completed == 4 && o.run.res[0].chunks == 5, "P: require-text chunks %d",
              o.ok ? o.run.res[0].chunks : -1);
        // the first text comes one token delay (20 ms) after the empty chunk; timers only run late
        CHECK(o.ok && o.m.ttft.mean > 112, "P: require-text TTFT %.1f ms (mock 100 + 20)", o.m.ttft.mean);
        outcome_free(&o);
    }

    // G: events split inside the JSON across writes; H: Content-Length body.
    {
        td_lg_params p = base_params(&mk, 6, 8, 6);
        p.ignore_eos = 1;
        outcome o = run_case(&mk, &p, "mock-split", NULL);
        CHECK(o.ok && o.m.completed == 6 && o.run.res[0].chunks == 6, "G: completed %d chunks %d", o.m.completed,
              o.ok ? o.run.res[0].chunks : -1);
        outcome_free(&o);
        o = run_case(&mk, &p, "mock-length", NULL);
        CHECK(o.ok && o.m.completed == 6 && o.run.res[0].chunks == 6 && o.m.total_output == 36,
              "H: completed %d chunks %d", o.m.completed, o.ok ? o.run.res[0].chunks : -1);
        outcome_free(&o);
    }

    // I..L: failures are counted per request, never crash.
    {
        td_lg_params p = base_params(&mk, 5, 8, 4);
        outcome o = run_case(&mk, &p, "mock-error", NULL);
        CHECK(o.ok && o.m.failed == 5 && o.m.completed == 0 && all_errors_contain(&o.run, "HTTP 500"),
              "I: HTTP 500 counted");
        outcome_free(&o);
        o = run_case(&mk, &p, "mock-malformed", NULL);
        CHECK(o.ok && o.m.failed == 5 && all_errors_contain(&o.run, "malformed"), "J: malformed chunk counted");
        outcome_free(&o);
        p.timeout_s = 0.3;
        o = run_case(&mk, &p, "mock-hang", NULL);
        CHECK(o.ok && o.m.failed == 5 && all_errors_contain(&o.run, "timed out") && o.wall < 3.0,
              "K: timeouts counted (%.2f s)", o.wall);
        outcome_free(&o);

        int s = socket(AF_INET, SOCK_STREAM, 0);  // a port nobody listens on
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t al = sizeof a;
        bind(s, (struct sockaddr *)&a, sizeof a);
        getsockname(s, (struct sockaddr *)&a, &al);
        close(s);
        mock dead = {.pid = 0};
        snprintf(dead.url, sizeof dead.url, "http://127.0.0.1:%d", ntohs(a.sin_port));
        td_lg_params q = base_params(&dead, 5, 8, 4);
        td_lg_workload w;
        td_err err;
        td_lg_run r;
        CHECK(td_lg_workload_build(&q, "x", &w, &err) == TD_OK, "L: workload");
        CHECK(td_lg_run_workload(&q, &w, &r, &err) == TD_OK, "L: run returns");
        CHECK(r.n == 5 && all_errors_contain(&r, "connecting"), "L: refused connections counted");
        td_lg_run_free(&r);
        td_lg_workload_free(&w);
    }

    // M: the command itself: model from /v1/models, goodput, percentiles, the JSON file.
    {
        mkdir(".cache", 0755);
        const char *path = ".cache/loadgen_e2e_result.json";
        remove(path);
        cJSON_Delete(mock_call(&mk, "POST", "/mock/reset"));
        char *argv[] = {"serve", "--base-url", mk.url, "--num-prompts", "10", "--random-input-len", "12", "--num-warmups", "2",
                        "--random-output-len", "5", "--ignore-eos", "--max-concurrency", "5",
                        "--goodput", "ttft:5000", "tpot:1000", "--metric-percentiles", "50,99",
                        "--save-result", "--result-filename", (char *)path, NULL};
        int rc = td_lg_bench_main((int)(sizeof argv / sizeof *argv) - 1, argv);
        CHECK(rc == 0, "M: exit status %d", rc);
        cJSON *ms = mock_call(&mk, "GET", "/mock/stats");
        CHECK(stat_int(ms, "requests") == 12, "M: 2 warm-up + 10 requests, mock saw %d", stat_int(ms, "requests"));
        cJSON_Delete(ms);
        char *text = NULL;
        td_err err;
        cJSON *j = td_read_file(path, 0, &text, NULL, &err) == TD_OK ? cJSON_Parse(text) : NULL;
        free(text);
        CHECK(j != NULL, "M: result JSON written and parses");
        const char *keys[] = {"completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                              "output_throughput", "total_token_throughput", "request_goodput", "duration",
                              "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "std_ttft_ms", "p50_ttft_ms",
                              "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "std_tpot_ms",
                              "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "std_itl_ms",
                              "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "std_e2el_ms"};
        for (size_t k = 0; j && k < sizeof keys / sizeof *keys; k++)
            CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, keys[k])), "M: numeric key %s", keys[k]);
        const char *arrays[] = {"input_lens", "output_lens", "ttfts", "itls", "errors"};
        for (size_t k = 0; j && k < sizeof arrays / sizeof *arrays; k++)
            CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, arrays[k])) == 10, "M: array %s of 10", arrays[k]);
        if (j) {
            CHECK(cJSON_GetObjectItem(j, "completed")->valueint == 10, "M: completed");
            CHECK(cJSON_GetObjectItem(j, "total_output_tokens")->valueint == 50, "M: output tokens");
            CHECK(cJSON_GetObjectItem(j, "total_input_tokens")->valueint == 120, "M: input tokens");
            CHECK(!strcmp(cJSON_GetObjectItem(j, "model_id")->valuestring, "mock-model"), "M: model from /v1/models");
            CHECK_NEAR(cJSON_GetObjectItem(j, "request_goodput")->valuedouble,
                       cJSON_GetObjectItem(j, "request_throughput")->valuedouble, 1e-9, "M: all requests meet loose SLOs");
            CHECK(cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "itls"), 0)) == 4, "M: 4 gaps");
        }
        cJSON_Delete(j);

        char *argv2[] = {"serve", "--base-url", mk.url, "--num-prompts", "4", "--random-output-len", "3",
                         "--goodput", "ttft:1", "--json", NULL};
        CHECK(td_lg_bench_main((int)(sizeof argv2 / sizeof *argv2) - 1, argv2) == 0, "M: strict SLO run");
        char *bad1[] = {"serve", "--no-such-option", NULL};
        CHECK(td_lg_bench_main(2, bad1) == 2, "M: unknown option is a usage error");
        char *bad2[] = {"serve", "--goodput", "latency:5", NULL};
        CHECK(td_lg_bench_main(3, bad2) == 2, "M: bad goodput key is a usage error");
        char *bad3[] = {"serve", "--base-url", "ftp://x", NULL};
        CHECK(td_lg_bench_main(3, bad3) == 2, "M: a scheme other than http(s) is refused");
        char *bad4[] = {"serve", "--base-url", mk.url, "--header", "no colon", NULL};
        CHECK(td_lg_bench_main(5, bad4) == 2, "M: a malformed --header is a usage error");
    }

    // N: strict goodput through the library: a 1 ms TTFT SLO is never met.
    {
        td_lg_params p = base_params(&mk, 4, 8, 3);
        td_lg_slo slo = {1.0, -1, -1};
        outcome o = run_case(&mk, &p, "mock-model", &slo);
        CHECK(o.ok && o.m.completed == 4 && o.m.has_goodput && o.m.request_goodput == 0.0, "N: goodput 0 (%g)",
              o.m.request_goodput);
        outcome_free(&o);
    }
    mock_stop(&mk);

    // O: hundreds of concurrent streams from one thread.
    {
        mock big = {0};
        if (!mock_start(&big, 1000, 20, 5, NULL)) {
            CHECK(0, "cannot start the second mock");
        } else {
            td_lg_params p = base_params(&big, 300, 8, 4);
            p.ignore_eos = 1;
            outcome o = run_case(&big, &p, "mock-model", NULL);
            CHECK(o.ok && o.m.completed == 300 && o.m.total_output == 1200, "O: completed %d output %lld (%s)",
                  o.m.completed, o.m.total_output, o.ok && o.m.failed ? o.run.res[0].error : "");
            CHECK(o.ok && o.run.max_in_flight == 300, "O: client in flight %d", o.run.max_in_flight);
            CHECK(o.ok && stat_int(o.stats, "max_concurrent") >= 150, "O: mock saw %d concurrent streams",
                  stat_int(o.stats, "max_concurrent"));
            printf("O: 300 streams in %.3f s, mean TTFT %.1f ms (mock 1000)\n", o.m.duration, o.m.ttft.mean);
            outcome_free(&o);
            mock_stop(&big);
        }
    }

    // S: https with a certificate made here (openssl CLI), trusted through --cacert; the extra
    // headers and the API key reach the server; without the certificate every request fails.
    {
        char dir[] = "/tmp/tandem_lg_tls_XXXXXX", cmd[1024];
        CHECK(mkdtemp(dir) != NULL, "S: temporary directory");
        snprintf(cmd, sizeof cmd,
                 "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=localhost "
                 "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout %s/key.pem -out %s/cert.pem 2>/dev/null",
                 dir, dir);
        int made = system(cmd) == 0;
        CHECK(made, "S: openssl made a certificate (scripts/setup.sh installs openssl)");
        mock tls = {0};
        if (made && !mock_start(&tls, 50, 10, 4, dir)) CHECK(0, "cannot start the https mock");
        if (made && tls.pid > 0) {
            cJSON_Delete(mock_call(&tls, "POST", "/mock/reset"));
            char *argv[] = {"serve", "--base-url", tls.url, "--cacert", tls.cacert, "--num-prompts", "4",
                            "--random-input-len", "8", "--random-output-len", "3", "--ignore-eos",
                            "--header", "X-Bench-Run: s-42", "--header", "x-info=0.3.3", "--api-key", "sk-tls", NULL};
            int rc = td_lg_bench_main((int)(sizeof argv / sizeof *argv) - 1, argv);
            CHECK(rc == 0, "S: bench over https exits %d", rc);
            cJSON *ms = mock_call(&tls, "GET", "/mock/stats");
            const cJSON *h = ms ? cJSON_GetObjectItem(ms, "last_headers") : NULL;
            const cJSON *auth = cJSON_GetObjectItem(h, "authorization"), *xb = cJSON_GetObjectItem(h, "x-bench-run");
            const cJSON *xi = cJSON_GetObjectItem(h, "x-info");
            CHECK(stat_int(ms, "requests") == 4, "S: the https mock saw %d requests", stat_int(ms, "requests"));
            CHECK(cJSON_IsString(auth) && !strcmp(auth->valuestring, "Bearer sk-tls"), "S: Authorization reached the server");
            CHECK(cJSON_IsString(xb) && !strcmp(xb->valuestring, "s-42") && cJSON_IsString(xi) &&
                      !strcmp(xi->valuestring, "0.3.3"),
                  "S: --header lines reached the server");
            cJSON_Delete(ms);

            td_lg_params p = base_params(&tls, 3, 8, 2);
            p.ignore_eos = 1;
            p.max_concurrency = 1;  // one after another: one kept-alive TLS connection
            p.cacert = tls.cacert;
            outcome o = run_case(&tls, &p, "mock-model", NULL);
            CHECK(o.ok && o.m.completed == 3 && o.m.total_output == 6 && o.run.connections_opened == 1,
                  "S: library run over https: completed %d output %lld connections %d", o.m.completed,
                  o.m.total_output, o.run.connections_opened);
            outcome_free(&o);
            p.cacert = NULL;  // the system store does not know this certificate
            td_lg_workload w;
            td_err err;
            td_lg_run r;
            CHECK(td_lg_workload_build(&p, "mock-model", &w, &err) == TD_OK, "S: workload");
            CHECK(td_lg_run_workload(&p, &w, &r, &err) == TD_OK, "S: run returns");
            CHECK(r.n == 3 && all_errors_contain(&r, "certificate"), "S: an untrusted certificate fails every request");
            td_lg_run_free(&r);
            td_lg_workload_free(&w);
            p.insecure = 1;
            o = run_case(&tls, &p, "mock-model", NULL);
            CHECK(o.ok && o.m.completed == 3, "S: --insecure accepts it: completed %d", o.m.completed);
            outcome_free(&o);
            mock_stop(&tls);
        }
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0, "S: clean up");
    }
    TEST_DONE();
}
