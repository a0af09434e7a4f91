"""README.md's quick start, followed literally against two lab nodes (issue 21 item 8).

Two systemd lab nodes with Docker inside (``lab/up.sh --runtime container --nodes-only`` with
``UMA_LAB_ENGINE_LOAD=0``: the image uma-lab/node-docker:bookworm, no image in either node's Docker)
stand in for the two DGX Sparks. The test takes
every command of the README's quick start (tests/integration/_quickstart.py: the block between
the ``quickstart:begin``/``quickstart:end`` markers) and runs them in the README's order, from a
copy of this checkout, with HOME in a temporary directory (so ``~/sparks`` is a fresh copy of
inventories/spark and the collection is installed from the tarball the README builds):

1. ``ansible-galaxy collection build && ... install -p ~/.ansible/collections``, ``cp -r inventories/spark
   ~/sparks`` in the checkout's copy, as written; then ``cd ~``: every later command runs from the home
   directory, outside the checkout (no ansible.cfg: Ansible's defaults, no pipelining);
2. the values table: ``LAB_INVENTORY`` below sets each value the README's table names (each one
   checked to hold the published example's value first), the vault file is made from
   ``vault.yml.example`` and ``ansible-vault encrypt``-ed with a password file;
3. the check-mode run (it says what the run will pull; nothing may exist on the nodes after it, no
   image pulled, no weight downloaded) and the run (each node pulled the engine image from the
   registry, ai1 downloaded the model, ai2 got it over the cluster link);
4. ``systemctl status`` of the engine's unit on either node, the ``curl`` (an answer with a completion);
5. the undo command (the unit is gone, the shared kernel's vm.* values are back).

A command is changed only by ``LAB_VALUES`` (the README's placeholders and published addresses
-> the lab's). A command in the README that ``STEPS`` does not know, or one it knows that the
README lost, fails the test before anything runs (drift; tests/unit/test_quickstart_readme.py
proves that check).

The nodes are reached as a fresh pair's owner reaches them: over SSH (the node's real sshd,
openssh-server installed into each node by this test as a DGX OS node has it) as ``spark``, a user
whose sudo asks for a password (the ``sudo`` group, no NOPASSWD anywhere), with ``-K`` answered from
a 0600 file. The key is the test's own (``ansible_ssh_private_key_file`` and the known-hosts file
named in hosts.yml: ssh reads ~/.ssh from the account's passwd home, not from the test's HOME).

STAND-INS for what cannot exist here: the nodes are containers on this machine's Docker bridge; no
GPU and no 80B model: the engine is the lab's vLLM CPU build (uma-lab/vllm-cpu;
lab/runtime-container.yml's settings), tensor parallel 2 over the Docker bridge (eth0) instead of
the ConnectX link. A STAND-IN FOR NGC (nvcr.io): the lab's registry (lab/registry.sh: Debian's
docker-registry, TLS on this machine's bridge address) holds the engine image, pushed there by
tests/setup.sh (this test pushes it when the registry lacks it); the inventory names it as
``ADDRESS/uma-lab/vllm-cpu:0.32.0`` and the role's own ``docker pull`` on each node fetches it. Each
node's Docker is given the lab's CA (``/etc/docker/certs.d/ADDRESS/ca.crt``), where a Spark trusts
nvcr.io's public CA already; the image's layers are uncompressed (nvcr.io's are gzip: see
lab/registry_push.py). The test reads the registry's access log: the check-mode run fetched no
layer, the run fetched each layer once per node. The model is the README's Hub id, from a STAND-IN
FOR THE HUB: lab/hub_standin.py on this machine's Docker bridge address serves the lab's tiny
Llama (.cache/lab/models/tiny-1g, 1 GiB of real safetensors) as ``lab/tiny-llama``
(``vllm_service_hub_endpoint`` added to the inventory) and, as the Hub does, answers each weight
file's ``resolve`` with a redirect to a signed URL on another origin, its CDN: the name ``CDN_HOST``,
which each node's /etc/hosts resolves to the same server (a stand-in for the Hub's CDN and DNS).
Neither node has a model or ``huggingface_hub`` (``UMA_LAB_MODELS=0``: nothing mounted at
/models). The test checks that the check-mode run downloaded nothing (only config.json was read,
into memory), that only ai1 asked the stand-in for the weights, each file once, and fetched each
weight file from the CDN once, and that ai2 got them over the cluster link.

Each node's Docker keeps its images on a named volume: ``UMA_QUICKSTART_VOLUME_PREFIX`` ('' by
default: the lab's own uma-lab-ai{1,2}-docker volumes, emptied of images first, so the engine image
this test's run pulls is there for molecule/cluster_container and lab/up.sh --runtime container
afterwards) and ``UMA_QUICKSTART_PREFIX`` (node container names, default itest-qs-). The test
refuses to start while another container uses those volumes.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from _quickstart import check_known
from test_vllm_parser_oracle import ROOT

sys.path.insert(0, str(ROOT / "lab"))
import hub_standin

PREFIX = os.environ.get("UMA_QUICKSTART_PREFIX", "itest-qs-")
VOLUME_PREFIX = os.environ.get("UMA_QUICKSTART_VOLUME_PREFIX", "")
HOSTS = ("ai1", "ai2")
API_KEY = "quickstart-key-%d" % os.getpid()
VAULT_PASSWORD = "quickstart-vault-password-%d" % os.getpid()
NODE_IMAGE = "uma-lab/node-docker:bookworm"
# The README's placeholders and published example values in its commands -> the lab's.
SSH_USER = "spark"
SUDO_PASSWORD = "quickstart-sudo-%d" % os.getpid()
LAB_VALUES = {
    "<ssh user>": SSH_USER,
    # no terminal in a test: the passwords from 0600 files (the options ansible-playbook has for both)
    " -K ": " --become-password-file ~/become-pass ",
    "--ask-vault-pass": "--vault-password-file ~/vault-pass",
    # ai1's management address (ansible_host): the lab's node has one address, its cluster link's too
    "10.0.0.11": "{ai1_addr}",
    "<vault_vllm_api_key>": API_KEY,
    "Qwen/Qwen3-Next-80B-A3B-Instruct": "lab/tiny-llama",
}
MODEL = ROOT / ".cache" / "lab" / "models" / "tiny-1g"
REGISTRY = ROOT / "lab" / "registry.sh"
CDN_HOST = "cdn.hub-standin.test"
MODELS_DIR = "/var/lib/uma-vllm/models"
# The README's quick start, command by command, and what the test does with each (in this order).
STEPS = [
    ("ansible-galaxy collection build && ansible-galaxy collection install uma-vllm-0.1.0.tar.gz"
     " -p ~/.ansible/collections", "shell"),
    ("cp -r inventories/spark ~/sparks", "shell"),
    ("cd ~", "cd"),
    ("ansible-vault encrypt", "values_table"),
    ("ansible-playbook uma.vllm.site -i ~/sparks -u <ssh user> -K --ask-vault-pass --check --diff", "check_run"),
    ("ansible-playbook uma.vllm.site -i ~/sparks -u <ssh user> -K --ask-vault-pass", "run"),
    ("systemctl status uma-vllm@qwen3-next", "on_each_node"),
    ('curl -s http://10.0.0.11:8000/v1/completions -H "Authorization: Bearer <vault_vllm_api_key>" '
     "-H 'Content-Type: application/json' -d '{\"model\": \"Qwen/Qwen3-Next-80B-A3B-Instruct\", "
     '"prompt": "The capital of France is", "max_tokens": 8}\'', "curl"),
    ("ansible-playbook uma.vllm.restore -i ~/sparks -u <ssh user> -K --ask-vault-pass", "restore"),
]  # fmt: skip
KNOBS = ("min_free_kbytes", "vfs_cache_pressure", "dirty_ratio", "dirty_background_ratio", "swappiness")


def _knobs():
    return {name: open("/proc/sys/vm/" + name).read().strip() for name in KNOBS}


def _docker(*args, check=True, timeout=120):
    return subprocess.run(["docker", *args], check=check, capture_output=True, text=True, timeout=timeout)


def _addr(name):
    return _docker("inspect", "-f", "{{.NetworkSettings.IPAddress}}", name).stdout.strip()


def _bridge_gateway(node):
    """This machine's address on the Docker bridge, where the nodes reach it: the bridge's IPAM
    gateway, or (Debian's docker.io 20.10 leaves the default bridge's IPAM Gateway empty) the node's
    own default route. Never empty: a stand-in bound to "" listens on 0.0.0.0 and the nodes were
    sent to http://0.0.0.0:PORT, their own loopback."""
    gateway = _docker("network", "inspect", "bridge", "-f", "{{range .IPAM.Config}}{{.Gateway}}{{end}}").stdout
    if not gateway.strip():
        route = _docker("exec", node, "ip", "-4", "route", "show", "default").stdout.split()
        gateway = route[route.index("via") + 1] if "via" in route else ""
    assert gateway.strip(), "no address of this machine on the Docker bridge (IPAM gateway or the node's route)"
    return gateway.strip()


