// Token shard writer/reader and corpus preparation (format in shards.h).
#include "train/shards.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

#include "base/file.h"
#include "base/threadpool.h"
#include "train/afile.h"

static const uint8_t MAGIC[8] = {'T', 'D', 'S', 'H', 'A', 'R', 'D', 0};
static const uint8_t END_MAGIC[8] = {'T', 'D', 'S', 'H', 'E', 'N', 'D', 0};
#define HEADER_BYTES 64
#define CHUNK 8192  // tokens converted per step

struct td_shard {
    td_map map;
    int tb;  // token bytes
    int vocab;
    uint64_t n, ndocs;
    const uint8_t *payload;
};

// Converts ids[0..n) to little-endian tb-byte values in out.
static void pack(const int32_t *ids, size_t n, int tb, uint8_t *out) {
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)ids[i];
        out[tb * i] = (uint8_t)v;
        out[tb * i + 1] = (uint8_t)(v >> 8);
        if (tb == 4) {
            out[4 * i + 2] = (uint8_t)(v >> 16);
            out[4 * i + 3] = (uint8_t)(v >> 24);
        }
    }
}

td_status td_shard_write(const char *path, int vocab_size, const int32_t *ids, size_t n,
                         uint64_t ndocs, td_err *err) {
    if (vocab_size <= 0)
        return td_err_set(err, TD_ERR_INVALID, "%s: vocab size %d", path, vocab_size);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_size)
            return td_err_set(err, TD_ERR_INVALID, "%s: token %zu = %d outside the vocabulary (%d)",
                              path, i, (int)ids[i], vocab_size);
    int tb = vocab_size <= 65536 ? 2 : 4;
    uint8_t buf[CHUNK * 4];
    XXH3_state_t *h = XXH3_createState();
    if (!h) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    XXH3_64bits_reset(h);
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        pack(ids + i, k, tb, buf);
        XXH3_64bits_update(h, buf, k * (size_t)tb);
    }
    uint64_t payload_hash = XXH3_64bits_digest(h);
    XXH3_freeState(h);
    uint8_t hdr[HEADER_BYTES] = {0};
    memcpy(hdr, MAGIC, 8);
    uint64_t f[7] = {TD_SHARD_VERSION | (uint64_t)HEADER_BYTES << 32,
                     (uint64_t)tb | (uint64_t)vocab_size << 32,
                     n,
                     ndocs,
                     payload_hash,
                     0,
                     0};
    for (int j = 0; j < 6; j++)
        for (int b = 0; b < 8; b++) hdr[8 + 8 * j + b] = (uint8_t)(f[j] >> (8 * b));
    uint64_t hh = XXH3_64bits(hdr, 56);
    for (int b = 0; b < 8; b++) hdr[56 + b] = (uint8_t)(hh >> (8 * b));
    td_afile a;
    td_status st = td_afile_open(&a, path, err);
    if (st) return st;
    st = td_afile_write(&a, hdr, sizeof hdr, err);
    for (size_t i = 0; i < n && !st; i += CHUNK) {
        size_t k = n - i < CHUNK ? n - i : CHUNK;
        pack(ids + i, k, tb, buf);
        st = td_afile_write(&a, buf, k * (size_t)tb, err);
    }
    if (!st) st = td_afile_write(&a, END_MAGIC, 8, err);
    if (st) {
        td_afile_abort(&a);
        return st;
    }
    return td_afile_commit(&a, err);
}

void td_shard_close(td_shard *s) {
    if (!s) return;
    td_map_close(&s->map);
    free(s);
}

