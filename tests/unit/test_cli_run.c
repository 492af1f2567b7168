// `tandem run` end to end, as a user runs it, against the PyTorch oracle (tests/reference/
// make_models.py): greedy continuations and log-probabilities of every reference model file,
// prompt echo log-probabilities, text prompts through the model's own tokenizer, stopping at EOS,
// seeded sampling, and clear errors for bad input.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/file.h"
#include "kernel_choice.h"
#include "run_cmd.h"
#include "test_util.h"

static const char *g_bin, *g_ref;
// 1 when `tandem run` uses avx512-int8 (TANDEM_KERNELS, else auto): Q8_0/Q4_0/BF16 files are then
// compared with the activation-rounded oracle (models[].act, see test_oracle.c). Tolerances there:
// rows agree within 1e-4 unless an activation rounds the other way at a rounding boundary (f32
// noise); such a flip moves a log-prob by up to ~0.1 (measured 6.2e-3 on the greedy prompt,
// 0.08 on the 33-token prompt), hence TOL_FLIP, and at least half of the echo rows must agree.
static int g_rounds;
#define TOL_FLIP 0.3

// The oracle record (greedy, logprobs) matching the kernel semantics in force for this model.
static const cJSON *oracle_for(const cJSON *model) {
    const cJSON *act = cJSON_GetObjectItem(model, "act");
    return g_rounds && act ? act : model;
}

static void ids_str(const cJSON *arr, char *out, size_t cap) {
    size_t n = 0;
    const cJSON *x;
    out[0] = 0;
    cJSON_ArrayForEach(x, arr) n += (size_t)snprintf(out + n, cap - n, "%s%d", n ? "," : "", x->valueint);
}

static float *read_f32(const char *rel, size_t *count) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_ref, rel);
    char *buf;
    size_t len;
    if (td_read_file(path, 0, &buf, &len, NULL) != TD_OK) return NULL;
    *count = len / 4;
    return (float *)buf;
}

static cJSON *run_json(const char *args, int *status) {
    char cmd[20000];
    snprintf(cmd, sizeof cmd, "%s run %s --json 2>/dev/null", g_bin, args);
    char *out = td_test_run(cmd, status);
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    free(out);
    return j;
}

// Greedy continuation and per-token log-probabilities (with top-5) against the oracle.
static void check_greedy(const cJSON *model, const char *prompt_ids) {
    const char *name = cJSON_GetObjectItem(model, "name")->valuestring;
    const char *path = cJSON_GetObjectItem(model, "path")->valuestring;
    const int act = oracle_for(model) != model;
    const double tol = act ? TOL_FLIP : 1e-4;
    const cJSON *g = cJSON_GetObjectItem(oracle_for(model), "greedy");
    const cJSON *want = cJSON_GetObjectItem(g, "tokens");
    int n = cJSON_GetArraySize(want);
    char args[16384];
    snprintf(args, sizeof args, "%s/%s --prompt-ids %s -n %d --temperature 0 --ignore-eos --logprobs 5", g_ref,
             path, prompt_ids, n);
    int st;
    cJSON *j = run_json(args, &st);
    CHECK(st == 0 && j, "%s: tandem run exited %d", name, st);
    if (!j) return;
    const cJSON *toks = cJSON_GetObjectItem(j, "tokens");
    CHECK(cJSON_GetArraySize(toks) == n, "%s: %d tokens, want %d", name, cJSON_GetArraySize(toks), n);
    double maxd = 0;
    for (int i = 0; i < n && i < cJSON_GetArraySize(toks); i++) {
        const cJSON *t = cJSON_GetArrayItem(toks, i);
        int id = cJSON_GetObjectItem(t, "id")->valueint;
        CHECK(id == cJSON_GetArrayItem(want, i)->valueint, "%s: token %d is %d, oracle %d", name, i, id,
              cJSON_GetArrayItem(want, i)->valueint);
        double lp = cJSON_GetObjectItem(t, "logprob")->valuedouble;
        double wl = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "token_logprobs"), i)->valuedouble;
        if (fabs(lp - wl) > maxd) maxd = fabs(lp - wl);
        const cJSON *top = cJSON_GetObjectItem(t, "top");
        const cJSON *wtop = cJSON_GetArrayItem(cJSON_GetObjectItem(g, "top5"), i);
        CHECK(cJSON_GetArraySize(top) == 5, "%s: top has %d entries", name, cJSON_GetArraySize(top));
        for (int k = 0; k < 5 && k < cJSON_GetArraySize(top); k++) {
            const cJSON *e = cJSON_GetArrayItem(top, k), *w = cJSON_GetArrayItem(wtop, k);
            double a = cJSON_GetObjectItem(e, "logprob")->valuedouble, b = cJSON_GetArrayItem(w, 1)->valuedouble;
            CHECK_NEAR(a, b, tol, "top-5 logprob");
            // Ids must agree unless two alternatives are closer than the tolerance.
            // (The 6th is unknown: with a rounding flip the 5th may trade places with it.)
            double next = k + 1 < 5 ? cJSON_GetArrayItem(cJSON_GetArrayItem(wtop, k + 1), 1)->valuedouble
                                    : act ? b : -1e9;
            if (b - next > 2 * tol)
                CHECK(cJSON_GetObjectItem(e, "id")->valueint == cJSON_GetArrayItem(w, 0)->valueint,
                      "%s: token %d top-%d id", name, i, k);
        }
    }
    CHECK(maxd <= tol, "%s: greedy token logprobs differ from the oracle by %g", name, maxd);
    printf("%-22s greedy %d tokens ok, max |logprob diff| %.2e%s\n", name, n, maxd, act ? " (rounded oracle)" : "");
    cJSON_Delete(j);
}

