// OpenAI request parsing/validation (src/server/openai.c): a table of bad bodies, each with the HTTP
// status and the field the error must name, then the fields of good bodies, error JSON shape and SSE
// framing. The expectations come from the OpenAI API reference and vLLM's behaviour, not from the code.
#include <string.h>
#include "server/openai.h"
#include "test_util.h"

static int cleanup_log[4], n_cleanup;
static void note_cleanup(void *arg) { cleanup_log[n_cleanup++] = (int)(intptr_t)arg; }

typedef struct bad_case {
    td_api_kind kind;
    const char *body;
    int status;
    const char *param;  // NULL: none named
} bad_case;

#define C TD_API_COMPLETIONS
#define H TD_API_CHAT
static const bad_case bad[] = {
    {C, "", 400, NULL},
    {C, "{", 400, NULL},
    {C, "{\"prompt\": \"x\"} trailing", 400, NULL},
    {C, "[1,2]", 400, NULL},
    {C, "\"prompt\"", 400, NULL},
    {C, "null", 400, NULL},
    {C, "{}", 400, "prompt"},
    {C, "{\"prompt\": null}", 400, "prompt"},
    {C, "{\"prompt\": 5}", 400, "prompt"},
    {C, "{\"prompt\": []}", 400, "prompt"},
    {C, "{\"prompt\": [[]]}", 400, "prompt"},
    {C, "{\"prompt\": [\"a\", 1]}", 400, "prompt"},
    {C, "{\"prompt\": [1, \"a\"]}", 400, "prompt"},
    {C, "{\"prompt\": [[1], 2]}", 400, "prompt"},
    {C, "{\"prompt\": [1.5]}", 400, "prompt"},
    {C, "{\"prompt\": [-1]}", 400, "prompt"},
    {C, "{\"prompt\": [1000]}", 400, "prompt"},
    {C, "{\"prompt\": [1e300]}", 400, "prompt"},
    {C, "{\"prompt\": [{}]}", 400, "prompt"},
    {C, "{\"prompt\": \"x\", \"model\": 3}", 400, "model"},
    {C, "{\"prompt\": \"x\", \"model\": \"other\"}", 404, "model"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": \"5\"}", 400, "max_tokens"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": 0}", 400, "max_tokens"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": -3}", 400, "max_tokens"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": 2.5}", 400, "max_tokens"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": 5000}", 400, "max_tokens"},
    {C, "{\"prompt\": \"x\", \"max_tokens\": 1e400}", 400, "max_tokens"},
    {C, "{\"prompt\": \"x\", \"n\": 0}", 400, "n"},
    {C, "{\"prompt\": \"x\", \"n\": 17}", 400, "n"},
    {C, "{\"prompt\": \"x\", \"n\": true}", 400, "n"},
    {C, "{\"prompt\": \"x\", \"n\": 2, \"best_of\": 3}", 400, "best_of"},
    {C, "{\"prompt\": \"x\", \"temperature\": \"1\"}", 400, "temperature"},
    {C, "{\"prompt\": \"x\", \"temperature\": -0.1}", 400, "temperature"},
    {C, "{\"prompt\": \"x\", \"temperature\": 2.5}", 400, "temperature"},
    {C, "{\"prompt\": \"x\", \"top_p\": 0}", 400, "top_p"},
    {C, "{\"prompt\": \"x\", \"top_p\": 1.1}", 400, "top_p"},
    {C, "{\"prompt\": \"x\", \"top_k\": -2}", 400, "top_k"},
    {C, "{\"prompt\": \"x\", \"top_k\": 1.5}", 400, "top_k"},
    {C, "{\"prompt\": \"x\", \"min_p\": 1.5}", 400, "min_p"},
    {C, "{\"prompt\": \"x\", \"repetition_penalty\": 0}", 400, "repetition_penalty"},
    {C, "{\"prompt\": \"x\", \"presence_penalty\": 3}", 400, "presence_penalty"},
    {C, "{\"prompt\": \"x\", \"frequency_penalty\": -2.5}", 400, "frequency_penalty"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": []}", 400, "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"a\": 1}}", 400, "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", 400, "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"999\": 1}}", 400, "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"1\"}}", 400, "logit_bias"},
    {C, "{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 1}}", 400, "logit_bias"},
    {C, "{\"prompt\": \"x\", \"seed\": 1.5}", 400, "seed"},
    {C, "{\"prompt\": \"x\", \"seed\": \"7\"}", 400, "seed"},
    {C, "{\"prompt\": \"x\", \"seed\": 9223372036854775808}", 400, "seed"},
    {C, "{\"prompt\": \"x\", \"seed\": 1e300}", 400, "seed"},
    {C, "{\"prompt\": \"x\", \"seed\": -9223372036854777856}", 400, "seed"},
    {C, "{\"prompt\": \"x\", \"stop\": 1}", 400, "stop"},
    {C, "{\"prompt\": \"x\", \"stop\": [\"a\", 2]}", 400, "stop"},
    {C, "{\"prompt\": \"x\", \"stop\": [\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\",\"j\",\"k\",\"l\",\"m\",\"n\",\"o\",\"p\",\"q\"]}", 400, "stop"},
    {C, "{\"prompt\": \"x\", \"stop_token_ids\": 3}", 400, "stop_token_ids"},
    {C, "{\"prompt\": \"x\", \"stop_token_ids\": [3, 5000]}", 400, "stop_token_ids"},
    {C, "{\"prompt\": \"x\", \"ignore_eos\": 1}", 400, "ignore_eos"},
    {C, "{\"prompt\": \"x\", \"stream\": \"true\"}", 400, "stream"},
    {C, "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": true}}", 400, "stream_options"},
    {C, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": 1}", 400, "stream_options"},
    {C, "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": {\"include_usage\": 1}}", 400, "stream_options.include_usage"},
    {C, "{\"prompt\": \"x\", \"echo\": \"yes\"}", 400, "echo"},
    {C, "{\"prompt\": \"x\", \"logprobs\": true}", 400, "logprobs"},
    {C, "{\"prompt\": \"x\", \"logprobs\": 21}", 400, "logprobs"},
    {C, "{\"prompt\": \"x\", \"suffix\": \"y\"}", 400, "suffix"},
    {C, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"xml\"}}", 400, "response_format"},
    {C, "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\"}}", 400, "response_format"},
    {C, "{\"prompt\": \"x\", \"guided_json\": {\"type\": \"string\"}, \"grammar\": \"root ::= \\\"a\\\"\"}", 400, "grammar"},
    {C, "{\"prompt\": \"x\", \"guided_json\": {\"type\": \"string\", \"format\": \"date\"}}", 400, "guided_json"},
    {C, "{\"prompt\": \"x\", \"guided_json\": \"{not json\"}", 400, "guided_json"},
    {C, "{\"prompt\": \"x\", \"guided_regex\": \"(a)\\\\1\"}", 400, "guided_regex"},
    {C, "{\"prompt\": \"x\", \"guided_choice\": []}", 400, "guided_choice"},
    {C, "{\"prompt\": \"x\", \"guided_choice\": [\"a\", 1]}", 400, "guided_choice"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"response_format\": {\"type\": \"json_object\"}, \"guided_regex\": \"a\"}", 400, "guided_regex"},
    {C, "{\"prompt\": \"x\", \"add_special_tokens\": 0}", 400, "add_special_tokens"},
    {H, "{}", 400, "messages"},
    {H, "{\"messages\": []}", 400, "messages"},
    {H, "{\"messages\": \"hi\"}", 400, "messages"},
    {H, "{\"messages\": [1]}", 400, "messages"},
    {H, "{\"messages\": [{\"content\": \"x\"}]}", 400, "messages"},
    {H, "{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}", 400, "messages"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400, "messages"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", 400, "messages"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": [3]}]}", 400, "messages"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 2}", 400, "logprobs"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", 400, "top_logprobs"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 30}", 400, "top_logprobs"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_completion_tokens\": 0}", 400, "max_completion_tokens"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"add_generation_prompt\": \"no\"}", 400, "add_generation_prompt"},
    {C, "{\"prompt\": \"x\", \"logprobs_mode\": \"raw_logits\"}", 400, "logprobs_mode"},
    {C, "{\"prompt\": \"x\", \"logprobs_mode\": \"Processed\"}", 400, "logprobs_mode"},
    {C, "{\"prompt\": \"x\", \"logprobs_mode\": 1}", 400, "logprobs_mode"},
    {H, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs_mode\": \"\"}", 400, "logprobs_mode"},
    {C, "{\"prompt\": \"x\", \"return_token_ids\": 1}", 400, "return_token_ids"},
    {C, "{\"prompt\": [3, 259]}", 400, "prompt"},
    {C, "{\"prompt\": [3, -1]}", 400, "prompt"},
    {C, "{\"prompt\": [3, 4.5]}", 400, "prompt"},
};

