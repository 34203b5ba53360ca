#!/usr/bin/env bash
# Build kube-apiserver v1.20.2 from Debian 12's `kubernetes` SOURCE package and cache ONLY the binary.
#
# Recipe (see the tooling notes, "A real kube-apiserver (v1.20.2) + etcd, built from Debian's own packages"):
#   1. apt-get install golang-go make rsync jq etcd-server ca-certificates (Go 1.19, etcd 3.4);
#   2. a PRIVATE apt config with deb-src entries (the system sources stay untouched), then
#      `apt-get source --download-only kubernetes=1.20.5+really1.20.2-1.1+deb12u1`;
#   3. untar the orig tarball;
#   4. REQUIRED: replace the vendored github.com/modern-go/reflect2 (1.0.1) and github.com/json-iterator/go
#      (1.1.10) -- they crash under Go >= 1.18 ("fatal error: fault") -- with Debian's
#      golang-github-modern-go-reflect2-dev (1.0.2) and golang-github-json-iterator-go-dev (1.1.12);
#   5. GOPROXY=off make WHAT=cmd/kube-apiserver  ->  _output/bin/kube-apiserver.
# ~6.5 min on 2 cores, ~2.4 GB of build tree (deleted afterwards, Go build cache included); the binary is ~110 MB.
#
# Idempotent: exits 0 at once when the cached binary exists. Progress goes to stderr; the binary's path is the
# only thing printed on stdout.
#
# Env: SLOTWISE_KUBE_CACHE  cache dir (default ${XDG_CACHE_HOME:-$HOME/.cache}/slotwise/kube-apiserver-v1.20.2)
#      SLOTWISE_KUBE_BUILD_DIR  where the temporary build tree goes (default ${TMPDIR:-/tmp})
set -euo pipefail

KUBE_VERSION=1.20.2
DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
ORIG_TARBALL=kubernetes_1.20.5+really1.20.2.orig.tar.gz
CACHE=${SLOTWISE_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slotwise/kube-apiserver-v${KUBE_VERSION}}
BIN=$CACHE/kube-apiserver