// --echo: every prompt position's log-probability and top-5 against the oracle's log-softmax rows.
static void check_echo(const cJSON *model, const cJSON *prompts) {
    const char *name = cJSON_GetObjectItem(model, "name")->valuestring;
    const char *path = cJSON_GetObjectItem(model, "path")->valuestring;
    const int act = oracle_for(model) != model;
    const double tol = act ? TOL_FLIP : 1e-4;
    const cJSON *lpf = cJSON_GetObjectItem(cJSON_GetObjectItem(oracle_for(model), "logprobs"), "len33");
    CHECK(lpf != NULL, "%s: the oracle has no len33 log-probabilities", name);
    if (!lpf) return;
    size_t cnt;
    float *rows = read_f32(lpf->valuestring, &cnt);
    CHECK(rows != NULL, "%s: oracle file %s", name, lpf->valuestring);
    if (!rows) return;
    const cJSON *prompt = cJSON_GetObjectItem(prompts, "len33");
    int n = cJSON_GetArraySize(prompt), V = (int)(cnt / (size_t)n);
    char ids[4096], args[16384];
    ids_str(prompt, ids, sizeof ids);
    // --batch 8 makes the prompt cross several chunks.
    snprintf(args, sizeof args, "%s/%s --prompt-ids %s -n 1 --temperature 0 --echo --logprobs 3 --batch 8", g_ref,
             path, ids);
    int st;
    cJSON *j = run_json(args, &st);
    CHECK(st == 0 && j, "%s: echo run exited %d", name, st);
    if (j) {
        const cJSON *pl = cJSON_GetObjectItem(j, "prompt_logprobs");
        CHECK(cJSON_GetArraySize(pl) == n - 1, "%s: %d prompt logprobs, want %d", name, cJSON_GetArraySize(pl), n - 1);
        double maxd = 0;
        int agree = 0;
        for (int i = 0; i + 1 < n && i < cJSON_GetArraySize(pl); i++) {
            const cJSON *e = cJSON_GetArrayItem(pl, i);
            int tok = cJSON_GetArrayItem(prompt, i + 1)->valueint;
            CHECK(cJSON_GetObjectItem(e, "id")->valueint == tok, "%s: echo id", name);
            double d = fabs(cJSON_GetObjectItem(e, "logprob")->valuedouble - rows[(size_t)i * V + tok]);
            if (d > maxd) maxd = d;
            agree += d <= 1e-4;
            const cJSON *best = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "top"), 0);
            float m = -1e30f;
            for (int v = 0; v < V; v++) m = rows[(size_t)i * V + v] > m ? rows[(size_t)i * V + v] : m;
            CHECK_NEAR(cJSON_GetObjectItem(best, "logprob")->valuedouble, m, tol, "echo top-1 logprob");
        }
        CHECK(maxd <= tol, "%s: echo logprobs differ by %g", name, maxd);
        CHECK(2 * agree >= n - 1, "%s: only %d of %d echo logprobs within 1e-4", name, agree, n - 1);
        printf("%-22s echo max |logprob diff| %.2e, %d/%d within 1e-4%s\n", name, maxd, agree, n - 1,
               act ? " (rounded oracle)" : "");
        cJSON_Delete(j);
    }
    free(rows);
}

