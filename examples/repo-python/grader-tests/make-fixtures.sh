#!/usr/bin/env bash
# Writes the fixtures of the patch appliers' unit tests (patch.py here,
# examples/repo-go/bundle/grader/patch.go) into DIR, one directory a case:
#
#   before/          the tree the patch is applied to (absent: empty)
#   candidate.patch  real `git diff` (or `git format-patch`) output; for a
#                    refusal git cannot write (a path with "..", a header
#                    cut short), git's output edited by the line below that
#                    says so
#   after/           the tree after applying it (absent: empty), or
#   refused          a part of the refusal's message, when it must be refused
#
# Both appliers take the same fixtures: after changing a case here, run
#   make-fixtures.sh examples/repo-python/grader-tests/testdata/patches
#   make-fixtures.sh examples/repo-go/bundle/grader/testdata/patches
# (examples/repo-go/grader_test.go checks that the two copies agree).
set -euo pipefail
out=${1:?usage: make-fixtures.sh DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GIT_CONFIG_NOSYSTEM=1 HOME=$work LC_ALL=C
g() { git -c core.autocrlf=false -c core.quotepath=true -c diff.noprefix=false -c diff.mnemonicPrefix=false \
          -c diff.renames=false -c user.name=fixture -c user.email=fixture@example.com "$@"; }

# A case: begin NAME (a fresh repository), put FILE CONTENT (printf %b) for
# each file of before/, start (commits them and keeps them as before/), then
# the change, diff_ (candidate.patch: git diff of it) and finish (after/) or
# refused TEXT.
begin() {
  name=$1
  rm -rf "${out:?}/${name:?}" "$work/r"
  mkdir -p "$out/$name" "$work/r"
  cd "$work/r"
  g init -q
}
put() { mkdir -p "$(dirname "$1")"; printf '%b' "$2" > "$1"; }
start() { # commits the tree: it is before/
  g add -A
  g commit -q --allow-empty -m base
  snapshot before
}
snapshot() { # the work tree's files (tracked or not, present) into $out/$name/$1
  mkdir -p "$out/$name/$1"
  g ls-files -z --cached --others | while IFS= read -r -d '' f; do
    [ -e "$f" ] || continue
    mkdir -p "$out/$name/$1/$(dirname "$f")"
    cp -p "$f" "$out/$name/$1/$f"
  done
  rmdir "$out/$name/$1" 2>/dev/null || true
}
diff_() { g add -A && g diff --cached "$@" > "$out/$name/candidate.patch"; }
finish() { snapshot after; }
refused() { printf '%s\n' "$1" > "$out/$name/refused"; }

ten='one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'

# --- patches that apply ---------------------------------------------------

# One line changed.
begin clean-apply; put src/calc.txt "$ten"; start
put src/calc.txt 'one\ntwo\nthree\nFOUR\nfive\nsix\nseven\neight\nnine\nten\n'; diff_; finish

# Two hunks in one file and a second file.
begin two-hunks-two-files; put src/calc.txt "$ten$ten"; put src/other.txt 'a\nb\n'; start
put src/calc.txt "one\nTWO\n${ten#one\\ntwo\\n}${ten%nine\\nten\\n}NINE\nten\n"; put src/other.txt 'a\nB\n'; diff_; finish

# The patch was made against a file with three more lines at its top: its
# hunk sits three lines earlier than its header says (git apply takes it).
begin hunk-at-other-lines; put src/calc.txt "x\ny\nz\n$ten"; start
put src/calc.txt "x\ny\nz\none\ntwo\nthree\nfour\nfive\nsix\nSEVEN\neight\nnine\nten\n"; diff_
put src/calc.txt "$ten"; g add -A; g commit -q -m moved; rm -rf "$out/$name/before"; snapshot before
put src/calc.txt 'one\ntwo\nthree\nfour\nfive\nsix\nSEVEN\neight\nnine\nten\n'; finish

# Hunks without context (git diff -U0): "-4,0" inserts after line 4.
begin zero-context; put src/calc.txt "$ten"; start
put src/calc.txt 'one\ntwo\nthree\nfour\nfour and a half\nfive\nsix\nseven\neight\nnine\n'; diff_ -U0; finish

# A file created (in a new directory) and a file deleted.
begin create-and-delete; put src/calc.txt "$ten"; put src/old.txt 'gone\n'; start
rm src/old.txt; put src/new/made.txt 'made\nhere\n'; diff_; finish

# An empty file created and another deleted: git writes a header, no hunk.
begin empty-files; put src/calc.txt "$ten"; put src/empty.txt ''; start
rm src/empty.txt; put src/pkg/__init__.py ''; diff_; finish

# "\ No newline at end of file": the last line changed, and the newline added to another file.
begin no-newline-at-end; put src/a.txt 'one\ntwo'; put src/b.txt 'one\ntwo'; start
put src/a.txt 'one\nTWO'; put src/b.txt 'one\ntwo\n'; diff_; finish

# A file with CRLF line ends: the CRs are part of the lines.
begin crlf-file; put src/win.txt 'one\r\ntwo\r\nthree\r\n'; start
put src/win.txt 'one\r\nTWO\r\nthree\r\n'; diff_; finish

# git format-patch: a mail's headers and message around the diff.
begin format-patch; put src/calc.txt "$ten"; start
put src/calc.txt 'one\ntwo\nthree\nfour\nFIVE\nsix\nseven\neight\nnine\nten\n'; g add -A; g commit -q -m 'five, loudly' -m 'The message, the diffstat and the signature are text outside the diff.'
g format-patch -1 --stdout --zero-commit | sed 's/^Date: .*/Date: Thu, 1 Jan 1970 00:00:00 +0000/' > "$out/$name/candidate.patch"; finish

# An empty patch changes nothing.
begin empty-patch; put src/calc.txt "$ten"; start
: > "$out/$name/candidate.patch"; finish

# --- patches refused --------------------------------------------------------

# Made against another version of the file.
begin context-mismatch; put src/calc.txt "$ten"; start
put src/calc.txt 'one\ntwo\nthree\nfour\nfive\nsix\nseven\nEIGHT\nnine\nten\n'; diff_
g add -A; g commit -q -m other; put src/calc.txt 'one\ntwo\nthree\nfour\nfive\nSIX\nseven\neight\nnine\nten\n'; g add -A; g commit -q -m other2
rm -rf "$out/$name/before"; snapshot before
refused 'hunk 1 (line 5): its context and removed lines are not in the file'

# Header of the hunk edited: "@@ -1,3 +1,3 @@" loses its comma.
begin malformed-hunk-header; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i 's/^@@ -1,4 +1,4 @@/@@ -1,4 +1 4 @@/' "$out/$name/candidate.patch"
refused 'malformed hunk header'

# A line number of 5,000 digits in the hunk's header (Python's int()
# refuses more than 4,300 with an error of its own): no file has a line
# past 999,999,999, and more digits are a malformed header.
begin hunk-header-huge-number; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i "s/^@@ -1,4 +1,4 @@/@@ -$(printf '9%.0s' $(seq 5000)),4 +1,4 @@/" "$out/$name/candidate.patch"
refused 'malformed hunk header'

# The "+++" line removed.
begin missing-plus-header; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i '/^+++ /d' "$out/$name/candidate.patch"
refused "'---' without '+++' after it"

# The hunk's last line removed: fewer lines than its header says.
begin hunk-ends-early; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i '$d' "$out/$name/candidate.patch"
refused 'the hunk ends early'

# A line beyond the count its header gives.
begin hunk-runs-over; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
printf ' five\n' >> "$out/$name/candidate.patch"
refused 'a line of a hunk beyond the count its header gives'

# A line in a git header git never writes there.
begin unexpected-git-header; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i 's/^index /indexx /' "$out/$name/candidate.patch"
refused 'unexpected line in a git header'

# git diff -M: a rename.
begin rename; put src/calc.txt "$ten"; start
g mv src/calc.txt src/renamed.txt; diff_ -M
refused 'only changes to the text of files are taken'

# A rename written as ---/+++ of two names, without git's header.
begin rename-without-header; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i -e '/^diff --git /d' -e '/^index /d' -e 's/^+++ b\/src\/calc.txt/+++ b\/src\/other.txt/' "$out/$name/candidate.patch"
refused 'renames are not taken'

# chmod +x: a mode change.
begin mode-change; put src/run.sh 'echo hi\n'; start
chmod +x src/run.sh; diff_
refused 'only changes to the text of files are taken'

# A new executable file.
begin new-executable; put src/calc.txt "$ten"; start
put src/run.sh 'echo hi\n'; chmod +x src/run.sh; diff_
refused 'only changes to the text of files are taken'

# A binary file (git: "Binary files ... differ").
begin binary; put src/calc.txt "$ten"; start
put src/blob.bin 'a\0b\n'; diff_
refused 'only changes to the text of files are taken'

# The same, git diff --binary.
begin binary-patch; put src/calc.txt "$ten"; start
put src/blob.bin 'a\0b\n'; diff_ --binary
refused 'only changes to the text of files are taken'

# A path leaving the tree: "src/calc.txt" becomes "../calc.txt".
begin path-dotdot; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i -e 's#^--- a/src/calc.txt#--- a/../calc.txt#' -e 's#^+++ b/src/calc.txt#+++ b/../calc.txt#' "$out/$name/candidate.patch"
refused 'is not relative and clean'

# An absolute path: "--- /etc/passwd".
begin path-absolute; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i -e 's#^--- a/src/calc.txt#--- /src/calc.txt#' -e 's#^+++ b/src/calc.txt#+++ /src/calc.txt#' "$out/$name/candidate.patch"
refused 'is not a/PATH or b/PATH'

# A name git quotes (core.quotepath: "a/caf\303\251.txt").
begin path-quoted; put src/calc.txt "$ten"; start
put "src/café.txt" 'x\n'; diff_
refused 'quoted path'

# The same file in two diffs (two real diffs, concatenated).
begin patched-twice; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_; cp "$out/$name/candidate.patch" "$work/first"
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nTEN\n'; g add -A; g diff --cached > "$work/second"
cat "$work/first" "$work/second" > "$out/$name/candidate.patch"
refused 'is patched twice'

# A file created that the tree already has.
begin create-existing; put src/calc.txt "$ten"; start
put src/new.txt 'new\n'; diff_
put src/new.txt 'already here\n'; g add -A; g commit -q -m here; rm -rf "$out/$name/before"; snapshot before
refused 'created by the patch, but the repository has it'

# A file changed that the tree does not have.
begin modify-missing; put src/calc.txt "$ten"; put src/gone.txt 'x\n'; start
put src/gone.txt 'y\n'; diff_
g rm -q -f src/gone.txt; g commit -q -m gone; rm -rf "$out/$name/before"; snapshot before
refused 'not in the repository'

# A file deleted whose content is not what the patch removes.
begin delete-other-content; put src/calc.txt "$ten"; put src/old.txt 'gone\n'; start
rm src/old.txt; diff_
put src/old.txt 'gone\nand more\n'; g add -A; g commit -q -m more; rm -rf "$out/$name/before"; snapshot before
refused 'deleted, but the patch leaves lines in it'

# An empty file "deleted" (a header and no hunk) that is not empty.
begin delete-nonempty-by-header; put src/calc.txt "$ten"; put src/empty.txt ''; start
rm src/empty.txt; diff_
put src/empty.txt 'not empty\n'; g add -A; g commit -q -m full; rm -rf "$out/$name/before"; snapshot before
refused 'deleted, but the patch leaves lines in it'

# The patch itself saved with CRLF line ends (unix2dos): its paths end in a CR.
begin crlf-patch; put src/calc.txt "$ten"; start
put src/calc.txt 'ONE\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n'; diff_
sed -i 's/$/\r/' "$out/$name/candidate.patch"
refused 'a control character'

# Text without any diff.
begin no-diff; put src/calc.txt "$ten"; start
printf 'Please change four to FOUR.\n' > "$out/$name/candidate.patch"
refused 'the patch holds no file diff'

cd "$out"
printf '* -text\n' > .gitattributes
echo "make-fixtures: $(find . -mindepth 1 -maxdepth 1 -type d | wc -l) cases in $out"
