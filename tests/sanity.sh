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
# ansible-test fetches its pip bootstrap from a host the build machines cannot
# reach; give it the offline stand-in under the name it looks for.
pip_version=$(grep -o "pip='[0-9.]*'" "$(python -c 'import ansible_test, os; print(os.path.dirname(ansible_test.__file__))')/_internal/python_requirements.py" | head -1 | tr -dc '0-9.')
mkdir -p ~/.ansible/test/cache
cp "$root/tests/get_pip_offline.py" ~/.ansible/test/cache/get_pip_"${pip_version//./_}".py
python_version=$(python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
ansible-test sanity --python "$python_version" --color no --venv "$@"
