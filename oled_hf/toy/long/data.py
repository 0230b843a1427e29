"""Long-answer problems on the model's canvas: chat-template prompts, answers, EOS padding, noising.

A canvas row is the chat-template prompt at position 0 (its length varies with the question), the
answer right after it, one EOS and EOS padding to the canvas end: the layout ``generate`` decodes
(blocks at absolute multiples of the block length, the answer starting mid-block). Prompt ids
come from the tokenizer on the rendered chat text, so they equal ``apply_chat_template`` (tested).

Noising is block diffusion with a clean prefix, the situation decoding meets: per row a current
answer block ``k`` is drawn (uniformly, up to the block holding the answer's EOS); answer
positions before block ``k`` stay clean, positions in block ``k`` and after are masked with
probability ``t ~ U(eps, 1]``. Under the block-causal mask, block ``k``'s predictions then see
exactly what a decoding iteration sees (prompt and finished blocks clean, the current block
partly masked); later blocks add ordinary masked-diffusion signal.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import torch

from ...fileio import check_new_files, write_folder_atomically
from .tasks import DEFAULT_MIX, SHIPPED_MIX, Problem, TaskSpec, heldout_problems, train_problems

# Every word of the chat frame and of the questions becomes one token; answer words stay spelled.
QUESTION_WORDS = ("SYSTEM", "HUMAN", "ASSISTANT", "detailed thinking off", "Reverse 0", "Spell 0",
                  "Count 0 terms from 0 by 0", "Add 0+0")


@dataclass(frozen=True)
class LongEncoding:
    """Turns problems into token ids with the long-answer tokenizer (no model, no randomness)."""

    tokenizer: object
    head: str  # chat text before the question
    tail: str  # chat text after the question (role end, assistant header)
    eos: int
    mask: int

    @classmethod
    def from_tokenizer(cls, tokenizer) -> LongEncoding:
        marker = "\x00QUESTION\x00"
        text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], add_generation_prompt=True,
                                             tokenize=False)
        head, tail = text.split(marker)
        return cls(tokenizer, head, tail, tokenizer.eos_token_id, tokenizer.mask_token_id)

    def prompt_text(self, question: str) -> str:
        return self.head + question + self.tail

    def prompt_ids(self, questions: list[str]) -> list[list[int]]:
        enc = self.tokenizer([self.prompt_text(q) for q in questions], add_special_tokens=False)
        return enc["input_ids"]

    def answer_ids(self, answers: list[str]) -> list[list[int]]:
        return self.tokenizer(list(answers), add_special_tokens=False)["input_ids"]

    def canvases(self, problems: list[Problem], canvas_length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, canvas_length] prompt + answer + EOS padding, and [N] prompt lengths."""
        prompts = self.prompt_ids([p.question for p in problems])
        answers = self.answer_ids([p.answer for p in problems])
        out = torch.full((len(problems), canvas_length), self.eos, dtype=torch.long)
        lengths = torch.empty(len(problems), dtype=torch.long)
        for i, (q, a) in enumerate(zip(prompts, answers)):
            if len(q) + len(a) + 1 > canvas_length:
                raise ValueError(f"problem {problems[i].question!r} needs {len(q) + len(a) + 1} positions; "
                                 f"canvas_length is {canvas_length}")
            out[i, : len(q)] = torch.tensor(q)
            out[i, len(q) : len(q) + len(a)] = torch.tensor(a)
            lengths[i] = len(q)
        return out, lengths