def _lab_inventory(ctx):
    """The README's values table, filled with the lab's values: (file, key path, published, lab)."""
    runtime = yaml.safe_load((ROOT / "lab" / "runtime-container.yml").read_text())
    plan = {"tensor_parallel_size": 2, "max_model_len": 512, "max_num_seqs": 4, "extra_args": ["--enforce-eager"]}
    table = []
    for index, host in enumerate(HOSTS):
        table += [
            ("hosts.yml", ["all", "children", "spark", "hosts", host, "ansible_host"], "10.0.0.1%d" % (index + 1),
             ctx["addrs"][host]),
            # the test's own key and known hosts (an owner's are in ~/.ssh, which ssh finds by itself)
            ("hosts.yml", ["all", "children", "spark", "hosts", host, "ansible_ssh_private_key_file"], None,
             str(ctx["home"] / ".ssh" / "id_ed25519")),
            ("hosts.yml", ["all", "children", "spark", "hosts", host, "ansible_ssh_common_args"], None,
             "-o UserKnownHostsFile=%s -o StrictHostKeyChecking=yes" % (ctx["home"] / ".ssh" / "known_hosts")),
            ("host_vars/%s.yml" % host, ["uma_cluster_addr"], "192.168.100.1%d" % (index + 1), ctx["addrs"][host]),
            ("host_vars/%s.yml" % host, ["uma_net_interface"], "enp1s0f1np1", "eth0"),
            # the README's override: the lab's nodes share this machine's RAM and kernel (inventories/lab)
            ("host_vars/%s.yml" % host, ["uma_ram_gib"], None, 23),
            ("host_vars/%s.yml" % host, ["uma_min_free_kbytes"], None, (262144, 196608)[index]),
        ]  # fmt: skip
    table += [
        # ai2 shares ai1's kernel: only ai1 puts vm.* values in force (inventories/lab/host_vars/ai2.yml)
        ("host_vars/ai2.yml", ["node_prep_sysctl_apply"], None, False),
        ("group_vars/spark.yml", ["node_prep_require_unified_memory"], True, False),  # no GB10 here
        ("group_vars/spark.yml", ["uma_reserve_gib"], None, 4),
        # the lab registry's name of the engine image (a stand-in for nvcr.io)
        ("group_vars/spark.yml", ["vllm_service_image"], "nvcr.io/nvidia/vllm:26.05-py3", ctx["image"]),
        ("group_vars/spark.yml", ["vllm_service_engines", 0, "model"], "Qwen/Qwen3-Next-80B-A3B-Instruct",
         "lab/tiny-llama"),
        # a stand-in: the Hub is not reachable here (lab/hub_standin.py on the Docker bridge)
        ("group_vars/spark.yml", ["vllm_service_hub_endpoint"], None, ctx["hub"].endpoint),
        ("group_vars/spark.yml", ["vllm_service_engines", 0, "plan"],
         {"tensor_parallel_size": 2, "max_model_len": 65536, "max_num_seqs": 16}, plan),
        ("group_vars/spark.yml", ["vllm_service_engines", 0, "env"], None,
         {"VLLM_CPU_KVCACHE_SPACE": "1", "TORCHDYNAMO_DISABLE": "1"}),
        # the lab's slow CPU engine gets the lab's timeouts (the firewall stays on: these nodes have
        # NET_ADMIN, and lab/runtime-container.yml's vllm_service_firewall is added below)
        ("group_vars/spark.yml", ["vllm_service_health_timeout_s"], None, 900),
        ("group_vars/spark.yml", ["vllm_service_peer_timeout_s"], None, 300),
    ]  # fmt: skip
    # the rest of the lab's container settings, but its image (the registry's, above) and its no-pull
    # (the lab loads its image elsewhere; these nodes pull it with the role's default, as a Spark does)
    for key, value in runtime.items():
        if key not in ("vllm_service_runtime", "vllm_service_image", "vllm_service_pull_image"):
            table.append(("group_vars/spark.yml", [key], None, value))
    return table


