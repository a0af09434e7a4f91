#!/usr/bin/env bash
# The lab's image registry: a STAND-IN FOR NGC (nvcr.io), where a DGX Spark's owner pulls the engine
# image from. A real registry, Debian's docker-registry package (the distribution registry 2.8, what
# Docker Hub and most private registries run), on this machine, serving TLS on the Docker bridge's
# address so the lab nodes pull from it as a Spark pulls from nvcr.io: over the network, with a
# certificate their Docker checks. The certificate is signed by the lab's own CA
# (.cache/lab/registry/certs/ca.crt): where nvcr.io's is signed by a public CA every node already
# trusts, a lab node is given the lab CA in /etc/docker/certs.d/ADDRESS/ca.crt (Docker's own way to
# trust a private registry; `trust NODE` below). No login: NGC's public images need none either.
#
#   lab/registry.sh start          start it (kept when running; idempotent)
#   lab/registry.sh push IMAGE     start it, and push this machine's IMAGE into it as ADDRESS/IMAGE,
#                                  unless it holds that image already (same config digest): its
#                                  layers uncompressed (lab/registry_push.py, the registry's HTTP API)
#   lab/registry.sh retag REPOSITORY:FROM TO KEY=VALUE
#                                  publish as REPOSITORY:TO the registry's REPOSITORY:FROM with the label
#                                  KEY=VALUE added to its config: another image Id on the same layers
#                                  (again with another VALUE: the tag moved, as a nightly's does)
#   lab/registry.sh address        print ADDRESS (the bridge's address:port, what the nodes pull from)
#   lab/registry.sh trust NODE     give lab node container NODE the lab CA for ADDRESS (its Docker)
#   lab/registry.sh requests       print the registry's requests so far: "REMOTE METHOD PATH STATUS"
#   lab/registry.sh stop           stop it (its storage stays in .cache/lab/registry/data)
#
# The push goes to 127.0.0.1 (the certificate names it too): nothing of this machine's Docker
# configuration is changed. UMA_LAB_REGISTRY_PORT (default 5000) picks the port.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
dir="${UMA_LAB_CACHE:-$root/.cache/lab}/registry"
port="${UMA_LAB_REGISTRY_PORT:-5000}"
log() { printf '[registry] %s\n' "$*" >&2; }
die() { printf 'registry.sh: %s\n' "$*" >&2; exit 1; }

case "$port" in
  ''|*[!0-9]*) die "UMA_LAB_REGISTRY_PORT='$port' is not a port number (1024-65535)" ;;
esac
if [ "$port" -lt 1024 ] || [ "$port" -gt 65535 ]; then
  die "UMA_LAB_REGISTRY_PORT='$port' is not a port number (1024-65535)"
fi

# This machine's address on the Docker bridge (docker0), where the lab nodes reach it.
bridge_addr() {
  local addr
  addr=$(ip -4 -o addr show dev docker0 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -1)
  [ -n "$addr" ] || addr=$(docker network inspect bridge -f '{{range .IPAM.Config}}{{.Gateway}}{{end}}' 2>/dev/null || true)
  [ -n "$addr" ] || die "no address of this machine on the Docker bridge (docker0): is dockerd running?"
  echo "$addr"
}

answers() { curl -sf --max-time 5 --cacert "$dir/certs/ca.crt" "https://127.0.0.1:$port/v2/" >/dev/null 2>&1; }

# The lab CA and the registry's certificate for the bridge's address and 127.0.0.1 (made once; again
# when the bridge's address changed).
certs() {
  local addr=$1 certs=$dir/certs
  mkdir -p "$certs"
  if [ -f "$certs/server.crt" ] && [ "$(cat "$certs/server.addr" 2>/dev/null)" = "$addr" ]; then
    return
  fi
  log "the lab CA and a certificate for $addr"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=uma.vllm lab CA" \
    -keyout "$certs/ca.key" -out "$certs/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$addr" -keyout "$certs/server.key" -out "$certs/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' "$addr" >"$certs/server.ext"
  openssl x509 -req -in "$certs/server.csr" -CA "$certs/ca.crt" -CAkey "$certs/ca.key" -CAcreateserial \
    -days 3650 -extfile "$certs/server.ext" -out "$certs/server.crt" 2>/dev/null
  chmod 0600 "$certs/ca.key" "$certs/server.key"
  echo "$addr" >"$certs/server.addr"
}

