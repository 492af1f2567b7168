// Resume after a crash, end to end through the real binary ($TANDEM_BIN train): a run killed with
// SIGKILL (once at a random moment after its first checkpoint, once while a checkpoint is being
// written) and resumed logs exactly the losses of an uninterrupted run, bit for bit; only the last
// K checkpoints remain; a truncated or corrupt newest checkpoint is reported by name and the
// previous one loads; every run leaves its resolved configuration (train_config.json).
// Not here: the loop's unit tests (test_train_run), the checkpoint format (test_ckpt).
#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "ckpt_compare.h"
#include "test_util.h"
#include "train/ckpt.h"
#include "train/shards.h"

enum { S = 48, C = 4, K = 2, VOCAB = 64, MAXLINES = 256 };

static const char *g_bin;
static char g_dir[256], g_shard[320];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Starts `tandem train` on the test shard with the shared model flags plus `extra` (NULL-ended),
// stdout/stderr to g_dir/<tag>.out/.err. Returns the pid.
static pid_t spawn(const char *out, const char *metrics, const char *tag,
                   const char *const *extra) {
    char steps[16], ce[16], keep[16], so[400], se[400];
    snprintf(steps, sizeof steps, "%d", S);
    snprintf(ce, sizeof ce, "%d", C);
    snprintf(keep, sizeof keep, "%d", K);
    snprintf(so, sizeof so, "%s/%s.out", g_dir, tag);
    snprintf(se, sizeof se, "%s/%s.err", g_dir, tag);
    const char *argv[64];
    int n = 0;
    const char *base[] = {g_bin,          "train", "--dim",     "96",  "--layers", "2",
                          "--heads",      "4",     "--ffn",     "256", "--batch",  "4",
                          "--seq-len",    "48",    "--steps",   steps, "--lr",     "3e-3",
                          "--warmup",     "4",     "--threads", "2",   "--seed",   "7",
                          "--ckpt-every", ce,      "--keep",    keep,  "--out",    out,
                          "--metrics",    metrics, g_shard};
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) argv[n++] = base[i];
    for (int i = 0; extra && extra[i]; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid == 0) {
        int fo = open(so, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int fe = open(se, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fo < 0 || fe < 0) _exit(127);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(g_bin, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

// Waits for pid; returns its exit status, or 1000 + signal number if a signal ended it.
static int wait_pid(pid_t pid) {
    int ws = 0;
    if (waitpid(pid, &ws, 0) != pid) return -1;
    return WIFSIGNALED(ws) ? 1000 + WTERMSIG(ws) : WEXITSTATUS(ws);
}

// Number of complete checkpoints in dir; *tmp: the highest step of a checkpoint temporary
// (ckpt-<step>.tdck.tmp; 0 if none).
static int scan(const char *dir, long *tmp) {
    *tmp = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (strncmp(e->d_name, "ckpt-", 5) != 0) continue;
        if (l > 9 && !strcmp(e->d_name + l - 9, ".tdck.tmp")) {
            long s = atol(e->d_name + 5);
            if (s > *tmp) *tmp = s;
        } else if (l > 5 && !strcmp(e->d_name + l - 5, ".tdck")) {
            n++;
        }
    }
    closedir(d);
    return n;
}

// One metrics line's fields as logged (exact text: %.17g round-trips the double).
typedef struct {
    int step;
    char loss[40], norm[40], lr[40];
} mline;

static int field(const char *line, const char *key, char *out, size_t cap) {
    char k[40];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = strstr(line, k);
    if (!p) return 0;
    p += strlen(k);
    size_t n = strcspn(p, ",}");
    if (n == 0 || n >= cap || !p[n]) return 0;
    memcpy(out, p, n);
    out[n] = 0;
    return 1;
}

// Reads a metrics log; a last line cut by the kill (no closing brace) is dropped. Returns lines.
static int read_metrics(const char *path, mline *out, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024], st[24];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        if (!strchr(line, '}')) continue;
        mline *m = &out[n];
        if (field(line, "step", st, sizeof st) && field(line, "loss", m->loss, sizeof m->loss) &&
            field(line, "grad_norm", m->norm, sizeof m->norm) &&
            field(line, "lr", m->lr, sizeof m->lr)) {
            m->step = atoi(st);
            n++;
        }
    }
    fclose(f);
    return n;
}

static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

static mline g_ref[MAXLINES];
static int g_nref;
static int g_seen[S + 1];  // steps logged by the interrupted/resumed segments

