// `tandem <command> ...`: dispatches to the subcommands in src/cli/.
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cmd_bench.h"
#include "cli/cmd_bench_serve.h"
#include "cli/cmd_convert.h"
#include "cli/cmd_train.h"
#include "cli/cmd_eval.h"
#include "cli/cmd_export.h"
#include "cli/cmd_rl_tools.h"
#include "cli/cmd_train_data.h"
#include "cli/cmd_weights.h"
#include "model/export.h"

#define TANDEM_VERSION "0.1.0"

static void usage(FILE *f) {
    char types[160];  // export.c's table: what convert, quantize and export accept
    fprintf(f,
            "tandem %s: train, serve and post-train Llama-family models\n"
            "\n"
            "usage: tandem <command> [options]\n"
            "\n"
            "commands:\n"
            "  run [MODEL]      generate text from a prompt (MODEL: directory or .gguf; default: the embedded model)\n"
            "  serve [MODEL]    serve an OpenAI-compatible API (docs/serving.md; default: the embedded model)\n"
            "  tokenize PATH    print the token ids of a text\n"
            "  detokenize PATH  print the text of token ids\n"
            "  convert MODEL    convert a model directory or GGUF to GGUF or HF (--type: %s)\n"
            "  quantize IN OUT TYPE  convert a GGUF file to another type\n"
            "  train            train a Llama-family model (docs/training.md)\n"
            "  export CKPT      a training checkpoint to an HF directory or GGUF (--to hf|gguf -o OUT)\n"
            "  weights push|get URL  push a checkpoint or model into a running server / read its version\n"
            "  tokenizer train  learn a byte-level BPE tokenizer from text files\n"
            "  data prepare     tokenize a corpus into training shards\n"
            "  bench pp|tg|batched|ceilings  llama-bench-style speed (docs/bench.md)\n"
            "  bench serve      load-test an OpenAI-compatible server (docs/bench-serve.md)\n"
            "  eval MODEL       perplexity over token shards (docs/eval.md)\n"
            "  plot LOG...      training-log loss curves to a PNG (docs/eval.md)\n"
            "  rl --config F    GRPO post-training (docs/rl.md); rl data|eval: a task's SFT data, pass@k\n"
            "\n"
            "`tandem <command> --help` describes a command's options.\n",
            TANDEM_VERSION, td_export_type_list(types, sizeof types, false));
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "run")) return td_cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return td_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return td_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return td_cmd_detokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return td_cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "export")) return td_cmd_export(argc - 1, argv + 1);
    if (!strcmp(cmd, "weights")) return td_cmd_weights(argc - 1, argv + 1);
    if (!strcmp(cmd, "convert")) return td_cmd_convert(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return td_cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenizer")) {
        if (argc > 2 && !strcmp(argv[2], "train")) return td_cmd_tokenizer_train(argc - 2, argv + 2);
        fprintf(stderr, "tandem tokenizer: expected a subcommand: train\n");
        return 2;
    }
    if (!strcmp(cmd, "data")) {
        if (argc > 2 && !strcmp(argv[2], "prepare")) return td_cmd_data_prepare(argc - 2, argv + 2);
        fprintf(stderr, "tandem data: expected a subcommand: prepare\n");
        return 2;
    }
    if (!strcmp(cmd, "bench")) {
        if (argc > 2 && !strcmp(argv[2], "serve")) return td_cmd_bench_serve(argc - 2, argv + 2);
        return td_cmd_bench(argc - 1, argv + 1);  // pp, tg, batched, ceilings
    }
    if (!strcmp(cmd, "eval")) return td_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return td_cmd_plot(argc - 1, argv + 1);
    if (!strcmp(cmd, "rl")) return td_cmd_rl(argc - 1, argv + 1);
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("tandem %s\n", TANDEM_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "tandem: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
