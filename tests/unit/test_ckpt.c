// Checkpoint container tests: bit-exact round trip, every truncation point and every single-byte
// flip of a small checkpoint detected with a message naming the problem, directory rotation and
// fallback to the previous checkpoint, and kill -9 of a child mid-write leaving the previous
// checkpoint loadable and no file under the new final name.
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "test_util.h"
#include "train/ckpt.h"

static char dir[1024];

static void rm_dir(const char *d) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", d);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static int write_bytes(const char *path, const uint8_t *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    size_t w = n ? fwrite(p, 1, n, f) : 0;
    return fclose(f) == 0 && w == n;
}

// Three tensors: (3, 5) f32, (7,) bf16, a scalar f32, plus an empty (0, 4) f32.
static float a[15], s[1];
static uint16_t b[7];
static td_ckpt_tensor tens[4];
static const char *META = "{\"step\":100,\"rng\":[1,2,3],\"config\":{\"lr\":0.001}}";

static void make_tensors(void) {
    for (int i = 0; i < 15; i++) a[i] = (float)((int)rnd() % 2001 - 1000) / 7.0f;
    for (int i = 0; i < 7; i++) b[i] = (uint16_t)rnd();
    s[0] = -0.0f;
    tens[0] = (td_ckpt_tensor){"model.w", TD_F32, 2, {3, 5}, a, sizeof a};
    tens[1] = (td_ckpt_tensor){"opt.m/bf16", TD_BF16, 1, {7}, b, sizeof b};
    tens[2] = (td_ckpt_tensor){"scalar", TD_F32, 0, {0}, s, 4};
    tens[3] = (td_ckpt_tensor){"empty", TD_F32, 2, {0, 4}, NULL, 0};
}

static void test_round_trip(const char *path) {
    td_err err = {0};
    CHECK(td_ckpt_write(path, tens, 4, META, &err) == TD_OK, "write: %s", err.msg);
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(!td_file_exists(tmp), "temporary left behind");
    td_ckpt *c = NULL;
    CHECK(td_ckpt_open(path, &c, &err) == TD_OK, "open: %s", err.msg);
    if (!c) return;
    CHECK(strcmp(td_ckpt_meta(c), META) == 0, "meta %s", td_ckpt_meta(c));
    CHECK(td_ckpt_count(c) == 4, "count %d", td_ckpt_count(c));
    for (int i = 0; i < 4; i++) {
        const td_ckpt_tensor *t = td_ckpt_find(c, tens[i].name);
        CHECK(t != NULL, "missing %s", tens[i].name);
        if (!t) continue;
        CHECK(t == td_ckpt_get(c, i), "order of %s", t->name);
        CHECK(t->dtype == tens[i].dtype && t->ndim == tens[i].ndim && t->nbytes == tens[i].nbytes,
              "%s: header fields", t->name);
        for (int d = 0; d < t->ndim; d++)
            CHECK(t->shape[d] == tens[i].shape[d], "%s: dim %d", t->name, d);
        CHECK(t->nbytes == 0 || memcmp(t->data, tens[i].data, t->nbytes) == 0,
              "%s: data not bit-exact", t->name);
        CHECK(((uintptr_t)t->data & 63) == 0, "%s: data not 64-byte aligned", t->name);
    }
    CHECK(td_ckpt_find(c, "nope") == NULL, "found a missing tensor");
    td_ckpt_close(c);

    // Invalid input is refused, and nothing is written.
    td_ckpt_tensor bad[2] = {tens[0], tens[0]};
    char p2[1100];
    snprintf(p2, sizeof p2, "%s/bad.tdck", dir);
    CHECK(td_ckpt_write(p2, bad, 2, NULL, &err) == TD_ERR_INVALID, "duplicate names accepted");
    bad[0].nbytes = 12;
    CHECK(td_ckpt_write(p2, bad, 1, NULL, &err) == TD_ERR_INVALID, "size mismatch accepted");
    CHECK(!td_file_exists(p2), "file written for invalid input");
}

