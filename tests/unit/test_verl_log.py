"""verl's log lines -> per-step metrics, checkpoints and a classified failure (what `submit` prints at the end)."""

from __future__ import annotations

import numbers

from verl_cluster.verl_logs.verl_log import VerlProgress, classify, describe, parse_metrics


def verl_line(step: int, metrics: dict) -> str:
    """The line verl 0.9's console logger prints (aggregate_logger.concat_dict_to_str), as Ray forwards it."""
    parts = [f"step:{step}"] + [f"{k}:{v!r}" for k, v in metrics.items() if isinstance(v, numbers.Number)]
    return "(TaskRunner pid=4711) " + " - ".join(parts)


def test_metrics_line_parsed_with_ray_prefix_and_odd_values():
    line = verl_line(3, {"timing_s/step": 12.5, "perf/throughput": 1234.5, "actor/pg_loss": -1.5e-05,
                         "critic/vf_loss": float("nan"), "perf/max_memory_reserved_gb": 20.25})
    step, m = parse_metrics(line)
    assert step == 3
    assert m["timing_s/step"] == 12.5 and m["perf/throughput"] == 1234.5
    assert m["actor/pg_loss"] == -1.5e-05 and m["perf/max_memory_reserved_gb"] == 20.25
    assert m["critic/vf_loss"] != m["critic/vf_loss"]  # nan kept as nan
    assert parse_metrics("(TaskRunner pid=1) step 3 of 10 started") is None
    assert parse_metrics("\x1b[36m(TaskRunner pid=1)\x1b[0m step:2 - perf/throughput:5.0")[0] == 2


def test_summary_takes_last_step_peak_memory_validation_and_checkpoint():
    p = VerlProgress()
    p.feed("\n".join([
        verl_line(1, {"timing_s/step": 20.0, "perf/throughput": 100.0, "perf/max_memory_allocated_gb": 5.0,
                      "perf/max_memory_reserved_gb": 7.0}),
        "(TaskRunner pid=4711) INFO:2026-11-24 19:00:00,000:Saving checkpoint to /ckpt/ppo/global_step_2",
        verl_line(2, {"timing_s/step": 10.0, "perf/throughput": 200.0, "perf/max_memory_allocated_gb": 6.0,
                      "perf/max_memory_reserved_gb": 6.5}),
    ]) + "\n")
    p.feed(verl_line(2, {"val-core/openai/gsm8k/reward/mean@1": 0.0}) + "\n")
    s = p.summary()
    assert s["steps"] == 2 and s["last_step"] == 2
    assert s["step_time_s"] == 10.0 and s["mean_step_time_s"] == 15.0
    assert s["throughput_tokens_per_gpu_s"] == 200.0
    assert s["max_memory_allocated_gb"] == 6.0 and s["max_memory_reserved_gb"] == 7.0
    assert s["validation"] == {"val-core/openai/gsm8k/reward/mean@1": 0.0}
    assert s["checkpoints"] == ["/ckpt/ppo/global_step_2"]
    text = "\n".join(describe(s))
    assert "2 step(s)" in text and "reserved 7.0 GB" in text and "global_step_2" in text and "val-core" in text


def test_no_steps_is_said():
    assert describe(VerlProgress().summary()) == ["verl: no training step was logged"]


def test_chunks_split_mid_line_still_parse():
    p = VerlProgress()
    line = verl_line(1, {"timing_s/step": 3.0})
    p.feed(line[:20])
    assert p.steps == {}  # nothing parsed from half a line
    p.feed(line[20:] + "\nstep:2 - timing_s/step:4.0")
    assert p.summary()["steps"] == 2  # the unterminated last line counts once the stream ends


