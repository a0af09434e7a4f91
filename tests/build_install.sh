#!/usr/bin/env bash
# Build the collection tarball, install it somewhere fresh, and use it by FQCN
# only from there: ansible-doc of every module and role, the installed
# playbooks, every filter documented, and the uma_sysctl acceptance check of issue 2 (changed,
# unchanged, changed after an edit; bad input fails cleanly and writes nothing).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$root"
ansible-galaxy collection build --force --output-path "$work/dist" >/dev/null
tarball=$(ls "$work"/dist/uma-vllm-*.tar.gz)
echo "built $(basename "$tarball") ($(du -k "$tarball" | cut -f1) kB)"
unset PYTHONPATH  # the checkout must not be importable: only the installed copy counts
printf '[defaults]\ncollections_path = %s\n' "$work/collections" >"$work/ansible.cfg"
export ANSIBLE_CONFIG="$work/ansible.cfg" ANSIBLE_COLLECTIONS_PATH="$work/collections"
ansible-galaxy collection install --offline -p "$work/collections" "$tarball" >/dev/null
cd "$work"
ansible-galaxy collection list uma.vllm | grep -q 'uma.vllm'
# One ansible-doc process per plugin type (each start costs ~1 s): every name must then have its own
# header in the output, since ansible-doc exits 0 when one of several names has no documentation.
docs() {  # docs TYPE HEADER NAME...: each NAME rendered under "> HEADER NAME"
  local type=$1 header=$2 out name
  shift 2
  out=$(ANSIBLE_NOCOLOR=1 ansible-doc -t "$type" "$@" 2>&1) || { echo "ansible-doc -t $type failed: $out" >&2; exit 1; }
  for name in "$@"; do
    grep -qE "^> $header\*?$name\*? " <<<"$out" || { echo "ansible-doc -t $type $name failed (undocumented)" >&2; exit 1; }
  done
}
mapfile -t modules < <(find "$work/collections/ansible_collections/uma/vllm/plugins/modules" -name '*.py' -printf '%f\n' | sed 's/\.py$//' | sort)
docs module "MODULE " "${modules[@]/#/uma.vllm.}"
mapfile -t roles < <(ls "$work/collections/ansible_collections/uma/vllm/roles")
docs role "ROLE: " "${roles[@]/#/uma.vllm.}"
mapfile -t filters < <(ANSIBLE_NOCOLOR=1 ansible-doc -t filter -l uma.vllm | awk '{print $1}' | sort)
[ "${#filters[@]}" -gt 0 ] || { echo "ansible-doc -t filter -l uma.vllm lists no filters" >&2; exit 1; }
docs filter "FILTER " "${filters[@]}"
echo "ansible-doc renders: ${#modules[@]} modules, ${#roles[@]} roles, ${#filters[@]} filters"
for p in site restore diagnose status; do
  ansible-playbook "uma.vllm.$p" -i "$root/inventories/spark" --syntax-check >/dev/null
done
echo "installed playbooks parse: uma.vllm.site, uma.vllm.restore, uma.vllm.diagnose, uma.vllm.status"

conf="$work/x.conf"
run() { ansible localhost -m uma.vllm.uma_sysctl -a "path=$conf apply=false state_dir=$work/state $*" 2>&1; }
run min_free_kbytes=3145728 | grep -q '^localhost | CHANGED' || { echo "uma_sysctl: first run not changed" >&2; exit 1; }
run min_free_kbytes=3145728 | grep -q '^localhost | SUCCESS' || { echo "uma_sysctl: second run changed" >&2; exit 1; }
sed -i 's/^vm.dirty_ratio = 5$/vm.dirty_ratio = 7/' "$conf"
out=$(run min_free_kbytes=3145728)
if ! grep -q '^localhost | CHANGED' <<<"$out" || ! grep -q 'edited by hand' <<<"$out"; then
  echo "uma_sysctl: edit not corrected: $out" >&2
  exit 1
fi
rm -f "$conf"
out=$(run min_free_kbytes=3145728 dirty_background_ratio=9 || true)
grep -q "option 'dirty_background_ratio' = '9': is not below dirty_ratio" <<<"$out" || { echo "uma_sysctl: bad input message: $out" >&2; exit 1; }
if grep -q Traceback <<<"$out" || [ -e "$conf" ]; then echo "uma_sysctl: traceback or file after bad input" >&2; exit 1; fi
echo "uma_sysctl from the installed collection: changed, unchanged, changed after an edit; bad input refused, no file"