// Every line of a segment's log must equal the reference run's line of the same step.
static int check_segment(const char *metrics, const char *what) {
    static mline m[MAXLINES];
    int n = read_metrics(metrics, m, MAXLINES), bad = 0;
    for (int i = 0; i < n; i++) {
        const mline *r = m[i].step >= 1 && m[i].step <= g_nref ? &g_ref[m[i].step - 1] : NULL;
        if (!r || r->step != m[i].step || strcmp(r->loss, m[i].loss) ||
            strcmp(r->norm, m[i].norm) || strcmp(r->lr, m[i].lr)) {
            if (bad++ < 3)
                fprintf(stderr, "%s: step %d: loss %s norm %s vs uninterrupted %s %s\n", what,
                        m[i].step, m[i].loss, m[i].norm, r ? r->loss : "-", r ? r->norm : "-");
        } else {
            g_seen[m[i].step] = 1;
        }
    }
    CHECK(bad == 0, "%s: %d of %d logged steps differ from the uninterrupted run", what, bad, n);
    return n ? m[0].step : -1;
}

static int file_contains(const char *path, const char *needle) {
    size_t n = 0;
    char *t = NULL;
    if (td_read_file(path, 0, &t, &n, NULL) != TD_OK) return 0;
    int r = strstr(t, needle) != NULL;
    free(t);
    return r;
}

static const char *str_or_empty(const cJSON *v) {
    const char *s = cJSON_GetStringValue(v);
    return s ? s : "";
}

static double num(const cJSON *o, const char *path) {  // "a.b" -> o.a.b (NAN if absent)
    char k[64];
    const char *dot = strchr(path, '.');
    if (dot) {
        snprintf(k, sizeof k, "%.*s", (int)(dot - path), path);
        return num(cJSON_GetObjectItemCaseSensitive(o, k), dot + 1);
    }
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, path);
    return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

// The resolved configuration next to the checkpoints: the values given on the command line, the
// resolved ones (vocabulary from the shard, head_dim) and the resume point.
static void check_config(const char *dir, double resumed_from) {
    char path[400];
    snprintf(path, sizeof path, "%s/train_config.json", dir);
    char *t = NULL;
    size_t n = 0;
    CHECK(td_read_file(path, 0, &t, &n, NULL) == TD_OK, "%s missing", path);
    cJSON *o = t ? cJSON_Parse(t) : NULL;
    free(t);
    CHECK(o != NULL, "%s: not JSON", path);
    if (!o) return;
    const struct {
        const char *key;
        double want;
    } want[] = {{"model.hidden_size", 96},
                {"model.num_hidden_layers", 2},
                {"model.num_attention_heads", 4},
                {"model.num_key_value_heads", 4},
                {"model.head_dim", 24},
                {"model.intermediate_size", 256},
                {"model.vocab_size", VOCAB},
                {"model.rope_theta", 10000},
                {"batch", 4},
                {"seq_len", 48},
                {"grad_accum", 1},
                {"threads", 2},
                {"steps", S},
                {"lr_schedule.max_lr", 3e-3f},
                {"lr_schedule.min_lr", 3e-4f},
                {"lr_schedule.warmup_steps", 4},
                {"lr_schedule.total_steps", S},
                {"grad_clip", 1},
                {"adamw.beta1", 0.9f},
                {"adamw.beta2", 0.95f},
                {"adamw.eps", 1e-8f},
                {"adamw.weight_decay", 0.1f},
                {"init_std", 0.02f},
                {"ckpt_every", C},
                {"keep", K},
                {"resumed_from_step", resumed_from}};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        double v = num(o, want[i].key);  // the options are floats: compare as floats
        CHECK((float)v == (float)want[i].want, "%s: %s = %.9g, expected %.9g", path, want[i].key, v,
              want[i].want);
    }
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(o, "shards");
    CHECK(cJSON_GetArraySize(sh) == 1 && !strcmp(str_or_empty(cJSON_GetArrayItem(sh, 0)), g_shard),
          "%s: shards", path);
    const char *strs[][2] = {
        {"precision", "fp32"}, {"gemm", "kernels"}, {"seed", "0000000000000007"}};
    for (int i = 0; i < 3; i++)
        CHECK(!strcmp(str_or_empty(cJSON_GetObjectItemCaseSensitive(o, strs[i][0])), strs[i][1]),
              "%s: %s", path, strs[i][0]);
    cJSON_Delete(o);
}