def test_failures_classified_specific_before_generic():
    oom = ["Traceback (most recent call last):", "  File x.py", "torch.OutOfMemoryError: CUDA out of memory. "
           "Tried to allocate 2.00 GiB"]
    assert classify(oom).kind == "oom"
    kv = ["ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"]
    f = classify(kv)
    assert f.kind == "oom" and "gpu_memory_utilization" in f.fix
    nccl = ["[rank0]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE)"]
    assert classify(nccl).kind == "nccl-timeout"
    missing = ["ModuleNotFoundError: No module named 'vllm'"]
    assert classify(missing).kind == "missing-package"
    override = ["Could not override 'trainer.totl_epochs'.", "Key 'totl_epochs' is not in struct"]
    assert classify(override).kind == "bad-override"
    user = ["Traceback (most recent call last):", '  File "my_reward.py", line 3, in score',
            "(TaskRunner pid=9) KeyError: 'ground_truth'"]
    f = classify(user)
    assert f.kind == "user-code" and "KeyError" in f.line
    assert classify(["step:1 - a:1.0", "all fine"]) is None


def test_shutdown_noise_after_the_real_traceback_is_skipped():
    # seen in CI on Ray 2.52: a thread's traceback printed while the driver exits follows the job's own one
    lines = ["step 2", "Traceback (most recent call last):", '  File "resumable_job.py", line 71, in main',
             "ValueError: bad value at step 3", "Exception in thread ray_print_logs:",
             "Traceback (most recent call last):", '  File "threading.py", line 1075, in _bootstrap_inner',
             "RuntimeError: can't register atexit after shutdown"]
    f = classify(lines)
    assert f.kind == "user-code" and f.line == "ValueError: bad value at step 3"
    # a chained exception still reports the last one
    chained = lines[:4] + ["During handling of the above exception, another exception occurred:",
                           "Traceback (most recent call last):", "KeyError: 'x'"]
    assert classify(chained).line == "KeyError: 'x'"
    only_noise = lines[5:]
    assert "atexit" in classify(only_noise).line


def test_the_data_loaders_exit_traceback_is_noise():
    """verl 0.9.1's TaskRunner prints this when the job ends, SUCCEEDED or not (every H100 run of the grid): a
    failed run's own error before it is the one reported."""
    end = (LOGS / "h100_fit-grpo15.log").read_text().splitlines()
    teardown = [x for x in end if "DataLoader worker" in x]
    assert teardown, "the recorded run's teardown line"
    real = ["(TaskRunnerV1 pid=4380) Traceback (most recent call last):",
            '(TaskRunnerV1 pid=4380)   File "my_reward.py", line 3, in score',
            "(TaskRunnerV1 pid=4380) KeyError: 'ground_truth'"]
    after = ["(TaskRunnerV1 pid=4380) Traceback (most recent call last):",
             '(TaskRunnerV1 pid=4380)   File "ray/_private/workers/default_worker.py", line 323, in <module>',
             *teardown]
    f = classify(real + after)
    assert f.kind == "user-code" and f.line.endswith("KeyError: 'ground_truth'")


# ---- real logs: verl 0.9.1 + vLLM 0.24 under `submit` on an H100 (tests/fixtures/verl_logs, docs/BENCHMARKS.md) ----
LOGS = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "verl_logs"


def fed(name: str) -> VerlProgress:
    p = VerlProgress()
    text = (LOGS / name).read_text()
    for i in range(0, len(text), 1000):  # in pieces, as the Jobs API streams it
        p.feed(text[i:i + 1000])
    return p


def test_real_grpo_run_summary():
    s = fed("h100_grpo_0.5b_succeeded.log").summary()
    assert s["steps"] == 3 and s["last_step"] == 3
    assert s["step_time_s"] == 82.79 and s["throughput_tokens_per_gpu_s"] == 2013.0
    assert s["max_memory_allocated_gb"] == 40.613 and s["max_memory_reserved_gb"] == 55.551
    # validation metrics come as np.float64(...) in that line
    assert s["validation"]["val-core/openai/gsm8k/acc/mean@1"] == 0.0
    assert s["validation"]["val-aux/num_turns/mean"] == 2.0
    assert s["checkpoints"] == ["/root/ckpt/grpo05/global_step_3"]
    assert fed("h100_grpo_0.5b_succeeded.log").failure() is None


