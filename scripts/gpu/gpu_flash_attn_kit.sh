#!/bin/bash
# Build kit for flash-attn 2.8.3 (FlashAttention 2) on the offline GPU machine, staged in one device call.
#
# Why: verl 0.9.1 loads the critic (value model) with attn_implementation="flash_attention_2" hardcoded, and
# the GPU machine (x86_64, Ubuntu 24.04, Python 3.12, torch 2.11.0+cu130, 16 cores, H100) has no flash-attn
# and no registry. PyPI has flash-attn only as an sdist whose setup.py downloads a prebuilt wheel from GitHub
# (unreachable there) and otherwise compiles 72 kernel files for 4 GPU archs (hours). The kit compiles a
# trimmed build there in a few minutes: bf16 only, head dims FA_HDIMS (default "32 64 128": the tiny test model
# in verl_cluster/testdata/tiny_model.py has 128/4 = 32, Qwen2.5-0.5B 896/14 = 64, 1.5B and 3B 128), sm_90 only.
#
# Here, from the repo root (networked, any CPU; needs curl, pip, apt-get, xz):
#   scripts/gpu/gpu_flash_attn_kit.sh [--wheel-here]
#   1. downloads into .stage-src/flashattn/dl/ (kept: reruns are cheap): the flash-attn sdist, CUDA 13.0 nvcc
#      + headers as NVIDIA's pip wheels (the versions torch 2.11.0+cu130 pins: cuda-toolkit 13.0.2), ninja,
#      and Ubuntu noble's libpython3.12-dev (for Python.h, in case the machine lacks python3.12-dev)
#   2. assembles .stage-src/flashattn/kit/: the patched, trimmed source; a pruned CUDA_HOME (nvcc, cicc,
#      ptxas, cudafe++, fatbinary, headers, libcudart); CPython 3.12 headers; ninja; check.py
#   3. --wheel-here: compiles the wheel on this machine (python3.12 needed; ~25 min on 2 cores) and stages only the
#      wheel (~10 MiB) with install.sh; otherwise packs kit/ as flashattn-kit.tar.xz + build.sh with ../shared/tools/gpu-stage.sh (parts <= 56 MiB)
#      and prints the device calls
# Env: FA_HDIMS="32 64 128" (among 32 64 96 128 192 256), FA_DISABLE="ALIBI SOFTCAP UNEVEN_K" (flash-attn's own
#      FLASHATTENTION_DISABLE_* switches; each off-feature halves the template instances per kernel file).
# There:  bash .stage/flashattn/s0/unpack.sh && bash /root/stage/flashattn/files/build.sh
#   build.sh's header says what the GPU machine must have; it builds the wheel, installs it with --no-deps
#   into /root/stage/verl/site and checks it on the GPU against torch SDPA.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
name=flashattn; src=.stage-src/$name; dl=$src/dl; kit=$src/kit
FA_VERSION=2.8.3
FA_HDIMS=${FA_HDIMS:-"32 64 128"}
FA_DISABLE=${FA_DISABLE-"ALIBI SOFTCAP UNEVEN_K"}
for p in /.stage/ /.stage-src/; do   # keep the downloads out of git and out of what a device call carries
  grep -qxF "$p" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "$p" >> .git/info/exclude; }
done
mkdir -p "$dl"

# --- 1. downloads ---------------------------------------------------------------------------------------------
# The sdist: `pip download flash-attn` runs setup.py to read metadata, and that imports torch, so take the file's
# URL and sha256 from PyPI's simple index (PEP 691 JSON) and check the hash.
sdist=$dl/flash_attn-$FA_VERSION.tar.gz
if [ ! -s "$sdist" ]; then
  read -r url sha < <(curl -fsSL -H 'Accept: application/vnd.pypi.simple.v1+json' https://pypi.org/simple/flash-attn/ |
    python3 -c "import json,sys; f=[f for f in json.load(sys.stdin)['files'] if f['filename']=='flash_attn-$FA_VERSION.tar.gz'][0]; print(f['url'], f['hashes']['sha256'])")
  curl -fsSL -o "$sdist.tmp" "$url"
  echo "$sha  $sdist.tmp" | sha256sum -c --quiet - && mv "$sdist.tmp" "$sdist"
fi
# CUDA 13.0 compiler and headers as wheels, at cuda-toolkit 13.0.2's pins (the CUDA that torch 2.11.0+cu130 was
# built with; nvidia-nvvm must be pinned: left free pip picks a newer cicc). All unpack into nvidia/cu13/.
cuda_wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-cuda-runtime==13.0.96
             nvidia-cuda-cccl==13.0.85 ninja==1.13.2)