td_status td_shard_open(const char *path, td_shard **out, td_err *err) {
    *out = NULL;
    td_shard *s = calloc(1, sizeof *s);
    if (!s) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    td_status st = td_map_open(&s->map, path, err);
    if (st) {
        free(s);
        return st;
    }
    const uint8_t *p = s->map.data;
    uint64_t size = s->map.size;
    const char *why = NULL;
    char msg[160];
    if (size < 8 || memcmp(p, MAGIC, 8) != 0) {
        why = size < 8 && (size == 0 || !memcmp(p, MAGIC, size))
                  ? "truncated: shorter than the header"
                  : "not a tandem token shard (bad magic)";
    } else if (size < HEADER_BYTES + 8) {
        why = "truncated: shorter than header and end marker";
    } else if (td_le32(p + 8) != TD_SHARD_VERSION) {
        snprintf(msg, sizeof msg, "unsupported shard version %u (this build reads %d)",
                 td_le32(p + 8), TD_SHARD_VERSION);
        why = msg;
    } else if (XXH3_64bits(p, 56) != td_le64(p + 56)) {
        why = "header checksum mismatch (corrupt header)";
    } else {
        uint32_t hdr = td_le32(p + 12), tb = td_le32(p + 16), vocab = td_le32(p + 20);
        uint64_t n = td_le64(p + 24);
        if (hdr < HEADER_BYTES || (tb != 2 && tb != 4) || vocab == 0 || vocab > INT32_MAX ||
            (tb == 2 && vocab > 65536)) {
            why = "header fields out of range";
        } else if (n > (size - hdr) / tb || hdr + n * tb + 8 > size) {
            snprintf(msg, sizeof msg,
                     "truncated: %" PRIu64 " bytes, header says %" PRIu64 " tokens", size, n);
            why = msg;
        } else if (hdr + n * tb + 8 < size) {
            why = "trailing bytes after the end marker";
        } else if (memcmp(p + size - 8, END_MAGIC, 8) != 0) {
            why = "completeness marker missing (truncated or corrupt)";
        } else if (XXH3_64bits(p + hdr, n * tb) != td_le64(p + 40)) {
            why = "payload checksum mismatch (corrupt tokens)";
        } else {
            s->tb = (int)tb;
            s->vocab = (int)vocab;
            s->n = n;
            s->ndocs = td_le64(p + 32);
            s->payload = p + hdr;
            // Ids must be in the vocabulary (the checksum proves they are what was written).
            for (uint64_t i = 0; i < n && !why; i++) {
                uint32_t v = tb == 2 ? td_le16(s->payload + 2 * i) : td_le32(s->payload + 4 * i);
                if (v >= vocab) {
                    snprintf(msg, sizeof msg, "token %" PRIu64 " = %u outside the vocabulary (%u)",
                             i, v, vocab);
                    why = msg;
                }
            }
        }
    }
    if (why) {
        td_shard_close(s);
        return td_err_set(err, TD_ERR_FORMAT, "%s: %s", path, why);
    }
    *out = s;
    return TD_OK;
}

uint64_t td_shard_tokens(const td_shard *s) { return s->n; }
uint64_t td_shard_docs(const td_shard *s) { return s->ndocs; }
int td_shard_vocab(const td_shard *s) { return s->vocab; }
int td_shard_token_bytes(const td_shard *s) { return s->tb; }

void td_shard_read(const td_shard *s, uint64_t start, size_t n, int32_t *out) {
    TD_ASSERT(start <= s->n && n <= s->n - start);
    const uint8_t *p = s->payload + start * (uint64_t)s->tb;
    if (s->tb == 2)
        for (size_t i = 0; i < n; i++) out[i] = (int32_t)td_le16(p + 2 * i);
    else
        for (size_t i = 0; i < n; i++) out[i] = (int32_t)td_le32(p + 4 * i);
}

// ---- data prepare ----

td_status td_shard_encode_tokenizer(void *ctx, const char *text, size_t len, td_tokens *out,
                                    td_err *err) {
    return td_tokenizer_encode((const td_tokenizer *)ctx, text, len, false, out, err);
}

td_shard_prepare_params td_shard_prepare_default_params(void) {
    td_shard_prepare_params p = {0};
    p.name = "data";
    p.sep_id = -1;
    p.docs = TD_SHARD_DOC_BLANK_LINE;
    p.split = TD_SHARD_SPLIT_DOCS;
    p.val_fraction = 0.0;
    p.seed = 1234;
    p.shard_tokens = 1ull << 26;
    return p;
}

// A set of shards being filled: <dir>/<name>-<split>-NNNNNN.tdsh.
typedef struct {
    const td_shard_prepare_params *p;
    const char *split;
    int32_t *ids;  // (cap) grown up to shard_tokens
    uint64_t n, cap, ndocs;
    int index;
} shard_set;

