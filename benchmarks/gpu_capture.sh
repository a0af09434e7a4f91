#!/usr/bin/env bash
# Record a GPU machine's platform facts for tests/unit/fixtures/platform/<card>-driver-<version>/
# (the files named in that folder's README.md), on a lent machine; nothing here runs in CI.
#
#   bash benchmarks/gpu_capture.sh OUTDIR [PYLIB]
#
# PYLIB: a folder holding ansible/module_utils (ansible-core's, with an empty ansible/__init__.py)
# where ansible is not installed: uma.vllm.node_facts then runs as a plain script.
set -uo pipefail
out=${1:?usage: gpu_capture.sh OUTDIR [PYLIB]}
pylib=${2:-}
[ -z "$pylib" ] || pylib=$(cd "$pylib" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
run() { local file=$1; shift; "$@" >"$out/$file" 2>&1 || echo "[gpu-capture] $* exited $?" >&2; }
run nvidia-smi-query.csv nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
run nvidia-smi-query-extended.csv nvidia-smi \
  --query-gpu=name,memory.total,memory.used,memory.free,driver_version,compute_cap,pci.bus_id --format=csv
run nvidia-smi.txt nvidia-smi
run nvidia-smi-q-memory.txt nvidia-smi -q -d MEMORY
run lscpu.txt lscpu
run meminfo.txt cat /proc/meminfo
run uname.txt uname -a
# the real module as a script: ansible_collections/uma/vllm -> this checkout
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ac/ansible_collections/uma"
ln -s "$root" "$tmp/ac/ansible_collections/uma/vllm"
echo '{"ANSIBLE_MODULE_ARGS": {}}' >"$tmp/args.json"
(cd "$tmp" && PYTHONPATH="$tmp/ac${pylib:+:$pylib}" python3 "$root/plugins/modules/node_facts.py" args.json) \
  >"$out/node_facts.json" 2>"$out/node_facts.stderr" || echo "[gpu-capture] node_facts exited $?" >&2
# torch's message for one allocation of 1.25 x the card while 1 GiB is held (plain cudaMalloc)
python3 - >"$out/torch_oom.txt" 2>&1 <<'PY' || true
import torch
held = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
total = torch.cuda.mem_get_info()[1]
try:
    torch.empty(int(total * 1.25), dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as exc:
    print(str(exc))
PY
ls -l "$out" >&2
