// `tandem train --config FILE`: options from a JSON file, command-line flags overriding them, the
// resolved configuration written next to the checkpoints, and clear errors for a bad file.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "base/file.h"
#include "test_util.h"
#include "train/shards.h"

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static double num(const cJSON *o, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, a);
    if (b) v = cJSON_GetObjectItemCaseSensitive(v, b);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

int main(void) {
    const char *bin = getenv("TANDEM_BIN");
    if (!bin) bin = "build/tandem";
    char dir[512], cmd[4096], path[700], shard[700], cfg[700];
    snprintf(dir, sizeof dir, "%s/train_config_test", td_test_data_dir());
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    CHECK(sh(cmd) == 0, "scratch dir");
    snprintf(shard, sizeof shard, "%s/data.tdsh", dir);
    int32_t ids[2000];
    for (int i = 0; i < 2000; i++) ids[i] = (i * 7919 + i / 3) % 61;
    td_err err;
    CHECK(td_shard_write(shard, 64, ids, 2000, 1, &err) == TD_OK, "shard: %s", err.msg);

    // File values, one overridden on the command line; arrays and booleans.
    snprintf(cfg, sizeof cfg, "%s/cfg.json", dir);
    FILE *f = fopen(cfg, "w");
    fprintf(f, "{\"dim\": 32, \"layers\": 2, \"heads\": 2, \"kv-heads\": 1, \"ffn\": 64, \"steps\": 4,"
               " \"batch\": 2, \"seq-len\": 16, \"lr\": 0.002, \"recompute\": true, \"bf16\": false,"
               " \"threads\": 1, \"shards\": [\"%s\"], \"out\": \"%s/run\"}\n", shard, dir);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train --config %s --layers 3 >%s/out.txt 2>&1", bin, cfg, dir);
    CHECK(sh(cmd) == 0, "train --config failed (see %s/out.txt)", dir);
    snprintf(path, sizeof path, "%s/run/train_config.json", dir);
    char *text = NULL;
    CHECK(td_read_file(path, 0, &text, NULL, &err) == TD_OK, "%s", err.msg);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(o != NULL, "train_config.json parses");
    if (o) {
        CHECK(num(o, "model", "hidden_size") == 32, "dim from the file");
        CHECK(num(o, "model", "num_hidden_layers") == 3, "--layers on the command line overrides the file");
        CHECK(num(o, "model", "num_key_value_heads") == 1, "kv-heads from the file");
        CHECK(num(o, "model", "intermediate_size") == 64, "ffn from the file");
        CHECK(num(o, "steps", NULL) == 4 && num(o, "batch", NULL) == 2 && num(o, "seq_len", NULL) == 16,
              "steps/batch/seq_len from the file");
        CHECK(fabs(num(o, "lr_schedule", "max_lr") - 0.002) < 1e-9, "lr from the file");
        cJSON_Delete(o);
    }

    // Bad files: clear errors, usage exit status.
    const char *bad[] = {"[1, 2]", "{\"dim\": {\"x\": 1}}", "{\"dim\": 32,", "{\"no-such-flag\": 1}"};
    const char *needle[] = {"not a JSON object", "must be a number", "not a JSON object", "unknown option"};
    for (int i = 0; i < 4; i++) {
        f = fopen(cfg, "w");
        fputs(bad[i], f);
        fclose(f);
        snprintf(cmd, sizeof cmd, "%s train --config %s %s >%s/err.txt 2>&1", bin, cfg, shard, dir);
        CHECK(sh(cmd) == 2, "bad config %d: exit status", i);
        snprintf(path, sizeof path, "%s/err.txt", dir);
        char *e = NULL;
        td_read_file(path, 0, &e, NULL, NULL);
        CHECK(e && strstr(e, needle[i]), "bad config %d: message '%s' lacks '%s'", i, e ? e : "", needle[i]);
        free(e);
    }
    snprintf(cmd, sizeof cmd, "%s train --config %s/missing.json %s >/dev/null 2>&1", bin, dir, shard);
    CHECK(sh(cmd) == 2, "missing config file");
    TEST_DONE();
}