plat=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp)
for t in manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_12 manylinux2010 manylinux1; do plat+=(--platform "${t}_x86_64"); done
python3 -m pip download -q "${plat[@]}" -i https://pypi.org/simple -d "$dl/whl" "${cuda_wheels[@]}"
# Python.h for 3.12: Ubuntu noble's libpython3.12-dev (the GPU machine's OS), fetched with apt-get through a
# private apt state (this machine's own apt sources are left alone). The Ubuntu archive key is usually not in
# this machine's keyring, hence trusted=yes; apt still checks each .deb against the index's sha256. Fallback: the
# headers of any local CPython 3.12 (same C API; pyconfig.h of another build of the same release).
if ! ls "$dl"/libpython3.12-dev_*_amd64.deb >/dev/null 2>&1; then
  a=$root/$src/apt; mkdir -p "$a/lists/partial" "$a/cache/archives/partial"
  printf 'deb [trusted=yes] http://archive.ubuntu.com/ubuntu noble%s main\n' "" -updates -security > "$a/sources.list"
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists="$a/lists" -oDir::Cache="$a/cache"
     -oDir::Etc::SourceList="$a/sources.list" -oDir::Etc::SourceParts=/nonexistent -oAcquire::AllowInsecureRepositories=true)
  { apt-get "${o[@]}" update -qq && (cd "$dl" && apt-get "${o[@]}" download libpython3.12-dev); } >/dev/null 2>&1 ||
    echo "note: libpython3.12-dev .deb not fetched; falling back to a local CPython 3.12's headers" >&2
fi

# --- 2. the kit tree --------------------------------------------------------------------------------------------
rm -rf "$kit"; mkdir -p "$kit/tools" "$kit/pyinc"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# 2a. flash-attn source, trimmed to what setup.py's CUDA build reads: setup.py, README.md (setup.py reads it),
# the flash_attn Python package, csrc/flash_attn (kernels of the kept head dims only) and cutlass's headers.
tar xzf "$sdist" -C "$tmp"
fa=$tmp/flash_attn-$FA_VERSION
# The patch (flash-attn's own sources, not committed anywhere): setup.py keeps the bf16 .cu files of FA_HDIMS
# and adds FA_DISABLE's defines; static_switch.h's FP16_SWITCH / HEADDIM_SWITCH dispatch only into compiled
# kernels (no undefined symbol at import) and raise a clear RuntimeError for fp16 or another head dim.
cat > "$kit/patch_fa.py" <<'EOF'
"""Trim a flash-attn 2.8.3 source tree to the kernels one model needs, so it compiles in minutes.

usage: python3 patch_fa.py SRC_DIR "32 64" "ALIBI SOFTCAP UNEVEN_K"
- setup.py: keep flash_api.cpp and the bf16 .cu files of the given head dims (fwd, fwd causal, bwd, bwd causal,
  split-kv fwd, split-kv fwd causal: all that flash_api.cpp's run_mha_fwd / run_mha_bwd dispatch into); add
  -DFLASHATTENTION_DISABLE_<X> for each feature named (upstream's own switches: flash_api.cpp then raises
  "This flash attention build does not support ..." when one is asked for); drop setup_requires (offline);
  take bdist_wheel from setuptools when wheel no longer ships it.
- static_switch.h: FP16_SWITCH and HEADDIM_SWITCH dispatch only into what was compiled, so the extension has no
  undefined symbol; fp16 or another head dim raise a RuntimeError (TORCH_CHECK) naming what this build has.
"""
import re
import sys
from pathlib import Path

src = Path(sys.argv[1])
hdims = sorted(int(d) for d in sys.argv[2].split())
disable = sys.argv[3].split() if len(sys.argv) > 3 else []
upstream = [32, 64, 96, 128, 192, 256]  # HEADDIM_SWITCH buckets: (previous, d] -> the kernel of head dim d
assert hdims and all(d in upstream for d in hdims), f"head dims must be among {upstream}"
allowed_disable = {"ALIBI", "SOFTCAP", "UNEVEN_K", "DROPOUT", "LOCAL"}
assert set(disable) <= allowed_disable, f"disable must be among {sorted(allowed_disable)}"

# --- setup.py
setup = src / "setup.py"
text = setup.read_text()
kept = [f"_hdim{d}_bf16_" for d in hdims]
n_before = len(re.findall(r'"csrc/flash_attn/src/flash_\w+\.cu",', text))
text = re.sub(r'^\s*"csrc/flash_attn/src/(flash_\w+)\.cu",\n',
              lambda m: m.group(0) if any(k in m.group(1) + "_" for k in kept) else "", text, flags=re.M)
