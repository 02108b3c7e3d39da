/* ftk — the dispatcher: `ftk pack …` runs `ftk-pack …`; `ftk help` lists the tools. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../libcommon/log.h"
#include "../libcommon/version.h"

static const struct {
    const char *name, *what;
} tools[] = {
    {"import-hf", "Hugging Face Llama folder (safetensors) -> ftk weights file"},
    {"export-hf", "ftk weights file -> Hugging Face Llama folder"},
    {"import-llama2c", "llama2.c checkpoint -> ftk weights file (HF conventions)"},
    {"init", "random initial weights for a preset or config.json"},
    {"pack", "Alpaca JSON -> tokenized, packed HDF5 training data"},
    {"tokenize", "encode/decode text with a Llama tokenizer, line by line"},
    {"train", "finetune a model on packed data; checkpoints, resume"},
    {"generate", "sample text from weights or a checkpoint"},
    {"reshard", "checkpoint of S shards -> S' shards (other ranks or strategy)"},
    {"merge", "checkpoint -> consolidated weights file (HF names)"},
    {"info", "describe any ftk file"},
    {"verify", "recompute checksums and check invariants of ftk files"},
    {"plot", "runs' metrics -> SVG picture or CSV table"},
};

static void usage(FILE *out)
{
    fprintf(out, "Usage: ftk COMMAND [ARGS...]   (runs ftk-COMMAND ARGS...)\n\nCommands:\n");
    for (size_t i = 0; i < sizeof tools / sizeof tools[0]; i++)
        fprintf(out, "  %-10s %s\n", tools[i].name, tools[i].what);
    fprintf(out, "\n`ftk COMMAND --help` shows a command's options. ftk %s\n", FTK_VERSION);
}

int main(int argc, char **argv)
{
    ftk_set_tool("ftk");
    if (argc < 2 || strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        if (argc >= 3 && strcmp(argv[1], "help") == 0) {
            argv[1] = argv[2];
            argv[2] = "--help";
            argc = 3;
        } else {
            usage(argc < 2 ? stderr : stdout);
            return argc < 2 ? FTK_EXIT_USAGE : FTK_EXIT_OK;
        }
    }
    if (strcmp(argv[1], "--version") == 0) {
        ftk_version_print(stdout, "ftk");
        return 0;
    }
    char name[256];
    snprintf(name, sizeof name, "ftk-%s", argv[1]);
    argv[1] = name;
    /* Prefer the tool next to this binary, so a build tree works without PATH. */
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", dirname(self), name);
        if (access(path, X_OK) == 0)
            execv(path, argv + 1);
    }
    execvp(name, argv + 1);
    ftk_error("'%s' is not an ftk command (%s); see 'ftk help'", name + 4, strerror(errno));
    return FTK_EXIT_USAGE;
}
