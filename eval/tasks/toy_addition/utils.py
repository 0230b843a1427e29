"""Choices of ``toy_addition_mc`` laid out as the toy is trained: answer digits, then EOS up to 7 answer slots.

The toy always sees a 32-token canvas (25 prompt tokens + 7 answer slots) and infers the answer's
length from the slots it has, so a bare "1327" (4 slots, nothing after) is not what it models; the
scored continuation is therefore the whole answer region, "1327" + 3 EOS, for every choice.
"""

EOS = "<|endoftext|>"
ANSWER_SLOTS = 7


def doc_to_choice(doc: dict) -> list[str]:
    return [choice + EOS * (ANSWER_SLOTS - len(choice)) for choice in doc["choices"]]


def load_dataset(data_files: dict | None = None, **_metadata):
    """The task's JSON splits, with relative ``data_files`` read next to this file, not the working directory.

    lm-eval hands ``dataset_kwargs`` (plus the task's metadata) to a ``custom_dataset`` function; the
    stock ``datasets.load_dataset`` would resolve ``data/test.jsonl`` against the working directory,
    so the stock ``lm_eval --include_path eval/tasks`` only worked from inside this folder.
    """
    from pathlib import Path

    import datasets

    here = Path(__file__).resolve().parent
    files = data_files or {"train": "data/train.jsonl", "test": "data/test.jsonl"}
    resolved = {split: str(path if Path(path).is_absolute() else here / path) for split, path in files.items()}
    return datasets.load_dataset("json", data_files=resolved)