static td_api_limits limits(void) {
    td_api_limits l = td_api_default_limits();
    l.max_model_len = 256;
    l.vocab_size = 259;
    return l;
}

int main(void) {
    td_api_limits lim = limits();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        td_srv_arena *a = td_srv_arena_create(1024);
        td_api_request r;
        td_api_error e = {0};
        bool ok = td_api_parse(bad[i].kind, bad[i].body, strlen(bad[i].body), &lim, "m", a, &r, &e);
        CHECK(!ok, "bad body accepted: %s", bad[i].body);
        CHECK(e.http_status == bad[i].status, "%s: status %d, want %d (%s)", bad[i].body, e.http_status, bad[i].status, e.message);
        CHECK(strcmp(e.param, bad[i].param ? bad[i].param : "") == 0, "%s: param '%s', want '%s'", bad[i].body, e.param,
              bad[i].param ? bad[i].param : "");
        CHECK(e.message[0] != 0 && e.type != NULL, "%s: message and type set", bad[i].body);
        td_srv_arena_destroy(a);
    }
    // Good completions request: every field lands where it should.
    {
        const char *b = "{\"model\": \"m\", \"prompt\": \"hello\", \"max_tokens\": 7, \"n\": 3, \"temperature\": 0.5,"
                        " \"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05, \"repetition_penalty\": 1.1,"
                        " \"presence_penalty\": 0.5, \"frequency_penalty\": -0.5, \"logit_bias\": {\"7\": -100, \"9\": 5},"
                        " \"seed\": -1, \"stop\": [\"a\", \"\", \"bc\"], \"stop_token_ids\": [1, 2], \"ignore_eos\": true,"
                        " \"logprobs\": 3, \"echo\": true, \"stream\": true, \"stream_options\": {\"include_usage\": true},"
                        " \"user\": \"u\", \"unknown_field\": {\"x\": 1}, \"suffix\": null, \"best_of\": 3}";
        td_srv_arena *a = td_srv_arena_create(1024);
        td_api_request r;
        td_api_error e = {0};
        bool ok = td_api_parse(TD_API_COMPLETIONS, b, strlen(b), &lim, "m", a, &r, &e);
        CHECK(ok, "good body rejected: %s", e.message);
        if (ok) {
            td_gen_request *g = &r.gen;
            CHECK(r.n_prompts == 1 && strcmp(r.prompts[0].text, "hello") == 0 && r.prompts[0].ids == NULL, "prompt");
            CHECK(r.has_max_tokens && g->max_tokens == 7 && g->n == 3, "max_tokens/n");
            CHECK(g->temperature == 0.5f && g->top_p == 0.9f && g->top_k == 40 && g->min_p == 0.05f, "sampling");
            CHECK(g->repetition_penalty == 1.1f && g->presence_penalty == 0.5f && g->frequency_penalty == -0.5f, "penalties");
            CHECK(g->n_logit_bias == 2 && g->logit_bias[0].token == 7 && g->logit_bias[0].bias == -100 &&
                      g->logit_bias[1].token == 9 && g->logit_bias[1].bias == 5, "logit_bias");
            CHECK(g->has_seed && g->seed == UINT64_MAX, "seed -1 wraps to all ones");
            CHECK(g->n_stop == 2 && strcmp(g->stop[0], "a") == 0 && strcmp(g->stop[1], "bc") == 0, "stop (empty dropped)");
            CHECK(g->n_stop_token_ids == 2 && g->stop_token_ids[1] == 2 && g->ignore_eos, "stop ids / ignore_eos");
            CHECK(g->logprobs == 3 && g->prompt_logprobs == 3 && g->echo && g->stream && r.include_usage, "logprobs/echo/stream");
            CHECK(r.add_special_tokens && strcmp(r.model, "m") == 0, "defaults");
        }
        td_srv_arena_destroy(a);
    }
    // seed at both ends of the int64 range that a double holds exactly.
    {
        const char *bodies[] = {"{\"prompt\": \"x\", \"seed\": -9223372036854775808}",
                                "{\"prompt\": \"x\", \"seed\": 9223372036854774784}"};
        const uint64_t want[] = {(uint64_t)INT64_MIN, 9223372036854774784ull};
        for (int k = 0; k < 2; k++) {
            td_srv_arena *a = td_srv_arena_create(256);
            td_api_request r;
            td_api_error e = {0};
            bool ok = td_api_parse(TD_API_COMPLETIONS, bodies[k], strlen(bodies[k]), &lim, "m", a, &r, &e);
            CHECK(ok && r.gen.has_seed && r.gen.seed == want[k], "seed edge %d: %s", k, ok ? "" : e.message);
            td_srv_arena_destroy(a);
        }
    }
    // Defaults and prompt shapes.
    {
        const char *bodies[] = {"{\"prompt\": [[3, 4], [5]]}", "{\"prompt\": [\"a\", \"bb\"]}", "{\"prompt\": [3, 4, 258]}",
                                "{\"prompt\": \"\", \"max_tokens\": null, \"stop\": null, \"logprobs\": null}"};
        int want_n[] = {2, 2, 1, 1};
        for (int k = 0; k < 4; k++) {
            td_srv_arena *a = td_srv_arena_create(256);
            td_api_request r;
            td_api_error e = {0};
            bool ok = td_api_parse(TD_API_COMPLETIONS, bodies[k], strlen(bodies[k]), &lim, "m", a, &r, &e);
            CHECK(ok && r.n_prompts == want_n[k], "%s: ok %d prompts %d (%s)", bodies[k], ok, ok ? r.n_prompts : -1, e.message);
            if (ok) {
                CHECK(!r.has_max_tokens && r.gen.n == 1 && r.gen.temperature == 1.0f && r.gen.top_p == 1.0f &&
                          r.gen.logprobs == -1 && r.gen.prompt_logprobs == -1 && r.gen.n_stop == 0 && !r.gen.stream,
                      "%s: defaults", bodies[k]);
                if (k == 0) CHECK(r.prompts[0].n_ids == 2 && r.prompts[1].ids[0] == 5, "token lists");
                if (k == 2) CHECK(r.prompts[0].n_ids == 3 && r.prompts[0].ids[2] == 258, "token array");
            }
            td_srv_arena_destroy(a);
        }
    }
    // logprobs_mode: every spelling, null as absent, and the server default (--logprobs-mode).
    {
        const char *modes[] = {"\"raw\"", "\"raw_logprobs\"", "\"processed\"", "\"processed_logprobs\"", "null"};
        const int want[] = {0, 0, 1, 1, -1};  // -1: the default
        for (int dflt = 0; dflt < 2; dflt++)
            for (int k = 0; k < 5; k++)
                for (int kind = 0; kind < 2; kind++) {
                    char body[256];
                    snprintf(body, sizeof body, kind ? "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s%s}"
                                                     : "{\"prompt\": [3], %s%s}",
                             "\"return_token_ids\": true, \"logprobs_mode\": ", modes[k]);
                    td_api_limits l2 = lim;
                    l2.default_logprobs_processed = dflt;
                    td_srv_arena *a = td_srv_arena_create(256);
                    td_api_request r;
                    td_api_error e = {0};
                    bool ok = td_api_parse(kind ? TD_API_CHAT : TD_API_COMPLETIONS, body, strlen(body), &l2, "m", a, &r, &e);
                    bool w = want[k] < 0 ? dflt : want[k];
                    CHECK(ok && r.gen.logprobs_processed == w && r.return_token_ids, "%s (default %d): ok %d processed %d (%s)",
                          body, dflt, ok, ok && r.gen.logprobs_processed, e.message);
                    td_srv_arena_destroy(a);
                }
    }
    // Chat.
    {
        const char *b = "{\"messages\": [{\"role\": \"system\", \"content\": null}, {\"role\": \"user\", \"content\": "
                        "[{\"type\": \"text\", \"text\": \"hi\"}]}], \"logprobs\": true, \"top_logprobs\": 5,"
                        " \"max_completion_tokens\": 9, \"max_tokens\": 100}";
        td_srv_arena *a = td_srv_arena_create(256);
        td_api_request r;
        td_api_error e = {0};
        bool ok = td_api_parse(TD_API_CHAT, b, strlen(b), &lim, NULL, a, &r, &e);
        CHECK(ok, "chat rejected: %s", e.message);
        if (ok) {
            CHECK(cJSON_GetArraySize(r.messages) == 2 && r.add_generation_prompt && !r.add_special_tokens, "chat messages/defaults");
            CHECK(r.chat_logprobs && r.gen.logprobs == 5 && r.gen.max_tokens == 9, "chat logprobs / max_completion_tokens wins");
            CHECK(r.model == NULL, "no model given");
        }
        td_srv_arena_destroy(a);
    }
    // Error JSON shape.
    {
        td_api_error e;
        CHECK(!td_api_fail(&e, 413, NULL, "too big: %d", 5), "fail returns false");
        char *s = td_api_error_json(&e);
        cJSON *j = cJSON_Parse(s);
        const cJSON *err = cJSON_GetObjectItem(j, "error");
        CHECK(err && cJSON_IsString(cJSON_GetObjectItem(err, "message")) &&
                  strcmp(cJSON_GetObjectItem(err, "message")->valuestring, "too big: 5") == 0,
              "error.message");
        CHECK(cJSON_IsString(cJSON_GetObjectItem(err, "type")) && cJSON_IsNull(cJSON_GetObjectItem(err, "param")) &&
                  cJSON_GetObjectItem(err, "code")->valueint == 413,
              "error.type/param/code: %s", s);
        cJSON_Delete(j);
        free(s);
        td_api_fail(&e, 400, "n", "bad n");
        s = td_api_error_json(&e);
        CHECK(strstr(s, "\"param\":\"n\"") != NULL, "param named: %s", s);
        free(s);
    }
    // SSE framing.
    {
        td_srv_buf b;
        td_srv_buf_init(&b, 0);
        CHECK(td_sse_append(&b, "{\"a\":1}", 7) && td_sse_append_done(&b), "sse append");
        CHECK(b.len == strlen("data: {\"a\":1}\n\ndata: [DONE]\n\n") &&
                  memcmp(b.p, "data: {\"a\":1}\n\ndata: [DONE]\n\n", b.len) == 0,
              "sse bytes: %s", b.p);
        td_srv_buf_free(&b);
        td_srv_buf_init(&b, 20);  // bounded: a chunk that does not fit leaves the buffer unchanged
        CHECK(td_sse_append(&b, "{}", 2) && b.len == 10, "fits");
        CHECK(!td_sse_append(&b, "{\"long\":true}", 13) && b.len == 10, "all-or-nothing under the cap");
        td_srv_buf_free(&b);
    }
    // Arena: alignment, cleanups run at destroy (newest first).
    {
        td_srv_arena *a = td_srv_arena_create(256);
        for (int i = 0; i < 100; i++) {
            void *p = td_srv_arena_alloc(a, (size_t)(i * 7 + 1));
            CHECK(p && ((uintptr_t)p & 15) == 0, "aligned allocation %d", i);
        }
        void *big = td_srv_arena_alloc(a, 100000);
        CHECK(big != NULL && td_srv_arena_used(a) >= 100000, "oversized allocation");
        CHECK(td_srv_arena_cleanup(a, note_cleanup, (void *)1) && td_srv_arena_cleanup(a, note_cleanup, (void *)2), "cleanup");
        td_srv_arena_destroy(a);
        CHECK(n_cleanup == 2 && cleanup_log[0] == 2 && cleanup_log[1] == 1, "cleanups ran newest first");
    }
    CHECK(strcmp(td_finish_reason_str(TD_FINISH_STOP), "stop") == 0 && strcmp(td_finish_reason_str(TD_FINISH_LENGTH), "length") == 0 &&
              strcmp(td_finish_reason_str(TD_FINISH_ABORT), "abort") == 0 && td_finish_reason_str(TD_FINISH_NONE) == NULL,
          "finish reason names");
    TEST_DONE();
}
