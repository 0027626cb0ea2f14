#!/bin/sh
# Builds rigger-test-apiserver in GOPATH mode from Debian's packaged Go and
# Kubernetes libraries (see README.md). Usage: build.sh [OUTPUT]
#   K8S_ROOT  directory the Debian packages were unpacked into (/tmp/k8sprobe/root)
#   WORK      scratch GOPATH and GOCACHE (/tmp/k8sgopath, /tmp/k8sgocache)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=${K8S_ROOT:-/tmp/k8sprobe/root}
gopath=${GOPATH_DIR:-/tmp/k8sgopath}
out=${1:-$here/rigger-test-apiserver}
mkdir -p "$gopath/src/rigger.dev" "$gopath/src/github.com/emicklei/go-restful"
ln -sfn "$here" "$gopath/src/rigger.dev/k8s-apiserver"
# Debian installs go-restful v3 without the /v3 directory its importers name
ln -sfn "$root/usr/share/gocode/src/github.com/emicklei/go-restful" "$gopath/src/github.com/emicklei/go-restful/v3"
cd "$gopath/src/rigger.dev/k8s-apiserver"
GO111MODULE=off GOTOOLCHAIN=local CGO_ENABLED=0 GOROOT="$root/usr/lib/go-1.27" \
  GOPATH="$gopath:$root/usr/share/gocode" GOCACHE="${GOCACHE_DIR:-/tmp/k8sgocache}" GOFLAGS=-trimpath \
  "$root/usr/lib/go-1.27/bin/go" build -o "$out" rigger.dev/k8s-apiserver