static td_status set_flush(shard_set *s, td_err *err) {
    if (!s->n) return TD_OK;
    char path[TD_AFILE_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s-%s-%06d.tdsh", s->p->out_dir, s->p->name, s->split,
             s->index);
    td_status st = td_shard_write(path, s->p->vocab_size, s->ids, s->n, s->ndocs, err);
    if (st) return st;
    s->index++;
    s->n = s->ndocs = 0;
    return TD_OK;
}

static td_status set_add(shard_set *s, const int32_t *ids, size_t n, td_err *err) {
    while (n) {
        uint64_t k = s->p->shard_tokens - s->n;
        if (k > n) k = n;
        if (s->n + k > s->cap) {
            uint64_t cap = s->cap ? s->cap : 1 << 16;
            while (cap < s->n + k) cap *= 2;
            if (cap > s->p->shard_tokens) cap = s->p->shard_tokens;
            int32_t *nb =
                cap <= SIZE_MAX / sizeof *nb ? realloc(s->ids, (size_t)cap * sizeof *nb) : NULL;
            if (!nb)
                return td_err_set(err, TD_ERR_NOMEM, "data prepare: out of memory (shard buffer)");
            s->ids = nb;
            s->cap = cap;
        }
        memcpy(s->ids + s->n, ids, k * sizeof *ids);
        s->n += k;
        ids += k;
        n -= k;
        if (s->n == s->p->shard_tokens) {
            td_status st = set_flush(s, err);
            if (st) return st;
        }
    }
    return TD_OK;
}

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#define BATCH_DOCS 1024  // documents encoded in parallel per round

typedef struct {
    const td_shard_prepare_params *p;
    shard_set set[2];
    td_shard_prepare_stats st;
    uint64_t doc_index;
    td_pool *pool;  // NULL: encode inline
    // The current batch of documents of one file: text spans, their ids and statuses.
    const char *text;
    size_t off[BATCH_DOCS], len[BATCH_DOCS];
    td_tokens tok[BATCH_DOCS];
    td_status status[BATCH_DOCS];
    td_err errs[BATCH_DOCS];
    int n;
    int next;  // work counter for the workers (atomic)
} prep;

static void encode_task(void *ctx, int ith, int nth) {
    prep *q = ctx;
    const td_shard_prepare_params *p = q->p;
    for (;;) {
        int i = __atomic_fetch_add(&q->next, 1, __ATOMIC_RELAXED);
        if (i >= q->n) break;
        q->tok[i].n = 0;
        q->status[i] =
            p->encode(p->encode_ctx, q->text + q->off[i], q->len[i], &q->tok[i], &q->errs[i]);
    }
}

// Routes one encoded document to train or validation (in document order: deterministic).
static td_status route(prep *q, const td_tokens *t, td_err *err) {
    const td_shard_prepare_params *p = q->p;
    if (!t->n) return TD_OK;
    size_t n = t->n + (p->sep_id >= 0);
    int v;
    if (p->split == TD_SHARD_SPLIT_DOCS) {
        double u = (double)(splitmix(p->seed ^ splitmix(q->doc_index)) >> 11) * 0x1.0p-53;
        v = u < p->val_fraction;
    } else {
        double total = (double)(q->st.tokens[0] + q->st.tokens[1] + n);
        v = (double)q->st.tokens[1] < p->val_fraction * total;
    }
    q->doc_index++;
    shard_set *s = &q->set[v];
    td_status st = TD_OK;
    if (p->sep_id >= 0 && p->sep_before) st = set_add(s, &p->sep_id, 1, err);
    if (!st) st = set_add(s, t->ids, t->n, err);
    if (!st && p->sep_id >= 0 && !p->sep_before) st = set_add(s, &p->sep_id, 1, err);
    s->ndocs++;
    q->st.docs[v]++;
    q->st.tokens[v] += n;
    return st;
}

// Encodes the batched documents (in parallel with a pool) and routes them in order.
static td_status flush_batch(prep *q, td_err *err) {
    q->next = 0;
    td_pool_run(q->pool, encode_task, q);
    td_status st = TD_OK;
    for (int i = 0; i < q->n && !st; i++) {
        if (q->status[i]) {
            if (err) *err = q->errs[i];
            st = q->status[i];
            break;
        }
        st = route(q, &q->tok[i], err);
    }
    q->n = 0;
    return st;
}

