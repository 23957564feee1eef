#!/usr/bin/env bash
# FUSE round trips in an evaluation's jobs (issue 26; BENCHMARKS.md, "Where
# the time goes", item 7): `sandboxd run` of examples/go (good candidate,
# built as bench/evaluation.sh builds it) on the Docker engine, whose root
# file systems are served by fuse-overlayfs on this machine, and on the
# containerd engine (overlayfs snapshotter: the kernel's, no FUSE).
#
#   ./bench/fuse.sh [rounds]    (default 3; root, perf with the fuse tracepoints)
#
# 1. One traced run per engine. For each job container of the run (named
#    $SANDBOXD_BROKER_NAME-*): its wall time (while its cgroup exists), its
#    CPU (cgroup v1 cpuacct, user and system), and on Docker the FUSE
#    requests of its root file system (perf, fuse:fuse_request_send/end,
#    matched by the connection, which is the device of the container's
#    MergedDir) by opcode and by requesting command, their summed latency
#    (thread time blocked; FORGET and RELEASE are not waited for), the time
#    at least one request was outstanding, and the CPU of the container's
#    fuse-overlayfs daemon (which runs outside the container's cgroup).
# 2. Rounds alternating the two engines, untraced: wall time, load.
#
# Extra `sandboxd run` flags may be given in SANDBOXD_RUN_FLAGS. Everything
# runs under the broker name sandboxd-fusebench (its own volumes); the
# runs remove their containers themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-3}"
[ "$(id -u)" = 0 ] || { echo "fuse.sh: needs root (perf -a, cgroups)" >&2; exit 1; }
perf list 'fuse:fuse_request_send' 2>/dev/null | grep -q fuse_request_send || { echo "fuse.sh: perf does not list the fuse:fuse_request_send tracepoint" >&2; exit 1; }
./scripts/setup >/dev/null
export SANDBOXD_STATE="${SANDBOXD_STATE:-$PWD/.cache/bench-state}"
export SANDBOXD_BROKER_NAME=sandboxd-fusebench
work="$PWD/.cache/bench-fuse"
rm -rf "$work" && mkdir -p "$work"
go_image=$(./bin/sandboxd image build -q images/go | tail -n 1)
cp -r examples/go/bundle "$work/go-bundle"
sed "s/@GO_IMAGE@/$go_image/" examples/go/bundle.json.in > "$work/go-bundle/bundle.json"
ws=examples/go/candidates/good
bg=()
cleanup() {
  local p
  for p in "${bg[@]}"; do kill -- -"$p" 2>/dev/null || kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

run() { # engine: one run, its wall time in ms; it must pass
  local start end
  start=$(date +%s%N)
  # shellcheck disable=SC2086
  ./bin/sandboxd run --engine "$1" --ephemeral-key --quiet ${SANDBOXD_RUN_FLAGS:-} --bundle "$work/go-bundle" --workspace "$ws" > "$work/out.txt"
  end=$(date +%s%N)
  echo $(((end - start) / 1000000))
}

# mono: CLOCK_MONOTONIC in seconds, the clock of the perf records (a
# connection's device number is reused by later mounts: a container's
# requests are those of its lifetime).
mono() { python3 -c 'import time; print(time.clock_gettime(time.CLOCK_MONOTONIC))'; }

# follow NAME CGROUP [MERGED]: one line for a job container when its cgroup
# goes: name, wall, CPU, and for Docker the FUSE connection and daemon CPU.
follow() {
  local name=$1 cg=$2 merged=${3:-} dev="" fpid="" fticks=0 ns=0 user=0 sys=0 t0 m0 f u s
  if [ -n "$merged" ]; then
    dev=$(stat -c %d "$merged" 2>/dev/null || true)
    fpid=$(pgrep -f -- " $merged\$" | head -n 1 || true)
  fi
  t0=$(date +%s%N)
  m0=$(mono)
  while [ -d "$cg" ]; do
    u=$(cat "$cg/cpuacct.usage" 2>/dev/null || true); [ -n "$u" ] && ns=$u
    s=$(cat "$cg/cpuacct.stat" 2>/dev/null || true)
    [ -n "$s" ] && { user=$(awk '/^user/ {print $2}' <<<"$s"); sys=$(awk '/^system/ {print $2}' <<<"$s"); }
    if [ -n "$fpid" ]; then
      f=$(awk '{print $14 + $15}' "/proc/$fpid/stat" 2>/dev/null || true); [ -n "$f" ] && fticks=$f
    fi
    sleep 0.1
  done
  echo "$name wall_ms=$((($(date +%s%N) - t0) / 1000000)) cpu_ns=$ns user_ticks=$user sys_ticks=$sys dev=$dev fuse_daemon_ticks=$fticks mono=$m0,$(mono)"
}

watch_docker() { # the run's containers, as they start
  docker events --filter type=container --filter event=start --format '{{.ID}} {{.Actor.Attributes.name}}' |
    while read -r id name; do
      case "$name" in "$SANDBOXD_BROKER_NAME"-*) ;; *) continue ;; esac
      follow "$name" "/sys/fs/cgroup/cpuacct/docker/$id" "$(docker inspect -f '{{.GraphDriver.Data.MergedDir}}' "$id")" &
    done
}

