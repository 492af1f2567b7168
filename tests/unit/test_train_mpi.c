// `mpirun -np N tandem train` end to end: real processes, the MPI communicator, the real binary
// ($TANDEM_BIN). N ranks at --batch 4 log the losses of one process at --batch 4/N --accum N bit
// for bit (the metrics lines' 17-digit text), with plain DP, ZeRO-1 and ZeRO-2, at N = 2 and 4,
// and carry world_size; ZeRO-2 through the gradient ring (--grad-ring) likewise untied, and with 2
// micro-batches per rank it logs ZeRO-2's full-size-buffer losses bit for bit; tied (the default
// model), the ring reduces the embedding's two gradient parts separately (2N f32 terms regrouped:
// test_train_dp derives it), so its losses agree to 1e-6 relative; its gradient bytes shrink from
// np 2 to 4; a checkpoint written by 2 ranks resumes on 1 with the
// same losses; a rank killed with SIGKILL mid-run ends the job within a bound (never a hang), and resuming from the
// last checkpoint reproduces the uninterrupted run. Every mpirun runs under an outer deadline in
// its own process group. Skipped (77) without MPI in the build or mpirun on PATH.
// The same equivalence without processes: test_train_dp_run.
#define _GNU_SOURCE
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"
#include "train/shards.h"

enum { STEPS = 6, MAXL = 64 };
static const char *g_bin;
static char g_dir[256], g_shard[320], g_mpirun[512];

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool find_mpirun(void) {
    const char *path = getenv("PATH");
    while (path && *path) {
        size_t len = strcspn(path, ":");
        snprintf(g_mpirun, sizeof g_mpirun, "%.*s/mpirun", (int)len, path);
        if (access(g_mpirun, X_OK) == 0) return true;
        path += len + (path[len] == ':');
    }
    return false;
}

// Under ASan the ranks run without LeakSanitizer: OpenMPI's components are dlopen'd and unloaded
// before exit, so what they keep cannot be attributed (or suppressed by module); tandem's own
// leaks are checked by the single-process tests (test_train_dp, test_train_dp_run). The rest of
// ASan stays on.
static void no_leak_check(void) {
    const char *a = getenv("ASAN_OPTIONS");
    char buf[512];
    snprintf(buf, sizeof buf, "%s%sdetect_leaks=0", a ? a : "", a && *a ? ":" : "");
    setenv("ASAN_OPTIONS", buf, 1);
}

// Starts `[mpirun -np np] tandem train <model flags> extra...` (np 0: no mpirun) in its own
// process group, output to g_dir/tag.log. Returns the pid.
static pid_t start(int np, const char *tag, const char *const *extra) {
    char logp[400], nps[16];
    snprintf(logp, sizeof logp, "%s/%s.log", g_dir, tag);
    snprintf(nps, sizeof nps, "%d", np);
    const char *argv[80];
    int n = 0;
    if (np > 0) {
        const char *m[] = {g_mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", nps};
        for (size_t i = 0; i < sizeof m / sizeof *m; i++) argv[n++] = m[i];
    }
    const char *base[] = {g_bin,   "train", "--dim",    "32",   "--layers",  "2",  "--heads", "4",   "--kv-heads",
                          "2",     "--ffn", "64",       "--seq-len", "16", "--threads", "1", "--lr",   "1e-2",
                          "--warmup", "2", "--clip",   "0.5",  "--seed",    "3",  "--bucket-mb", "0.004",
                          "--comm-timeout", "20"};
    for (size_t i = 0; i < sizeof base / sizeof *base; i++) argv[n++] = base[i];
    for (int i = 0; extra[i]; i++) argv[n++] = extra[i];
    argv[n++] = g_shard;
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        FILE *f = freopen(logp, "w", stdout);
        if (!f || dup2(fileno(stdout), 2) < 0) _exit(127);
        setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
        setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
        char owner[32];
        snprintf(owner, sizeof owner, "%d", (int)getppid());
        setenv("TD_TEST_TRAIN_MPI_OWNER", owner, 1);  // find_rank's mark: ranks of this test's jobs
        no_leak_check();
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    setpgid(pid, pid);
    return pid;
}

// Waits up to deadline_s; kills the whole group on expiry. Exit status, 1000 + signal, or -2 on
// the deadline.
static int finish(pid_t pid, double deadline_s, double *secs) {
    const double t0 = now_s();
    int ws = 0;
    for (;;) {
        pid_t r = waitpid(pid, &ws, WNOHANG);
        if (r == pid) break;
        if (now_s() - t0 > deadline_s) {
            kill(-pid, SIGKILL);
            waitpid(pid, &ws, 0);
            if (secs) *secs = now_s() - t0;
            return -2;
        }
        usleep(20000);
    }
    if (secs) *secs = now_s() - t0;
    return WIFSIGNALED(ws) ? 1000 + WTERMSIG(ws) : WEXITSTATUS(ws);
}

static int run(int np, const char *tag, const char *const *extra) {
    const int rc = finish(start(np, tag, extra), 180, NULL);
    if (rc != 0) {
        char cmd[800];
        snprintf(cmd, sizeof cmd, "tail -n 15 '%s/%s.log' >&2", g_dir, tag);
        if (system(cmd)) {}
    }
    return rc;
}

// The metrics lines' "loss" texts (17 digits), and world_size.
static int losses(const char *path, char out[][48], int *world) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024];
    int n = 0;
    while (n < MAXL && fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\":"), *w = strstr(line, "\"world_size\":");
        if (!l || !w || !strchr(line, '}')) continue;
        l += 7;
        snprintf(out[n], 48, "%.*s", (int)strcspn(l, ",}"), l);
        world[n++] = atoi(w + 13);
    }
    fclose(f);
    return n;
}