def test_real_failures_are_classified_with_the_telling_line():
    f = fed("h100_ppo_tiny_no_flash_attn.log").failure()
    assert f.kind == "missing-package" and "flash-attn" in f.what and "adv_estimator=grpo" in f.fix
    assert "FlashAttention2 has been toggled on" in f.line
    f = fed("h100_grpo_0.5b_oom.log").failure()
    assert f.kind == "oom" and f.line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    f = fed("h100_grpo_tiny_micro_not_dividing.log").failure()
    assert f.kind == "config" and "divisible by force_group_size * micro_batch_size_per_gpu" in f.line


def test_real_ppo_run_with_a_critic_summary():
    # PPO (GAE critic, flash-attn 2.8.3) on the 0.5B shape, H100: verl ends with its own DataLoader-worker traceback
    # at shutdown after the last step; the job SUCCEEDED and the summary is the run's
    p = fed("h100_ppo_0.5b_succeeded.log")
    s = p.summary()
    assert s["steps"] == 3 and s["step_time_s"] == 30.86 and s["throughput_tokens_per_gpu_s"] == 769.6
    assert s["max_memory_allocated_gb"] == 17.453 and s["max_memory_reserved_gb"] == 22.41
    assert s["checkpoints"] == ["/root/ckpt/ppo05/global_step_3"]
    assert "critic/vf_loss" in p.steps[3] and s["validation"]["val-core/openai/gsm8k/acc/mean@1"] == 0.0
    assert describe(s)[0] == "verl: 3 step(s), last 3, step time 30.86 s, 769.6 tokens/s/GPU"


def test_the_block_shown_is_the_failing_traceback_not_the_shutdown_noise_after_it():
    from verl_cluster.verl_logs.verl_log import classify, traceback_block

    job = ["step 1", "step 2", "Traceback (most recent call last):", '  File "resumable_job.py", line 80, in <module>',
           "    sys.exit(main())", '  File "resumable_job.py", line 70, in main',
           '    raise ValueError(f"bad value at step {step}")', "ValueError: bad value at step 3"]
    noise = ["Exception ignored in atexit callback: <function shutdown at 0x7f>"] + [
        f'  File "/ray/_private/worker.py", line {i}, in shutdown' for i in range(30)] + [
        "RuntimeError: can't register atexit after shutdown"]
    lines = job + noise
    err = classify(lines)
    assert err.kind == "user-code" and err.line == "ValueError: bad value at step 3"
    block = traceback_block(lines, err.line)
    assert block == job[2:]  # header to the error line, none of what came after
    long = job[:3] + [f'  File "f.py", line {i}, in g' for i in range(50)] + job[-1:]
    cut = traceback_block(long, err.line, limit=20)
    assert len(cut) == 20 and cut[0].startswith("Traceback") and cut[1] == "  ..." and cut[-1] == job[-1]
    assert traceback_block(["a", "b", "c"], "nothing like it") == ["a", "b", "c"]


def test_shutdown_noise_with_its_own_traceback_header_is_skipped_too():
    from verl_cluster.verl_logs.verl_log import classify, traceback_block

    job = ["Traceback (most recent call last):", '  File "job.py", line 3, in <module>', "ValueError: bad value at step 3"]
    noise = ["Exception ignored in atexit callback: <function shutdown at 0x7f>", "Traceback (most recent call last):",
             '  File "/ray/_private/worker.py", line 1, in shutdown', "RuntimeError: can't register atexit after shutdown"]
    err = classify(job + noise)
    assert err.line == "ValueError: bad value at step 3" and traceback_block(job + noise, err.line) == job


def test_rays_runtime_env_merge_refusal_names_the_freeze_and_its_flag():
    """A program whose own ray.init(runtime_env=...) sets py_modules or a set-up hook meets the ones the collector's
    freeze ships: Ray refuses to merge them; the run's own mistake, with --no-gc-freeze as the fix."""
    line = ("ValueError: Failed to merge the Job's runtime env {'py_modules': ['gcs://a.zip'], "
            "'worker_process_setup_hook': 'vc_hooks.setup'} with a child's runtime env {'py_modules': ['/x']}")
    f = classify(["Traceback (most recent call last):", '  File "main.py", line 3', line])
    assert f.kind == "config" and "--no-gc-freeze" in f.fix and f.line.startswith("ValueError: Failed to merge")
