"""The memory formulas against hand-computed numbers."""

import pytest

from verl_cluster.placement import memory as mem
from verl_cluster.placement.memory import GIB, TrainInputs
from verl_cluster.placement.model_shape import catalog_shape

Q05 = catalog_shape("qwen2.5-0.5b")  # 494,032,768 params, hidden 896, 24 layers, vocab 151936, tied


def test_fsdp_states_16_bytes_per_param_sharded():
    p, g, o = mem.fsdp_states(Q05.params, 4, 4, trainable=True)
    assert p.bytes == Q05.params * 4 / 4
    assert g.bytes == Q05.params * 4 / 4
    assert o.bytes == Q05.params * 8 / 4
    assert (p.bytes + g.bytes + o.bytes) * 4 == 16 * Q05.params  # 16 B/param over the world


def test_logits_hand_computed():
    # micro 2 x 1024 tokens x 151936 vocab x 4 B, doubled in training (fp32 logits + their gradient)
    x = TrainInputs(shape=Q05, params=Q05.params, n=1, tokens=2048, micro=2, seq=1024, c=2, m=4, grad_ckpt=True,
                    attn="flash_attention_2", vocab_out=Q05.vocab)
    train = dict((p.name, p.bytes) for p in mem.train_phase(x))
    fwd = dict((p.name, p.bytes) for p in mem.forward_phase(x, params_on_gpu=True))
    assert train["logits"] == 2048 * 151936 * 4 * 2
    assert fwd["logits"] == 2048 * 151936 * 4


def test_gradient_checkpointing_keeps_layer_inputs_only():
    x = dict(shape=Q05, params=Q05.params, n=1, tokens=4096, micro=4, seq=1024, c=2, m=4, attn="sdpa",
             vocab_out=Q05.vocab)
    with_ckpt = dict((p.name, p.bytes) for p in mem.train_phase(TrainInputs(grad_ckpt=True, **x)))
    without = dict((p.name, p.bytes) for p in mem.train_phase(TrainInputs(grad_ckpt=False, **x)))
    layer = mem.layer_activation_bytes(Q05, 4096, 2)
    assert with_ckpt["activations"] == 24 * 4096 * 896 * 2 + 2 * layer
    assert without["activations"] == 24 * layer
    assert without["activations"] > 3 * with_ckpt["activations"]


def test_eager_attention_adds_quadratic_scores():
    assert mem.attention_scores_bytes(Q05, 2, 1024, 4, "sdpa") == 0
    assert mem.attention_scores_bytes(Q05, 2, 1024, 4, "eager") == 2 * 2 * 14 * 1024 * 1024 * 4


def test_offload_moves_states_to_host():
    gpu, host = mem.trainable_resident(1_000_000, 1, 4, param_offload=False, optimizer_offload=True)
    assert mem.total(gpu) == 8_000_000 and mem.total(host) == 8_000_000
    gpu, host = mem.trainable_resident(1_000_000, 1, 4, param_offload=True, optimizer_offload=True)
    assert mem.total(gpu) == 0 and mem.total(host) == 16_000_000


def test_rollout_kv_cache_hand_computed():
    s7 = catalog_shape("qwen2.5-7b")
    r = mem.rollout_memory(s7, total_bytes=80 * GIB, util=0.5, tp=2, dtype_bytes=2, seq=2048, max_num_seqs=256,
                           max_num_batched_tokens=8192, enforce_eager=False)
    assert r.budget == 40 * GIB
    assert r.weights == s7.params * 2 / 2
    assert r.kv_per_seq == 2 * 28 * 2 * 128 * 2 * 2048  # 2 x layers x kv_heads/TP x head_dim x 2 B x tokens
    assert r.kv_cache == pytest.approx(r.budget - r.weights - r.activations - r.graphs)
    assert r.seqs_fit == int(r.kv_cache // r.kv_per_seq)


def test_peaks_add_context_and_margin():
    assert mem.gpu_peak(10 * GIB, 2 * GIB) == pytest.approx(mem.CUDA_CONTEXT_BYTES + 12 * GIB * 1.1)
    assert mem.rollout_peak(40 * GIB, 10 * GIB) == pytest.approx(mem.CUDA_CONTEXT_BYTES + 40 * GIB + 11 * GIB)
