package main

import (
	"context"
	"fmt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// layoutIndex returns the one index that build wrote into the OCI layout
// at dir.
func layoutIndex(dir string) (v1.ImageIndex, error) {
	root, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("oci layout %s: %w", dir, err)
	}
	m, err := root.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("oci layout %s: %w", dir, err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, fmt.Errorf("oci layout %s: index.json lists %d manifests, want the one image index of `image build`", dir, len(m.Manifests))
	}
	idx, err := root.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return nil, fmt.Errorf("oci layout %s: %w", dir, err)
	}
	return idx, nil
}

// push pushes the index of the OCI layout at dir, with its images, to ref,
// authenticating with the default keychain (docker login's credentials),
// and returns the index's digest.
func push(ctx context.Context, dir, ref string, opts ...remote.Option) (v1.Hash, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("image %q: %w", ref, err)
	}
	idx, err := layoutIndex(dir)
	if err != nil {
		return v1.Hash{}, err
	}
	d, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, err
	}
	opts = append([]remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}, opts...)
	if err := remote.WriteIndex(r, idx, opts...); err != nil {
		return v1.Hash{}, fmt.Errorf("push %s: %w", r, err)
	}
	return d, nil
}
