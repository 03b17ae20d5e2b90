#!/usr/bin/env bash
# Provision what gradleak's data loader and tests need besides Python packages, from Debian's
# package registry only, into DEST (make setup passes .venv/share/gradleak):
#   - Fashion-MNIST: the IDX files of Debian's dataset-fashion-mnist, in DEST/fashion-mnist
#     (skipped when /usr/share/datasets/fashion-mnist already holds all four files);
#   - strace (the loopback test traces Ray's sockets): DEST/debs/usr/bin/strace unless one is on
#     the PATH;
#   - chromium (the dashboard test opens its pages in a real headless browser, driven by the
#     Playwright wheel): Debian's /usr/bin/chromium, installed with apt-get when it is missing and
#     this runs as root; otherwise one line says that test will be skipped.
# The data and strace need no root: packages are fetched with `apt-get download` and unpacked with
# `dpkg-deb -x`. When the machine's package lists are missing, private lists are fetched into a
# temporary folder (the system's apt state is never changed). Checks the files, not dpkg's records.
# chromium alone is installed system-wide (it needs its shared libraries): `apt-get update` first
# when the system's lists do not know it, then `apt-get install --no-install-recommends chromium`.
# Playwright's own browser download (`playwright install`) is never used.
set -euo pipefail
DEST=${1:?usage: provision.sh DEST}
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
FMNIST_FILES="train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

have_all() {  # have_all DIR: every Fashion-MNIST file is there and not empty
  local f
  for f in $FMNIST_FILES; do [ -s "$1/$f" ] || return 1; done
}

APT_OPTS=()
fetch_deb() {  # fetch_deb NAME: download NAME's .deb into $WORK/debs, print its path
  mkdir -p "$WORK/debs"
  if ! (cd "$WORK/debs" && apt-get download "${APT_OPTS[@]}" "$1" >/dev/null 2>&1); then
    if [ ${#APT_OPTS[@]} -eq 0 ]; then  # no usable system lists: fetch private ones once
      mkdir -p "$WORK/lists/partial" "$WORK/cache/archives/partial"
      APT_OPTS=(-o "Dir::State::Lists=$WORK/lists" -o "Dir::Cache=$WORK/cache" -o Debug::NoLocking=1)
      apt-get "${APT_OPTS[@]}" update -q >/dev/null 2>&1 || true
    fi
    (cd "$WORK/debs" && apt-get download "${APT_OPTS[@]}" "$1" >/dev/null) \
      || { echo "provision: could not download the Debian package $1" >&2; return 1; }
  fi
  ls "$WORK/debs/$1"_*.deb
}

if have_all /usr/share/datasets/fashion-mnist || have_all "$DEST/fashion-mnist"; then
  :
else
  deb=$(fetch_deb dataset-fashion-mnist)
  rm -rf "$WORK/x" && mkdir -p "$WORK/x"
  dpkg-deb -x "$deb" "$WORK/x"
  src=$(dirname "$(find "$WORK/x" -name train-images-idx3-ubyte.gz | head -n 1)")
  have_all "$src" || { echo "provision: $deb does not hold the Fashion-MNIST IDX files" >&2; exit 1; }
  rm -rf "$DEST/fashion-mnist.new" && mkdir -p "$DEST/fashion-mnist.new"
  for f in $FMNIST_FILES; do cp "$src/$f" "$DEST/fashion-mnist.new/"; done
  rm -rf "$DEST/fashion-mnist" && mv "$DEST/fashion-mnist.new" "$DEST/fashion-mnist"
  echo "provision: Fashion-MNIST unpacked into $DEST/fashion-mnist"
fi

if ! command -v strace >/dev/null 2>&1 && [ ! -x "$DEST/debs/usr/bin/strace" ]; then
  deb=$(fetch_deb strace)
  mkdir -p "$DEST/debs"
  dpkg-deb -x "$deb" "$DEST/debs"
  "$DEST/debs/usr/bin/strace" -V >/dev/null || { echo "provision: the unpacked strace does not run" >&2; exit 1; }
  echo "provision: strace unpacked into $DEST/debs/usr/bin"
fi

if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" -eq 0 ]; then
    policy=$(apt-cache policy chromium 2>/dev/null || true)
    if [[ "$policy" != *"Candidate: "[0-9]* ]]; then   # the system's lists do not know chromium yet
      apt-get update -q >/dev/null || { echo "provision: apt-get update failed" >&2; exit 1; }
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null \
      || { echo "provision: could not install the Debian package chromium" >&2; exit 1; }
    /usr/bin/chromium --version >/dev/null 2>&1 || { echo "provision: the installed chromium does not run" >&2; exit 1; }
    echo "provision: chromium installed at /usr/bin/chromium (for the dashboard's browser test)"
  else
    echo "provision: no /usr/bin/chromium and not root: the dashboard's browser test will be skipped (as root: apt-get install --no-install-recommends chromium)"
  fi
fi
