// The newcomer path, end to end: the shell block of docs/training.md's tutorial is extracted and
// run as written (its /tmp/tutorial replaced by a fresh directory, its port 8080 by a free one),
// so the doc cannot drift from the code; the served model must answer the completion. Then the
// behaviours the tutorial promises: the tokenizer recorded in the checkpoint (export without
// --tokenizer; refused when none is known or the copy changed), `train` without --out, the empty
// validation warning, and the progress line (one per step through a pipe; rewritten in place on
// a terminal, through script(1)).
#include <arpa/inet.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/file.h"
#include "run_cmd.h"
#include "test_util.h"

static int free_port(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    int port = 0;
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0) close(s);
    return port;
}

// Replaces every occurrence of from by to in s (malloc'd result; s is freed).
static char *replace_all(char *s, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to), n = 0;
    for (const char *p = strstr(s, from); p; p = strstr(p + fl, from)) n++;
    char *out = malloc(strlen(s) + n * (tl > fl ? tl - fl : 0) + 1), *o = out;
    if (!out) return free(s), NULL;
    const char *p = s;
    for (const char *q; (q = strstr(p, from)); p = q + fl) {
        memcpy(o, p, (size_t)(q - p));
        o += q - p;
        memcpy(o, to, tl);
        o += tl;
    }
    strcpy(o, p);
    free(s);
    return out;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

static char *run(const char *cmd, int *st) {
    char *out = td_test_run(cmd, st);
    return out ? out : calloc(1, 1);
}