static int same(const char *a, const char *b, int expect_n, int world_a) {
    static char la[MAXL][48], lb[MAXL][48];
    int wa[MAXL], wb[MAXL];
    const int na = losses(a, la, wa), nb = losses(b, lb, wb);
    if (na != expect_n || nb != expect_n) {
        fprintf(stderr, "%s: %d lines, %s: %d lines, want %d\n", a, na, b, nb, expect_n);
        return 0;
    }
    for (int i = 0; i < na; i++)
        if (strcmp(la[i], lb[i]) || (world_a && wa[i] != world_a)) {
            fprintf(stderr, "step %d: %s (world %d) vs %s\n", i + 1, la[i], wa[i], lb[i]);
            return 0;
        }
    return 1;
}

// Whether a's and b's losses agree within tol relative (and a's carry world_a, unless 0).
static int close_to(const char *a, const char *b, int expect_n, int world_a, double tol) {
    static char la[MAXL][48], lb[MAXL][48];
    int wa[MAXL], wb[MAXL];
    const int na = losses(a, la, wa), nb = losses(b, lb, wb);
    if (na != expect_n || nb != expect_n) {
        fprintf(stderr, "%s: %d lines, %s: %d lines, want %d\n", a, na, b, nb, expect_n);
        return 0;
    }
    double worst = 0;
    for (int i = 0; i < na; i++) {
        const double x = atof(la[i]), y = atof(lb[i]), d = (x > y ? x - y : y - x) / y;
        if (d > worst) worst = d;
        if (world_a && wa[i] != world_a) return 0;
    }
    printf("%s: losses within %.1e of %s\n", a, worst, b);
    return worst <= tol;
}

static void path(char *dst, size_t cap, const char *name) { snprintf(dst, cap, "%s/%s", g_dir, name); }

// From run `tag`'s log (rank 0's start-up lines): the parameter count and, with ZeRO-2's gradient
// ring, the gradient bytes ("= N bytes"); 0 where absent.
static void grad_bytes(const char *tag, long *params, long *grads) {
    char p[400], line[2048];
    snprintf(p, sizeof p, "%s/%s.log", g_dir, tag);
    FILE *f = fopen(p, "r");
    *params = *grads = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *a = strstr(line, "train: "), *b = strstr(line, " bytes; paper 4P/N");
        if (a && strstr(line, " parameters, ") && !*params) *params = atol(a + 7);
        if (b) {
            while (b > line && b[-1] >= '0' && b[-1] <= '9') b--;
            *grads = atol(b);
        }
    }
    if (f) fclose(f);
}