// Every truncation and every byte flip must be refused with TD_ERR_FORMAT.
static void test_corruption(const char *path) {
    uint8_t *orig;
    size_t n;
    td_err err = {0};
    CHECK(td_read_file(path, 0, (char **)&orig, &n, &err) == TD_OK, "read: %s", err.msg);
    if (!orig) return;
    char p[1100];
    snprintf(p, sizeof p, "%s/mangled.tdck", dir);
    int trunc_ok = 0, trunc_named = 0;
    for (size_t cut = 0; cut < n; cut++) {
        write_bytes(p, orig, cut);
        td_ckpt *c = NULL;
        td_status st = td_ckpt_open(p, &c, &err);
        trunc_ok += st == TD_ERR_FORMAT && c == NULL;
        trunc_named += strstr(err.msg, "truncated") != NULL || strstr(err.msg, "marker") != NULL;
        td_ckpt_close(c);
    }
    CHECK(trunc_ok == (int)n, "%d of %zu truncations detected", trunc_ok, n);
    CHECK(trunc_named == (int)n, "%d of %zu truncation messages say truncated", trunc_named, n);
    uint8_t *m = malloc(n);
    int flip_ok = 0, named_tensor = 0;
    for (size_t i = 0; i < n; i++) {
        memcpy(m, orig, n);
        m[i] ^= (uint8_t)(1u << (rnd() % 8));
        write_bytes(p, m, n);
        td_ckpt *c = NULL;
        td_status st = td_ckpt_open(p, &c, &err);
        flip_ok += st == TD_ERR_FORMAT && c == NULL;
        named_tensor += strstr(err.msg, "tensor model.w: checksum") != NULL;
        td_ckpt_close(c);
    }
    CHECK(flip_ok == (int)n, "%d of %zu byte flips detected", flip_ok, n);
    CHECK(named_tensor >= 60, "only %d flips named tensor model.w's checksum", named_tensor);
    // Trailing garbage and a wrong magic.
    memcpy(m, orig, n);
    write_bytes(p, m, n);
    FILE *f = fopen(p, "ab");
    fputc('x', f);
    fclose(f);
    td_ckpt *c = NULL;
    CHECK(td_ckpt_open(p, &c, &err) == TD_ERR_FORMAT, "trailing byte accepted");
    m[0] = 'X';
    write_bytes(p, m, n);
    CHECK(td_ckpt_open(p, &c, &err) == TD_ERR_FORMAT && strstr(err.msg, "magic"), "bad magic: %s",
          err.msg);
    m[0] = orig[0];
    m[8] = 2;  // version
    write_bytes(p, m, n);
    CHECK(td_ckpt_open(p, &c, &err) == TD_ERR_FORMAT && strstr(err.msg, "version"), "version: %s",
          err.msg);
    free(m);
    free(orig);
    unlink(p);
}

static void test_directory(void) {
    char d[1100], p[1200];
    snprintf(d, sizeof d, "%s/run", dir);
    td_err err = {0};
    int64_t steps[8];
    td_ckpt *c = NULL;
    int64_t step = -1;
    CHECK(td_ckpt_dir_load_latest(d, &c, &step, &err) == TD_ERR_NOT_FOUND, "missing dir: %s",
          err.msg);
    for (int64_t st = 100; st <= 400; st += 100) {
        char meta[64];
        snprintf(meta, sizeof meta, "{\"step\":%lld}", (long long)st);
        CHECK(td_ckpt_dir_save(d, st, tens, 3, meta, 3, p, sizeof p, &err) == TD_OK, "save: %s",
              err.msg);
    }
    CHECK(strstr(p, "/ckpt-000400.tdck") != NULL, "path %s", p);
    snprintf(p, sizeof p, "%s/ckpt-1.tdck", d);  // not a checkpoint name: ignored
    write_bytes(p, (const uint8_t *)"x", 1);
    int n = td_ckpt_dir_list(d, steps, 8);
    CHECK(n == 3 && steps[0] == 400 && steps[1] == 300 && steps[2] == 200, "rotation kept %d", n);
    CHECK(td_ckpt_dir_load_latest(d, &c, &step, &err) == TD_OK && step == 400, "latest %lld",
          (long long)step);
    CHECK(c && strcmp(td_ckpt_meta(c), "{\"step\":400}") == 0, "latest meta");
    td_ckpt_close(c);
    // Corrupt the newest (byte flip) and truncate the next: falls back to 200.
    snprintf(p, sizeof p, "%s/ckpt-000400.tdck", d);
    FILE *f = fopen(p, "r+b");
    fseek(f, 300, SEEK_SET);
    int ch = fgetc(f);
    fseek(f, 300, SEEK_SET);
    fputc(ch ^ 0x10, f);
    fclose(f);
    CHECK(td_ckpt_dir_load_latest(d, &c, &step, &err) == TD_OK && step == 300,
          "fallback to 300: %lld", (long long)step);
    td_ckpt_close(c);
    snprintf(p, sizeof p, "%s/ckpt-000300.tdck", d);
    CHECK(truncate(p, 200) == 0, "truncate");
    CHECK(td_ckpt_dir_load_latest(d, &c, &step, &err) == TD_OK && step == 200,
          "fallback to 200: %lld", (long long)step);
    td_ckpt_close(c);
    snprintf(p, sizeof p, "%s/ckpt-000200.tdck", d);
    CHECK(truncate(p, 10) == 0, "truncate");
    CHECK(td_ckpt_dir_load_latest(d, &c, &step, &err) == TD_ERR_FORMAT && c == NULL, "no valid: %d",
          err.status);
    CHECK(strstr(err.msg, "ckpt-000400.tdck") && strstr(err.msg, "checksum"), "message: %s",
          err.msg);
}

