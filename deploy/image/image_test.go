package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64"}
)

// testCA writes a self-signed CA certificate in PEM into a temp dir and
// returns its path and content.
func testCA(t *testing.T) (string, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test root"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1<<32, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	b := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	p := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

// testConfig is a build of version v1.2.3-test at commit abc123, created
// 2026-01-02T03:04:05Z.
func testConfig() *Config {
	return &Config{
		Name: "fleetsync:0.1.0", Version: "v1.2.3-test", Commit: "abc123",
		Source: "https://github.com/fleetsync/fleetsync", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Platforms: []v1.Platform{amd64, arm64}, Go: "go", Module: ".", Out: "out/image",
	}
}

// file is one tar entry as the checks compare it.
type file struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	mtime    time.Time
	data     string
}

func (f file) String() string {
	d := f.data
	if len(d) > 40 {
		d = fmt.Sprintf("%d bytes", len(d))
	}
	return fmt.Sprintf("%s type %c mode %o owner %d:%d mtime %s data %q", f.name, f.typ, f.mode, f.uid, f.gid, f.mtime.UTC().Format(time.RFC3339), d)
}

// layerFiles returns the files of img, which must have one layer, in the
// layer's order.
func layerFiles(t *testing.T, img v1.Image) []file {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1", len(layers))
	}
	if mt, err := layers[0].MediaType(); err != nil || mt != types.OCILayer {
		t.Errorf("layer media type %q (%v), want %q", mt, err, types.OCILayer)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var files []file
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, file{name: h.Name, typ: h.Typeflag, mode: h.Mode, uid: h.Uid, gid: h.Gid, mtime: h.ModTime, data: string(data)})
	}
	return files
}