def _set(doc, path, published, value, where):
    for key in path[:-1]:
        doc = doc[key]
    have = doc.get(path[-1]) if isinstance(doc, dict) else doc[path[-1]]
    # None: a value the published example leaves unset (the README's "only to override")
    assert have == published, "%s %s is %r, the quick-start test expects %r" % (where, path, have, published)
    doc[path[-1]] = value


def _run(ctx, command, timeout=1800):
    started = time.monotonic()
    proc = subprocess.run(
        ["bash", "-c", command], cwd=str(ctx.get("cwd", ctx["checkout"])), env=ctx["env"],
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    ctx["timings"].append("%6.1f s  %s" % (time.monotonic() - started, command[:110]))
    return proc


def _must(proc, command):
    output = proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, "%s\n-> rc %d\n%s" % (command, proc.returncode, output)
    return proc


def _lab_command(ctx, command):
    for old, new in LAB_VALUES.items():
        command = command.replace(old, new.format(ai1_addr=ctx["addrs"]["ai1"]))
    return command


def step_shell(ctx, command):
    command = _lab_command(ctx, command)
    return _must(_run(ctx, command), command)


def step_cd(ctx, command):
    """The README's commands after the install run from the home directory, outside the checkout (no
    ansible.cfg there: Ansible's defaults, as on an owner's laptop)."""
    assert command == "cd ~"
    ctx["cwd"] = ctx["home"]
    ctx["timings"].append("         cd ~ (the next commands run in %s)" % ctx["home"])


def step_values_table(ctx, command):
    sparks = ctx["home"] / "sparks"
    docs = {}
    for name, path, published, value in _lab_inventory(ctx):
        if name not in docs:
            docs[name] = yaml.safe_load((sparks / name).read_text())
        _set(docs[name], path, published, value, name)
    for name, doc in docs.items():
        (sparks / name).write_text(yaml.safe_dump(doc, sort_keys=False))
    example = (sparks / "group_vars" / "all" / "vault.yml.example").read_text()
    assert 'vault_vllm_api_key: ""' in example
    (sparks / "group_vars" / "all" / "vault.yml").write_text(
        example.replace('vault_vllm_api_key: ""', "vault_vllm_api_key: %s" % API_KEY)
    )
    full = command + " --vault-password-file ~/vault-pass ~/sparks/group_vars/all/vault.yml"
    _must(_run(ctx, full), full)
    assert (sparks / "group_vars" / "all" / "vault.yml").read_text().startswith("$ANSIBLE_VAULT;")


def _installed(node):
    return _docker("exec", node, "sh", "-c", "ls /etc/uma-vllm /etc/systemd/system/uma-vllm@.service", check=False)


def _weights_asked(ctx, where="/resolve/"):
    """The stand-in's GETs of the model's files (``where``: /resolve/ at the Hub, /cdn/ at its CDN): (client
    address, file name)."""
    return [(entry["client"], str(entry["path"]).rsplit("/", 1)[-1]) for entry in ctx["hub"].log
            if entry["method"] == "GET" and where in str(entry["path"])]  # fmt: skip


def _images(node):
    return _docker("exec", node, "docker", "image", "ls", "-aq").stdout.split()


def _registry_requests(ctx):
    """The registry's requests since the last call: (client address, method, path, status)."""
    lines = subprocess.run(["bash", str(REGISTRY), "requests"], check=True, capture_output=True, text=True).stdout
    lines = lines.splitlines()
    new, ctx["registry_seen"] = lines[ctx.get("registry_seen", 0) :], len(lines)
    return [tuple(line.split()) for line in new]


def _layers(ctx):
    """The engine image's layer digests, from the registry's manifest (read from this machine, once)."""
    if "layers" not in ctx:
        ctx["layers"] = _read_layers(ctx)
    return ctx["layers"]


def _read_layers(ctx):
    repository, tag = ctx["image"].split("/", 1)[1].rsplit(":", 1)
    port = ctx["image"].split("/", 1)[0].rsplit(":", 1)[1]
    context = ssl.create_default_context(cafile=str(ROOT / ".cache" / "lab" / "registry" / "certs" / "ca.crt"))
    request = urllib.request.Request("https://127.0.0.1:%s/v2/%s/manifests/%s" % (port, repository, tag))
    request.add_header("Accept", "application/vnd.docker.distribution.manifest.v2+json")
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return sorted(layer["digest"] for layer in json.load(response)["layers"])


def _layer_gets(ctx, requests):
    """(client, layer digest) of each layer fetched (the config blob is read by `docker manifest inspect` too)."""
    layers = set(_layers(ctx))
    return sorted((client, path.rsplit("/", 1)[-1]) for client, method, path, status in requests
                  if method == "GET" and status == "200" and path.rsplit("/", 1)[-1] in layers)  # fmt: skip


def step_check_run(ctx, command):
    _registry_requests(ctx)
    proc = step_shell(ctx, command)
    for host, node in ctx["nodes"].items():
        said = "%s: check mode: the run will pull %s (not on the node)" % (host, ctx["image"])
        assert said in proc.stdout, "the check-mode run did not say the pull on %s:\n%s" % (host, proc.stdout[-4000:])
        assert _images(node) == [], "the check-mode run pulled an image on %s" % node
    assert _layer_gets(ctx, _registry_requests(ctx)) == [], "the check-mode run fetched image layers"
    for node in ctx["nodes"].values():
        probe = _installed(node)
        assert probe.returncode != 0, "the check-mode run left files on %s: %s" % (node, probe.stdout)
        models = _docker("exec", node, "ls", MODELS_DIR, check=False)
        assert models.returncode != 0, "the check-mode run made %s on %s: %s" % (MODELS_DIR, node, models.stdout)
    # the plan of the model not downloaded yet read its config.json (into memory), nothing else
    assert {name for _client, name in _weights_asked(ctx)} == {"config.json"}, ctx["hub"].log
    assert _weights_asked(ctx, "/cdn/") == [], ctx["hub"].log


def step_run(ctx, command):
    ctx["hub"].log.clear()
    step_shell(ctx, command)
    asked = _weights_asked(ctx)
    files = sorted(name for name in os.listdir(str(MODEL)) if not name.startswith("."))
    # ai1 (rank 0) downloaded every file once; ai2 never asked the Hub: it copied them over the link
    assert sorted(name for _client, name in asked) == files, asked
    assert {client for client, _name in asked} == {ctx["addrs"]["ai1"]}, asked
    # the weights (the Hub's LFS files) came from the CDN the Hub redirected to, each once, to ai1 only
    lfs = sorted(name for name, meta in ctx["hub"].repos["lab/tiny-llama"].files.items() if meta["lfs"])
    assert lfs and any(name.endswith(".safetensors") for name in lfs), lfs
    assert sorted(_weights_asked(ctx, "/cdn/")) == [(ctx["addrs"]["ai1"], name) for name in lfs], ctx["hub"].log
    script = "cd %s/lab/tiny-llama && sha256sum %s" % (MODELS_DIR, " ".join(files))
    sums = [_docker("exec", node, "sh", "-c", script).stdout for node in ctx["nodes"].values()]
    assert sums[0] == sums[1] and len(sums[0].splitlines()) == len(files), sums
    # each node pulled the engine image from the lab registry: each layer once per node
    gets = _layer_gets(ctx, _registry_requests(ctx))
    assert gets == sorted((ctx["addrs"][host], layer) for host in HOSTS for layer in _layers(ctx)), gets
    for node in ctx["nodes"].values():
        digests = _docker("exec", node, "docker", "image", "inspect", "-f", "{{json .RepoDigests}}", ctx["image"])
        digests = digests.stdout
        assert ctx["image"].rsplit(":", 1)[0] + "@sha256:" in digests, (node, digests)


def step_on_each_node(ctx, command):
    ctx["timings"].append("         %s --no-pager (docker exec on each node)" % command)
    for node in ctx["nodes"].values():
        proc = _docker("exec", node, *shlex.split(command), "--no-pager", check=False)
        assert proc.returncode == 0 and "active (running)" in proc.stdout, (node, proc.stdout, proc.stderr)


def step_curl(ctx, command):
    command = _lab_command(ctx, command)
    proc = _must(_run(ctx, command, timeout=120), command)
    answer = json.loads(proc.stdout)
    assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] > 0, answer