n_after = len(re.findall(r'"csrc/flash_attn/src/flash_\w+\.cu",', text))
assert n_before == 72 and n_after == 6 * len(hdims), (n_before, n_after)
defs = [f'"-DFLASHATTENTION_DISABLE_{x}"' for x in disable]
text, n1 = re.subn(r'(    "--use_fast_math",)', lambda m: m.group(1) + "".join(f"\n    {d}," for d in defs), text, count=1)
# the same defines for flash_api.cpp (host side), where the runtime checks live
text, n2 = re.subn(r'compiler_c17_flag=\["-O3", "-std=c\+\+17"\]',
                   lambda m: 'compiler_c17_flag=["-O3", "-std=c++17"' + "".join(", " + d for d in defs) + "]", text, count=1)
text, n3 = re.subn(r'\n    setup_requires=\[[^\]]*\],', "", text, count=1)
text, n4 = re.subn(r'^from wheel\.bdist_wheel import bdist_wheel as _bdist_wheel$',
                   "try:\n    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel\n"
                   "except ImportError:\n    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel", text, count=1, flags=re.M)
assert (n1, n2, n3, n4) == (1, 1, 1, 1), (n1, n2, n3, n4)
setup.write_text(text)

# --- static_switch.h
sw = src / "csrc/flash_attn/src/static_switch.h"
text = sw.read_text()
fp16 = ('#define FP16_SWITCH(COND, ...)                                                        \\\n'
        '  [&] {                                                                               \\\n'
        '    TORCH_CHECK(!(COND), "this flash_attn build (verl-cluster kit) has bf16 kernels "  \\\n'
        '                "only; got fp16 inputs");                                             \\\n'
        '    using elem_type = cutlass::bfloat16_t;                                            \\\n'
        '    return __VA_ARGS__();                                                             \\\n'
        '  }()\n')
hd = "#define HEADDIM_SWITCH(HEADDIM, ...)                                  \\\n  [&] {                                                         \\\n"
for i, d in enumerate(hdims):
    lo = ([0] + upstream)[upstream.index(d)]
    hd += (f"    {'if' if i == 0 else '} else if'} (HEADDIM > {lo} && HEADDIM <= {d}) {{".ljust(62) + "\\\n"
           + f"      constexpr static int kHeadDim = {d};".ljust(62) + "\\\n"
           + "      return __VA_ARGS__();".ljust(62) + "\\\n")
hd += ("    } else {".ljust(62) + "\\\n"
       + f'      TORCH_CHECK(false, "this flash_attn build (verl-cluster kit) has head dims {", ".join(map(str, hdims))} "'.ljust(62) + "\\\n"
       + '                  "only; got ", HEADDIM);'.ljust(62) + "\\\n"
       + "    }".ljust(62) + "\\\n  }()\n")
