"""Tasks with many right answers: checkers accept every valid answer and refuse invalid ones, splits by constraint."""

import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch

from oled_hf.toy.long.open_tasks import (
    OPEN_TASKS,
    check_climb,
    check_open,
    check_pick,
    check_vary,
    make_climb,
    make_pick,
    make_vary,
    open_task_of,
)
from oled_hf.toy.long.tasks import (
    DEFAULT_TASKS,
    SHIPPED_TASKS,
    Problem,
    TaskSpec,
    check,
    check_answer,
    heldout_problems,
    key_is_heldout,
    train_problems,
)

ROOT = Path(__file__).resolve().parents[2]


def test_default_mix_has_open_tasks_and_drops_the_unsolved():
    assert set(OPEN_TASKS) == {"climb", "pick", "vary"} and set(OPEN_TASKS) <= set(DEFAULT_TASKS)
    assert "count" not in DEFAULT_TASKS and "add" not in DEFAULT_TASKS
    shipped = json.loads((ROOT / "oled_hf/toy/long/checkpoint/long_report.json").read_text())["tasks"]
    assert tuple(t.split(":")[0] for t in shipped) == SHIPPED_TASKS


@pytest.mark.parametrize("task", OPEN_TASKS)
def test_sampled_answers_pass_their_checker(task):
    spec = TaskSpec(task)
    problems = train_problems(spec, 500) + heldout_problems(spec, 200)
    assert all(check(p, p.answer) for p in problems)
    assert all(check_answer(p.question, p.answer) is True for p in problems[:50])
    assert {open_task_of(p.question) for p in problems} == {task}


@pytest.mark.parametrize("task", OPEN_TASKS)
def test_split_is_by_constraint_and_answers_are_spread(task):
    spec = TaskSpec(task)
    held, train = heldout_problems(spec, 200), train_problems(spec, 2000)
    assert all(key_is_heldout(task, p.key) for p in held) and not any(key_is_heldout(task, p.key) for p in train)
    assert not {p.key for p in held} & {p.key for p in train}
    assert len({p.question for p in held}) == 200
    # one constraint, many answers: the maker draws the training target per example
    maker = {"climb": make_climb, "pick": make_pick, "vary": make_vary}[task]
    assert maker(random.Random(1), spec.max_size) == maker(random.Random(1), spec.max_size)  # reproducible
    p = maker(random.Random(3), spec.max_size)
    distinct = set()
    for s in range(30):
        q = Problem(p.task, p.key, p.question, _redraw(task, p, random.Random(s)))
        assert check(q, q.answer)
        distinct.add(q.answer)
    assert len(distinct) >= 10


def _redraw(task: str, p: Problem, rng: random.Random) -> str:
    """Another valid answer to ``p``'s constraint, drawn as the maker draws its target."""
    import re

    if task == "climb":
        last, start = re.fullmatch(r"Count to ([A-P]) from (\d{3}) by 1-3", p.question).groups()
        terms = [int(start)]
        for _ in range("ABCDEFGHIJKLMNOP".index(last)):
            terms.append(terms[-1] + rng.choice((1, 2, 3)))
        return "".join(f"{'ABCDEFGHIJKLMNOP'[i]}{t:03d}" for i, t in enumerate(terms))
    last, digits = re.fullmatch(r"\w+ to ([A-P]) from (\d+)", p.question).groups()
    n = "ABCDEFGHIJKLMNOP".index(last) + 1
    if task == "pick":
        words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
        return " ".join(f"{'ABCDEFGHIJKLMNOP'[i]} {words[int(rng.choice(digits))]}" for i in range(n))
    out = [rng.choice(digits)]
    for _ in range(n - 1):
        out.append(rng.choice([d for d in digits if d != out[-1]]))
    return "".join(f"{'ABCDEFGHIJKLMNOP'[i]}{d}" for i, d in enumerate(out))


def test_climb_checker():
    q = "Count to D from 047 by 1-3"
    assert check_climb(q, "A047B048C051D053")
    assert check_climb(q, "A047B050C053D056")
    for bad in ("A047B048C051",  # stops early
                "A047B048C051D053E054",  # goes past D
                "A046B048C051D053",  # wrong start
                "A047B047C051D053",  # step 0
                "A047B051C052D053",  # step 4
                "A047C048B051D053",  # labels out of order
                "A047B48C051D053",  # not three digits
                "A047,B048,C051,D053", ""):
        assert not check_climb(q, bad), bad
    assert not check_climb("Count 4 terms from 047 by 07", "A047B048C051D053")  # not this task's question


def test_pick_checker():
    q = "Spell to C from 417"
    assert check_pick(q, "A four B four C seven") and check_pick(q, "A one B seven C four")
    for bad in ("A four B four", "A four B four C seven D one", "A four B five C seven", "A four C four B seven",
                "A four B fourC seven", "A four  B four C seven", "four four seven", ""):
        assert not check_pick(q, bad), bad


