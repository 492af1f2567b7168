// Arena and bounded buffer (see srv_mem.h). The arena is a singly linked list of malloc'd chunks.
#include "server/srv_mem.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct arena_chunk {
    struct arena_chunk *next;
    size_t cap, used;  // bytes of data[]
    _Alignas(16) unsigned char data[];
} arena_chunk;

typedef struct arena_cleanup {
    struct arena_cleanup *next;
    void (*fn)(void *);
    void *arg;
} arena_cleanup;

struct td_srv_arena {
    arena_chunk *head;
    arena_cleanup *cleanups;
    size_t block;
    size_t total;
};

td_srv_arena *td_srv_arena_create(size_t block) {
    td_srv_arena *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    a->block = block < 256 ? 256 : block;
    return a;
}

void td_srv_arena_destroy(td_srv_arena *a) {
    if (!a) return;
    for (arena_cleanup *c = a->cleanups; c; c = c->next) c->fn(c->arg);  // newest first
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *n = c->next;
        free(c);
        c = n;
    }
    free(a);
}

void *td_srv_arena_alloc(td_srv_arena *a, size_t bytes) {
    if (bytes > SIZE_MAX / 2) return NULL;
    bytes = (bytes + 15) & ~(size_t)15;
    if (bytes == 0) bytes = 16;
    arena_chunk *c = a->head;
    if (!c || c->cap - c->used < bytes) {
        size_t cap = bytes > a->block ? bytes : a->block;
        arena_chunk *n = malloc(sizeof *n + cap);
        if (!n) return NULL;
        n->cap = cap;
        n->used = 0;
        a->total += sizeof *n + cap;
        if (c && bytes > a->block) {  // oversized: keep the current chunk on top for small ones
            n->next = c->next;
            c->next = n;
        } else {
            n->next = c;
            a->head = n;
        }
        c = n;
    }
    void *p = c->data + c->used;
    c->used += bytes;
    return p;
}

void *td_srv_arena_calloc(td_srv_arena *a, size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) return NULL;
    void *p = td_srv_arena_alloc(a, n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

char *td_srv_arena_strndup(td_srv_arena *a, const char *s, size_t n) {
    char *p = td_srv_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

bool td_srv_arena_cleanup(td_srv_arena *a, void (*fn)(void *), void *arg) {
    arena_cleanup *c = td_srv_arena_alloc(a, sizeof *c);
    if (!c) return false;
    c->fn = fn;
    c->arg = arg;
    c->next = a->cleanups;
    a->cleanups = c;
    return true;
}

size_t td_srv_arena_used(const td_srv_arena *a) { return a->total; }

void td_srv_buf_init(td_srv_buf *b, size_t limit) {
    memset(b, 0, sizeof *b);
    b->limit = limit;
}

void td_srv_buf_free(td_srv_buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static bool buf_reserve(td_srv_buf *b, size_t extra) {
    if (extra > SIZE_MAX - b->len - 1) return false;
    size_t need = b->len + extra + 1;  // +1: keep room for a NUL
    if (b->limit && need > b->limit + 1) return false;
    if (need <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool td_srv_buf_append(td_srv_buf *b, const void *data, size_t n) {
    if (!buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = 0;
    return true;
}

bool td_srv_buf_printf(td_srv_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) return false;
    if ((size_t)n < sizeof small) return td_srv_buf_append(b, small, (size_t)n);
    if (!buf_reserve(b, (size_t)n)) return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void td_srv_buf_consume(td_srv_buf *b, size_t n) {
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->p, b->p + n, b->len - n);
        b->len -= n;
    }
    if (b->p) b->p[b->len] = 0;
}
