// Data-parallel training across two "hosts": two network namespaces joined by a veth pair
// (10.231.x.1 and 10.231.x.2), mpirun started in the first with a hostfile naming both addresses,
// its daemon launched in the second by a stand-in for ssh (`ip netns exec`), every byte between the
// ranks over TCP on the veth (btl self,tcp; oob and btl pinned to that subnet). The 2-rank job must
// log the losses of one process at batch 2 x 2 bit for bit, as on one host. The test creates and
// deletes its own namespaces. Skipped (77) without MPI in the build, mpirun, `ip`, or the right to
// create namespaces (root).
#define _GNU_SOURCE
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"
#include "train/shards.h"

static char g_dir[256], g_ns[2][32];
static int g_made;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    const int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : 1000;
}

static void cleanup(void) {
    if (!g_made) return;
    g_made = 0;
    for (int i = 0; i < 2; i++) sh("ip netns del %s 2>/dev/null", g_ns[i]);
}
static void on_signal(int s) {
    cleanup();
    signal(s, SIG_DFL);
    raise(s);
}

static int read_losses(const char *path, char out[][48], int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[1024];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        const char *l = strstr(line, "\"loss\":");
        if (!l || !strchr(line, '}')) continue;
        snprintf(out[n++], 48, "%.*s", (int)strcspn(l + 7, ",}"), l + 7);
    }
    fclose(f);
    return n;
}