text, n1 = re.subn(r"#define FP16_SWITCH\(COND, \.\.\.\).*?\}\(\)\n", lambda m: fp16, text, count=1, flags=re.S)
text, n2 = re.subn(r"#define HEADDIM_SWITCH\(HEADDIM, \.\.\.\).*?\}\(\)\n", lambda m: hd, text, count=1, flags=re.S)
assert (n1, n2) == (1, 1)
sw.write_text(text)
print(f"patched {src}: bf16 only, head dims {hdims}, {n_after} kernel files, disabled: {disable or 'none'}")
EOF
python3 "$kit/patch_fa.py" "$fa" "$FA_HDIMS" "$FA_DISABLE"
mkdir -p "$kit/flash_attn-$FA_VERSION/csrc/cutlass" "$kit/flash_attn-$FA_VERSION/csrc/flash_attn/src"
cp -a "$fa"/{setup.py,README.md,LICENSE,AUTHORS,flash_attn} "$kit/flash_attn-$FA_VERSION/"
cp -a "$fa/csrc/cutlass/include" "$kit/flash_attn-$FA_VERSION/csrc/cutlass/"
cp -a "$fa/csrc/flash_attn/flash_api.cpp" "$kit/flash_attn-$FA_VERSION/csrc/flash_attn/"
cp -a "$fa"/csrc/flash_attn/src/*.h "$fa"/csrc/flash_attn/src/*.cuh "$kit/flash_attn-$FA_VERSION/csrc/flash_attn/src/"
for f in $(grep -o 'csrc/flash_attn/src/flash_[a-z0-9_]*\.cu' "$fa/setup.py"); do cp -a "$fa/$f" "$kit/flash_attn-$FA_VERSION/$f"; done
# 2b. CUDA_HOME: the wheels all unpack into nvidia/cu13/{bin,nvvm,include,lib}, a tree nvcc.profile already
# describes (TOP = bin/..). Kept: what `nvcc -c` for sm_90 runs (nvcc --dryrun: cicc, cudafe++, ptxas,
# fatbinary, and the host gcc), libdevice, the headers, and libcudart.so.13 (torch links -lcudart). Dropped:
# nvlink and the static/device-runtime libraries (only for -rdc / -dlink), libnvvm.so (NVRTC/JIT only).
for w in "$dl"/whl/nvidia_*.whl; do python3 -m zipfile -e "$w" "$tmp/cuda-wheels"; done
cu=$tmp/cuda-wheels/nvidia/cu13; c=$kit/cuda
mkdir -p "$c/bin" "$c/nvvm/bin" "$c/lib"
cp -a "$cu"/bin/{nvcc,nvcc.profile,cudafe++,ptxas,fatbinary,crt} "$c/bin/"
cp -a "$cu/nvvm/bin/cicc" "$c/nvvm/bin/"; cp -a "$cu/nvvm/libdevice" "$c/nvvm/"
cp -a "$cu/include" "$c/"; cp -a "$cu/lib/libcudart.so.13" "$c/lib/"
chmod +x "$c"/bin/{nvcc,cudafe++,ptxas,fatbinary} "$c/nvvm/bin/cicc"
# 2c. CPython 3.12 headers: usr/include/python3.12 + usr/include/x86_64-linux-gnu/python3.12/pyconfig.h
deb=$(ls "$dl"/libpython3.12-dev_*_amd64.deb 2>/dev/null | tail -1 || true)
if [ -n "$deb" ]; then
  dpkg-deb -x "$deb" "$tmp/pydev" && cp -a "$tmp/pydev/usr/include/." "$kit/pyinc/"
else
  inc=$(python3.12 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  cp -a "$inc" "$kit/pyinc/python3.12"
fi
[ -f "$kit/pyinc/python3.12/Python.h" ] || { echo "no CPython 3.12 headers for the kit" >&2; exit 1; }
# 2d. ninja (torch's cpp_extension compiles in parallel only through ninja; used there only if it has none)
python3 -m zipfile -e "$(ls "$dl"/whl/ninja-*.whl)" "$tmp/ninja"
cp "$tmp"/ninja/ninja-*.data/scripts/ninja "$kit/tools/ninja"; chmod +x "$kit/tools/ninja"
printf 'FA_VERSION=%s\nFA_HDIMS="%s"\nFA_DISABLE="%s"\n' "$FA_VERSION" "$FA_HDIMS" "$FA_DISABLE" > "$kit/kit.env"

# 2e. check.py: the GPU check build.sh runs after installing (also runnable alone: python check.py)
cat > "$kit/check.py" <<'EOF'
"""Check the installed flash_attn on the GPU: import, then bf16 forward + backward against torch SDPA.

For each compiled head dim, causal and not: flash_attn_func (GQA, 14 query / 2 kv heads as Qwen2.5-0.5B, odd
lengths), flash_attn_varlen_func (3 packed sequences, as verl's remove-padding path), flash_attn_with_kvcache
(num_splits=4: the split-kv kernels). Each is compared with an fp32 reference (SDPA on upcast inputs); it
passes when its error is within a few times that of bf16 SDPA (flash-attn's own test criterion), and the max
abs difference to bf16 SDPA is printed. Then: fp16 and an uncompiled head dim must raise clear errors, and,
if transformers imports, a 2-layer Qwen2 token-classification model (as verl's critic) must run with
attn_implementation="flash_attention_2" and match "sdpa".
"""
import os
import sys

import torch
import torch.nn.functional as F

HDIMS = [int(d) for d in os.environ.get("FA_HDIMS", "32 64 128").split()]
import flash_attn  # noqa: E402
import flash_attn_2_cuda  # noqa: E402
from flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache  # noqa: E402

print(f"flash_attn {flash_attn.__version__} from {os.path.dirname(flash_attn.__file__)}; "
      f"extension {flash_attn_2_cuda.__file__}")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()} (sm_{''.join(map(str, torch.cuda.get_device_capability()))})")
dev, bf16 = "cuda", torch.bfloat16
failures = []


def sdpa(q, k, v, causal):  # q (b, s, h, d), k/v (b, s, hk, d) -> (b, s, h, d); GQA by repeating kv heads
    rep = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(rep, dim=2) for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2)


def compare(label, fa, ref32, ref16, out_factor=2.0, grad_factor=3.0):
    """fa/ref32/ref16: lists of tensors (out, dq, dk, dv); the first is the output."""
    worst, bad = 0.0, []
    for i, (a, r, p) in enumerate(zip(fa, ref32, ref16)):
        err, base = (a.float() - r).abs().max().item(), (p.float() - r).abs().max().item()
        worst = max(worst, (a.float() - p.float()).abs().max().item())
        if not err <= (out_factor if i == 0 else grad_factor) * base + 1e-3:
            bad.append(f"{label} {['out', 'dq', 'dk', 'dv'][i]}: err {err:.3g} vs SDPA bf16 err {base:.3g}")
    failures.extend(bad)
    print(f"  {label:<42} max|fa - sdpa_bf16| (out, grads) = {worst:.3e}  {'FAIL' if bad else 'ok'}")


def run(fn, q, k, v, g):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    out.backward(g)
    return [out.detach(), q.grad, k.grad, v.grad]


torch.manual_seed(0)
for d in HDIMS:
    for causal in (False, True):
        b, s, h, hk = 2, 333, 14, 2
        q, k, v = (torch.randn(b, s, n, d, device=dev, dtype=bf16) for n in (h, hk, hk))
        g = torch.randn(b, s, h, d, device=dev, dtype=bf16)
        fa = run(lambda q, k, v: flash_attn_func(q, k, v, causal=causal), q, k, v, g)
        r32 = run(lambda q, k, v: sdpa(q.float(), k.float(), v.float(), causal), q, k, v, g)
        r16 = run(lambda q, k, v: sdpa(q, k, v, causal), q, k, v, g)
        compare(f"flash_attn_func d={d} causal={causal}", fa, r32, r16)

        lens = [100, 1, 229]  # packed sequences
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
        t = sum(lens)
        q, k, v = (torch.randn(t, n, d, device=dev, dtype=bf16) for n in (h, hk, hk))
        g = torch.randn(t, h, d, device=dev, dtype=bf16)

        def packed(fn32):
            def f(q, k, v):
                return torch.cat([fn32(q[None, a:e], k[None, a:e], v[None, a:e])[0]
                                  for a, e in zip(cu[:-1].tolist(), cu[1:].tolist())])
            return f
        fa = run(lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal), q, k, v, g)
        r32 = run(packed(lambda q, k, v: sdpa(q.float(), k.float(), v.float(), causal)), q, k, v, g)
        r16 = run(packed(lambda q, k, v: sdpa(q, k, v, causal)), q, k, v, g)
        compare(f"flash_attn_varlen_func d={d} causal={causal}", fa, r32, r16)

    # decoding against a kv cache with the split-kv kernels (forward only)
    b, sk, h, hk = 3, 777, 14, 2
    q = torch.randn(b, 1, h, d, device=dev, dtype=bf16)
    kc, vc = (torch.randn(b, sk, hk, d, device=dev, dtype=bf16) for _ in range(2))
    out = flash_attn_with_kvcache(q, kc, vc, causal=True, num_splits=4)
    r32 = sdpa(q.float(), kc.float(), vc.float(), False)
    r16 = sdpa(q, kc, vc, False)
    compare(f"flash_attn_with_kvcache d={d} splits=4", [out], [r32], [r16])


def expect_error(label, fn, needle):
    try:
        fn()
    except RuntimeError as e:
        ok = needle in str(e)
        print(f"  {label:<38} raises: {str(e).splitlines()[0][:100]}")
        if not ok:
            failures.append(f"{label}: unexpected error {e}")
        return
    failures.append(f"{label}: no error raised")


x = torch.randn(1, 16, 2, HDIMS[0], device=dev)
expect_error("fp16 inputs", lambda: flash_attn_func(x.half(), x.half(), x.half()), "bf16 kernels only")
other = next(d for d in (128, 96, 256, 64, 32) if d not in HDIMS)
y = torch.randn(1, 16, 2, other, device=dev, dtype=bf16)
expect_error(f"head dim {other}", lambda: flash_attn_func(y, y, y), "head dims")

try:
    import transformers
    from transformers import AutoModelForTokenClassification, Qwen2Config
except Exception as e:  # noqa: BLE001
    print(f"  transformers not importable ({e}): model check skipped")
else:
    for hidden, heads in ((128, 4), (256, 4), (512, 4)):  # head_dim 32 (the tiny model), 64 (0.5B), 128 (1.5B, 3B)
        if hidden // heads not in HDIMS:
            continue
        cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads, num_key_value_heads=2,
                          intermediate_size=2 * hidden, vocab_size=512, num_labels=1)
        torch.manual_seed(0)
        models = {}
        torch.set_default_dtype(bf16)  # created in bf16 (FA2 refuses/warns on fp32), across transformers 4.x/5.x
        try:
            for impl in ("flash_attention_2", "sdpa"):
                # eval(): the token-classification head has dropout (0.1 by default), random per model in train mode
                models[impl] = AutoModelForTokenClassification.from_config(cfg, attn_implementation=impl).to(dev).eval()
        finally:
            torch.set_default_dtype(torch.float32)
        models["sdpa"].load_state_dict(models["flash_attention_2"].state_dict())
        ids = torch.randint(0, 512, (2, 57), device=dev)
        mask = torch.ones_like(ids)
        mask[1, 40:] = 0  # right padding in the second row
        outs = {}
        for impl, m in models.items():
            logits = m(input_ids=ids, attention_mask=mask).logits
            (logits * mask[..., None]).sum().backward()
            outs[impl] = logits.detach().float()
        keep = mask.bool()
        diff = (outs["flash_attention_2"][keep] - outs["sdpa"][keep]).abs().max().item()
        scale = outs["sdpa"][keep].abs().max().item()
        print(f"  transformers {transformers.__version__} Qwen2 critic head_dim={hidden // heads}: "
              f"max|fa2 - sdpa| logits = {diff:.3e} (max |logit| {scale:.3g})")
        if not diff <= 0.05 * max(scale, 1.0):
            failures.append(f"transformers head_dim={hidden // heads}: logits differ by {diff}")

if failures:
    print("CHECK FAILED:\n  " + "\n  ".join(failures))
    sys.exit(1)
print("CHECK OK")
EOF

# 2f. build.sh: runs there
cat > "$src/build.sh" <<'EOF'
#!/bin/bash
# Build the trimmed flash-attn 2.8.3 of flashattn-kit.tar.xz on the offline GPU machine, install it into
# /root/stage/verl/site (where verl and its wheels are; PYTHONPATH points there) and check it on the GPU.
#   bash /root/stage/flashattn/files/build.sh        (after the staging calls; see scripts/gpu/gpu_flash_attn_kit.sh)
# What the machine must have (each is checked below, with a message saying what is missing):
#   - x86_64 Linux with an NVIDIA sm_90 GPU (H100/H200) and a driver for CUDA 13.0 (>= 580)
#   - a Python 3.12 with torch 2.11.0+cu130 (any 2.x+cu13x should do): FA_PYTHON, else /opt/torch/.venv/bin/python,
#     else python3; with pip, setuptools and wheel importable (torch's venv has them)
#   - a host C/C++ toolchain: c++/g++ (gcc 11..15 for CUDA 13.0) with binutils (ld) -- NOT carried
#   - ~1.5 GB of disk under FA_WORK (default /root/fa-build); ~6 GB of RAM per parallel nvcc job (13 jobs)
# Carried in the kit, so the machine need not have them:
#   - CUDA 13.0.88's nvcc/cicc/ptxas/cudafe++/fatbinary, the CUDA 13.0 runtime + crt + CCCL headers, libcudart:
#     assembled into FA_WORK/cuda as CUDA_HOME (FA_CUDA_HOME=/usr/local/cuda uses an installed toolkit instead).
#     Headers the carried set lacks (cublas, cusparse, ...: this build was found not to need any) are linked in
#     from that python's site-packages nvidia/*/include when present there.
#   - CPython 3.12 headers (Ubuntu noble libpython3.12-dev): used only when that python's Python.h is missing
#   - ninja 1.13: used only when no `ninja` is on PATH (torch compiles in parallel only through ninja)
# Env: FA_SITE (install target, /root/stage/verl/site), FA_WORK, MAX_JOBS (default: all cores), FA_SKIP_CHECK=1.
# If $OUT is set (a device call), the build log and the wheel (if <= 16 MiB) are copied there: carry that wheel
# next time and `pip install --no-deps --target` it instead of building.
set -euo pipefail
t0=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
SITE=${FA_SITE:-/root/stage/verl/site}
WORK=${FA_WORK:-/root/fa-build}
say() { echo "[build.sh +$(( $(date +%s) - t0 ))s] $*"; }
die() { echo "build.sh: $*" >&2; exit 1; }

