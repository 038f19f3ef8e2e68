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
    # micro 2 x 1024 tokens x 151936 vocab; bf16 logits (2 B) plus fp32 tensors of the loss path:
    # backward: log-softmax + two gradients in flight (2 + 12 B); forward: fp32 copy + log-softmax (2 + 8 B)
    x = TrainInputs(shape=Q05, params=Q05.params, n=1, tokens=2048, micro=2, seq=1024, c=2, m=4, grad_ckpt=True,
                    attn="flash_attention_2", vocab_out=Q05.vocab)
    step = mem.update_step(x)
    train = dict((p.name, p.bytes) for p in step.parts)
    fwd = dict((p.name, p.bytes) for p in mem.forward_phase(x, params_on_gpu=True))
    assert step.moment == "loss backward"
    assert train["logits"] == 2048 * 151936 * 14
    assert fwd["logits"] == 2048 * 151936 * 10
    # fp32 compute: .float() is a no-op, so forward has no copy
    assert mem.loss_bytes(4, "forward") == 8 and mem.loss_bytes(4, "backward") == 16


def test_update_step_moments_hand_computed():
    """0.5B on one GPU, 512 tokens: the optimizer step is the peak (20 B/param + the logits still referenced)."""
    x = TrainInputs(shape=Q05, params=Q05.params, n=1, tokens=512, micro=1, seq=512, c=2, m=4, grad_ckpt=True,
                    attn="sdpa", vocab_out=Q05.vocab)
    step = mem.update_step(x)
    parts = dict((p.name, p.bytes) for p in step.parts)
    assert step.moment == "optimizer step"
    assert parts["optimizer temp"] == Q05.params * 4  # foreach AdamW: sqrt(exp_avg_sq), one fp32 copy
    assert step.allocated == pytest.approx(Q05.params * 20 + 512 * 151936 * 6)
    assert "grad reduce" not in parts  # world 1: FSDP runs NO_SHARD, the fp32 cast is the gradient itself
    assert parts["allocator"] == pytest.approx(mem.FRAGMENT_UNITS * Q05.root_params * (2 + 4))
    two = dict((p.name, p.bytes) for p in mem.train_phase(TrainInputs(**{**x.__dict__, "n": 2})))
    assert two["grad reduce"] == Q05.root_params * 4


def test_gradient_checkpointing_keeps_layer_inputs_only():
    x = dict(shape=Q05, params=Q05.params, n=1, tokens=4096, micro=4, seq=1024, c=2, m=4, attn="sdpa",
             vocab_out=Q05.vocab)
    with_ckpt = mem.update_step(TrainInputs(grad_ckpt=True, **x))
    without = mem.update_step(TrainInputs(grad_ckpt=False, **x))
    acts = dict((p.name, p.bytes) for p in with_ckpt.parts)["activations"]
    layer = mem.layer_activation_bytes(Q05, 4096, 2)
    assert acts == 24 * 4096 * 896 * 2  # the loss moment: every layer's input, nothing recomputed yet
    assert dict((p.name, p.bytes) for p in without.parts)["activations"] == 24 * layer
    assert without.reserved - with_ckpt.reserved == pytest.approx(24 * layer - acts)


def test_eager_attention_adds_quadratic_scores():
    assert mem.attention_scores_bytes(Q05, 2, 1024, 4, "sdpa") == 0
    assert mem.attention_scores_bytes(Q05, 2, 1024, 4, "eager") == 2 * 2 * 14 * 1024 * 1024 * 4


def test_offload_moves_states_to_host():
    # grads are not kept between phases (freed after each optimizer step): params + Adam only
    gpu, host = mem.trainable_resident(1_000_000, 1, 4, param_offload=False, optimizer_offload=True)
    assert mem.total(gpu) == 4_000_000 and mem.total(host) == 8_000_000
    gpu, host = mem.trainable_resident(1_000_000, 1, 4, param_offload=True, optimizer_offload=True)
    assert mem.total(gpu) == 0 and mem.total(host) == 12_000_000


def test_rollout_kv_cache_hand_computed():
    s7 = catalog_shape("qwen2.5-7b")
    r = mem.rollout_memory(s7, total_bytes=80 * GIB, util=0.5, tp=2, dtype_bytes=2, seq=2048, max_num_seqs=256,
                           max_num_batched_tokens=8192, enforce_eager=False)
    assert r.budget == 40 * GIB
    assert r.weights == s7.params * 2 / 2
    assert r.kv_per_seq == 2 * 28 * 2 * 128 * 2 * 2048  # 2 x layers x kv_heads/TP x head_dim x 2 B x tokens
    assert r.kv_cache == pytest.approx(r.budget - r.weights - r.activations - r.graphs)
    assert r.seqs_fit == int(r.kv_cache // r.kv_per_seq)


def test_peaks_add_context_and_resident_margin():
    # the phase's own working set is already what the allocator reserves; other roles' residents get the margin
    assert mem.gpu_peak(10 * GIB, 2 * GIB) == pytest.approx(mem.CUDA_CONTEXT_BYTES + 10 * GIB + 2 * GIB * 1.1)
    r = mem.RolloutMemory(40 * GIB, 1 * GIB, 1 * GIB, 0.5 * GIB, 37.5 * GIB, 1.0, 37, workspace=2 * GIB)
    # colocated: vLLM's process (context + budget + sampler workspace) beside the trainer's (context + residents)
    assert mem.rollout_peak(r, 10 * GIB, colocated=True) == pytest.approx(
        mem.VLLM_CONTEXT_BYTES + 42 * GIB + mem.CUDA_CONTEXT_BYTES + 11 * GIB)
    assert mem.rollout_peak(r, 0.0, colocated=False) == pytest.approx(mem.VLLM_CONTEXT_BYTES + 42 * GIB)
