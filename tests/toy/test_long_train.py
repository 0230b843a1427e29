"""The long-answer training entry point: a few tiny steps, deterministic, saved in the official layout."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import oled_hf  # noqa: F401  (registers the Auto classes)
from oled_hf.toy.long import REPORT_NAME, load_mix
from oled_hf.toy.long.tasks import TaskSpec
from oled_hf.toy.long.train import main, scheduled_lr, train_long

MICRO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
             rotary_dim=8, intermediate_size=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=8,
             n_group=4, topk_group=2)
MIX = (TaskSpec("reverse", 1.0, 24, 24), TaskSpec("count", 2.0, 10, 10))
FAST = dict(batch_size=8, eval_n=0, log_every=0, eval_every=0, warmup=2, model_overrides=MICRO, save=False)


def _state(model):
    return model.state_dict()


def test_same_seed_same_weights(tmp_path):
    a = train_long(tmp_path / "a", MIX, seed=1, steps=3, **FAST)["trained_model"]
    b = train_long(tmp_path / "b", MIX, seed=1, steps=3, **FAST)["trained_model"]
    c = train_long(tmp_path / "c", MIX, seed=2, steps=3, **FAST)["trained_model"]
    sa, sb, sc = _state(a), _state(b), _state(c)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)


def test_command_saves_checkpoint_and_report(tmp_path, monkeypatch, capsys):
    import oled_hf.toy.long.train as train_mod

    monkeypatch.setattr(train_mod, "LONG_MODEL", {**train_mod.LONG_MODEL, **MICRO})
    out = tmp_path / "ckpt"
    main([str(out), "--task", "reverse:1:24-24", "--task", "count:2:10-10", "--steps", "2", "--batch-size", "4",
          "--eval-n", "2", "--eval-every", "0", "--warmup", "1"])
    report = json.loads((out / REPORT_NAME).read_text())
    assert report["tasks"] == ["reverse:1:24-24", "count:2:10-10"] and report["steps"] == 2
    assert "held-out evaluation (2 per task): done, 2/2 setting in " in capsys.readouterr().err  # a log's duration
    assert report["command"][:3] == ["python", "-m", "oled_hf.toy.long.train"]
    assert [r["block_length"] for r in report["heldout"]] == [16, 32]
    assert [t.name for t in load_mix(out)] == ["reverse", "count"]
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["block_length"] == 16 and gen["threshold"] == 0.95
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_experts == 16


def test_time_schedule_reaches_the_floor():
    assert scheduled_lr(0, 100, 1.0, 10, 0.0, None) == 0.1  # warmup step 1 of 10
    assert abs(scheduled_lr(50, 100, 1.0, 0, 600.0, 10.0) - 0.1) < 1e-9  # the time budget is spent
    assert scheduled_lr(50, 100, 1.0, 0, 0.0, 10.0) == scheduled_lr(50, 100, 1.0, 0, 0.0, None)


def test_model_overrides_parse_to_the_field_type():
    from oled_hf.toy.long.train import parse_overrides

    assert parse_overrides(["hidden_size=192", "rope_theta=10000"]) == {"hidden_size": 192, "rope_theta": 10000.0}
    assert isinstance(parse_overrides(["hidden_size=192"])["hidden_size"], int)
    for bad, says in (("hidden=1", "FIELD one of hidden_size"), ("hidden_size", "FIELD=VALUE"),
                      ("hidden_size=big", "must be of type int"), ("hidden_size=1.5", "must be of type int")):
        try:
            parse_overrides([bad])
        except ValueError as e:
            assert says in str(e), (bad, str(e))
        else:
            raise AssertionError(f"{bad} was accepted")


def test_bad_model_override_is_a_usage_error(tmp_path, capsys):


    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "x"), "--model", "nope=3"])
    assert exc.value.code == 2 and "--model 'nope=3'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_init_continues_a_checkpoint_and_records_its_lineage(tmp_path):
    first = train_long(tmp_path / "a", MIX, seed=1, steps=2, **{**FAST, "save": True})
    again = train_long(tmp_path / "b", MIX, seed=1, steps=2, init=tmp_path / "a",
                       **{k: v for k, v in FAST.items() if k != "model_overrides"}, command=["x"])
    assert again["init"] == str(tmp_path / "a") and again["previous"]["steps"] == 2
    assert again["model"]["hidden_size"] == MICRO["hidden_size"]
    a, b = first["trained_model"].state_dict(), again["trained_model"].state_dict()
    assert any(not torch.equal(a[k], b[k]) for k in a)  # it trained on
    with pytest.raises(ValueError, match="cannot be combined with --init"):
        train_long(tmp_path / "c", MIX, steps=1, init=tmp_path / "a", **FAST)


def test_deep_preset_has_eight_moe_layers_at_minis_routing_shape(tmp_path):
    from oled_hf.toy.long.tokenizer import build_long_tokenizer
    from oled_hf.toy.long.train import preset_model
    from oled_hf.toy.train import toy_config

    config = toy_config(build_long_tokenizer(tmp_path), **preset_model("deep"))
    assert config.num_hidden_layers - config.first_k_dense_replace == 8 and config.first_k_dense_replace == 1
    assert (config.num_experts, config.num_experts_per_tok, config.n_group, config.topk_group,
            config.num_shared_experts) == (256, 8, 8, 4, 1)
    assert config.use_qk_norm and config.partial_rotary_factor < 1 and config.moe_router_enable_expert_bias
    assert preset_model("long")["num_hidden_layers"] == 4


@pytest.mark.parametrize("args,says", [
    (["--preset", "wide"], "--preset 'wide': expected one of long, deep"),
    (["--init", "/nonexistent/ckpt"], "--init /nonexistent/ckpt: no config.json there"),
    (["--task", "sort"], "unknown task 'sort'"),
])
def test_bad_start_is_a_usage_error_before_anything_is_written(tmp_path, capsys, args, says):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "x"), *args])
    assert exc.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_stages_record_every_command(tmp_path, monkeypatch):
    import oled_hf.toy.long.train as train_mod

    monkeypatch.setattr(train_mod, "LONG_MODEL", {**train_mod.LONG_MODEL, **MICRO})
    common = ["--task", "vary:1:12-12", "--steps", "1", "--batch-size", "2", "--eval-n", "0", "--eval-every", "0",
              "--warmup", "1"]
    main([str(tmp_path / "s1"), "--preset", "deep", *common])
    first = json.loads((tmp_path / "s1" / REPORT_NAME).read_text())
    assert first["preset"] == "deep" and first["model"]["num_hidden_layers"] == 9
    main([str(tmp_path / "s2"), "--init", str(tmp_path / "s1"), *common])
    second = json.loads((tmp_path / "s2" / REPORT_NAME).read_text())
    assert second["stages"] == [first["command"], second["command"]] and second["stages"][1][4:6] == [
        "--init", str(tmp_path / "s1")]
    assert second["model"]["num_hidden_layers"] == 9 and second["preset"] is None


def test_training_in_a_log_ends_with_its_duration_and_quiet_prints_nothing(tmp_path, capsys):
    import re

    train_long(tmp_path / "a", MIX, seed=1, steps=3, **FAST)
    err = capsys.readouterr().err  # pytest's capture is a pipe, as a log is
    assert re.search(r"^training: done, 3/3 step in \d+\.\d s \(", err, re.M), err
    train_long(tmp_path / "b", MIX, seed=1, steps=3, quiet=True, **FAST)
    assert "training" not in capsys.readouterr().err
