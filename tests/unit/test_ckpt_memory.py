"""A checkpoint folder on tmpfs is named before a run saves its checkpoints into RAM."""

from verl_cluster.submit.ckpt_memory import mount_fs, ram_checkpoint_warning

MOUNTS = """/dev/vda / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,relatime,size=24684084k 0 0
tmpfs /run tmpfs rw 0 0
/dev/vdb /run/data ext4 rw 0 0
/dev/vdc /mnt/my\\040disk xfs rw 0 0
"""


def test_the_longest_mount_above_the_path_decides():
    assert mount_fs("/dev/shm/ckpt/run1", MOUNTS) == "tmpfs"  # need not exist yet
    assert mount_fs("/run/data/ckpt", MOUNTS) == "ext4"  # a disk mounted inside a tmpfs
    assert mount_fs("/run/other", MOUNTS) == "tmpfs"
    assert mount_fs("/runner/ckpt", MOUNTS) == "ext4"  # /run is not a prefix of /runner
    assert mount_fs("/mnt/my disk/ckpt", MOUNTS) == "xfs"
    assert mount_fs("/dev/shm", MOUNTS) == "tmpfs"


def test_warns_only_when_saves_go_to_ram():
    msg, hint = ram_checkpoint_warning("/dev/shm/ckpt", 10, MOUNTS)
    assert "/dev/shm/ckpt is on tmpfs" in msg and "stays in RAM" in msg and "default_local_dir=" in hint
    assert ram_checkpoint_warning("/dev/shm/ckpt", -1, MOUNTS) is None  # no saves
    assert ram_checkpoint_warning("/data/ckpt", 10, MOUNTS) is None
    assert ram_checkpoint_warning("", 10, MOUNTS) is None


def test_this_machines_mounts_are_read(tmp_path):
    # /proc/mounts of the machine the tests run on: its root is a real file system, not RAM
    assert mount_fs(str(tmp_path)) is not None
    assert mount_fs("/proc/self/status") == "proc"


def test_submit_preflight_warns_of_a_tmpfs_checkpoint_folder():
    from pathlib import Path

    from verl_cluster.config.job import load_job
    from verl_cluster.submit.checkpoint_checks import ram_checkpoint_findings

    root = Path(__file__).resolve().parents[2]
    mounts = "tmpfs /dev/shm tmpfs rw 0 0\n/dev/vda1 / ext4 rw 0 0\n"  # as /proc/mounts says it on Linux

    def findings(*words):
        return ram_checkpoint_findings(load_job(root / "launch/gsm8k_grpo.yaml", list(words)), mounts)

    (f,) = findings("trainer.save_freq=5", "trainer.default_local_dir=/dev/shm/ckpt")
    assert f.level == "warning" and f.check == "checkpoint" and "stays in RAM" in f.message
    assert findings("trainer.save_freq=-1", "trainer.default_local_dir=/dev/shm/ckpt") == []  # never saves
    assert findings("trainer.save_freq=5", "trainer.default_local_dir=/var/tmp/ckpt") == []  # on disk
