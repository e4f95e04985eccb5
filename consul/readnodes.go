package consul

import (
	"context"

	"golang.org/x/sync/errgroup"
)

// nodeReaders is how many nodes one whole-state read reads at once (each
// read also holds a slot of the client's read bound): a restart of a
// cluster spread over 100 nodes reads them 4 at a time instead of one
// after another, so Consul's encoding and ours overlap.
const nodeReaders = 4

// readEach reads the instances whose ID starts with prefix ("": all) on
// the given nodes, nodeReaders at a time, and returns them in the order of
// nodes; the first error ends the read.
func (c *Client) readEach(ctx context.Context, nodes []string, prefix string) ([]Registered, error) {
	if len(nodes) == 1 {
		return c.read(ctx, nodes[0], prefix)
	}
	got := make([][]Registered, len(nodes))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(nodeReaders)
	for i, node := range nodes {
		g.Go(func() error {
			var err error
			got[i], err = c.read(gctx, node, prefix)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	n := 0
	for _, r := range got {
		n += len(r)
	}
	out := make([]Registered, 0, n)
	for _, r := range got {
		out = append(out, r...)
	}
	return out, nil
}
