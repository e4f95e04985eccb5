package admin

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/ownership"
)

// Inventory is every Kubernetes cluster fleetsync syncs into this Consul
// (`fleetsync status`), as read.
type Inventory struct {
	Index    uint64             `json:"index"` // the catalog's index when read
	Clusters []ClusterInventory `json:"clusters"`
	// Other nodes with external-source=kubernetes that are no fleetsync
	// cluster's node (consul-k8s's k8s-sync, for one).
	Others []OtherNode `json:"other_nodes"`
}

// ClusterInventory is what one cluster has in Consul.
type ClusterInventory struct {
	ClusterID          string         `json:"cluster_id"`
	Node               string         `json:"node"`
	Nodes              int            `json:"nodes"` // synthetic nodes in Consul (see --consul-nodes)
	Services           int            `json:"services"`
	Instances          int            `json:"instances"`
	Passing            int            `json:"passing"`
	Warning            int            `json:"warning"`
	Critical           int            `json:"critical"`
	Foreign            int            `json:"foreign_entries"`
	LastWriteIndex     uint64         `json:"last_write_index"`
	InstancesByService map[string]int `json:"instances_by_service"`
	// Claim is the cluster id's claim in Consul KV; nil when there is none.
	Claim *ClaimStatus `json:"claim"`
}

// ClaimStatus is a cluster id's claim and whether it is held.
type ClaimStatus struct {
	claim.Value
	Held bool `json:"held"` // a live session (a running fleetsync) holds it
}

// OtherNode is a node marked external-source=kubernetes that no cluster
// owns.
type OtherNode struct {
	Node    string `json:"node"`
	Entries int    `json:"entries"`
}

// Inspect lists every cluster in this Consul: each cluster's marked
// nodes (find says whose a node is) with what is on them, and every
// cluster id claimed under claimPrefix ("" for claim.DefaultPrefix), with
// its claim. Read-only.
func Inspect(ctx context.Context, cn *conn.Conn, claimPrefix string, find consul.ClusterFinder) (Inventory, error) {
	q := (&api.QueryOptions{NodeMeta: map[string]string{ownership.MetaExternalSource: ownership.ExternalSource}}).WithContext(ctx)
	nodes, meta, err := cn.API().Catalog().Nodes(q)
	if err != nil {
		return Inventory{}, fmt.Errorf("list nodes with meta %s=%s: %w", ownership.MetaExternalSource, ownership.ExternalSource, err)
	}
	inv := Inventory{Index: meta.LastIndex, Clusters: []ClusterInventory{}, Others: []OtherNode{}}
	type found struct {
		cluster consul.ClusterOwner
		index   uint64
		nodes   int
	}
	var clusters []*found
	byID := map[string]*found{}
	for _, n := range nodes {
		if cluster, ok := find.ClusterOf(consul.Node{Name: n.Node, Address: n.Address, Meta: n.Meta}); ok {
			f := byID[cluster.ID()]
			if f == nil {
				f = &found{cluster: cluster}
				byID[cluster.ID()] = f
				clusters = append(clusters, f)
			}
			f.index = max(f.index, n.ModifyIndex)
			f.nodes++
			continue
		}
		list, _, err := cn.API().Catalog().NodeServiceList(n.Node, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return Inventory{}, fmt.Errorf("read services of node %s: %w", n.Node, err)
		}
		o := OtherNode{Node: n.Node}
		if list != nil {
			o.Entries = len(list.Services)
		}
		inv.Others = append(inv.Others, o)
	}
	seen := map[string]bool{}
	for _, f := range clusters {
		entries, err := consul.NewConnClient(cn, f.cluster, consul.Options{}).ReadNode(ctx)
		if err != nil {
			return Inventory{}, err
		}
		s := summarize(f.cluster, f.index, entries)
		s.Nodes = f.nodes
		inv.Clusters = append(inv.Clusters, s)
		seen[f.cluster.ID()] = true
	}
	// Claimed ids without a node (nothing written yet, or purged) are
	// clusters too.
	ids, err := claimedIDs(ctx, cn, claimPrefix)
	if err != nil {
		return Inventory{}, err
	}
	for _, id := range ids {
		if find.ValidClusterID(id) && !seen[id] {
			inv.Clusters = append(inv.Clusters, ClusterInventory{ClusterID: id, InstancesByService: map[string]int{}})
		}
	}
	for i := range inv.Clusters {
		c := &inv.Clusters[i]
		v, held, err := claim.Read(ctx, cn.API(), claimPrefix, c.ClusterID)
		if err != nil {
			return Inventory{}, fmt.Errorf("read the claim of cluster %s: %w", c.ClusterID, err)
		}
		if v != nil {
			c.Claim = &ClaimStatus{Value: *v, Held: held}
		}
	}
	sort.Slice(inv.Clusters, func(i, j int) bool { return inv.Clusters[i].ClusterID < inv.Clusters[j].ClusterID })
	sort.Slice(inv.Others, func(i, j int) bool { return inv.Others[i].Node < inv.Others[j].Node })
	return inv, nil
}

// claimedIDs lists the cluster ids that have a claim key under prefix.
func claimedIDs(ctx context.Context, cn *conn.Conn, prefix string) ([]string, error) {
	if prefix == "" {
		prefix = claim.DefaultPrefix
	}
	prefix = strings.TrimSuffix(prefix, "/") + "/"
	keys, _, err := cn.API().KV().Keys(prefix, "/", (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("list cluster-id claims under %s: %w", prefix, err)
	}
	ids := make([]string, 0, len(keys))
	for _, k := range keys {
		if id := strings.TrimPrefix(k, prefix); id != "" && !strings.HasSuffix(id, "/") {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// summarize counts what is on one cluster's nodes: entries the cluster
// owns by their check's status, the others as foreign.
func summarize(c consul.ClusterOwner, nodeIndex uint64, entries []consul.Registered) ClusterInventory {
	s := ClusterInventory{ClusterID: c.ID(), Node: c.NodeName(), LastWriteIndex: nodeIndex, InstancesByService: map[string]int{}}
	for _, e := range entries {
		s.LastWriteIndex = max(s.LastWriteIndex, e.ServiceIndex, e.CheckIndex)
		if c.Owns(e) != nil {
			s.Foreign++
			continue
		}
		s.Instances++
		s.InstancesByService[e.Name]++
		if !e.HasCheck {
			continue
		}
		switch e.Check.Status {
		case consul.StatusPassing:
			s.Passing++
		case consul.StatusWarning:
			s.Warning++
		case consul.StatusCritical:
			s.Critical++
		}
	}
	s.Services = len(s.InstancesByService)
	return s
}
