// Loader tests over three shards of awkward lengths: every row is a real (T+1)-token window at a
// multiple of T; an epoch visits every window once; the same seed gives the same batches and
// another seed different ones; resuming from a saved position after N batches continues exactly
// like an uninterrupted run (across epoch boundaries); ranks of world 2 together see the world-1
// batch; bad positions and corrupt shards are refused.
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"
#include "train/ckpt.h"
#include "train/loader.h"
#include "train/shards.h"

#define VOCAB 50000
#define NB 4
#define NT 16
#define ROW (NT + 1)

static char dir[1024], paths[3][1200];
static const char *pp[3] = {paths[0], paths[1], paths[2]};
static const int lens[3] = {1000, 537, 2049};  // windows: 62 + 33 + 128 = 223
static int32_t *data[3];

static int32_t tok_at(int s, int i) {
    return (int32_t)(((uint32_t)s * 100003u + (uint32_t)i * 7919u) % VOCAB);
}

// Window id (global numbering) whose tokens equal row, or -1.
static int find_window(const int32_t *row) {
    int base = 0;
    for (int s = 0; s < 3; s++) {
        int nw = (lens[s] - 1) / NT;
        for (int w = 0; w < nw; w++)
            if (!memcmp(data[s] + w * NT, row, ROW * sizeof *row)) return base + w;
        base += nw;
    }
    return -1;
}

static td_loader *open_loader(uint64_t seed, int b, int rank, int world, int shuffle) {
    td_loader_params p = td_loader_default_params();
    p.paths = pp;
    p.n_paths = 3;
    p.B = b;
    p.T = NT;
    p.seed = seed;
    p.rank = rank;
    p.world = world;
    p.shuffle = shuffle;
    td_loader *l = NULL;
    td_err err = {0};
    CHECK(td_loader_open(&p, &l, &err) == TD_OK, "open: %s", err.msg);
    return l;
}

