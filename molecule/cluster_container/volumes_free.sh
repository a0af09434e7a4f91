#!/usr/bin/env bash
# molecule/cluster_container's nodes mount the lab's Docker volumes (uma-lab-ai{1,2}-docker, the
# engine-image cache that lab/up.sh --runtime container and the quick-start test share). Two Docker
# engines on one /var/lib/docker break it: refuse while a container other than this scenario's own
# nodes (cluster-ctr-ai1/2, left by an earlier run; destroy removes them next) uses either volume.
set -euo pipefail
for volume in uma-lab-ai1-docker uma-lab-ai2-docker; do
  users=$(docker ps -a --filter "volume=$volume" --format '{{.Names}}' | grep -v -x -e cluster-ctr-ai1 -e cluster-ctr-ai2 || true)
  if [ -n "$users" ]; then
    echo "molecule/cluster_container: volume $volume is in use by: $users." \
      "Fix: stop that lab first (bash lab/up.sh --down), or remove the container." >&2
    exit 1
  fi
done
