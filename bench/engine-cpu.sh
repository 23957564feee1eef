#!/usr/bin/env bash
# bench/engine-cpu.sh: what each of sandboxd's container settings costs the
# engine, in CPU per container (BENCHMARKS.md item 2's "~70 ms more per job").
#
# Every variant is the bare `docker run --rm --network none IMAGE /bin/true`
# plus one setting of internal/broker/spec.go (or all of them, "all"). Each
# sample runs N containers through `xargs -P P docker run ...` (item 2's
# shape) and records, over the sample's window:
#   machine  busy CPU of the whole machine from /proc/stat (all but idle,
#            iowait): includes whatever else runs on a shared machine
#   engine   task-clock of dockerd and containerd and of every process they
#            start during the window (`perf stat -p` counts inherit into
#            children: containerd-shim, runc, fuse-overlayfs, docker-init, the
#            container's processes), plus the CLI; other work on the machine
#            is not in it, other users of the same engine are (see foreign)
#   dockerd, containerd   utime+stime of the daemons' own threads (/proc/<pid>/stat)
#   children the engine's started processes: perf total - dockerd - containerd
#   cli      user+sys of the docker CLI processes (getrusage via /usr/bin/time)
#   wall     the window divided by N
# Variants are interleaved (the order rotates every round); the table gives
# medians over rounds, in ms per container, and the difference from "base".
# Other users of the engine are detected with `docker events`: a sample during
# which someone else created a container is reported in column "foreign" and
# left out of the medians when at least 3 clean samples remain.
#
# Usage: bench/engine-cpu.sh                       # all variants, 5 rounds of 30
#        ROUNDS=9 N=30 P=4 bench/engine-cpu.sh base all log init
#        IMAGE=... (default: sandboxd/minimal, built with bin/sandboxd if absent)
# Everything created carries the label sandboxd.enginecpu=<run> and is removed
# at exit (containers by --rm and a final sweep, the volume by name).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-5}
N=${N:-30}
P=${P:-4}
IMAGE=${IMAGE:-sandboxd/minimal}
RUN=enginecpu-$$-$RANDOM
LABEL=sandboxd.enginecpu
VOL=$RUN-vol
SECCOMP=$PWD/profiles/seccomp/sandboxd.json
TMP=$(mktemp -d)
EVENTS_PID=

