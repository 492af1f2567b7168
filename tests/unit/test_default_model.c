// The committed default model (assets/default-model, docs/default-model.md): it loads; its config
// and tokenizer agree (vocabulary, BOS/EOS ids, chat template); its perplexity on a held-out Brown
// snippet (from a validation-split document, never trained on) is far below the uniform
// distribution's (vocab) -- the weights are trained, not random; and `tandem run --prompt` with no
// MODEL finds it beside the executable and generates tokens, also from another directory.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/file.h"
#include "model/forward.h"
#include "model/model.h"
#include "run_cmd.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

#define DM "assets/default-model"

// From a validation-split document (brown docs "A Night in New Orleans", category press reportage);
// the training shards never contained it.
static const char *SNIPPET =
    "\"A Night in New Orleans\" is the gayety planned by members of the Thrift Shop Committee for May 6 at "
    "Philmont Country Club. The women have a reputation for giving parties that are different and are fun "
    "and this year's promises to follow in this fine tradition. Mrs. H. J. Grinsfelder is chairman.";

// `tandem run` with no MODEL from directory `cwd`: exit 0 and n tokens in its JSON output.
static void check_run(const char *bin, const char *cwd) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' run --prompt 'The' -n 12 --temperature 0 --ignore-eos --json 2>/dev/null", cwd, bin);
    int st = -1;
    char *out = td_test_run(cmd, &st);
    cJSON *j = out ? cJSON_Parse(out) : NULL;
    const cJSON *toks = cJSON_GetObjectItem(j, "tokens"), *text = cJSON_GetObjectItem(j, "text");
    CHECK(st == 0 && cJSON_GetArraySize(toks) == 12 && cJSON_IsString(text) && strlen(text->valuestring) > 0,
          "tandem run --prompt The (no MODEL) in %s: exit %d, output %.200s", cwd, st, out ? out : "");
    if (cJSON_IsString(text)) printf("run (cwd %s): The%s\n", cwd, text->valuestring);
    cJSON_Delete(j);
    free(out);
}

int main(void) {
    td_err err = {0};
    td_model *m = NULL;
    td_tokenizer *tk = NULL;
    CHECK(td_model_load(DM, &m, &err) == TD_OK, "load %s: %s", DM, err.msg);
    CHECK(td_tokenizer_load(DM, &tk, &err) == TD_OK, "tokenizer %s: %s", DM, err.msg);
    if (!m || !tk) {
        td_model_free(m);
        td_tokenizer_free(tk);
        TEST_DONE();
    }
    const td_model_config *c = &m->cfg;
    const int V = c->vocab_size;
    printf("default model: dim %d, layers %d, heads %d/%d, ffn %d, vocab %d, ctx %d, tied %d\n", c->dim,
           c->n_layers, c->n_heads, c->n_kv_heads, c->ffn_dim, V, c->max_pos, (int)c->tie_embeddings);
    CHECK(c->arch == TD_ARCH_LLAMA && c->tie_embeddings, "expected a tied llama");
    CHECK(td_tokenizer_vocab_size(tk) == V, "tokenizer has %d tokens, model %d", td_tokenizer_vocab_size(tk), V);
    CHECK(c->bos_id >= 0 && c->bos_id == td_tokenizer_bos_id(tk), "bos %d vs tokenizer %d", c->bos_id,
          td_tokenizer_bos_id(tk));
    CHECK(c->n_eos >= 1 && c->eos_ids[0] == td_tokenizer_eos_id(tk), "eos %d vs tokenizer %d",
          c->n_eos ? c->eos_ids[0] : -1, td_tokenizer_eos_id(tk));
    CHECK(td_tokenizer_bos_token(tk) && !strcmp(td_tokenizer_bos_token(tk), "<|bos|>") &&
              td_tokenizer_eos_token(tk) && !strcmp(td_tokenizer_eos_token(tk), "<|eos|>"),
          "special tokens");
    CHECK(td_tokenizer_chat_template(tk) != NULL, "no chat template");
    CHECK(td_file_exists(DM "/generation_config.json") && td_file_exists(DM "/LICENSE-brown-corpus.txt") &&
              td_file_exists(DM "/README.md"),
          "generation_config.json, LICENSE-brown-corpus.txt, README.md");

    // Perplexity of the held-out snippet (BOS + text; every next token predicted).
    td_tokens ids = {0};
    CHECK(td_tokenizer_encode(tk, SNIPPET, strlen(SNIPPET), true, &ids, &err) == TD_OK && ids.n > 20 &&
              ids.n <= 256 && ids.ids[0] == c->bos_id,
          "encode: %s", err.msg);
    td_forward *f = NULL;
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = (int)ids.n, fp.max_ctx = (int)ids.n, fp.n_threads = 2;
    float *lg = malloc(ids.n * (size_t)V * sizeof *lg);
    if (ids.n > 20 && td_forward_create(m, &fp, &f, &err) == TD_OK) {
        int32_t pos[256], seq[256];
        for (size_t t = 0; t < ids.n; t++) pos[t] = (int32_t)t, seq[t] = 0;
        td_batch bt = {.n_tokens = (int)ids.n, .tokens = ids.ids, .pos = pos, .seq_id = seq};
        CHECK(td_forward_run(f, &bt, lg, &err) == TD_OK, "forward: %s", err.msg);
        double nll = 0;
        for (size_t t = 0; t + 1 < ids.n; t++) {
            const float *r = lg + t * (size_t)V;
            double mx = r[0], s = 0;
            for (int v = 1; v < V; v++) mx = r[v] > mx ? r[v] : mx;
            for (int v = 0; v < V; v++) s += exp((double)r[v] - mx);
            nll += mx + log(s) - r[ids.ids[t + 1]];
        }
        double ppl = exp(nll / (double)(ids.n - 1));
        printf("held-out snippet: %zu tokens, perplexity %.1f (uniform: %d)\n", ids.n - 1, ppl, V);
        CHECK(ppl < V / 10.0, "perplexity %.1f is not well below the uniform %d: untrained weights?", ppl, V);
    } else {
        CHECK(0, "forward: %s", err.msg);
    }
    free(lg);
    td_forward_free(f);
    td_tokens_free(&ids);
    td_tokenizer_free(tk);
    td_model_free(m);

    // `tandem run` without MODEL: found beside the executable, from the repo root and elsewhere.
    const char *bin = td_test_bin();
    if (bin) {
        char abs[4096];
        if (bin[0] != '/' && realpath(bin, abs)) bin = abs;
        check_run(bin, ".");
        check_run(bin, "/");
    }
    TEST_DONE();
}
