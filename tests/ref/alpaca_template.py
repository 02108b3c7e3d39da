"""The Alpaca prompt template, word for word as Stanford Alpaca (train.py PROMPT_DICT) and
LitGPT (prompts.py Alpaca) write it. An independent copy of what ftk-pack does in C."""

WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
NO_INPUT = (
    "Below is an instruction that describes a task. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)


def prompt_of(rec):
    if rec.get("input"):
        return WITH_INPUT.format(instruction=rec["instruction"], input=rec["input"])
    return NO_INPUT.format(instruction=rec["instruction"])
