#!/usr/bin/env bash
# A VM lab node: a Debian bookworm guest with its own kernel (Debian's 6.1),
# systemd as PID 1, a virtio ext4 disk with real safetensors shards, reachable
# by Ansible over ssh on a loopback-forwarded port. See docs/VM-LAB.md.
#
#   lab/vm.sh up        # build what is missing (once), boot, wait for ssh
#   lab/vm.sh ssh [CMD] # ssh into the guest as root
#   lab/vm.sh status    # running or not, the ssh port, the inventory file
#   lab/vm.sh down      # power off; nothing keeps running
#   lab/vm.sh module    # build lab/vm/fakegb10 against the guest kernel's headers
#
# Everything lives under .cache/vm (UMA_VM_CACHE): the downloaded kernel
# packages, the rootfs, the disk images (kept as a cache after `down`), the
# ssh key, the console log. Delete that directory to rebuild from scratch.
#
# The guest RAM is a scaled DGX Spark (121 GiB node, 148 GiB checkpoint, 74 GiB
# pinned per rank): 3 GiB of RAM, a 3.6 GiB checkpoint (ratio 1.2), 1.8 GiB
# pinned per rank (0.6). QEMU runs under TCG by default: on the build machines
# KVM runs the guest kernel far slower than emulation (docs/VM-LAB.md).
#
# The QEMU process holds a lock (UMA_VM_LOCK, default .cache/vm/vm.lock) for as
# long as it runs; point UMA_VM_LOCK at a lock that other heavy jobs take too.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache="${UMA_VM_CACHE:-$root/.cache/vm}"
mem_mib="${UMA_VM_MEM_MIB:-3072}"
cpus="${UMA_VM_CPUS:-2}"
port="${UMA_VM_SSH_PORT:-10022}"
model_gib="${UMA_VM_MODEL_GIB:-3.6}"
model_shards="${UMA_VM_MODEL_SHARDS:-4}"
accel="${UMA_VM_ACCEL:-tcg}"
boot_timeout="${UMA_VM_BOOT_TIMEOUT:-600}"
lock="${UMA_VM_LOCK:-$cache/vm.lock}"
kver=6.1.0-56-amd64
kpkgver=6.1.192-2
suite=bookworm
mirror="${UMA_VM_MIRROR:-http://deb.debian.org/debian}"
packages=systemd,systemd-sysv,dbus,python3,python3-apt,procps,util-linux,udev,iproute2,kmod,ca-certificates,sudo,less,libnuma1,openssh-server,initramfs-tools,linux-base,zstd,e2fsprogs

log() { printf '[vm] %s\n' "$*" >&2; }
die() { printf 'vm.sh: %s\n' "$*" >&2; exit 1; }

check_int() {
  case "$2" in
    '' | *[!0-9]*) die "$1='$2' is not a whole number; set it to e.g. $3" ;;
  esac
}
check_int UMA_VM_MEM_MIB "$mem_mib" 3072
check_int UMA_VM_CPUS "$cpus" 2
check_int UMA_VM_SSH_PORT "$port" 10022
check_int UMA_VM_MODEL_SHARDS "$model_shards" 4
check_int UMA_VM_BOOT_TIMEOUT "$boot_timeout" 600
case "$accel" in
  tcg | kvm) ;;
  *) die "UMA_VM_ACCEL='$accel' is not tcg or kvm; unset it (tcg) or set it to kvm" ;;
esac
case "$model_gib" in
  '' | *[!0-9.]*) die "UMA_VM_MODEL_GIB='$model_gib' is not a number of GiB; set it to e.g. 3.6" ;;
esac

pidfile="$cache/qemu.pid"
holderfile="$cache/flock.pid"
monitor="$cache/monitor.sock"
key="$cache/id_ed25519"
ssh_opts=(-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR
  -o ConnectTimeout=5 -o BatchMode=yes -i "$key" -p "$port")

# The Debian package of each host tool vm.sh runs (issue 35 item 6: on a fresh machine `up` installs
# what is missing, as lab/up.sh does through tests/setup.sh, instead of stopping to name it).
package_of() {
  case "$1" in
    qemu-system-x86_64) echo qemu-system-x86 ;;
    debootstrap) echo debootstrap ;;
    mkfs.ext4) echo e2fsprogs ;;
    ssh | ssh-keygen) echo openssh-client ;;
    unshare | flock) echo util-linux ;;
    make) echo make ;;
    gcc-12) echo gcc-12 ;;
    *) echo "" ;;
  esac
}

