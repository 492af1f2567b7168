// The shared option parser (base/opts.h) on its own: every kind, `--x=v` and `--x v`, short and
// multi-letter short names, errors, `--`; then every command of the real binary ($TANDEM_BIN):
// each option in its --help-options table appears in its --help, and `--x=BAD` fails exactly as
// `--x BAD` for every numeric option; then `tandem serve` with vLLM's and llama-server's names
// (--seed, --max-logprobs, inline --chat-template, --gpu-memory-utilization, -m/-c/-np/-t).
// Needs the binary and the llama2 reference model (.cache/ref); fails without them.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/opts.h"
#include "run_cmd.h"
#include "serve_proc.h"
#include "test_util.h"

// ---- the parser

typedef struct {
    int n_rep;
    const char *rep[8];
} rep_ctx;

static bool take_rep(void *ctx, const td_opt *opt, const char *v) {
    (void)opt;
    rep_ctx *c = ctx;
    if (!strcmp(v, "bad")) return false;
    c->rep[c->n_rep++] = v;
    return true;
}

typedef struct {
    bool flag, on, seen_i;
    int i32;
    long long i64;
    float f32;
    double f64;
    const char *s;
    size_t bytes;
    int choice;
    rep_ctx rep;
} vals;

// Parses the words of `line` (split on spaces) into v; returns td_opts_parse's result and the
// positionals in pos[].
static int parse_line(const char *line, vals *v, int *n_pos, char pos[][32]) {
    memset(v, 0, sizeof *v);
    v->on = true;
    v->choice = -1;
    const td_opt opts[] = {
        {TD_OPT_B("flag", &v->flag, "a flag"), .aliases = "flag-alias"},
        {TD_OPT_NB("no-on", &v->on, "turns on off")},
        {TD_OPT_I("i32", &v->i32, -5, 100, "N", "an int"), .shorts = "i np", .seen = &v->seen_i},
        {TD_OPT_I("i64", &v->i64, 0, 9e18, "N", "a wide int")},
        {TD_OPT_F("f32", &v->f32, 0, 1, "F", "a float")},
        {TD_OPT_F("f64", &v->f64, -1e9, 1e9, "F", "a double"), .shorts = "d"},
        {TD_OPT_S("str", &v->s, "S", "a string")},
        {TD_OPT_BYTES_("bytes", &v->bytes, "B", "bytes")},
        {TD_OPT_C("choice", &v->choice, "red green blue", "C", "a choice")},
        {TD_OPT_CB("rep", take_rep, true, "R", "repeatable"), .multi = true},
    };
    const td_opts t = {.prog = "tandem test", .opts = opts, .n = (int)(sizeof opts / sizeof opts[0]),
                       .ctx = &v->rep, .max_pos = 3};
    static char buf[16][64];
    char *argv[17] = {"test"};
    int argc = 1;
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", line);
    for (char *save = NULL, *w = strtok_r(tmp, " ", &save); w && argc < 17; w = strtok_r(NULL, " ", &save)) {
        snprintf(buf[argc - 1], sizeof buf[0], "%s", w);
        argv[argc] = buf[argc - 1];
        argc++;
    }
    int r = td_opts_parse(&t, argc, argv, n_pos);
    for (int i = 0; r > 0 && i < *n_pos; i++) snprintf(pos[i], 32, "%s", argv[1 + i]);
    // rep values point into buf; copy them out of the way of the next call
    static char reps[8][64];
    for (int i = 0; i < v->rep.n_rep; i++) {
        snprintf(reps[i], sizeof reps[i], "%s", v->rep.rep[i]);
        v->rep.rep[i] = reps[i];
    }
    if (v->s) {
        static char sbuf[64];
        snprintf(sbuf, sizeof sbuf, "%s", v->s);
        v->s = sbuf;
    }
    return r;
}

