// Subcommands of the `tandem` executable. Each takes argv with argv[0] = the subcommand's name and
// returns the process exit status (0 ok, 1 runtime error, 2 usage error).
#ifndef TD_CLI_CLI_H
#define TD_CLI_CLI_H

#include "tensor/dtype.h"

int td_cmd_run(int argc, char **argv);
int td_cmd_serve(int argc, char **argv);
int td_cmd_tokenize(int argc, char **argv);
int td_cmd_detokenize(int argc, char **argv);

// Small argument helpers shared by the subcommands (cli_args.c). Each parses the value of flag
// `name` strictly (the whole string must be a number in range) and prints a usage error if not.
int td_arg_int(const char *name, const char *v, long lo, long hi, long *out);
int td_arg_float(const char *name, const char *v, double lo, double hi, double *out);
// --kv-cache-dtype: "auto" or "f32" -> TD_F32 (auto is f32: exact, and what the oracle tests pin;
// docs/engine.md), "f16" -> TD_F16, "bf16" -> TD_BF16 (case-insensitive). Prints a usage error
// and returns 0 for anything else.
int td_arg_kv_dtype(const char *name, const char *v, td_dtype *out);
#define TD_KV_DTYPE_HELP                                                                       \
    "  --kv-cache-dtype T    KV cache element type: auto (= f32), f32, f16 or bf16; f16/bf16\n" \
    "                        halve the cache's bytes per token (docs/engine.md)\n"
// Parses "1,2,3" (commas and/or spaces) into a malloc'd array; returns count or -1 on error.
long td_arg_ids(const char *v, int **out);

// The embedded default model's directory (assets/default-model, found relative to the executable
// first: ../assets/default-model from build/tandem; then the current directory) into buf, or NULL
// when absent (default_model.c).
const char *td_default_model_path(char *buf, size_t cap);
#define TD_DEFAULT_MODEL_HELP "assets/default-model beside the executable (../ from build/) or in the current directory"

#endif
