"""Reading a job's log by byte ranges (verl_logs/job_log.py) against a stand-in of Ray's agent route
(tests/unit/agent_log_server.py; tests/integration/test_log_scale.py reads the real one): each poll moves only what
the job wrote since the last, a reader resumes at its offset, the last lines and the parsed progress stay bounded."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest

from tests.unit.agent_log_server import AgentLogServer, fake_api
from verl_cluster.errors import ClusterError
from verl_cluster.verl_logs import job_log
from verl_cluster.verl_logs.job_log import AgentLog, LogFollower, last_lines
from verl_cluster.verl_logs.verl_log import VerlProgress

LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "verl_logs"
STEP = ("(TaskRunner pid=4711) step:{n} - timing_s/gen:{g} - timing_s/old_log_prob:0.7 - timing_s/ref:0.4 - "
        "timing_s/adv:0.01 - timing_s/update_actor:{u} - timing_s/update_weights:0.2 - timing_s/step:{s} - "
        "timing_s/save_checkpoint:{c} - perf/total_num_tokens:{t} - perf/throughput:{p} - "
        "perf/max_memory_allocated_gb:{m} - perf/max_memory_reserved_gb:{r} - perf/cpu_memory_used_gb:{h} - "
        "response_length/mean:{rl} - response_length/max:{rm} - response_length/clip_ratio:{cr} - "
        "prompt_length/mean:{pl} - prompt_length/max:300.0\n")


def steps_log(n: int, seed: int = 1) -> str:
    """A long run's console lines: n steps of varying figures, a validation line now and then, worker noise."""
    rnd = random.Random(seed)
    out = ["(TaskRunner pid=4711) step:0 - val-core/openai/gsm8k/acc/mean@1:0.1\n"]
    for k in range(1, n + 1):
        out.append("(WorkerDict pid=99) some worker output " + "x" * rnd.randint(0, 200) + "\n")
        out.append(STEP.format(n=k, g=rnd.uniform(3, 5), u=rnd.uniform(1, 2), s=rnd.uniform(5, 9),
                               c=rnd.choice([0.0, 0.0, 3.5]), t=rnd.uniform(1e5, 2e5), p=rnd.uniform(900, 1200),
                               m=rnd.uniform(10, 20), r=rnd.uniform(20, 30), h=rnd.uniform(30, 40),
                               rl=rnd.uniform(100, 400), rm=rnd.uniform(400, 512), cr=rnd.uniform(0, 0.1),
                               pl=rnd.uniform(90, 110)))
        if k % 10 == 0:
            out.append(f"(TaskRunner pid=4711) step:{k} - val-core/openai/gsm8k/acc/mean@1:{rnd.random()}\n")
            out.append(f"(TaskRunner pid=4711) local_global_step_folder: /ckpt/global_step_{k}\n")
    return "".join(out)


@pytest.fixture
def server():
    s = AgentLogServer()
    yield s
    s.close()


def test_each_poll_fetches_only_what_the_job_wrote_since_the_last(server):
    server.write("j", "x" * 99 + "\n" + ("y" * 1023 + "\n") * 9000)  # ~9 MB before the reader comes
    f = LogFollower(AgentLog(fake_api(server), "j"))
    got = f.poll() + f.catch_up(deadline=float("inf"))
    assert f.offset == server.size("j") and not f.behind and got.endswith("y\n")
    assert max(n for *_, n in server.requests) <= job_log.CHUNK  # caught up a chunk at a time
    for k in range(5):
        before = len(server.requests)
        server.write("j", f"step:{k} - a:1.0\n" * (k + 1))
        text = f.poll()
        assert text == f"step:{k} - a:1.0\n" * (k + 1)
        (path, rng, status, sent), = server.requests[before:]
        assert status == 206 and rng.startswith(f"bytes={f.offset - sent}-") and sent == len(text)
    before = len(server.requests)
    assert f.poll() == "" and server.requests[before][2] == 416  # nothing new: nothing moved
    assert all(r[1].startswith("bytes=") for r in server.requests)  # never the whole log
    assert list(f.tail)[-1] == "step:4 - a:1.0" and len(f.tail) <= job_log.TAIL_LINES


def test_a_line_cut_between_polls_and_a_multibyte_character_read_once(server):
    seen = []
    f = LogFollower(AgentLog(fake_api(server), "j"), on_lines=[seen.append])
    printed = ""
    for piece in ("step:1 - a:1", ".0\nhé".encode(), "llo wörld\n".encode(), b"no newline"):
        server.write("j", piece)
        printed += f.poll(limit=3)  # tiny ranges: cuts inside a line and inside a character
        while f.behind:
            printed += f.poll(limit=3)
    printed += f.flush()
    assert printed == "step:1 - a:1.0\nhéllo wörld\nno newline"
    assert "".join(seen) == "step:1 - a:1.0\nhéllo wörld\nno newline\n"


