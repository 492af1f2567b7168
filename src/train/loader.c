// Seeded, resumable window loader over token shards (behaviour documented in loader.h).
#include "train/loader.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/shards.h"

struct td_loader {
    td_loader_params p;
    int n;              // shards
    td_shard **shards;  // (n) owned
    uint64_t *first;    // (n + 1) first global window of each shard
    uint64_t W;         // windows per epoch
    uint64_t *perm;     // (W) this epoch's order
    td_loader_pos pos;
};

static uint64_t splitmix(uint64_t *s) {
    uint64_t x = (*s += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t epoch_rng(uint64_t seed, uint64_t epoch) {
    uint64_t s = seed;
    uint64_t a = splitmix(&s);
    s = a ^ (epoch * 0xd1b54a32d192ed03ull);
    return splitmix(&s);
}

// Draws epoch `e`'s permutation into l->perm and resets the position to its start.
static void draw(td_loader *l, uint64_t e) {
    l->pos.epoch = e;
    l->pos.index = 0;
    l->pos.rng = epoch_rng(l->p.seed, e);
    for (uint64_t i = 0; i < l->W; i++) l->perm[i] = i;
    if (!l->p.shuffle) return;
    uint64_t s = l->pos.rng;
    for (uint64_t i = l->W - 1; i > 0; i--) {
        // Unbiased bounded draw (rejection on the top remainder).
        uint64_t bound = i + 1, lim = UINT64_MAX - UINT64_MAX % bound, r;
        do r = splitmix(&s);
        while (r >= lim);
        uint64_t j = r % bound, t = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = t;
    }
}

td_loader_params td_loader_default_params(void) {
    td_loader_params p = {0};
    p.B = 8;
    p.T = 256;
    p.seed = 1;
    p.shuffle = true;
    p.world = 1;
    return p;
}

void td_loader_close(td_loader *l) {
    if (!l) return;
    for (int i = 0; i < l->n; i++) td_shard_close(l->shards[i]);
    free(l->shards);
    free(l->first);
    free(l->perm);
    free(l);
}

td_status td_loader_open(const td_loader_params *p, td_loader **out, td_err *err) {
    *out = NULL;
    if (p->n_paths <= 0 || !p->paths || p->B <= 0 || p->T <= 0 || p->world <= 0 || p->rank < 0 ||
        p->rank >= p->world)
        return td_err_set(err, TD_ERR_INVALID,
                          "loader: bad parameters (B %d, T %d, rank %d of %d, %d shards)", p->B,
                          p->T, p->rank, p->world, p->n_paths);
    td_loader *l = calloc(1, sizeof *l);
    if (!l) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    l->p = *p;
    l->p.paths = NULL;  // not kept
    l->shards = calloc((size_t)p->n_paths, sizeof *l->shards);
    l->first = calloc((size_t)p->n_paths + 1, sizeof *l->first);
    td_status st =
        (!l->shards || !l->first) ? td_err_set(err, TD_ERR_NOMEM, "out of memory") : TD_OK;
    for (int i = 0; i < p->n_paths && !st; i++) {
        st = td_shard_open(p->paths[i], &l->shards[i], err);
        if (st) break;
        l->n = i + 1;
        if (td_shard_vocab(l->shards[i]) != td_shard_vocab(l->shards[0]))
            st = td_err_set(err, TD_ERR_INVALID, "%s: vocabulary %d differs from %s's %d",
                            p->paths[i], td_shard_vocab(l->shards[i]), p->paths[0],
                            td_shard_vocab(l->shards[0]));
        uint64_t n = td_shard_tokens(l->shards[i]);
        l->first[i + 1] = l->first[i] + (n > 0 ? (n - 1) / (uint64_t)p->T : 0);
    }
    if (!st) {
        l->W = l->first[l->n];
        uint64_t need = (uint64_t)p->B * (uint64_t)p->world;
        if (l->W < need)
            st = td_err_set(err, TD_ERR_INVALID,
                            "loader: %llu windows of %d+1 tokens, a step needs %llu",
                            (unsigned long long)l->W, p->T, (unsigned long long)need);
        else if (!(l->perm = malloc(l->W * sizeof *l->perm)))
            st = td_err_set(err, TD_ERR_NOMEM, "loader: out of memory for %llu windows",
                            (unsigned long long)l->W);
    }
    if (st) {
        td_loader_close(l);
        return st;
    }
    draw(l, 0);
    *out = l;
    return TD_OK;
}

void td_loader_next(td_loader *l, int32_t *tokens) {
    uint64_t step = (uint64_t)l->p.B * (uint64_t)l->p.world;
    if (l->pos.index + step > l->W) draw(l, l->pos.epoch + 1);
    const uint64_t *w = l->perm + l->pos.index + (uint64_t)l->p.rank * (uint64_t)l->p.B;
    size_t row = (size_t)l->p.T + 1;
    for (int b = 0; b < l->p.B; b++) {
        // The shard holding window w[b]: the last s with first[s] <= w[b].
        int lo = 0, hi = l->n - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) / 2;
            if (l->first[mid] <= w[b])
                lo = mid;
            else
                hi = mid - 1;
        }
        uint64_t start = (w[b] - l->first[lo]) * (uint64_t)l->p.T;
        td_shard_read(l->shards[lo], start, row, tokens + (size_t)b * row);
    }
    l->pos.index += step;
}

