#!/bin/bash
# Stage verl 0.9.1 + vLLM 0.24.0 + the product's runtime deps (Ray, omegaconf, paramiko) as wheels for the
# offline GPU machine (x86_64, Python 3.12, no package registry), in parts small enough for one device call.
#
# Here, from the repo root (networked, any CPU):   scripts/gpu/gpu_stage_verl.sh [--list]
#   1. downloads the wheels pinned in scripts/gpu/gpu_verl_wheels.txt into .stage-src/verl/ (kept: reruns are cheap)
#   2. tars them and splits the tar into .stage/verl/s0, s1, ... (<= 50 MiB each: a call carries one beside the working tree, 64 MiB in all); the last part has unpack.sh
#   3. prints the device calls to make, back to back (the machine must stay warm between them)
# --list: after the download, print each wheel's size and the total, then stop (no packing).
# There, unpack.sh joins the parts in /root/stage/verl, checks the sha256 and installs every wheel with
# --no-deps into /root/stage/verl/site; then: export PYTHONPATH=/root/stage/verl/site (it prints the line).
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
req=scripts/gpu/gpu_verl_wheels.txt; src=.stage-src/verl; dst=.stage/verl; name=verl; there=/root/stage/verl
for p in /.stage/ /.stage-src/; do   # keep ~1 GB of wheels out of git and out of what a device call carries
  grep -qxF "$p" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "$p" >> .git/info/exclude; }
done
# The GPU machine's pip checks these tags there; its glibc (Ubuntu 24.04, Python 3.12.3) is newer than all of them.
plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
for t in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1; do plat+=(--platform "${t}_x86_64"); done
for n in 35 34 31 29 26 25 24; do plat+=(--platform "manylinux_2_${n}_x86_64"); done
plat+=(--platform any)
mkdir -p "$src"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
grep -E '^[A-Za-z0-9]' "$req" | grep -v 'sdist-only' | sed 's/ *#.*//' > "$tmp/bin.txt"
grep -E '^[A-Za-z0-9].*sdist-only' "$req" | sed 's/ *#.*//' > "$tmp/sdist.txt" || true
python3 -m pip download -q --no-deps "${plat[@]}" -d "$src" -r "$tmp/bin.txt"
# a few pure-Python packages (antlr4-python3-runtime, needed by omegaconf/hydra) exist on PyPI only as sdists
[ -s "$tmp/sdist.txt" ] && python3 -m pip wheel -q --no-deps -w "$src" -r "$tmp/sdist.txt"
# Pick exactly one wheel per pinned line (older downloads may linger in $src); fail loudly on a gap.
python3 - "$src" "$tmp/bin.txt" "$tmp/sdist.txt" > "$tmp/files.txt" <<'EOF'
import os, re, sys
norm = lambda s: re.sub(r'[-_.]+', '-', s).lower()
want = {}
for f in sys.argv[2:]:
    for line in open(f):
        if line.strip():
            n, v = line.strip().split('==')
            want[norm(n)] = v
have = {}
for w in os.listdir(sys.argv[1]):
    if w.endswith('.whl'):
        n, v = w.split('-')[:2]
        if want.get(norm(n)) == v:
            have.setdefault(norm(n), []).append(w)
missing = sorted(set(want) - set(have))
extra = {n: ws for n, ws in have.items() if len(ws) > 1}
if missing or extra:
    sys.exit(f"no wheel for {missing}; several wheels for {extra}")
print('\n'.join(sorted(ws[0] for ws in have.values())))
EOF
if [ "${1:-}" = --list ]; then
  (cd "$src" && xargs -a "$tmp/files.txt" du -k | sort -rn | awk '{printf "%8.1f MiB  %s\n", $1/1024, $2; t+=$1}
    END {printf "%8.1f MiB  total, %d wheels\n", t/1024, NR}')
  exit 0
fi
rm -rf "$dst"; mkdir -p "$dst"
cp "$tmp/files.txt" "$src/wheels.txt"
tar cf "$tmp/$name.tar" -C "$src" wheels.txt $(cat "$tmp/files.txt")   # wheels are zips already: no compression
(cd "$tmp" && sha256sum "$name.tar" > "$name.tar.sha256" && split -b 50M -d -a 2 "$name.tar" "$name.tar.part-")
i=0
for p in "$tmp/$name.tar.part-"*; do mkdir -p "$dst/s$i"; mv "$p" "$dst/s$i/"; i=$((i + 1)); done
last=$((i - 1))
cp "$tmp/$name.tar.sha256" "$dst/s$last/"
cat > "$dst/s$last/unpack.sh" <<EOF
#!/bin/bash
# On the GPU machine: join the parts staged in $there, check them, install the wheels into $there/site.
set -euo pipefail
here=\$(cd "\$(dirname "\$0")" && pwd)
mkdir -p $there && cd $there
cp "\$here"/$name.tar.part-* "\$here"/$name.tar.sha256 .
n=\$(ls $name.tar.part-* | wc -l)
[ "\$n" = $i ] || { echo "have \$n of $i parts in $there: the machine was cold; start again at s0" >&2; exit 3; }
cat $name.tar.part-* > $name.tar && sha256sum -c $name.tar.sha256 >/dev/null && rm -f $name.tar.part-*
rm -rf whl site && mkdir whl && tar xf $name.tar -C whl && rm -f $name.tar
(cd whl && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $there/site \$(cat wheels.txt))
rm -rf whl
# console scripts (ray, vllm, ...): run them with whatever python3 is first on PATH there
for f in site/bin/*; do
  if head -c2 "\$f" | grep -q '#!'; then sed -i '1s|^#!.*python.*|#!/usr/bin/env python3|' "\$f"; fi
done
echo "installed into $there/site (\$(du -sh site | cut -f1)); now:"
echo "  export PYTHONPATH=$there/site\\\${PYTHONPATH:+:\\\$PYTHONPATH} PATH=$there/site/bin:\\\$PATH"
echo "  export VLLM_USE_FLASHINFER_SAMPLER=0   # flashinfer is not carried; vLLM imports it for sampling unless 0"
EOF
chmod +x "$dst/s$last/unpack.sh"
echo "packed $(wc -l < "$tmp/files.txt") wheels ($(du -sh "$tmp/$name.tar" | cut -f1)) into $i part(s) under $dst:"
du -sh "$dst"/s* | sed 's|^|  |'
echo "device calls, back to back (if a reply says \"warm\": false, the earlier parts are gone: start again at s0):"
for ((k = 0; k < last; k++)); do
  echo "  carry [\"$dst/s$k\"]  command: mkdir -p $there && cp $dst/s$k/* $there/"
done
echo "  carry [\"$dst/s$last\"]  command: bash $dst/s$last/unpack.sh && export PYTHONPATH=$there/site PATH=$there/site/bin:\$PATH VLLM_USE_FLASHINFER_SAMPLER=0 && ..."
