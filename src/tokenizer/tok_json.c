// Loader for Hugging Face tokenizer.json (+ tokenizer_config.json), and td_tokenizer_load's
// path dispatch. Supports the BPE model with the normalizers, pre-tokenizers, post-processors and
// decoders that GPT-2/Llama/Qwen/Mistral files use; anything else is TD_ERR_UNSUPPORTED by name.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "format/gguf.h"
#include "tokenizer/tok_impl.h"

#define JSON_MAX_BYTES ((size_t)1 << 30)

static const cJSON *jget(const cJSON *o, const char *k) { return cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, k) : NULL; }

static const char *jstr(const cJSON *o, const char *k) {
    const cJSON *v = jget(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool jbool(const cJSON *o, const char *k, bool def) {
    const cJSON *v = jget(o, k);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : def;
}

static bool jid(const cJSON *v, int32_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= (double)(1 << 30) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return false;
    *out = (int32_t)v->valuedouble;
    return true;
}

// String pattern {"String": s} or {"Regex": r}: returns the text, sets *is_regex.
static const char *jpattern(const cJSON *o, bool *is_regex) {
    const cJSON *p = jget(o, "pattern");
    const char *s = jstr(p, "String");
    *is_regex = false;
    if (s) return s;
    *is_regex = true;
    return jstr(p, "Regex");
}

static td_status parse_normalizer(td_tokenizer *t, const cJSON *n, td_err *err) {
    if (!n || cJSON_IsNull(n)) return TD_OK;
    const char *type = jstr(n, "type");
    if (!type) return td_err_set(err, TD_ERR_FORMAT, "normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *l = jget(n, "normalizers"), *x;
        if (!cJSON_IsArray(l)) return td_err_set(err, TD_ERR_FORMAT, "normalizer Sequence without normalizers");
        cJSON_ArrayForEach(x, l) {
            td_status st = parse_normalizer(t, x, err);
            if (st) return st;
        }
        return TD_OK;
    }
    if (t->n_norm == TOK_MAX_STEPS) return td_err_set(err, TD_ERR_LIMIT, "too many normalizers");
    tok_norm *m = &t->norm[t->n_norm];
    memset(m, 0, sizeof *m);
    if (!strcmp(type, "NFC")) m->kind = TOK_NORM_NFC;
    else if (!strcmp(type, "NFD")) m->kind = TOK_NORM_NFD;
    else if (!strcmp(type, "NFKC")) m->kind = TOK_NORM_NFKC;
    else if (!strcmp(type, "NFKD")) m->kind = TOK_NORM_NFKD;
    else if (!strcmp(type, "Prepend")) {
        const char *p = jstr(n, "prepend");
        if (!p) return td_err_set(err, TD_ERR_FORMAT, "normalizer Prepend without prepend");
        m->kind = TOK_NORM_PREPEND;
        m->alen = strlen(p);
        m->a = tok_strndup(p, m->alen);
    } else if (!strcmp(type, "Replace")) {
        bool re;
        const char *p = jpattern(n, &re), *c = jstr(n, "content");
        if (!p || !c) return td_err_set(err, TD_ERR_FORMAT, "normalizer Replace without pattern/content");
        if (re) return td_err_set(err, TD_ERR_UNSUPPORTED, "normalizer Replace with a Regex pattern");
        m->kind = TOK_NORM_REPLACE;
        m->alen = strlen(p), m->blen = strlen(c);
        m->a = tok_strndup(p, m->alen), m->b = tok_strndup(c, m->blen);
        if (!m->b) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    } else {
        return td_err_set(err, TD_ERR_UNSUPPORTED, "normalizer type \"%s\"", type);
    }
    if ((m->kind == TOK_NORM_PREPEND || m->kind == TOK_NORM_REPLACE) && !m->a)
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    t->n_norm++;
    return TD_OK;
}

static td_status parse_pre(td_tokenizer *t, const cJSON *n, td_err *err) {
    if (!n || cJSON_IsNull(n)) return TD_OK;
    const char *type = jstr(n, "type");
    if (!type) return td_err_set(err, TD_ERR_FORMAT, "pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *l = jget(n, "pretokenizers"), *x;
        if (!cJSON_IsArray(l)) return td_err_set(err, TD_ERR_FORMAT, "pre_tokenizer Sequence without pretokenizers");
        cJSON_ArrayForEach(x, l) {
            td_status st = parse_pre(t, x, err);
            if (st) return st;
        }
        return TD_OK;
    }
    if (t->n_pre == TOK_MAX_STEPS) return td_err_set(err, TD_ERR_LIMIT, "too many pre-tokenizers");
    tok_pre *p = &t->pre[t->n_pre];
    memset(p, 0, sizeof *p);
    if (!strcmp(type, "Split")) {
        bool re;
        const char *pat = jpattern(n, &re), *b = jstr(n, "behavior");
        if (!pat || !b) return td_err_set(err, TD_ERR_FORMAT, "pre_tokenizer Split without pattern/behavior");
        p->kind = TOK_PRE_SPLIT;
        if (!strcmp(b, "Isolated")) p->behavior = TOK_SPLIT_ISOLATED;
        else if (!strcmp(b, "Removed")) p->behavior = TOK_SPLIT_REMOVED;
        else if (!strcmp(b, "MergedWithPrevious")) p->behavior = TOK_SPLIT_MERGED_PREV;
        else if (!strcmp(b, "MergedWithNext")) p->behavior = TOK_SPLIT_MERGED_NEXT;
        else if (!strcmp(b, "Contiguous")) p->behavior = TOK_SPLIT_CONTIGUOUS;
        else return td_err_set(err, TD_ERR_UNSUPPORTED, "Split behavior \"%s\"", b);
        p->invert = jbool(n, "invert", false);
        p->literal = !re;
        td_status st = tok_compile_regex(pat, strlen(pat), !re, &p->re, err);
        if (st) return st;
        if (!(p->pattern = tok_strndup(pat, strlen(pat)))) {
            pcre2_code_free(p->re);
            return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        }
    } else if (!strcmp(type, "ByteLevel")) {
        p->kind = TOK_PRE_BYTELEVEL;
        p->add_prefix_space = jbool(n, "add_prefix_space", true);
        p->behavior = TOK_SPLIT_ISOLATED;
        t->byte_level = true;
        if (jbool(n, "use_regex", true)) {
            td_status st = tok_compile_regex(tok_gpt2_pattern, strlen(tok_gpt2_pattern), false, &p->re, err);
            if (st) return st;
        }
    } else if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(n, "replacement"), *scheme = jstr(n, "prepend_scheme");
        if (!r) r = "\xe2\x96\x81";
        if (!*r || strlen(r) >= sizeof p->rep) return td_err_set(err, TD_ERR_FORMAT, "Metaspace replacement");
        p->kind = TOK_PRE_METASPACE;
        memcpy(p->rep, r, strlen(r) + 1);
        p->split = jbool(n, "split", true);
        if (!scheme) p->prepend = jbool(n, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
        else if (!strcmp(scheme, "always")) p->prepend = TOK_PREPEND_ALWAYS;
        else if (!strcmp(scheme, "first")) p->prepend = TOK_PREPEND_FIRST;
        else if (!strcmp(scheme, "never")) p->prepend = TOK_PREPEND_NEVER;
        else return td_err_set(err, TD_ERR_UNSUPPORTED, "Metaspace prepend_scheme \"%s\"", scheme);
    } else {
        return td_err_set(err, TD_ERR_UNSUPPORTED, "pre_tokenizer type \"%s\"", type);
    }
    t->n_pre++;
    return TD_OK;
}

static int32_t special_id(const td_tokenizer *t, const cJSON *specials, const char *name, bool *ok) {
    const cJSON *ids = jget(jget(specials, name), "ids");
    int32_t id;
    if (cJSON_GetArraySize(ids) != 1 || !jid(cJSON_GetArrayItem(ids, 0), &id) || id >= t->n_vocab) {
        *ok = false;
        return -1;
    }
    return id;
}

static td_status parse_post(td_tokenizer *t, const cJSON *n, td_err *err) {
    if (!n || cJSON_IsNull(n)) return TD_OK;
    const char *type = jstr(n, "type");
    if (!type) return td_err_set(err, TD_ERR_FORMAT, "post_processor without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *l = jget(n, "processors"), *x;
        if (!cJSON_IsArray(l)) return td_err_set(err, TD_ERR_FORMAT, "post_processor Sequence without processors");
        cJSON_ArrayForEach(x, l) {
            td_status st = parse_post(t, x, err);
            if (st) return st;
        }
        return TD_OK;
    }
    if (!strcmp(type, "ByteLevel")) return TD_OK;  // only trims offsets
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *single = jget(n, "single"), *specials = jget(n, "special_tokens"), *x;
        if (!cJSON_IsArray(single)) return td_err_set(err, TD_ERR_FORMAT, "TemplateProcessing without single");
        bool seen_seq = false;
        t->n_prefix = t->n_suffix = 0;
        cJSON_ArrayForEach(x, single) {
            const cJSON *sp = jget(x, "SpecialToken");
            if (jget(x, "Sequence")) {
                seen_seq = true;
                continue;
            }
            const char *name = jstr(sp, "id");
            bool ok = true;
            int32_t id = name ? special_id(t, specials, name, &ok) : -1;
            if (!name || !ok) return td_err_set(err, TD_ERR_FORMAT, "TemplateProcessing: bad special token in single");
            if ((seen_seq ? t->n_suffix : t->n_prefix) == 8) return td_err_set(err, TD_ERR_LIMIT, "TemplateProcessing: too many special tokens");
            if (seen_seq) t->post_suffix[t->n_suffix++] = id;
            else t->post_prefix[t->n_prefix++] = id;
        }
        return TD_OK;
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        int32_t cls, sep;
        if (!jid(cJSON_GetArrayItem(jget(n, "cls"), 1), &cls) || !jid(cJSON_GetArrayItem(jget(n, "sep"), 1), &sep) ||
            cls >= t->n_vocab || sep >= t->n_vocab)
            return td_err_set(err, TD_ERR_FORMAT, "%s: bad cls/sep", type);
        t->post_prefix[0] = cls, t->post_suffix[0] = sep;
        t->n_prefix = t->n_suffix = 1;
        return TD_OK;
    }
    return td_err_set(err, TD_ERR_UNSUPPORTED, "post_processor type \"%s\"", type);
}

static td_status add_dec_replace(td_tokenizer *t, const char *from, const char *to, td_err *err) {
    if (t->n_dec_replace == TOK_MAX_STEPS) return td_err_set(err, TD_ERR_LIMIT, "too many decoders");
    t->dec_from[t->n_dec_replace] = tok_strndup(from, strlen(from));
    t->dec_to[t->n_dec_replace] = tok_strndup(to, strlen(to));
    t->n_dec_replace++;
    if (!t->dec_from[t->n_dec_replace - 1] || !t->dec_to[t->n_dec_replace - 1]) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

// Decoders: ByteLevel alone, or a chain of Replace* ByteFallback? Fuse? Strip? (Metaspace maps
// onto Replace + Strip(1)). Order matters to HF; we accept only the orders that mean the same here.
static td_status parse_decoder(td_tokenizer *t, const cJSON *n, int *stage, td_err *err) {
    if (!n || cJSON_IsNull(n)) return TD_OK;
    const char *type = jstr(n, "type");
    if (!type) return td_err_set(err, TD_ERR_FORMAT, "decoder without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *l = jget(n, "decoders"), *x;
        if (!cJSON_IsArray(l)) return td_err_set(err, TD_ERR_FORMAT, "decoder Sequence without decoders");
        cJSON_ArrayForEach(x, l) {
            td_status st = parse_decoder(t, x, stage, err);
            if (st) return st;
        }
        return TD_OK;
    }
    if (!strcmp(type, "ByteLevel")) {
        if (t->dec != TOK_DEC_NONE) return td_err_set(err, TD_ERR_UNSUPPORTED, "ByteLevel decoder combined with others");
        t->dec = TOK_DEC_BYTELEVEL;
        *stage = 9;
        return TD_OK;
    }
    if (t->dec == TOK_DEC_BYTELEVEL) return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder %s after ByteLevel", type);
    t->dec = TOK_DEC_CHAIN;
    if (!strcmp(type, "Replace")) {
        bool re;
        const char *p = jpattern(n, &re), *c = jstr(n, "content");
        if (!p || !c) return td_err_set(err, TD_ERR_FORMAT, "decoder Replace without pattern/content");
        if (re) return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder Replace with a Regex pattern");
        if (*stage > 0) return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder Replace after ByteFallback/Fuse/Strip");
        return add_dec_replace(t, p, c, err);
    }
    if (!strcmp(type, "Metaspace")) {
        const char *r = jstr(n, "replacement");
        const char *scheme = jstr(n, "prepend_scheme");
        if (*stage > 0) return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder Metaspace after other decoders");
        td_status st = add_dec_replace(t, r ? r : "\xe2\x96\x81", " ", err);
        if (st) return st;
        bool strip = scheme ? strcmp(scheme, "never") != 0 : jbool(n, "add_prefix_space", true);
        if (strip) t->dec_strip_start = 1, t->dec_strip_char = ' ';
        *stage = 3;
        return TD_OK;
    }
    if (!strcmp(type, "ByteFallback")) {
        if (*stage > 1) return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder ByteFallback after Fuse/Strip");
        t->dec_byte_fallback = true;
        *stage = 1;
        return TD_OK;
    }
    if (!strcmp(type, "Fuse")) {
        *stage = 2;
        return TD_OK;
    }
    if (!strcmp(type, "Strip")) {
        const char *c = jstr(n, "content");
        const cJSON *start = jget(n, "start"), *stop = jget(n, "stop");
        if (*stage != 2) return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder Strip without a Fuse before it");
        if (!c || !cJSON_IsNumber(start) || start->valuedouble < 0 || start->valuedouble > 64)
            return td_err_set(err, TD_ERR_FORMAT, "decoder Strip without content/start");
        if (cJSON_IsNumber(stop) && stop->valuedouble != 0)
            return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder Strip with stop > 0");
        int32_t cp;
        bool inc;
        size_t cl = strlen(c);
        if (!cl || tok_utf8_next((const uint8_t *)c, cl, &cp, &inc) != cl || cp < 0)
            return td_err_set(err, TD_ERR_FORMAT, "decoder Strip content must be one character");
        t->dec_strip_start = (int)start->valuedouble, t->dec_strip_char = (uint32_t)cp;
        *stage = 3;
        return TD_OK;
    }
    return td_err_set(err, TD_ERR_UNSUPPORTED, "decoder type \"%s\"", type);
}

// Model-space spelling: byte-level vocab strings become raw bytes. buf must hold n bytes.
static size_t model_space(const td_tokenizer *t, const char *s, size_t n, char *buf) {
    if (!t->byte_level) {
        memcpy(buf, s, n);
        return n;
    }
    return tok_bytelevel_to_raw(s, n, buf);
}

static td_status set_spelling(td_tokenizer *t, int32_t id, const char *s, td_err *err) {
    size_t n = strlen(s);
    char *buf = malloc(n + 1);
    if (!buf) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    size_t m = model_space(t, s, n, buf);
    td_status st = tok_set_piece(t, id, buf, m, err);
    free(buf);
    return st;
}

static td_status parse_merges(td_tokenizer *t, const cJSON *merges, td_err *err) {
    int nm = cJSON_GetArraySize(merges);
    if (!cJSON_IsArray(merges)) return td_err_set(err, TD_ERR_FORMAT, "model.merges is not an array");
    td_status st = tok_merges_reserve(t, (size_t)nm, err);
    if (st) return st;
    const cJSON *m;
    uint32_t rank = 0;
    char *buf = NULL;
    size_t cap = 0;
    cJSON_ArrayForEach(m, merges) {
        const char *a, *b;
        size_t al, bl;
        if (cJSON_IsString(m)) {
            a = m->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                free(buf);
                return td_err_set(err, TD_ERR_FORMAT, "merge %u \"%.40s\" is not two tokens", rank, a);
            }
            al = (size_t)(sp - a), b = sp + 1, bl = strlen(b);
        } else if (cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
            a = cJSON_GetArrayItem(m, 0)->valuestring, b = cJSON_GetArrayItem(m, 1)->valuestring;
            al = strlen(a), bl = strlen(b);
        } else {
            free(buf);
            return td_err_set(err, TD_ERR_FORMAT, "merge %u is neither \"a b\" nor [a, b]", rank);
        }
        if (al + bl + 1 > cap) {
            cap = (al + bl + 1) * 2;
            char *p = realloc(buf, cap);
            if (!p) {
                free(buf);
                return td_err_set(err, TD_ERR_NOMEM, "out of memory");
            }
            buf = p;
        }
        size_t ma = model_space(t, a, al, buf);
        size_t mb = model_space(t, b, bl, buf + ma);
        int32_t ia = tok_vocab_get(t, buf, ma), ib = tok_vocab_get(t, buf + ma, mb), in = tok_vocab_get(t, buf, ma + mb);
        if (ia < 0 || ib < 0 || in < 0) {
            td_err_set(err, TD_ERR_FORMAT, "merge %u (\"%.*s\" \"%.*s\") uses a token missing from the vocab", rank,
                       (int)(al > 40 ? 40 : al), a, (int)(bl > 40 ? 40 : bl), b);
            free(buf);
            return TD_ERR_FORMAT;
        }
        tok_merge_add(t, ia, ib, rank, in, true);
        rank++;
    }
    free(buf);
    return TD_OK;
}

// tokenizer_config.json token fields are a string or {"content": ...}.
static const char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = jget(cfg, key);
    if (cJSON_IsString(v)) return v->valuestring;
    return jstr(v, "content");
}