cleanup() {
	set +e
	[ -n "$EVENTS_PID" ] && kill "$EVENTS_PID" 2>/dev/null && wait "$EVENTS_PID" 2>/dev/null
	left=$(docker ps -aq --filter "label=$LABEL=$RUN")
	[ -n "$left" ] && docker rm -f $left >/dev/null
	docker volume rm -f "$VOL" >/dev/null 2>&1
	left=$(docker ps -aq --filter "label=$LABEL=$RUN"; docker volume ls -q --filter "name=$VOL")
	[ -n "$left" ] && echo "LEFT BEHIND: $left" >&2
	rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
	[ -x bin/sandboxd ] || ./scripts/setup
	IMAGE=$(bin/sandboxd image build -q images/minimal | tail -n 1)
fi

# sandboxd's defaults (sandbox.DefaultLimits, broker.DefaultConfig).
DISK=536870912
LIMITS=(--memory 1073741824 --memory-swap 1073741824 --cpus 1 --pids-limit 256 --oom-score-adj 1000
	--ulimit core=0:0 --ulimit fsize=268435456:268435456 --ulimit nofile=1024:1024 --ulimit nproc=8192:8192)
LOG=(--log-driver local --log-opt max-size=16m --log-opt max-file=1 --log-opt compress=false)
TMPFS=(--tmpfs "/work:rw,exec,nosuid,nodev,size=$DISK,mode=0755,uid=65534,gid=65534"
	--tmpfs "/tmp:rw,exec,nosuid,nodev,size=$DISK,mode=1777")
CAPS=(--cap-drop ALL --cap-add SETUID --cap-add SETGID)
VOLUME=(--mount "type=volume,src=$VOL,dst=/.sandboxd,readonly,volume-nocopy")
MISC=(--hostname sandbox --user 0:0 -e SANDBOXD_STREAM_NONCE=0123456789abcdef --workdir /)

ALL_VARIANTS=(base host log init tmpfs readonly seccomp seccomp-unconfined caps nnp ipc cgroupns
	limits volume stdin dns misc all all-log all-init all-tmpfs all-seccomp)

# args NAME: sets A to the variant's extra arguments (after --rm --label).
args() {
	local all=("${LOG[@]}" --network none --init "${TMPFS[@]}" --read-only
		--security-opt "seccomp=$SECCOMP" "${CAPS[@]}" --security-opt no-new-privileges:true
		--ipc none --cgroupns private "${LIMITS[@]}" "${VOLUME[@]}" -i --dns 127.0.0.1 "${MISC[@]}")
	case $1 in
	base) A=(--network none) ;;
	host) A=(--network host) ;;
	log) A=(--network none "${LOG[@]}") ;;
	init) A=(--network none --init) ;;
	tmpfs) A=(--network none "${TMPFS[@]}") ;;
	readonly) A=(--network none --read-only) ;;
	seccomp) A=(--network none --security-opt "seccomp=$SECCOMP") ;;
	seccomp-unconfined) A=(--network none --security-opt seccomp=unconfined) ;; # reference only
	caps) A=(--network none "${CAPS[@]}") ;;
	nnp) A=(--network none --security-opt no-new-privileges:true) ;;
	ipc) A=(--network none --ipc none) ;;
	cgroupns) A=(--network none --cgroupns private) ;;
	limits) A=(--network none "${LIMITS[@]}") ;;
	volume) A=(--network none "${VOLUME[@]}") ;;
	stdin) A=(--network none -i) ;; # xargs gives its children /dev/null as stdin
	dns) A=(--network none --dns 127.0.0.1) ;;
	misc) A=(--network none "${MISC[@]}") ;;
	all) A=("${all[@]}") ;;
	all-log) A=("${all[@]:${#LOG[@]}}") ;; # all but the log driver (json-file default)
	all-init) A=(); for x in "${all[@]}"; do [ "$x" = --init ] || A+=("$x"); done ;;
	all-tmpfs) A=("${LOG[@]}" --network none --init --read-only "${all[@]:$((${#LOG[@]} + 3 + ${#TMPFS[@]} + 1))}") ;;
	all-seccomp) A=(); for x in "${all[@]}"; do [ "$x" = "seccomp=$SECCOMP" ] && { unset 'A[-1]'; continue; }; A+=("$x"); done ;;
	*) echo "unknown variant $1 (known: ${ALL_VARIANTS[*]})" >&2; exit 2 ;;
	esac
}

