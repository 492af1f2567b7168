// The random dataset of `tandem bench serve`: per-request input and output lengths drawn like
// vLLM's random dataset, prompts as token-id arrays (/v1/completions) or random words (chat), and
// the JSON request bodies, all built before the timed run. Not a tokenizer.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen/lg_http.h"
#include "loadgen/lg_stats.h"
#include "loadgen/loadgen.h"

td_lg_params td_lg_default_params(void) {
    td_lg_params p = {0};
    p.base_url = "http://127.0.0.1:8000";
    p.endpoint = "/v1/completions";
    p.model = NULL;
    p.num_prompts = 1000;
    p.input_len = 1024;
    p.output_len = 128;
    p.range_ratio = 0.0;
    p.vocab_size = 1000;
    p.vocab_offset = 1000;
    p.max_concurrency = 0;
    p.request_rate = INFINITY;
    p.burstiness = 1.0;
    p.ignore_eos = 0;
    p.seed = 0;
    p.timeout_s = 600.0;
    p.keep_alive = 1;
    p.temperature = NAN;
    p.extra_body = NULL;
    p.num_warmups = 0;
    return p;
}

// Common English words, each one token in the usual BPE vocabularies when preceded by a space,
// so a chat prompt of k words is about k tokens (the server's usage gives the exact count).
static const char *const WORDS[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an",
    "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "time", "people", "year",
    "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family",
    "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company",
    "system", "program", "question", "work", "number", "night", "point", "home", "water", "room",
    "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye",
    "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend",
    "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "name",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

static int is_chat(const char *endpoint) { return strstr(endpoint, "chat/completions") != NULL; }

void td_lg_workload_free(td_lg_workload *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->reqs[i].body);
    free(w->reqs);
    free(w->url);
    w->url = NULL;
    w->reqs = NULL;
    w->n = 0;
}

// The JSON body of one request; returns a malloc'd string or NULL (out of memory).
static char *build_body(const td_lg_params *p, const char *model, int chat, const int *ids, int in_len,
                        int max_tokens, td_rng *rng, const cJSON *extra) {
    cJSON *o = cJSON_CreateObject();
    char *text = NULL, *out = NULL;
    if (!o) return NULL;
    cJSON_AddStringToObject(o, "model", model);
    if (chat) {
        size_t cap = (size_t)in_len * 12 + 1, len = 0;
        text = malloc(cap);
        if (!text) goto done;
        for (int i = 0; i < in_len; i++) {
            const char *wd = WORDS[td_rng_int(rng, 0, (long)N_WORDS - 1)];
            len += (size_t)snprintf(text + len, cap - len, "%s%s", i ? " " : "", wd);
        }
        text[len] = 0;
        cJSON *msgs = cJSON_AddArrayToObject(o, "messages");
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(msgs, m);
        // vLLM sends max_completion_tokens; older servers only know max_tokens: send both.
        cJSON_AddNumberToObject(o, "max_completion_tokens", max_tokens);
        cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
    } else {
        cJSON_AddItemToObject(o, "prompt", cJSON_CreateIntArray(ids, in_len));
        cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
    }
    cJSON_AddBoolToObject(o, "stream", 1);
    cJSON *so = cJSON_AddObjectToObject(o, "stream_options");
    cJSON_AddBoolToObject(so, "include_usage", 1);
    if (p->ignore_eos) cJSON_AddBoolToObject(o, "ignore_eos", 1);
    if (!isnan(p->temperature)) cJSON_AddNumberToObject(o, "temperature", p->temperature);
    if (extra) {
        const cJSON *it;
        cJSON_ArrayForEach(it, extra) {
            cJSON_DeleteItemFromObjectCaseSensitive(o, it->string);
            cJSON_AddItemToObject(o, it->string, cJSON_Duplicate(it, 1));
        }
    }
    out = cJSON_PrintUnformatted(o);
done:
    free(text);
    cJSON_Delete(o);
    return out;
}

