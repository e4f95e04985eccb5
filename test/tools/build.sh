#!/usr/bin/env bash
# Builds the real test stack (kube-apiserver, etcd, consul) and dev tools
# (staticcheck) from pinned Go modules into a cache outside the checkout, keyed
# by version and a hash of the build recipe (see below). A cached binary is
# reused, so a second run costs seconds.
#
# Usage: test/tools/build.sh [tool ...]   (default: all; prints the bin dir)
# Cache: $FLEETSYNC_TOOLS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/fleetsync-tools)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${FLEETSYNC_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetsync-tools}"
# The user's GOFLAGS are kept; -mod=readonly on the command line (it wins over
# GOFLAGS) builds from the committed go.mod/go.sum of each tool module and
# fails rather than rewriting them.
export GOTOOLCHAIN=local

# name|module dir|package|version
tools=(
  "kube-apiserver|kube|k8s.io/kubernetes/cmd/kube-apiserver|v1.37.2"
  "etcd|etcd|go.etcd.io/etcd/server/v3|v3.6.16"
  "consul|consul|github.com/hashicorp/consul|v1.14.11"
  "kubectl|kubectl|k8s.io/kubernetes/cmd/kubectl|v1.37.2"
  "helm|helm|helm.sh/helm/v3/cmd/helm|v3.22.0"
  "staticcheck|staticcheck|honnef.co/go/tools/cmd/staticcheck|v0.8.2"
)

want=("$@")
selected() {
  [ ${#want[@]} -eq 0 ] && return 0
  local w; for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1
}

# Linker flags per tool: the version stamps upstream's own build sets, so that
# e.g. kube-apiserver's /version says v1.37.2 rather than v0.0.0-master.
ldflags_for() {
  local name=$1 version=$2
  case "$name" in
    kube-apiserver|kubectl)
      local kv="v1.${version#v[01].}" # a staging module v0.37.2 and k8s.io/kubernetes v1.37.2 are both Kubernetes v1.37.2
      local minor="${kv#v1.}"; minor="${minor%%.*}"
      local p f=""
      for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=" -X $p.gitVersion=$kv -X $p.gitMajor=1 -X $p.gitMinor=$minor"
        f+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
      done
      echo "${f# }" ;;
    helm)
      # The Kubernetes version helm assumes (.Capabilities, lint's
      # deprecation rules) is that of the client-go it is built with.
      local cg; cg="$(awk '$1 == "k8s.io/client-go" {print $2}' "$here/helm/go.mod")"
      local minor="${cg#v0.}"; minor="${minor%%.*}"
      local h=helm.sh/helm/v3 f p
      f="-X $h/internal/version.version=$version -X $h/internal/version.gitTreeState=clean"
      for p in $h/pkg/chartutil $h/pkg/lint/rules; do
        f+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$minor"
      done
      echo "$f" ;;
  esac
}

bin="$cache/bin"
mkdir -p "$bin"
for t in "${tools[@]}"; do
  IFS='|' read -r name dir pkg version <<<"$t"
  selected "$name" || continue
  if [ ! -f "$here/$dir/go.mod" ]; then
    echo ">> $name: there is no tool module test/tools/$dir yet" >&2
    exit 1
  fi
  ldflags="$(ldflags_for "$name" "$version")"
  # The cache key is the version plus a hash of the whole recipe (package,
  # linker flags, the tool module's go.mod and go.sum): changing any of them
  # builds anew instead of reusing a stale binary.
  key="$( { printf '%s\n' "$pkg" "$version" "$ldflags"; cat "$here/$dir/go.mod" "$here/$dir/go.sum"; } | sha256sum | cut -c1-10)"
  out="$cache/$name-$version-$key/$name"
  if [ ! -x "$out" ]; then
    echo ">> building $name $version from $pkg (cold cache: this takes minutes)" >&2
    start=$(date +%s)
    mkdir -p "$(dirname "$out")"
    (cd "$here/$dir" && go build -mod=readonly -trimpath -ldflags="$ldflags" -o "$out.tmp.$$" "$pkg") >&2
    mv -f "$out.tmp.$$" "$out"
    echo ">> built $name in $(( $(date +%s) - start ))s -> $out" >&2
  else
    echo ">> $name $version cached at $out" >&2
  fi
  ln -sfn "$out" "$bin/$name"
done
echo "$bin"