PY=
for c in ${FA_PYTHON:-} /opt/torch/.venv/bin/python python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import torch' 2>/dev/null; then PY=$(command -v "$c"); break; fi
done
[ -n "$PY" ] || die "no python with torch found (tried FA_PYTHON, /opt/torch/.venv/bin/python, python3)"
read -r pyver torchver torchcuda < <("$PY" -c 'import sys,torch; print("%d.%d" % sys.version_info[:2], torch.__version__, torch.version.cuda)')
say "python $PY ($pyver), torch $torchver (CUDA $torchcuda)"
[ "${torchcuda%%.*}" = 13 ] || die "torch is built for CUDA $torchcuda; this kit carries CUDA 13.0's nvcc"
"$PY" -c 'import setuptools, wheel, pip' 2>/dev/null || die "$PY lacks setuptools, wheel or pip"
CXX_BIN=$(command -v c++ || command -v g++ || true)
[ -n "$CXX_BIN" ] || die "no host C++ compiler (c++/g++): nvcc and torch's extension build need one"
say "host compiler: $CXX_BIN ($("$CXX_BIN" -dumpfullversion 2>/dev/null || echo '?'))"

say "unpacking the kit into $WORK"
rm -rf "$WORK"; mkdir -p "$WORK"
if [ -n "${FA_KIT_DIR:-}" ]; then cp -a "$FA_KIT_DIR/." "$WORK/"   # --wheel-here: the kit tree as assembled
else
  tar -xJf "$here/flashattn-kit.tar.xz" -C "$WORK" 2>/dev/null ||
    "$PY" -c 'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$here/flashattn-kit.tar.xz" "$WORK"
