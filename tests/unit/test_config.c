// config.json / generation_config.json parsing and td_config_validate. The inputs are abridged
// copies of published configs (Llama-3.1, Mistral-7B, Qwen2.5, Qwen3); expected values are the
// fields as written plus transformers' documented defaults for absent ones.
#include <string.h>

#include "model/config.h"
#include "test_util.h"

static td_status parse(td_model_config *c, const char *js, td_err *err) {
    err->msg[0] = 0;
    return td_config_from_hf_json(c, js, strlen(js), "config.json", err);
}

static void test_llama31(void) {
    const char *js =
        "{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
        "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"hidden_act\":\"silu\","
        "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,"
        "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
        "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"pretraining_tp\":1,"
        "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
        "\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,"
        "\"tie_word_embeddings\":false,\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"vocab_size\":128256}";
    td_model_config c;
    td_err err;
    CHECK(parse(&c, js, &err) == TD_OK, "%s", err.msg);
    CHECK(c.arch == TD_ARCH_LLAMA && c.dim == 4096 && c.n_layers == 32 && c.n_heads == 32 && c.n_kv_heads == 8,
          "sizes");
    CHECK(c.head_dim == 128 && c.ffn_dim == 14336 && c.max_pos == 131072 && c.vocab_size == 128256, "sizes 2");
    CHECK(c.norm_eps == 1e-5f && c.rope_theta == 500000.0f, "eps theta");
    CHECK(c.rope_scaling == TD_ROPE_SCALING_LLAMA3 && c.rope_factor == 8 && c.rope_low_freq_factor == 1 &&
              c.rope_high_freq_factor == 4 && c.rope_orig_max_pos == 8192, "llama3 scaling");
    CHECK(!c.tie_embeddings && !c.qkv_bias && !c.qk_norm && c.rope_style == TD_ROPE_NEOX, "flags");
    CHECK(c.bos_id == 128000 && c.n_eos == 3 && c.eos_ids[0] == 128001 && c.eos_ids[2] == 128009, "special ids");
    CHECK(c.sliding_window == 0 && c.gen_temperature < 0 && c.gen_top_k < 0, "unspecified");
    CHECK(td_config_validate(&c, "config.json", &err) == TD_OK, "%s", err.msg);

    // generation_config.json merges.
    const char *gen = "{\"bos_token_id\":128000,\"do_sample\":true,\"eos_token_id\":[128001,128008,128009,7],"
                      "\"temperature\":0.6,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05}";
    CHECK(td_config_merge_generation_json(&c, gen, strlen(gen), "generation_config.json", &err) == TD_OK, "%s", err.msg);
    CHECK(c.n_eos == 4 && c.eos_ids[3] == 7, "eos merged without duplicates (%d)", c.n_eos);
    CHECK_NEAR(c.gen_temperature, 0.6, 1e-7, "temperature");
    CHECK_NEAR(c.gen_top_p, 0.9, 1e-7, "top_p");
    CHECK(c.gen_top_k == 40, "top_k");
    CHECK_NEAR(c.gen_min_p, 0.05, 1e-7, "min_p");
    const char *g2 = "{\"eos_token_id\":2}";
    CHECK(td_config_merge_generation_json(&c, g2, strlen(g2), "g", &err) == TD_OK && c.n_eos == 5 &&
              c.eos_ids[4] == 2 && c.gen_top_k == 40, "int eos, others unchanged");
    CHECK(td_config_merge_generation_json(&c, "{", 1, "generation_config.json", &err) == TD_ERR_FORMAT &&
              strstr(err.msg, "generation_config.json"), "%s", err.msg);
    const char *g3 = "{\"top_k\":\"x\"}";
    CHECK(td_config_merge_generation_json(&c, g3, strlen(g3), "g", &err) == TD_ERR_FORMAT && strstr(err.msg, "top_k"),
          "%s", err.msg);
}

