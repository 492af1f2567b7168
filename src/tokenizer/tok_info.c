// Read-only views of a loaded tokenizer for converters (tokenizer.h: td_tokenizer_info,
// td_tokenizer_is_added, td_tokenizer_merges), so that no other room re-parses tokenizer files.
// Not here: loading (tok_json.c, tok_gguf.c), encoding or decoding (tokenizer.c).
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tok_impl.h"

static bool writes_metaspace(const char *s, size_t n) {
    static const char ms[] = "\xe2\x96\x81";  // "▁"
    for (size_t i = 0; i + 3 <= n; i++)
        if (!memcmp(s + i, ms, 3)) return true;
    return false;
}

void td_tokenizer_get_info(const td_tokenizer *t, td_tokenizer_info *info) {
    memset(info, 0, sizeof *info);
    info->byte_level = t->byte_level;
    bool spm = t->byte_fallback || t->model == TOK_MODEL_SPM_SCORE;
    for (int i = 0; i < t->n_norm; i++) {
        const tok_norm *m = &t->norm[i];
        if (m->kind == TOK_NORM_PREPEND) {
            info->add_space_prefix = true;
            spm |= writes_metaspace(m->a, m->alen);
        }
        if (m->kind == TOK_NORM_REPLACE) spm |= writes_metaspace(m->b, m->blen);
    }
    for (int i = 0; i < t->n_pre; i++) {
        const tok_pre *p = &t->pre[i];
        if (p->kind == TOK_PRE_SPLIT) {
            if (!info->n_split++) info->split_pattern = p->pattern, info->split_literal = p->literal;
        } else if (p->kind == TOK_PRE_BYTELEVEL) {
            info->bytelevel_regex |= p->re != NULL;
        } else if (p->kind == TOK_PRE_METASPACE) {
            spm = true;
            info->add_space_prefix |= p->prepend != TOK_PREPEND_NEVER;
        }
    }
    info->sentencepiece = !t->byte_level && spm;
    info->n_prefix = t->n_prefix, info->n_suffix = t->n_suffix;
    info->unk_id = t->unk_id, info->pad_id = t->pad_id;
}

bool td_tokenizer_is_added(const td_tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_vocab) return false;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id) return true;
    return false;
}

static int cmp_rank(const void *a, const void *b) {
    uint32_t x = ((const struct tok_merge *)a)->rank, y = ((const struct tok_merge *)b)->rank;
    return (x > y) - (x < y);
}

td_status td_tokenizer_merges(const td_tokenizer *t, td_tokenizer_merge **out, size_t *n, td_err *err) {
    *out = NULL, *n = 0;
    size_t m = 0;
    for (size_t i = 0; i < t->mh_cap; i++) m += t->mh[i].key != 0;
    if (!m) return TD_OK;
    struct tok_merge *tmp = malloc(m * sizeof *tmp);
    td_tokenizer_merge *o = malloc(m * sizeof *o);
    if (!tmp || !o) {
        free(tmp), free(o);
        return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory (%zu merges)", m);
    }
    for (size_t i = 0, k = 0; i < t->mh_cap; i++)
        if (t->mh[i].key) tmp[k++] = t->mh[i];
    qsort(tmp, m, sizeof *tmp, cmp_rank);  // ranks are distinct: one per listed merge
    for (size_t i = 0; i < m; i++) {
        uint64_t key = tmp[i].key - 1;  // (left << 32 | right) + 1
        o[i] = (td_tokenizer_merge){(int32_t)(uint32_t)(key >> 32), (int32_t)(uint32_t)key, tmp[i].new_id};
    }
    free(tmp);
    *out = o, *n = m;
    return TD_OK;
}
