// The command-line option parser every `tandem` command uses: a table of options parsed from argv
// and printed as --help from the same table, so an accepted option cannot be missing from help.
// Not getopt: it also takes llama-server's multi-letter short names (-np) and writes typed values.
//
// Accepted forms: `--name value`, `--name=value`, `-s value` (a short name, one or more letters),
// `--` ends the options (everything after is positional), a lone `-` is positional, and so is any
// `-word` when the table has no short names (`tokenize PATH -x`). `--help` / `-h`
// print the help; `--help-options` prints the table as JSON (tests check help against it).
#ifndef TD_BASE_OPTS_H
#define TD_BASE_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

typedef enum td_opt_kind {
    TD_OPT_SECTION,  // not an option: a heading line in --help (help is the heading)
    TD_OPT_FLAG,     // no value; sets *(bool *)dst to !negate
    TD_OPT_INT,      // integer in [lo, hi] into a signed integer of `size` bytes (1, 2, 4, 8)
    TD_OPT_FLOAT,    // number in [lo, hi] into a float (size 4) or double (size 8)
    TD_OPT_STR,      // the value itself into *(const char **)dst (points into argv)
    TD_OPT_BYTES,    // a positive byte count, suffixes K, M, G (KiB, MB ...), into *(size_t *)dst
    TD_OPT_CHOICE,   // one of the space-separated `choices`; its index into *(int *)dst
    TD_OPT_FN,       // fn(ctx, opt, value) does the work (repeatable options, custom parsing);
                     //   value is NULL for an option with takes_value false
} td_opt_kind;

typedef struct td_opt td_opt;
// Returns true when the value was taken; false after printing the problem (naming the option).
typedef bool (*td_opt_fn)(void *ctx, const td_opt *opt, const char *value);

struct td_opt {
    const char *name;     // long name without "--" ("max-num-seqs")
    const char *aliases;  // NULL or more long names, space-separated ("max-seqs no-foo")
    const char *shorts;   // NULL or short names without "-", space-separated ("n np")
    td_opt_kind kind;
    void *dst;            // where the value goes (see td_opt_kind)
    size_t size;          // bytes of *dst for INT / FLOAT
    double lo, hi;        // INT / FLOAT range, inclusive
    const char *choices;  // CHOICE: space-separated accepted values
    bool negate;          // FLAG: store false
    bool takes_value;     // FN: whether a value follows
    td_opt_fn fn;         // FN
    bool multi;           // FN: in the space form, the following arguments that do not start with '-'
                          //   are more values (vLLM's nargs='+': `--served-model-name a b`)
    bool *seen;           // optional: set true when the option is given
    const char *metavar;  // help: the value's placeholder ("N", "FILE")
    const char *help;     // help text; '\n' starts a continuation line
};

// Initializers (more designators may follow: `{TD_OPT_I("port", &port, 0, 65535, "N", "..."), .shorts = "p"}`).
#define TD_OPT_S(nm, ptr, mv, hl) .name = (nm), .kind = TD_OPT_STR, .dst = (ptr), .metavar = (mv), .help = (hl)
#define TD_OPT_I(nm, ptr, l, h, mv, hl) \
    .name = (nm), .kind = TD_OPT_INT, .dst = (ptr), .size = sizeof *(ptr), .lo = (l), .hi = (h), .metavar = (mv), .help = (hl)
#define TD_OPT_F(nm, ptr, l, h, mv, hl) \
    .name = (nm), .kind = TD_OPT_FLOAT, .dst = (ptr), .size = sizeof *(ptr), .lo = (l), .hi = (h), .metavar = (mv), .help = (hl)
#define TD_OPT_B(nm, ptr, hl) .name = (nm), .kind = TD_OPT_FLAG, .dst = (ptr), .help = (hl)
#define TD_OPT_NB(nm, ptr, hl) .name = (nm), .kind = TD_OPT_FLAG, .dst = (ptr), .negate = true, .help = (hl)
#define TD_OPT_BYTES_(nm, ptr, mv, hl) .name = (nm), .kind = TD_OPT_BYTES, .dst = (ptr), .metavar = (mv), .help = (hl)
#define TD_OPT_C(nm, ptr, ch, mv, hl) .name = (nm), .kind = TD_OPT_CHOICE, .dst = (ptr), .choices = (ch), .metavar = (mv), .help = (hl)
#define TD_OPT_CB(nm, f, val, mv, hl) .name = (nm), .kind = TD_OPT_FN, .fn = (f), .takes_value = (val), .metavar = (mv), .help = (hl)
#define TD_OPT_SEC(hl) .kind = TD_OPT_SECTION, .help = (hl)

typedef struct td_opts {
    const char *prog;    // "tandem serve": prefixes every message
    const char *usage;   // printed first by --help (lines ending in '\n')
    const td_opt *opts;  // [n]
    int n;
    const char *epilog;  // NULL or text printed after the options
    void (*epilog_fn)(FILE *f);  // NULL or more text after the epilog (computed at run time)
    void *ctx;           // passed to FN options
    int max_pos;         // positional arguments accepted (-1: any number)
} td_opts;

// Parses argv[1..argc) (argv[0] is the command's name). Positional arguments are moved, in order,
// to the front of argv + 1 and counted in *n_pos (argv is reordered in place; its strings are not
// copied, so STR values point into argv). Returns 1 when parsed, 0 after printing --help or
// --help-options to stdout (the command exits 0), -1 after printing the problem to stderr (the
// command exits 2).
int td_opts_parse(const td_opts *t, int argc, char **argv, int *n_pos);

// The help text generated from the table.
void td_opts_help(const td_opts *t, FILE *f);
// The table as a JSON array: [{"name", "aliases": [...], "shorts": [...], "kind", "takes_value"}].
void td_opts_help_json(const td_opts *t, FILE *f);

// Strict value parsers shared with the commands; each prints "PROG: NAME ..." and returns false
// on a bad value. name is the option as written ("--port").
bool td_opts_int(const char *prog, const char *name, const char *v, double lo, double hi, long long *out);
bool td_opts_float(const char *prog, const char *name, const char *v, double lo, double hi, double *out);
bool td_opts_bytes(const char *prog, const char *name, const char *v, size_t *out);

#endif