static void test_others(void) {
    td_model_config c;
    td_err err;
    // Mistral-7B-v0.1: no head_dim (128 = 4096/32), sliding window, no tie.
    const char *mis = "{\"architectures\":[\"MistralForCausalLM\"],\"bos_token_id\":1,\"eos_token_id\":2,"
                      "\"hidden_act\":\"silu\",\"hidden_size\":4096,\"intermediate_size\":14336,"
                      "\"max_position_embeddings\":32768,\"model_type\":\"mistral\",\"num_attention_heads\":32,"
                      "\"num_hidden_layers\":32,\"num_key_value_heads\":8,\"rms_norm_eps\":1e-05,"
                      "\"rope_theta\":10000.0,\"sliding_window\":4096,\"tie_word_embeddings\":false,\"vocab_size\":32000}";
    CHECK(parse(&c, mis, &err) == TD_OK, "%s", err.msg);
    CHECK(c.arch == TD_ARCH_MISTRAL && c.head_dim == 128 && c.sliding_window == 4096 && c.bos_id == 1 &&
              c.n_eos == 1 && c.eos_ids[0] == 2 && !c.tie_embeddings, "mistral");
    // Qwen2.5-0.5B: tied, bias, sliding window off.
    const char *q2 = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,"
                     "\"eos_token_id\":151643,\"hidden_act\":\"silu\",\"hidden_size\":896,\"intermediate_size\":4864,"
                     "\"max_position_embeddings\":32768,\"max_window_layers\":24,\"model_type\":\"qwen2\","
                     "\"num_attention_heads\":14,\"num_hidden_layers\":24,\"num_key_value_heads\":2,"
                     "\"rms_norm_eps\":1e-06,\"rope_theta\":1000000.0,\"sliding_window\":32768,"
                     "\"tie_word_embeddings\":true,\"use_sliding_window\":false,\"vocab_size\":151936}";
    CHECK(parse(&c, q2, &err) == TD_OK, "%s", err.msg);
    CHECK(c.arch == TD_ARCH_QWEN2 && c.qkv_bias && !c.qk_norm && c.tie_embeddings && c.head_dim == 64 &&
              c.sliding_window == 0 && c.n_kv_heads == 2 && c.norm_eps == 1e-6f, "qwen2");
    CHECK(td_config_validate(&c, "q2", &err) == TD_OK, "%s", err.msg);
    // Qwen3-0.6B: head_dim 128 != 1024/16, q/k norm, attention_bias false.
    const char *q3 = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"bos_token_id\":151643,"
                     "\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":1024,"
                     "\"intermediate_size\":3072,\"max_position_embeddings\":40960,\"max_window_layers\":28,"
                     "\"model_type\":\"qwen3\",\"num_attention_heads\":16,\"num_hidden_layers\":28,"
                     "\"num_key_value_heads\":8,\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,"
                     "\"sliding_window\":null,\"tie_word_embeddings\":true,\"use_sliding_window\":false,"
                     "\"vocab_size\":151936}";
    CHECK(parse(&c, q3, &err) == TD_OK, "%s", err.msg);
    CHECK(c.arch == TD_ARCH_QWEN3 && c.head_dim == 128 && c.qk_norm && !c.qkv_bias && c.tie_embeddings &&
              c.rope_scaling == TD_ROPE_SCALING_NONE && c.rope_theta == 1e6f, "qwen3");
    CHECK(td_config_validate(&c, "q3", &err) == TD_OK, "%s", err.msg);
    // Defaults: minimal llama (architectures only), linear scaling with legacy "type" key.
    const char *mini = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":100,"
                       "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}}";
    CHECK(parse(&c, mini, &err) == TD_OK, "%s", err.msg);
    CHECK(c.n_kv_heads == 4 && c.head_dim == 16 && c.max_pos == 2048 && c.rope_theta == 10000.0f &&
              c.norm_eps == 1e-6f && !c.tie_embeddings && c.bos_id == -1 && c.n_eos == 0, "defaults");
    CHECK(c.rope_scaling == TD_ROPE_SCALING_LINEAR && c.rope_factor == 2.0f, "linear");
    const char *dflt = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4,\"intermediate_size\":128,\"vocab_size\":100,"
                       "\"rope_scaling\":{\"rope_type\":\"default\"}}";
    CHECK(parse(&c, dflt, &err) == TD_OK && c.rope_scaling == TD_ROPE_SCALING_NONE, "default rope type");
}

static void test_errors(void) {
    td_model_config c;
    td_err err;
    struct { const char *js; td_status st; const char *needle; } cases[] = {
        {"{", TD_ERR_FORMAT, "malformed"},
        {"[1]", TD_ERR_FORMAT, "object"},
        {"{\"model_type\":\"gpt2\",\"hidden_size\":4}", TD_ERR_UNSUPPORTED, "gpt2"},
        {"{\"architectures\":[\"GemmaForCausalLM\"]}", TD_ERR_UNSUPPORTED, "GemmaForCausalLM"},
        {"{\"hidden_size\":4}", TD_ERR_FORMAT, "model_type"},
        {"{\"model_type\":\"llama\",\"num_hidden_layers\":2,\"num_attention_heads\":4,\"intermediate_size\":8,"
         "\"vocab_size\":10}", TD_ERR_FORMAT, "hidden_size"},
        {"{\"model_type\":\"llama\",\"hidden_size\":\"64\",\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10}", TD_ERR_FORMAT, "hidden_size"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64.5,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10}", TD_ERR_FORMAT, "hidden_size"},
        {"{\"model_type\":\"llama\",\"hidden_size\":1e30,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10}", TD_ERR_FORMAT, "hidden_size"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":0,"
         "\"intermediate_size\":8,\"vocab_size\":10}", TD_ERR_FORMAT, "heads"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}",
         TD_ERR_UNSUPPORTED, "yarn"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}",
         TD_ERR_FORMAT, "low_freq_factor"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"rope_scaling\":{\"rope_type\":\"linear\"}}",
         TD_ERR_FORMAT, "factor"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"rope_scaling\":5}", TD_ERR_FORMAT, "rope_scaling"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"attention_bias\":true}", TD_ERR_UNSUPPORTED, "attention_bias"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"hidden_act\":\"gelu\"}", TD_ERR_UNSUPPORTED, "gelu"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"eos_token_id\":[1,\"x\"]}", TD_ERR_FORMAT, "eos_token_id"},
        {"{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
         "\"intermediate_size\":8,\"vocab_size\":10,\"tie_word_embeddings\":1}", TD_ERR_FORMAT, "tie_word_embeddings"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        td_status s = parse(&c, cases[i].js, &err);
        CHECK(s == cases[i].st && strstr(err.msg, cases[i].needle) && strstr(err.msg, "config.json"),
              "case %zu: %s: %s", i, td_status_name(s), err.msg);
    }
    CHECK(td_config_from_hf_json(&c, NULL, 0, "x", &err) == TD_ERR_FORMAT, "NULL text");

    // Integer fields: each failure says which it is (out of range with the range, not an
    // integer, the wrong type), the field and the value.