VARIANTS=("$@")
[ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=("${ALL_VARIANTS[@]}")
for v in "${VARIANTS[@]}"; do args "$v"; done
[ -f "$SECCOMP" ] || { echo "no $SECCOMP" >&2; exit 1; }

# The helper volume stands in for sandboxd's: one small file, read-only.
docker volume create --label "$LABEL=$RUN" "$VOL" >/dev/null
docker run --rm --label "$LABEL=$RUN" -v "$VOL:/v" "$IMAGE" sh -c 'cp /bin/true /v/shim' >/dev/null

DOCKERD=$(pgrep -xo dockerd)
CONTAINERD=$(pgrep -xo containerd)
busy() { awk 'NR==1 { s=0; for (i=2; i<=NF; i++) if (i!=5 && i!=6) s+=$i; print s }' /proc/stat; }
ticks() { awk '{ print $14+$15 }' "/proc/$1/stat"; }     # own utime+stime
HZ=$(getconf CLK_TCK)

docker events --filter type=container --filter event=create \
	--format "{{.TimeNano}} {{index .Actor.Attributes \"$LABEL\"}}" >"$TMP/events" &
EVENTS_PID=$!
seq "$N" >"$TMP/seq"
seq 4 >"$TMP/seq-warm"
SEQ=$TMP/seq-warm

# sample NAME ROUND: one window of N containers; appends a line to samples:
# name round machine dockerd containerd children cli wall_ms foreign (CPU in ms).
sample() {
	args "$1"
	local b0 d0 c0 t0 b1 d1 c1 t1 cli foreign perfms
	b0=$(busy) d0=$(ticks "$DOCKERD") c0=$(ticks "$CONTAINERD") t0=$(date +%s%N)
	perf stat -x, -o "$TMP/perf" -e task-clock -p "$DOCKERD,$CONTAINERD" -- \
		/usr/bin/time -f '%U %S' -o "$TMP/time" xargs -P"$P" -I{} \
		docker run --rm --label "$LABEL=$RUN" "${A[@]}" "$IMAGE" /bin/true <"$SEQ" >/dev/null 2>"$TMP/err" ||
		{ echo "variant $1 failed:" >&2; grep -v "Localhost DNS" "$TMP/err" | tail -n 5 >&2; exit 1; }
	t1=$(date +%s%N) b1=$(busy) d1=$(ticks "$DOCKERD") c1=$(ticks "$CONTAINERD")
	perfms=$(awk -F, '$3 == "task-clock" { printf "%.0f", $1 }' "$TMP/perf")
	cli=$(awk '{ printf "%.0f", ($1+$2)*1000 }' "$TMP/time")
	foreign=$(awk -v a="$t0" -v b="$t1" -v run="$RUN" '$1>=a && $1<=b && $2!=run' "$TMP/events" | wc -l)
	d1=$(((d1 - d0) * 1000 / HZ)) c1=$(((c1 - c0) * 1000 / HZ))
	echo "$1 $2 $(((b1 - b0) * 1000 / HZ)) $d1 $c1 $((perfms - d1 - c1)) $cli $(((t1 - t0) / 1000000)) $foreign" >>"$TMP/samples"
}

echo "engine CPU per container: image $IMAGE, $N containers per sample at -P$P, $ROUNDS rounds, ${#VARIANTS[@]} variants"
echo "docker $(docker version --format '{{.Server.Version}}'), $(docker info --format '{{.Driver}}, cgroup v{{.CgroupVersion}}'), $(nproc) CPUs"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in "${VARIANTS[@]}"; do sample "$i" warmup; done # 4 containers each: first runs pay caches
: >"$TMP/samples"
SEQ=$TMP/seq
n=${#VARIANTS[@]}
for ((r = 0; r < ROUNDS; r++)); do
	for ((k = 0; k < n; k++)); do sample "${VARIANTS[$(((k + r) % n))]}" "$r"; done
	echo "  round $((r + 1))/$ROUNDS done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
echo "load after:  $(cut -d' ' -f1-3 /proc/loadavg)"
[ -z "${SAMPLES:-}" ] || cp "$TMP/samples" "$SAMPLES"

# Medians per variant, in ms per container.
order=$(printf '%s\n' "${VARIANTS[@]}")
# Samples during which someone else created containers are dropped when at
# least 3 clean ones remain for the variant.
awk 'NR == FNR { c[$1] += ($9 == 0); next } !(c[$1] >= 3 && $9 > 0)' "$TMP/samples" "$TMP/samples" >"$TMP/used"
awk -v n="$N" -v order="$order" '
function med(list,   a, k, t, i, j) {
	k = split(list, a, " ")
	if (k == 0) return "nan"
	for (i = 2; i <= k; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j+1] = a[j]; a[j+1] = t }
	return k % 2 ? a[(k+1)/2] : (a[k/2] + a[k/2+1]) / 2
}
{ v = $1; x[1]=$3; x[2]=$4+$5+$6+$7; x[3]=$4; x[4]=$5; x[5]=$6; x[6]=$7; x[7]=$8
  for (c = 1; c <= 7; c++) L[v, c] = L[v, c] " " x[c] / n
  E[v, $2] = x[2] / n; B[v, $2] = x[1] / n; rounds[$2] = 1; used[v]++
  if (!((v, "min") in E) || x[2] / n < E[v, "min"]) E[v, "min"] = x[2] / n }
END {
	m = split(order, vs, "\n")
	for (i = 1; i <= m; i++) {
		v = vs[i]
		for (c = 1; c <= 7; c++) M[v, c] = med(L[v, c])
		de = ""; dm = ""
		for (r in rounds) if ((v, r) in E && ("base", r) in E) { de = de " " E[v, r] - E["base", r]; dm = dm " " B[v, r] - B["base", r] }
		DE[v] = med(de); DM[v] = med(dm)
	}
	printf "%-20s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %5s\n", "variant", "machine", "Δbase", "engine", "Δbase", "min", "dockerd", "contnrd", "children", "cli", "wall", "used"
	for (i = 1; i <= m; i++) {
		v = vs[i]
		printf "%-20s %8.0f %+8.0f %8.0f %+8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %5d\n", v, M[v,1], DM[v], M[v,2], DE[v], E[v,"min"], M[v,3], M[v,4], M[v,5], M[v,6], M[v,7], used[v]
	}
}' "$TMP/used"
echo "(ms per container, medians over rounds; Δbase = median over rounds of (variant - base) in the same round,"
echo " only when base is among the variants; min = lowest engine sample;"
echo " used = samples in the median; samples during which another user created containers: $(awk '$9 > 0' "$TMP/samples" | wc -l) of $(wc -l <"$TMP/samples"))"
