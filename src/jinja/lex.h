// Internals of the Jinja front end shared by lex.c (preprocessing, lexer) and parse.c (parser):
// the tokens and the compiler state. Not a public header.
#ifndef TD_JINJA_LEX_H
#define TD_JINJA_LEX_H

#include "jinja/jinja_impl.h"

typedef enum {
    JT_TEXT, JT_NUM, JT_STR, JT_IDENT, JT_EQUALS, JT_LPAREN, JT_RPAREN, JT_OPEN_STMT, JT_CLOSE_STMT,
    JT_OPEN_EXPR, JT_CLOSE_EXPR, JT_LBRACKET, JT_RBRACKET, JT_LBRACE, JT_RBRACE, JT_COMMA, JT_DOT, JT_COLON,
    JT_PIPE, JT_ADD, JT_MUL, JT_POW, JT_CMP, JT_UNARY, JT_COMMENT, JT_NONE,
} td_jinja_tok_type;

typedef struct {
    int type;
    uint32_t pos;  // original source offset
    const char *s;
    size_t len;
} td_jinja_token;

typedef struct td_jinja_compiler {
    const char *orig;
    size_t orig_len;
    td_jinja_arena *arena;
    td_err *err;
    int failed;
    // lexer
    const char *s;
    const uint32_t *map;
    size_t n, cur;
    td_jinja_token *toks;
    size_t ntok, captok;
    // parser
    size_t p;
    int nest;
} td_jinja_compiler;

// Preprocesses src[0..len) as @huggingface/jinja's Template does and lexes the result into
// st->toks (st->orig, orig_len, arena and err set by the caller; text tokens point into an arena
// copy). Returns 1 on success; on failure st->failed is set and st->err says why.
int td_jinja_lex(td_jinja_compiler *st, const char *src, size_t len);

// Sets st's error once (the first failure wins): TD_ERR_INVALID with the line and column of the
// original source offset orig_pos.
void td_jinja_fail_at(td_jinja_compiler *st, size_t orig_pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