// The pid of the `tandem train` process that is MPI rank `rank` of a job this process started (its
// environment names both), never another test's on the same machine.
static pid_t find_rank(int rank) {
    DIR *d = opendir("/proc");
    struct dirent *e;
    pid_t found = 0;
    char want[48], mine[64];
    snprintf(want, sizeof want, "OMPI_COMM_WORLD_RANK=%d", rank);
    snprintf(mine, sizeof mine, "TD_TEST_TRAIN_MPI_OWNER=%d", (int)getpid());
    while (d && (e = readdir(d)) && !found) {
        const pid_t pid = (pid_t)atoi(e->d_name);
        if (pid <= 0 || pid == getpid()) continue;
        char p[64], buf[8192];
        snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
        FILE *f = fopen(p, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        buf[n] = 0;
        if (n == 0 || !strstr(buf, "tandem") || strstr(buf, "mpirun")) continue;
        if (!memmem(buf, n, "train", 6)) continue;
        snprintf(p, sizeof p, "/proc/%d/environ", pid);
        f = fopen(p, "r");
        n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f) fclose(f);
        bool is_rank = false, ours = false;  // another copy's ranks (a second ctest) are not ours
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1) {
            is_rank |= !strcmp(buf + i, want);
            ours |= !strcmp(buf + i, mine);
        }
        if (is_rank && ours) found = pid;
    }
    if (d) closedir(d);
    return found;
}