watch_containerd() { # the engine's cgroups are /sandboxd/<container name>
  local d
  declare -A seen=()
  while :; do
    for d in /sys/fs/cgroup/cpuacct/sandboxd/"$SANDBOXD_BROKER_NAME"-*; do
      if [ ! -d "$d" ] || [ -n "${seen[$d]:-}" ]; then continue; fi
      seen[$d]=1
      follow "${d##*/}" "$d" &
    done
    sleep 0.05
  done
}

traced() { # engine
  local e=$1 wall
  run "$e" >/dev/null # warm: volumes, selfcheck, page cache; containerd imports the image
  : > "$work/containers-$e.txt"
  set -m # the watcher and its children get a process group of their own
  "watch_$e" >> "$work/containers-$e.txt" &
  local watch_pid=$!
  set +m
  bg+=("$watch_pid")
  perf record -q -k monotonic -m 16M -a -e fuse:fuse_request_send -e fuse:fuse_request_end -o "$work/perf-$e.data" 2>/dev/null &
  local perf_pid=$!
  bg+=("$perf_pid")
  sleep 2
  echo "$e: traced run, load before $(cut -d' ' -f1-3 /proc/loadavg)"
  wall=$(run "$e")
  echo "$e: wall ${wall} ms, load after $(cut -d' ' -f1-3 /proc/loadavg)"
  sleep 1
  kill -INT "$perf_pid"
  wait "$perf_pid" 2>/dev/null || true
  kill -- -"$watch_pid" 2>/dev/null || true
  sleep 0.3
  perf script -i "$work/perf-$e.data" -F comm,time,event,trace 2>/dev/null > "$work/perf-$e.txt"
  python3 - "$work/containers-$e.txt" "$work/perf-$e.txt" <<'EOF'
import collections, re, sys
conts, bydev = [], {}
for line in open(sys.argv[1]):
    f = line.split()
    kv = dict(x.split("=", 1) for x in f[1:])
    conts.append((f[0], kv))
    if kv.get("dev"):
        a, b = kv["mono"].split(",")
        bydev.setdefault(int(kv["dev"]), []).append((float(a), float(b), f[0]))
rx = re.compile(r"^\s*(.*?)\s+([\d.]+):\s+fuse:fuse_request_(send|end):\s+connection (\d+) req (\d+)(?: opcode \d+ \((\w+)\))?")
events = [m for m in map(rx.match, open(sys.argv[2])) if m and int(m.group(4)) in bydev]
# A container's connection begins with the FUSE_INIT last sent on its
# device before the container was seen to start, and ends with the
# container: the device number is reused by later mounts.
inits = collections.defaultdict(list)
for m in events:
    if m.group(6) == "FUSE_INIT":
        inits[int(m.group(4))].append(float(m.group(2)))
spans = collections.defaultdict(list)  # dev -> (from, to, name)
for dev, cs in bydev.items():
    for a, b, name in cs:
        begin = max([t for t in inits[dev] if t <= a + 0.5], default=a - 2)
        spans[dev].append((begin, b + 0.5, name))
def owner(dev, ts):
    for a, b, name in spans[dev]:
        if a <= ts <= b:
            return name
    return None
pending, ops, lat, comms = {}, collections.Counter(), collections.Counter(), collections.Counter()
per = collections.defaultdict(lambda: [0, 0.0, []])
async_ops = {"FUSE_FORGET", "FUSE_BATCH_FORGET", "FUSE_RELEASE", "FUSE_RELEASEDIR"}
for m in events:
    comm, ts, kind, dev, req, op = m.group(1), float(m.group(2)), m.group(3), int(m.group(4)), m.group(5), m.group(6)
    name = owner(dev, ts)
    if name is None:
        continue
    dev = name
    if kind == "send":
        pending[(dev, req)] = (ts, op)
        ops[op] += 1
        comms[comm] += 1
        per[dev][0] += 1
    elif (dev, req) in pending:
        t0, op = pending.pop((dev, req))
        if op not in async_ops:
            lat[op] += ts - t0
            per[dev][1] += ts - t0
            per[dev][2].append((t0, ts))
def outstanding(iv):
    total, end = 0.0, None
    for a, b in sorted(iv):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total
n = sum(ops.values())
if bydev:
    print(f"  FUSE requests of the run's job containers: {n}")
    for op, c in ops.most_common(8):
        print(f"    {op:18s} {c:7d}  summed latency {lat[op]:6.2f} s  mean {1e6 * lat[op] / c:5.0f} us")
    print("    by command: " + ", ".join(f"{c} {k}" for c, k in ((c, k) for k, c in comms.most_common(6))))
tw = tc = tb = to = tf = 0.0
devof = {name: dev for dev, cs in bydev.items() for _, _, name in cs}
for name, kv in sorted(conts):
    d = per[name] if name in devof else [0, 0.0, []]
    wall, cpu, fd = int(kv["wall_ms"]) / 1000, int(kv["cpu_ns"]) / 1e9, int(kv["fuse_daemon_ticks"]) / 100
    o = outstanding(d[2])
    tw += wall; tc += cpu; tb += d[1]; to += o; tf += fd
    fuse = f", FUSE {d[0]} requests, blocked {d[1]:.2f} s, outstanding {o:.2f} s ({100 * o / wall:.0f} % of wall), fuse-overlayfs CPU {fd:.2f} s" if name in devof else ""
    print(f"  {name[len('sandboxd-fusebench-'):]}: wall {wall:.2f} s, CPU {cpu:.2f} s (user {int(kv['user_ticks']) / 100:.2f}, system {int(kv['sys_ticks']) / 100:.2f}){fuse}")
if bydev:
    print(f"  jobs together: wall {tw:.2f} s, CPU {tc:.2f} s + fuse-overlayfs {tf:.2f} s, FUSE blocked {tb:.2f} s, outstanding {to:.2f} s ({100 * to / tw:.0f} % of the jobs' wall)")
else:
    print(f"  jobs together: wall {tw:.2f} s, CPU {tc:.2f} s")
EOF
}

echo "bench/fuse.sh: examples/go, $(date -u +%FT%TZ), Docker storage driver $(docker info -f '{{.Driver}}')"
traced docker
traced containerd

[ "$rounds" -gt 0 ] || exit 0
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : int((a[NR/2] + a[NR/2+1]) / 2)}'; }
: > "$work/docker.txt" && : > "$work/containerd.txt"
for r in $(seq "$rounds"); do
  for e in docker containerd; do
    l=$(cut -d' ' -f1 /proc/loadavg)
    w=$(run "$e")
    echo "$w" >> "$work/$e.txt"
    echo "round $r $e: ${w} ms (load ${l} → $(cut -d' ' -f1 /proc/loadavg))"
  done
done
d=$(median < "$work/docker.txt")
c=$(median < "$work/containerd.txt")
echo "medians of $rounds: docker ${d} ms, containerd ${c} ms, ratio $(awk -v c="$c" -v d="$d" 'BEGIN {printf "%.2f", c / d}')"
