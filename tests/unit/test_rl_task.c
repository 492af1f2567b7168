// RL tasks (rl/task.h): addition problems against an independent string addition, determinism in
// (seed, split, index), train and eval splits disjoint (200k problems each; and exhaustively on
// 2-digit operands, where a leak would be certain), operand lengths uniform; the reward on exact,
// wrong, malformed, leading-zero, empty and overlong completions; the file task with real external
// scorers (sh/awk in a temp dir): correct rewards, one that exits early, one that hangs (timeout
// honoured in bounded time, its process group killed, no zombie), one that closes its output and
// lingers, garbage / NaN / out-of-range / too many lines; malformed prompts files (line numbers);
// `tandem rl data` output equal to the task's problems, --group, `tandem rl eval --json` on the
// reference model (the binary: TANDEM_BIN, set by ctest).
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rl/task.h"
#include "run_cmd.h"
#include "test_util.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Decimal string addition, digit by digit from the right: the oracle for the task's answers.
static void str_add(const char *a, size_t la, const char *b, size_t lb, char *out) {
    char tmp[64];
    int n = 0, carry = 0;
    for (size_t i = 0; i < la || i < lb || carry; i++) {
        int d = carry;
        if (i < la) d += a[la - 1 - i] - '0';
        if (i < lb) d += b[lb - 1 - i] - '0';
        tmp[n++] = (char)('0' + d % 10);
        carry = d / 10;
    }
    for (int i = 0; i < n; i++) out[i] = tmp[n - 1 - i];
    out[n] = 0;
}

// Splits "A+B=" into its operands; false if it is not that shape.
static bool parse_prompt(const char *p, const char **a, size_t *la, const char **b, size_t *lb) {
    const char *plus = strchr(p, '+'), *eq = strchr(p, '=');
    if (!plus || !eq || eq < plus || eq[1]) return false;
    *a = p, *la = (size_t)(plus - p);
    *b = plus + 1, *lb = (size_t)(eq - plus - 1);
    for (const char *s = p; s < eq; s++)
        if (s != plus && (*s < '0' || *s > '9')) return false;
    return *la > 0 && *lb > 0;
}

// Open-addressing set of 64-bit keys (0 is never a key: pairs are encoded with a high bit set).
typedef struct kset {
    uint64_t *k;
    size_t cap;
} kset;
static void kset_init(kset *s, size_t cap) {
    s->cap = cap;
    s->k = calloc(cap, sizeof *s->k);
}
static bool kset_has(const kset *s, uint64_t key) {
    for (size_t i = (key * 0x9e3779b97f4a7c15ull) % s->cap;; i = (i + 1) % s->cap) {
        if (s->k[i] == key) return true;
        if (!s->k[i]) return false;
    }
}
static void kset_add(kset *s, uint64_t key) {
    for (size_t i = (key * 0x9e3779b97f4a7c15ull) % s->cap;; i = (i + 1) % s->cap) {
        if (s->k[i] == key) return;
        if (!s->k[i]) {
            s->k[i] = key;
            return;
        }
    }
}
static uint64_t pair_key(const char *a, size_t la, const char *b, size_t lb) {
    uint64_t x = strtoull(a, NULL, 10), y = strtoull(b, NULL, 10);
    (void)la, (void)lb;
    return (1ull << 63) | ((x << 24) ^ y);  // x < 10^6 < 2^20 and y < 2^24 here: injective
}

static td_rl_task make_add(uint64_t seed, int lo, int hi) {
    td_rl_task_params p = td_rl_task_default_params();
    p.seed = seed;
    p.min_digits = lo;
    p.max_digits = hi;
    td_rl_task t;
    td_err err = {0};
    td_status st = td_rl_task_create(&p, &t, &err);
    CHECK(st == TD_OK, "create addition: %s", err.msg);
    return t;
}