int main(void) {
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || !*bin) bin = "build/tandem";
    CHECK(access(bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", bin);
    char *doc = NULL;
    td_err err;
    CHECK(td_read_file("docs/training.md", 0, &doc, NULL, &err) == TD_OK, "docs/training.md: %s", err.msg);
    if (td_test_failed) TEST_DONE();

    // The block between the markers, as written.
    const char *b = strstr(doc, "<!-- tutorial:begin -->\n```sh\n"), *e = b ? strstr(b, "\n```\n<!-- tutorial:end -->") : NULL;
    CHECK(b && e, "docs/training.md has the tutorial block between its markers");
    if (td_test_failed) TEST_DONE();
    b += strlen("<!-- tutorial:begin -->\n```sh\n");
    char *script = strndup(b, (size_t)(e - b) + 1);
    free(doc);
    char dir[] = "/tmp/tandem_tutorial_XXXXXX", port[16], bindir[1024], cmd[8192];
    CHECK(mkdtemp(dir) != NULL, "temporary directory");
    snprintf(port, sizeof port, "%d", free_port());
    script = replace_all(script, "/tmp/tutorial", dir);
    script = replace_all(script, "8080", port);
    char path[1200];
    snprintf(path, sizeof path, "%s/tutorial.sh", dir);
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(script, f) >= 0 && fclose(f) == 0, "write %s", path);
    free(script);
    char *slash = strrchr(bin, '/');
    snprintf(bindir, sizeof bindir, "%.*s", slash ? (int)(slash - bin) : 1, slash ? bin : ".");
    char absdir[PATH_MAX];
    CHECK(realpath(bindir, absdir) != NULL, "the directory of %s", bin);
    snprintf(bindir, sizeof bindir, "%.1000s", absdir);
    // `tandem` must be the one under test: link it into a directory of its own, first on PATH.
    snprintf(cmd, sizeof cmd, "mkdir -p %s/bin && ln -sf %s/%s %s/bin/tandem", dir, bindir, slash ? slash + 1 : bin, dir);
    CHECK(system(cmd) == 0, "link tandem");

    int st;
    snprintf(cmd, sizeof cmd, "PATH=%s/bin:$PATH timeout 900 bash -eu %s 2>%s/stderr.txt", dir, path, dir);
    char *out = run(cmd, &st);
    CHECK(st == 0, "the tutorial runs (exit %d); stdout:\n%s", st, out);
    if (st != 0) {
        snprintf(cmd, sizeof cmd, "tail -30 %s/stderr.txt >&2", dir);
        if (system(cmd)) {}
    }
    // The tutorial's request samples (unseeded) up to max_tokens 16: the model may end early with
    // its EOS ("stop"); exactly 16 tokens means "length".
    const char *ct = strstr(out, "\"completion_tokens\":");
    int n_ct = ct ? atoi(ct + strlen("\"completion_tokens\":")) : -1;
    const char *want_finish = n_ct == 16 ? "\"finish_reason\":\"length\"" : "\"finish_reason\":\"stop\"";
    CHECK(strstr(out, "\"object\":\"text_completion\"") && strstr(out, "\"text\":\"") && n_ct >= 1 && n_ct <= 16 &&
              strstr(out, want_finish),
          "the served model answered the completion (1-16 tokens, finish_reason to match):\n%s", out);
    CHECK(count(out, "\nstep ") + !strncmp(out, "step ", 5) == 150 && !strchr(out, '\r'),
          "not a terminal: one progress line per step, no carriage returns");
    CHECK(count(out, "val ") == 3, "three evaluations (every 50 steps)");
    free(out);
    const char *want[] = {"loss.png", "metrics.jsonl", "data/tokenizer.json", "ckpt/tokenizer.json", "model/tokenizer.json",
                          "model/model.safetensors"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, want[i]);
        CHECK(td_file_exists(path), "%s written", want[i]);
    }

    // export: the copy beside the checkpoint must still hash to what the checkpoint records.
    snprintf(cmd, sizeof cmd, "cp %s/ckpt/tokenizer.json %s/tok.bak && printf ' ' >> %s/ckpt/tokenizer.json && "
                              "%s export %s/ckpt -o %s/m2 2>&1", dir, dir, dir, bin, dir, dir);
    out = run(cmd, &st);
    CHECK(st == 1 && strstr(out, "has changed since training") && !td_is_dir(strcat(strcpy(path, dir), "/m2")),
          "a changed tokenizer copy is refused (exit %d):\n%s", st, out);
    free(out);
    snprintf(cmd, sizeof cmd, "rm %s/ckpt/tokenizer.json && %s export %s/ckpt -o %s/m2 2>&1", dir, bin, dir, dir);
    out = run(cmd, &st);
    CHECK(st == 1 && strstr(out, "is missing"), "a missing tokenizer copy is refused (exit %d):\n%s", st, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s export %s/ckpt -o %s/m2 --tokenizer %s/tok 2>&1", bin, dir, dir, dir);
    out = run(cmd, &st);
    CHECK(st == 0, "--tokenizer overrides the record (exit %d):\n%s", st, out);
    free(out);

    // Shards without a tokenizer beside them: train says so, export refuses.
    snprintf(cmd, sizeof cmd,
             "mkdir -p %s/bare && cp %s/data/data-train-000000.tdsh %s/bare/ && "
             "%s train --dim 32 --layers 1 --heads 2 --batch 2 --seq-len 16 --steps 2 --out %s/bare-ckpt "
             "%s/bare/data-train-000000.tdsh 2>&1 >/dev/null && %s export %s/bare-ckpt -o %s/m3 2>&1",
             dir, dir, dir, bin, dir, dir, bin, dir, dir);
    out = run(cmd, &st);
    CHECK(st == 1 && strstr(out, "the checkpoints record no tokenizer") && strstr(out, "no tokenizer known"),
          "no tokenizer: train notes it, export refuses (exit %d):\n%s", st, out);
    free(out);

    // train without --out; data prepare with an empty validation split.
    snprintf(cmd, sizeof cmd,
             "%s train --dim 32 --layers 1 --heads 2 --batch 2 --seq-len 16 --steps 2 %s/data/data-train-000000.tdsh "
             "2>&1 >/dev/null", bin, dir);
    out = run(cmd, &st);
    CHECK(st == 0 && strstr(out, "no checkpoint will be written"), "train without --out says so:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s data prepare --tokenizer %s/tok --out %s/d0 --val-fraction 0 %s/corpus.txt 2>&1", bin,
             dir, dir, dir);
    out = run(cmd, &st);
    CHECK(st == 0 && strstr(out, "validation split is empty"), "empty validation split warned:\n%s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s data prepare --tokenizer %s/tok --out %s/d1 --val-fraction 0.1 %s/corpus.txt 2>&1", bin,
             dir, dir, dir);
    out = run(cmd, &st);
    CHECK(st == 0 && !strstr(out, "validation split is empty"), "no warning with a validation split:\n%s", out);
    free(out);

    // On a terminal (script(1) gives one): the progress line is rewritten in place.
    if (access("/usr/bin/script", X_OK) == 0) {
        snprintf(cmd, sizeof cmd,
                 "script -q -e -c \"%s train --dim 32 --layers 1 --heads 2 --batch 2 --seq-len 16 --steps 20 "
                 "%s/data/data-train-000000.tdsh\" /dev/null 2>&1", bin, dir);
        out = run(cmd, &st);
        CHECK(st == 0 && count(out, "\rstep ") == 20 && count(out, "\033[K") == 20 && count(out, "\033[K\r\n") +
                  count(out, "\033[K\n") == 1,
              "terminal: 20 in-place updates, one kept line (exit %d)", st);
        free(out);
    } else {
        printf("script(1) not installed: the terminal form of the progress line is not checked here\n");
    }

    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "clean up");
    TEST_DONE();
}
