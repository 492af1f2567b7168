// `tandem rl --config` as a user runs it (real processes): a task from a JSON-lines prompts file
// scored by an external command (a python3 script: the fraction of vowels among a completion's
// letters), synchronous GRPO on the tiny random llama2 of tests/oracle/gen/models.sh.
//  1. an uninterrupted run of 6 steps, a checkpoint after every step;
//  2. the same run (configured for 4 steps, extended with --steps 6 on its last resume) killed with
//     SIGKILL twice (right after its second checkpoint appears, then at a random moment of the
//     resumed run) and resumed with --resume each time: its final
//     checkpoint equals the uninterrupted one byte for byte in every tensor, and every step's
//     logged reward is the same;
//  3. `tandem export` reads the RL checkpoint (an HF directory the engine loads);
//  4. a broken scorer (exits 3) fails the run with a message naming the command; a bad config key
//     is a usage error naming the key;
//  5. remote placement: two `tandem serve` children launched by the loop; one killed with SIGKILL
//     mid-run is dropped, restarted and re-synced, its requests re-submitted, and the run completes.
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "run_cmd.h"
#include "test_util.h"
#include "train/ckpt.h"

static const char *bin(void) {
    const char *b = getenv("TANDEM_BIN");
    return b && *b ? b : "build/tandem";
}

static void write_file(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(s, f);
    fclose(f);
}

static void write_config(const char *path, const char *tmp, const char *out, const char *scorer, int steps) {
    char s[4096];
    snprintf(s, sizeof s,
             "{\"model\": \"%s/ref/llama2\", \"out_dir\": \"%s\", \"steps\": %d,\n"
             " \"task\": {\"name\": \"file\", \"prompts\": \"%s/prompts.jsonl\", \"scorer\": \"%s\", \"stop\": \"\\n\"},\n"
             " \"prompts_per_step\": 4, \"samples_per_prompt\": 8, \"max_tokens\": 8, \"max_prompt_tokens\": 8,\n"
             " \"micro_batch\": 16, \"optim\": {\"lr\": 0.003}, \"threads\": 2, \"seed\": 11, \"ckpt_every\": 1,\n"
             " \"keep\": 0, \"timeout_s\": 60}\n",
             td_test_data_dir(), out, steps, tmp, scorer);
    write_file(path, s);
}

// A remote run: two `tandem serve` children launched by the loop (weight sync on), 8 steps.
static void write_remote_config(const char *path, const char *tmp, const char *out, const char *scorer) {
    char s[4096];
    snprintf(s, sizeof s,
             "{\"model\": \"%s/ref/llama2\", \"out_dir\": \"%s\", \"steps\": 8,\n"
             " \"task\": {\"name\": \"file\", \"prompts\": \"%s/prompts.jsonl\", \"scorer\": \"%s\"},\n"
             " \"prompts_per_step\": 4, \"samples_per_prompt\": 8, \"max_tokens\": 8, \"max_prompt_tokens\": 8,\n"
             " \"micro_batch\": 16, \"optim\": {\"lr\": 0.003}, \"threads\": 1, \"seed\": 11,\n"
             " \"engine\": {\"placement\": \"remote\", \"launch\": 2}, \"timeout_s\": 30}\n",
             td_test_data_dir(), out, tmp, scorer);
    write_file(path, s);
}

// `tandem rl --config CFG [--resume] [--steps STEPS]` (steps NULL: the config's).
static pid_t spawn_rl_steps(const char *cfg, bool resume, const char *steps, const char *log) {
    pid_t p = fork();
    if (p == 0) {
        FILE *f = freopen(log, "a", stdout);
        (void)f;
        dup2(fileno(stdout), 2);
        const char *argv[10] = {bin(), "rl", "--config", cfg};
        int n = 4;
        if (resume) argv[n++] = "--resume";
        if (steps) argv[n++] = "--steps", argv[n++] = steps;
        argv[n] = NULL;
        execv(bin(), (char *const *)argv);
        _exit(127);
    }
    return p;
}
static pid_t spawn_rl(const char *cfg, bool resume, const char *log) { return spawn_rl_steps(cfg, resume, NULL, log); }

