"""A verl run's time per step and time left (verl_logs/run_eta.py), read through the same VerlProgress the follow and
the watcher feed, on the recorded verl 0.9.1 logs; every figure checked against the log's own numbers by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_cluster.verl_logs.run_eta import FOLLOW_EVERY, WATCH_EVERY, EtaTicker, due, duration
from verl_cluster.verl_logs.verl_log import KEEP_STEPS, VerlProgress

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "verl_logs"
# the grid's PPO 0.5B run (tests/fixtures/verl_runs/calibration_runs.json: fit-ppo05, save_freq 3, 5 steps)
PPO05 = (LOGS / "h100_fit-ppo05.log").read_text()
PPO05_CMD = ("/opt/venv/bin/python -m verl.trainer.main_ppo trainer.total_training_steps=5 trainer.save_freq=3 "
             "trainer.test_freq=-1 'data.train_files=[/root/data/gsm8k/train.parquet]'")
# the plan's phases by fill: at fill 0.5 (63743.5 tokens a step / 127487) gen 6 + update_actor 3 = 9 s
PLAN = {"step_s": 12.0, "save_checkpoint_s": 12.0, "tokens_full": 127487,
        "by_fill": [[0.25, {"gen": 4.0, "update_actor": 2.0}], [0.75, {"gen": 8.0, "update_actor": 4.0}]]}


def at_each_step(text: str, progress: VerlProgress) -> dict[int, dict]:
    """The estimate after each line of the log that logs a step, fed line by line as a reader gets it."""
    out = {}
    for line in text.splitlines(keepends=True):
        progress.feed(line)
        est = progress.estimate()
        if est is not None and "timing_s/step:" in line:
            out[est["step"]] = est
    return out


def test_the_grid_ppo_run_step_by_step():
    p = VerlProgress(predicted=PLAN, keep_steps=KEEP_STEPS)
    p.learn_command(PPO05_CMD)
    got = at_each_step(PPO05, p)
    assert sorted(got) == [2, 3, 4, 5]  # step 1 (37.0 s: start-up) gives none and is in no mean
    s2 = 11.699785255000052
    s3 = 26.425586922999855 - 14.724838999999974  # step 3 saved: its timing_s/step holds the save
    e = got[2]
    assert e["step_s"] == round(s2, 2) and e["total_steps"] == 5 and e["total_from"] == "command"
    # steps 3, 4, 5 left; saves at 3 (save_freq) and 5 (the last step), none seen yet: the plan's 12 s each
    assert e["steps_left"] == 3 and e["saves_left"] == 2 and e["save_s"] == 12.0 and e["save_s_from"] == "plan"
    assert e["left_s"] == round(3 * s2 + 2 * 12.0, 1) and e["validations_left"] == 0
    e = got[3]
    mean = (s2 + s3) / 2
    assert e["step_s"] == round(mean, 2) and e["steps_left"] == 2 and e["saves_left"] == 1
    assert e["save_s"] == round(14.724838999999974, 2) and e["save_s_from"] == "measured"
    assert e["left_s"] == round(2 * mean + 14.724838999999974, 1)
    assert e["plan_step_s"] == 9.0 and e["at_fill"] == 0.5 and e["vs_plan"] == round(mean / 9.0 - 1, 3)
    assert e["text"] == "step 3/5: 11.7 s/step (plan 9, +30%), ~38 s left incl. 1 save (~15 s each)"
    s4, s5 = 9.753616583999928, 26.551643805999902 - 14.791249198999822
    assert got[4]["step_s"] == round((s2 + s3 + s4) / 3, 2)
    assert got[5]["step_s"] == round((s2 + s3 + s4 + s5) / 4, 2) and got[5]["steps_left"] == 0
    assert got[5]["text"].endswith(", last step")
    assert p.summary()["eta"] == got[5]  # what `submit --json` ends with


def test_the_total_from_verls_progress_bar_and_a_resumed_attempts_first_step_left_out():
    """The tiny GRPO run killed after step 2 (save_freq 2, 4 steps), then its resumed attempt (steps 3, 4)."""
    p = VerlProgress(keep_steps=KEEP_STEPS)
    p.learn_command("python3 -m verl.trainer.main_ppo trainer.save_freq=2 trainer.test_freq=-1")
    got = at_each_step((LOGS / "h100_grpo_tiny_worker_killed.log").read_text(), p)
    save = 0.043083751999915876
    step2 = 11.982981913999993 - save
    e = got[2]
    assert e["total_steps"] == 4 and e["total_from"] == "log"  # 'Training Progress: 0%| | 0/4'
    assert e["steps_left"] == 2 and e["saves_left"] == 1 and e["save_s"] == round(save, 2)
    assert e["left_s"] == round(2 * step2 + save, 1)
    assert e["text"] == "step 2/4: 11.94 s/step, ~24 s left incl. 1 save (~0.04 s each)"
    resumed = VerlProgress(keep_steps=KEEP_STEPS)  # a new attempt: the watcher reads it afresh
    got = at_each_step((LOGS / "h100_grpo_tiny_resumed.log").read_text(), resumed)
    assert sorted(got) == [4]  # step 3, its first, paid for the restart (49.0 s)
    assert got[4]["step_s"] == round(11.619370839999988 - 0.027912012000001596, 2) and got[4]["steps_left"] == 0


def test_total_steps_unknown_until_the_log_says_it():
    """A run whose command does not set trainer.total_training_steps: verl counts epochs x batches."""
    text = (LOGS / "h100_fit-grpo3.log").read_text()
    p = VerlProgress()
    p.learn_command("python3 -m verl.trainer.main_ppo data.train_batch_size=64")
    e = at_each_step(text, p)[3]
    assert e["total_steps"] is None and "left_s" not in e
    assert e["text"] == ("step 3: 8.37 s/step, total steps unknown (verl counts them from the data and has not "
                         "said them yet)")
    assert e["step_s"] == round((9.47239256399996 + 7.271243066000011) / 2, 2)
    told = VerlProgress()
    told.feed("(TaskRunner pid=3470) Size of train dataloader: 116, Size of val dataloader: 1\n"
              "(TaskRunner pid=3470) Total training steps: 1740\n")
    e = at_each_step(text, told)[5]
    mean = (9.47239256399996 + 7.271243066000011 + 9.02921663899997 + 9.072687009999981) / 4
    assert e["total_steps"] == 1740 and e["total_from"] == "log" and e["left_s"] == round(1735 * mean, 1)
    # no command and no printed config: the saves and validations are said not counted, not guessed
    assert e["saves_left"] is None and e["validations_left"] is None
    assert e["text"] == ("step 5/1740: 8.71 s/step, ~4h11m left; saves not counted (trainer.save_freq unknown); "
                         "validations not counted (trainer.test_freq unknown)")


def test_the_brief_example_by_hand():
    """Step 1 at 90 s, then 31.1 s a step; 200 steps, a save every 20 steps (45 s by the plan), a validation every
    50 (70 s seen at step 10)."""
    p = VerlProgress(predicted={"step_s": 27.5, "save_checkpoint_s": 45.0})
    p.feed("(TaskRunner pid=1)             'save_freq': 20,\n(TaskRunner pid=1)             'test_freq': 50,\n"
           "(TaskRunner pid=1) Total training steps: 200\n")
    p.feed("step:1 - timing_s/step:90.0\n")
    assert p.estimate() is None
    for k in range(2, 13):
        p.feed(f"step:{k} - timing_s/step:31.1" + (" - timing_s/testing:70.0" if k == 10 else "") + "\n")
    e = p.estimate()
    left = 188 * 31.1 + 10 * 45.0 + 4 * 70.0  # saves at 20..200; validations at 50, 100, 150, 200
    assert (e["saves_left"], e["validations_left"], e["left_s"]) == (10, 4, round(left, 1))
    assert e["text"] == ("step 12/200: 31.1 s/step (plan 27.5, +13%), ~1h49m left incl. 10 saves (~45 s each) "
                         "and 4 validations (~1m10s each)")
    assert duration(left) == "1h49m" and duration(3 * 86400 + 7200) == "3d2h" and duration(0.5) == "0.5 s"


def test_a_step_outside_the_seconds_the_plans_bar_allows_says_so():
    """The plan's error bar, carried in its predictions (over +70.9%, under -22.6%: the quickstart's), gives the
    seconds its step may come in between: 27.5 / 1.709 to 27.5 / 0.774 = 16.09-35.53 s, printed (and judged)
    rounded outward, 16-36 s. 31.1 s and 35.7 s are inside: the line is as before; 40 s is not, and it says so."""
    from verl_cluster.placement.envelope import range_bounds, step_range

    bar = {"pct": 75, "over": 0.709, "under": -0.226}
    lo, hi = step_range(27.5, bar)
    assert (round(lo, 2), round(hi, 2)) == (16.09, 35.53) and range_bounds(lo, hi) == (16.0, 36.0)
    for step, inside in ((31.1, True), (35.7, True), (40.0, False)):
        p = VerlProgress(predicted={"step_s": 27.5, "save_checkpoint_s": 45.0, "error_bar": bar})
        p.feed("(TaskRunner pid=1) Total training steps: 200\n")
        for k in range(1, 4):
            p.feed(f"step:{k} - timing_s/step:{step}\n")
        e = p.estimate()
        assert e["plan_range_s"] == [16.0, 36.0] and e["in_plan_range"] is inside
        said = f"(plan 27.5, {step / 27.5 - 1:+.0%})" if inside else "(plan 27.5, +46%: outside its 16-36 s)"
        assert said in e["text"]


def test_a_plan_without_a_bar_gives_no_range():
    p = VerlProgress(predicted={"step_s": 27.5, "error_bar": {"pct": 0, "over": 0.0, "under": 0.0}})
    for k in range(1, 4):
        p.feed(f"step:{k} - timing_s/step:31.1\n")
    e = p.estimate()
    assert e["plan_step_s"] == 27.5 and "plan_range_s" not in e and "in_plan_range" not in e

@pytest.mark.parametrize("last,total,freq,n", [(12, 200, 20, 10), (12, 205, 20, 11), (20, 20, 20, 0),
                                               (0, 5, -1, 0), (3, 5, 3, 1), (2, 5, 3, 2), (0, 7, None, 0)])
def test_saves_left_as_verl_decides_them(last, total, freq, n):
    """verl saves when global_step % save_freq == 0 or on the last step (ray_trainer.py, v1 trainer_base.py)."""
    assert due(last, total, freq) == n == sum(1 for s in range(last + 1, total + 1)
                                              if freq and freq > 0 and (s % freq == 0 or s == total))


def test_the_command_line_as_ray_keeps_it():
    p = VerlProgress()
    p.learn_command("python3 -m verl.trainer.main_ppo '+trainer.save_freq=10' ++trainer.total_training_steps=\"40\"")
    assert (p.eta.total, p.eta.save_freq, p.eta.test_freq) == (40, 10, -1)  # test_freq: verl's default (off)
    own = VerlProgress()
    own.learn_command("python3 -m verl.trainer.main_ppo --config-name my_ppo trainer.total_training_steps=40")
    assert (own.eta.total, own.eta.save_freq) == (40, None)  # its own config may save: not known
    script = VerlProgress()
    script.learn_command("python train.py --steps 40 'unbalanced")
    assert (script.eta.total, script.eta.save_freq) == (None, None)
    logged = VerlProgress()  # the log's own figures win over the command's
    logged.feed("Training Progress:   0%|          | 0/12 [00:00<?, ?it/s]\n")
    logged.learn_command("python3 -m verl.trainer.main_ppo trainer.total_training_steps=40")
    assert logged.eta.total == 12
    first_line = VerlProgress()  # the driver log's first line is the command
    first_line.feed("Running entrypoint for job raysubmit_1: python3 -m verl.trainer.main_ppo trainer.save_freq=5\n")
    assert (first_line.eta.save_freq, first_line.eta.test_freq) == (5, -1)


def test_a_reader_resumed_from_its_saved_state_says_what_one_that_read_it_all_says():
    whole, first = VerlProgress(predicted=PLAN), VerlProgress(predicted=PLAN, keep_steps=2)
    for p in (whole, first):
        p.learn_command(PPO05_CMD)
    whole.feed(PPO05)
    cut = PPO05.index("step:4 ")
    first.feed(PPO05[:cut])
    again = VerlProgress.from_json(json.loads(json.dumps(first.to_json())), PLAN, 2)
    again.feed(PPO05[cut:])
    assert again.estimate() == whole.estimate() and again.estimate()["step"] == 5


def test_when_a_line_is_said_again():
    def est(step, step_s, left_s, total=200):
        return {"step": step, "step_s": step_s, "left_s": left_s, "total_steps": total, "text": f"s{step}"}

    follow = EtaTicker(FOLLOW_EVERY)
    assert follow.due(None, 0) is None
    assert follow.due(est(2, 30.0, 5940), 0) == "s2"  # the first estimate at once
    assert follow.due(est(2, 30.0, 5940), 1) is None  # no new step
    assert follow.due(est(3, 30.3, 5910), 31) is None  # on course: the end 1 s later
    assert follow.due(est(4, 33.5, 6500), 62) == "s4"  # +12% a step
    assert follow.due(est(5, 33.4, 6450), 95) is None
    assert follow.due(est(6, 33.4, 5000), 130) == "s6"  # the end 20 min sooner
    assert follow.due(est(7, 33.4, 4967), 163) is None
    assert follow.due(est(8, 33.4, 4700), 130 + 300) == "s8"  # 5 minutes on
    assert follow.due(est(9, 33.4, 4700, total=None), 431) == "s9"  # the total changed
    watch = EtaTicker(WATCH_EVERY)
    assert watch.due(est(2, 30.0, 5940), 0) == "s2"
    assert watch.due(est(3, 60.0, 12000), 599) is None  # doubled, but not within 10 minutes of the last
    assert watch.due(est(23, 60.0, 10000), 600) == "s23"
    assert watch.due(est(40, 60.0, 8980), 1800) is None  # on course
    assert watch.due(est(90, 60.0, 6000), 600 + 3600) == "s90"  # hourly
