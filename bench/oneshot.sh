# shellcheck shell=bash
# Sourced by the bench scripts that time one-shot `sandboxd run`s, with the
# directory for their engine state as $1: a broker name of this run's own
# (its containers and cache volumes carry it), containerd's engine state
# inside that directory, and at exit the removal of every volume and
# container of that name (a one-shot command keeps its caches for the next
# one; a bench must leave none). Anything it cannot remove is named.
oneshot_dir="$1"
SANDBOXD_BROKER_NAME="sbbench-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
SANDBOXD_CONTAINERD_STATE="$oneshot_dir/containerd"
export SANDBOXD_BROKER_NAME SANDBOXD_CONTAINERD_STATE
oneshot_cleanup() {
  local c v
  docker ps -aq --filter "name=$SANDBOXD_BROKER_NAME-" | xargs -r docker rm -f >/dev/null 2>&1 || true
  docker volume ls -q | grep "^$SANDBOXD_BROKER_NAME-" | xargs -r docker volume rm -f >/dev/null 2>&1 || true
  rm -rf "$SANDBOXD_CONTAINERD_STATE"
  c=$(docker ps -aq --filter "name=$SANDBOXD_BROKER_NAME-")
  v=$(docker volume ls -q | grep "^$SANDBOXD_BROKER_NAME-" || true)
  if [ -n "$c$v" ]; then echo "bench: LEFT BEHIND: $c $v" >&2; fi
}
trap oneshot_cleanup EXIT
trap 'exit 130' INT TERM