static int wait_exit(pid_t p) {
    int st = 0;
    while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

static bool exists(const char *path) {
    struct stat s;
    return stat(path, &s) == 0;
}

// The last logged reward of each step 0..n-1 (a resumed run logs again the steps after its
// checkpoint: the last line wins).
static int rewards(const char *dir, double *out, int n) {
    char path[700], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        long step;
        double r;
        const char *ps = strstr(line, "\"step\":"), *pr = strstr(line, "\"reward\":");
        if (!ps || !pr || sscanf(ps + 7, "%ld", &step) != 1 || sscanf(pr + 9, "%lf", &r) != 1) continue;
        if (step >= 0 && step < n) out[step] = r, seen |= 1 << step;
    }
    fclose(f);
    return __builtin_popcount((unsigned)seen);
}

static void same_ckpt(const char *a, const char *b) {
    td_ckpt *x = NULL, *y = NULL;
    td_err err = {0};
    CHECK(td_ckpt_open(a, &x, &err) == TD_OK, "%s", err.msg);
    CHECK(td_ckpt_open(b, &y, &err) == TD_OK, "%s", err.msg);
    if (x && y) {
        int diff = 0;
        for (int i = 0; i < td_ckpt_count(x); i++) {
            const td_ckpt_tensor *t = td_ckpt_get(x, i), *u = td_ckpt_find(y, t->name);
            if (!u || u->nbytes != t->nbytes || memcmp(u->data, t->data, t->nbytes)) diff++;
        }
        CHECK(td_ckpt_count(x) == td_ckpt_count(y) && diff == 0, "%s vs %s: %d tensors differ", a, b, diff);
    }
    td_ckpt_close(x);
    td_ckpt_close(y);
}

