package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/x509"
	"fmt"
	"os"
	"time"
)

// nonroot is the user and group the image runs as (distroless's nonroot).
const (
	nonroot     = 65532
	binaryPath  = "fleetsync"
	caCertsPath = "etc/ssl/certs/ca-certificates.crt"
)

// entry is one file or directory of the image's root filesystem.
type entry struct {
	name     string // without the leading slash; directories end in /
	mode     int64
	uid, gid int
	data     []byte // nil for a directory
}

// rootfs lists the root filesystem holding binary and caCerts, sorted by
// name: the order the layer's tar has them in.
func rootfs(binary, caCerts []byte) []entry {
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", nonroot, nonroot)
	group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", nonroot)
	return []entry{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte(group)},
		{name: "etc/passwd", mode: 0o644, data: []byte(passwd)},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: caCertsPath, mode: 0o644, data: caCerts},
		{name: binaryPath, mode: 0o755, data: binary},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: nonroot, gid: nonroot},
		{name: "tmp/", mode: 0o1777},
	}
}

// layerTar returns the gzipped tar of entries, every mtime set to mtime:
// the same entries and mtime give the same bytes.
func layerTar(entries []entry, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf) // no name, no mtime in the gzip header
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		h := &tar.Header{
			Name:    e.name,
			Mode:    e.mode,
			Uid:     e.uid,
			Gid:     e.gid,
			ModTime: mtime.UTC(),
		}
		if e.data == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("layer: %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// readCACerts reads the CA bundle at path and checks that it holds at least
// one PEM certificate.
func readCACerts(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ca certificates (-ca-certs; on Debian and Ubuntu the package ca-certificates): %w", err)
	}
	if !x509.NewCertPool().AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("ca certificates %s (-ca-certs): no PEM certificate in it", path)
	}
	return b, nil
}