static td_status parse_config(td_tokenizer *t, const cJSON *cfg, td_err *err) {
    const char *bos = config_token(cfg, "bos_token"), *eos = config_token(cfg, "eos_token"),
               *pad = config_token(cfg, "pad_token");
    if (pad) t->pad_id = td_tokenizer_token_id(t, pad, strlen(pad));
    if (bos) {
        t->bos_token = tok_strndup(bos, strlen(bos));
        t->bos_id = td_tokenizer_token_id(t, bos, strlen(bos));
    }
    if (eos) {
        t->eos_token = tok_strndup(eos, strlen(eos));
        t->eos_id = td_tokenizer_token_id(t, eos, strlen(eos));
    }
    t->add_bos = jbool(cfg, "add_bos_token", t->add_bos);
    const cJSON *ct = jget(cfg, "chat_template"), *x;
    const char *tmpl = cJSON_IsString(ct) ? ct->valuestring : NULL;
    if (cJSON_IsArray(ct)) {  // [{"name": "default", "template": ...}, ...]
        cJSON_ArrayForEach(x, ct) {
            const char *name = jstr(x, "name");
            if (name && !strcmp(name, "default")) tmpl = jstr(x, "template");
        }
        if (!tmpl) tmpl = jstr(cJSON_GetArrayItem(ct, 0), "template");
    }
    if (tmpl) t->chat_template = tok_strndup(tmpl, strlen(tmpl));
    if ((bos && !t->bos_token) || (eos && !t->eos_token) || (tmpl && !t->chat_template))
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    return TD_OK;
}