fi
# shellcheck disable=SC1091
. "$WORK/kit.env"

# CUDA_HOME, laid out as torch.utils.cpp_extension expects: bin/nvcc, include/, lib64/libcudart.so
if [ -n "${FA_CUDA_HOME:-}" ]; then
  CUDA_HOME=$FA_CUDA_HOME
else
  CUDA_HOME=$WORK/cuda
  ln -sfn lib "$CUDA_HOME/lib64"; ln -sfn libcudart.so.13 "$CUDA_HOME/lib/libcudart.so"
  n=0
  for inc in $("$PY" -c 'import site,glob; print(" ".join(sorted({p for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/*/include")})))'); do
    for h in "$inc"/*; do [ -e "$CUDA_HOME/include/$(basename "$h")" ] || { ln -s "$h" "$CUDA_HOME/include/"; n=$((n + 1)); }; done
  done
  say "CUDA_HOME=$CUDA_HOME (carried nvcc; $n extra header entries linked from the python's nvidia/*/include)"
fi
"$CUDA_HOME/bin/nvcc" --version | tail -1

# Python.h: that python's own if present, else the carried headers through CPATH (gcc and nvcc's gcc read it)
if ! "$PY" -c 'import sysconfig,os,sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then
  [ "$pyver" = 3.12 ] || die "Python.h missing for python $pyver; the kit carries 3.12's only"
  export CPATH="$WORK/pyinc/python3.12:$WORK/pyinc${CPATH:+:$CPATH}"
  say "Python.h: carried CPython 3.12 headers"