static void test_addition_problems(void) {
    td_rl_task t = make_add(7, 4, 6), t2 = make_add(7, 4, 6), t3 = make_add(8, 4, 6);
    CHECK(t.stop && !strcmp(t.stop, "\n"), "stop string is a newline");
    CHECK(!strcmp(t.vt->name, "addition"), "name");
    const int N = 200000;
    kset seen[2];
    kset_init(&seen[0], 1 << 20);
    kset_init(&seen[1], 1 << 20);
    long bad_shape = 0, bad_sum = 0, bad_len = 0, lead0 = 0, nondet = 0, same_other_seed = 0, leak = 0;
    long len_count[2][8] = {{0}};
    td_err err = {0};
    for (int sp = 0; sp < 2; sp++) {
        for (int i = 0; i < N; i++) {
            td_rl_problem pr, pr2, pr3;
            if (t.vt->problem(t.ctx, (td_rl_split)sp, (uint64_t)i, &pr, &err)) {
                CHECK(0, "problem %d: %s", i, err.msg);
                break;
            }
            const char *a, *b;
            size_t la, lb;
            if (!parse_prompt(pr.prompt, &a, &la, &b, &lb)) {
                bad_shape++;
                continue;
            }
            if (la < 4 || la > 6 || lb < 4 || lb > 6) bad_len++;
            else len_count[sp][la]++, len_count[sp][lb]++;
            if (a[0] == '0' || b[0] == '0') lead0++;
            char want[64];
            str_add(a, la, b, lb, want);
            if (strcmp(want, pr.answer)) {
                if (bad_sum++ < 3) fprintf(stderr, "  %s -> %s, want %s\n", pr.prompt, pr.answer, want);
            }
            uint64_t key = pair_key(a, la, b, lb);
            if (sp == 1 && kset_has(&seen[0], key)) leak++;
            kset_add(&seen[sp], key);
            if (i % 97 == 0) {  // same (seed, split, index) from another handle, out of order
                t2.vt->problem(t2.ctx, (td_rl_split)sp, (uint64_t)i, &pr2, &err);
                if (strcmp(pr.prompt, pr2.prompt) || strcmp(pr.answer, pr2.answer)) nondet++;
                t3.vt->problem(t3.ctx, (td_rl_split)sp, (uint64_t)i, &pr3, &err);
                if (!strcmp(pr.prompt, pr3.prompt)) same_other_seed++;
            }
        }
    }
    CHECK(bad_shape == 0, "%ld prompts not of the form A+B=", bad_shape);
    CHECK(bad_sum == 0, "%ld wrong answers", bad_sum);
    CHECK(bad_len == 0, "%ld operands outside 4..6 digits", bad_len);
    CHECK(lead0 == 0, "%ld operands with a leading zero", lead0);
    CHECK(nondet == 0, "%ld problems differ between two handles of the same seed", nondet);
    CHECK(same_other_seed < 5, "%ld problems equal under another seed", same_other_seed);
    CHECK(leak == 0, "%ld eval problems are also train problems", leak);
    for (int sp = 0; sp < 2; sp++)
        for (int l = 4; l <= 6; l++) {
            double f = (double)len_count[sp][l] / (2.0 * N);
            CHECK(fabs(f - 1.0 / 3) < 0.01, "split %d: %d-digit operands %.4f of all, want 1/3", sp, l, f);
        }
    // A large index is as cheap and as valid as a small one.
    td_rl_problem big;
    CHECK(t.vt->problem(t.ctx, TD_RL_SPLIT_TRAIN, UINT64_MAX - 3, &big, &err) == TD_OK, "index 2^64-4: %s", err.msg);
    free(seen[0].k), free(seen[1].k);

    // 2-digit operands: 8100 pairs. 200k problems per split reach every pair of their split, so a
    // split that let any pair through both sides would show it here.
    td_rl_task s = make_add(3, 2, 2), s9 = make_add(99, 2, 2);
    static unsigned char owner[100][100];  // bit 0: seen in train, bit 1: in eval
    memset(owner, 0, sizeof owner);
    for (int sp = 0; sp < 2; sp++)
        for (int i = 0; i < N; i++) {
            td_rl_problem pr;
            td_rl_task *tt = i % 2 ? &s9 : &s;  // two seeds: the split must not depend on the seed
            if (tt->vt->problem(tt->ctx, (td_rl_split)sp, (uint64_t)i, &pr, &err)) break;
            int x = atoi(pr.prompt), y = atoi(strchr(pr.prompt, '+') + 1);
            if (x >= 10 && x < 100 && y >= 10 && y < 100) owner[x][y] |= (unsigned char)(1 << sp);
        }
    int both = 0, n_train = 0, n_eval = 0, none = 0;
    for (int x = 10; x < 100; x++)
        for (int y = 10; y < 100; y++) {
            both += owner[x][y] == 3;
            n_train += owner[x][y] == 1;
            n_eval += owner[x][y] == 2;
            none += owner[x][y] == 0;
        }
    CHECK(both == 0, "%d two-digit pairs in both splits", both);
    CHECK(none < 10, "%d two-digit pairs in neither split", none);
    CHECK(n_train > 3600 && n_eval > 3600, "splits of 8100 pairs: %d train, %d eval", n_train, n_eval);
    td_rl_task_free(&s), td_rl_task_free(&s9);
    td_rl_task_free(&t), td_rl_task_free(&t2), td_rl_task_free(&t3);

    // Bad parameters are errors, not asserts.
    td_rl_task_params p = td_rl_task_default_params();
    td_rl_task bad;
    p.min_digits = 5, p.max_digits = 4;
    CHECK(td_rl_task_create(&p, &bad, &err) == TD_ERR_INVALID && !bad.vt, "min > max refused");
    p.min_digits = 1, p.max_digits = TD_RL_ADDITION_MAX_DIGITS + 1;
    CHECK(td_rl_task_create(&p, &bad, &err) == TD_ERR_INVALID, "max over the cap refused");
    p = td_rl_task_default_params();
    p.name = "subtraction";
    CHECK(td_rl_task_create(&p, &bad, &err) == TD_ERR_INVALID && strstr(err.msg, "subtraction"),
          "unknown task named: %s", err.msg);
    td_rl_task_free(&bad);  // zeroed: fine
    td_rl_task_free(NULL);

    // Longest operands: 11 digits, a 12-digit sum.
    td_rl_task l = make_add(5, 11, 11);
    for (int i = 0; i < 1000; i++) {
        td_rl_problem pr;
        l.vt->problem(l.ctx, TD_RL_SPLIT_EVAL, (uint64_t)i, &pr, &err);
        const char *a, *b;
        size_t la, lb;
        char want[64];
        if (!parse_prompt(pr.prompt, &a, &la, &b, &lb) || la != 11 || lb != 11) {
            CHECK(0, "11-digit problem: %s", pr.prompt);
            break;
        }
        str_add(a, la, b, lb, want);
        if (strcmp(want, pr.answer)) {
            CHECK(0, "11-digit sum %s%s, want %s", pr.prompt, pr.answer, want);
            break;
        }
    }
    td_rl_task_free(&l);
}

