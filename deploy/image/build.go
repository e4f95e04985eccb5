package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Result is what build wrote.
type Result struct {
	Index  v1.Hash    // the index's digest
	Layout string     // the OCI layout directory
	Images []Platform // one per platform, in the order of Config.Platforms
}

// Platform is the image of one platform.
type Platform struct {
	Platform v1.Platform
	Digest   v1.Hash // the image manifest's digest
	Size     int64   // compressed: manifest, config and layer
	Tarball  string  // the docker-format tarball
	Binary   string  // the binary in the image
}

// compile builds ./cmd/fleetsync for p into dst: static (CGO_ENABLED=0),
// stamped as `make build` stamps it, and with -trimpath -buildvcs=false so
// that the same source gives the same bytes wherever it is checked out.
func compile(ctx context.Context, c *Config, p v1.Platform, dst string) error {
	ldflags := fmt.Sprintf("-s -w -X main.version=%s -X main.commit=%s", c.Version, c.Commit)
	cmd := exec.CommandContext(ctx, c.Go, "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", dst, "./cmd/fleetsync")
	cmd.Dir = c.Module
	// The baseline instruction sets: the image runs on any node of its
	// architecture, whatever GOAMD64 the builder's environment sets.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+p.OS, "GOARCH="+p.Architecture, "GOAMD64=v1", "GOARM64=v8.0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build for %s: %w\n%s", p, err, stderr.Bytes())
	}
	return nil
}

// build compiles the binary of every platform of c, assembles the images
// and their index and writes them under c.Out: the OCI layout oci/, a
// docker-format tarball fleetsync-<os>-<arch>.tar per platform, and the
// binaries under bin/<os>-<arch>/. It logs its progress to log.
func build(ctx context.Context, c *Config, log io.Writer) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	caCerts, err := readCACerts(c.CACerts)
	if err != nil {
		return Result{}, err
	}
	tag, err := name.NewTag(c.Name)
	if err != nil {
		return Result{}, fmt.Errorf("-name %q: %w", c.Name, err)
	}
	res := Result{Layout: filepath.Join(c.Out, "oci")}
	var imgs []v1.Image
	for _, p := range c.Platforms {
		slug := p.OS + "-" + p.Architecture
		if p.Variant != "" {
			slug += "-" + p.Variant
		}
		bin := filepath.Join(c.Out, "bin", slug, binaryPath)
		fmt.Fprintf(log, "compile %s -> %s\n", p, bin)
		if err := compile(ctx, c, p, bin); err != nil {
			return Result{}, err
		}
		binary, err := os.ReadFile(bin)
		if err != nil {
			return Result{}, err
		}
		img, err := newImage(c, p, binary, caCerts)
		if err != nil {
			return Result{}, err
		}
		pi := Platform{Platform: p, Binary: bin, Tarball: filepath.Join(c.Out, "fleetsync-"+slug+".tar")}
		if pi.Digest, err = img.Digest(); err != nil {
			return Result{}, err
		}
		if pi.Size, err = compressedSize(img); err != nil {
			return Result{}, err
		}
		if err := tarball.WriteToFile(pi.Tarball, tag, img); err != nil {
			return Result{}, fmt.Errorf("docker tarball %s: %w", pi.Tarball, err)
		}
		imgs = append(imgs, img)
		res.Images = append(res.Images, pi)
	}
	idx := newIndex(c, imgs)
	if res.Index, err = idx.Digest(); err != nil {
		return Result{}, err
	}
	if err := writeLayout(res.Layout, idx, tag); err != nil {
		return Result{}, err
	}
	return res, nil
}

// writeLayout writes idx as the one index of a fresh OCI layout at dir,
// named with tag's tag.
func writeLayout(dir string, idx v1.ImageIndex, tag name.Tag) error {
	// A fresh layout: blobs of earlier builds would pile up in it.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("oci layout %s: %w", dir, err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{annotationRefName: tag.TagStr()})); err != nil {
		return fmt.Errorf("oci layout %s: %w", dir, err)
	}
	return nil
}

// compressedSize is what a pull of img transfers: its manifest, config and
// compressed layers.
func compressedSize(img v1.Image) (int64, error) {
	m, err := img.Manifest()
	if err != nil {
		return 0, err
	}
	raw, err := img.RawManifest()
	if err != nil {
		return 0, err
	}
	n := int64(len(raw)) + m.Config.Size
	for _, l := range m.Layers {
		n += l.Size
	}
	return n, nil
}
