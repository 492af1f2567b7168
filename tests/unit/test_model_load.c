// td_model_load on the tiny models from tests/reference/make_format_samples.py: HF directories
// (F32/F16/BF16, sharded, llama3 scaling, mistral, qwen2 bias, qwen3 q/k norm) and GGUF files
// (llama Q8_0 with permuted Q/K and rope_freqs, qwen2 F16/BF16, qwen3 Q4_0). Checks config fields
// and probe values (models.expect.json, written by the generator) and the errors of broken models.
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "model/model.h"
#include "test_util.h"

static char dir[1024];

static const char *P(const char *name) {
    static char buf[4][2048];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

// Maps an HF or GGUF tensor name to the model's view (test-side table, independent of the loader).
static const td_tensor *find(const td_model *m, const char *name) {
    if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "token_embd.weight")) return &m->tok_embd;
    if (!strcmp(name, "lm_head.weight") || !strcmp(name, "output.weight")) return &m->output;
    if (!strcmp(name, "model.norm.weight") || !strcmp(name, "output_norm.weight")) return &m->out_norm;
    if (!strcmp(name, "rope_freqs.weight")) return &m->rope_freqs;
    int l = -1, n = 0;
    char rest[128];
    if (sscanf(name, "model.layers.%d.%127s%n", &l, rest, &n) != 2 && sscanf(name, "blk.%d.%127s%n", &l, rest, &n) != 2)
        return NULL;
    if (l < 0 || l >= m->cfg.n_layers) return NULL;
    const td_layer_weights *w = &m->layers[l];
    static const struct { const char *a, *b; size_t off; } tab[] = {
        {"input_layernorm.weight", "attn_norm.weight", offsetof(td_layer_weights, attn_norm)},
        {"self_attn.q_proj.weight", "attn_q.weight", offsetof(td_layer_weights, wq)},
        {"self_attn.k_proj.weight", "attn_k.weight", offsetof(td_layer_weights, wk)},
        {"self_attn.v_proj.weight", "attn_v.weight", offsetof(td_layer_weights, wv)},
        {"self_attn.o_proj.weight", "attn_output.weight", offsetof(td_layer_weights, wo)},
        {"self_attn.q_proj.bias", "attn_q.bias", offsetof(td_layer_weights, bq)},
        {"self_attn.k_proj.bias", "attn_k.bias", offsetof(td_layer_weights, bk)},
        {"self_attn.v_proj.bias", "attn_v.bias", offsetof(td_layer_weights, bv)},
        {"self_attn.q_norm.weight", "attn_q_norm.weight", offsetof(td_layer_weights, q_norm)},
        {"self_attn.k_norm.weight", "attn_k_norm.weight", offsetof(td_layer_weights, k_norm)},
        {"post_attention_layernorm.weight", "ffn_norm.weight", offsetof(td_layer_weights, ffn_norm)},
        {"mlp.gate_proj.weight", "ffn_gate.weight", offsetof(td_layer_weights, w_gate)},
        {"mlp.up_proj.weight", "ffn_up.weight", offsetof(td_layer_weights, w_up)},
        {"mlp.down_proj.weight", "ffn_down.weight", offsetof(td_layer_weights, w_down)},
    };
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (!strcmp(rest, tab[i].a) || !strcmp(rest, tab[i].b)) return (const td_tensor *)((const char *)w + tab[i].off);
    return NULL;
}

// Element k (flat, row-major) of t as f32, dequantizing its row.
static float elem(const td_tensor *t, int64_t k) {
    int64_t cols = t->ne[t->ndim - 1];
    int64_t row = k / cols;
    float *buf = malloc((size_t)cols * sizeof *buf);
    size_t rb = td_row_bytes(t->type, cols);
    td_to_f32(t->type, (const char *)t->data + row * rb, buf, cols);
    float v = buf[k % cols];
    free(buf);
    return v;
}

