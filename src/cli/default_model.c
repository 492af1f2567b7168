// Where the embedded default model (assets/default-model, docs/default-model.md) lives: next to the
// executable first (build/tandem -> ../assets/default-model, or an install's share/tandem/), then
// the current directory. Used by `tandem run` and `tandem serve` when no MODEL is given.
// Not here: loading it (model/model.h).
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "cli/cli.h"

#define DM_REL "assets/default-model"

static int has_model(char *buf, size_t cap, const char *dir, const char *rel) {
    char cfg[PATH_MAX + 64];
    int n = snprintf(buf, cap, "%s%s%s", dir, *dir ? "/" : "", rel);
    if (n < 0 || (size_t)n >= cap) return 0;
    snprintf(cfg, sizeof cfg, "%s/config.json", buf);
    return td_file_exists(cfg);
}

const char *td_default_model_path(char *buf, size_t cap) {
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;  // exe is now the executable's directory
            static const char *const rel[] = {("../" DM_REL), DM_REL, "../share/tandem/default-model"};
            for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++)
                if (has_model(buf, cap, exe, rel[i])) return buf;
        }
    }
    if (has_model(buf, cap, "", DM_REL)) return buf;
    return NULL;
}
