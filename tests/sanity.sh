#!/usr/bin/env bash
# ansible-test sanity needs the collection at .../ansible_collections/uma/vllm
# (a real directory, not a symlink): copy the tracked and new files there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.cache/sanity/ansible_collections/uma/vllm"
rm -rf "$dest"
mkdir -p "$dest"
cd "$root"
git ls-files -z --cached --others --exclude-standard | xargs -0 -I{} cp --parents -P {} "$dest/" 2>/dev/null || true
# files deleted in the work tree but still in the index were skipped above
cd "$dest"
git init -q . && git add -A >/dev/null
python_version=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ansible-test sanity --python "$python_version" --color no --local "$@"
