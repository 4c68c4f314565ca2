#!/usr/bin/env bash
# Builds the real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl), kwok/kwokctl and helm from the Go module proxy, at pinned versions,
# into a cache outside the repository. Idempotent: a finished build is reused.
#
# Why a wrapper module: k8s.io/kubernetes points its staging modules at ./staging with `replace`
# and requires them at v0.0.0, so `go install k8s.io/kubernetes/cmd/...@vX` is refused. A module of
# our own that requires k8s.io/kubernetes and replaces every staging module with its published
# v0.Y.Z builds the same sources.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.4}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
CACHE="${TREADLE_CACHE:-$HOME/.cache/treadle}"
BIN="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-helm-$HELM_VERSION/bin"

fail() { echo "build-k8s: step '$1' failed: $2" >&2; exit 1; }
need=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwokctl helm)
missing=()
for b in "${need[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$BIN"; exit 0; fi

command -v go >/dev/null || fail "go toolchain" "'go' is not on PATH; install Go >= 1.24"
mkdir -p "$BIN"
WORK="$CACHE/build-k8s-$K8S_VERSION"
mkdir -p "$WORK"
minor="${K8S_VERSION#v1.}"; staging="v0.$minor"
major_minor="${minor%%.*}"
export GOFLAGS="-mod=mod" GOTOOLCHAIN=local CGO_ENABLED=0

build_kube() {
  cd "$WORK"
  local mod
  mod=$(cd "$WORK" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
          | python3 -c 'import json,sys;print(open(json.load(sys.stdin)["GoMod"]).read())') \
    || fail "fetch k8s.io/kubernetes $K8S_VERSION go.mod" "Go module proxy unreachable (see GOPROXY)"
  {
    echo "module treadle.dev/k8sbins"
    echo "go 1.24.0"
    echo "require ("
    echo "  k8s.io/kubernetes $K8S_VERSION"
    echo "  go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    echo ")"
    echo "replace ("
    echo "$mod" | sed -n '/^replace (/,/^)/p' | grep -oE 'k8s.io/[a-z0-9-]+ =>' | awk -v v="$staging" '{print "  " $1 " => " $1 " " v}'
    echo ")"
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  go mod tidy >/dev/null 2>"$WORK/tidy.log" || fail "go mod tidy for k8s.io/kubernetes $K8S_VERSION" "$(tail -5 "$WORK/tidy.log")"
  # kwokctl and kubectl read the version: a dependency build would report v0.0.0.
  local ld="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$major_minor -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$major_minor"
  for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [ -x "$BIN/$c" ] && continue
    echo "build-k8s: building $c $K8S_VERSION (slow on first run)" >&2
    go build -trimpath -ldflags "$ld" -o "$BIN/$c.tmp" "k8s.io/kubernetes/cmd/$c" 2>"$WORK/$c.log" \
      || fail "go build $c" "$(tail -5 "$WORK/$c.log")"
    mv "$BIN/$c.tmp" "$BIN/$c"
  done
  if [ ! -x "$BIN/etcd" ]; then
    echo "build-k8s: building etcd $ETCD_VERSION" >&2
    go build -trimpath -ldflags "-s -w" -o "$BIN/etcd.tmp" go.etcd.io/etcd/server/v3 2>"$WORK/etcd.log" \
      || fail "go build etcd" "$(tail -5 "$WORK/etcd.log")"
    mv "$BIN/etcd.tmp" "$BIN/etcd"
  fi
}

build_kube
for c in kwok kwokctl; do
  [ -x "$BIN/$c" ] && continue
  echo "build-k8s: installing $c $KWOK_VERSION" >&2
  GOBIN="$BIN" GOFLAGS= go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/$c@$KWOK_VERSION" 2>"$WORK/$c.log" \
    || fail "go install $c" "$(tail -5 "$WORK/$c.log")"
done
if [ ! -x "$BIN/helm" ]; then
  echo "build-k8s: installing helm $HELM_VERSION" >&2
  GOBIN="$BIN" GOFLAGS= go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" 2>"$WORK/helm.log" \
    || fail "go install helm" "$(tail -5 "$WORK/helm.log")"
fi
echo "$BIN"
