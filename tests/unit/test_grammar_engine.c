// The engine enforces td_gen_request.grammar: on the random-weight qwen2 reference model (byte-level
// BPE), which emits valid JSON only if the mask works, every choice of a JSON-schema request is a
// full match of its grammar, parses (cJSON) and finishes with STOP once nothing but EOS can follow,
// in greedy and sampled modes with processed logprobs; an unconstrained greedy request batched with
// constrained ones gives the same tokens as alone; a bad grammar fails submit with a message.
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <math.h>
#include <cjson/cJSON.h>
#include "engine/engine.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#define MAXN 4
#define MAXT 512

typedef struct res {
    bool done;
    td_status st;
    char msg[256];
    int ntok[MAXN];
    int32_t tok[MAXN][MAXT];
    float lp[MAXN][MAXT];
    char text[MAXN][8192];
    size_t tlen[MAXN];
    td_finish_reason fin[MAXN];
} res;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;

static void s_token(void *ctx, const td_gen_token *t) {
    res *r = ctx;
    if (t->prompt || t->index < 0 || t->index >= MAXN) return;
    int j = t->index;
    if (r->ntok[j] < MAXT) r->tok[j][r->ntok[j]] = t->token, r->lp[j][r->ntok[j]] = t->logprob, r->ntok[j]++;
    if (r->tlen[j] + t->text_len < sizeof r->text[j]) memcpy(r->text[j] + r->tlen[j], t->text, t->text_len), r->tlen[j] += t->text_len;
}
static void s_finish(void *ctx, int j, td_finish_reason why, const char *tail, size_t len) {
    res *r = ctx;
    r->fin[j] = why;
    if (r->tlen[j] + len < sizeof r->text[j]) memcpy(r->text[j] + r->tlen[j], tail, len), r->tlen[j] += len;
}
static void s_done(void *ctx, const td_gen_usage *u, td_status st, const char *msg) {
    (void)u;
    res *r = ctx;
    pthread_mutex_lock(&g_mu);
    r->st = st;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->done = true;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static td_gen_request greq(const int32_t *prompt, int n) {
    td_gen_request g;
    memset(&g, 0, sizeof g);
    g.prompt = prompt, g.n_prompt = n, g.n = 1, g.max_tokens = 400;
    g.top_p = 1, g.repetition_penalty = 1, g.logprobs = -1, g.prompt_logprobs = -1;
    return g;
}

static bool submit(td_eng *e, const td_gen_request *g, res *r, td_err *err) {
    td_gen_sink s = {r, s_token, s_finish, s_done};
    td_engine_handle h;
    return td_eng_submit(e, g, &s, &h, err) == TD_OK;
}

static void wait_done(res *r) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 120;
    pthread_mutex_lock(&g_mu);
    while (!r->done)
        if (pthread_cond_timedwait(&g_cv, &g_mu, &ts) != 0) break;
    pthread_mutex_unlock(&g_mu);
    CHECK(r->done, "request finished within 120 s");
}

static const char *SCHEMA =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},\"n\":{\"type\":\"integer\"},"
    "\"tag\":{\"enum\":[\"a\",\"b\",null]},\"xs\":{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"maxItems\":3}},"
    "\"required\":[\"name\",\"n\",\"tag\"],\"additionalProperties\":false}";

