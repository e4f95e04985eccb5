#!/usr/bin/env bash
# Builds the real test stack (kube-apiserver, etcd, consul) from pinned Go
# modules into a cache outside the checkout, keyed by version. A cached binary
# is reused, so a second run costs seconds.
#
# Usage: test/tools/build.sh [tool ...]   (default: all; prints the bin dir)
# Cache: $FLEETSYNC_TOOLS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/fleetsync-tools)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${FLEETSYNC_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetsync-tools}"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod

# name|module dir|package|version
tools=(
  "kube-apiserver|kube|k8s.io/kubernetes/cmd/kube-apiserver|v1.37.2"
  "etcd|etcd|go.etcd.io/etcd/server/v3|v3.6.16"
  "consul|consul|github.com/hashicorp/consul|v1.14.11"
  "kubectl|kubectl|k8s.io/kubectl/cmd/kubectl|v0.37.2"
  "helm|helm|helm.sh/helm/v3/cmd/helm|v3.22.0"
)

want=("$@")
selected() {
  [ ${#want[@]} -eq 0 ] && return 0
  local w; for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1
}

bin="$cache/bin"
mkdir -p "$bin"
for t in "${tools[@]}"; do
  IFS='|' read -r name dir pkg version <<<"$t"
  selected "$name" || continue
  out="$cache/$name-$version/$name"
  if [ ! -x "$out" ]; then
    echo ">> building $name $version from $pkg (cold cache: this takes minutes)" >&2
    start=$(date +%s)
    mkdir -p "$cache/$name-$version"
    (cd "$here/$dir" && go build -trimpath -o "$out.tmp" "$pkg") >&2
    mv "$out.tmp" "$out"
    echo ">> built $name in $(( $(date +%s) - start ))s -> $out" >&2
  else
    echo ">> $name $version cached at $out" >&2
  fi
  ln -sf "$out" "$bin/$name"
done
echo "$bin"
