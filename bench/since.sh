# shellcheck shell=bash
# Sourced by the bench scripts that compare this checkout with the build of
# an earlier commit, with the commit as $1 and a directory of the script's
# own as $2: scripts/setup; bench/oneshot.sh on that directory (a broker name
# of the run's own, everything of it removed at exit); the commit's worktree
# in $2/src ($base, kept for the next run) with every command of it built;
# and `alternate ROUNDS`, which runs the caller's `timed base` and `timed
# head` (each printing one figure) ROUNDS times each, the order swapping
# each round, into $2/base.txt and $2/head.txt.
./scripts/setup >/dev/null
mkdir -p "$2"
. bench/oneshot.sh "$2"
base="$2/src"
if [ "$(git -C "$base" rev-parse HEAD 2>/dev/null)" != "$(git rev-parse "$1^{commit}")" ]; then
  rm -rf "$base"
  git worktree prune
  git worktree add -f --detach "$base" "$1" >/dev/null
fi
(cd "$base" && CGO_ENABLED=0 go build -trimpath -o bin/ ./cmd/...) # every command of that build (an older one had a hook binary too)
since_work="$2"

alternate() {
  : > "$since_work/base.txt" && : > "$since_work/head.txt"
  local r
  for r in $(seq "$1"); do
    if [ $((r % 2)) = 1 ]; then
      timed base >> "$since_work/base.txt"; timed head >> "$since_work/head.txt"
    else
      timed head >> "$since_work/head.txt"; timed base >> "$since_work/base.txt"
    fi
  done
}