def test_tail_reads_backwards_only_as_far_as_the_last_lines(server):
    server.write("j", "".join(f"line {i}\n" for i in range(200_000)))  # 2.3 MB
    data, start = last_lines(AgentLog(fake_api(server), "j"), 3)
    assert data == b"line 199997\nline 199998\nline 199999\n" and start == server.size("j") - len(data)
    assert sum(n for *_, n in server.requests) <= 64 << 10
    server.write("k", "a\nb\nno newline")
    assert last_lines(AgentLog(fake_api(server), "k"), 2)[0] == b"b\nno newline"
    assert last_lines(AgentLog(fake_api(server), "k"), 10)[0] == b"a\nb\nno newline"
    out = io.StringIO()
    assert job_log.print_log(fake_api(server), "k", out, tail=1) and out.getvalue() == "no newline"
    assert not job_log.print_log(fake_api(server), "none", io.StringIO())  # no log (yet): said, not raised


def test_a_log_that_starts_over_is_read_afresh(server):
    server.write("j", "old 1\nold 2\n")
    f = LogFollower(AgentLog(fake_api(server), "j"))
    f.poll()
    server.logs["job-driver-j.log"] = bytearray(b"new\n")
    assert f.poll() == "new\n" and f.restarted and f.offset == 4


def test_the_token_is_sent_and_a_refusal_is_one_clear_error(server):
    server.write("j", "x\n")
    api = fake_api(server)
    api.headers["Authorization"] = "Bearer wrong"
    with pytest.raises(ClusterError) as e:
        LogFollower(AgentLog(api, "j")).poll()
    assert "refused our token" in e.value.message