static void check_probes(const td_model *m, const cJSON *checks, const char *label) {
    const cJSON *c;
    int n = 0;
    cJSON_ArrayForEach(c, checks) {
        const char *name = cJSON_GetArrayItem(c, 0)->valuestring;
        int64_t k = (int64_t)cJSON_GetArrayItem(c, 1)->valuedouble;
        double want = cJSON_GetArrayItem(c, 2)->valuedouble;
        const td_tensor *t = find(m, name);
        CHECK(t && td_tensor_present(t), "%s: %s absent", label, name);
        if (!t || !td_tensor_present(t)) continue;
        CHECK(k < td_tensor_nelem(t), "%s: %s index", label, name);
        float got = elem(t, k);
        CHECK(fabs(got - want) <= 1e-6 * fabs(want) + 1e-9, "%s: %s[%lld] = %.9g, want %.9g", label, name,
              (long long)k, got, want);
        n++;
    }
    CHECK(n > 0, "%s: no probes", label);
}

// The file a pointer lies in, per /proc/self/maps ("" if anonymous memory): proves zero-copy.
static void mapped_file(const void *p, char *out, size_t cap) {
    out[0] = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        int off = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &off) < 2) continue;
        if ((uintptr_t)p >= lo && (uintptr_t)p < hi) {
            snprintf(out, cap, "%s", line + off);
            out[strcspn(out, "\n")] = 0;
            break;
        }
    }
    fclose(f);
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static td_model *load_ok(const char *name, td_err *err) {
    td_model *m = NULL;
    td_status s = td_model_load(P(name), &m, err);
    CHECK(s == TD_OK && m, "%s: %s", name, err->msg);
    return m;
}

// A sample file of tests/oracle/gen/formats.sh, read whole; missing is a failed check, not a skip.
static bool need_read(const char *path, char **buf, size_t *n) {
    td_err err;
    const td_status st = td_read_file(path, 0, buf, n, &err);
    CHECK(st == TD_OK, "%s (run tests/reference/make_format_samples.py)", err.msg);
    return st == TD_OK;
}