td_status td_lg_workload_build(const td_lg_params *p, const char *model, td_lg_workload *w, td_err *err) {
    memset(w, 0, sizeof *w);
    td_lg_url url;
    if (td_lg_url_parse(p->base_url, &url, err) != TD_OK) return err ? err->status : TD_ERR_INVALID;
    if (p->num_prompts < 1) return td_err_set(err, TD_ERR_INVALID, "--num-prompts must be >= 1");
    if (p->input_len < 1 || p->output_len < 1)
        return td_err_set(err, TD_ERR_INVALID, "--random-input-len and --random-output-len must be >= 1");
    if (!(p->range_ratio >= 0.0 && p->range_ratio < 1.0))
        return td_err_set(err, TD_ERR_INVALID, "--random-range-ratio must be in [0, 1)");
    if (p->vocab_size < 1 || p->vocab_offset < 0)
        return td_err_set(err, TD_ERR_INVALID, "--random-vocab-size must be >= 1, the offset >= 0");
    if (!p->endpoint || p->endpoint[0] != '/')
        return td_err_set(err, TD_ERR_INVALID, "--endpoint must start with '/'");
    cJSON *extra = NULL;
    if (p->extra_body) {
        extra = cJSON_Parse(p->extra_body);
        if (!extra || !cJSON_IsObject(extra)) {
            cJSON_Delete(extra);
            return td_err_set(err, TD_ERR_INVALID, "--extra-body must be a JSON object");
        }
    }
    int chat = is_chat(p->endpoint);
    if (p->prefix_len < 0 || (p->prefix_len > 0 && chat)) {
        cJSON_Delete(extra);
        return td_err_set(err, TD_ERR_INVALID, "--random-prefix-len needs a completions endpoint");
    }
    long in_lo = (long)floor(p->input_len * (1.0 - p->range_ratio));
    long in_hi = (long)ceil(p->input_len * (1.0 + p->range_ratio));
    long out_lo = (long)floor(p->output_len * (1.0 - p->range_ratio));
    long out_hi = (long)ceil(p->output_len * (1.0 + p->range_ratio));
    if (in_lo < 1) in_lo = 1;
    if (out_lo < 1) out_lo = 1;  // never ask for 0 tokens
    if (out_hi < out_lo) out_hi = out_lo;
    if (in_hi < in_lo) in_hi = in_lo;

    td_status st = TD_OK;
    const int pre = p->prefix_len;
    int *ids = malloc(((size_t)pre + (size_t)in_hi) * sizeof *ids);
    w->reqs = calloc((size_t)p->num_prompts, sizeof *w->reqs);
    size_t ul = strlen(url.base) + strlen(p->endpoint) + 1;
    w->url = malloc(ul);
    if (w->url) snprintf(w->url, ul, "%s%s", url.base, p->endpoint);
    if (!ids || !w->reqs || !w->url) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory for %d requests", p->num_prompts);
        goto out;
    }
    td_rng rng;
    td_rng_seed(&rng, p->seed ^ 0x5eedda7a5e7ull);  // the dataset stream; arrivals use another
    if (pre > 0) {  // its own stream: the rest of the dataset is the same with or without a prefix
        td_rng prng;
        td_rng_seed(&prng, p->seed ^ 0x9e3779b97f4a7c15ull);
        for (int k = 0; k < pre; k++) ids[k] = p->vocab_offset + (int)td_rng_int(&prng, 0, p->vocab_size - 1);
    }
    for (int i = 0; i < p->num_prompts; i++) {
        int in_len = (int)td_rng_int(&rng, in_lo, in_hi);
        int max_tokens = (int)td_rng_int(&rng, out_lo, out_hi);
        if (!chat)
            for (int k = 0; k < in_len; k++) ids[pre + k] = p->vocab_offset + (int)td_rng_int(&rng, 0, p->vocab_size - 1);
        char *body = build_body(p, model, chat, ids, pre + in_len, max_tokens, &rng, extra);
        if (!body) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory building request %d", i);
            goto out;
        }
        w->reqs[i].body = body;
        w->reqs[i].body_len = strlen(body);
        w->reqs[i].prompt_len = pre + in_len;
        w->reqs[i].max_tokens = max_tokens;
        w->n = i + 1;
    }
out:
    free(ids);
    cJSON_Delete(extra);
    if (st != TD_OK) td_lg_workload_free(w);
    return st;
}