int main(void) {
    char tmp[] = "/tmp/td_rl_cli_XXXXXX";
    if (!mkdtemp(tmp)) {
        CHECK(0, "mkdtemp");
        TEST_DONE();
    }
    char path[700], a[600], b[600], cfg_a[700], cfg_b[700], scorer[700], log[700], cmd[2048];
    snprintf(path, sizeof path, "%s/prompts.jsonl", tmp);
    FILE *f = fopen(path, "w");
    static const char *ps[] = {"the ", "a cat ", "one ", "we ", "in the ", "so ", "my ", "it ", "on ", "to "};
    for (int i = 0; i < 40; i++) fprintf(f, "{\"prompt\": \"%s\", \"answer\": \"\"}\n", ps[i % 10]);
    fclose(f);
    snprintf(scorer, sizeof scorer, "%s/vowels.py", tmp);
    write_file(scorer,
               "import json, sys\n"
               "for line in sys.stdin:\n"
               "    c = json.loads(line)['completion']\n"
               "    letters = [ch for ch in c if ch.isascii() and ch.isalpha()]\n"
               "    print(sum(ch in 'aeiouAEIOU' for ch in letters) / len(letters) if letters else 0.0)\n");
    char scorer_cmd[800];
    snprintf(scorer_cmd, sizeof scorer_cmd, "python3 %s", scorer);
    snprintf(a, sizeof a, "%s/a", tmp);
    snprintf(b, sizeof b, "%s/b", tmp);
    snprintf(cfg_a, sizeof cfg_a, "%s/a.json", tmp);
    snprintf(cfg_b, sizeof cfg_b, "%s/b.json", tmp);
    snprintf(log, sizeof log, "%s/log.txt", tmp);
    write_config(cfg_a, tmp, a, scorer_cmd, 6);
    write_config(cfg_b, tmp, b, scorer_cmd, 4);  // the last resume asks for 6 (--steps)

    // 1. uninterrupted
    int rc = wait_exit(spawn_rl(cfg_a, false, log));
    CHECK(rc == 0, "uninterrupted run exit %d (log %s)", rc, log);
    // 2. killed twice, resumed
    pid_t p = spawn_rl(cfg_b, false, log);
    snprintf(path, sizeof path, "%s/ckpt-000002.tdck", b);
    for (int i = 0; i < 600 && !exists(path); i++) usleep(20000);
    kill(p, SIGKILL);
    rc = wait_exit(p);
    CHECK(rc == -SIGKILL, "first run killed (%d)", rc);
    p = spawn_rl(cfg_b, true, log);
    srand((unsigned)time(NULL));
    usleep(200000 + (useconds_t)(rand() % 800000));
    kill(p, SIGKILL);
    (void)wait_exit(p);
    rc = wait_exit(spawn_rl_steps(cfg_b, true, "6", log));
    CHECK(rc == 0, "resumed run (--steps 6) exit %d", rc);
    snprintf(path, sizeof path, "%s/ckpt-000006.tdck", a);
    char pb[700];
    snprintf(pb, sizeof pb, "%s/ckpt-000006.tdck", b);
    same_ckpt(path, pb);
    double ra[6], rb[6];
    CHECK(rewards(a, ra, 6) == 6 && rewards(b, rb, 6) == 6, "every step logged");
    for (int i = 0; i < 6; i++) CHECK(ra[i] == rb[i], "step %d reward %.17g vs %.17g", i, ra[i], rb[i]);
    CHECK(ra[5] > ra[0], "the vowel reward rose over 6 steps (%.3f -> %.3f)", ra[0], ra[5]);

    // 3. export the RL checkpoint and serve-load it
    snprintf(cmd, sizeof cmd,
             "%s export %s --to hf -o %s/hf --tokenizer %s/ref/llama2 2>&1 && %s run %s/hf --prompt 'the ' -n 4 2>&1",
             bin(), path, tmp, td_test_data_dir(), bin(), tmp);
    int st = 0;
    char *o = td_test_run(cmd, &st);
    CHECK(st == 0, "export + run of the RL checkpoint: %s", o ? o : "");
    free(o);

    // 5. remote placement: rollouts on two launched servers; one is killed with SIGKILL mid-run:
    // the loop re-submits its requests, the pool restarts it and re-syncs it before it serves again,
    // and the run completes with its reward risen.
    char cfg_r[700], rdir[600];
    snprintf(cfg_r, sizeof cfg_r, "%s/r.json", tmp);
    snprintf(rdir, sizeof rdir, "%s/r", tmp);
    write_remote_config(cfg_r, tmp, rdir, scorer_cmd);
    char rlog[700];
    snprintf(rlog, sizeof rlog, "%s/remote.txt", tmp);
    p = spawn_rl(cfg_r, false, rlog);
    snprintf(path, sizeof path, "%s/metrics.jsonl", rdir);
    for (int i = 0; i < 1500 && !exists(path); i++) usleep(20000);  // the first step is done
    snprintf(cmd, sizeof cmd, "pgrep -P %d -f ' serve '", (int)p);
    o = td_test_run(cmd, &st);
    const int child = o ? atoi(o) : 0;
    free(o);
    CHECK(child > 0, "a launched server is running");
    if (child > 0) kill(child, SIGKILL);
    rc = wait_exit(p);
    CHECK(rc == 0, "the remote run survives a killed server (exit %d, log %s)", rc, rlog);
    double rr[8];
    CHECK(rewards(rdir, rr, 8) == 8, "every remote step logged");
    CHECK(rr[7] > rr[0], "remote reward rose (%.3f -> %.3f)", rr[0], rr[7]);
    snprintf(cmd, sizeof cmd, "grep -c 're-synced' %s", rlog);
    o = td_test_run(cmd, &st);
    CHECK(o && atoi(o) >= 1, "the restarted server was re-synced before serving again (log %s)", rlog);
    free(o);

    // 4. failures
    char bad[700];
    snprintf(bad, sizeof bad, "%s/bad.json", tmp);
    char cbad[700];
    snprintf(cbad, sizeof cbad, "%s/c", tmp);
    write_config(bad, tmp, cbad, "sh -c 'exit 3'", 2);
    snprintf(cmd, sizeof cmd, "%s rl --config %s 2>&1", bin(), bad);
    o = td_test_run(cmd, &st);
    CHECK(st == 1 && o && strstr(o, "exit 3"), "a failing scorer fails the run, naming it (%d): %s", st, o ? o : "");
    free(o);
    write_file(bad, "{\"model\": \"x\", \"sampling\": {\"temprature\": 1}}");
    o = td_test_run(cmd, &st);
    CHECK(st == 2 && o && strstr(o, "temprature"), "an unknown key is named (%d): %s", st, o ? o : "");
    free(o);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (td_test_failed == 0 && system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", tmp);
    TEST_DONE();
}
