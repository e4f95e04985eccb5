package main

import (
	"bytes"
	"cmp"
	"debug/buildinfo"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"
)

// repoRoot returns the root of the checkout the test runs in; it skips
// the test outside a git checkout (a source tarball: make image takes the
// version and commit from git).
func repoRoot(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout (git rev-parse: %v)", err)
	}
	return strings.TrimSpace(string(out))
}

// command runs name with args in dir and returns its standard output.
func command(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// makeImage returns the Config of make image's own command (make -n image),
// building in the checkout at root.
func makeImage(t *testing.T, root string) *Config {
	t.Helper()
	var line string
	for _, l := range strings.Split(command(t, root, "make", "-n", "image"), "\n") {
		if strings.Contains(l, " ./deploy/image build ") {
			line = l
		}
	}
	_, args, ok := strings.Cut(line, " ./deploy/image build ")
	if !ok {
		t.Fatalf("make -n image runs no ./deploy/image build")
	}
	var c Config
	fs := flag.NewFlagSet("make image", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse(strings.Fields(args)); err != nil || fs.NArg() != 0 {
		t.Fatalf("make image runs %q: %v (arguments %q)", line, err, fs.Args())
	}
	if c.Out != "out/image" {
		t.Errorf("make image writes to %s, want out/image", c.Out)
	}
	c.Module = root
	return &c
}

// TestDefaultImageName: the image make image builds is the one the Helm
// chart and the kustomize base deploy by default: fleetsync tagged with the
// chart's appVersion.
func TestDefaultImageName(t *testing.T) {
	root := repoRoot(t)
	c := makeImage(t, root)
	read := func(p string, v any) {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, v); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	read("deploy/helm/fleetsync/Chart.yaml", &chart)
	var values struct {
		Image struct{ Repository, Tag string }
	}
	read("deploy/helm/fleetsync/values.yaml", &values)
	var deployment struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct{ Name, Image string }
				}
			}
		}
	}
	read("deploy/kustomize/base/deployment.yaml", &deployment)

	want := "fleetsync:" + chart.AppVersion
	if chart.AppVersion == "" || c.Name != want {
		t.Errorf("make image builds %s, want %s (fleetsync:<the chart's appVersion>)", c.Name, want)
	}
	if helm := values.Image.Repository + ":" + cmp.Or(values.Image.Tag, chart.AppVersion); helm != c.Name {
		t.Errorf("the chart deploys %s (values.yaml image.repository:image.tag, the tag defaulting to appVersion), make image builds %s", helm, c.Name)
	}
	var kustomize []string
	for _, ct := range deployment.Spec.Template.Spec.Containers {
		if ct.Name == "fleetsync" {
			kustomize = append(kustomize, ct.Image)
		}
	}
	if len(kustomize) != 1 || kustomize[0] != c.Name {
		t.Errorf("the kustomize base deploys %q, make image builds %s", kustomize, c.Name)
	}
}