static void test_good(void) {
    size_t n;
    char *js;
    td_err err;
    if (td_read_file(P("models.expect.json"), 0, &js, &n, &err)) {
        fprintf(stderr, "%s (run tests/reference/make_format_samples.py)\n", err.msg);
        exit(1);
    }
    cJSON *exp = cJSON_Parse(js);
    free(js);
    const cJSON *e;
    cJSON_ArrayForEach(e, exp) {
        td_model *m = load_ok(e->string, &err);
        if (!m) continue;
        const td_model_config *c = &m->cfg;
        int q3 = strstr(e->string, "qwen3") != NULL;
        CHECK(c->vocab_size == 48 && c->dim == 64 && c->n_layers == 2 && c->n_heads == 4 && c->n_kv_heads == 2 &&
                  c->ffn_dim == 96 && c->head_dim == (q3 ? 32 : 16), "%s sizes", e->string);
        CHECK(c->bos_id == 1 && c->n_eos >= 1 && c->eos_ids[0] == 2, "%s special ids", e->string);
        CHECK(c->norm_eps == 1e-5f, "%s eps", e->string);
        check_probes(m, cJSON_GetObjectItem(e, "checks"), e->string);
        for (int l = 0; l < c->n_layers; l++) {
            CHECK(td_tensor_present(&m->layers[l].w_down) && m->layers[l].w_down.ne[0] == 64 &&
                      m->layers[l].w_down.ne[1] == 96, "%s w_down shape", e->string);
            CHECK(td_tensor_present(&m->layers[l].bq) == c->qkv_bias, "%s bias presence", e->string);
            CHECK(td_tensor_present(&m->layers[l].k_norm) == c->qk_norm, "%s qk norm presence", e->string);
        }
        if (c->tie_embeddings) CHECK(m->output.data == m->tok_embd.data, "%s tied output aliases", e->string);
        else CHECK(m->output.data != m->tok_embd.data && td_tensor_present(&m->output), "%s untied", e->string);
        CHECK(m->tokenizer_path && strcmp(m->tokenizer_path, P(e->string)) == 0, "%s tokenizer path", e->string);
        td_model_free(m);
    }
    cJSON_Delete(exp);

    td_model *m;
    // Per-model specifics.
    if ((m = load_ok("hf_llama_f32", &err))) {
        CHECK(m->cfg.arch == TD_ARCH_LLAMA && !m->cfg.tie_embeddings && m->cfg.rope_style == TD_ROPE_NEOX &&
                  m->tok_embd.type == TD_F32 && m->cfg.max_pos == 128, "llama f32");
        CHECK(m->cfg.n_eos == 2 && m->cfg.eos_ids[1] == 7 && fabsf(m->cfg.gen_temperature - 0.6f) < 1e-6f &&
                  fabsf(m->cfg.gen_top_p - 0.9f) < 1e-6f, "generation_config merged");
        CHECK(!td_tensor_present(&m->rope_freqs), "no rope_freqs");
        char where[4096];
        mapped_file(m->layers[1].w_up.data, where, sizeof where);
        CHECK(ends_with(where, "hf_llama_f32/model.safetensors"), "weights are views of the mapped file: '%s'", where);
        td_model_free(m);
    }
    if ((m = load_ok("hf_llama_f16", &err))) {
        CHECK(m->layers[0].wq.type == TD_F16 && m->out_norm.type == TD_F16, "f16 stays f16");
        td_model_free(m);
    }
    if ((m = load_ok("hf_llama_sharded", &err))) {
        CHECK(m->layers[1].w_up.type == TD_BF16, "sharded bf16");
        char w1[4096], w2[4096];
        mapped_file(m->tok_embd.data, w1, sizeof w1);
        mapped_file(m->output.data, w2, sizeof w2);
        CHECK(ends_with(w1, "model-00001-of-00003.safetensors") && ends_with(w2, "model-00001-of-00003.safetensors"),
              "embeddings in shard 1: %s", w1);
        mapped_file(m->layers[1].w_down.data, w1, sizeof w1);
        CHECK(ends_with(w1, "model-00003-of-00003.safetensors"), "last layer in shard 3: %s", w1);
        td_model_free(m);
    }
    if ((m = load_ok("hf_llama3_tied", &err))) {
        const td_model_config *c = &m->cfg;
        CHECK(c->tie_embeddings && c->rope_scaling == TD_ROPE_SCALING_LLAMA3 && c->rope_factor == 8 &&
                  c->rope_low_freq_factor == 1 && c->rope_high_freq_factor == 4 && c->rope_orig_max_pos == 64 &&
                  c->rope_theta == 500000.0f && c->n_eos == 2 && c->eos_ids[1] == 3, "llama3 config");
        td_model_free(m);
    }
    if ((m = load_ok("hf_mistral", &err))) {
        CHECK(m->cfg.arch == TD_ARCH_MISTRAL && m->cfg.sliding_window == 32, "mistral");
        td_model_free(m);
    }
    if ((m = load_ok("hf_qwen2", &err))) {
        CHECK(m->cfg.arch == TD_ARCH_QWEN2 && m->cfg.qkv_bias && m->cfg.tie_embeddings && m->cfg.sliding_window == 0 &&
                  m->layers[0].bk.ne[0] == 32 && m->layers[0].bq.ne[0] == 64, "qwen2");
        td_model_free(m);
    }
    if ((m = load_ok("hf_qwen3", &err))) {
        CHECK(m->cfg.arch == TD_ARCH_QWEN3 && m->cfg.qk_norm && m->cfg.head_dim == 32 && m->layers[1].wq.ne[0] == 128 &&
                  m->layers[1].wo.ne[1] == 128 && m->layers[1].q_norm.ne[0] == 32, "qwen3");
        td_model_free(m);
    }
    if ((m = load_ok("llama_q8_0.gguf", &err))) {
        const td_model_config *c = &m->cfg;
        CHECK(c->arch == TD_ARCH_LLAMA && c->rope_style == TD_ROPE_NORM && !c->tie_embeddings &&
                  c->rope_theta == 500000.0f && c->rope_scaling == TD_ROPE_SCALING_NONE && c->max_pos == 128, "llama gguf");
        CHECK(c->n_eos == 2 && c->eos_ids[1] == 5, "eot added to eos");
        CHECK(m->layers[0].wq.type == TD_Q8_0 && m->layers[0].attn_norm.type == TD_F32, "q8_0 matrices");
        CHECK(td_tensor_present(&m->rope_freqs) && m->rope_freqs.ne[0] == 8 && m->rope_freqs.type == TD_F32, "rope_freqs");
        char where[4096];
        mapped_file(m->layers[0].wq.data, where, sizeof where);
        CHECK(ends_with(where, "llama_q8_0.gguf"), "gguf weights mapped: '%s'", where);
        td_model_free(m);
    }
    if ((m = load_ok("llama_f32.gguf", &err))) {
        CHECK(m->cfg.rope_scaling == TD_ROPE_SCALING_LINEAR && m->cfg.rope_factor == 4.0f, "linear scaling");
        td_model_free(m);
    }
    if ((m = load_ok("qwen2_f16.gguf", &err))) {
        CHECK(m->cfg.arch == TD_ARCH_QWEN2 && m->cfg.rope_style == TD_ROPE_NEOX && m->cfg.qkv_bias &&
                  m->cfg.tie_embeddings && !m->cfg.qk_norm, "qwen2 gguf");
        td_model_free(m);
    }
    if ((m = load_ok("qwen3_q4_0.gguf", &err))) {
        CHECK(m->cfg.arch == TD_ARCH_QWEN3 && m->cfg.qk_norm && m->cfg.head_dim == 32 && m->layers[0].wq.type == TD_Q4_0,
              "qwen3 gguf");
        td_model_free(m);
    }
    if ((m = load_ok("novocab.gguf", &err))) {
        CHECK(m->cfg.vocab_size == 48 && m->cfg.tie_embeddings && m->output.data == m->tok_embd.data,
              "vocab from token_embd rows");
        td_model_free(m);
    }
    // Misaligned safetensors data: copied to aligned memory, values intact.
    if ((m = load_ok("hf_unaligned", &err))) {
        if (need_read(P("hf_unaligned.expect.json"), &js, &n)) {
            cJSON *x = cJSON_Parse(js);
            free(js);
            check_probes(m, cJSON_GetObjectItem(x, "checks"), "hf_unaligned");
            cJSON_Delete(x);
        }
        CHECK(((uintptr_t)m->layers[0].wq.data & 3) == 0, "aligned f32");
        td_model_free(m);
    }
}