static void check_output(td_grammar *g, const td_gvocab *v, const res *r, int j, const char *what) {
    td_gmatch *m = td_gmatch_create(g, v, NULL);
    bool ok = td_gmatch_accept_bytes(m, r->text[j], r->tlen[j]) && td_gmatch_complete(m);
    CHECK(ok, "%s choice %d: output is not a full match: %.*s", what, j, (int)r->tlen[j], r->text[j]);
    cJSON *p = cJSON_ParseWithLength(r->text[j], r->tlen[j]);
    CHECK(p && cJSON_IsObject(p) && cJSON_GetObjectItem(p, "name") && cJSON_GetObjectItem(p, "tag"),
          "%s choice %d: does not parse as the object: %.*s", what, j, (int)r->tlen[j], r->text[j]);
    cJSON_Delete(p);
    CHECK(r->fin[j] == TD_FINISH_STOP, "%s choice %d: finish %d", what, j, r->fin[j]);
    td_gmatch_free(m);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/ref/qwen2", td_test_data_dir());
    td_model *mo = NULL;
    td_tokenizer *tok = NULL;
    td_err err = {0};
    if (td_model_load(path, &mo, &err) != TD_OK || td_tokenizer_load(path, &tok, &err) != TD_OK) {
        CHECK(0, "%s (run /usr/bin/python3 tests/reference/make_models.py): %s", path, err.msg);
        td_model_free(mo);
        TEST_DONE();
    }
    td_eng_params p = td_eng_default_params();
    p.max_seqs = 8, p.max_batched_tokens = 64, p.kv_blocks = 256, p.n_threads = 2, p.debug_checks = true;
    td_eng *e = NULL;
    CHECK(td_eng_create(mo, tok, &p, &e, &err) == TD_OK, "engine: %s", err.msg);
    cJSON *sj = cJSON_Parse(SCHEMA);
    char *gb = td_gbnf_from_json_schema(sj, "", &err);
    cJSON_Delete(sj);
    td_grammar *g = td_grammar_compile(gb, strlen(gb), &err);
    int32_t eos = td_tokenizer_eos_id(tok);
    td_gvocab *v = td_gvocab_from_tokenizer(tok, 0, &eos, 1, &err);
    td_tokens pr = {0};
    td_tokenizer_encode(tok, "Give me JSON:", 13, false, &pr, &err);

    // alone: the unconstrained greedy reference
    td_gen_request ref = greq(pr.ids, (int)pr.n);
    ref.max_tokens = 40, ref.ignore_eos = true;
    res *solo = calloc(1, sizeof *solo);
    CHECK(submit(e, &ref, solo, &err), "%s", err.msg);
    wait_done(solo);

    // constrained (greedy n=1; sampled n=3 with processed logprobs) batched with the same unconstrained one
    td_gen_request cg = greq(pr.ids, (int)pr.n);
    cg.grammar = gb;
    td_gen_request cs = cg;
    cs.n = 3, cs.temperature = 1.0f, cs.has_seed = true, cs.seed = 7, cs.logprobs = 2, cs.logprobs_processed = true;
    res *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b), *u = calloc(1, sizeof *u);
    CHECK(submit(e, &cg, a, &err), "%s", err.msg);
    CHECK(submit(e, &cs, b, &err), "%s", err.msg);
    CHECK(submit(e, &ref, u, &err), "%s", err.msg);
    wait_done(a), wait_done(b), wait_done(u);
    CHECK(a->st == TD_OK && b->st == TD_OK, "status %s / %s", a->msg, b->msg);
    check_output(g, v, a, 0, "greedy");
    for (int j = 0; j < 3; j++) {
        check_output(g, v, b, j, "sampled");
        for (int k = 0; k < b->ntok[j]; k++) CHECK(isfinite(b->lp[j][k]) && b->lp[j][k] <= 0, "processed logprob");
    }
    bool same = u->ntok[0] == solo->ntok[0] && !memcmp(u->tok[0], solo->tok[0], (size_t)u->ntok[0] * 4);
    CHECK(same, "unconstrained tokens batched with constrained ones == alone (%d vs %d tokens)", u->ntok[0], solo->ntok[0]);
    printf("greedy: %.*s\nsampled: %.*s\n", (int)a->tlen[0], a->text[0], (int)b->tlen[1], b->text[1]);

    // a bad grammar fails submit with its message; the engine keeps serving
    td_gen_request bad = greq(pr.ids, (int)pr.n);
    bad.grammar = "root ::= undefined_rule\n";
    res *x = calloc(1, sizeof *x);
    td_err berr = {0};
    CHECK(!submit(e, &bad, x, &berr) && berr.status == TD_ERR_INVALID && strstr(berr.msg, "undefined rule"),
          "bad grammar: %s", berr.msg);
    // a regex constraint
    char *rg = td_gbnf_from_regex("[a-z]{3}-\\d{2}", "", &err);
    td_gen_request rq = greq(pr.ids, (int)pr.n);
    rq.grammar = rg, rq.temperature = 1.0f;
    res *y = calloc(1, sizeof *y);
    CHECK(submit(e, &rq, y, &err), "%s", err.msg);
    wait_done(y);
    bool rok = y->tlen[0] == 6 && y->text[0][3] == '-' && y->text[0][4] >= '0' && y->text[0][4] <= '9' &&
               y->text[0][0] >= 'a' && y->text[0][0] <= 'z' && y->fin[0] == TD_FINISH_STOP;
    CHECK(rok, "regex output %.*s (finish %d)", (int)y->tlen[0], y->text[0], y->fin[0]);
    free(rg);
    td_eng_free(e);
    free(solo), free(a), free(b), free(u), free(x), free(y);
    td_tokens_free(&pr);
    td_gvocab_free(v);
    td_grammar_unref(g);
    free(gb);
    td_tokenizer_free(tok);
    td_model_free(mo);
    TEST_DONE();
}