int main(void) {
#ifndef TANDEM_HAVE_MPI
    return td_test_skip("built without MPI");
#else
    // Under ASan the ranks run without LeakSanitizer (OpenMPI's unloaded components: see
    // test_train_mpi); the rest of ASan stays on.
    const char *ao = getenv("ASAN_OPTIONS");
    char aob[512];
    snprintf(aob, sizeof aob, "%s%sdetect_leaks=0", ao ? ao : "", ao && *ao ? ":" : "");
    setenv("ASAN_OPTIONS", aob, 1);
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || access(bin, X_OK)) {
        CHECK(0, "TANDEM_BIN is not set to the tandem binary");
        TEST_DONE();
    }
    if (sh("command -v mpirun >/dev/null && command -v ip >/dev/null")) {
        return td_test_skip("mpirun or ip (iproute2) is not on PATH");
    }
    const int id = (int)(getpid() % 200) + 20;  // a subnet and names of this run's own
    snprintf(g_ns[0], sizeof g_ns[0], "tdhostA%d", (int)getpid());
    snprintf(g_ns[1], sizeof g_ns[1], "tdhostB%d", (int)getpid());
    if (sh("ip netns add %s 2>/dev/null", g_ns[0])) {
        return td_test_skip("cannot create network namespaces here (needs root)");
    }
    g_made = 1;
    atexit(cleanup);
    signal(SIGINT, on_signal), signal(SIGTERM, on_signal), signal(SIGALRM, on_signal);
    alarm(240);  // the whole test, whatever hangs
    char va[16], vb[16], a1[32], a2[32];
    snprintf(va, sizeof va, "tdv%da", id), snprintf(vb, sizeof vb, "tdv%db", id);
    snprintf(a1, sizeof a1, "10.231.%d.1", id), snprintf(a2, sizeof a2, "10.231.%d.2", id);
    const int net = sh("ip netns add %s && ip link add %s type veth peer name %s && ip link set %s netns %s && "
                       "ip link set %s netns %s && ip -n %s addr add %s/24 dev %s && ip -n %s addr add %s/24 dev %s && "
                       "ip -n %s link set %s up && ip -n %s link set %s up && ip -n %s link set lo up && "
                       "ip -n %s link set lo up",
                       g_ns[1], va, vb, va, g_ns[0], vb, g_ns[1], g_ns[0], a1, va, g_ns[1], a2, vb, g_ns[0], va,
                       g_ns[1], vb, g_ns[0], g_ns[1]);
    CHECK(net == 0, "two namespaces joined by a veth pair");
    if (net) TEST_DONE();

    snprintf(g_dir, sizeof g_dir, "%s/train_hosts_test", td_test_data_dir());
    CHECK(sh("rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir) == 0, "mkdir");
    enum { NTOK = 20000, STEPS = 6 };
    static int32_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (int32_t)((i * 7 + i / 13) % 29);
    char shard[400];
    snprintf(shard, sizeof shard, "%s/s0.tdsh", g_dir);
    td_err err = {0};
    CHECK(td_shard_write(shard, 29, ids, NTOK, 1, &err) == TD_OK, "shard: %s", err.msg);
    // The stand-in for ssh: `agent HOST COMMAND...` runs COMMAND in HOST's namespace.
    char agent[400], hostfile[400];
    snprintf(agent, sizeof agent, "%s/agent.sh", g_dir);
    snprintf(hostfile, sizeof hostfile, "%s/hosts", g_dir);
    FILE *f = fopen(agent, "w");
    if (f) {
        fprintf(f, "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n  %s) exec ip netns exec %s /bin/sh -c \"$*\" ;;\n"
                   "  *) exec ip netns exec %s /bin/sh -c \"$*\" ;;\nesac\n", a2, g_ns[1], g_ns[0]);
        fclose(f);
    }
    f = fopen(hostfile, "w");
    if (f) {
        fprintf(f, "%s slots=1\n%s slots=1\n", a1, a2);
        fclose(f);
    }
    CHECK(sh("chmod +x '%s'", agent) == 0, "agent script");
    const char *model = "--dim 32 --layers 2 --heads 4 --kv-heads 2 --ffn 64 --seq-len 16 --threads 1 --lr 1e-2 "
                        "--warmup 2 --clip 0.5 --seed 3 --bucket-mb 0.004 --comm-timeout 30 --steps 6";
    // One process on the host (no namespace): the reference.
    CHECK(sh("timeout 120 '%s' train %s --batch 2 --accum 2 --metrics '%s/ref.jsonl' '%s' > '%s/ref.log' 2>&1", bin,
             model, g_dir, shard, g_dir) == 0,
          "the one-process reference run");
    // Two ranks, one per namespace, over TCP on the veth.
    const int rc = sh("cd '%s' && OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 ip netns exec %s mpirun "
                      "--allow-run-as-root --hostfile '%s' --mca plm_rsh_agent '%s' --mca btl self,tcp "
                      "--mca btl_tcp_if_include 10.231.%d.0/24 --mca oob_tcp_if_include 10.231.%d.0/24 -np 2 "
                      "sh -c 'echo rank $OMPI_COMM_WORLD_RANK on $(ip -4 -o addr show | grep -o \"10\\.231\\.[0-9.]*\" "
                      "| head -1) >> \"%s/where\"; exec \"$0\" \"$@\"' '%s' train %s --batch 4 --metrics '%s/hosts.jsonl' "
                      "'%s' > '%s/hosts.log' 2>&1",
                      g_dir, g_ns[0], hostfile, agent, id, id, g_dir, bin, model, g_dir, shard, g_dir);
    CHECK(rc == 0, "mpirun -np 2 across the two namespaces: exit %d (see %s/hosts.log)", rc, g_dir);
    char where[400];
    snprintf(where, sizeof where, "%s/where", g_dir);
    CHECK(sh("grep -q 'rank 0 on %s' '%s' && grep -q 'rank 1 on %s' '%s'", a1, where, a2, where) == 0,
          "rank 0 ran on %s, rank 1 on %s", a1, a2);
    char ref[STEPS + 2][48], got[STEPS + 2][48], rp[400], gp[400];
    snprintf(rp, sizeof rp, "%s/ref.jsonl", g_dir), snprintf(gp, sizeof gp, "%s/hosts.jsonl", g_dir);
    const int nr = read_losses(rp, ref, STEPS + 2), ng = read_losses(gp, got, STEPS + 2);
    int same = nr == STEPS && ng == STEPS;
    for (int i = 0; same && i < STEPS; i++) same = !strcmp(ref[i], got[i]);
    CHECK(same, "2 ranks on two hosts log the one-process losses bit for bit (%d and %d lines)", nr, ng);
    cleanup();
    CHECK(sh("ip netns list | grep -q '%s'", g_ns[0]) != 0, "the namespaces are gone");
    TEST_DONE();
#endif
}
