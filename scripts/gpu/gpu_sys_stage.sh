#!/bin/bash
# Stage the system tools the namespace hosts need (iproute2's `ip`, OpenSSH's sshd and ssh-keygen) for the GPU
# machine, whose image has none of them and no package registry. Debian bookworm's packages, unpacked there into
# /srv/vc/sys; only the libraries the image lacks are put on those tools' own LD_LIBRARY_PATH (wrappers), so
# nothing else there loads a library of ours.
#   here (root of the repo, Debian, networked):   bash scripts/gpu/gpu_sys_stage.sh       -> .stage/sys/*.deb + install.sh
#   there (device call, carry [".stage/sys"]):    bash .stage/sys/install.sh           -> prints what it linked
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
grep -qxF /.stage/ .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.stage/ >> .git/info/exclude; }
dst=.stage/sys
mkdir -p "$dst"
# the tools and every library they link that an Ubuntu 24.04 image may lack (install.sh links only the missing)
pkgs="iproute2 libbpf1 libelf1 libmnl0 libxtables12 libcap2 libbsd0 libmd0 libdb5.3 libtirpc3 libtirpc-common
  libselinux1 libpcre2-8-0 openssh-server openssh-client libwrap0 libaudit1 libcap-ng0 libpam0g libsystemd0
  libkrb5-3 libgssapi-krb5-2 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libcrypt1 libssl3 zlib1g
  libnsl2 libedit2 libfido2-1 libcbor0.8 libudev1 libtinfo6 libzstd1 liblzma5 liblz4-1 libgcrypt20 libgpg-error0 util-linux"
(cd "$dst" && rm -f ./*.deb && apt-get download $pkgs >/dev/null 2>&1) || {
  echo "apt-get download failed: run 'apt-get update' first (as root)" >&2; exit 1; }
cat > "$dst/install.sh" <<'EOF'
#!/bin/bash
# On the GPU machine: unpack the staged packages into /srv/vc/sys/root and put wrappers for the tools the image
# lacks where the namespace hosts look for them (PATH, /usr/sbin/sshd), each with only the missing libraries.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sys=/srv/vc/sys; r=$sys/root; lib=$sys/lib
mkdir -p "$r" "$lib"
for d in "$here"/*.deb; do dpkg -x "$d" "$r"; done
missing_libs() { LD_LIBRARY_PATH=$lib ldd "$1" 2>/dev/null | awk '/not found/ {print $1}'; }
wrap() {  # wrap NAME REAL_BINARY WHERE: a wrapper at WHERE unless the image has NAME already
  local name=$1 bin=$2 where=$3 so f
  if command -v "$name" >/dev/null 2>&1 && [ "$name" != sshd ]; then echo "have $name: $(command -v "$name")"; return; fi
  [ "$name" = sshd ] && [ -x /usr/sbin/sshd ] && { echo "have sshd: /usr/sbin/sshd"; return; }
  for _ in 1 2 3 4; do  # a library found may need another
    for so in $(missing_libs "$bin"); do
      f=$(find "$r" -name "$so" | head -1)
      [ -n "$f" ] && ln -sf "$f" "$lib/$so" || echo "no $so in the staged packages (for $name)" >&2
    done
  done
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$lib" "$bin" > "$where"
  chmod 755 "$where"
  echo "staged $name -> $where ($(ls "$lib" | wc -l) libraries in $lib)"
}
wrap ip "$r/bin/ip" /usr/local/sbin/ip
wrap ssh-keygen "$r/usr/bin/ssh-keygen" /usr/local/bin/ssh-keygen
wrap nsenter "$r/usr/bin/nsenter" /usr/local/bin/nsenter
wrap unshare "$r/usr/bin/unshare" /usr/local/bin/unshare
# sshd re-executes itself by the path it was started with: the wrapper execs the real binary by its full path
wrap sshd "$r/usr/sbin/sshd" /usr/local/sbin/sshd
getent passwd sshd >/dev/null || echo 'sshd:x:997:65534::/run/sshd:/usr/sbin/nologin' >> /etc/passwd
mkdir -p -m 755 /run/sshd
command -v ip >/dev/null && ip -V
EOF
chmod +x "$dst/install.sh"
echo "staged $(ls "$dst"/*.deb | wc -l) packages ($(du -sh "$dst" | cut -f1)) in $dst; on the device: bash $dst/install.sh"