need() {
  local tool pkg missing=() pkgs=()
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 && continue
    missing+=("$tool")
    pkg=$(package_of "$tool")
    [ -n "$pkg" ] && [[ " ${pkgs[*]} " != *" $pkg "* ]] && pkgs+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ "${#pkgs[@]}" -gt 0 ] \
    && [ "${UMA_VM_NO_INSTALL:-0}" != 1 ]; then
    log "missing ${missing[*]}: apt-get install ${pkgs[*]}"
    local cache_log
    cache_log=$(mktemp)
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null 2>"$cache_log" \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" \
        >/dev/null 2>>"$cache_log"; }; then
      tail -20 "$cache_log" >&2
      rm -f "$cache_log"
      die "apt-get install ${pkgs[*]} failed (above); install them by hand and run 'lab/vm.sh up' again"
    fi
    rm -f "$cache_log"
  fi
  for tool in "${missing[@]}"; do
    command -v "$tool" >/dev/null 2>&1 \
      || die "'$tool' is missing; install it as root: apt-get install ${pkgs[*]:-<the package with $tool>}"
  done
}

fetch_debs() {
  mkdir -p "$cache/debs"
  local pkg missing=() kbuild upstream=${kpkgver%-*}
  for pkg in "linux-image-${kver}_${kpkgver}_amd64" "linux-headers-${kver}_${kpkgver}_amd64" \
    "linux-headers-${kver%-amd64}-common_${kpkgver}_all"; do
    [ -f "$cache/debs/$pkg.deb" ] || missing+=("${pkg%%_*}=$kpkgver")
  done
  # linux-kbuild-6.1 (the module build's tools) is built from another source package than the
  # signed image, and Debian's security archive keeps only its newest revision: any revision of the
  # same upstream release builds modules for this kernel (seen 28 Nov 2026: the image at 6.1.192-2,
  # kbuild only at 6.1.192-3; pinning 6.1.192-2 failed on a fresh machine).
  if ! compgen -G "$cache/debs/linux-kbuild-6.1_${upstream}-*_amd64.deb" >/dev/null; then
    kbuild=$(apt-cache madison linux-kbuild-6.1 2>/dev/null | awk -v up="$upstream-" '
      { gsub(/ /, "", $3); if (index($3, up) == 1) { print $3; exit } }')
    [ -n "$kbuild" ] || die "apt has no linux-kbuild-6.1 of Linux $upstream (it has: $(apt-cache madison \
linux-kbuild-6.1 2>/dev/null | awk '{print $3}' | tr '\n' ' ')); run apt-get update, or give lab/vm.sh's kver and \
kpkgver a kernel apt has (apt-cache madison 'linux-image-6.1.0-*-amd64')"
    missing+=("linux-kbuild-6.1=$kbuild")
  fi
  [ "${#missing[@]}" -eq 0 ] && return 0
  log "apt-get download ${missing[*]}"
  (cd "$cache/debs" && apt-get download "${missing[@]}" >/dev/null 2>"$cache/apt-download.log") \
    || { cat "$cache/apt-download.log" >&2; die "apt-get download failed (run apt-get update?; lab/vm.sh's kver \
$kver / kpkgver $kpkgver must be a kernel apt has: apt-cache madison linux-image-$kver)"; }
}

# Headers for building modules on the host: dpkg -x, never installed. The
# arch Makefile includes the common tree by absolute path; point it here.
extract_headers() {
  [ -f "$cache/headers/.done" ] && return 0
  rm -rf "$cache/headers"
  mkdir -p "$cache/headers"
  local deb
  for deb in "$cache"/debs/linux-headers-*.deb "$cache"/debs/linux-kbuild-*.deb; do
    dpkg -x "$deb" "$cache/headers"
  done
  sed -i "s|/usr/src/|$cache/headers/usr/src/|" "$cache/headers/usr/src/linux-headers-$kver/Makefile"
  touch "$cache/headers/.done"
}

build_rootfs() {
  [ -f "$cache/rootfs/.done" ] && return 0
  local dest="$cache/rootfs"
  rm -rf "$dest"
  mkdir -p "$dest"
  log "debootstrap $suite into $dest (a minute or two)"
  debootstrap --variant=minbase --include="$packages" "$suite" "$dest" "$mirror" \
    >"$cache/debootstrap.log" 2>&1 || { tail -20 "$cache/debootstrap.log" >&2; die "debootstrap failed"; }
  log "installing Debian's kernel $kver into the guest rootfs (initramfs)"
  cp "$cache/debs/linux-image-${kver}_${kpkgver}_amd64.deb" "$dest/tmp/linux-image.deb"
  # A private mount namespace: the /proc mount the kernel's postinst needs
  # disappears with it, nothing stays mounted on the host.
  # shellcheck disable=SC2016 # $1 is expanded by the inner sh
  unshare --mount --propagation private sh -c \
    'mount -t proc proc "$1/proc" && chroot "$1" dpkg -i /tmp/linux-image.deb' sh "$dest" \
    >"$cache/kernel-install.log" 2>&1 || { tail -20 "$cache/kernel-install.log" >&2; die "kernel install failed"; }
  rm -f "$dest/tmp/linux-image.deb"
  echo uma-vm >"$dest/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 uma-vm\n' >"$dest/etc/hosts"
  : >"$dest/etc/machine-id"
  printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n/dev/vdb /srv/model ext4 ro,nofail 0 2\n' >"$dest/etc/fstab"
  mkdir -p "$dest/srv/model"
  printf 'deb %s %s main\n' "$mirror" "$suite" >"$dest/etc/apt/sources.list"
  printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n' >"$dest/etc/systemd/network/10-user.network"
  ln -sf /lib/systemd/system/systemd-networkd.service \
    "$dest/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
  local unit
  for unit in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
    systemd-networkd-wait-online.service; do
    ln -sf /dev/null "$dest/etc/systemd/system/$unit"
  done
  rm -rf "$dest/var/cache/apt/archives/"*.deb
  touch "$dest/.done"
}

make_key() {
  [ -f "$key" ] && return 0
  ssh-keygen -q -t ed25519 -N '' -C uma-vm-lab -f "$key"
}

build_root_img() {
  local stamp
  stamp=$(cat "$key.pub" "$0" | sha256sum | cut -c1-16)
  if [ -f "$cache/root.img" ] && [ "$(cat "$cache/root.img.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  install -d -m 0700 "$cache/rootfs/root/.ssh"
  install -m 0600 "$key.pub" "$cache/rootfs/root/.ssh/authorized_keys"
  cp "$cache/rootfs/boot/vmlinuz-$kver" "$cache/vmlinuz"
  cp "$cache/rootfs/boot/initrd.img-$kver" "$cache/initrd.img"
  log "mkfs.ext4 root.img from the rootfs"
  rm -f "$cache/root.img"
  mkfs.ext4 -q -F -L uma-vm-root -d "$cache/rootfs" "$cache/root.img" 4G
  echo "$stamp" >"$cache/root.img.stamp"
}

build_model_img() {
  local stamp="$model_gib:$model_shards"
  if [ -f "$cache/model.img" ] && [ "$(cat "$cache/model.img.stamp" 2>/dev/null)" = "$stamp" ]; then
    return 0
  fi
  local py="$root/.venv/bin/python"
  [ -x "$py" ] || py=python3
  "$py" -c 'import numpy, safetensors, tokenizers' 2>/dev/null \
    || die "$py lacks numpy/safetensors/tokenizers (lab/make_model.py needs them; use the project's .venv)"
  log "writing a ${model_gib} GiB checkpoint in $model_shards safetensors shards"
  rm -rf "$cache/model.tmp" "$cache/model.img"
  "$py" "$root/lab/make_model.py" --out "$cache/model.tmp" --shards "$model_shards" --pad-gib "$model_gib" >/dev/null
  local size_mib
  size_mib=$(du -sm "$cache/model.tmp" | cut -f1)
  mkfs.ext4 -q -F -L uma-vm-model -m 0 -d "$cache/model.tmp" "$cache/model.img" "$((size_mib + size_mib / 10 + 128))M"
  rm -rf "$cache/model.tmp"
  echo "$stamp" >"$cache/model.img.stamp"
}

write_inventory() {
  cat >"$cache/inventory.ini" <<EOF
# Written by lab/vm.sh: the VM lab node as an Ansible inventory host.
[uma_vm]
uma-vm ansible_host=127.0.0.1 ansible_port=$port ansible_user=root ansible_ssh_private_key_file=$key ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null' ansible_python_interpreter=/usr/bin/python3
EOF
}

running() {
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

cmd_up() {
  need qemu-system-x86_64 debootstrap mkfs.ext4 ssh ssh-keygen apt-get dpkg unshare flock
  [ "$(id -u)" = 0 ] || die "run as root (debootstrap and chroot need it)"
  if running; then
    log "already running (pid $(cat "$pidfile")), ssh on 127.0.0.1:$port"
    return 0
  fi
  mkdir -p "$cache"
  fetch_debs
  extract_headers
  build_rootfs
  make_key
  build_root_img
  build_model_img
  write_inventory
  local accel_args=(-accel "tcg,thread=multi" -cpu max)
  if [ "$accel" = kvm ]; then
    accel_args=(-accel kvm -cpu "host,-arch-capabilities")
  fi
  rm -f "$pidfile" "$monitor" "$holderfile" "$cache/console.log"
  log "starting QEMU ($accel, ${mem_mib} MiB, $cpus vCPUs) under flock $lock"
  local t0
  t0=$(date +%s)
  # flock holds the lock while QEMU runs; setsid keeps it out of our session.
  setsid flock "$lock" nice -n 10 qemu-system-x86_64 "${accel_args[@]}" \
    -m "$mem_mib" -smp "$cpus" -display none -no-reboot \
    -kernel "$cache/vmlinuz" -initrd "$cache/initrd.img" \
    -append "root=/dev/vda rw console=ttyS0 panic=-1 net.ifnames=0" \
    -drive "file=$cache/root.img,if=virtio,format=raw,cache=none,aio=threads" \
    -drive "file=$cache/model.img,if=virtio,format=raw,cache=none,aio=threads,readonly=on" \
    -netdev "user,id=n0,hostfwd=tcp:127.0.0.1:$port-:22" -device virtio-net-pci,netdev=n0 \
    -serial "file:$cache/console.log" -monitor "unix:$monitor,server,nowait" \
    -pidfile "$pidfile" </dev/null >"$cache/qemu.log" 2>&1 &
  local holder=$! booted=""
  echo "$holder" >"$holderfile"
  # Interrupted while waiting: leave nothing behind (a waiting flock included).
  trap 'cmd_down; exit 130' INT TERM
  until ssh "${ssh_opts[@]}" root@127.0.0.1 true 2>/dev/null; do
    sleep 3
    if ! kill -0 "$holder" 2>/dev/null; then
      cat "$cache/qemu.log" >&2
      cmd_down
      die "QEMU exited; see $cache/console.log"
    fi
    if [ -z "$booted" ]; then
      # Still waiting for the lock: the boot timeout starts with QEMU.
      [ -f "$pidfile" ] || continue
      booted=$(date +%s)
      log "QEMU started after $((booted - t0))s waiting for $lock"
    fi
    if [ "$(($(date +%s) - booted))" -ge "$boot_timeout" ]; then
      tail -20 "$cache/console.log" >&2 || true
      cmd_down
      die "no ssh after ${boot_timeout}s (UMA_VM_BOOT_TIMEOUT); see $cache/console.log"
    fi
  done
  trap - INT TERM
  log "ssh answered $(($(date +%s) - ${booted:-$t0}))s after QEMU started: ssh on 127.0.0.1:$port"
  log "inventory: $cache/inventory.ini"
}

cmd_down() {
  local holder
  holder=$(cat "$holderfile" 2>/dev/null || true)
  if ! running; then
    # An `up` interrupted while waiting for the lock leaves a waiting flock.
    if [ -n "$holder" ] && kill -0 "$holder" 2>/dev/null; then
      kill "$holder" 2>/dev/null || true
      log "stopped the flock (pid $holder) still waiting for $lock"
    fi
    rm -f "$pidfile" "$monitor" "$holderfile"
    log "not running"
    return 0
  fi
  local pid
  pid=$(cat "$pidfile")
  ssh "${ssh_opts[@]}" root@127.0.0.1 'systemctl poweroff' >/dev/null 2>&1 || true
  local i
  for i in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
    if [ "$i" = 30 ]; then
      kill "$pid" 2>/dev/null || true
    fi
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -9 "$pid" 2>/dev/null || true
  fi
  if [ -n "$holder" ] && kill -0 "$holder" 2>/dev/null; then
    kill "$holder" 2>/dev/null || true
  fi
  rm -f "$pidfile" "$monitor" "$holderfile"
  log "stopped (pid $pid); disk images stay in $cache as a cache"
}

cmd_status() {
  if running; then
    echo "running pid=$(cat "$pidfile") ssh=127.0.0.1:$port inventory=$cache/inventory.ini"
  else
    echo "stopped"
    return 3
  fi
}

cmd_ssh() {
  running || die "the VM is not running (lab/vm.sh up)"
  exec ssh "${ssh_opts[@]}" root@127.0.0.1 "$@"
}

cmd_module() {
  need make gcc-12
  mkdir -p "$cache"
  fetch_debs
  extract_headers
  local src="$root/lab/vm/fakegb10" out="$cache/fakegb10"
  rm -rf "$out"
  cp -r "$src" "$out"
  make -C "$cache/headers/usr/src/linux-headers-$kver" M="$out" modules >&2
  log "built $out/fakegb10.ko"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  ssh) shift; cmd_ssh "$@" ;;
  module) cmd_module ;;
  *) echo "usage: lab/vm.sh up|down|status|ssh [CMD]|module" >&2; exit 2 ;;
esac
