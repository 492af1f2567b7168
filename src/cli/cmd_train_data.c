// Command-line front ends for BPE tokenizer training and corpus sharding (src/train/).
// Not here: the training loop (tandem train) and anything needing a model.
#include "cli/cmd_train_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/opts.h"
#include "base/log.h"
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"
#include "train/bpe_train.h"
#include "train/shards.h"
#include "train/tok_record.h"

static bool opt_special(void *ctx, const td_opt *opt, const char *v) {
    td_bpe_params *p = ctx;
    if (!*v) return fprintf(stderr, "tandem tokenizer train: --%s needs a value\n", opt->name), false;
    if (p->n_special == TD_BPE_MAX_SPECIAL)
        return fprintf(stderr, "tandem: at most %d --special tokens\n", TD_BPE_MAX_SPECIAL), false;
    p->special[p->n_special++] = v;
    return true;
}

int td_cmd_tokenizer_train(int argc, char **argv) {
    td_bpe_params p = td_bpe_default_params();
    const char *out = NULL;
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    int nfiles = 0;
    if (!files) return 1;
    bool no_bos = false, no_eos = false, no_add_bos = false;
    const td_opt opts[] = {
        {TD_OPT_I("vocab-size", &p.vocab_size, 257, 1 << 24, "N",
                  "total tokens incl. 256 bytes and special tokens (default 4096)")},
        {TD_OPT_I("min-frequency", &p.min_frequency, 1, 1L << 40, "N",
                  "stop when the best pair occurs fewer than N times (default 2)")},
        {TD_OPT_S("bos", &p.bos, "TOK", "beginning-of-text token (default <|bos|>)")},
        {TD_OPT_B("no-bos", &no_bos, "no beginning-of-text token")},
        {TD_OPT_S("eos", &p.eos, "TOK", "end-of-text token (default <|eos|>)")},
        {TD_OPT_B("no-eos", &no_eos, "no end-of-text token")},
        {TD_OPT_S("pad", &p.pad, "TOK", "padding token (default none)")},
        {TD_OPT_CB("special", opt_special, true, "TOK", "a further special token (repeatable)")},
        {TD_OPT_B("no-add-bos", &no_add_bos, "do not prepend bos when encoding with special tokens")},
        {TD_OPT_I("max-length", &p.model_max_length, 1, 1L << 30, "N",
                  "model_max_length in tokenizer_config.json (default 2048)")},
        {TD_OPT_S("out", &out, "DIR", "output directory (required)")},
    };
    const td_opts ot = {.prog = "tandem tokenizer train",
                        .usage = "usage: tandem tokenizer train [options] FILE...\n"
                                 "  Learns a byte-level BPE tokenizer (Llama 3 pre-tokenizer) from UTF-8 text files and writes\n"
                                 "  OUT/tokenizer.json and OUT/tokenizer_config.json.\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .ctx = &p,
                        .max_pos = -1};
    int pr = td_opts_parse(&ot, argc, argv, &nfiles);
    if (pr <= 0) {
        if (pr < 0) td_opts_help(&ot, stderr);
        free(files);
        return pr == 0 ? 0 : 2;
    }
    for (int i = 0; i < nfiles; i++) files[i] = argv[1 + i];
    const char *empty = (p.bos && !*p.bos) ? "--bos" : (p.eos && !*p.eos) ? "--eos" : (p.pad && !*p.pad) ? "--pad"
                        : (out && !*out) ? "--out" : NULL;
    if (empty) {
        fprintf(stderr, "tandem: %s needs a value\n", empty);
        td_opts_help(&ot, stderr);
        free(files);
        return 2;
    }
    if (no_bos) p.bos = NULL, p.add_bos = false;
    if (no_eos) p.eos = NULL;
    if (no_add_bos) p.add_bos = false;
    if (!out || !nfiles) {
        fprintf(stderr, "tandem: tokenizer train needs --out DIR and at least one input file\n");
        td_opts_help(&ot, stderr);
        free(files);
        return 2;
    }
    td_err err = {0};
    td_bpe_trainer *t = NULL;
    double t0 = td_now();
    td_status st = td_bpe_trainer_new(&p, &t, &err);
    size_t bytes = 0;
    for (int i = 0; i < nfiles && !st; i++) {
        char *text;
        size_t len;
        st = td_read_file(files[i], 0, &text, &len, &err);
        if (st) break;
        st = td_bpe_feed(t, text, len, &err);
        if (st) td_err_prefix(&err, "%s", files[i]);
        bytes += len;
        free(text);
    }
    double t1 = td_now();
    if (!st) st = td_bpe_train(t, &err);
    double t2 = td_now();
    if (!st) st = td_bpe_write(t, out, &err);
    if (st) {
        fprintf(stderr, "tandem: tokenizer train: %s\n", err.msg);
        td_bpe_trainer_free(t);
        free(files);
        return 1;
    }
    TD_LOGI(
        "tokenizer train: %zu bytes, %zu distinct words, %d merges, vocab %d; count %.2f s, merge "
        "%.2f s -> %s",
        bytes, td_bpe_word_count(t), td_bpe_merge_count(t), td_bpe_vocab_size(t), t1 - t0, t2 - t1,
        out);
    td_bpe_trainer_free(t);
    free(files);
    return 0;
}