static void test_parser(void) {
    vals v;
    int np = 0;
    char pos[4][32];
    // every kind, both forms
    CHECK(parse_line("--flag --no-on --i32 7 --i64=9000000000 --f32=0.5 --f64 -2.5 --str=a=b --bytes 2M "
                     "--choice=blue --rep x --rep=y",
                     &v, &np, pos) == 1, "full line");
    CHECK(v.flag && !v.on && v.i32 == 7 && v.seen_i && v.i64 == 9000000000LL && v.f32 == 0.5f && v.f64 == -2.5,
          "values: flag %d on %d i32 %d i64 %lld f32 %g f64 %g", v.flag, v.on, v.i32, v.i64, v.f32, v.f64);
    CHECK(v.s && !strcmp(v.s, "a=b"), "--str=a=b keeps the second '=': %s", v.s ? v.s : "(null)");
    CHECK(v.bytes == 2u << 20 && v.choice == 2, "bytes %zu choice %d", v.bytes, v.choice);
    CHECK(v.rep.n_rep == 2 && !strcmp(v.rep.rep[0], "x") && !strcmp(v.rep.rep[1], "y"), "repeated: %d", v.rep.n_rep);
    CHECK(np == 0, "no positionals: %d", np);
    // aliases, short and multi-letter short names, positionals around options, --
    CHECK(parse_line("A --flag-alias -np 3 B -d 4 -- --i32", &v, &np, pos) == 1, "short forms");
    CHECK(v.flag && v.i32 == 3 && v.f64 == 4, "alias/short values: %d %d %g", v.flag, v.i32, v.f64);
    CHECK(np == 3 && !strcmp(pos[0], "A") && !strcmp(pos[1], "B") && !strcmp(pos[2], "--i32"),
          "positionals in order, -- ends options: %d", np);
    CHECK(parse_line("-i 5", &v, &np, pos) == 1 && v.i32 == 5, "-i: %d", v.i32);
    CHECK(!v.seen_i || v.i32 == 5, "seen");
    CHECK(parse_line("--flag", &v, &np, pos) == 1 && !v.seen_i, "seen stays false when absent");
    // multi: vLLM's space-separated values stop at the next option
    CHECK(parse_line("--rep a b c --flag d", &v, &np, pos) == 1, "multi");
    CHECK(v.rep.n_rep == 3 && !strcmp(v.rep.rep[2], "c") && v.flag && np == 1 && !strcmp(pos[0], "d"),
          "multi values %d, positional %d", v.rep.n_rep, np);
    // errors
    const char *bad[] = {"--i32 101", "--i32=x", "--i32", "--i32=", "--f32 1.5", "--f32=nan", "--bytes 0",
                         "--bytes=3Q", "--choice=purple", "--flag=1", "--nope", "-q", "--rep bad",
                         "a b c d", "--i64 -1", "--i32 1e2"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK(parse_line(bad[i], &v, &np, pos) == -1, "'%s' must be refused", bad[i]);
    CHECK(parse_line("--i32 -5", &v, &np, pos) == 1 && v.i32 == -5, "a negative value after the option");
    CHECK(parse_line("x --help", &v, &np, pos) == 0, "--help returns 0");
    CHECK(parse_line("--help-options", &v, &np, pos) == 0, "--help-options returns 0");
}

// ---- every command of the binary

static const char *g_bin;

static char *run(const char *args, int *status, bool with_stderr) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' %s %s", g_bin, args, with_stderr ? "2>&1" : "2>/dev/null");
    return td_test_run(cmd, status);
}

// Whether `word` occurs in text followed by a character that cannot continue an option name.
static bool has_word(const char *text, const char *word) {
    size_t n = strlen(word);
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        char b = p == text ? ' ' : p[-1], a = p[n];
        bool ok_before = b == ' ' || b == '\n' || b == ',' || b == '(' || b == '[';
        bool ok_after = !(a == '-' || (a >= 'a' && a <= 'z') || (a >= '0' && a <= '9'));
        if (ok_before && ok_after) return true;
    }
    return false;
}

static void test_command(const char *cmd) {
    char args[256];
    int st;
    snprintf(args, sizeof args, "%s --help-options", cmd);
    char *js = run(args, &st, false);
    cJSON *tab = js ? cJSON_Parse(js) : NULL;
    CHECK(st == 0 && cJSON_IsArray(tab) && cJSON_GetArraySize(tab) > 0, "%s --help-options: exit %d, a JSON table", cmd, st);
    free(js);
    snprintf(args, sizeof args, "%s --help", cmd);
    char *help = run(args, &st, false);
    CHECK(st == 0 && help, "%s --help: exit %d", cmd, st);
    const cJSON *o;
    cJSON_ArrayForEach(o, tab) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(o, "name"));
        const char *lists[] = {"aliases", "shorts"};
        CHECK(name && help && has_word(help, name), "%s: %s missing from --help", cmd, name ? name : "?");
        for (int l = 0; l < 2; l++) {
            const cJSON *w;
            cJSON_ArrayForEach(w, cJSON_GetObjectItem(o, lists[l]))
                CHECK(help && has_word(help, w->valuestring), "%s: %s missing from --help", cmd, w->valuestring);
        }
        const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(o, "kind"));
        if (!name || !kind || (strcmp(kind, "int") && strcmp(kind, "float"))) continue;
        // the '=' form behaves as the space form: the same refusal, naming the option
        char a1[512], a2[512];
        snprintf(a1, sizeof a1, "%s %s=not-a-number", cmd, name);
        snprintf(a2, sizeof a2, "%s %s not-a-number", cmd, name);
        int s1, s2;
        char *e1 = run(a1, &s1, true), *e2 = run(a2, &s2, true);
        CHECK(s1 == 2 && s2 == 2, "%s %s: exit %d / %d, want 2", cmd, name, s1, s2);
        CHECK(e1 && e2 && !strcmp(e1, e2) && strstr(e1, name) && strstr(e1, "not-a-number"),
              "%s %s=V vs %s V: '%s' vs '%s'", cmd, name, name, e1 ? e1 : "", e2 ? e2 : "");
        free(e1);
        free(e2);
    }
    
    free(help);
    cJSON_Delete(tab);
}