int main(void) {
    g_bin = getenv("TANDEM_BIN");
    if (!g_bin) g_bin = "build/tandem";
    CHECK(access(g_bin, X_OK) == 0, "no tandem binary at %s (set TANDEM_BIN)", g_bin);
    snprintf(g_dir, sizeof g_dir, "%s/train_resume_test", td_test_data_dir());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    CHECK(system(cmd) == 0, "mkdir %s", g_dir);
    // The kill delay varies run to run; TANDEM_RESUME_SEED replays one.
    const char *se = getenv("TANDEM_RESUME_SEED");
    unsigned seed = se ? (unsigned)strtoul(se, NULL, 10) : (unsigned)(time(NULL) ^ getpid());
    printf("seed %u (TANDEM_RESUME_SEED replays it)\n", seed);
    srand(seed);

    // A token stream with structure and noise over 64 ids.
    enum { NTOK = 30000 };
    static int32_t ids[NTOK];
    uint32_t x = 12345;
    for (int i = 0; i < NTOK; i++) {
        x = x * 1664525u + 1013904223u;
        ids[i] = (int32_t)((i % 11) * 5 + (x >> 28) % 5) % VOCAB;
    }
    snprintf(g_shard, sizeof g_shard, "%s/data.tdsh", g_dir);
    td_err err = {0};
    CHECK(td_shard_write(g_shard, VOCAB, ids, NTOK, 1, &err) == TD_OK, "shard: %s", err.msg);

    char ref[300], out[300], m[400];
    snprintf(ref, sizeof ref, "%s/ref", g_dir);
    snprintf(out, sizeof out, "%s/run", g_dir);

    // (a) The uninterrupted run.
    const double t0 = now_s();
    snprintf(m, sizeof m, "%s/ref.jsonl", g_dir);
    int rc = wait_pid(spawn(ref, m, "ref", NULL));
    const double t_run = now_s() - t0;
    CHECK(rc == 0, "uninterrupted run exited %d (see %s/ref.err)", rc, g_dir);
    g_nref = read_metrics(m, g_ref, MAXLINES);
    CHECK(g_nref == S, "uninterrupted run logged %d steps", g_nref);
    for (int i = 0; i < g_nref; i++)
        CHECK(g_ref[i].step == i + 1, "ref line %d: step %d", i, g_ref[i].step);
    printf("uninterrupted: %d steps in %.2f s, loss %s -> %s\n", g_nref, t_run,
           g_nref ? g_ref[0].loss : "-", g_nref ? g_ref[g_nref - 1].loss : "-");
    check_config(ref, -1);

    // (b1) Killed with SIGKILL at a random moment after its first checkpoint: once the run has
    // logged a random step in (C, S/2] (by progress, not time, so a loaded machine cannot let it
    // finish first), plus a random part of a step.
    snprintf(m, sizeof m, "%s/seg1.jsonl", g_dir);
    pid_t pid = spawn(out, m, "seg1", NULL);
    long tmp = 0;
    const int target = C + 1 + rand() % (S / 2 - C);
    const double t1 = now_s();
    while (count_lines(m) < target && now_s() - t1 < 60 && waitpid(pid, NULL, WNOHANG) == 0)
        usleep(200);
    usleep((useconds_t)(1e6 * t_run / S * (rand() / (double)RAND_MAX)));
    kill(pid, SIGKILL);
    rc = wait_pid(pid);
    CHECK(rc == 1000 + SIGKILL, "first segment was not killed (status %d): too fast?", rc);
    int first = check_segment(m, "segment 1");
    CHECK(first == 1, "segment 1 starts at step %d", first);

    scan(out, &tmp);
    if (tmp) printf("segment 1 was killed while writing checkpoint %ld\n", tmp);
    // (b2) Resumed, then killed as soon as its first checkpoint's temporary appears (mid-write).
    // Segment 1 may have left a temporary of the same step behind: the kill waits until segment 2
    // has logged that step itself (the log is flushed before the save), so it lands in segment
    // 2's save, not at its start.
    int64_t newest = 0;
    CHECK(td_ckpt_dir_list(out, &newest, 1) >= 1, "no checkpoint after segment 1");
    snprintf(m, sizeof m, "%s/seg2.jsonl", g_dir);
    const char *resume[] = {"--resume", NULL};
    pid = spawn(out, m, "seg2", resume);
    const double t2 = now_s();
    int mid_write = 0;
    for (;;) {
        scan(out, &tmp);
        if (tmp > newest && count_lines(m) >= tmp - newest) {
            kill(pid, SIGKILL);
            mid_write = 1;
            break;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid || now_s() - t2 > 60) break;
        usleep(100);
    }
    if (mid_write) {
        rc = wait_pid(pid);
        CHECK(rc == 1000 + SIGKILL, "second segment status %d", rc);
        long left = 0;
        scan(out, &left);
        printf("segment 2 killed while writing checkpoint %ld (temporary %s)\n", tmp,
               left ? "left behind" : "already renamed");
    } else {
        printf("note: no checkpoint temporary was seen before segment 2 ended\n");
    }
    int s2 = check_segment(m, "segment 2");
    CHECK(s2 == newest + 1, "segment 2 resumed at step %d, the newest checkpoint was %lld", s2,
          (long long)newest);
    check_config(out, s2 - 1);

    // (b3) Resumed to the end.
    snprintf(m, sizeof m, "%s/seg3.jsonl", g_dir);
    rc = wait_pid(spawn(out, m, "seg3", resume));
    CHECK(rc == 0, "final segment exited %d", rc);
    int s3 = check_segment(m, "segment 3");
    // (When segment 2 ran to the end unkilled, segment 3 has nothing left to do.)
    CHECK(mid_write ? s3 > 1 && (s3 - 1) % C == 0 : s3 == -1, "segment 3 resumed at step %d", s3);
    int covered = 0;
    for (int s = 1; s <= S; s++) covered += g_seen[s];
    CHECK(covered == S, "the segments logged %d of %d steps", covered, S);
    char fa[400], fb[400];
    snprintf(fa, sizeof fa, "%s/ckpt-%06d.tdck", ref, S);
    snprintf(fb, sizeof fb, "%s/ckpt-%06d.tdck", out, S);
    CHECK(same_tensors(fa, fb), "final weights/optimizer state differ from the uninterrupted run");

    // (c) Only the last K checkpoints remain, and no temporary.
    int64_t steps[8];
    int nck = td_ckpt_dir_list(out, steps, 8);
    CHECK(nck == K && steps[0] == S && steps[1] == S - C, "%d checkpoints left (newest %lld)", nck,
          nck > 0 ? (long long)steps[0] : -1LL);
    CHECK(scan(out, &tmp) == K && !tmp, "a checkpoint temporary was left behind");

    // (d) Truncate the newest checkpoint: resuming names it and the problem, falls back to the
    // previous one, and the rerun steps still match.
    struct stat sb;
    CHECK(stat(fb, &sb) == 0 && truncate(fb, sb.st_size / 2) == 0, "truncate %s", fb);
    snprintf(m, sizeof m, "%s/seg4.jsonl", g_dir);
    rc = wait_pid(spawn(out, m, "seg4", resume));
    CHECK(rc == 0, "resume past a truncated checkpoint exited %d", rc);
    char errp[400];
    snprintf(errp, sizeof errp, "%s/seg4.err", g_dir);
    char want[500];
    snprintf(want, sizeof want, "%s: truncated", fb);
    CHECK(file_contains(errp, want), "stderr of the resume does not say '%s'", want);
    int s4 = check_segment(m, "after truncation");
    CHECK(s4 == S - C + 1, "after truncation resumed at step %d, expected %d", s4, S - C + 1);
    CHECK(same_tensors(fa, fb), "rewritten final checkpoint differs");

    // A flipped byte in the newest: a checksum error naming the tensor; the previous one loads.
    FILE *f = fopen(fb, "r+b");
    CHECK(f != NULL, "open %s", fb);
    if (f) {
        fseek(f, -4096, SEEK_END);
        int c = fgetc(f);
        fseek(f, -4096, SEEK_END);
        fputc(c ^ 0x40, f);
        fclose(f);
    }
    snprintf(m, sizeof m, "%s/seg5.jsonl", g_dir);
    rc = wait_pid(spawn(out, m, "seg5", resume));
    CHECK(rc == 0, "resume past a corrupt checkpoint exited %d", rc);
    snprintf(errp, sizeof errp, "%s/seg5.err", g_dir);
    snprintf(want, sizeof want, "%s: tensor adam.v: checksum mismatch", fb);
    CHECK(file_contains(errp, want), "stderr of the resume does not say '%s'", want);
    CHECK(check_segment(m, "after corruption") == S - C + 1,
          "after corruption: wrong resume point");

    // Every checkpoint bad: a clear error, no training from scratch.
    nck = td_ckpt_dir_list(out, steps, 8);
    for (int i = 0; i < nck && i < 8; i++) {
        snprintf(fa, sizeof fa, "%s/ckpt-%06lld.tdck", out, (long long)steps[i]);
        CHECK(truncate(fa, 100) == 0, "truncate %s", fa);
    }
    snprintf(m, sizeof m, "%s/seg6.jsonl", g_dir);
    rc = wait_pid(spawn(out, m, "seg6", resume));
    snprintf(errp, sizeof errp, "%s/seg6.err", g_dir);
    CHECK(rc == 1 && file_contains(errp, "no valid checkpoint among 2"),
          "all checkpoints corrupt: exit %d, see %s", rc, errp);
    CHECK(read_metrics(m, g_ref, MAXLINES) == 0, "trained although no checkpoint loads");
    printf("resume points: %d, %d; total %.1f s\n", s2 - 1, s3 - 1, now_s() - t0);
    TEST_DONE();
}
