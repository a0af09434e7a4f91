# Copyright: uma.vllm developers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# Run on the node by playbooks/status.yml (python3 -c, argv: CONFIG_DIR STATE_DIR ENGINE...): reads,
# and changes nothing, what each engine's rank on this node is doing and prints it as JSON: its unit
# and its watchdog's unit (systemctl show), the launcher config (health URL, rank), the watchdog's
# state.json (phase, reason) and last restart or give-up (events.json), the last launch record
# (exit, why it stopped), the node's memory and one GET of the health URL; from the config's plan the
# model, the vLLM release, the KV tokens and --gpu-memory-utilization it was planned for; for the
# container runtime the rank's container (its image, image id and registry digest, state, and the
# memory of its own cgroup: the launcher's unit holds only the client). Secrets are never read (the
# EnvironmentFiles are not opened). Standard library only (the node's Python).
import json
import os
import subprocess
import sys
import urllib.request

PROPS = ["ActiveState", "SubState", "Result", "NRestarts", "MemoryCurrent", "ActiveEnterTimestamp", "StatusText"]
RESTART_ACTIONS = ("restart", "systemd-restart", "gave_up", "peer-stop", "peer-start", "peer-gave-up")


def read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def units(names):
    argv = ["systemctl", "show"] + ["-p%s" % p for p in ["Id", *PROPS]]
    argv += ["%s@%s.service" % (kind, name) for name in names for kind in ("uma-vllm", "uma-vllm-watchdog")]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for block in out.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            found[props["Id"]] = props
    return found


def last_event(events):
    items = events if isinstance(events, list) else (events or {}).get("events") or []
    for event in reversed([e for e in items if isinstance(e, dict)]):
        if event.get("action") in RESTART_ACTIONS:
            return {k: event.get(k) for k in ("action", "reason", "at", "time", "epoch_s") if event.get(k) is not None}
    return None


def health(url):
    if not isinstance(url, str) or not url.startswith("http"):
        return None
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return response.status
    except Exception as exc:  # any failure to answer is the answer
        return getattr(exc, "code", None) or type(exc).__name__


def run(argv):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=15)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def cgroup_memory(pid, proc_root="/proc", cgroup_root="/sys/fs/cgroup"):
    """Bytes the cgroup of ``pid`` uses: cgroup v2 ``memory.current``, else the v1 memory controller's
    ``memory.usage_in_bytes`` (a hybrid host); None where neither can be read."""
    try:
        with open(os.path.join(proc_root, str(int(pid)), "cgroup"), encoding="ascii") as handle:
            lines = handle.read().splitlines()
    except (OSError, ValueError, TypeError):
        return None
    places = []
    for line in lines:
        number, _sep, rest = line.partition(":")
        controllers, _sep, path = rest.partition(":")
        if number == "0" and controllers == "":
            places.append((path, "memory.current"))
        elif "memory" in controllers.split(","):
            places.insert(0, (os.path.join("memory", path.lstrip("/")), "memory.usage_in_bytes"))
    for path, name in places:
        if ".." in path.split("/"):
            continue
        try:
            with open(os.path.join(cgroup_root, path.lstrip("/"), name), encoding="ascii") as handle:
                return int(handle.read().strip())
        except (OSError, ValueError):
            continue
    return None


def container(name, command):
    """The rank's container when the launcher's command runs one (``CLIENT run ... --name uma-vllm-NAME``)."""
    words = [str(w) for w in command] if isinstance(command, list) else []
    want = "uma-vllm-" + name
    if "run" not in words[:3] or not any(a == "--name" and b == want for a, b in zip(words, words[1:])):
        return None
    client = words[0]
    shown = run([client, "inspect", "--format", "{{.Config.Image}}|{{.Image}}|{{.State.Status}}|{{.State.Pid}}", want])
    if not shown:
        return {"name": want, "state": "absent"}
    image, image_id, state, pid = [*shown.split("|"), "", "", "", ""][:4]
    digests = run([client, "image", "inspect", "--format", "{{json .RepoDigests}}", image]) or "[]"
    try:
        digests = [d for d in json.loads(digests) if isinstance(d, str)]
    except ValueError:
        digests = []
    return {
        "name": want,
        "image": image,
        "image_id": image_id,
        "digests": digests,
        "state": state,
        "memory": cgroup_memory(pid) if pid.isdigit() and pid != "0" else None,
    }


def meminfo():
    out = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                key, sep, rest = line.partition(":")
                if sep and key in ("MemTotal", "MemAvailable"):
                    out[key + "_kb"] = int(rest.split()[0])
    except (OSError, ValueError):
        pass
    return out


def main(config_dir, state_dir, names):
    shown = units(names)
    engines = {}
    for name in names:
        config = read_json(os.path.join(config_dir, "engines", name + ".json")) or {}
        cluster = config.get("cluster") or {}
        plan = config.get("plan") if isinstance(config.get("plan"), dict) else {}
        launch = read_json(os.path.join(state_dir, "launches", name, "latest", "launch.json")) or {}
        watchdog = read_json(os.path.join(state_dir, "watchdog", name, "state.json")) or {}
        engines[name] = {
            "unit": shown.get("uma-vllm@%s.service" % name, {}),
            "watchdog_unit": shown.get("uma-vllm-watchdog@%s.service" % name, {}),
            "rank": cluster.get("rank"),
            "nnodes": cluster.get("nnodes"),
            "health_url": config.get("health_url"),
            "health": health(config.get("health_url")),
            "watchdog": {k: watchdog.get(k) for k in ("phase", "reason", "restarts_in_window") if k in watchdog},
            "last_restart": last_event(read_json(os.path.join(state_dir, "watchdog", name, "events.json"))),
            "last_launch": {k: launch.get(k) for k in ("exit_code", "stopped_because", "started_at") if k in launch},
            "model": config.get("model_path"),
            "plan": {k: plan.get(k) for k in ("vllm_version", "kv_tokens", "gpu_memory_utilization") if k in plan},
            "container": container(name, config.get("command")),
        }
    print(json.dumps({"memory": meminfo(), "engines": engines}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