say() { echo "[build-kube-apiserver $(date +%H:%M:%S)] $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

if [[ -x $BIN ]]; then
    say "cached binary present: $BIN"
    echo "$BIN"
    exit 0
fi

mkdir -p "$CACHE"
# one build at a time (parallel test sessions): take a lock, then look again
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.build.lock"
    say "waiting for the build lock $CACHE/.build.lock"
    flock 9
    if [[ -x $BIN ]]; then
        say "cached binary present (built meanwhile): $BIN"
        echo "$BIN"
        exit 0
    fi
fi

command -v apt-get >/dev/null 2>&1 || die "apt-get not found (this recipe needs a Debian 12 machine)"
[[ $(id -u) -eq 0 ]] || die "must run as root (apt-get install of the build dependencies)"

export DEBIAN_FRONTEND=noninteractive
DEPS=(golang-go make rsync jq etcd-server ca-certificates)
say "step 1/5: apt-get install ${DEPS[*]}"
if ! apt-get install -y -qq --no-install-recommends "${DEPS[@]}" >&2; then
    say "install failed; apt-get update and retry"
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${DEPS[@]}" >&2
fi
say "go: $(go version)"

WORK=$(mktemp -d "${SLOTWISE_KUBE_BUILD_DIR:-${TMPDIR:-/tmp}}/slotwise-kube-build.XXXXXX")
cleanup() {
    say "removing the build tree $WORK"
    chmod -R u+w "$WORK" 2>/dev/null || true  # the Go module cache is read-only
    rm -rf "$WORK"
}
trap cleanup EXIT
say "build tree: $WORK"

# --- step 2: private apt config with deb-src (and deb, for `apt-get download`) -------------------------------
APTDIR=$WORK/apt
mkdir -p "$APTDIR/sources.list.d" "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
    # deb822: `Types: deb` -> `Types: deb deb-src` (the system file itself is not touched)
    sed -E 's/^Types:[[:space:]]*deb[[:space:]]*$/Types: deb deb-src/' /etc/apt/sources.list.d/debian.sources \
        >"$APTDIR/sources.list.d/debian.sources"
elif [[ -r /etc/apt/sources.list ]] && grep -qE '^deb[[:space:]]' /etc/apt/sources.list; then
    { grep -E '^deb[[:space:]]' /etc/apt/sources.list
      grep -E '^deb[[:space:]]' /etc/apt/sources.list | sed -E 's/^deb /deb-src /'; } >"$APTDIR/sources.list.d/debian.list"
else
    die "no Debian apt sources found (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list)"
fi
APT=(apt-get -q
     -o "Dir::Etc::SourceList=/dev/null"
     -o "Dir::Etc::SourceParts=$APTDIR/sources.list.d"
     -o "Dir::State::Lists=$APTDIR/lists"
     -o "Dir::Cache=$APTDIR/cache"
     -o "APT::Sandbox::User=root")
say "step 2/5: apt-get update (private config) and apt-get source --download-only kubernetes=$DEB_VERSION"
"${APT[@]}" update >&2
mkdir -p "$WORK/src"
(cd "$WORK/src" && "${APT[@]}" source --download-only "kubernetes=$DEB_VERSION" >&2)
[[ -f $WORK/src/$ORIG_TARBALL ]] || die "$ORIG_TARBALL not downloaded (got: $(ls "$WORK/src"))"

# --- step 3: untar ------------------------------------------------------------------------------------------
say "step 3/5: untar $ORIG_TARBALL"
mkdir -p "$WORK/tree"
tar -xzf "$WORK/src/$ORIG_TARBALL" -C "$WORK/tree"
rm -f "$WORK/src/$ORIG_TARBALL"
TOP=$(find "$WORK/tree" -mindepth 1 -maxdepth 1 -type d | head -n1)
[[ -f $TOP/Makefile && -d $TOP/vendor ]] || die "unexpected tarball layout under $WORK/tree"
say "tree: $TOP"

# --- step 4: replace the vendored reflect2 and json-iterator with Debian's newer ones (REQUIRED) ---------------
say "step 4/5: vendor reflect2 1.0.2 and json-iterator 1.1.12 from Debian's -dev packages"
mkdir -p "$WORK/debs"
(cd "$WORK/debs" && "${APT[@]}" download golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev >&2)
for deb in "$WORK"/debs/*.deb; do
    dpkg-deb -x "$deb" "$WORK/debs/x"
done
GOCODE=$WORK/debs/x/usr/share/gocode/src/github.com
for pkg in modern-go/reflect2 json-iterator/go; do
    [[ -d $GOCODE/$pkg ]] || die "$GOCODE/$pkg missing in the Debian package"
    rm -rf "${TOP:?}/vendor/github.com/$pkg"
    mkdir -p "$TOP/vendor/github.com/$pkg"
    cp -a "$GOCODE/$pkg/." "$TOP/vendor/github.com/$pkg/"
    find "$TOP/vendor/github.com/$pkg" -name '*_test.go' -delete
    say "  replaced vendor/github.com/$pkg"
done

# --- step 5: build ------------------------------------------------------------------------------------------
say "step 5/5: GOPROXY=off make WHAT=cmd/kube-apiserver (several minutes)"
cat >"$WORK/version.env" <<VERSION
KUBE_GIT_COMMIT=''
KUBE_GIT_TREE_STATE='archive'
KUBE_GIT_VERSION='v${KUBE_VERSION}'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
VERSION
start=$SECONDS
(cd "$TOP" && GOPROXY=off GOFLAGS= GOCACHE="$WORK/gocache" GOMODCACHE="$WORK/gomodcache" \
    KUBE_GIT_VERSION_FILE="$WORK/version.env" make WHAT=cmd/kube-apiserver >&2)
[[ -x $TOP/_output/bin/kube-apiserver ]] || die "build finished without _output/bin/kube-apiserver"
say "built in $((SECONDS - start)) s"

install -m 0755 "$TOP/_output/bin/kube-apiserver" "$BIN.tmp.$$"
mv -f "$BIN.tmp.$$" "$BIN"
say "cached: $BIN ($(du -h "$BIN" | cut -f1)); $("$BIN" --version 2>&1 || true)"
echo "$BIN"