def test_vary_checker():
    q = "Vary to E from 135"
    assert check_vary(q, "A1B3C1D5E3") and check_vary(q, "A5B1C5D1E5")
    for bad in ("A1B1C3D5E3",  # the same digit twice in a row
                "A1B3C1D5E2",  # 2 is not in the set
                "A1B3C1D5", "A1B3C1D5E3F1", "B1A3C1D5E3", "A13C1D5E3", ""):
        assert not check_vary(q, bad), bad


def test_check_scores_one_answer_tasks_by_exact_match():
    p = heldout_problems(TaskSpec("reverse_labeled"), 1)[0]
    assert check(p, p.answer) and not check(p, p.answer[2:])
    assert check_answer(p.question, p.answer) is True and check_answer(p.question, "X") is False
    assert check_answer("What is 1+2?", "3") is None
    with pytest.raises(ValueError, match="task 'reverse' has no checker; tasks with many right answers: climb"):
        check_open("reverse", "Reverse 12", "21")


def _lm_eval_utils():
    spec = importlib.util.spec_from_file_location("long_answer_utils", ROOT / "eval/tasks/long_answer/utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_lm_eval_process_results_uses_the_checker():
    utils = _lm_eval_utils()
    doc = json.loads((ROOT / "eval/tasks/long_answer/data/vary/test.jsonl").read_text().splitlines()[0])
    assert utils.process_results(doc, [doc["answer"]]) == {"exact_match": 1.0, "accuracy": 1.0}
    other = _redraw("vary", Problem("vary", "", doc["question"], doc["answer"]), random.Random(9))
    assert other != doc["answer"]
    assert utils.process_results(doc, [other]) == {"exact_match": 0.0, "accuracy": 1.0}
    labels, digits = doc["answer"][0::2], doc["answer"][1::2]
    repeated = "".join(a + b for a, b in zip(labels, digits[0] + digits[:-1]))  # digit 0 twice at the start
    assert utils.process_results(doc, [repeated]) == {"exact_match": 0.0, "accuracy": 0.0}
    forced = {"task": "reverse_labeled", "question": "Reverse A1B2", "answer": "B2A1"}
    assert utils.process_results(forced, ["B2A1"]) == {"exact_match": 1.0, "accuracy": 1.0}
    assert utils.process_results(forced, ["B2A2"]) == {"exact_match": 0.0, "accuracy": 0.0}


def test_lm_eval_yamls_score_both_metrics():
    for task in (*SHIPPED_TASKS, *OPEN_TASKS):
        text = (ROOT / f"eval/tasks/long_answer/long_{task}.yaml").read_text()
        assert f"task: long_{task}\n" in text and "process_results: !function utils.process_results" in text
        assert "- metric: exact_match" in text and "- metric: accuracy" in text
        assert f"data/{task}/test.jsonl" in text and (ROOT / f"eval/tasks/long_answer/data/{task}/test.jsonl").is_file()


class _StubModel:
    """``generate`` that answers each prompt with a fixed text: scoring without a trained model."""

    def __init__(self, enc, replies: dict[str, str]):
        self.enc, self.replies = enc, replies

    def generate(self, ids, attention_mask, **_):
        from types import SimpleNamespace

        rows = []
        for row, mask in zip(ids.tolist(), attention_mask.tolist()):
            prompt = self.enc.tokenizer.decode([t for t, m in zip(row, mask) if m], skip_special_tokens=False)
            question = prompt.removeprefix(self.enc.head).removesuffix(self.enc.tail)
            rows.append(row + self.enc.answer_ids([self.replies[question]])[0] + [self.enc.eos])
        width = max(map(len, rows))
        seqs = torch.tensor([r + [self.enc.eos] * (width - len(r)) for r in rows])
        n = len(rows)
        return SimpleNamespace(sequences=seqs, iterations=torch.full((n,), 6), blocks=torch.full((n,), 2))


def test_evaluate_counts_a_valid_non_reference_answer_as_right(tmp_path):
    from oled_hf.toy.long.data import LongEncoding
    from oled_hf.toy.long.evaluate import evaluate, format_table
    from oled_hf.toy.long.tokenizer import build_long_tokenizer

    tok = build_long_tokenizer(tmp_path)
    enc = LongEncoding.from_tokenizer(tok)
    mix = (TaskSpec("vary"), TaskSpec("reverse_labeled"))
    vary, rev = heldout_problems(mix[0], 4), heldout_problems(mix[1], 2)
    replies = {p.question: _redraw("vary", p, random.Random(i)) for i, p in enumerate(vary)}
    replies[vary[0].question] = "A0"  # wrong
    replies |= {rev[0].question: rev[0].answer, rev[1].question: "A0"}
    result = evaluate(_StubModel(enc, replies), tok, (TaskSpec("vary"),), n=4, examples=0)
    row = result["tasks"][0]
    assert row["accuracy"] == 0.75 and row["scored_by"] == "checker" and row["exact_match"] < 0.75
    assert result["open"]["accuracy"] == 0.75 and row["iterations_per_block"] == 3.0
    result = evaluate(_StubModel(enc, replies), tok, (TaskSpec("reverse_labeled"),), n=2, examples=0)
    assert result["tasks"][0]["accuracy"] == result["tasks"][0]["exact_match"] == 0.5 and "open" not in result
    assert "accuracy" in format_table(result).splitlines()[1]