// TestMakeImage runs make image's build (its flags from make -n image,
// into a temp dir) twice: both give the same index digest. It reads the
// OCI layout and the docker tarballs back and checks every image
// (checkImage), that the binary in the layer is the one built, stamped
// with make build's version and commit (the host's runs --version; the
// others' build info says so), static, for its platform.
func TestMakeImage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds fleetsync for every platform, twice")
	}
	root := repoRoot(t)
	c := makeImage(t, root)
	describe := strings.TrimSpace(command(t, root, "git", "describe", "--always", "--dirty"))
	rev := strings.TrimSpace(command(t, root, "git", "rev-parse", "HEAD"))
	epoch := cmp.Or(os.Getenv("SOURCE_DATE_EPOCH"), strings.TrimSpace(command(t, root, "git", "log", "-1", "--format=%ct")))
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != describe || c.Commit != rev || !c.Created.Equal(time.Unix(sec, 0)) {
		t.Fatalf("make image builds version %s commit %s created %s, want %s, %s and %s (git describe --always --dirty, HEAD, its time)",
			c.Version, c.Commit, c.Created, describe, rev, time.Unix(sec, 0).UTC())
	}
	if len(c.Platforms) != 2 || c.Platforms[0].String() != "linux/amd64" || c.Platforms[1].String() != "linux/arm64" {
		t.Errorf("make image builds for %v, want linux/amd64 and linux/arm64", c.Platforms)
	}
	caCerts, err := readCACerts(c.CACerts)
	if err != nil {
		t.Skipf("no CA bundle on this machine: %v", err)
	}

	c.Out = t.TempDir()
	res, err := build(t.Context(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	again := *c
	again.Out = t.TempDir()
	res2, err := build(t.Context(), &again, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if res2.Index != res.Index {
		t.Errorf("two builds of the same commit: index %s and %s", res.Index, res2.Index)
	}

	idx, err := layoutIndex(res.Layout)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := idx.Digest(); err != nil || d != res.Index {
		t.Fatalf("the layout's index is %s (%v), build said %s", d, err, res.Index)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(c.Name)
	if err != nil {
		t.Fatal(err)
	}
	var imgs []v1.Image
	for i, p := range c.Platforms {
		if i >= len(m.Manifests) || m.Manifests[i].Platform == nil || m.Manifests[i].Platform.String() != p.String() {
			t.Fatalf("index manifests %v, want one per platform %v", m.Manifests, c.Platforms)
		}
		img, err := idx.Image(m.Manifests[i].Digest)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
		built, err := os.ReadFile(res.Images[i].Binary)
		if err != nil {
			t.Fatal(err)
		}
		binary := checkImage(t, img, c, p, built, caCerts)
		checkBinary(t, binary, p, describe, rev)
		checkTarball(t, res.Images[i].Tarball, tag, img)
		t.Logf("%s: %s, %.1f MB compressed", p, res.Images[i].Digest, float64(res.Images[i].Size)/1e6)
	}
	checkIndex(t, idx, c, imgs)
	t.Logf("index %s", res.Index)
}

// checkBinary checks that binary is static, for p, and holds version and
// commit; run on this machine when it is the host's platform, that it
// prints them with --version.
func checkBinary(t *testing.T, binary []byte, p v1.Platform, version, commit string) {
	t.Helper()
	info, err := buildinfo.Read(bytes.NewReader(binary))
	if err != nil {
		t.Fatalf("%s: the binary in the layer: %v", p, err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if settings["GOOS"] != p.OS || settings["GOARCH"] != p.Architecture || settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
		t.Errorf("%s: binary built with GOOS=%s GOARCH=%s CGO_ENABLED=%s -trimpath=%s", p, settings["GOOS"], settings["GOARCH"], settings["CGO_ENABLED"], settings["-trimpath"])
	}
	// -trimpath leaves -ldflags out of the build info; the -X values are
	// in the binary's data.
	for _, s := range []string{version, commit} {
		if !bytes.Contains(binary, []byte(s)) {
			t.Errorf("%s: %q is nowhere in the binary: not stamped", p, s)
		}
	}
	if p.OS != runtime.GOOS || p.Architecture != runtime.GOARCH {
		return
	}
	bin := filepath.Join(t.TempDir(), "fleetsync")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		t.Fatal(err)
	}
	out := command(t, t.TempDir(), bin, "--version")
	if want := "fleetsync " + version + " (commit " + commit + ", " + runtime.Version() + ")\n"; out != want {
		t.Errorf("%s: the binary in the layer prints %q with --version, want %q", p, out, want)
	}
}

// checkTarball checks that the docker-format tarball at path holds img
// (its config and layers), tagged tag.
func checkTarball(t *testing.T, path string, tag name.Tag, img v1.Image) {
	t.Helper()
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(path) })
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(m) != 1 || len(m[0].RepoTags) != 1 || m[0].RepoTags[0] != tag.String() {
		t.Errorf("%s: manifest.json %+v, want one image tagged %s", path, m, tag)
	}
	got, err := tarball.ImageFromPath(path, &tag)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, f := range []func(v1.Image) (any, error){
		func(i v1.Image) (any, error) { return i.ConfigName() },
		func(i v1.Image) (any, error) { return i.RawConfigFile() },
		func(i v1.Image) (any, error) {
			ls, err := i.Layers()
			if err != nil || len(ls) != 1 {
				return nil, fmt.Errorf("%d layers (%v)", len(ls), err)
			}
			return ls[0].DiffID()
		},
	} {
		a, errA := f(got)
		b, errB := f(img)
		if errA != nil || errB != nil || fmt.Sprint(a) != fmt.Sprint(b) {
			t.Errorf("%s: %v (%v), the layout's image %v (%v)", path, a, errA, b, errB)
		}
	}
}

// TestPush: image push sends the layout's index and its images to a
// registry (one in this process), from which they come back by digest.
func TestPush(t *testing.T) {
	c := testConfig()
	_, ca := testCA(t)
	var imgs []v1.Image
	for _, p := range c.Platforms {
		img, err := newImage(c, p, []byte("binary for "+p.String()), ca)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	idx := newIndex(c, imgs)
	want, err := idx.Digest()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "oci")
	tag, err := name.NewTag(c.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := writeLayout(dir, idx, tag); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	ref := u.Host + "/team/fleetsync:0.1.0"
	var stdout, stderr bytes.Buffer
	if code := run(t.Context(), []string{"push", "-layout", dir, ref}, &stdout, &stderr); code != 0 {
		t.Fatalf("image push: exit %d: %s", code, stderr.String())
	}
	if got := stdout.String(); got != ref+"@"+want.String()+"\n" {
		t.Errorf("image push printed %q, want %s@%s", got, ref, want)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := remote.Index(r, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := pulled.Digest(); err != nil || d != want {
		t.Fatalf("pulled index %s (%v), pushed %s", d, err, want)
	}
	for i, p := range c.Platforms {
		img, err := pulled.Image(must(t, imgs[i].Digest))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		checkImage(t, img, c, p, []byte("binary for "+p.String()), ca)
	}
}

func must[T any](t *testing.T, f func() (T, error)) T {
	t.Helper()
	v, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestUsage: a bad command line exits 2 with the usage.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"bild"}, {"push"}, {"push", "a", "b"}, {"build", "extra"}, {"build", "-platforms", "linux"}} {
		var stdout, stderr bytes.Buffer
		if code := run(t.Context(), args, &stdout, &stderr); code != 2 || stdout.Len() != 0 || stderr.Len() == 0 {
			t.Errorf("image %q: exit %d, stdout %q, stderr %q; want 2 and a message", args, code, stdout.String(), stderr.String())
		}
	}
}
