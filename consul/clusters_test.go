package consul

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// nodesAPI answers CatalogNodes with a fixed list (ignoring the filter, so
// the client's own check of the mark is exercised too) and records each
// query's node meta.
type nodesAPI struct {
	catalogAPI
	nodes   []*api.Node
	err     error
	hang    bool // block until the request's context ends
	queries []map[string]string
}

func (f *nodesAPI) CatalogNodes(q *api.QueryOptions) ([]*api.Node, *api.QueryMeta, error) {
	f.queries = append(f.queries, maps.Clone(q.NodeMeta))
	if f.hang {
		<-q.Context().Done()
		return nil, nil, q.Context().Err()
	}
	return f.nodes, &api.QueryMeta{}, f.err
}

func k8sNode(name string, meta map[string]string) *api.Node {
	return &api.Node{Node: name, Address: "127.0.0.1", Meta: meta}
}

func clusterMeta(id string) map[string]string {
	return map[string]string{nodeMetaExternalSource: externalSourceK8s, nodeMetaCluster: id}
}

func TestClusterIDs(t *testing.T) {
	if got := (testOwner{id: "east"}).Node().Meta; got[nodeMetaExternalSource] != externalSourceK8s || got[nodeMetaCluster] != "east" {
		t.Fatalf("the mark's node meta is %v, not what ClusterIDs reads", got)
	}
	tests := []struct {
		name  string
		nodes []*api.Node
		want  []string
	}{
		{name: "empty catalog"},
		{
			name:  "only our own nodes",
			nodes: []*api.Node{k8sNode("k8s-east", clusterMeta("east")), k8sNode("k8s-east.3", clusterMeta("east"))},
		},
		{
			name: "other clusters, distinct and sorted, ours left out",
			nodes: []*api.Node{
				k8sNode("k8s-west.2", clusterMeta("west")),
				k8sNode("k8s-east", clusterMeta("east")),
				k8sNode("k8s-west", clusterMeta("west")),
				k8sNode("k8s-north", clusterMeta("north")),
				k8sNode("k8s-east.1", clusterMeta("east")),
				k8sNode("k8s-apac-1", clusterMeta("apac-1")),
			},
			want: []string{"apac-1", "north", "west"},
		},
		{
			name: "nodes without both parts of the mark are not clusters",
			nodes: []*api.Node{
				k8sNode("k8s-sync", map[string]string{nodeMetaExternalSource: externalSourceK8s}), // consul-k8s's node
				k8sNode("k8s-blank", clusterMeta("")),
				k8sNode("k8s-nomad", map[string]string{nodeMetaExternalSource: "nomad", nodeMetaCluster: "nomad"}),
				k8sNode("agent-1", nil),
				nil,
				k8sNode("k8s-west", clusterMeta("west")),
			},
			want: []string{"west"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := &nodesAPI{nodes: tt.nodes}
			c := newClient(fake, testOwner{id: "east"}, Options{})
			got, err := c.ClusterIDs(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ClusterIDs = %q, want %q", got, tt.want)
			}
			want := map[string]string{"external-source": "kubernetes"}
			if len(fake.queries) != 1 || !maps.Equal(fake.queries[0], want) {
				t.Errorf("queries %v, want one with node meta %v", fake.queries, want)
			}
		})
	}
}

func TestClusterIDsErrors(t *testing.T) {
	boom := errors.New("connection refused")
	c := newClient(&nodesAPI{err: boom}, testOwner{id: "east"}, Options{})
	if _, err := c.ClusterIDs(context.Background()); !errors.Is(err, boom) || !strings.Contains(err.Error(), "external-source=kubernetes") {
		t.Errorf("err = %v, want the API error wrapped, naming the query", err)
	}
	c = newClient(&nodesAPI{hang: true}, testOwner{id: "east"}, Options{RequestTimeout: time.Millisecond})
	if _, err := c.ClusterIDs(context.Background()); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "no answer from Consul") {
		t.Errorf("a Consul that never answers: err = %v, want the request deadline", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fake := &nodesAPI{}
	c = newClient(fake, testOwner{id: "east"}, Options{MaxReads: 1})
	if err := c.reads.Acquire(context.Background(), 1); err != nil { // every read slot busy
		t.Fatal(err)
	}
	defer c.reads.Release(1)
	if _, err := c.ClusterIDs(ctx); !errors.Is(err, context.Canceled) || len(fake.queries) != 0 {
		t.Errorf("cancelled while waiting for a read slot: err = %v, %d queries; want context.Canceled and none", err, len(fake.queries))
	}
}

// TestClusterIDsAgainstConsul: the node-meta query finds other clusters'
// nodes in a real catalog, and neither ours nor unmarked ones.
func TestClusterIDsAgainstConsul(t *testing.T) {
	a := needConsul(t)
	ctx := t.Context()
	nodes := map[string]map[string]string{
		"k8s-cidtest-own":   clusterMeta("cidtest-own"),
		"k8s-cidtest-own.1": clusterMeta("cidtest-own"),
		"k8s-cidtest-b":     clusterMeta("cidtest-b"),
		"k8s-cidtest-a":     clusterMeta("cidtest-a"),
		"k8s-cidtest-a.2":   clusterMeta("cidtest-a"),
		"cidtest-unmarked":  {nodeMetaCluster: "cidtest-unmarked"},
	}
	for name, meta := range nodes {
		if _, err := a.Client.Catalog().Register(&api.CatalogRegistration{Node: name, Address: "127.0.0.1", NodeMeta: meta}, nil); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = a.Client.Catalog().Deregister(&api.CatalogDeregistration{Node: name}, nil)
		})
	}
	got, err := NewClient(a.Client, testOwner{id: "cidtest-own"}, Options{}).ClusterIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("ClusterIDs = %q: not sorted and distinct", got)
	}
	for _, id := range []string{"cidtest-a", "cidtest-b"} {
		if !slices.Contains(got, id) {
			t.Errorf("ClusterIDs = %q, lacks %s", got, id)
		}
	}
	for _, id := range []string{"cidtest-own", "cidtest-unmarked"} {
		if slices.Contains(got, id) {
			t.Errorf("ClusterIDs = %q, has %s", got, id)
		}
	}
}