static td_status add_doc(prep *q, size_t off, size_t len, td_err *err) {
    q->off[q->n] = off;
    q->len[q->n] = len;
    q->n++;
    return q->n == BATCH_DOCS ? flush_batch(q, err) : TD_OK;
}

// Splits one file's text into documents per p->docs.
static td_status add_file(prep *q, const char *text, size_t len, td_err *err) {
    q->text = text;
    q->n = 0;
    if (q->p->docs == TD_SHARD_DOC_FILE) {
        td_status st = len ? add_doc(q, 0, len, err) : TD_OK;
        return st ? st : flush_batch(q, err);
    }
    size_t i = 0;
    while (i < len) {
        // A line [i, e) and the next line start.
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        if (q->p->docs == TD_SHARD_DOC_LINE) {
            size_t le = e > i && text[e - 1] == '\r' ? e - 1 : e;
            if (le > i) {
                td_status st = add_doc(q, i, le - i, err);
                if (st) return st;
            }
            i = e + 1;
            continue;
        }
        // Blank-line mode: extend the document until a blank line or the end; a trailing CR of
        // its last line is dropped.
        size_t start = i, end = i;
        for (;;) {
            const char *l = memchr(text + i, '\n', len - i);
            size_t le = l ? (size_t)(l - text) : len;
            int blank = 1;
            for (size_t k = i; k < le; k++)
                if (text[k] != '\r' && text[k] != ' ' && text[k] != '\t') blank = 0;
            if (blank) {
                i = le + 1;
                break;
            }
            end = le > i && text[le - 1] == '\r' ? le - 1 : le;
            i = le + 1;
            if (i >= len) break;
        }
        if (end > start) {
            td_status st = add_doc(q, start, end - start, err);
            if (st) return st;
        }
    }
    return flush_batch(q, err);
}

td_status td_shard_prepare(const td_shard_prepare_params *p, const char *const *files, int nfiles,
                           td_shard_prepare_stats *stats, td_err *err) {
    if (!p->out_dir || !p->encode || p->vocab_size <= 0 ||
        !(p->val_fraction >= 0 && p->val_fraction <= 1) || p->shard_tokens == 0 ||
        p->sep_id >= p->vocab_size || (unsigned)p->docs > TD_SHARD_DOC_FILE ||
        (unsigned)p->split > TD_SHARD_SPLIT_TOKENS)
        return td_err_set(err, TD_ERR_INVALID, "data prepare: bad parameters");
    if (!td_is_dir(p->out_dir) && mkdir(p->out_dir, 0755) != 0 && errno != EEXIST)
        return td_err_set(err, TD_ERR_IO, "%s: cannot create directory: %s", p->out_dir,
                          strerror(errno));
    prep *q = calloc(1, sizeof *q);  // large (batch arrays): not on the stack
    if (!q) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    q->p = p;
    q->set[0] = (shard_set){.p = p, .split = "train"};
    q->set[1] = (shard_set){.p = p, .split = "val"};
    td_status st = TD_OK;
    if (p->n_threads > 1 && !(q->pool = td_pool_create(p->n_threads)))
        st = td_err_set(err, TD_ERR_NOMEM, "data prepare: cannot start %d threads", p->n_threads);
    for (int f = 0; f < nfiles && !st; f++) {
        char *text;
        size_t len;
        st = td_read_file(files[f], 0, &text, &len, err);
        if (st) break;
        q->st.bytes_in += len;
        st = add_file(q, text, len, err);
        if (st) td_err_prefix(err, "%s", files[f]);
        free(text);
    }
    for (int v = 0; v < 2 && !st; v++) st = set_flush(&q->set[v], err);
    for (int v = 0; v < 2; v++) {
        q->st.shards[v] = q->set[v].index;
        free(q->set[v].ids);
    }
    for (int i = 0; i < BATCH_DOCS; i++) td_tokens_free(&q->tok[i]);
    td_pool_free(q->pool);
    if (stats) *stats = q->st;
    free(q);
    return st;
}
