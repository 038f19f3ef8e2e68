"""The verl config probe decides quickly whether the model's config can come from the Hub: offline, transformers
would retry an unreachable Hub for about a minute inside every preflight."""

import os
import socket
import time

from verl_cluster.submit import verl_probe


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when this returns: connections are refused


def test_an_unreachable_hub_turns_the_probe_offline_within_seconds(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    t0 = time.monotonic()
    why = verl_probe.stay_offline_if_hub_unreachable(["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"])
    assert time.monotonic() - t0 < verl_probe.HUB_TIMEOUT_S + 1
    assert why == "the Hugging Face Hub is not reachable from here"
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_a_reachable_hub_or_a_local_model_leaves_it_online(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen()
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.getsockname()[1]}")
        assert verl_probe.stay_offline_if_hub_unreachable(["actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B"]) is None
    assert "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    model = tmp_path / "model"
    model.mkdir()
    assert verl_probe.stay_offline_if_hub_unreachable([f"actor_rollout_ref.model.path={model}"]) is None
    assert "HF_HUB_OFFLINE" not in os.environ


def test_the_users_own_choice_is_kept(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert verl_probe.stay_offline_if_hub_unreachable(["actor_rollout_ref.model.path=Qwen/Q"]) is None
    assert os.environ["HF_HUB_OFFLINE"] == "0"