// checkImage checks img against what c builds for p with binary and
// caCerts: the config (platform, user, entrypoint, labels, created) and the
// layer's files, each with its type, mode, owner, mtime and content. It
// returns the binary taken out of the layer.
func checkImage(t *testing.T, img v1.Image, c *Config, p v1.Platform, binary, caCerts []byte) []byte {
	t.Helper()
	if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("%s: manifest media type %q (%v), want %q", p, mt, err, types.OCIManifestSchema1)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != p.OS || cf.Architecture != p.Architecture {
		t.Errorf("%s: config platform %s/%s", p, cf.OS, cf.Architecture)
	}
	if cf.Config.User != "65532:65532" {
		t.Errorf("%s: user %q, want 65532:65532", p, cf.Config.User)
	}
	if !slices.Equal(cf.Config.Entrypoint, []string{"/fleetsync"}) || len(cf.Config.Cmd) != 0 {
		t.Errorf("%s: entrypoint %q cmd %q, want [/fleetsync] and none", p, cf.Config.Entrypoint, cf.Config.Cmd)
	}
	if _, ok := cf.Config.ExposedPorts["9090/tcp"]; !ok {
		t.Errorf("%s: exposed ports %v, want 9090/tcp", p, cf.Config.ExposedPorts)
	}
	if !cf.Created.Equal(c.Created) {
		t.Errorf("%s: created %s, want %s", p, cf.Created, c.Created)
	}
	wantLabels := map[string]string{
		"org.opencontainers.image.title":    "fleetsync",
		"org.opencontainers.image.source":   c.Source,
		"org.opencontainers.image.revision": c.Commit,
		"org.opencontainers.image.version":  c.Version,
		"org.opencontainers.image.created":  c.Created.UTC().Format(time.RFC3339),
	}
	for k, v := range wantLabels {
		if cf.Config.Labels[k] != v {
			t.Errorf("%s: label %s = %q, want %q", p, k, cf.Config.Labels[k], v)
		}
	}
	if len(cf.Config.Labels) != len(wantLabels) {
		t.Errorf("%s: labels %v, want %v", p, cf.Config.Labels, wantLabels)
	}
	dir := func(name string, mode int64, owner int) file {
		return file{name: name, typ: tar.TypeDir, mode: mode, uid: owner, gid: owner, mtime: c.Created}
	}
	reg := func(name string, mode int64, data string) file {
		return file{name: name, typ: tar.TypeReg, mode: mode, mtime: c.Created, data: data}
	}
	want := []file{
		dir("etc/", 0o755, 0),
		reg("etc/group", 0o644, "root:x:0:\nnonroot:x:65532:\n"),
		reg("etc/passwd", 0o644, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"),
		dir("etc/ssl/", 0o755, 0),
		dir("etc/ssl/certs/", 0o755, 0),
		reg("etc/ssl/certs/ca-certificates.crt", 0o644, string(caCerts)),
		reg("fleetsync", 0o755, string(binary)),
		dir("home/", 0o755, 0),
		dir("home/nonroot/", 0o700, 65532),
		dir("tmp/", 0o1777, 0),
	}
	got := layerFiles(t, img)
	if !slices.EqualFunc(got, want, func(a, b file) bool { return a.String() == b.String() && a.data == b.data && a.mtime.Equal(b.mtime) }) {
		t.Errorf("%s: layer files:\n%s\nwant:\n%s", p, join(got), join(want))
	}
	for _, f := range got {
		if f.name == "fleetsync" {
			return []byte(f.data)
		}
	}
	return nil
}

func join(files []file) string {
	var b strings.Builder
	for _, f := range files {
		b.WriteString("  " + f.String() + "\n")
	}
	return b.String()
}

// TestImage: the image of a (stand-in) binary has the config and the files
// checkImage wants, and its index lists one image per platform.
func TestImage(t *testing.T) {
	c := testConfig()
	_, ca := testCA(t)
	var imgs []v1.Image
	for _, p := range c.Platforms {
		binary := []byte("binary for " + p.String())
		img, err := newImage(c, p, binary, ca)
		if err != nil {
			t.Fatal(err)
		}
		checkImage(t, img, c, p, binary, ca)
		imgs = append(imgs, img)
	}
	checkIndex(t, newIndex(c, imgs), c, imgs)
}

// checkIndex checks that idx is an OCI index of imgs, one per platform of
// c, annotated with the labels.
func checkIndex(t *testing.T, idx v1.ImageIndex, c *Config, imgs []v1.Image) {
	t.Helper()
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIImageIndex {
		t.Errorf("index media type %q, want %q", m.MediaType, types.OCIImageIndex)
	}
	if len(m.Manifests) != len(c.Platforms) {
		t.Fatalf("index lists %d manifests, want %d", len(m.Manifests), len(c.Platforms))
	}
	for i, d := range m.Manifests {
		want, err := imgs[i].Digest()
		if err != nil {
			t.Fatal(err)
		}
		if d.Digest != want || d.Platform == nil || d.Platform.String() != c.Platforms[i].String() {
			t.Errorf("index manifest %d: %s platform %v, want %s %s", i, d.Digest, d.Platform, want, c.Platforms[i])
		}
	}
	if m.Annotations["org.opencontainers.image.revision"] != c.Commit {
		t.Errorf("index annotations %v, want the labels", m.Annotations)
	}
}

// TestReproducible: the same inputs give the same index digest; each
// input that goes into the image changes it.
func TestReproducible(t *testing.T) {
	_, ca := testCA(t)
	digest := func(c *Config, binary []byte) v1.Hash {
		t.Helper()
		var imgs []v1.Image
		for _, p := range c.Platforms {
			img, err := newImage(c, p, binary, ca)
			if err != nil {
				t.Fatal(err)
			}
			imgs = append(imgs, img)
		}
		d, err := newIndex(c, imgs).Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := digest(testConfig(), []byte("binary"))
	if again := digest(testConfig(), []byte("binary")); again != base {
		t.Fatalf("two builds of the same inputs: %s and %s", base, again)
	}
	for _, tt := range []struct {
		name   string
		change func(*Config)
		binary string
	}{
		{name: "binary", change: func(*Config) {}, binary: "other binary"},
		{name: "commit", change: func(c *Config) { c.Commit = "def456" }},
		{name: "created", change: func(c *Config) { c.Created = c.Created.Add(time.Second) }},
		{name: "platforms", change: func(c *Config) { c.Platforms = c.Platforms[:1] }},
	} {
		c := testConfig()
		tt.change(c)
		b := cmp.Or(tt.binary, "binary")
		if d := digest(c, []byte(b)); d == base {
			t.Errorf("%s changed, digest %s did not", tt.name, d)
		}
	}
}

// TestValidate: bad flags are refused, naming the flag.
func TestValidate(t *testing.T) {
	for _, tt := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{name: "name", change: func(c *Config) { c.Name = "Fleet Sync" }, want: "-name"},
		{name: "version with a space", change: func(c *Config) { c.Version = "v1 -X main.commit=x" }, want: "-version"},
		{name: "empty commit", change: func(c *Config) { c.Commit = "" }, want: "-commit"},
		{name: "not linux", change: func(c *Config) { c.Platforms = []v1.Platform{{OS: "windows", Architecture: "amd64"}} }, want: "-platforms windows/amd64"},
		{name: "twice", change: func(c *Config) { c.Platforms = []v1.Platform{amd64, amd64} }, want: "twice"},
		{name: "no platform", change: func(c *Config) { c.Platforms = nil }, want: "-platforms: empty"},
	} {
		c := testConfig()
		if err := c.Validate(); err != nil {
			t.Fatalf("test config: %v", err)
		}
		tt.change(c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Validate() = %v, want an error naming %q", tt.name, err, tt.want)
		}
	}
}

// TestCACerts: a missing or non-PEM bundle fails the build, naming the flag.
func TestCACerts(t *testing.T) {
	p, want := testCA(t)
	if got, err := readCACerts(p); err != nil || !bytes.Equal(got, want) {
		t.Errorf("readCACerts(%s) = %d bytes, %v", p, len(got), err)
	}
	notPEM := filepath.Join(t.TempDir(), "not-pem")
	if err := os.WriteFile(notPEM, []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(t.TempDir(), "missing.crt"), notPEM} {
		c := testConfig()
		c.CACerts = p
		if _, err := build(t.Context(), c, io.Discard); err == nil || !strings.Contains(err.Error(), "-ca-certs") {
			t.Errorf("build with -ca-certs %s: %v, want an error naming -ca-certs", p, err)
		}
	}
}
