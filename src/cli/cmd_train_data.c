// Command-line front ends for BPE tokenizer training and corpus sharding (src/train/).
// Not here: the training loop (tandem train) and anything needing a model.
#include "cli/cmd_train_data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"
#include "train/bpe_train.h"
#include "train/shards.h"
#include "train/tok_record.h"

static void tokenizer_train_usage(void) {
    fprintf(stderr,
            "usage: tandem tokenizer train [options] FILE...\n"
            "  Learns a byte-level BPE tokenizer (Llama 3 pre-tokenizer) from UTF-8 text files and "
            "writes\n"
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
        } else if (!strcmp(a, "--bos") || !strcmp(a, "--eos") || !strcmp(a, "--pad") ||
                   !strcmp(a, "--special") || !strcmp(a, "--out")) {
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
    TD_LOGI(
        "tokenizer train: %zu bytes, %zu distinct words, %d merges, vocab %d; count %.2f s, merge "
        "%.2f s -> %s",
        bytes, td_bpe_word_count(t), td_bpe_merge_count(t), td_bpe_vocab_size(t), t1 - t0, t2 - t1,
        out);
    td_bpe_trainer_free(t);
    free(files);
    return 0;
}

static void data_prepare_usage(void) {
    fprintf(stderr,
            "usage: tandem data prepare --tokenizer PATH --out DIR [options] FILE...\n"
            "  Tokenizes UTF-8 text files into binary token shards DIR/NAME-train-NNNNNN.tdsh and\n"
            "  DIR/NAME-val-NNNNNN.tdsh (uint16 ids when the vocabulary fits, else uint32).\n"
            "  --tokenizer PATH    tokenizer.json, its directory, or a .gguf file\n"
            "  --name NAME         file name stem (default data)\n"
            "  --docs MODE         document boundaries: blank (blank lines, default), line, file\n"
            "  --sep MODE          eos (after each document, default), bos (before), none\n"
            "  --val-fraction F    share for validation, 0..1 (default 0.01)\n"
            "  --split MODE        docs (each document by seeded hash, default) or tokens "
            "(token-balanced)\n"
            "  --seed N            seed of the document split (default 1234)\n"
            "  --shard-tokens N    tokens per shard file (default 67108864)\n"
            "  --threads N         encoder threads (default: online CPUs); output does not depend "
            "on it\n");
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
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        long x;
        double d;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            data_prepare_usage();
            free(files);
            return 0;
        } else if (a[0] == '-' && a[1] && !v) {
            fprintf(stderr, "tandem: %s needs a value\n", a);
            ok = 0;
        } else if (!strcmp(a, "--tokenizer")) {
            tok_path = argv[++i];
        } else if (!strcmp(a, "--out")) {
            p.out_dir = argv[++i];
        } else if (!strcmp(a, "--name")) {
            p.name = argv[++i];
        } else if (!strcmp(a, "--sep")) {
            sep = argv[++i];
            ok = !strcmp(sep, "eos") || !strcmp(sep, "bos") || !strcmp(sep, "none");
            if (!ok) fprintf(stderr, "tandem: --sep expects eos, bos or none\n");
        } else if (!strcmp(a, "--docs")) {
            v = argv[++i];
            if (!strcmp(v, "blank"))
                p.docs = TD_SHARD_DOC_BLANK_LINE;
            else if (!strcmp(v, "line"))
                p.docs = TD_SHARD_DOC_LINE;
            else if (!strcmp(v, "file"))
                p.docs = TD_SHARD_DOC_FILE;
            else {
                fprintf(stderr, "tandem: --docs expects blank, line or file\n");
                ok = 0;
            }
        } else if (!strcmp(a, "--split")) {
            v = argv[++i];
            if (!strcmp(v, "docs"))
                p.split = TD_SHARD_SPLIT_DOCS;
            else if (!strcmp(v, "tokens"))
                p.split = TD_SHARD_SPLIT_TOKENS;
            else {
                fprintf(stderr, "tandem: --split expects docs or tokens\n");
                ok = 0;
            }
        } else if (!strcmp(a, "--val-fraction")) {
            ok = td_arg_float(a, argv[++i], 0, 1, &d);
            p.val_fraction = d;
        } else if (!strcmp(a, "--seed")) {
            ok = td_arg_int(a, argv[++i], 0, 0x7fffffffffffffffL, &x);
            p.seed = (uint64_t)x;
        } else if (!strcmp(a, "--threads")) {
            ok = td_arg_int(a, argv[++i], 1, 1024, &x);
            p.n_threads = (int)x;
        } else if (!strcmp(a, "--shard-tokens")) {
            ok = td_arg_int(a, argv[++i], 1, 1L << 40, &x);
            p.shard_tokens = (uint64_t)x;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tandem: unknown option %s\n", a);
            ok = 0;
        } else {
            files[nfiles++] = a;
        }
        if (!ok) {
            data_prepare_usage();
            free(files);
            return 2;
        }
    }
    if (!tok_path || !p.out_dir || !nfiles) {
        fprintf(stderr,
                "tandem: data prepare needs --tokenizer, --out and at least one input file\n");
        data_prepare_usage();
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
