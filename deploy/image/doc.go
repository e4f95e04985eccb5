// Command image builds fleetsync's container image without a container
// engine and without pulling a base image: `make image` runs it.
//
// `image build` cross-compiles the static binary (CGO_ENABLED=0) for each
// platform, stamped with -X main.version and -X main.commit as `make build`
// stamps it, and puts it in one layer with the build machine's CA bundle and
// an /etc/passwd and /etc/group naming the nonroot user 65532. The image runs
// as 65532:65532 with /fleetsync as its entrypoint and carries the OCI labels
// source, revision, version and created. The images of all platforms go into
// one OCI index, written as an OCI layout (<out>/oci) and, per platform, a
// docker-format tarball that `docker load` and `podman load` accept.
//
// The build is reproducible: every time in the image (the config's created,
// the history, the files' mtimes) is the -created time (SOURCE_DATE_EPOCH or
// the commit's time in the Makefile), tar entries are sorted with fixed
// owners and modes, and the binary is built with -trimpath; the same commit,
// Go toolchain and CA bundle give the same index digest.
//
// `image push` pushes the index of an OCI layout to a registry with the
// credentials of `docker login` (the default keychain).
package main