static td_status build(td_tokenizer *t, const cJSON *root, const cJSON *cfg, td_err *err) {
    if (!cJSON_IsObject(root)) return td_err_set(err, TD_ERR_FORMAT, "not a JSON object");
    const cJSON *model = jget(root, "model");
    if (!cJSON_IsObject(model)) return td_err_set(err, TD_ERR_FORMAT, "no \"model\" object");
    const char *mtype = jstr(model, "type");
    if (mtype && strcmp(mtype, "BPE")) return td_err_set(err, TD_ERR_UNSUPPORTED, "model type \"%s\" (only BPE)", mtype);
    const cJSON *vocab = jget(model, "vocab"), *merges = jget(model, "merges");
    if (!cJSON_IsObject(vocab)) return td_err_set(err, TD_ERR_FORMAT, "model.vocab is not an object");
    const char *csp = jstr(model, "continuing_subword_prefix"), *eow = jstr(model, "end_of_word_suffix");
    if ((csp && *csp) || (eow && *eow))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "BPE continuing_subword_prefix/end_of_word_suffix");
    const cJSON *dropout = jget(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0) return td_err_set(err, TD_ERR_UNSUPPORTED, "BPE dropout");
    t->model = TOK_MODEL_BPE;
    t->byte_fallback = jbool(model, "byte_fallback", false);
    t->fuse_unk = jbool(model, "fuse_unk", false);
    t->ignore_merges = jbool(model, "ignore_merges", false);

    td_status st;
    if ((st = parse_normalizer(t, jget(root, "normalizer"), err))) return td_err_prefix(err, "normalizer"), st;
    if ((st = parse_pre(t, jget(root, "pre_tokenizer"), err))) return st;
    int stage = 0;
    if ((st = parse_decoder(t, jget(root, "decoder"), &stage, err))) return st;
    if ((t->dec == TOK_DEC_BYTELEVEL) != t->byte_level)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "ByteLevel decoder without ByteLevel pre-tokenizer or vice versa");

    // Size the id space: vocab ids and added-token ids, dense enough to index directly.
    int32_t max_id = -1;
    int count = 0;
    const cJSON *v, *added = jget(root, "added_tokens");
    cJSON_ArrayForEach(v, vocab) {
        int32_t id;
        if (!jid(v, &id)) return td_err_set(err, TD_ERR_FORMAT, "vocab entry \"%.40s\" has a bad id", v->string);
        if (id > max_id) max_id = id;
        count++;
    }
    if (added && !cJSON_IsArray(added)) return td_err_set(err, TD_ERR_FORMAT, "added_tokens is not an array");
    cJSON_ArrayForEach(v, added) {
        int32_t id;
        if (!jid(jget(v, "id"), &id) || !jstr(v, "content"))
            return td_err_set(err, TD_ERR_FORMAT, "added_tokens entry without id/content");
        if (id > max_id) max_id = id;
        count++;
    }
    if (max_id < 0) return td_err_set(err, TD_ERR_FORMAT, "empty vocabulary");
    if (max_id >= 4 * count + 65536) return td_err_set(err, TD_ERR_FORMAT, "token id %d far beyond the %d entries", max_id, count);
    if ((st = tok_set_n_vocab(t, max_id + 1, err))) return st;
    cJSON_ArrayForEach(v, vocab) {
        int32_t id = 0;
        jid(v, &id);
        if (t->flags[id] & TOK_F_PRESENT) return td_err_set(err, TD_ERR_FORMAT, "vocab id %d appears twice", id);
        if ((st = set_spelling(t, id, v->string, err))) return st;
    }
    cJSON_ArrayForEach(v, added) {
        int32_t id = 0;
        jid(jget(v, "id"), &id);
        const char *c = jstr(v, "content");
        bool special = jbool(v, "special", false);
        if (!(t->flags[id] & TOK_F_PRESENT)) {
            if ((st = set_spelling(t, id, c, err))) return st;
            t->flags[id] |= TOK_F_ADDED;
        }
        if (special) t->flags[id] |= TOK_F_SPECIAL;
        if ((st = tok_add_added(t, c, strlen(c), id, special, jbool(v, "lstrip", false), jbool(v, "rstrip", false),
                                jbool(v, "single_word", false), jbool(v, "normalized", !special), err)))
            return st;
    }
    if ((st = tok_build_vocab_hash(t, err))) return st;
    tok_fill_byte_tokens(t);
    if (merges && (st = parse_merges(t, merges, err))) return st;
    const char *unk = jstr(model, "unk_token");
    if (unk) {
        t->unk_id = td_tokenizer_token_id(t, unk, strlen(unk));
        if (t->unk_id < 0) return td_err_set(err, TD_ERR_FORMAT, "unk_token \"%.40s\" is not in the vocab", unk);
    }
    if ((st = parse_post(t, jget(root, "post_processor"), err))) return st;
    if (t->n_prefix) t->bos_id = t->post_prefix[0];
    if (cfg && (st = parse_config(t, cfg, err))) return st;
    tok_finalize(t);
    return TD_OK;
}