td_loader_pos td_loader_tell(const td_loader *l) { return l->pos; }

td_status td_loader_seek(td_loader *l, const td_loader_pos *pos, td_err *err) {
    uint64_t step = (uint64_t)l->p.B * (uint64_t)l->p.world;
    if (pos->index % step || pos->index > l->W)
        return td_err_set(err, TD_ERR_INVALID,
                          "loader position: index %llu is not a step boundary of this data",
                          (unsigned long long)pos->index);
    if (pos->rng != epoch_rng(l->p.seed, pos->epoch))
        return td_err_set(err, TD_ERR_INVALID,
                          "loader position: rng state does not match seed %llu, epoch %llu",
                          (unsigned long long)l->p.seed, (unsigned long long)pos->epoch);
    draw(l, pos->epoch);
    l->pos.index = pos->index;
    return TD_OK;
}

uint64_t td_loader_windows(const td_loader *l) { return l->W; }
uint64_t td_loader_steps_per_epoch(const td_loader *l) {
    return l->W / ((uint64_t)l->p.B * (uint64_t)l->p.world);
}
int td_loader_vocab(const td_loader *l) { return td_shard_vocab(l->shards[0]); }

int td_loader_pos_format(const td_loader_pos *pos, char *buf, size_t cap) {
    return snprintf(buf, cap,
                    "{\"epoch\":%" PRIu64 ",\"index\":%" PRIu64 ",\"rng\":\"%016" PRIx64 "\"}",
                    pos->epoch, pos->index, pos->rng);
}

static int get_u53(const cJSON *o, const char *key, uint64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(uint64_t)v->valuedouble)
        return 0;
    *out = (uint64_t)v->valuedouble;
    return 1;
}

td_status td_loader_pos_parse(const char *json, td_loader_pos *out, td_err *err) {
    cJSON *o = cJSON_Parse(json);
    td_status st = TD_OK;
    const cJSON *r = o ? cJSON_GetObjectItemCaseSensitive(o, "rng") : NULL;
    char *end = NULL;
    if (!cJSON_IsObject(o))
        st = td_err_set(err, TD_ERR_FORMAT, "loader position: not a JSON object");
    else if (!get_u53(o, "epoch", &out->epoch))
        st = td_err_set(err, TD_ERR_FORMAT, "loader position: missing or bad \"epoch\"");
    else if (!get_u53(o, "index", &out->index))
        st = td_err_set(err, TD_ERR_FORMAT, "loader position: missing or bad \"index\"");
    else if (!cJSON_IsString(r) || strlen(r->valuestring) != 16 ||
             (out->rng = strtoull(r->valuestring, &end, 16), *end))
        st = td_err_set(err, TD_ERR_FORMAT,
                        "loader position: missing or bad \"rng\" (16 hex digits)");
    cJSON_Delete(o);
    return st;
}