def step_restore(ctx, command):
    step_shell(ctx, command)
    for node in ctx["nodes"].values():
        probe = _installed(node)
        assert probe.returncode != 0, "the undo command left %s on %s" % (probe.stdout, node)
    assert _knobs() == ctx["knobs"], "the undo command left the kernel's vm.* values changed"


def _ssh_owner(home, nodes, addrs):
    """What a fresh DGX Spark has and the lab image lacks: sshd, and its owner's account, whose sudo asks
    for a password; the owner's key in its authorized_keys and the nodes' host keys in known_hosts."""
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(ssh / "id_ed25519")], check=True)
    public = (ssh / "id_ed25519.pub").read_text().strip()
    script = (
        "set -e; export DEBIAN_FRONTEND=noninteractive; "
        "apt-get install -y -qq --no-install-recommends openssh-server >/dev/null; "
        "id {user} >/dev/null 2>&1 || useradd -m -s /bin/bash -G sudo {user}; "
        "echo '{user}:{password}' | chpasswd; "
        "install -d -m 0700 -o {user} -g {user} /home/{user}/.ssh; "
        "echo '{key}' > /home/{user}/.ssh/authorized_keys; "
        "chown {user}:{user} /home/{user}/.ssh/authorized_keys; chmod 0600 /home/{user}/.ssh/authorized_keys; "
        "systemctl start ssh"
    ).format(user=SSH_USER, password=SUDO_PASSWORD, key=public)
    for host, node in nodes.items():
        done = _docker("exec", node, "sh", "-c", script, check=False, timeout=600)
        assert done.returncode == 0, "%s: sshd and the owner's account: %s" % (node, done.stdout + done.stderr)
        sudoers = _docker("exec", node, "sh", "-c", "cat /etc/sudoers /etc/sudoers.d/* 2>/dev/null").stdout
        assert "NOPASSWD" not in sudoers, sudoers  # sudo asks the password
        for _attempt in range(50):
            keys = subprocess.run(["ssh-keyscan", "-t", "ed25519", addrs[host]], capture_output=True, text=True,
                                  check=False).stdout  # fmt: skip
            if keys.strip():
                break
            time.sleep(0.2)
        with open(ssh / "known_hosts", "a", encoding="ascii") as handle:
            handle.write(keys)
    asks = _docker("exec", "-u", SSH_USER, nodes["ai1"], "sudo", "-n", "true", check=False)
    assert asks.returncode != 0 and "password" in asks.stderr, asks.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = None
    if os.geteuid() != 0 or not shutil.which("docker"):
        reason = "needs root and docker"
    elif _docker("image", "inspect", "uma-lab/node:bookworm", check=False).returncode != 0:
        reason = "needs the lab image (tests/setup.sh builds it)"
    elif not (ROOT / ".cache" / "lab" / "vllm-venv" / "bin" / "vllm-serve-lab").exists():
        reason = "needs the lab's vLLM venv (tests/setup.sh)"
    if reason:
        if os.environ.get("UMA_REQUIRE_TOOLS") == "1":
            pytest.fail("UMA_REQUIRE_TOOLS=1 but the quick-start test %s" % reason)
        pytest.skip(reason)
    nodes = {host: PREFIX + host for host in HOSTS}
    for host in HOSTS:
        volume = "%suma-lab-%s-docker" % (VOLUME_PREFIX, host)
        users = _docker("ps", "--filter", "volume=" + volume, "--format", "{{.Names}}").stdout.split()
        others = [name for name in users if name not in nodes.values()]
        assert not others, "volume %s is in use by %s: stop that lab first (lab/up.sh --down)" % (volume, others)
        _docker("rm", "-f", nodes[host], check=False)
    knobs = _knobs()
    env = dict(os.environ, UMA_LAB_PREFIX=PREFIX, UMA_LAB_VOLUME_PREFIX=VOLUME_PREFIX, UMA_LAB_SETUP="0",
               UMA_LAB_MODELS="0", UMA_LAB_ENGINE_LOAD="0")  # fmt: skip
    engine_image = yaml.safe_load((ROOT / "lab" / "runtime-container.yml").read_text())["vllm_service_image"]
    started = time.monotonic()
    # the registry holds the engine image (tests/setup.sh pushed it; pushed here where it did not)
    pushed = subprocess.run(["bash", str(REGISTRY), "push", engine_image], capture_output=True, text=True,
                            timeout=900, check=False)  # fmt: skip
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    push_s, started = time.monotonic() - started, time.monotonic()
    hub = None
    up = subprocess.run(
        ["bash", str(ROOT / "lab" / "up.sh"), "--runtime", "container", "--nodes-only"],
        env=env, capture_output=True, text=True, timeout=1200, check=False,
    )  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        home = tmp_path_factory.mktemp("quickstart")
        checkout = home / "checkout"
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=str(ROOT), check=True, capture_output=True, text=True,
        ).stdout.split("\0")  # fmt: skip
        for name in filter(None, listed):
            source = ROOT / name
            if source.is_file():
                (checkout / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, checkout / name)
        for name, secret in (("vault-pass", VAULT_PASSWORD), ("become-pass", SUDO_PASSWORD)):
            fd = os.open(str(home / name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secret + "\n")
        addrs = {host: _addr(name) for host, name in nodes.items()}
        registry = subprocess.run(["bash", str(REGISTRY), "address"], check=True, capture_output=True,
                                  text=True).stdout.strip()  # fmt: skip
        for node in nodes.values():
            # a fresh Spark's Docker has no image; it trusts nvcr.io's CA (a stand-in: the lab's CA)
            emptied = "docker ps -aq | xargs -r docker rm -f; docker image ls -aq | xargs -r docker rmi -f"
            _docker("exec", node, "sh", "-c", emptied, timeout=300)
            assert _images(node) == [], "%s: images left in its Docker: %s" % (node, _images(node))
            subprocess.run(["bash", str(REGISTRY), "trust", node], check=True, capture_output=True)
        up_s, owner_started = time.monotonic() - started, time.monotonic()
        _ssh_owner(home, nodes, addrs)
        owner_s = time.monotonic() - owner_started
        # what a user's shell has: the control node's tools, no checkout on the Python path
        child = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k != "PYTHONPATH"}
        child.update(HOME=str(home), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
        gateway = _bridge_gateway(nodes[HOSTS[0]])
        hub = hub_standin.serve({"lab/tiny-llama": str(MODEL)}, host=gateway, cdn=True, cdn_host=CDN_HOST)
        for node in nodes.values():
            # the Hub's CDN is another origin, found by name (a stand-in: this server, by the node's hosts file)
            _docker("exec", node, "sh", "-c", "echo '%s %s' >> /etc/hosts" % (gateway, CDN_HOST))
        ctx = {
            "home": home, "checkout": checkout, "env": child, "nodes": nodes, "knobs": knobs, "hub": hub,
            "addrs": addrs, "image": "%s/%s" % (registry, engine_image),
            "timings": ["%6.1f s  lab/registry.sh push %s (the lab registry holds it)" % (push_s, engine_image),
                        "%6.1f s  lab/up.sh --runtime container --nodes-only (no image in either node)" % up_s,
                        "%6.1f s  sshd and the owner's sudo account on both nodes (what a Spark has)" % owner_s],
        }  # fmt: skip
        yield ctx
    finally:
        if hub is not None:
            hub.shutdown()
            hub.server_close()
        for name in nodes.values():
            _docker("rm", "-f", name, check=False)
        for name, value in knobs.items():
            if _knobs()[name] != value:
                with open("/proc/sys/vm/" + name, "w") as handle:
                    handle.write(value)


def test_the_readme_quick_start_runs_as_written(lab):
    readme = (ROOT / "README.md").read_text()
    steps = check_known(readme, [command for command, _action in STEPS])
    assert len(steps) == len(STEPS)
    try:
        for command, action in STEPS:
            globals()["step_" + action](lab, command)
    finally:
        sys.stderr.write("\nquick start, step by step:\n" + "\n".join(lab["timings"]) + "\n")
    # the runs (from the home directory) used the collection the README installed from its tarball (a
    # MANIFEST.json only an installed copy has) in ~/.ansible/collections, where Ansible looks by default
    installed = lab["home"] / ".ansible" / "collections" / "ansible_collections" / "uma" / "vllm"
    assert (installed / "MANIFEST.json").is_file() and not installed.is_symlink()
    assert not (lab["home"] / "ansible.cfg").exists() and lab["cwd"] == lab["home"]