#define CFG(field)                                                                                  \
    "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_attention_heads\":4,\"intermediate_size\":8," \
    "\"vocab_size\":10," field "}"
    struct { const char *js, *msg; } ints[] = {
        {CFG("\"num_hidden_layers\":1e12"), "config.json: num_hidden_layers: 1000000000000 is out of range [1, 65536]"},
        {CFG("\"num_hidden_layers\":0"), "config.json: num_hidden_layers: 0 is out of range [1, 65536]"},
        {CFG("\"num_hidden_layers\":-3"), "config.json: num_hidden_layers: -3 is out of range [1, 65536]"},
        {CFG("\"num_hidden_layers\":2.5"), "config.json: num_hidden_layers: 2.5 must be an integer"},
        {CFG("\"num_hidden_layers\":\"2\""), "config.json: num_hidden_layers must be an integer, not a string"},
        {CFG("\"num_hidden_layers\":[2]"), "config.json: num_hidden_layers must be an integer, not an array"},
        {CFG("\"num_hidden_layers\":true"), "config.json: num_hidden_layers must be an integer, not a boolean"},
        {CFG("\"num_hidden_layers\":2,\"num_key_value_heads\":1e5"),
         "config.json: num_key_value_heads: 100000 is out of range [1, 65536]"},
        {CFG("\"num_hidden_layers\":2,\"bos_token_id\":3e9"),
         "config.json: bos_token_id: 3000000000 is out of range [-2147483648, 2147483647]"},
    };
#undef CFG
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        td_status s = parse(&c, ints[i].js, &err);
        CHECK(s == TD_ERR_FORMAT && !strcmp(err.msg, ints[i].msg), "int case %zu: %s: '%s', expected '%s'", i,
              td_status_name(s), err.msg, ints[i].msg);
    }

    // Validation.
    const char *ok = "{\"model_type\":\"llama\",\"hidden_size\":64,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                     "\"intermediate_size\":8,\"vocab_size\":10,\"bos_token_id\":1,\"eos_token_id\":2}";
    CHECK(parse(&c, ok, &err) == TD_OK, "%s", err.msg);
    CHECK(td_config_validate(&c, "m", &err) == TD_OK, "%s", err.msg);
    td_model_config b;
    b = c, b.n_kv_heads = 3;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && strstr(err.msg, "multiple"), "%s", err.msg);
    b = c, b.head_dim = 15;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && strstr(err.msg, "even"), "%s", err.msg);
    b = c, b.n_layers = 0;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && !strcmp(err.msg, "m: num_hidden_layers: 0 is out of range [1, 65536]"),
          "%s", err.msg);
    b = c, b.dim = -5;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && strstr(err.msg, "hidden_size"), "%s", err.msg);
    b = c, b.norm_eps = 0;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && strstr(err.msg, "eps"), "%s", err.msg);
    b = c, b.rope_theta = -1;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID, "theta");
    b = c, b.eos_ids[0] = 10;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && strstr(err.msg, "eos"), "%s", err.msg);
    b = c, b.bos_id = 99;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && strstr(err.msg, "bos"), "%s", err.msg);
    b = c, b.rope_scaling = TD_ROPE_SCALING_LLAMA3, b.rope_factor = 8, b.rope_low_freq_factor = 4,
    b.rope_high_freq_factor = 4, b.rope_orig_max_pos = 8192;
    CHECK(td_config_validate(&b, "m", &err) == TD_ERR_INVALID && strstr(err.msg, "llama3"), "%s", err.msg);
    CHECK(strcmp(td_arch_name(TD_ARCH_QWEN3), "qwen3") == 0, "arch name");
}

int main(void) {
    test_llama31();
    test_others();
    test_errors();
    TEST_DONE();
}
