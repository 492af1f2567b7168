// Internals of the Jinja engine, shared by lex.c and parse.c (UTF-8, preprocessing, lexer, parser),
// value.c (arena, JS-compatible strings/numbers), eval.c (interpreter) and filters.c
// (filters and tests). Not a public header.
#ifndef TD_JINJA_JINJA_IMPL_H
#define TD_JINJA_JINJA_IMPL_H

#include <stdint.h>

#include "jinja/jinja.h"

// ---- arena: bump allocator, freed all at once; the render arena has a byte budget ----
typedef struct td_jinja_chunk {
    struct td_jinja_chunk *next;
    size_t cap, used;  // bytes of data[]
    char data[];
} td_jinja_chunk;

typedef struct td_jinja_arena {
    td_jinja_chunk *head;  // current chunk first
    size_t total;          // bytes malloc'd so far
    size_t budget;         // max total bytes (0 = unlimited)
    int failed;            // 1: malloc failed, 2: budget exhausted
    char *last_end;        // end of the string last built by td_jinja_concat, if still at the top
} td_jinja_arena;

void *td_jinja_alloc(td_jinja_arena *a, size_t n);  // 16-aligned; NULL + a->failed on failure
char *td_jinja_strdup(td_jinja_arena *a, const char *s, size_t n);  // NUL-terminated copy
// Returns a + b; when a ends at the top of the current chunk, grows it in place (amortised O(n)
// repeated concatenation). The bytes of a are never modified.
char *td_jinja_concat(td_jinja_arena *a, const char *s1, size_t n1, const char *s2, size_t n2);
void td_jinja_arena_free(td_jinja_arena *a);

// ---- AST ----
typedef enum {
    JN_TEXT, JN_INT, JN_FLOAT, JN_STR, JN_ARRAY, JN_TUPLE, JN_OBJECT, JN_IDENT, JN_MEMBER, JN_CALL,
    JN_UNARY, JN_BINARY, JN_FILTER, JN_TEST, JN_SELECT, JN_TERNARY, JN_SLICE, JN_KWARG, JN_SPREAD,
    JN_KWSPREAD,
    // statements
    JN_IF, JN_FOR, JN_SET, JN_MACRO, JN_CALLSTMT, JN_FILTERSTMT, JN_BREAK, JN_CONTINUE, JN_COMMENT,
} td_jinja_node_kind;

typedef enum {
    JOP_ADD, JOP_SUB, JOP_CONCAT, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_EQ, JOP_NE,
    JOP_LT, JOP_GT, JOP_LE, JOP_GE, JOP_AND, JOP_OR, JOP_IN, JOP_NOTIN, JOP_NOT, JOP_NEG, JOP_POS,
} td_jinja_op;

typedef struct td_jinja_node td_jinja_node;
struct td_jinja_node {
    int kind;        // td_jinja_node_kind
    int op;          // td_jinja_op; JN_TEST: negate; JN_MEMBER: computed; JN_CALLSTMT: has caller params
    int depth;       // 1 + max child depth (bounds every recursive walk)
    uint32_t pos;    // byte offset in the original source (for messages)
    double num;      // JN_INT, JN_FLOAT
    const char *s;   // JN_TEXT/JN_STR value, JN_IDENT/JN_MACRO/JN_KWARG name, JN_TEST test name
    size_t slen;
    td_jinja_node *a, *b, *c;        // see parse.c: parse_* for each kind's use
    td_jinja_node **list, **list2;   // children lists (args, bodies, keys/values)
    size_t n, n2;
    int uses_kwargs, uses_varargs;   // JN_MACRO / JN_CALLSTMT: body reads kwargs / varargs
};

struct td_jinja_template {
    char *src;  // original source (for line/column of runtime errors)
    size_t src_len;
    td_jinja_arena arena;  // owns the AST and decoded strings
    td_jinja_node **body;
    size_t n_body;
};

// line/column (1-based) of byte offset pos in src
void td_jinja_line_col(const char *src, size_t len, size_t pos, int *line, int *col);

// ---- values ----
typedef enum {
    JV_UNDEF, JV_NULL, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_ARRAY, JV_OBJECT, JV_NS, JV_FUNC,
} td_jinja_vtype;

typedef struct td_jinja_arr td_jinja_arr;
typedef struct td_jinja_map td_jinja_map;
typedef struct td_jinja_fn td_jinja_fn;

typedef struct td_jinja_val {
    int t;      // td_jinja_vtype
    int flag;   // JV_ARRAY: is a tuple; JV_OBJECT: is a keyword-arguments object
    size_t len; // JV_STR: bytes
    union {
        int b;
        double n;  // JV_INT and JV_FLOAT: both are JS numbers
        const char *s;
        td_jinja_arr *a;
        td_jinja_map *o;  // JV_OBJECT, JV_NS
        td_jinja_fn *f;
    } u;
} td_jinja_val;

struct td_jinja_arr {
    td_jinja_val *v;
    size_t n;
};

struct td_jinja_map {  // insertion-ordered, like a JS Map
    const char **k;
    size_t *klen;
    td_jinja_val *v;
    size_t n, cap;
    uint32_t *hidx;  // open-addressing index (entry + 1, 0 = empty) once n grows past a few keys
    size_t hcap;     // slots, a power of two >= 2 * cap
};

// JS whitespace (String.prototype.trim, /\s/): returns the byte length of the whitespace code point
// at s (0 if none)
size_t td_jinja_ws_len(const char *s, size_t n);
// Decodes one UTF-8 code point; invalid bytes decode as themselves (length 1).
uint32_t td_jinja_utf8_decode(const char *s, size_t n, size_t *adv);
size_t td_jinja_utf8_encode(uint32_t cp, char *out);  // surrogates encoded as 3 bytes too

#endif