// ---- tandem serve

static int http(int port, const char *method, const char *path, const char *body, char **out) {
    *out = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return close(fd), -1;
    struct timeval tv = {30, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[8192];
    int n = snprintf(req, sizeof req,
                     "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     method, path, body ? strlen(body) : 0, body ? body : "");
    if (write(fd, req, (size_t)n) != n) return close(fd), -1;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while (buf && (k = read(fd, buf + len, cap - 1 - len)) > 0) {
        len += (size_t)k;
        if (cap - 1 - len == 0) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) free(buf);
            buf = nb;
        }
    }
    close(fd);
    if (!buf) return -1;
    buf[len] = 0;
    int code = 0;
    sscanf(buf, "HTTP/1.%*d %d", &code);
    char *b = strstr(buf, "\r\n\r\n");
    *out = strdup(b ? b + 4 : "");
    free(buf);
    return code;
}

// The text of a completion of `prompt` at temperature 1 (seed < 0: none), or NULL.
static char *sample(int port, const char *extra) {
    char body[512], *out = NULL;
    snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 12, \"temperature\": 1%s}", extra);
    int code = http(port, "POST", "/v1/completions", body, &out);
    cJSON *j = code == 200 && out ? cJSON_Parse(out) : NULL;
    free(out);
    const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text"));
    char *r = t ? strdup(t) : NULL;
    cJSON_Delete(j);
    return r;
}

static bool streq(const char *a, const char *b) { return a && b && !strcmp(a, b); }

static const char *const BASE[] = {"--threads", "2", "--max-seqs", "4", "--max-batched-tokens", "64", NULL};

// Three unseeded samples and one seeded one from a server started with --seed seed.
static bool seeded_run(const char *model, const char *seed, char *texts[4]) {
    const char *extra[] = {"--seed", seed, "--max-logprobs", "2", NULL};
    server s;
    memset(texts, 0, 4 * sizeof *texts);
    if (!td_serve_start(g_bin, model, BASE, extra, &s)) return false;
    for (int i = 0; i < 3; i++) texts[i] = sample(s.port, "");
    texts[3] = sample(s.port, ", \"seed\": 5");
    char *out = NULL;
    int c3 = http(s.port, "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 1, \"logprobs\": 3}", &out);
    CHECK(c3 == 400 && out && strstr(out, "logprobs"), "--max-logprobs 2: logprobs 3 answered %d %s", c3, out ? out : "");
    free(out);
    int c2 = http(s.port, "POST", "/v1/completions", "{\"prompt\": \"a\", \"max_tokens\": 1, \"logprobs\": 2}", &out);
    CHECK(c2 == 200, "--max-logprobs 2: logprobs 2 answered %d %s", c2, out ? out : "");
    free(out);
    CHECK(td_serve_stop(&s) == 0, "serve --seed %s exits 0", seed);
    return true;
}

// prompt_tokens of a one-message chat on a server started with extra.
static int chat_prompt_tokens(const char *model, const char *const *extra) {
    server s;
    if (!td_serve_start(g_bin, model, BASE, extra, &s)) return -1;
    char *out = NULL;
    int code = http(s.port, "POST", "/v1/chat/completions",
                    "{\"messages\": [{\"role\": \"user\", \"content\": \"hello there\"}], \"max_tokens\": 1}", &out);
    cJSON *j = code == 200 && out ? cJSON_Parse(out) : NULL;
    int n = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "prompt_tokens"));
    if (!j) n = -1;
    cJSON_Delete(j);
    free(out);
    td_serve_stop(&s);
    return n;
}