int main(void) {
    g_bin = getenv("TANDEM_BIN");
    if (!g_bin) g_bin = "build/tandem";
    static char ref[1024];
    snprintf(ref, sizeof ref, "%s/ref", td_test_data_dir());
    g_ref = ref;
    g_rounds = tk_rounds_activations();
    printf("kernel set %s\n", td_kernels_get(NULL) ? td_kernels_get(NULL)->name : "(none)");
    char path[1100];
    snprintf(path, sizeof path, "%s/oracle.json", g_ref);
    char *text;
    td_err err;
    if (td_read_file(path, 0, &text, NULL, &err) != TD_OK) {
        fprintf(stderr, "missing oracle (run tests/reference/make_models.py): %s\n", err.msg);
        return 1;
    }
    cJSON *o = cJSON_Parse(text);
    free(text);
    const cJSON *models = cJSON_GetObjectItem(o, "models"), *prompts = cJSON_GetObjectItem(o, "prompts");
    char gp[4096];
    ids_str(cJSON_GetObjectItem(o, "greedy_prompt"), gp, sizeof gp);
    const cJSON *m;
    int n_models = 0;
    cJSON_ArrayForEach(m, models) {
        check_greedy(m, gp);
        n_models++;
    }
    CHECK(n_models >= 25, "only %d models in the oracle", n_models);
    cJSON_ArrayForEach(m, models) {
        const char *dt = cJSON_GetObjectItem(m, "dtype")->valuestring;
        if (!strcmp(dt, "F32") || !strcmp(dt, "Q4_0")) check_echo(m, prompts);
    }

    // Text prompts go through each format's own tokenizer (tokenizer.json, GGUF metadata) and
    // give the oracle's prompt ids (BOS added).
    const char *ptext = cJSON_GetObjectItem(o, "greedy_prompt_text")->valuestring;
    const char *paths[] = {"llama2", "llama2-q8_0.gguf", "qwen3", "qwen3-bf16.gguf"};
    for (int i = 0; i < 4; i++) {
        char args[8192];
        snprintf(args, sizeof args, "%s/%s --prompt '%s' -n 4 --temperature 0 --ignore-eos", g_ref, paths[i], ptext);
        int st;
        cJSON *j = run_json(args, &st);
        CHECK(st == 0 && j, "%s: text prompt run exited %d", paths[i], st);
        if (!j) continue;
        char got[4096];
        ids_str(cJSON_GetObjectItem(j, "prompt_ids"), got, sizeof got);
        CHECK(!strcmp(got, gp), "%s: prompt ids %s, oracle %s", paths[i], got, gp);
        cJSON_Delete(j);
    }

    // Stops at EOS: a copy of llama2 whose generation_config names the oracle's 6th greedy token as
    // an end-of-sequence token must stop there, with the token counted but not in the text.
    const cJSON *g0 = cJSON_GetObjectItem(cJSON_GetArrayItem(models, 0), "greedy");
    int stop_tok = cJSON_GetArrayItem(cJSON_GetObjectItem(g0, "tokens"), 5)->valueint;
    int first5_has_stop = 0;
    for (int i = 0; i < 5; i++) first5_has_stop |= cJSON_GetArrayItem(cJSON_GetObjectItem(g0, "tokens"), i)->valueint == stop_tok;
    if (!first5_has_stop) {
        char dir[1200], cmd[8192];
        snprintf(dir, sizeof dir, "%s/eos-test", td_test_data_dir());
        snprintf(cmd, sizeof cmd,
                 "rm -rf %s && mkdir -p %s && cd %s && for f in %s/llama2/*; do ln -s \"$f\" .; done && "
                 "rm generation_config.json && printf '{\"eos_token_id\": [%d]}' > generation_config.json",
                 dir, dir, dir, g_ref[0] == '/' ? g_ref : "$OLDPWD/.cache/ref", stop_tok);
        int st = system(cmd);
        CHECK(st == 0, "making the EOS test model");
        char args[16384];
        snprintf(args, sizeof args, "%s --prompt-ids %s -n 16 --temperature 0", dir, gp);
        cJSON *j = run_json(args, &st);
        CHECK(st == 0 && j, "eos run exited %d", st);
        if (j) {
            CHECK(!strcmp(cJSON_GetObjectItem(j, "finish_reason")->valuestring, "stop"), "finish_reason %s",
                  cJSON_GetObjectItem(j, "finish_reason")->valuestring);
            CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")) == 6, "stopped after %d tokens",
                  cJSON_GetArraySize(cJSON_GetObjectItem(j, "tokens")));
            cJSON_Delete(j);
        }
    }

    // Seeded sampling: same seed, same output; the text mode streams the same text as --json.
    char args[16384];
    snprintf(args, sizeof args, "%s/llama3-q8_0.gguf --prompt-ids %s -n 24 --temperature 0.9 --top-p 0.95 --top-k 50 --min-p 0.01 --seed 7 --ignore-eos",
             g_ref, gp);
    int s1, s2, s3;
    cJSON *a = run_json(args, &s1), *b = run_json(args, &s2);
    CHECK(s1 == 0 && s2 == 0 && a && b, "seeded runs");
    if (a && b) {
        char *x = cJSON_PrintUnformatted(cJSON_GetObjectItem(a, "tokens"));
        char *y = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "tokens"));
        CHECK(!strcmp(x, y), "same seed, different tokens");
        free(x), free(y);
        char cmd[20000];
        snprintf(cmd, sizeof cmd, "%s run %s 2>/dev/null", g_bin, args);
        char *plain = td_test_run(cmd, &s3);
        const char *jt = cJSON_GetObjectItem(a, "text")->valuestring;
        CHECK(s3 == 0 && plain && !strncmp(plain, jt, strlen(jt)) && plain[strlen(jt)] == '\n',
              "streamed text differs from --json text");
        free(plain);
    }
    cJSON_Delete(a), cJSON_Delete(b);

    // Bad input: clear errors, right exit codes.
    struct {
        const char *args;
        int status;
        const char *needle;
    } bad[] = {
        {"/nonexistent/model --prompt-ids 1", 1, "/nonexistent/model"},
        {"%s/llama2 --prompt-ids 1,999999", 1, "outside the vocabulary"},
        {"%s/llama2 --prompt-ids 1,x", 1, "--prompt-ids"},
        {"%s/llama2 --prompt-ids 1 --temperature -1", 2, "--temperature"},
        {"%s/llama2 --prompt-ids 1 --bogus", 2, "unknown option"},
        {"%s/llama2", 2, "--prompt"},
        {"%s/llama2 --prompt-ids 1 --top-p 0", 2, "--top-p"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char a2[2048], cmd[8192];
        snprintf(a2, sizeof a2, bad[i].args, g_ref);
        snprintf(cmd, sizeof cmd, "%s run %s 2>&1 >/dev/null", g_bin, a2);
        int st;
        char *errout = td_test_run(cmd, &st);
        CHECK(st == bad[i].status, "'%s' exited %d, want %d", a2, st, bad[i].status);
        CHECK(errout && strstr(errout, bad[i].needle), "'%s' error '%s' lacks '%s'", a2, errout ? errout : "",
              bad[i].needle);
        free(errout);
    }
    cJSON_Delete(o);
    TEST_DONE();
}
