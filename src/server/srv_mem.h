// Per-request memory for the HTTP layer: an arena (nginx-style pool: many small allocations, one free,
// cleanup callbacks run at destroy) and a growable byte buffer with a hard cap (Redis-style bounded
// output). Not thread-safe: one owner at a time.
#ifndef TD_SERVER_SRV_MEM_H
#define TD_SERVER_SRV_MEM_H

#include <stddef.h>
#include <stdbool.h>

typedef struct td_srv_arena td_srv_arena;

// block: bytes per chunk (grows by chunks; an allocation larger than block gets its own chunk).
td_srv_arena *td_srv_arena_create(size_t block);
// Frees everything allocated from the arena, after running cleanups in reverse order of registration.
void td_srv_arena_destroy(td_srv_arena *a);
// 16-byte aligned, uninitialised; NULL when out of memory. Freed only with the arena.
void *td_srv_arena_alloc(td_srv_arena *a, size_t bytes);
void *td_srv_arena_calloc(td_srv_arena *a, size_t n, size_t size);  // zeroed, overflow-checked
char *td_srv_arena_strndup(td_srv_arena *a, const char *s, size_t n);  // NUL-terminated copy
// Registers fn(arg) to run at destroy (e.g. cJSON_Delete of the parsed body). Returns false on OOM
// (then fn has NOT been registered: the caller cleans up itself).
bool td_srv_arena_cleanup(td_srv_arena *a, void (*fn)(void *), void *arg);
size_t td_srv_arena_used(const td_srv_arena *a);  // bytes obtained from malloc, for tests/limits

// Growable bytes with a cap. The owner zero-initialises it (or calls td_srv_buf_init) and frees p.
typedef struct td_srv_buf {
    char *p;
    size_t len, cap;
    size_t limit;  // 0 = unlimited; appends beyond it fail
} td_srv_buf;

void td_srv_buf_init(td_srv_buf *b, size_t limit);
void td_srv_buf_free(td_srv_buf *b);
bool td_srv_buf_append(td_srv_buf *b, const void *data, size_t n);  // false: OOM or over limit
bool td_srv_buf_printf(td_srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void td_srv_buf_consume(td_srv_buf *b, size_t n);  // drops the first n bytes

#endif
