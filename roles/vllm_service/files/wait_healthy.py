# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Run on the node by roles/vllm_service (python -c, argv: URL UNIT TIMEOUT_S): polls an engine's
# health URL and its unit every 2 s and prints their state as JSON. Exit 0 healthy, 2 the unit
# failed or stopped, 1 timeout. Standard library only (the node's Python).
import json
import subprocess
import sys
import time
import urllib.request


def unit_state(unit):
    show = subprocess.run(
        ["systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "NRestarts", unit],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return dict(line.split("=", 1) for line in show.splitlines() if "=" in line)


def healthy(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except Exception:  # any failure to answer is "not healthy yet"
        return False


def main(argv):
    url, unit, timeout = argv[1], argv[2], float(argv[3])
    deadline = time.monotonic() + timeout
    while True:
        state = unit_state(unit)
        state.update(url=url, healthy=healthy(url))
        if state["healthy"]:
            print(json.dumps(state))
            return 0
        if state.get("ActiveState") in ("failed", "inactive"):
            print(json.dumps(state))
            return 2
        if time.monotonic() >= deadline:
            print(json.dumps(state))
            return 1
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