td_status td_tokenizer_from_json(const char *json, size_t len, const char *config_json, size_t config_len,
                                 const char *what, td_tokenizer **out, td_err *err) {
    *out = NULL;
    if (!what) what = "tokenizer.json";
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) return td_err_set(err, TD_ERR_FORMAT, "%s: invalid JSON near byte %zu", what,
                                 cJSON_GetErrorPtr() ? (size_t)(cJSON_GetErrorPtr() - json) : (size_t)0);
    cJSON *cfg = NULL;
    if (config_json) {
        cfg = cJSON_ParseWithLength(config_json, config_len);
        if (!cfg) {
            cJSON_Delete(root);
            return td_err_set(err, TD_ERR_FORMAT, "%s: tokenizer_config.json is not valid JSON", what);
        }
    }
    td_tokenizer *t = tok_alloc();
    td_status st = t ? build(t, root, cfg, err) : td_err_set(err, TD_ERR_NOMEM, "out of memory");
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (st) {
        td_err_prefix(err, "%s", what);
        td_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TD_OK;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

td_status td_tokenizer_load(const char *path, td_tokenizer **out, td_err *err) {
    *out = NULL;
    if (!path) return td_err_set(err, TD_ERR_INVALID, "tokenizer: no path");
    if (!td_is_dir(path) && ends_with(path, ".gguf")) {
        td_gguf *g;
        td_status st = td_gguf_open(path, &g, err);
        if (st) return st;
        st = td_tokenizer_from_gguf(g, out, err);
        if (st) td_err_prefix(err, "%s", path);
        td_gguf_close(g);
        return st;
    }
    char file[4096], dir[4096], cfgpath[4096];
    if (td_is_dir(path)) {
        if (!td_path_join(file, sizeof file, path, "tokenizer.json")) return td_err_set(err, TD_ERR_INVALID, "path too long");
        snprintf(dir, sizeof dir, "%s", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
    }
    char *json = NULL, *cfg = NULL;
    size_t len = 0, cfg_len = 0;
    td_status st = td_read_file(file, JSON_MAX_BYTES, &json, &len, err);
    if (st) return st;
    if (td_path_join(cfgpath, sizeof cfgpath, dir, "tokenizer_config.json") && td_file_exists(cfgpath)) {
        st = td_read_file(cfgpath, JSON_MAX_BYTES, &cfg, &cfg_len, err);
        if (st) {
            free(json);
            return st;
        }
    }
    st = td_tokenizer_from_json(json, len, cfg, cfg_len, file, out, err);
    free(json), free(cfg);
    return st;
}
