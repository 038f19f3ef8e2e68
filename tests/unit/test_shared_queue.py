"""submit's check for verl 0.9's TransferQueue, one per Ray cluster (submit/shared_queue.py): which jobs use it,
whose live controller is on the cluster, and the finding's words. The Ray side runs for real in
tests/integration/test_submit_ray.py::test_a_second_verl_job_is_refused_while_another_holds_the_queue."""

from types import SimpleNamespace

from verl_cluster.config.job import JobSpec
from verl_cluster.submit.shared_queue import finding, queue_owners, uses_transfer_queue


def verl_job() -> JobSpec:
    return JobSpec(name="grpo", entrypoint="verl.trainer.main_ppo")


def test_verl_trainers_v1_default_uses_the_queue_legacy_and_other_programs_do_not():
    job = verl_job()
    assert uses_transfer_queue(job, {}) and uses_transfer_queue(job, {"trainer.use_v1": True})
    assert not uses_transfer_queue(job, {"trainer.use_v1": False})
    assert not uses_transfer_queue(job, {"trainer.use_v1": "false"})
    sft = JobSpec(name="sft", entrypoint="verl.trainer.sft_trainer")
    plain = JobSpec(name="x", entrypoint="train.py")
    assert not uses_transfer_queue(sft, {}) and not uses_transfer_queue(plain, {})


def test_owners_are_named_by_submission_id_only_for_a_live_controller_in_its_namespace():
    jobs = [SimpleNamespace(submission_id="grpo-a1", ray_job_id="02000000"),
            SimpleNamespace(submission_id="old-b2", ray_job_id="01000000")]
    row = {"name": "TransferQueueController", "state": "ALIVE", "ray_namespace": "transfer_queue",
           "job_id": "02000000"}
    assert queue_owners([row], jobs) == ["grpo-a1"]
    assert queue_owners([{**row, "state": "DEAD"}], jobs) == []
    assert queue_owners([{**row, "ray_namespace": "someone_else"}], jobs) == []
    assert queue_owners([{**row, "job_id": "09000000"}], jobs) == ["Ray job 09000000"]
    assert queue_owners([{**row, "name": "WorkerDict"}], jobs) == []


def test_the_finding_names_the_owner_the_hang_and_three_ways_out():
    assert finding([]) is None
    f = finding(["grpo-a1"])
    assert f.level == "error" and f.check == "shared-queue"
    assert "grpo-a1" in f.message and "one per Ray cluster" in f.message and "hang when that job ends" in f.message
    assert "verl-cluster stop grpo-a1" in f.hint and "a cluster of other machines" in f.hint and "trainer.use_v1=false" in f.hint


def test_the_probe_names_other_clusters_of_ours_running_ray_on_the_machine():
    """node_script.siblings: raylets and GCSs whose temp dir sits beside ours in this user's folder; our own, other
    kinds of process, and a temp dir of the user's choosing (its neighbours are not ours) are left out."""
    from verl_cluster.nodes.node_script import siblings

    procs = {1: (0, "/usr/bin/raylet --temp_dir=/tmp/vc-0/b --session_dir=/tmp/vc-0/b/session_1 --node_id=ab"),
             2: (0, "/usr/bin/gcs_server --session-dir=/tmp/vc-0/c/session_2"),
             3: (0, "/usr/bin/raylet --temp_dir=/tmp/vc-0/a --session_dir=/tmp/vc-0/a/session_3"),
             4: (0, "python /srv/tool.py --out=/tmp/vc-0/d/x"),
             5: (0, "/usr/bin/raylet --temp_dir=/tmp/vc-01/e")}
    assert siblings("/tmp/vc-0/a", procs) == ["b", "c"]
    assert siblings("/scratch/mine/a", {9: (0, "/usr/bin/raylet --temp_dir=/scratch/mine/z")}) == []


def test_a_verl_job_is_warned_when_its_machine_runs_another_cluster_of_ours():
    from verl_cluster.submit.shared_queue import check_shared_host

    status = SimpleNamespace(nodes=[SimpleNamespace(host="box1", other_clusters=["lab-b"]),
                                    SimpleNamespace(host="box2", other_clusters=[])])
    f, = check_shared_host(verl_job(), status)
    assert f.level == "warning" and f.check == "shared-host" and "box1: lab-b" in f.message
    assert "take each other's sockets" in f.message and "verl-cluster down -c lab-b" in f.hint
    alone = SimpleNamespace(nodes=[SimpleNamespace(host="box1", other_clusters=[])])
    assert check_shared_host(verl_job(), alone) == [] and check_shared_host(verl_job(), None) == []
    assert check_shared_host(JobSpec(name="x", entrypoint="train.py"), status) == []