static void test_addition_reward(void) {
    struct {
        const char *ans, *comp;
        double want;
    } cases[] = {
        {"95198", "95198", 1.0},          // exact
        {"95198", "95197", 0.1},          // wrong, well formed
        {"95198", "9519", 0.1},           // a prefix: wrong
        {"95198", "951980", 0.1},         // longer: wrong
        {"5", "0", 0.1},                  // "0" is well formed
        {"95198", "095198", 0.0},         // leading zero
        {"95198", "00", 0.0},             // leading zero
        {"95198", "", 0.0},               // empty
        {"95198", " 95198", 0.0},         // space
        {"95198", "95198 ", 0.0},         // trailing space
        {"95198", "95198\n", 0.0},        // the stop string is never part of a completion
        {"95198", "-95198", 0.0},         // sign
        {"95198", "+95198", 0.0},         // sign
        {"95198", "9519a", 0.0},          // not a digit
        {"95198", "123456789012", 0.1},   // 12 digits: well formed
        {"95198", "1234567890123", 0.0},  // 13: overlong
        {"95198", "٣", 0.0},              // a non-ASCII digit
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double r = td_rl_addition_reward(cases[i].ans, cases[i].comp, strlen(cases[i].comp));
        CHECK(r == cases[i].want, "reward(\"%s\", \"%s\") = %g, want %g", cases[i].ans, cases[i].comp, r,
              cases[i].want);
    }
    // len is honoured: no reliance on a NUL.
    CHECK(td_rl_addition_reward("951", "95198", 3) == 1.0, "a length-3 view of 95198 is 951");
    CHECK(td_rl_addition_reward("95198", "95198", 4) == 0.1, "a length-4 view is wrong");
    CHECK(td_rl_addition_reward("95198", NULL, 0) == 0.0, "NULL completion");
    // Through the task's score slot.
    td_rl_task t = make_add(1, 4, 6);
    td_rl_problem pr;
    td_err err = {0};
    t.vt->problem(t.ctx, TD_RL_SPLIT_EVAL, 0, &pr, &err);
    char wrong[TD_RL_ANSWER_CAP];
    snprintf(wrong, sizeof wrong, "%s", pr.answer);
    wrong[0] = wrong[0] == '9' ? '1' : (char)(wrong[0] + 1);
    const td_rl_problem *ps[4] = {&pr, &pr, &pr, &pr};
    const char *cs[4] = {pr.answer, wrong, "x", ""};
    size_t ls[4] = {strlen(pr.answer), strlen(wrong), 1, 0};
    double r[4] = {-1, -1, -1, -1};
    CHECK(t.vt->score(t.ctx, ps, cs, ls, 4, r, &err) == TD_OK, "score: %s", err.msg);
    CHECK(r[0] == 1.0 && r[1] == 0.1 && r[2] == 0.0 && r[3] == 0.0, "scores %g %g %g %g", r[0], r[1], r[2], r[3]);
    td_rl_task_free(&t);
}