fi

# ninja: the python's bin dir first (a venv's ninja lives there), else the carried binary
export PATH="$(dirname "$PY"):$PATH"
command -v ninja >/dev/null 2>&1 || { export PATH="$PATH:$WORK/tools"; say "ninja: carried"; }

export CUDA_HOME BUILD_TARGET=cuda FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTENTION_SKIP_CUDA_BUILD=FALSE
export FLASH_ATTN_CUDA_ARCHS=90 TORCH_CUDA_ARCH_LIST=9.0   # setup.py emits -gencode arch=compute_90,code=sm_90 only
export MAX_JOBS=${MAX_JOBS:-$(nproc)} NVCC_THREADS=${NVCC_THREADS:-1}   # one arch: nvcc --threads would not help
export FLASH_ATTN_LOCAL_VERSION=${FLASH_ATTN_LOCAL_VERSION:-kit.bf16.hd${FA_HDIMS// /.hd}.sm90}
say "building flash-attn $FA_VERSION: bf16, head dims $FA_HDIMS, sm_90, disabled: ${FA_DISABLE:-none}; MAX_JOBS=$MAX_JOBS"
tb=$(date +%s)
cd "$WORK/flash_attn-$FA_VERSION"
set +e
"$PY" -m pip wheel --no-build-isolation --no-deps --no-index -v -w "$WORK/dist" . > "$WORK/build.log" 2>&1 &
pid=$!
while kill -0 $pid 2>/dev/null; do   # progress: ninja's "[k/N]" lines, once a minute
  sleep 60; p=$(grep -o '^ *\[[0-9]*/[0-9]*\]' "$WORK/build.log" | tail -1 | tr -d ' '); say "compiling ${p:-(starting)}"
done
wait $pid; rc=$?
set -e
[ -n "${OUT:-}" ] && cp "$WORK/build.log" "$OUT/flash_attn_build.log" 2>/dev/null || true
if [ $rc != 0 ]; then
  grep -n -E 'error|Error|FAILED' "$WORK/build.log" | head -40
  tail -30 "$WORK/build.log"
  die "the wheel build failed (rc $rc); log: $WORK/build.log"
fi
whl=$(ls "$WORK"/dist/flash_attn-*.whl)
say "built $(basename "$whl") ($(du -h "$whl" | cut -f1)) in $(( $(date +%s) - tb )) s"

mkdir -p "$SITE"
"$PY" -m pip install -q --no-deps --no-index --no-compile --upgrade --target "$SITE" "$whl"
say "installed into $SITE"
if [ -n "${OUT:-}" ] && [ "$(stat -c %s "$whl")" -le $((16 * 1024 * 1024)) ]; then cp "$whl" "$OUT/"; fi

if [ "${FA_SKIP_CHECK:-}" != 1 ]; then
  cd "$WORK"   # not the source tree: its flash_attn/ has no extension
  FA_HDIMS="$FA_HDIMS" PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$WORK/check.py"
fi
say "done: build $(( $(date +%s) - tb )) s of $(( $(date +%s) - t0 )) s in all"
EOF
chmod +x "$src/build.sh"

# --- 3a. --wheel-here: build the wheel on this machine and stage only it (no device time spent compiling) -------
# Needs a CPython 3.12 here (python3.12 on PATH) and ~25 min of 2 cores; torch 2.11.0 (PyPI's build is +cu130, the
# GPU machine's) goes into a private venv: the extension links against torch's ABI, not a GPU. The wheel, check.py
# and install.sh land in .stage/flashattn-wheel/ (one call carries it); there:
#   bash .stage/flashattn-wheel/install.sh      (installs into /root/stage/verl/site, then checks it on the GPU)
if [ "${1:-}" = --wheel-here ]; then
  py312=$(command -v python3.12) || { echo "--wheel-here needs python3.12 on PATH" >&2; exit 2; }
  venv=$root/$src/venv312
  if ! "$venv/bin/python" -c 'import torch, setuptools, wheel' 2>/dev/null; then
    "$py312" -m venv "$venv"
    "$venv/bin/python" -m pip install -q torch==2.11.0 setuptools wheel
  fi
  out=$root/.stage/$name-wheel; rm -rf "$out"; mkdir -p "$out"
  FA_KIT_DIR=$kit FA_PYTHON=$venv/bin/python FA_WORK=$root/$src/build FA_SITE=$root/$src/site FA_SKIP_CHECK=1 \
    OUT=$out bash "$src/build.sh"
  ls "$out"/flash_attn-*.whl >/dev/null || { echo "the wheel is over 16 MiB; stage the kit instead" >&2; exit 1; }
  rm -f "$out/flash_attn_build.log"; cp "$kit/check.py" "$kit/kit.env" "$out/"
  cat > "$out/install.sh" <<'EOS'
#!/bin/bash
# On the GPU machine: install the carried flash-attn wheel into /root/stage/verl/site (beside the staged verl) and
# check it on the GPU (bf16 fwd/bwd vs torch SDPA, varlen, kv-cache, a Qwen2 critic with flash_attention_2).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); SITE=${FA_SITE:-/root/stage/verl/site}
PY=$(command -v "${FA_PYTHON:-python3}")
"$PY" -m pip install -q --no-deps --no-index --no-compile --upgrade --target "$SITE" "$here"/flash_attn-*.whl
. "$here/kit.env"
cd /tmp && FA_HDIMS="$FA_HDIMS" PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$here/check.py"
EOS
  chmod +x "$out/install.sh"
  du -sh "$out"/* | sed 's/^/  /'
  echo "carry .stage/$name-wheel in one device call:  bash .stage/$name-wheel/install.sh"
  exit 0
fi

# --- 3. pack ------------------------------------------------------------------------------------------------------
# xz -9e: the CUDA binaries are most of the bytes; this keeps the kit in one 56 MiB part.
XZ_OPT="-9e -T0" tar -cJf "$src/flashattn-kit.tar.xz" -C "$kit" .
du -sh "$kit" "$src/flashattn-kit.tar.xz" | sed 's/^/  /'
../shared/tools/gpu-stage.sh pack "$name" "$src/flashattn-kit.tar.xz" "$src/build.sh"
echo "then (same last call):  bash .stage/$name/s<LAST>/unpack.sh && bash /root/stage/$name/files/build.sh"
