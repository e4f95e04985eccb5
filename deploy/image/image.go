package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The OCI labels the image carries (and the index's annotations).
const (
	labelSource   = "org.opencontainers.image.source"
	labelRevision = "org.opencontainers.image.revision"
	labelVersion  = "org.opencontainers.image.version"
	labelCreated  = "org.opencontainers.image.created"
	labelTitle    = "org.opencontainers.image.title"
	// annotationRefName names the index in the OCI layout's index.json (the
	// tag: skopeo's oci:out/image/oci:<tag>).
	annotationRefName = "org.opencontainers.image.ref.name"
)

// Config is one image build.
type Config struct {
	Name      string // image reference of the tarballs and the layout, e.g. fleetsync:0.1.0
	Version   string // main.version and the version label
	Commit    string // main.commit and the revision label
	Source    string // the source label
	Created   time.Time
	Platforms []v1.Platform
	CACerts   string // the CA bundle copied into the image
	Module    string // the module root ./cmd/fleetsync is built in
	Go        string // the go command
	Out       string // the output directory
}

// RegisterFlags registers the flags of `image build` on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Name, "name", "fleetsync:dev", "image `reference` the tarballs are tagged with and the OCI layout names (its tag)")
	fs.StringVar(&c.Version, "version", "dev", "version stamped into the binary (-X main.version) and labelled")
	fs.StringVar(&c.Commit, "commit", "unknown", "commit stamped into the binary (-X main.commit) and labelled as the revision")
	fs.StringVar(&c.Source, "source", "https://github.com/fleetsync/fleetsync", "the source label")
	fs.Func("created", "image creation time and every file's mtime, in Unix `seconds` (SOURCE_DATE_EPOCH; default 0)", func(s string) error {
		var sec int64
		if _, err := fmt.Sscan(s, &sec); err != nil || sec < 0 {
			return fmt.Errorf("want Unix seconds, got %q", s)
		}
		c.Created = time.Unix(sec, 0).UTC()
		return nil
	})
	c.Created = time.Unix(0, 0).UTC()
	c.Platforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64"}}
	fs.Func("platforms", "comma-separated `os/arch` list (default linux/amd64,linux/arm64)", func(s string) error {
		c.Platforms = nil
		for _, f := range strings.Split(s, ",") {
			p, err := v1.ParsePlatform(strings.TrimSpace(f))
			if err != nil {
				return err
			}
			c.Platforms = append(c.Platforms, *p)
		}
		return nil
	})
	fs.StringVar(&c.CACerts, "ca-certs", "/etc/ssl/certs/ca-certificates.crt", "CA bundle (PEM) copied into the image")
	fs.StringVar(&c.Module, "module", ".", "`directory` of fleetsync's go.mod")
	fs.StringVar(&c.Go, "go", "go", "the go `command`")
	fs.StringVar(&c.Out, "out", "out/image", "output `directory`")
}

// Validate checks c, naming the flag at fault.
func (c *Config) Validate() error {
	var errs []error
	if _, err := name.NewTag(c.Name); err != nil {
		errs = append(errs, fmt.Errorf("-name %q: %w", c.Name, err))
	}
	for flagName, v := range map[string]string{"version": c.Version, "commit": c.Commit} {
		if v == "" || strings.ContainsAny(v, " \t\n'\"") {
			errs = append(errs, fmt.Errorf("-%s %q: want a non-empty word (it goes into -ldflags)", flagName, v))
		}
	}
	if len(c.Platforms) == 0 {
		errs = append(errs, errors.New("-platforms: empty"))
	}
	seen := map[string]bool{}
	for _, p := range c.Platforms {
		if p.OS != "linux" || p.Architecture == "" {
			errs = append(errs, fmt.Errorf("-platforms %s: want linux/<arch>", p))
		}
		if seen[p.String()] {
			errs = append(errs, fmt.Errorf("-platforms %s: twice", p))
		}
		seen[p.String()] = true
	}
	if c.Out == "" {
		errs = append(errs, errors.New("-out: empty"))
	}
	return errors.Join(errs...)
}

// labels returns the OCI labels of the image c builds.
func (c *Config) labels() map[string]string {
	return map[string]string{
		labelTitle:    "fleetsync",
		labelSource:   c.Source,
		labelRevision: c.Commit,
		labelVersion:  c.Version,
		labelCreated:  c.Created.Format(time.RFC3339),
	}
}

// newImage assembles the image of platform p from its binary and the CA
// bundle: one layer (rootfs), user 65532:65532, entrypoint /fleetsync.
func newImage(c *Config, p v1.Platform, binary, caCerts []byte) (v1.Image, error) {
	gz, err := layerTar(rootfs(binary, caCerts), c.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:   layer,
		History: v1.History{Created: v1.Time{Time: c.Created}, CreatedBy: "make image (deploy/image)", Comment: "fleetsync " + c.Version},
	})
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", p, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", p, err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Created = v1.Time{Time: c.Created}
	cf.Config = v1.Config{
		User:         fmt.Sprintf("%d:%d", nonroot, nonroot),
		Entrypoint:   []string{"/" + binaryPath},
		Env:          []string{"SSL_CERT_FILE=/" + caCertsPath},
		ExposedPorts: map[string]struct{}{"9090/tcp": {}},
		Labels:       c.labels(),
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", p, err)
	}
	return img, nil
}

// newIndex puts the images, one per platform of c in the same order, into
// one OCI index.
func newIndex(c *Config, imgs []v1.Image) v1.ImageIndex {
	var adds []mutate.IndexAddendum
	for i, img := range imgs {
		p := c.Platforms[i]
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	idx = mutate.AppendManifests(idx, adds...)
	return mutate.Annotations(idx, c.labels()).(v1.ImageIndex)
}