// ---- the file task

static char g_dir[256];

static void write_file(const char *name, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_dir, name); }

// No child of ours is left unreaped (a zombie) or running.
static void check_no_children(const char *what) {
    int st;
    pid_t w = waitpid(-1, &st, WNOHANG);
    CHECK(w == -1 && errno == ECHILD, "%s: a child process is left (waitpid %d)", what, (int)w);
}

static td_status file_task(const char *scorer, int timeout_ms, td_rl_task *t, td_err *err) {
    char prompts[512];
    path_of(prompts, sizeof prompts, "prompts.jsonl");
    td_rl_task_params p = td_rl_task_default_params();
    p.name = "file";
    p.prompts = prompts;
    p.scorer = scorer;
    p.scorer_timeout_ms = timeout_ms;
    return td_rl_task_create(&p, t, err);
}

static td_status score3(td_rl_task *t, double *r, td_err *err) {
    td_rl_problem pr[3];
    for (int i = 0; i < 3; i++) t->vt->problem(t->ctx, TD_RL_SPLIT_TRAIN, (uint64_t)i, &pr[i], err);
    const td_rl_problem *ps[3] = {&pr[0], &pr[1], &pr[2]};
    // problem 0 answered exactly, 1 wrongly, 2 with nothing.
    const char *cs[3] = {pr[0].answer, "nope", ""};
    size_t ls[3] = {strlen(pr[0].answer), 4, 0};
    return t->vt->score(t->ctx, ps, cs, ls, 3, r, err);
}

