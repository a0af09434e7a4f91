# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the lab's engines left in a node's /dev/shm (molecule/cluster and cluster_container).

vLLM's processes leave their POSIX shared-memory segments (psm_* message queues, sem.mp-* locks)
in /dev/shm when they are killed (and, with the container runtime's --ipc host, after a SIGTERM
too); the launcher removes them once the engine's processes are gone (node/launch/shm.py; natively
Python's resource tracker races it for the segments their creators registered). After the
scenarios' drills, every such file on a node must be mapped by a process that runs now, and the
running launch must have tracked its engine's own.
"""

from __future__ import annotations

import json

# one line per file: "used NAME" (a running process maps it) or "left NAME BYTES"
SCRIPT = r"""
cd /dev/shm || exit 0
for f in psm_* sem.mp-*; do
  [ -f "$f" ] || continue
  ino=$(stat -c %i "$f")
  if grep -qsE "^[^ ]+ [^ ]+ [^ ]+ [^ ]+ $ino +/" /proc/[0-9]*/maps; then
    echo "used $f"
  else
    echo "left $f $(stat -c %s "$f")"
  fi
done
"""


def shm_files(host):
    """{"used": [names], "left": [(name, bytes)]} of the node's /dev/shm."""
    out = {"used": [], "left": []}
    for line in host.check_output("sh -c %s" % _quote(SCRIPT)).splitlines():
        words = line.split()
        if words[:1] == ["used"]:
            out["used"].append(words[1])
        elif words[:1] == ["left"]:
            out["left"].append((words[1], int(words[2])))
    return out


def latest_tracked(host, engine="tp2"):
    """The segments the running launch of ``engine`` tracked (its launch record's shm_tracked)."""
    latest = json.loads(host.file("/var/lib/uma-vllm/launches/%s/latest/launch.json" % engine).content_string)
    return latest.get("shm_tracked") or []


def _quote(text):
    return "'" + text.replace("'", "'\"'\"'") + "'"
