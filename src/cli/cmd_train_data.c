// Command-line front ends for BPE tokenizer training and corpus sharding (src/train/).
// Not here: the training loop (tandem train) and anything needing a model.
#include "cli/cmd_train_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "cli/cli.h"
#include "train/bpe_train.h"

static void tokenizer_train_usage(void) {
    fprintf(stderr,
            "usage: tandem tokenizer train [options] FILE...\n"
            "  Learns a byte-level BPE tokenizer (Llama 3 pre-tokenizer) from UTF-8 text files and writes\n"
            "  OUT/tokenizer.json and OUT/tokenizer_config.json.\n"
            "  --vocab-size N      total tokens incl. 256 bytes and special tokens (default 4096)\n"
            "  --min-frequency N   stop when the best pair occurs fewer than N times (default 2)\n"
            "  --bos TOK | --no-bos   beginning-of-text token (default <|bos|>)\n"
            "  --eos TOK | --no-eos   end-of-text token (default <|eos|>)\n"
            "  --pad TOK           padding token (default none)\n"
            "  --special TOK       a further special token (repeatable)\n"
            "  --no-add-bos        do not prepend bos when encoding with special tokens\n"
            "  --max-length N      model_max_length in tokenizer_config.json (default 2048)\n"
            "  --out DIR           output directory (required)\n");
}

int td_cmd_tokenizer_train(int argc, char **argv) {
    td_bpe_params p = td_bpe_default_params();
    const char *out = NULL;
    const char **files = calloc((size_t)argc + 1, sizeof *files);
    int nfiles = 0;
    if (!files) return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long x;
        int ok = 1;
        if (!strcmp(a, "--vocab-size")) {
            ok = td_arg_int(a, v, 257, 1 << 24, &x);
            p.vocab_size = (int)x;
            i++;
        } else if (!strcmp(a, "--min-frequency")) {
            ok = td_arg_int(a, v, 1, 1L << 40, &x);
            p.min_frequency = x;
            i++;
        } else if (!strcmp(a, "--max-length")) {
            ok = td_arg_int(a, v, 1, 1L << 30, &x);
            p.model_max_length = (int)x;
            i++;
        } else if (!strcmp(a, "--bos") || !strcmp(a, "--eos") || !strcmp(a, "--pad") || !strcmp(a, "--special") ||
                   !strcmp(a, "--out")) {
            if (!v || !*v) {
                fprintf(stderr, "tandem: %s needs a value\n", a);
                ok = 0;
            } else if (a[2] == 'b') {
                p.bos = v;
            } else if (a[2] == 'e') {
                p.eos = v;
            } else if (a[2] == 'p') {
                p.pad = v;
            } else if (a[2] == 'o') {
                out = v;
            } else if (p.n_special == TD_BPE_MAX_SPECIAL) {
                fprintf(stderr, "tandem: at most %d --special tokens\n", TD_BPE_MAX_SPECIAL);
                ok = 0;
            } else {
                p.special[p.n_special++] = v;
            }
            i++;
        } else if (!strcmp(a, "--no-bos")) {
            p.bos = NULL;
            p.add_bos = false;
        } else if (!strcmp(a, "--no-eos")) {
            p.eos = NULL;
        } else if (!strcmp(a, "--no-add-bos")) {
            p.add_bos = false;
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenizer_train_usage();
            free(files);
            return 0;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tandem: unknown option %s\n", a);
            ok = 0;
        } else {
            files[nfiles++] = a;
        }
        if (!ok) {
            tokenizer_train_usage();
            free(files);
            return 2;
        }
    }
    if (!out || !nfiles) {
        fprintf(stderr, "tandem: tokenizer train needs --out DIR and at least one input file\n");
        tokenizer_train_usage();
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
    TD_LOGI("tokenizer train: %zu bytes, %zu distinct words, %d merges, vocab %d; count %.2f s, merge %.2f s -> %s",
            bytes, td_bpe_word_count(t), td_bpe_merge_count(t), td_bpe_vocab_size(t), t1 - t0, t2 - t1, out);
    td_bpe_trainer_free(t);
    free(files);
    return 0;
}

int td_cmd_data_prepare(int argc, char **argv) {
    fprintf(stderr, "tandem: data prepare: not implemented yet\n");
    return 1;
}