static void test_file_task(void) {
    char tmpl[] = "/tmp/td_rl_task_XXXXXX";
    if (!mkdtemp(tmpl)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(g_dir, sizeof g_dir, "%s", tmpl);
    // 25 records and a blank line: records 10 and 20 are eval.
    char text[8192] = "";
    for (int r = 1; r <= 25; r++) {
        char line[128];
        snprintf(line, sizeof line, "{\"prompt\": \"q%d? \", \"answer\": \"a%d\"}\n%s", r, r, r == 12 ? "\n" : "");
        strcat(text, line);
    }
    write_file("prompts.jsonl", text);
    // The reference scorer: 1 when the completion equals the answer, else 0 (awk on the JSON that
    // the task writes: "prompt", "answer", "completion" in that order, no quotes in these strings).
    write_file("exact.sh",
               "awk '{ a = $0; sub(/.*\"answer\":\"/, \"\", a); sub(/\".*/, \"\", a);\n"
               "       c = $0; sub(/.*\"completion\":\"/, \"\", c); sub(/\".*/, \"\", c);\n"
               "       print (a == c) ? 1 : 0 }'\n");
    char cmd[1024];
    td_err err = {0};
    td_rl_task t;
    snprintf(cmd, sizeof cmd, "sh %s/exact.sh", g_dir);
    CHECK(file_task(cmd, 5000, &t, &err) == TD_OK, "file task: %s", err.msg);
    if (!t.vt) return;
    CHECK(t.stop && !strcmp(t.stop, "\n"), "default stop");
    td_rl_problem pr;
    CHECK(t.vt->problem(t.ctx, TD_RL_SPLIT_EVAL, 0, &pr, &err) == TD_OK && !strcmp(pr.prompt, "q10? ") &&
              !strcmp(pr.answer, "a10"),
          "eval 0 is record 10: %s", pr.prompt);
    CHECK(t.vt->problem(t.ctx, TD_RL_SPLIT_EVAL, 1, &pr, &err) == TD_OK && !strcmp(pr.answer, "a20"), "eval 1 is record 20");
    CHECK(t.vt->problem(t.ctx, TD_RL_SPLIT_EVAL, 2, &pr, &err) == TD_ERR_LIMIT && strstr(err.msg, "only 2"),
          "eval index 2 of 2: %s", err.msg);
    CHECK(t.vt->problem(t.ctx, TD_RL_SPLIT_TRAIN, 9, &pr, &err) == TD_OK && !strcmp(pr.answer, "a11"),
          "train 9 is record 11: %s", pr.answer);
    CHECK(t.vt->problem(t.ctx, TD_RL_SPLIT_TRAIN, 23, &pr, &err) == TD_OK && !strcmp(pr.answer, "a1"),
          "train wraps after 23 records: %s", pr.answer);
    double r[3] = {-1, -1, -1};
    CHECK(score3(&t, r, &err) == TD_OK, "exact scorer: %s", err.msg);
    CHECK(r[0] == 1 && r[1] == 0 && r[2] == 0, "exact scorer rewards %g %g %g", r[0], r[1], r[2]);
    // Many completions in one call (the input outgrows the socket buffer) keep their order.
    {
        enum { M = 3000 };
        static td_rl_problem mp[M];
        static const td_rl_problem *ps[M];
        static const char *cs[M];
        static size_t ls[M];
        static double mr[M];
        static char pad[200];
        memset(pad, 'x', sizeof pad - 1);
        for (int i = 0; i < M; i++) {
            t.vt->problem(t.ctx, TD_RL_SPLIT_TRAIN, (uint64_t)i, &mp[i], &err);
            snprintf(mp[i].prompt, sizeof mp[i].prompt, "%s %s", pad, "q");  // long lines
            ps[i] = &mp[i];
            cs[i] = i % 3 ? "wrong" : mp[i].answer;
            ls[i] = strlen(cs[i]);
        }
        double t0 = now_s();
        CHECK(t.vt->score(t.ctx, ps, cs, ls, M, mr, &err) == TD_OK, "3000 completions: %s", err.msg);
        int bad = 0;
        for (int i = 0; i < M; i++) bad += mr[i] != (i % 3 ? 0.0 : 1.0);
        CHECK(bad == 0, "%d of 3000 rewards wrong (%.2f s)", bad, now_s() - t0);
    }
    td_rl_task_free(&t);
    check_no_children("exact scorer");

    // Fractions are passed through; whitespace around the number is fine.
    CHECK(file_task("while read l; do echo ' 0.25 '; done", 5000, &t, &err) == TD_OK, "%s", err.msg);
    CHECK(score3(&t, r, &err) == TD_OK && r[0] == 0.25 && r[2] == 0.25, "0.25 scorer: %s", err.msg);
    td_rl_task_free(&t);

    struct {
        const char *cmd, *why, *want_msg;
        td_status want;
    } bad[] = {
        {"read l; echo 1", "answers one of three and exits", "1 lines of output for 3", TD_ERR_FORMAT},
        {"cat >/dev/null; echo 1; echo 1; echo 1; exit 3", "exits 3", "status 3", TD_ERR_IO},
        {"kill -9 $$", "killed", "signal 9", TD_ERR_IO},
        {"cat >/dev/null; echo 1; echo abc; echo 0", "garbage", "line 2", TD_ERR_FORMAT},
        {"cat >/dev/null; echo 1; echo nan; echo 0", "NaN", "line 2", TD_ERR_FORMAT},
        {"cat >/dev/null; echo 1; echo 0; echo 1.5", "out of range", "line 3", TD_ERR_FORMAT},
        {"cat >/dev/null; echo -0.1; echo 0; echo 1", "negative", "line 1", TD_ERR_FORMAT},
        {"cat >/dev/null; echo '1 1'; echo 0; echo 1", "two numbers on a line", "line 1", TD_ERR_FORMAT},
        {"cat >/dev/null; echo; echo 0; echo 1", "an empty line", "line 1", TD_ERR_FORMAT},
        {"cat >/dev/null; for i in 1 2 3 4; do echo 1; done", "too many lines", "more than 3", TD_ERR_FORMAT},
        {"/nonexistent/scorer", "cannot start", "status 127", TD_ERR_IO},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        CHECK(file_task(bad[i].cmd, 5000, &t, &err) == TD_OK, "%s", err.msg);
        memset(&err, 0, sizeof err);
        td_status st = score3(&t, r, &err);
        CHECK(st == bad[i].want && strstr(err.msg, bad[i].want_msg), "%s: status %s, message \"%s\"", bad[i].why,
              td_status_name(st), err.msg);
        td_rl_task_free(&t);
        check_no_children(bad[i].why);
    }

    // A scorer that exits at once while a large input is still being written: no SIGPIPE, an error.
    {
        CHECK(file_task("exit 0", 5000, &t, &err) == TD_OK, "%s", err.msg);
        enum { M = 2000 };
        static const td_rl_problem *ps[M];
        static const char *cs[M];
        static size_t ls[M];
        static double mr[M];
        static char big[4000];
        memset(big, '7', sizeof big - 1);
        t.vt->problem(t.ctx, TD_RL_SPLIT_TRAIN, 0, &pr, &err);
        for (int i = 0; i < M; i++) ps[i] = &pr, cs[i] = big, ls[i] = sizeof big - 1;
        td_status st = t.vt->score(t.ctx, ps, cs, ls, M, mr, &err);
        CHECK(st != TD_OK, "a scorer that reads nothing of 8 MB: %s", err.msg);
        td_rl_task_free(&t);
        check_no_children("exit at once");
    }

    // Hangs: the deadline is honoured, the whole process group is killed, nothing is left.
    char pidfile[512];
    path_of(pidfile, sizeof pidfile, "sleeper.pid");
    snprintf(cmd, sizeof cmd, "sleep 30 & echo $! > %s; wait", pidfile);
    CHECK(file_task(cmd, 300, &t, &err) == TD_OK, "%s", err.msg);
    double t0 = now_s();
    td_status st = score3(&t, r, &err);
    double dt = now_s() - t0;
    CHECK(st == TD_ERR_TIMEOUT && strstr(err.msg, "300 ms"), "hanging scorer: %s %s", td_status_name(st), err.msg);
    CHECK(dt >= 0.25 && dt < 3.0, "hanging scorer returned after %.2f s (timeout 0.3 s)", dt);
    td_rl_task_free(&t);
    check_no_children("hanging scorer");
    {
        FILE *f = fopen(pidfile, "r");
        int pid = 0;
        if (f) {
            if (fscanf(f, "%d", &pid) != 1) pid = 0;
            fclose(f);
        }
        CHECK(pid > 0, "the hanging scorer wrote its sleeper's pid");
        bool gone = false;
        for (int i = 0; i < 200 && pid > 0 && !gone; i++) {  // reparented: init reaps it
            char path[64], stat[256] = "";
            snprintf(path, sizeof path, "/proc/%d/stat", pid);
            FILE *s = fopen(path, "r");
            if (!s) gone = true;
            else {
                size_t n = fread(stat, 1, sizeof stat - 1, s);
                stat[n] = 0;
                fclose(s);
                const char *rp = strrchr(stat, ')');
                if (rp && (rp[2] == 'Z' || rp[2] == 'X')) gone = true;  // killed, awaiting its reaper
                else usleep(10000);
            }
        }
        CHECK(gone, "the scorer's child (pid %d) was killed with its process group", pid);
    }
    // Closes its output and lingers: still bounded.
    CHECK(file_task("cat >/dev/null; echo 1; echo 1; echo 1; exec >&-; sleep 30", 300, &t, &err) == TD_OK, "%s",
          err.msg);
    t0 = now_s();
    st = score3(&t, r, &err);
    dt = now_s() - t0;
    CHECK(st == TD_ERR_TIMEOUT && dt < 3.0, "lingering scorer: %s after %.2f s: %s", td_status_name(st), dt, err.msg);
    td_rl_task_free(&t);
    check_no_children("lingering scorer");

    // Malformed prompts files: the line is named.
    struct {
        const char *text, *want;
        td_status st;
    } mal[] = {
        {"{\"prompt\": \"a\", \"answer\": \"b\"}\n{\"prompt\": \"c\"}\n", ":2:", TD_ERR_FORMAT},
        {"{\"prompt\": \"a\", \"answer\": \"b\"}\n\n{\"prompt\": \"c\", \"answer\": \"d\"\n", ":3:", TD_ERR_FORMAT},
        {"{\"prompt\": \"a\", \"answer\": 5}\n", ":1:", TD_ERR_FORMAT},
        {"[1, 2]\n", ":1:", TD_ERR_FORMAT},
        {"{\"prompt\": \"\", \"answer\": \"x\"}\n", ":1: empty prompt", TD_ERR_FORMAT},
        {"\n  \n", "no problems", TD_ERR_FORMAT},
    };
    for (size_t i = 0; i < sizeof mal / sizeof *mal; i++) {
        write_file("prompts.jsonl", mal[i].text);
        memset(&err, 0, sizeof err);
        st = file_task("cat", 1000, &t, &err);
        CHECK(st == mal[i].st && strstr(err.msg, mal[i].want) && strstr(err.msg, "prompts.jsonl") && !t.vt,
              "malformed file %zu: %s \"%s\"", i, td_status_name(st), err.msg);
    }
    {  // an overlong prompt
        size_t n = TD_RL_PROMPT_CAP + 100;
        char *big = malloc(n + 64);
        strcpy(big, "{\"prompt\": \"");
        size_t o = strlen(big);
        memset(big + o, 'p', TD_RL_PROMPT_CAP);
        strcpy(big + o + TD_RL_PROMPT_CAP, "\", \"answer\": \"x\"}\n");
        write_file("prompts.jsonl", big);
        free(big);
        st = file_task("cat", 1000, &t, &err);
        CHECK(st == TD_ERR_LIMIT && strstr(err.msg, ":1:"), "overlong prompt: %s", err.msg);
    }
    td_rl_task_params p = td_rl_task_default_params();
    p.name = "file";
    p.prompts = "/nonexistent/prompts.jsonl";
    p.scorer = "cat";
    CHECK(td_rl_task_create(&p, &t, &err) == TD_ERR_IO && strstr(err.msg, "/nonexistent/prompts.jsonl"),
          "missing file: %s", err.msg);
    p.scorer = NULL;
    CHECK(td_rl_task_create(&p, &t, &err) == TD_ERR_INVALID, "no scorer refused");

    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", g_dir);
    if (system(rm) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
}

// `tandem rl data` writes exactly the task's problems, `prompt answer \n` per line.
static void test_cli_data(void) {
    const char *bin = td_test_bin();
    if (!bin) return;
    for (int sp = 0; sp < 2; sp++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s rl data --n 500 --seed 11 --min-digits 3 --max-digits 5 --split %s -o - 2>/dev/null",
                 bin, sp ? "eval" : "train");
        int status;
        char *out = td_test_run(cmd, &status);
        CHECK(out && status == 0, "rl data exits 0 (%d)", status);
        if (!out) continue;
        td_rl_task t = make_add(11, 3, 5);
        char *s = out;
        int bad = 0, n = 0;
        for (; n < 500 && *s; n++) {
            td_rl_problem pr;
            td_err err = {0};
            t.vt->problem(t.ctx, (td_rl_split)sp, (uint64_t)n, &pr, &err);
            char want[2048];
            snprintf(want, sizeof want, "%s%s\n", pr.prompt, pr.answer);
            size_t wl = strlen(want);
            if (strncmp(s, want, wl)) {
                if (bad++ < 3) fprintf(stderr, "  line %d: want %s", n + 1, want);
                char *nl = strchr(s, '\n');
                s = nl ? nl + 1 : s + strlen(s);
            } else {
                s += wl;
            }
        }
        CHECK(bad == 0 && n == 500 && !*s, "rl data --split %d: %d bad lines of %d, %zu bytes left", sp, bad, n,
              strlen(s));
        td_rl_task_free(&t);
        free(out);
    }
    char cmd[1024];
    int status;
    // --group 2: a blank line after every second problem.
    snprintf(cmd, sizeof cmd, "%s rl data --n 5 --group 2 -o - 2>/dev/null", bin);
    char *g = td_test_run(cmd, &status);
    int lines = 0, blank = 0;
    for (char *s = g; s && *s; s++)
        if (*s == '\n') {
            lines++;
            if (s[1] == '\n') blank++, s++, lines++;
        }
    CHECK(g && status == 0 && lines == 7 && blank == 2, "--group 2 over 5 problems: %d lines, %d blank", lines, blank);
    free(g);
    // rl eval end to end on the reference model: exit 0 and a JSON result.
    char json[] = "/tmp/td_rl_eval_XXXXXX";
    int fd = mkstemp(json);
    if (fd >= 0) close(fd);
    snprintf(cmd, sizeof cmd, "%s rl eval %s/ref/llama2 --n 10 --k 3 --max-tokens 4 --threads 1 --json %s 2>/dev/null",
             bin, td_test_data_dir(), json);
    char *o = td_test_run(cmd, &status);
    CHECK(o && status == 0 && strstr(o, "pass@3"), "rl eval exits 0 (%d): %s", status, o ? o : "");
    free(o);
    FILE *f = fopen(json, "r");
    char buf[1024] = "";
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
    }
    CHECK(strstr(buf, "\"n_problems\": 10") && strstr(buf, "\"k\": 3") && strstr(buf, "\"pass1\": ") &&
              strstr(buf, "\"pass_k\": ") && strstr(buf, "\"sample_solve\": ") && strstr(buf, "\"seconds\": "),
          "rl eval --json: %s", buf);
    unlink(json);
    snprintf(cmd, sizeof cmd, "%s rl eval %s/ref/llama2 --k 65 2>/dev/null", bin, td_test_data_dir());
    free(td_test_run(cmd, &status));
    CHECK(status == 2, "rl eval --k 65: exit %d, want 2", status);
    snprintf(cmd, sizeof cmd, "%s rl data --n 5 --bogus 2>/dev/null", bin);
    free(td_test_run(cmd, &status));
    CHECK(status == 2, "unknown option: exit %d, want 2", status);
    snprintf(cmd, sizeof cmd, "%s rl data --n 5 --min-digits 7 --max-digits 6 -o - 2>/dev/null", bin);
    free(td_test_run(cmd, &status));
    CHECK(status == 1, "min > max: exit %d, want 1", status);
}

int main(void) {
    signal(SIGPIPE, SIG_DFL);  // a scorer closing its input must not kill us: the task avoids SIGPIPE
    test_addition_problems();
    test_addition_reward();
    test_file_task();
    test_cli_data();
    TEST_DONE();
}
