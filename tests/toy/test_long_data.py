"""The long-answer toy's tasks and canvases: disjoint splits, answer lengths, chat-template prompts, noising."""

import random

import pytest
import torch

from oled_hf.toy.long.data import LongEncoding, noise_batch, required_canvas, sample_batch, write_jsonl
from oled_hf.toy.long.tasks import (
    DEFAULT_MIX,
    TaskSpec,
    addition_working,
    heldout_problems,
    key_is_heldout,
    parse_mix,
    sample_mix,
    train_problems,
)
from oled_hf.toy.long.tokenizer import build_long_tokenizer


@pytest.fixture(scope="module")
def enc(tmp_path_factory):
    return LongEncoding.from_tokenizer(build_long_tokenizer(tmp_path_factory.mktemp("longtok")))


@pytest.mark.parametrize("spec", DEFAULT_MIX, ids=str)
def test_splits_are_disjoint_by_key(spec):
    held = heldout_problems(spec, 200)
    train = train_problems(spec, 2000)
    assert all(key_is_heldout(p.task, p.key) for p in held)
    assert not any(key_is_heldout(p.task, p.key) for p in train)
    assert not {p.key for p in held} & {p.key for p in train}
    assert len({p.question for p in held}) == 200
    assert heldout_problems(spec, 5) == held[:5]  # a fixed list, the same for every caller


def test_random_mix_never_draws_heldout():
    problems = sample_mix(DEFAULT_MIX, 3000, random.Random(3))
    assert {p.task for p in problems} == {t.name for t in DEFAULT_MIX}
    assert not any(key_is_heldout(p.task, p.key) for p in problems)


@pytest.mark.parametrize("spec", DEFAULT_MIX, ids=str)
def test_answers_span_two_to_four_blocks_of_16(enc, spec):
    problems = train_problems(spec, 300) + heldout_problems(spec, 100)
    lengths = [len(a) for a in enc.answer_ids([p.answer for p in problems])]
    assert 24 <= min(lengths) and max(lengths) <= 64, (min(lengths), max(lengths))