start() {
  command -v docker-registry >/dev/null \
    || die "docker-registry is not installed: apt-get install docker-registry (tests/setup.sh does)"
  local addr pid
  addr=$(bridge_addr)
  mkdir -p "$dir/data"
  exec 9>"$dir/lock"
  flock 9
  pid=$(cat "$dir/registry.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$(cat "$dir/certs/server.addr" 2>/dev/null)" = "$addr" ] && answers; then
    return
  fi
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  certs "$addr"
  cat >"$dir/config.yml" <<EOF
# written by lab/registry.sh
version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: :$port
  tls:
    certificate: $dir/certs/server.crt
    key: $dir/certs/server.key
EOF
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is taken by another program (UMA_LAB_REGISTRY_PORT picks another)"
  fi
  : >"$dir/registry.log"
  nohup docker-registry serve "$dir/config.yml" >>"$dir/registry.log" 2>&1 9>&- &
  echo $! >"$dir/registry.pid"
  for _ in $(seq 1 50); do answers && break; sleep 0.2; done
  answers || { tail -20 "$dir/registry.log" >&2; die "docker-registry did not answer on port $port"; }
  log "docker-registry 2.8 serving https://$addr:$port (storage $dir/data)"
}

# The config digest the registry holds for REPOSITORY:TAG (empty when it holds none).
held_config() {
  curl -sf --max-time 10 --cacert "$dir/certs/ca.crt" \
    -H 'Accept: application/vnd.oci.image.manifest.v1+json' \
    -H 'Accept: application/vnd.docker.distribution.manifest.v2+json' \
    "https://127.0.0.1:$port/v2/$1/manifests/$2" 2>/dev/null \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["config"]["digest"])' 2>/dev/null || true
}

push() {
  local image=$1 id repository tag
  [[ $image =~ ^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] \
    || die "push: '$image' is not NAME:TAG of this machine's Docker (e.g. uma-lab/vllm-cpu:0.32.0)"
  id=$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null) \
    || die "push: this machine's Docker has no image $image (lab/build-engine-image.sh builds the engine image)"
  start
  repository=${image%:*} tag=${image##*:}
  if [ "$(held_config "$repository" "$tag")" = "$id" ]; then
    log "holds $image ($id)"
    return
  fi
  SECONDS=0
  # not docker push: it gzips each layer on one core (lab/registry_push.py says why and what differs)
  python3 "$here/registry_push.py" "$image" "127.0.0.1:$port" "$dir/certs/ca.crt" >&2 || die "push: $image not pushed (above)"
  [ "$(held_config "$repository" "$tag")" = "$id" ] || die "push: the registry does not hold $image after the push"
  log "pushed $image as $(bridge_addr):$port/$image in ${SECONDS} s"
}

retag() {
  local from=$1 to=$2 label=$3 repository
  [[ $from =~ ^[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] \
    || die "retag: '$from' is not REPOSITORY:TAG (e.g. uma-lab/vllm-cpu:0.32.0)"
  [[ $to =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || die "retag: '$to' is not a tag (letters, digits, _ . -)"
  [[ $label =~ ^[a-z0-9][a-z0-9._-]*=[A-Za-z0-9_.:-]*$ ]] || die "retag: '$label' is not KEY=VALUE (e.g. uma.lab.build=2)"
  start
  repository=${from%:*}
  [ -n "$(held_config "$repository" "${from##*:}")" ] || die "retag: the registry holds no $from (lab/registry.sh push $from)"
  python3 "$here/registry_push.py" --retag "$repository" "${from##*:}" "$to" "$label" "127.0.0.1:$port" "$dir/certs/ca.crt" >&2 \
    || die "retag: $repository:$to not published (above)"
}

trust() {
  local node=$1 addr
  addr=$(bridge_addr)
  [ -f "$dir/certs/ca.crt" ] || die "trust: no lab CA yet (lab/registry.sh start makes it)"
  docker exec "$node" mkdir -p "/etc/docker/certs.d/$addr:$port" >/dev/null || die "trust: no lab node container '$node'"
  docker cp "$dir/certs/ca.crt" "$node:/etc/docker/certs.d/$addr:$port/ca.crt" >/dev/null
}

# One line per request of the access log: remote address, method, path, status.
requests() {
  [ -f "$dir/registry.log" ] || return 0
  sed -n 's/^\([0-9.]*\) - - \[[^]]*\] "\([A-Z]*\) \([^ ]*\) [^"]*" \([0-9]*\) .*/\1 \2 \3 \4/p' "$dir/registry.log"
}

case "${1:-}" in
  start) start ;;
  push) [ $# -eq 2 ] || die "push takes one IMAGE (NAME:TAG)"; push "$2" ;;
  retag) [ $# -eq 4 ] || die "retag takes REPOSITORY:FROM TO KEY=VALUE"; retag "$2" "$3" "$4" ;;
  address) echo "$(bridge_addr):$port" ;;
  trust) [ $# -eq 2 ] || die "trust takes one lab node container name"; trust "$2" ;;
  requests) requests ;;
  stop)
    pid=$(cat "$dir/registry.pid" 2>/dev/null || true)
    [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
    rm -f "$dir/registry.pid" ;;
  *) die "usage: registry.sh start | push IMAGE | address | trust NODE | requests | stop" ;;
esac