int main(void) {
    snprintf(dir, sizeof dir, "%s/test_loader", td_test_data_dir());
    mkdir(td_test_data_dir(), 0755);
    mkdir(dir, 0755);
    td_err err = {0};
    for (int s = 0; s < 3; s++) {
        data[s] = malloc((size_t)lens[s] * sizeof(int32_t));
        for (int i = 0; i < lens[s]; i++) data[s][i] = tok_at(s, i);
        snprintf(paths[s], sizeof paths[s], "%s/s%d.tdsh", dir, s);
        CHECK(td_shard_write(paths[s], VOCAB, data[s], (size_t)lens[s], 1, &err) == TD_OK,
              "write: %s", err.msg);
    }
    td_loader *l = open_loader(42, NB, 0, 1, 1);
    if (!l) TEST_DONE();
    CHECK(td_loader_windows(l) == 223 && td_loader_steps_per_epoch(l) == 55 &&
              td_loader_vocab(l) == VOCAB,
          "windows %llu", (unsigned long long)td_loader_windows(l));

    // Reference run: 150 batches (almost 3 epochs).
    enum { N = 150 };
    static int32_t ref[N][NB * ROW];
    for (int i = 0; i < N; i++) td_loader_next(l, ref[i]);
    // Rows are real windows; each epoch covers 220 distinct windows; epochs differ in order.
    int ok_rows = 0, distinct_ok = 1;
    for (int e = 0; e < 2; e++) {
        char seen[223] = {0};
        int distinct = 0;
        for (int i = e * 55; i < (e + 1) * 55; i++)
            for (int b = 0; b < NB; b++) {
                int w = find_window(ref[i] + b * ROW);
                ok_rows += w >= 0;
                if (w >= 0 && !seen[w]) {
                    seen[w] = 1;
                    distinct++;
                }
            }
        distinct_ok &= distinct == 220;
    }
    CHECK(ok_rows == 2 * 55 * NB, "%d of %d rows are windows", ok_rows, 2 * 55 * NB);
    CHECK(distinct_ok, "an epoch repeated a window");
    CHECK(memcmp(ref[0], ref[55], sizeof ref[0]) != 0, "epoch 1 starts like epoch 0");
    td_loader_pos pe = td_loader_tell(l);
    CHECK(pe.epoch == 2 && pe.index == (uint64_t)(N - 110) * NB, "position epoch %llu index %llu",
          (unsigned long long)pe.epoch, (unsigned long long)pe.index);
    td_loader_close(l);

    // Same seed: same batches; other seed: different; no shuffle: window order.
    int32_t buf[NB * ROW];
    l = open_loader(42, NB, 0, 1, 1);
    int same = 1;
    for (int i = 0; i < N; i++) {
        td_loader_next(l, buf);
        same &= !memcmp(buf, ref[i], sizeof buf);
    }
    CHECK(same, "same seed gave different batches");
    td_loader_close(l);
    l = open_loader(43, NB, 0, 1, 1);
    td_loader_next(l, buf);
    CHECK(memcmp(buf, ref[0], sizeof buf) != 0, "another seed gave the same first batch");
    td_loader_close(l);
    l = open_loader(42, NB, 0, 1, 0);
    td_loader_next(l, buf);
    CHECK(!memcmp(buf, data[0], ROW * sizeof(int32_t)) &&
              !memcmp(buf + ROW, data[0] + NT, ROW * sizeof(int32_t)),
          "unshuffled order");
    td_loader_close(l);

    // Resume: after n batches save the position, a fresh loader seeks and continues.
    int ns[] = {0, 1, 54, 55, 70, 109};
    for (int k = 0; k < 6; k++) {
        int n = ns[k];
        l = open_loader(42, NB, 0, 1, 1);
        for (int i = 0; i < n; i++) td_loader_next(l, buf);
        td_loader_pos pos = td_loader_tell(l);
        td_loader_close(l);
        l = open_loader(42, NB, 0, 1, 1);
        CHECK(td_loader_seek(l, &pos, &err) == TD_OK, "seek: %s", err.msg);
        int eq = 1;
        for (int i = n; i < N; i++) {
            td_loader_next(l, buf);
            eq &= !memcmp(buf, ref[i], sizeof buf);
        }
        CHECK(eq, "resumed after %d batches: batches differ from the uninterrupted run", n);
        // Positions from another seed or off a step boundary are refused.
        td_loader_pos bad = pos;
        bad.rng ^= 1;
        CHECK(td_loader_seek(l, &bad, &err) == TD_ERR_INVALID, "wrong rng accepted");
        bad = pos;
        bad.index += 1;
        CHECK(td_loader_seek(l, &bad, &err) == TD_ERR_INVALID, "misaligned index accepted");
        td_loader_close(l);
    }

    // Resume through a checkpoint: the position travels in the metadata JSON with a tensor; a
    // "restarted" process loads the latest checkpoint, seeks, and sees the same batches.
    {
        char cdir[1200], meta[256], posjs[160];
        snprintf(cdir, sizeof cdir, "%s/ckpt", dir);
        l = open_loader(42, NB, 0, 1, 1);
        for (int i = 0; i < 80; i++) td_loader_next(l, buf);
        td_loader_pos pos = td_loader_tell(l);
        td_loader_close(l);
        CHECK(td_loader_pos_format(&pos, posjs, sizeof posjs) < (int)sizeof posjs, "format");
        snprintf(meta, sizeof meta, "{\"step\":80,\"loader\":%s}", posjs);
        float w[3] = {1, 2, 3};
        td_ckpt_tensor t = {"w", TD_F32, 1, {3}, w, sizeof w};
        CHECK(td_ckpt_dir_save(cdir, 80, &t, 1, meta, 2, NULL, 0, &err) == TD_OK, "save: %s",
              err.msg);
        td_ckpt *c = NULL;
        int64_t step = -1;
        CHECK(td_ckpt_dir_load_latest(cdir, &c, &step, &err) == TD_OK && step == 80, "load: %s",
              err.msg);
        td_loader_pos back = {0};
        if (c) {
            const char *m = strstr(td_ckpt_meta(c), "\"loader\":");
            char obj[160] = {0};
            if (m) sscanf(m + 9, "%159[^}]", obj);
            strcat(obj, "}");
            CHECK(td_loader_pos_parse(obj, &back, &err) == TD_OK, "parse %s: %s", obj, err.msg);
            td_ckpt_close(c);
        }
        CHECK(back.epoch == pos.epoch && back.index == pos.index && back.rng == pos.rng,
              "position round trip");
        l = open_loader(42, NB, 0, 1, 1);
        CHECK(td_loader_seek(l, &back, &err) == TD_OK, "seek: %s", err.msg);
        int same_after = 1;
        for (int i = 80; i < N; i++) {
            td_loader_next(l, buf);
            same_after &= !memcmp(buf, ref[i], sizeof buf);
        }
        CHECK(same_after, "resume through a checkpoint differs");
        td_loader_close(l);
        CHECK(td_loader_pos_parse("{\"epoch\":1,\"index\":2}", &back, &err) == TD_ERR_FORMAT &&
                  strstr(err.msg, "rng"),
              "missing rng: %s", err.msg);
        CHECK(td_loader_pos_parse("{\"epoch\":-1,\"index\":2,\"rng\":\"0000000000000001\"}", &back,
                                  &err) == TD_ERR_FORMAT,
              "negative epoch accepted");
        CHECK(td_loader_pos_parse("[1]", &back, &err) == TD_ERR_FORMAT, "array accepted");
        char cmd[1300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", cdir);
        CHECK(system(cmd) == 0, "rm");
    }

    // World 2, B = 2 per rank: rank 0 rows then rank 1 rows == the world-1 batch of B = 4.
    td_loader *r0 = open_loader(42, 2, 0, 2, 1), *r1 = open_loader(42, 2, 1, 2, 1);
    int eq = 1;
    for (int i = 0; i < N; i++) {
        td_loader_next(r0, buf);
        td_loader_next(r1, buf + 2 * ROW);
        eq &= !memcmp(buf, ref[i], sizeof buf);
    }
    CHECK(eq, "ranks of world 2 do not partition the world-1 batches");
    td_loader_pos p0 = td_loader_tell(r0), p1 = td_loader_tell(r1);
    CHECK(p0.epoch == p1.epoch && p0.index == p1.index && p0.rng == p1.rng,
          "ranks disagree on the position");
    td_loader_close(r0);
    td_loader_close(r1);

    // Bad configurations and data.
    td_loader_params p = td_loader_default_params();
    p.paths = pp;
    p.n_paths = 3;
    p.T = NT;
    p.B = 300;  // more rows than windows
    CHECK(td_loader_open(&p, &l, &err) == TD_ERR_INVALID && !l, "too few windows accepted");
    p.B = 2;
    p.rank = 2;
    p.world = 2;
    CHECK(td_loader_open(&p, &l, &err) == TD_ERR_INVALID, "rank >= world accepted");
    p.rank = 0;
    p.world = 1;
    FILE *f = fopen(paths[1], "r+b");
    fseek(f, 100, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    CHECK(td_loader_open(&p, &l, &err) == TD_ERR_FORMAT && strstr(err.msg, "s1.tdsh"),
          "corrupt shard: %s", err.msg);
    int32_t other[10] = {0};
    CHECK(td_shard_write(paths[1], 1000, other, 10, 1, &err) == TD_OK, "write");
    CHECK(td_loader_open(&p, &l, &err) == TD_ERR_INVALID && strstr(err.msg, "vocabulary"),
          "vocab mismatch: %s", err.msg);
    for (int s = 0; s < 3; s++) {
        free(data[s]);
        remove(paths[s]);
    }
    rmdir(dir);
    TEST_DONE();
}