def test_prompts_equal_the_chat_template(enc):
    tok = enc.tokenizer
    for spec in DEFAULT_MIX:
        for p in heldout_problems(spec, 3):
            ids = tok.apply_chat_template([{"role": "user", "content": p.question}], add_generation_prompt=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
            assert list(ids) == enc.prompt_ids([p.question])[0]
            assert tok.decode(enc.answer_ids([p.answer])[0]) == p.answer


def test_addition_working():
    assert addition_working(4721, 839) == "1+9+0=10,2+3+1=06,7+8+0=15,4+0+1=05;5560"
    rng = random.Random(0)
    for _ in range(200):
        a, b = rng.randrange(1, 10**6), rng.randrange(1, 10**6)
        assert addition_working(a, b).endswith(f";{a + b}")


def test_labelled_addition_and_padded_count():
    from oled_hf.toy.long.tasks import LABELS, labelled_addition_working, make_add_labeled, make_count_padded

    assert labelled_addition_working(4721, 839) == "D1+L9+0=10,C2+K3+1=06,B7+J8+0=15,A4+I0+1=05;A5B5C6D0"
    assert labelled_addition_working(9000, 1000).endswith(";1A0B0C0D0")  # a final carry comes first
    rng = random.Random(0)
    for _ in range(200):
        p = make_add_labeled(rng, rng.randint(1, 8))
        a, b = (int(x[1::2]) for x in p.question.removeprefix("Add ").split("+"))
        total = p.answer.split(";")[1]  # "A5B5C6D0", or "1A0B0C0D0" with a final carry
        carry, labelled = (1, total[1:]) if len(total) % 2 else (0, total)
        assert labelled[::2] == LABELS[: len(labelled) // 2]
        assert carry * 10 ** (len(labelled) // 2) + int(labelled[1::2]) == a + b
    with pytest.raises(ValueError, match="at most 8"):
        make_add_labeled(rng, 9)
    p = make_count_padded(random.Random(1), 8)
    terms = p.answer.split(",")
    assert len(terms) == 8 and {len(t) for t in terms} == {3}
    step = int(terms[1]) - int(terms[0])
    assert p.question == f"Count 8 terms from {terms[0]} by {step:02d}"
    assert all(int(b) - int(a) == step for a, b in zip(terms, terms[1:]))


def test_chain_walks_the_cycle_once():
    from oled_hf.toy.long.tasks import make_chain

    rng = random.Random(2)
    for size in (2, 9, 16):
        p = make_chain(rng, size)
        pairs = p.question.removeprefix("Chain ").split(",")
        succ = dict(pairs)
        assert sorted(succ) == sorted(succ.values()) == list("ABCDEFGHIJKLMNOP"[:size])
        steps = p.answer.split(",")
        assert len(steps) == size and steps[0][0] == "A" and steps[-1][1] == "A"
        assert all(succ[a] == b for a, b in steps) and all(x[1] == y[0] for x, y in zip(steps, steps[1:]))
        assert len({a for a, _ in steps}) == size  # one cycle through every label
    with pytest.raises(ValueError, match="2 to 16"):
        make_chain(rng, 17)


def test_cumsum_labeled_is_the_running_sum_mod_10(enc):
    from oled_hf.toy.long.tasks import LABELS, answer_for, make_cumsum_labeled

    assert make_cumsum_labeled(random.Random(0), 4) == make_cumsum_labeled(random.Random(0), 4)
    rng = random.Random(5)
    for size in (1, 12, 16):
        p = make_cumsum_labeled(rng, size)
        digits = [int(d) for d in p.question.removeprefix("Cumsum ")[1::2]]
        assert p.question == "Cumsum " + "".join(f"{LABELS[i]}{d}" for i, d in enumerate(digits))
        assert p.answer == "".join(f"{LABELS[i]}{sum(digits[: i + 1]) % 10}" for i in range(size))
        assert answer_for(p.question) == p.answer
    assert answer_for("Cumsum A3B1C4D9") == "A3B4C8D7"
    spec = TaskSpec("cumsum_labeled")
    lengths = [len(a) for a in enc.answer_ids([p.answer for p in heldout_problems(spec, 50)])]
    assert (spec.min_size, spec.max_size) == (12, 16) and 24 <= min(lengths) and max(lengths) <= 32
    with pytest.raises(ValueError, match="at most 16"):
        make_cumsum_labeled(rng, 17)


def test_cumsum_working_writes_each_step(enc):
    from oled_hf.toy.long.tasks import answer_for, make_cumsum_working

    assert answer_for("Sum A3B1C4D9") == "A3+0=3,B1+3=4,C4+4=8,D9+8=7"
    rng = random.Random(6)
    for size in (1, 5, 8, 16):
        p = make_cumsum_working(rng, size)
        steps = p.answer.split(",")
        assert len(steps) == size and answer_for(p.question) == p.answer
        total = 0
        for i, step in enumerate(steps):
            digit = int(p.question.removeprefix("Sum ")[2 * i + 1])
            assert step == f"{'ABCDEFGHIJKLMNOP'[i]}{digit}+{total}={(total + digit) % 10}"
            total = (total + digit) % 10
    spec = TaskSpec("cumsum_working")
    lengths = [len(a) for a in enc.answer_ids([p.answer for p in heldout_problems(spec, 50)])]
    assert 24 <= min(lengths) and max(lengths) <= 64
    with pytest.raises(ValueError, match="at most 16"):
        make_cumsum_working(rng, 17)


def test_task_spec_parsing():
    assert str(TaskSpec.parse("count:2:8-12")) == "count:2:8-12"
    assert TaskSpec.parse("add") == TaskSpec("add", 1.0, 4, 4)
    assert [t.name for t in parse_mix(["reverse", "spell:0.5"])] == ["reverse", "spell"]
    assert parse_mix(None) == DEFAULT_MIX
    for bad in ("sort", "add:0", "add:1:5-3", "add:1:2:3"):
        with pytest.raises(ValueError):
            TaskSpec.parse(bad)
    with pytest.raises(ValueError, match="twice"):
        parse_mix(["add", "add:2"])


def test_canvas_and_block_diffusion_noise(enc):
    canvas = required_canvas(enc, DEFAULT_MIX, 32)
    assert canvas % 32 == 0
    clean, lengths, problems = sample_batch(enc, DEFAULT_MIX, 64, canvas, random.Random(1))
    batch = noise_batch(clean, lengths, 16, enc.mask, enc.eos, torch.Generator().manual_seed(0))
    pos = torch.arange(canvas)[None, :]
    assert not (batch.masked & (pos < lengths[:, None])).any()  # the prompt is never masked
    assert torch.equal(batch.noised == enc.mask, batch.masked)
    near = 0
    for i in range(len(problems)):
        masked = batch.masked[i].nonzero().flatten()
        if len(masked):  # everything before the first masked position's block is clean
            block_start = int(masked[0]) // 16 * 16
            assert not batch.masked[i, :block_start].any()
            near += int(masked[0]) < int(lengths[i]) + len(enc.answer_ids([problems[i].answer])[0]) + 16
    # the current block is drawn up to the EOS's block; only a current block that drew no mask
    # (small t) leaves the first masked position further out
    assert near >= 0.8 * len(problems), near
    with pytest.raises(ValueError, match="canvas_length"):
        enc.canvases(problems, 40)


def test_jsonl_files(tmp_path):
    paths = write_jsonl(tmp_path, DEFAULT_MIX[:2], n_train=5, n_heldout=7)
    assert sorted(paths) == ["reverse_labeled/test", "reverse_labeled/train", "spell_labeled/test",
                             "spell_labeled/train"]
    assert len(paths["spell_labeled/test"].read_text().splitlines()) == 7


def test_committed_eval_data_is_current(tmp_path):
    """eval/tasks/long_answer/data equals what ``python -m oled_hf.toy.long.data`` writes today."""
    from pathlib import Path

    from oled_hf.toy.long.data import EVAL_MIX
    from oled_hf.toy.long.tasks import SHIPPED_MIX

    assert set(SHIPPED_MIX) | set(DEFAULT_MIX) == set(EVAL_MIX)  # the shipped model's tasks and the default's
    committed = Path(__file__).resolve().parents[2] / "eval" / "tasks" / "long_answer" / "data"
    for name, path in write_jsonl(tmp_path, EVAL_MIX, n_train=50, n_heldout=200).items():
        assert (committed / f"{name}.jsonl").read_text() == path.read_text(), name


def test_answer_for_solves_every_task():
    from oled_hf.toy.long.tasks import OPEN_TASKS, SHIPPED_MIX, answer_for, check_answer

    for spec in (*SHIPPED_MIX, *DEFAULT_MIX):
        for p in heldout_problems(spec, 20):
            if spec.name in OPEN_TASKS:  # many right answers: no single one to compute, a checker instead
                assert answer_for(p.question) is None and check_answer(p.question, p.answer) is True
            else:
                assert answer_for(p.question) == p.answer and check_answer(p.question, p.answer) is True
    assert answer_for("What is 1+2?") is None


def test_trace_prompts_come_from_the_split_asked():
    from oled_hf.toy.long.tasks import parse_mix
    from oled_hf.toy.long.traces import split_questions

    ckpt = "/nonexistent"  # no report there: the default mix
    held, dev = split_questions(ckpt, 3, "held-out"), split_questions(ckpt, 3, "dev")
    assert len(held) == len(dev) == 3 * len(parse_mix(None)) and not set(held) & set(dev)
    assert held[0].split()[0] != held[1].split()[0]  # round-robin over tasks
    with pytest.raises(ValueError, match="split 'test': expected one of held-out, dev"):
        split_questions(ckpt, 1, "test")