int td_cmd_data_prepare(int argc, char **argv) {
    td_shard_prepare_params p = td_shard_prepare_default_params();
    p.val_fraction = 0.01;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    p.n_threads = ncpu > 0 ? (int)ncpu : 1;
    const char *tok_path = NULL, *sep = "eos";
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    int nfiles = 0;
    if (!files) return 1;
    int docs = -1, split = -1, sep_i = 0;
    const td_opt opts[] = {
        {TD_OPT_S("tokenizer", &tok_path, "PATH", "tokenizer.json, its directory, or a .gguf file")},
        {TD_OPT_S("out", &p.out_dir, "DIR", "output directory (required)")},
        {TD_OPT_S("name", &p.name, "NAME", "file name stem (default data)")},
        {TD_OPT_C("docs", &docs, "blank line file", "MODE", "document boundaries: blank (blank lines, default), line, file")},
        {TD_OPT_C("sep", &sep_i, "eos bos none", "MODE", "eos (after each document, default), bos (before), none")},
        {TD_OPT_F("val-fraction", &p.val_fraction, 0, 1, "F", "share for validation, 0..1 (default 0.01)")},
        {TD_OPT_C("split", &split, "docs tokens", "MODE",
                  "docs (each document by seeded hash, default) or tokens (token-balanced)")},
        {TD_OPT_I("seed", &p.seed, 0, 9.2e18, "N", "seed of the document split (default 1234)")},
        {TD_OPT_I("shard-tokens", &p.shard_tokens, 1, 1L << 40, "N", "tokens per shard file (default 67108864)")},
        {TD_OPT_I("threads", &p.n_threads, 1, 1024, "N", "encoder threads (default: online CPUs); output does not depend on it")},
    };
    const td_opts ot = {.prog = "tandem data prepare",
                        .usage = "usage: tandem data prepare --tokenizer PATH --out DIR [options] FILE...\n"
                                 "  Tokenizes UTF-8 text files into binary token shards DIR/NAME-train-NNNNNN.tdsh and\n"
                                 "  DIR/NAME-val-NNNNNN.tdsh (uint16 ids when the vocabulary fits, else uint32).\n",
                        .opts = opts,
                        .n = (int)(sizeof opts / sizeof opts[0]),
                        .max_pos = -1};
    int pr = td_opts_parse(&ot, argc, argv, &nfiles);
    if (pr <= 0) {
        if (pr < 0) td_opts_help(&ot, stderr);
        free(files);
        return pr == 0 ? 0 : 2;
    }
    for (int i = 0; i < nfiles; i++) files[i] = argv[1 + i];
    static const char *const seps[] = {"eos", "bos", "none"};
    sep = seps[sep_i];
    if (docs >= 0) p.docs = docs == 0 ? TD_SHARD_DOC_BLANK_LINE : docs == 1 ? TD_SHARD_DOC_LINE : TD_SHARD_DOC_FILE;
    if (split >= 0) p.split = split == 0 ? TD_SHARD_SPLIT_DOCS : TD_SHARD_SPLIT_TOKENS;
    if (!tok_path || !p.out_dir || !nfiles) {
        fprintf(stderr,
                "tandem: data prepare needs --tokenizer, --out and at least one input file\n");
        td_opts_help(&ot, stderr);
        free(files);
        return 2;
    }
    td_err err = {0};
    td_tokenizer *tok = NULL;
    if (td_tokenizer_load(tok_path, &tok, &err)) {
        fprintf(stderr, "tandem: data prepare: %s\n", err.msg);
        free(files);
        return 1;
    }
    p.vocab_size = td_tokenizer_vocab_size(tok);
    p.encode = td_shard_encode_tokenizer;
    p.encode_ctx = tok;
    if (strcmp(sep, "none")) {
        p.sep_before = !strcmp(sep, "bos");
        p.sep_id = p.sep_before ? td_tokenizer_bos_id(tok) : td_tokenizer_eos_id(tok);
        if (p.sep_id < 0) {
            fprintf(stderr,
                    "tandem: data prepare: the tokenizer has no %s token (use --sep none)\n", sep);
            td_tokenizer_free(tok);
            free(files);
            return 1;
        }
    }
    double t0 = td_now();
    td_shard_prepare_stats st;
    td_status s = td_shard_prepare(&p, files, nfiles, &st, &err);
    td_tokenizer_free(tok);
    free(files);
    if (s) {
        fprintf(stderr, "tandem: data prepare: %s\n", err.msg);
        return 1;
    }
    double dt = td_now() - t0;
    if (st.tokens[1] == 0)
        fprintf(stderr,
                "tandem data prepare: warning: the validation split is empty (%s); `tandem train --val` has "
                "nothing to evaluate (raise --val-fraction or give more documents)\n",
                p.val_fraction > 0 ? "no document was routed to it" : "--val-fraction 0");
    // The shards' tokenizer travels with them: `tandem train` records it in its checkpoints.
    char tdir[4096], hex[17];
    if (!td_tok_record_dir(tok_path, tdir, sizeof tdir))
        fprintf(stderr, "tandem data prepare: note: %s is not a tokenizer.json or its directory: none copied to %s\n",
                tok_path, p.out_dir);
    else if (td_tok_record_copy(tdir, p.out_dir, hex, &err))
        return fprintf(stderr, "tandem: data prepare: copying the tokenizer: %s\n", err.msg), 1;
    TD_LOGI(
        "data prepare: %llu bytes in %.2f s (%.1f MB/s); train %llu docs %llu tokens in %d shards; "
        "val %llu docs %llu tokens in %d shards -> %s",
        (unsigned long long)st.bytes_in, dt, (double)st.bytes_in / 1e6 / (dt > 0 ? dt : 1e-9),
        (unsigned long long)st.docs[0], (unsigned long long)st.tokens[0], st.shards[0],
        (unsigned long long)st.docs[1], (unsigned long long)st.tokens[1], st.shards[1], p.out_dir);
    return 0;
}
