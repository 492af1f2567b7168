// `tandem train --resume` against the checkpoint's recorded settings, through the real binary
// ($TANDEM_BIN): a changed setting (here the lr schedule's length, the learning rate, the sequences
// per step) is refused by default, naming each with its old and new value; --allow-changed-config
// accepts it with a warning and records the changes in train_config.json and in the checkpoints
// written after; a changed model shape is refused even then. Not here: bit-exact resume
// (test_train_resume, test_train_run).
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "run_cmd.h"
#include "test_util.h"
#include "train/ckpt.h"
#include "train/shards.h"

static const char *g_bin;
static char g_dir[256], g_shard[320], g_out[320];

// Runs tandem train on the shard with the shared flags plus extra; returns the exit status and
// the combined stdout + stderr in *text (malloc'd).
static int train(const char *extra, char **text) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' train --dim 32 --layers 1 --heads 2 --ffn 64 --seq-len 16 --threads 1 --seed 5 --out '%s' %s '%s' 2>&1",
             g_bin, g_out, extra, g_shard);
    int rc = -1;
    *text = td_test_run(cmd, &rc);
    if (!*text) *text = strdup("");
    return rc;
}

static cJSON *read_json(const char *path) {
    char *t = NULL;
    size_t n = 0;
    if (td_read_file(path, 0, &t, &n, NULL) != TD_OK) return NULL;
    cJSON *o = cJSON_Parse(t);
    free(t);
    return o;
}

// changes (an array of {"key", "old", "new"}) holds key with these values (to float precision:
// min_lr is lr / 10 in float).
static int has_change(const cJSON *changes, const char *key, double old, double now) {
    const cJSON *c;
    cJSON_ArrayForEach(c, changes) {
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(c, "key");
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(c, "old"), *n = cJSON_GetObjectItemCaseSensitive(c, "new");
        if (cJSON_IsString(k) && !strcmp(k->valuestring, key) && cJSON_IsNumber(o) && cJSON_IsNumber(n) &&
            fabs(o->valuedouble - old) <= 1e-6 * fabs(old) && fabs(n->valuedouble - now) <= 1e-6 * fabs(now))
            return 1;
    }
    return 0;
}

int main(void) {
    g_bin = getenv("TANDEM_BIN");
    if (!g_bin) g_bin = "build/tandem";
    CHECK(access(g_bin, X_OK) == 0, "no tandem binary at %s (set TANDEM_BIN)", g_bin);
    snprintf(g_dir, sizeof g_dir, "%s/train_resume_config_test", td_test_data_dir());
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    CHECK(system(cmd) == 0, "mkdir %s", g_dir);
    enum { NTOK = 4000, VOCAB = 32 };
    static int32_t ids[NTOK];
    for (int i = 0; i < NTOK; i++) ids[i] = (int32_t)((i * 7 + i / 13) % VOCAB);
    snprintf(g_shard, sizeof g_shard, "%s/data.tdsh", g_dir);
    snprintf(g_out, sizeof g_out, "%s/run", g_dir);
    td_err err = {0};
    CHECK(td_shard_write(g_shard, VOCAB, ids, NTOK, 1, &err) == TD_OK, "shard: %s", err.msg);

    char *t = NULL;
    int rc = train("--batch 2 --lr 3e-3 --steps 2", &t);
    CHECK(rc == 0, "first run exited %d: %s", rc, t);
    free(t);

    // Refused by default: every changed setting named with both values; nothing trained.
    rc = train("--batch 4 --lr 1e-3 --steps 4 --resume", &t);
    CHECK(rc == 1 && strstr(t, "resuming with changed settings") && strstr(t, "sequences_per_step 2 -> 4") &&
              strstr(t, "lr_schedule.max_lr 0.00300000003 -> 0.00100000005") &&
              strstr(t, "lr_schedule.total_steps 2 -> 4") && strstr(t, "--allow-changed-config") && !strstr(t, "step 3/"),
          "changed settings: exit %d: %s", rc, t);
    free(t);
    // The same settings resume without a word (nothing left to do at step 2 of 2).
    rc = train("--batch 2 --lr 3e-3 --steps 2 --resume", &t);
    CHECK(rc == 0 && !strstr(t, "changed settings"), "unchanged settings: exit %d: %s", rc, t);
    free(t);
    // A changed shape: refused even with the flag.
    rc = train("--batch 2 --lr 3e-3 --steps 4 --layers 2 --resume --allow-changed-config", &t);
    CHECK(rc == 1 && strstr(t, "shape cannot change") && strstr(t, "num_hidden_layers 1 -> 2"), "shape: exit %d: %s",
          rc, t);
    free(t);

    // Accepted with the flag: warned, trained to the end, recorded.
    rc = train("--batch 2 --lr 1e-3 --steps 4 --resume --allow-changed-config", &t);
    CHECK(rc == 0 && strstr(t, "warning: resuming at step 2 with changed settings") &&
              strstr(t, "lr_schedule.max_lr 0.00300000003 -> 0.00100000005") && strstr(t, "step 4/4") &&
              !strstr(t, "sequences_per_step"),
          "allowed: exit %d: %s", rc, t);
    free(t);
    char path[400];
    snprintf(path, sizeof path, "%s/train_config.json", g_out);
    cJSON *cfg = read_json(path);
    const cJSON *ch = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "resume_changes") : NULL;
    CHECK(cJSON_GetArraySize(ch) == 3 && has_change(ch, "lr_schedule.max_lr", 3e-3, 1e-3) &&
              has_change(ch, "lr_schedule.min_lr", 3e-4, 1e-4) && has_change(ch, "lr_schedule.total_steps", 2, 4),
          "%s: resume_changes", path);
    cJSON_Delete(cfg);
    snprintf(path, sizeof path, "%s/ckpt-000004.tdck", g_out);
    td_ckpt *ck = NULL;
    CHECK(td_ckpt_open(path, &ck, &err) == TD_OK, "%s: %s", path, err.msg);
    if (ck) {
        cJSON *meta = cJSON_Parse(td_ckpt_meta(ck));
        const cJSON *set = meta ? cJSON_GetObjectItemCaseSensitive(meta, "settings") : NULL;
        const cJSON *lr = set ? cJSON_GetObjectItemCaseSensitive(set, "lr_schedule.max_lr") : NULL;
        CHECK(cJSON_IsNumber(lr) && (float)lr->valuedouble == 1e-3f, "%s: settings hold the new lr", path);
        ch = meta ? cJSON_GetObjectItemCaseSensitive(meta, "resume_changes") : NULL;
        CHECK(has_change(ch, "lr_schedule.max_lr", 3e-3, 1e-3), "%s: resume_changes", path);
        cJSON_Delete(meta);
        td_ckpt_close(ck);
    }
    // From then on the new settings are the recorded ones: resuming with them is quiet.
    rc = train("--batch 2 --lr 1e-3 --steps 4 --resume", &t);
    CHECK(rc == 0 && !strstr(t, "changed settings"), "after the change: exit %d: %s", rc, t);
    free(t);
    TEST_DONE();
}