static void test_serve(const char *model) {
    char *a[4], *b[4], *c[4];
    CHECK(seeded_run(model, "7", a), "serve --seed 7 starts");
    CHECK(seeded_run(model, "7", b), "serve --seed 7 starts again");
    CHECK(seeded_run(model, "8", c), "serve --seed 8 starts");
    for (int i = 0; i < 4; i++) CHECK(a[i] && b[i] && c[i], "sample %d answered", i);
    for (int i = 0; i < 3; i++) CHECK(streq(a[i], b[i]), "unseeded request %d: same --seed, same text: '%s' vs '%s'", i, a[i], b[i]);
    CHECK(!(streq(a[0], c[0]) && streq(a[1], c[1]) && streq(a[2], c[2])), "another --seed, other texts");
    CHECK(!(streq(a[0], a[1]) && streq(a[1], a[2])), "successive unseeded requests get different seeds");
    CHECK(streq(a[3], c[3]), "a request's own seed wins over --seed: '%s' vs '%s'", a[3], c[3]);
    for (int i = 0; i < 4; i++) free(a[i]), free(b[i]), free(c[i]);

    // inline --chat-template == the same template from a file, and differs from the model's own
    const char *tmpl = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }} and more words here{% endfor %}";
    char path[64];
    snprintf(path, sizeof path, "/tmp/tandem_tmpl_%d.jinja", (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, tmpl, strlen(tmpl)) == (ssize_t)strlen(tmpl), "template file");
    if (fd >= 0) close(fd);
    const char *ex_file[] = {"--chat-template", path, NULL};
    const char *ex_inline[] = {"--chat-template", tmpl, NULL};
    int n_own = chat_prompt_tokens(model, NULL);
    int n_file = chat_prompt_tokens(model, ex_file);
    int n_inline = chat_prompt_tokens(model, ex_inline);
    unlink(path);
    CHECK(n_own > 0 && n_file > 0 && n_inline == n_file && n_file != n_own,
          "chat prompt tokens: model's %d, file %d, inline %d", n_own, n_file, n_inline);

    // llama-server's names: -m MODEL -c N -np N -t N; --max-model-len from /v1/models
    server s;
    const char *ex_ll[] = {"-m", model, "-c", "96", "-np", "2", "-t", "1", "--alias=other", NULL};
    const char *base_none[] = {NULL};
    CHECK(td_serve_start(g_bin, "--log-prompts", base_none, ex_ll, &s), "serve -m -c -np -t starts");
    if (s.port > 0) {
        char *out = NULL;
        int code = http(s.port, "GET", "/v1/models", NULL, &out);
        cJSON *j = code == 200 && out ? cJSON_Parse(out) : NULL;
        const cJSON *d = cJSON_GetObjectItem(j, "data");
        CHECK(cJSON_GetArraySize(d) == 2, "/v1/models lists the model and --alias=other: %s", out ? out : "");
        CHECK(cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(d, 0), "max_model_len")) == 96,
              "-c 96: %s", out ? out : "");
        cJSON_Delete(j);
        free(out);
        CHECK(td_serve_stop(&s) == 0, "serve -m exits 0");
    }
    // --served-model-name in vLLM's space-separated form, --gpu-memory-utilization
    const char *ex_names[] = {"--gpu-memory-utilization=0.01", "--served-model-name", "n1", "n2", NULL};
    CHECK(td_serve_start(g_bin, model, BASE, ex_names, &s), "serve --served-model-name n1 n2 starts");
    if (s.port > 0) {
        char *out = NULL;
        int code = http(s.port, "GET", "/v1/models", NULL, &out);
        CHECK(code == 200 && out && strstr(out, "\"n1\"") && strstr(out, "\"n2\""), "both names listed: %s", out ? out : "");
        free(out);
        CHECK(td_serve_stop(&s) == 0, "serve exits 0");
    }
    // usage errors, before anything is loaded
    char args[2048];
    int st;
    const char *bad[] = {"--gpu-memory-utilization 0.5 --kv-cache-memory 1M", "--gpu-memory-utilization 0",
                         "--gpu-memory-utilization 1.5", "--max-logprobs 21", "-m x y", "--seed -1"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(args, sizeof args, "serve '%s' %s", model, bad[i]);
        char *e = run(args, &st, true);
        CHECK(st == 2 && e && strstr(e, "tandem serve:"), "serve %s: exit %d (want 2): %s", bad[i], st, e ? e : "");
        free(e);
    }
}

int main(void) {
    test_parser();
    g_bin = td_test_bin();
    if (!g_bin) TEST_DONE();
    const char *cmds[] = {"run", "serve", "train", "tokenize", "detokenize", "convert", "quantize", "export",
                          "weights push", "weights get", "tokenizer train", "data prepare", "bench pp", "bench tg",
                          "bench batched", "bench ceilings", "eval", "plot", "rl --config x", "rl data", "rl eval"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) test_command(cmds[i]);
    char model[1024];
    snprintf(model, sizeof model, "%s/ref/llama2", td_test_data_dir());
    if (td_test_need(model, "run /usr/bin/python3 tests/reference/make_models.py")) test_serve(model);
    TEST_DONE();
}