// A child writes a 256 MiB checkpoint; the parent SIGKILLs it once the temporary file has grown.
static void test_kill9(void) {
    char d[1100], p[1200], tmp[1300];
    snprintf(d, sizeof d, "%s/kill", dir);
    td_err err = {0};
    CHECK(td_ckpt_dir_save(d, 1, tens, 3, "{\"step\":1}", 3, NULL, 0, &err) == TD_OK, "save 1: %s",
          err.msg);
    snprintf(p, sizeof p, "%s/ckpt-000002.tdck", d);
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    pid_t pid = fork();
    if (pid == 0) {
        // 16 tensors sharing one 16 MiB buffer: a 256 MiB file, far longer to write than the
        // parent's 1 ms polling interval, so the kill lands mid-write even on a loaded machine.
        size_t nb = 16u << 20;
        uint8_t *big = malloc(nb);
        for (size_t i = 0; i < nb; i++) big[i] = (uint8_t)(i * 2654435761u >> 13);
        td_ckpt_tensor t[16];
        char names[16][16];
        for (int i = 0; i < 16; i++) {
            snprintf(names[i], sizeof names[i], "big.%d", i);
            t[i] = (td_ckpt_tensor){names[i], TD_F32, 1, {(int64_t)(nb / 4)}, big, nb};
        }
        td_ckpt_dir_save(d, 2, t, 16, "{\"step\":2}", 3, NULL, 0, NULL);
        _exit(0);
    }
    int killed_mid_write = 0;
    for (int i = 0; i < 20000; i++) {  // up to ~20 s
        struct stat st;
        if (stat(tmp, &st) == 0 && st.st_size > (1 << 20)) {
            kill(pid, SIGKILL);
            killed_mid_write = 1;
            break;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            pid = -1;
            break;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (pid > 0) {
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child was not killed");
    }
    CHECK(killed_mid_write, "child finished before the kill (test did not exercise a torn write)");
    CHECK(!td_file_exists(p), "half-written checkpoint under its final name");
    CHECK(td_file_exists(tmp), "expected the torn temporary file");
    td_ckpt *c = NULL;
    int64_t step = -1;
    CHECK(td_ckpt_dir_load_latest(d, &c, &step, &err) == TD_OK && step == 1, "after kill: %s",
          err.msg);
    td_ckpt_close(c);
    // The next save clears the torn temporary.
    CHECK(td_ckpt_dir_save(d, 3, tens, 3, "{}", 3, NULL, 0, &err) == TD_OK, "save 3: %s", err.msg);
    CHECK(!td_file_exists(tmp), "torn temporary not cleaned");
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/test_ckpt", td_test_data_dir());
    rm_dir(dir);
    mkdir(td_test_data_dir(), 0755);
    CHECK(mkdir(dir, 0755) == 0, "mkdir %s: %s", dir, strerror(errno));
    make_tensors();
    char path[1100];
    snprintf(path, sizeof path, "%s/a.tdck", dir);
    test_round_trip(path);
    test_corruption(path);
    test_directory();
    test_kill9();
    rm_dir(dir);
    TEST_DONE();
}