int main(void) {
#ifndef TANDEM_HAVE_MPI
    return td_test_skip("built without MPI");
#else
    g_bin = getenv("TANDEM_BIN");
    if (!g_bin || access(g_bin, X_OK)) {
        CHECK(0, "TANDEM_BIN is not set to the tandem binary");
        TEST_DONE();
    }
    if (!find_mpirun()) {
        return td_test_skip("mpirun is not on PATH");
    }
    // A directory of this process's own: two copies sharing TANDEM_TEST_DATA (two checkouts'
    // ctest runs) would otherwise write the same metrics files. Removed when everything passed.
    snprintf(g_dir, sizeof g_dir, "%s/train_mpi_test.%d", td_test_data_dir(), (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    CHECK(system(cmd) == 0, "mkdir %s", g_dir);
    enum { NTOK = 20000 };
    static int32_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (int32_t)((i * 7 + i / 13) % 29);
    path(g_shard, sizeof g_shard, "s0.tdsh");
    td_err err = {0};
    CHECK(td_shard_write(g_shard, 29, ids, NTOK, 1, &err) == TD_OK, "shard: %s", err.msg);
    char m_ref[400], m[400], out[400], steps[16];
    snprintf(steps, sizeof steps, "%d", STEPS);

    // N ranks at batch 4 = one process at batch 4/N x N micro-batches, for each ZeRO stage.
    const int worlds[2] = {2, 4};
    for (int wi = 0; wi < 2; wi++) {
        const int np = worlds[wi];
        char b1[8], acc[8], tag[32];
        snprintf(b1, sizeof b1, "%d", 4 / np);
        snprintf(acc, sizeof acc, "%d", np);
        snprintf(tag, sizeof tag, "ref%d", np);
        char nm[32];
        snprintf(nm, sizeof nm, "ref%d.jsonl", np);
        path(m_ref, sizeof m_ref, nm);
        const char *e1[] = {"--batch", b1, "--accum", acc, "--steps", steps, "--metrics", m_ref, NULL};
        CHECK(run(0, tag, e1) == 0, "one process, batch %s x %s", b1, acc);
        for (int zero = 0; zero <= 2; zero++) {
            char z[8], t2[32], mn[40];
            snprintf(z, sizeof z, "%d", zero);
            snprintf(t2, sizeof t2, "np%d_z%d", np, zero);
            snprintf(mn, sizeof mn, "np%d_z%d.jsonl", np, zero);
            path(m, sizeof m, mn);
            const char *e2[] = {"--batch", "4", "--zero", z, "--steps", steps, "--metrics", m, NULL};
            const int rc = run(np, t2, e2);
            CHECK(rc == 0, "mpirun -np %d tandem train --zero %d: exit %d", np, zero, rc);
            CHECK(rc == 0 && same(m, m_ref, STEPS, np),
                  "mpirun -np %d --zero %d: every step's loss equals one process's bit for bit, world_size %d", np, zero, np);
        }
        // ZeRO-2 through a gradient ring of one buffer (this model's default is the full-size one).
        char t2[32], mn[40];
        snprintf(t2, sizeof t2, "np%d_ring", np);
        snprintf(mn, sizeof mn, "np%d_ring.jsonl", np);
        path(m, sizeof m, mn);
        const char *e3[] = {"--batch", "4", "--zero", "2", "--grad-ring", "1", "--steps", steps, "--metrics", m, NULL};
        const int rc = run(np, t2, e3);
        CHECK(rc == 0 && close_to(m, m_ref, STEPS, np, 1e-6),
              "mpirun -np %d --zero 2 --grad-ring 1 (tied): every step's loss within 1e-6 of one process's (exit %d)", np, rc);
    }
    {  // The ring's gradient bytes (rank 0's start-up line) shrink with the ranks, below 4 P at 4.
        long p2, g2, p4, g4;
        grad_bytes("np2_ring", &p2, &g2);
        grad_bytes("np4_ring", &p4, &g4);
        CHECK(p2 > 0 && p2 == p4 && g2 > 0 && g4 > 0 && g4 < g2 && g4 < 4 * p4,
              "ZeRO-2's ring: gradients %ld bytes per rank at np 2, %ld at np 4 (full: %ld)", g2, g4, 4 * p2);
        printf("ZeRO-2, ring of 1: gradients %ld bytes per rank at np 2, %ld at np 4, full buffer %ld\n", g2, g4, 4 * p2);
    }
    // Untied, and 2 micro-batches per rank: the ring of 2 gives the full-size buffer's losses bit
    // for bit (the same reductions in the same order), and the untied ring one process's at accum 1;
    // tied, within 1e-6.
    {
        char mr[400], mf[400];
        path(m_ref, sizeof m_ref, "untied_ref.jsonl");
        const char *e1[] = {"--untied", "--batch", "2", "--accum", "2", "--steps", steps, "--metrics", m_ref, NULL};
        CHECK(run(0, "untied_ref", e1) == 0, "one process, untied, batch 2 x 2");
        path(m, sizeof m, "untied_ring.jsonl");
        const char *e2[] = {"--untied", "--batch", "4", "--zero", "2", "--grad-ring", "2", "--steps", steps, "--metrics", m, NULL};
        int rc = run(2, "untied_ring", e2);
        CHECK(rc == 0 && same(m, m_ref, STEPS, 2), "mpirun -np 2 --untied --zero 2 --grad-ring 2: one process's losses (exit %d)",
              rc);
        for (int untied = 0; untied <= 1; untied++)
            for (int np = 2; np <= 4; np += 2) {
                char tr[40], tf[40];
                snprintf(tr, sizeof tr, "acc_ring_u%d_np%d", untied, np), snprintf(tf, sizeof tf, "acc_full_u%d_np%d", untied, np);
                path(mr, sizeof mr, tr), path(mf, sizeof mf, tf);
                strcat(mr, ".jsonl"), strcat(mf, ".jsonl");
                const char *er[] = {"--batch", "4", "--accum", "2", "--zero", "2", "--grad-ring", "2", "--steps", steps,
                                    "--metrics", mr, untied ? "--untied" : NULL, NULL};
                const char *ef[] = {"--batch", "4", "--accum", "2", "--zero", "2", "--grad-ring", "-1", "--steps", steps,
                                    "--metrics", mf, untied ? "--untied" : NULL, NULL};
                rc = run(np, tr, er);
                const int rf = run(np, tf, ef);
                CHECK(rc == 0 && rf == 0 && (untied ? same(mr, mf, STEPS, np) : close_to(mr, mf, STEPS, np, 1e-6)),
                      "mpirun -np %d%s --accum 2 --zero 2: the ring of 2 logs the full-size buffer's losses %s (exit %d, %d)",
                      np, untied ? " --untied" : "", untied ? "bit for bit" : "within 1e-6", rc, rf);
            }
    }

    // Resume on another world size: 2 ranks (ZeRO-1) to step 3, then one process to 6, against
    // the uninterrupted one-process run (ref2: batch 2 x 2).
    path(out, sizeof out, "resume");
    path(m, sizeof m, "resume.jsonl");
    {
        const char *e1[] = {"--batch", "4", "--zero", "1", "--steps", "3", "--out", out, "--metrics", m, NULL};
        CHECK(run(2, "resume_a", e1) == 0, "2 ranks to step 3");
        const char *e2[] = {"--batch", "2", "--accum", "2", "--steps", steps, "--out", out, "--resume",
                            "--allow-changed-config", "--metrics", m, NULL};  // to 6 steps: total_steps 3 -> 6
        CHECK(run(0, "resume_b", e2) == 0, "resumed alone");
        path(m_ref, sizeof m_ref, "ref2.jsonl");
        CHECK(same(m, m_ref, STEPS, 0), "2 ranks (ZeRO-1) to step 3, resumed on 1 process: the uninterrupted losses");
    }

    // A rank killed mid-run: the job ends within a bound, and a restart from the last checkpoint
    // reproduces the uninterrupted run (the reference: 1 process, batch 2 x 2, KILL_STEPS steps).
    // The run is long enough (a step of this tiny model takes about a millisecond) that it cannot
    // finish between its first checkpoint and the kill: rank 1's process is found first, then the
    // checkpoint is polled every millisecond.
    {
        enum { KILL_STEPS = 2000 };
        const char *long_steps = "2000";
        path(m_ref, sizeof m_ref, "kill_ref.jsonl");
        const char *er[] = {"--batch", "2", "--accum", "2", "--steps", long_steps, "--metrics", m_ref, NULL};
        CHECK(run(0, "kill_ref", er) == 0, "reference run");
        path(out, sizeof out, "kill");
        path(m, sizeof m, "kill.jsonl");
        const char *ek[] = {"--batch", "4", "--steps", long_steps, "--out", out, "--ckpt-every", "10", "--keep", "2",
                            "--metrics", m, NULL};
        pid_t job = start(2, "kill_a", ek);
        char ck[500];
        snprintf(ck, sizeof ck, "%s/ckpt-000010/manifest.json", out);  // the first sharded checkpoint
        const double t0 = now_s();
        pid_t victim = 0;
        while (!(victim = find_rank(1)) && now_s() - t0 < 60) usleep(2000);
        while (access(ck, F_OK) && now_s() - t0 < 60) usleep(1000);
        CHECK(victim > 0, "found rank 1's process");
        double secs = 0;
        int rc;
        if (victim > 0) {
            kill(victim, SIGKILL);
            rc = finish(job, 60, &secs);
        } else {
            rc = finish(job, 1, &secs);
        }
        CHECK(rc != 0 && rc != -2, "a killed rank ends the job with an error (exit %d) within 60 s", rc);
        printf("rank 1 killed: mpirun exited %d after %.2f s\n", rc, secs);
        const char *er2[] = {"--batch", "4", "--steps", long_steps, "--out", out, "--ckpt-every", "10", "--keep", "2",
                             "--resume", "--metrics", m, NULL};
        CHECK(run(2, "kill_b", er2) == 0, "restarted from the last checkpoint");
        // Every logged step of both segments equals the reference's (the cut segment's last
        // steps after the checkpoint are logged again by the restart).
        static char lr[KILL_STEPS][48];
        FILE *f = fopen(m, "r"), *g = fopen(m_ref, "r");
        int bad = 0, lines = 0, nr = 0;
        char line[1024];
        while (g && nr < KILL_STEPS && fgets(line, sizeof line, g)) {
            const char *l = strstr(line, "\"loss\":");
            if (l) snprintf(lr[nr++], 48, "%.*s", (int)strcspn(l + 7, ",}"), l + 7);
        }
        while (f && fgets(line, sizeof line, f)) {
            const char *s = strstr(line, "\"step\":"), *l = strstr(line, "\"loss\":");
            if (!s || !l || !strchr(line, '}')) continue;
            const int st = atoi(s + 7);
            char txt[48];
            snprintf(txt, sizeof txt, "%.*s", (int)strcspn(l + 7, ",}"), l + 7);
            lines++;
            if (st < 1 || st > nr || strcmp(txt, lr[st - 1])) bad++;
        }
        if (f) fclose(f);
        if (g) fclose(g);
        CHECK(nr == KILL_STEPS && lines >= KILL_STEPS && bad == 0,
              "killed and restarted: %d logged steps, %d differ from the uninterrupted run (%d reference lines)", lines,
              bad, nr);
    }
    if (!td_test_failed) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
        if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_dir);
    } else {
        printf("logs kept in %s\n", g_dir);
    }
    TEST_DONE();
#endif
}