static void expect_fail(const char *name, td_status want, const char *n1, const char *n2) {
    td_model *m = (td_model *)1;
    td_err err = {0};
    td_status s = td_model_load(P(name), &m, &err);
    CHECK(s == want && m == NULL, "%s: got %s (%s)", name, td_status_name(s), err.msg);
    CHECK(strstr(err.msg, n1) && (!n2 || strstr(err.msg, n2)), "%s: message '%s' lacks '%s'/'%s'", name, err.msg, n1,
          n2 ? n2 : "");
}

static void test_bad(void) {
    expect_fail("bad/no_config", TD_ERR_NOT_FOUND, "config.json", NULL);
    expect_fail("bad/bad_json", TD_ERR_FORMAT, "config.json", "malformed");
    expect_fail("bad/bad_shape", TD_ERR_FORMAT,
                "model.safetensors: tensor model.layers.1.mlp.up_proj.weight has shape [64, 32], expected [96, 64]", NULL);
    expect_fail("bad/missing_tensor", TD_ERR_NOT_FOUND, "model.layers.1.post_attention_layernorm.weight", "missing");
    expect_fail("bad/no_lm_head", TD_ERR_NOT_FOUND, "lm_head.weight", "tie");
    expect_fail("bad/gemma", TD_ERR_UNSUPPORTED, "gemma", "config.json");
    expect_fail("bad/no_weights", TD_ERR_NOT_FOUND, "model.safetensors", NULL);
    expect_fail("bad/missing_shard", TD_ERR_IO, "model-00002-of-00002.safetensors", NULL);
    expect_fail("bad/bad_index", TD_ERR_FORMAT, "index.json", "file name");
    expect_fail("bad/heads", TD_ERR_INVALID, "num_key_value_heads", NULL);
    expect_fail("bad/i64", TD_ERR_UNSUPPORTED, "I64", "model.layers.0.mlp.gate_proj.weight");
    expect_fail("bad/gemma.gguf", TD_ERR_UNSUPPORTED, "gemma", "gemma.gguf");
    expect_fail("bad/q4_1.gguf", TD_ERR_UNSUPPORTED, "Q4_1", "blk.1.ffn_up.weight");
    expect_fail("bad/missing.gguf", TD_ERR_NOT_FOUND, "blk.1.attn_v.weight", "missing.gguf");
    expect_fail("bad/noembd.gguf", TD_ERR_NOT_FOUND, "token_embd.weight", NULL);
    expect_fail("bad/no_dim.gguf", TD_ERR_NOT_FOUND, "llama.embedding_length", NULL);
    expect_fail("bad/partial_rope.gguf", TD_ERR_UNSUPPORTED, "partial rotary", "partial_rope.gguf");
    expect_fail("bad/yarn.gguf", TD_ERR_UNSUPPORTED, "yarn", NULL);
    expect_fail("bad/heads_str.gguf", TD_ERR_FORMAT, "llama.attention.head_count", "string");
    expect_fail("bad/blocks.gguf", TD_ERR_NOT_FOUND, "blk.2.attn_norm.weight", NULL);
    expect_fail("does-not-exist", TD_ERR_NOT_FOUND, "does-not-exist", NULL);
    expect_fail("st_f32.safetensors", TD_ERR_FORMAT, "not a model directory", NULL);

    // Truncated copies of a GGUF model and of a safetensors model file.
    size_t n;
    char *buf;
    td_err err;
    mkdir(P("tmp"), 0755);
    if (need_read(P("llama_q8_0.gguf"), &buf, &n)) {
        for (int k = 0; k < 24; k++) {
            size_t len = k < 12 ? (size_t)k * 37 : n - 1 - (size_t)(k - 12) * (n / 13);
            FILE *f = fopen(P("tmp/trunc.gguf"), "wb");
            fwrite(buf, 1, len, f);
            fclose(f);
            td_model *m = NULL;
            td_status s = td_model_load(P("tmp/trunc.gguf"), &m, &err);
            CHECK(s != TD_OK && m == NULL, "truncated gguf at %zu loaded", len);
            CHECK(s == TD_ERR_FORMAT, "truncated gguf at %zu: %s %s", len, td_status_name(s), err.msg);
        }
        free(buf);
    }
    if (need_read(P("hf_llama_f32/model.safetensors"), &buf, &n)) {
        mkdir(P("tmp/st"), 0755);
        char *cfg;
        size_t cl;
        if (need_read(P("hf_llama_f32/config.json"), &cfg, &cl)) {
            FILE *f = fopen(P("tmp/st/config.json"), "wb");
            fwrite(cfg, 1, cl, f);
            fclose(f);
            free(cfg);
        }
        for (int k = 0; k < 10; k++) {
            size_t len = k < 5 ? (size_t)k * 5 : n - 1 - (size_t)(k - 5) * (n / 6);
            FILE *f = fopen(P("tmp/st/model.safetensors"), "wb");
            fwrite(buf, 1, len, f);
            fclose(f);
            td_model *m = NULL;
            td_status s = td_model_load(P("tmp/st"), &m, &err);
            CHECK(s == TD_ERR_FORMAT && m == NULL, "truncated safetensors at %zu: %s %s", len, td_status_name(s), err.msg);
        }
        free(buf);
    }
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/formats", td_test_data_dir());
    test_good();
    test_bad();
    TEST_DONE();
}