def required_canvas(enc: LongEncoding, mix: tuple[TaskSpec, ...], multiple: int, probe: int = 400) -> int:
    """Smallest multiple of ``multiple`` that holds the longest probed problem of the mix (+1 EOS).

    Probes each task at its largest size (plus random draws); the bound is then checked on every
    training batch by :meth:`LongEncoding.canvases`, which raises if a problem does not fit.
    """
    longest = 0
    for spec in mix:
        top = TaskSpec(spec.name, 1.0, spec.max_size, spec.max_size)
        problems = train_problems(top, probe) + heldout_problems(top, min(probe, 50))
        q = enc.prompt_ids([p.question for p in problems])
        a = enc.answer_ids([p.answer for p in problems])
        longest = max(longest, max(len(x) + len(y) for x, y in zip(q, a)) + 1)
    return -(-(longest + 2) // multiple) * multiple  # +2: a little slack over the probe


@dataclass
class NoisedBatch:
    clean: torch.Tensor  # [N, L]
    noised: torch.Tensor  # [N, L]
    masked: torch.Tensor  # [N, L] bool: positions replaced by the mask token (never in the prompt)
    answer: torch.Tensor  # [N, L] bool: answer slots (answer, EOS, EOS padding)
    t: torch.Tensor  # [N] noise level per row
    prompt_lengths: torch.Tensor  # [N]


def noise_batch(clean: torch.Tensor, prompt_lengths: torch.Tensor, block_length: int, mask_id: int, eos_id: int,
                generator: torch.Generator, eps: float = 1e-3) -> NoisedBatch:
    """Block diffusion with a clean prefix (see the module docstring), reproducible from ``generator``."""
    n, length = clean.shape
    pos = torch.arange(length)[None, :]
    answer = pos >= prompt_lengths[:, None]
    first_block = prompt_lengths // block_length
    # The current block runs up to the one holding the answer's EOS: later blocks are all padding.
    is_eos = (clean == eos_id) & answer
    eos_pos = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full_like(prompt_lengths, length - 1))
    span = (eos_pos // block_length - first_block + 1).clamp(min=1)
    current = first_block + (torch.rand(n, generator=generator) * span).long().clamp(max=span - 1)
    noisy_from = torch.maximum(current * block_length, prompt_lengths)
    t = eps + (1 - eps) * torch.rand(n, generator=generator)
    masked = (pos >= noisy_from[:, None]) & (torch.rand(n, length, generator=generator) < t[:, None])
    noised = torch.where(masked, torch.full_like(clean, mask_id), clean)
    return NoisedBatch(clean, noised, masked, answer, t, prompt_lengths)


def sample_batch(enc: LongEncoding, mix: tuple[TaskSpec, ...], batch_size: int, canvas_length: int,
                 rng: random.Random) -> tuple[torch.Tensor, torch.Tensor, list[Problem]]:
    from .tasks import sample_mix

    problems = sample_mix(mix, batch_size, rng)
    clean, lengths = enc.canvases(problems, canvas_length)
    return clean, lengths, problems


# The lm-eval data (eval/tasks/long_answer/data): the shipped checkpoint's tasks and the default mix's.
EVAL_MIX: tuple[TaskSpec, ...] = (*SHIPPED_MIX, *(t for t in DEFAULT_MIX if t not in SHIPPED_MIX))


def record(p: Problem) -> dict:
    """One lm-eval JSONL row: the bare question (the task YAML adds the chat frame) and the answer.

    For a task with many right answers the answer is the reference drawn with the problem (one valid
    answer); ``eval/tasks/long_answer/utils.py`` scores those tasks with the checker instead.
    """
    return {"task": p.task, "question": p.question, "answer": p.answer}


def write_jsonl(out_dir: str | os.PathLike, mix: tuple[TaskSpec, ...], n_train: int = 100,
                n_heldout: int = 200, *, overwrite: bool = False) -> dict[str, Path]:
    """Per task ``{task}/train.jsonl`` (few-shot pool) and ``{task}/test.jsonl`` (held out).

    ``out_dir`` may be missing (then its parent must exist); a task's files already there are
    refused unless ``overwrite``, every one checked before any is written. Each task's folder is
    built in a temporary sibling and moved in (:func:`~oled_hf.fileio.write_folder_atomically`):
    a failure leaves no task folder half written.
    """
    names = ("train.jsonl", "test.jsonl")
    out = check_new_files(out_dir, [], overwrite=overwrite, field="out", flag="overwrite=True (--overwrite)",
                          create=True)
    for spec in mix if out.is_dir() else ():  # a new folder holds nothing to refuse
        check_new_files(out / spec.name, names, overwrite=overwrite, field="out",
                        flag="overwrite=True (--overwrite)", create=True)
    paths = {}
    for spec in mix:
        splits = {"train": train_problems(spec, n_train), "test": heldout_problems(spec, n_heldout)}

        def build(folder: Path, splits=splits) -> None:
            for split, problems in splits.items():
                (folder / f"{split}.jsonl").write_text("".join(json.dumps(record(p)) + "\n" for p in problems))

        write_folder_atomically(build, out / spec.name)
        paths.update({f"{spec.name}/{split}": out / spec.name / f"{split}.jsonl" for split in splits})
    return paths


def main(argv: list[str] | None = None) -> None:
    """``python -m oled_hf.toy.long.data OUT [--n-train N] [--n-heldout N]``: per-task lm-eval JSONL files.

    Writes ``EVAL_MIX``: the shipped checkpoint's four tasks and the default mix's open tasks.
    """
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("out")
    parser.add_argument("--n-train", type=int, default=50)
    parser.add_argument("--n-heldout", type=int, default=200)
    parser.add_argument("--overwrite", action="store_true", help="replace the tasks' JSONL files in OUT")
    args = parser.parse_args(argv)
    try:
        paths = write_jsonl(args.out, EVAL_MIX, args.n_train, args.n_heldout, overwrite=args.overwrite)
    except (ValueError, OSError) as err:
        parser.error(str(err))
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