def test_an_agent_address_outside_the_cluster_gets_no_token(tmp_path):
    """The address comes from the Jobs API's reply: a hostile server could name any listener."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.jobs.ray_jobs import JobsApi

    root = Path(__file__).resolve().parents[2]
    spec = load_cluster(str(root / "cluster_configs/local.yaml"))
    api = JobsApi(None, "here", headers={"Authorization": "Bearer t"}, spec=spec)
    port = spec.ray.ports.dashboard_agent_listen
    for bad in (f"http://203.0.113.9:{port}", f"http://{spec.head_ip}:8080", "https://x:1", "file:///etc/passwd"):
        with pytest.raises(ClusterError):
            job_log.agent_endpoint(api, bad)


def test_a_head_on_this_machine_has_its_agent_at_any_address_of_this_machine(tmp_path):
    """Ray names the driver's agent of a head started on 127.0.0.1 by the machine's own address (its default
    route's): `submit` and `logs` on the one-node default failed 'not one of the cluster's nodes'. Any address of
    this machine is this head's; one elsewhere, or this machine for a remote head, still gets no token."""
    from verl_cluster.config.cluster import load_cluster
    from verl_cluster.jobs.ray_jobs import JobsApi

    root = Path(__file__).resolve().parents[2]
    spec = load_cluster(str(root / "cluster_configs/local.yaml"))
    api = JobsApi(None, "here", headers={"Authorization": "Bearer t"}, spec=spec)
    port = spec.ray.ports.dashboard_agent_listen
    assert job_log.agent_endpoint(api, f"http://127.0.0.2:{port}") == ("127.0.0.2", port)  # Linux: 127/8 is local
    for bad in (f"http://203.0.113.9:{port}", f"http://127.0.0.2:{port + 1}"):
        with pytest.raises(ClusterError):
            job_log.agent_endpoint(api, bad)
    remote = tmp_path / "remote.yaml"
    remote.write_text("cluster_name: remote\nhead: {host: 10.255.0.1}\n")
    api = JobsApi(None, "there", headers={"Authorization": "Bearer t"}, spec=load_cluster(str(remote)))
    with pytest.raises(ClusterError):
        job_log.agent_endpoint(api, f"http://127.0.0.2:{port}")


def test_follow_ends_on_the_status_and_prints_every_byte_once(server):
    """A verl run that SUCCEEDED can leave processes that keep writing: follow ends on the job's status, reads
    what landed after it once, and never asks for the whole log."""
    server.write("j", "step:1 - a:1.0\n")
    api = fake_api(server, status="SUCCEEDED")
    server.write("j", "step:2 - a:1.0\n\x1b]52;c;ZXZpbA==\x07")  # a clipboard write at the end
    out = io.StringIO()
    res = job_log.follow(api, "j", out=out, status_out=io.StringIO(), poll_s=0.05, progress=VerlProgress())
    assert res.status == "SUCCEEDED" and out.getvalue() == "step:1 - a:1.0\nstep:2 - a:1.0\n\x1b]52;c;ZXZpbA==\x07"
    assert res.stats.bytes == server.size("j") and res.verl["steps"] == 2

    class Tty(io.StringIO):
        def isatty(self):
            return True

    tty = Tty()
    job_log.follow(api, "j", out=tty, status_out=io.StringIO(), poll_s=0.05)
    assert tty.getvalue() == "step:1 - a:1.0\nstep:2 - a:1.0\n"  # on a terminal the escape is gone


def test_a_driver_started_by_hand_has_no_log_to_read(server):
    api = fake_api(server)
    api.client.get_job_info = lambda sid: type("Info", (), {"submission_id": None})()
    with pytest.raises(ClusterError) as e:
        LogFollower(AgentLog(api, "02000000")).poll()
    assert "not submitted through the Jobs API" in e.value.message


@pytest.mark.parametrize("keep", [1, 3, 32])
def test_folded_steps_read_as_every_step_kept(keep):
    """A reader of a long run keeps a few steps whole and sums of the rest: what it reports is the same."""
    predicted = {"phases_s": {"gen": 4.0, "old_log_prob": 0.7, "ref": 0.4, "adv": 0.01, "update_actor": 1.5,
                              "update_weights": 0.2}, "step_s": 6.8, "save_checkpoint_s": 3.0, "host_gib": 35.0}
    text = steps_log(120)
    whole, bounded = VerlProgress(predicted=predicted), VerlProgress(predicted=predicted, keep_steps=keep)
    whole.feed(text)
    for i in range(0, len(text), 4097):
        bounded.feed(text[i:i + 4097])
    assert len(bounded.steps) <= keep and len(whole.steps) == 121
    assert bounded.summary() == whole.summary() and bounded.lengths() == whole.lengths()
    assert bounded.vs_plan() == whole.vs_plan() and bounded.vs_plan()
    again = VerlProgress.from_json(json.loads(json.dumps(bounded.to_json())), predicted, keep)
    assert again.summary() == whole.summary()


def test_the_watchers_reader_resumes_at_its_offset_after_a_restart(server, tmp_path):
    """A watcher started again (the machine running it rebooted) reads on from where the last one stopped: only
    the lines before the offset that its tail needs, then what is new, never the log from its start."""
    from verl_cluster.watch.detect import LogTracker
    from verl_cluster.watch.progress import read_progress

    text = (LOGS / "h100_grpo_tiny_worker_killed.log").read_text()
    filler = "".join(f"(WorkerDict pid=7) noise {i}\n" for i in range(40_000))  # 1.1 MB between the steps
    cut = text.index("step:2")
    server.write("j", text[:cut] + filler)
    state = tmp_path / "log-j.json"
    first = LogTracker(AgentLog(fake_api(server), "j"), state)
    while True:
        first.update()
        if not first.behind:
            break
    first.save()
    assert first.progress.steps == [1]
    server.write("j", text[cut:])
    before = len(server.requests)
    second = LogTracker(AgentLog(None, "j"), state)  # as the watcher makes it: connected at its first read
    assert second.resumed_at == server.size("j") - len(text[cut:])
    second.read(fake_api(server))
    assert any(x.endswith("noise 39999") for x in second.tail)
    second.finish()
    starts = [int(r[1][6:].split("-")[0]) for r in server.requests[before:]]
    assert min(starts) >= second.resumed_at - (256 << 10)  # the tail's seed, bounded; never byte 0
    assert sum(r[3] for r in server.requests[before:]) <= len(text[cut:]) + (256 << 10)
    whole = read_progress(text)
    assert (second.progress.steps, second.progress.saves, second.progress.checkpoint) == \
        (whole.steps, whole.saves, whole.checkpoint)
    assert second.verl.summary()["steps"] == 2


def test_a_jobs_api_500_shows_the_last_line_of_the_servers_traceback():
    """The dashboard answered HTTP 500 to every submit once its working directory was gone; the message ended at
    'Traceback (most recent call last):' and the line that matters was cut (Ray's client puts the body after
    `Request failed with status code 500: ` and a '.' after it)."""
    from verl_cluster.jobs.ray_jobs import JobsApi

    body = ("Traceback (most recent call last):\n  File \"/ray/dashboard/modules/job/job_head.py\", line 1, in submit\n"
            "    cwd = os.path.abspath(os.path.curdir)\nFileNotFoundError: [Errno 2] No such file or directory")

    def submit():
        raise RuntimeError(f"Request failed with status code 500: {body}.")

    with pytest.raises(ClusterError) as e:
        JobsApi(None, "http://127.0.0.1:8265").call(submit)
    assert e.value.message == ("Ray Jobs API at http://127.0.0.1:8265: Request failed with status code 500: "
                               "FileNotFoundError: [Errno 2] No such file or directory.")


def test_jobs_json_reads_a_running_job_on_from_its_record_and_keeps_a_finished_ones_pairs(server, tmp_path,
                                                                                           monkeypatch):
    """`jobs --json` over a week-long run: each call reads only what the job wrote since the one before (its offset
    and parse state in the job's record); once the job has ended its pairs are kept and its log is not read again."""
    from types import SimpleNamespace

    from verl_cluster.records import job_records
    from verl_cluster.submit.integrations import PlanInfo, plan_metadata
    from verl_cluster.job_list.job_pairs import job_pairs, pairs_of

    monkeypatch.setenv("HOME", str(tmp_path))
    predicted = {"phases_s": {"gen": 4.0, "old_log_prob": 0.7, "ref": 0.4, "adv": 0.01, "update_actor": 1.5,
                              "update_weights": 0.2}, "step_s": 6.8}
    meta = plan_metadata(PlanInfo({}, True, {}, "planned", predicted=predicted))
    job_records.record("j", str(tmp_path / "c.yaml"), "c", "job")
    text = steps_log(60)
    half = text.index("step:31 ")
    half = text.rindex("\n", 0, half) + 1
    server.write("j", text[:half])
    api = fake_api(server)
    row = SimpleNamespace(submission_id="j", plan=meta, status="RUNNING")
    first = job_pairs(api, [row], 10)["j"]
    kept = job_records.lookup("j")["vs_plan_log"]
    assert first["vs_plan"] and kept["offset"] == half and "vs_plan_final" not in job_records.lookup("j")
    server.write("j", text[half:])
    before = len(server.requests)
    row.status = "SUCCEEDED"
    second = job_pairs(api, [row], 10)["j"]
    ranges = [r[1] for r in server.requests[before:]]
    assert ranges and all(int(r[6:].split("-")[0]) >= half for r in ranges)  # from where the first call stopped
    assert second == pairs_of(text, predicted) and job_records.lookup("j")["vs_plan_final"] == second
    before = len(server.requests)
    assert job_pairs(api, [row], 10)["j"] == second and len(server.requests) == before  # kept: not read again


def test_follow_says_the_time_left_from_step_2_and_not_at_step_1(server):
    """`submit`'s follow and `logs --follow`: the tiny GRPO run as verl 0.9.1 logged it, written as the job runs;
    the command comes from the job's entrypoint (save_freq 2), the total from verl's progress bar (0/4)."""
    import threading
    import time

    text = (LOGS / "h100_grpo_tiny_worker_killed.log").read_text()
    api = fake_api(server)
    info = api.client.get_job_info
    cmd = "python3 -m verl.trainer.main_ppo trainer.save_freq=2 trainer.test_freq=-1 trainer.default_local_dir=/ck"
    api.client.get_job_info = lambda sid: type("Info", (), {**vars(info(sid)), "entrypoint": cmd})()
    status, progress = io.StringIO(), VerlProgress(keep_steps=32)
    done = {}
    step2 = text.index("step:2 - ")
    server.write("j", text[:step2])
    t = threading.Thread(target=lambda: done.update(res=job_log.follow(api, "j", out=io.StringIO(), status_out=status,
                                                                       poll_s=0.02, progress=progress)))
    t.start()

    def wait_for(cond):
        deadline = time.monotonic() + 10
        while not cond() and time.monotonic() < deadline:
            time.sleep(0.02)
        return cond()

    try:
        assert wait_for(lambda: progress.eta.last == 1 and progress.eta.total == 4)
        time.sleep(0.2)  # several polls with step 1 in
        assert "s/step" not in status.getvalue()
        server.write("j", text[step2:])
        assert wait_for(lambda: "s/step" in status.getvalue())
    finally:  # the job ends either way
        api.client.status = "SUCCEEDED"
        t.join(15)
    eta = [x for x in status.getvalue().splitlines() if "s/step" in x]
    assert eta == ["── step 2/4: 11.94 s/step, ~24 s left incl. 1 save (~0.04 s each)"]
    assert done["res"].verl["eta"]["left_s"] == round(2 * (11.982981913999993 - 0.043083751999915876)
                                                      + 0.043083751999915876, 1)
