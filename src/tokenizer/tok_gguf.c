// Loader for tokenizers stored in GGUF metadata (tokenizer.ggml.*), as llama.cpp writes them:
// "gpt2" = byte-level BPE with merges and a pre-tokenizer named by tokenizer.ggml.pre, "llama" =
// SentencePiece vocab with scores (merged by score, byte fallback via <0xXX> tokens).
// Not here: the GGUF parser itself (format/gguf.c), "bert"/"t5"/"rwkv" vocabularies.
#include <stdlib.h>
#include <string.h>
#include "format/gguf.h"
#include "tokenizer/tok_impl.h"

enum { GGUF_TT_NORMAL = 1, GGUF_TT_UNKNOWN = 2, GGUF_TT_CONTROL = 3, GGUF_TT_USER = 4, GGUF_TT_UNUSED = 5, GGUF_TT_BYTE = 6 };

static const char LLAMA3_PAT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";
static const char QWEN2_PAT[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+";

static bool str_eq(td_gguf_str s, const char *c) { return s.len == strlen(c) && !memcmp(s.ptr, c, s.len); }

static int64_t opt_i64(const td_gguf *g, const char *key, int64_t def) {
    int64_t v;
    return td_gguf_get_i64(g, key, &v, NULL) == TD_OK ? v : def;
}

static bool opt_bool(const td_gguf *g, const char *key, bool def) {
    bool v;
    return td_gguf_get_bool(g, key, &v, NULL) == TD_OK ? v : def;
}

static td_status add_pre_regex(td_tokenizer *t, const char *pat, td_err *err) {
    tok_pre *p = &t->pre[t->n_pre];
    memset(p, 0, sizeof *p);
    p->kind = TOK_PRE_SPLIT;
    p->behavior = TOK_SPLIT_ISOLATED;
    td_status st = tok_compile_regex(pat, strlen(pat), false, &p->re, err);
    if (st) return st;
    t->n_pre++;  // from here td_tokenizer_free releases re and pattern
    if (!(p->pattern = tok_strndup(pat, strlen(pat)))) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

typedef struct {
    float score;
    int32_t id;
} scored;

static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static td_status build(td_tokenizer *t, const td_gguf *g, td_err *err) {
    td_gguf_str model;
    td_status st = td_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (st) return st;
    bool gpt2 = str_eq(model, "gpt2"), llama = str_eq(model, "llama");
    if (!gpt2 && !llama)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "tokenizer.ggml.model \"%.*s\" (supported: gpt2, llama)",
                          (int)(model.len > 40 ? 40 : model.len), model.ptr);
    int64_t ki = td_gguf_find_key(g, "tokenizer.ggml.tokens");
    if (ki < 0 || td_gguf_kv_type(g, ki) != TD_GGUF_ARRAY || td_gguf_arr_type(g, ki) != TD_GGUF_STRING)
        return td_err_set(err, TD_ERR_FORMAT, "tokenizer.ggml.tokens missing or not a string array");
    uint64_t n = td_gguf_arr_len(g, ki);
    if (n == 0 || n > (1u << 24)) return td_err_set(err, TD_ERR_FORMAT, "tokenizer.ggml.tokens has %llu entries", (unsigned long long)n);
    int64_t kt = td_gguf_find_key(g, "tokenizer.ggml.token_type");
    if (kt >= 0 && (td_gguf_kv_type(g, kt) != TD_GGUF_ARRAY || td_gguf_arr_len(g, kt) != n || td_gguf_arr_type(g, kt) == TD_GGUF_STRING))
        return td_err_set(err, TD_ERR_FORMAT, "tokenizer.ggml.token_type is not a numeric array of %llu", (unsigned long long)n);
    int64_t ks = td_gguf_find_key(g, "tokenizer.ggml.scores");
    if (ks >= 0 && (td_gguf_kv_type(g, ks) != TD_GGUF_ARRAY || td_gguf_arr_len(g, ks) != n || td_gguf_arr_type(g, ks) == TD_GGUF_STRING))
        return td_err_set(err, TD_ERR_FORMAT, "tokenizer.ggml.scores is not a numeric array of %llu", (unsigned long long)n);
    if (llama && ks < 0) return td_err_set(err, TD_ERR_FORMAT, "llama vocab without tokenizer.ggml.scores");

    t->byte_level = gpt2;
    t->model = gpt2 ? TOK_MODEL_BPE : TOK_MODEL_SPM_SCORE;
    t->byte_fallback = llama;
    if ((st = tok_set_n_vocab(t, (int32_t)n, err))) return st;
    char *buf = NULL;
    size_t cap = 0;
    for (uint64_t i = 0; i < n; i++) {
        td_gguf_str s = td_gguf_arr_str(g, ki, i);
        if (s.len + 1 > cap) {
            cap = s.len * 2 + 64;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                return td_err_set(err, TD_ERR_NOMEM, "out of memory");
            }
            buf = p;
        }
        size_t m = gpt2 ? tok_bytelevel_to_raw(s.ptr, s.len, buf) : (memcpy(buf, s.ptr, s.len), s.len);
        if ((st = tok_set_piece(t, (int32_t)i, buf, m, err))) {
            free(buf);
            return st;
        }
        int64_t type = kt >= 0 ? td_gguf_arr_i64(g, kt, i) : GGUF_TT_NORMAL;
        // Matched in the input before BPE, as llama.cpp's special-token partition does.
        if (type == GGUF_TT_CONTROL || type == GGUF_TT_USER || type == GGUF_TT_UNKNOWN) {
            bool special = type != GGUF_TT_USER;
            if (special) t->flags[i] |= TOK_F_SPECIAL;
            if (gpt2) t->flags[i] |= TOK_F_ADDED;  // HF keeps added tokens out of the BPE vocab
            if ((st = tok_add_added(t, s.ptr, s.len, (int32_t)i, special, false, false, false, false, err))) {
                free(buf);
                return st;
            }
        }
        if (type == GGUF_TT_UNKNOWN && t->unk_id < 0) t->unk_id = (int32_t)i;
    }
    if ((st = tok_build_vocab_hash(t, err))) {
        free(buf);
        return st;
    }
    tok_fill_byte_tokens(t);

    if (gpt2) {
        int64_t km = td_gguf_find_key(g, "tokenizer.ggml.merges");
        if (km < 0 || td_gguf_kv_type(g, km) != TD_GGUF_ARRAY || td_gguf_arr_type(g, km) != TD_GGUF_STRING) {
            free(buf);
            return td_err_set(err, TD_ERR_FORMAT, "gpt2 vocab without tokenizer.ggml.merges");
        }
        uint64_t nm = td_gguf_arr_len(g, km);
        if ((st = tok_merges_reserve(t, nm, err))) {
            free(buf);
            return st;
        }
        for (uint64_t r = 0; r < nm; r++) {
            td_gguf_str s = td_gguf_arr_str(g, km, r);
            const char *sp = memchr(s.ptr, ' ', s.len);
            if (s.len + 1 > cap) {
                cap = s.len * 2 + 64;
                char *p = realloc(buf, cap);
                if (!p) {
                    free(buf);
                    return td_err_set(err, TD_ERR_NOMEM, "out of memory");
                }
                buf = p;
            }
            if (!sp) {
                free(buf);
                return td_err_set(err, TD_ERR_FORMAT, "merge %llu is not two tokens", (unsigned long long)r);
            }
            size_t al = (size_t)(sp - s.ptr);
            size_t ma = tok_bytelevel_to_raw(s.ptr, al, buf);
            size_t mb = tok_bytelevel_to_raw(sp + 1, s.len - al - 1, buf + ma);
            int32_t ia = tok_vocab_get(t, buf, ma), ib = tok_vocab_get(t, buf + ma, mb), in = tok_vocab_get(t, buf, ma + mb);
            if (ia < 0 || ib < 0 || in < 0) {
                free(buf);
                return td_err_set(err, TD_ERR_FORMAT, "merge %llu uses a token missing from the vocab", (unsigned long long)r);
            }
            tok_merge_add(t, ia, ib, (uint32_t)r, in, false);
        }
        td_gguf_str pre = {"default", 7};
        td_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL);
        if (str_eq(pre, "default") || str_eq(pre, "gpt-2") || str_eq(pre, "gpt2")) {
            st = add_pre_regex(t, tok_gpt2_pattern, err);
        } else if (str_eq(pre, "llama-bpe") || str_eq(pre, "llama3") || str_eq(pre, "llama-v3")) {
            st = add_pre_regex(t, LLAMA3_PAT, err);
            t->ignore_merges = true;  // as llama.cpp (and HF's Llama 3 tokenizer.json) do
        } else if (str_eq(pre, "qwen2")) {
            t->norm[t->n_norm++] = (tok_norm){.kind = TOK_NORM_NFC};  // HF's Qwen tokenizer.json asks for NFC
            st = add_pre_regex(t, QWEN2_PAT, err);
        } else {
            st = td_err_set(err, TD_ERR_UNSUPPORTED, "tokenizer.ggml.pre \"%.*s\" (supported: default, gpt-2, llama-bpe, llama3, qwen2)",
                            (int)(pre.len > 40 ? 40 : pre.len), pre.ptr);
        }
        if (st) {
            free(buf);
            return st;
        }
        t->pre[t->n_pre++] = (tok_pre){.kind = TOK_PRE_BYTELEVEL};  // bytes are already raw: no-op marker
        t->dec = TOK_DEC_BYTELEVEL;
    } else {
        // SentencePiece: merge rank = position by descending score (equal scores share a rank).
        scored *sc = malloc(n * sizeof *sc);
        t->srank = malloc(n * sizeof *t->srank);
        if (!sc || !t->srank) {
            free(sc), free(buf);
            return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        }
        for (uint64_t i = 0; i < n; i++) sc[i] = (scored){(float)td_gguf_arr_f64(g, ks, i), (int32_t)i};
        qsort(sc, n, sizeof *sc, cmp_scored);
        int32_t rank = 0;
        for (uint64_t i = 0; i < n; i++) {
            if (i && sc[i].score != sc[i - 1].score) rank = (int32_t)i;
            t->srank[sc[i].id] = rank;
        }
        free(sc);
        if (opt_bool(g, "tokenizer.ggml.add_space_prefix", true)) {
            char *a = tok_strndup("\xe2\x96\x81", 3);
            t->norm[t->n_norm++] = (tok_norm){.kind = TOK_NORM_PREPEND, .a = a, .alen = 3};
            if (!a) {
                free(buf);
                return td_err_set(err, TD_ERR_NOMEM, "out of memory");
            }
            t->dec_strip_start = 1, t->dec_strip_char = ' ';
        }
        char *a = tok_strndup(" ", 1), *b = tok_strndup("\xe2\x96\x81", 3);
        t->norm[t->n_norm++] = (tok_norm){.kind = TOK_NORM_REPLACE, .a = a, .alen = 1, .b = b, .blen = 3};
        t->dec = TOK_DEC_CHAIN;
        t->dec_from[0] = tok_strndup("\xe2\x96\x81", 3), t->dec_to[0] = tok_strndup(" ", 1);
        t->n_dec_replace = 1;
        t->dec_byte_fallback = true;
        if (!a || !b || !t->dec_from[0] || !t->dec_to[0]) {
            free(buf);
            return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        }
    }
    free(buf);

    int64_t bos = opt_i64(g, "tokenizer.ggml.bos_token_id", -1), eos = opt_i64(g, "tokenizer.ggml.eos_token_id", -1);
    int64_t unk = opt_i64(g, "tokenizer.ggml.unknown_token_id", -1);
    int64_t pad = opt_i64(g, "tokenizer.ggml.padding_token_id", -1);
    t->pad_id = pad >= 0 && pad < (int64_t)n ? (int32_t)pad : -1;
    t->bos_id = bos >= 0 && bos < (int64_t)n ? (int32_t)bos : -1;
    t->eos_id = eos >= 0 && eos < (int64_t)n ? (int32_t)eos : -1;
    if (unk >= 0 && unk < (int64_t)n) t->unk_id = (int32_t)unk;
    char piece[256];
    if (t->bos_id >= 0 && td_tokenizer_id_to_piece(t, t->bos_id, piece, sizeof piece) >= 0)
        t->bos_token = tok_strndup(piece, strlen(piece));
    if (t->eos_id >= 0 && td_tokenizer_id_to_piece(t, t->eos_id, piece, sizeof piece) >= 0)
        t->eos_token = tok_strndup(piece, strlen(piece));
    t->add_bos = opt_bool(g, "tokenizer.ggml.add_bos_token", llama);
    if (t->add_bos && t->bos_id >= 0) t->post_prefix[t->n_prefix++] = t->bos_id;
    if (opt_bool(g, "tokenizer.ggml.add_eos_token", false) && t->eos_id >= 0) t->post_suffix[t->n_suffix++] = t->eos_id;
    td_gguf_str tmpl;
    if (td_gguf_get_str(g, "tokenizer.chat_template", &tmpl, NULL) == TD_OK) {
        t->chat_template = tok_strndup(tmpl.ptr, tmpl.len);
        if (!t->chat_template) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    tok_finalize(t);
    return TD_OK;
}

td_status td_tokenizer_from_gguf(const td_gguf *g, td_tokenizer **out, td_err *err) {
    *out = NULL;
    td_tokenizer *t = tok_alloc();
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    td_status st = build(t, g, err);
    if (st) {
        td_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TD_OK;
}
