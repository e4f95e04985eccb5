package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/claim"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/fence"
	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// purgeConflictRounds bounds how often a purge reads again and retries
// after a CAS conflict (someone changed an entry between our read and our
// delete).
const purgeConflictRounds = 5

// Purger removes one cluster that is gone for good from Consul (`fleetsync
// purge`): every instance carrying its mark, then each of its nodes that
// holds nothing else, then its released cluster-id claim. Every delete is
// conditional on what was read: instances go through the Client's writer
// (Owns verified on each entry, delete-CAS on the index read), a node only
// while it still carries the cluster's mark, holds nothing and is
// unchanged (see removeNode), the claim with a CAS on the index read while
// no session holds it. Entries without the mark, and every other
// cluster's, are never touched.
type Purger struct {
	api         *api.Client
	nodes       nodeCatalog
	cluster     consul.ClusterOwner
	store       *consul.Client
	claimPrefix string
}

// NewPurger returns a purger of cluster c, whose claim is under
// claimPrefix ("" for claim.DefaultPrefix).
func NewPurger(cn *conn.Conn, c consul.ClusterOwner, claimPrefix string) *Purger {
	return &Purger{api: cn.API(), nodes: wire.API{C: cn.API()}, cluster: c, store: consul.NewConnClient(cn, c, consul.Options{}), claimPrefix: claimPrefix}
}

// PurgePlan is what a purge found on a cluster's nodes.
type PurgePlan struct {
	Cluster    consul.ClusterOwner
	NodeFound  bool
	Nodes      []string            // the cluster's marked nodes found
	nodes      []*api.Node         // the same, as read (their ModifyIndex makes the node delete conditional)
	Owned      []consul.Registered // carrying the mark: to deregister
	Foreign    []consul.Registered // without the mark: kept, and they keep the node
	NodeChecks []string            // node-level checks: kept, and they keep the node
	Claim      *claim.Value        // the id's claim in Consul KV, if any
	ClaimHeld  bool                // a live session (a running fleetsync) holds it
}

// Refusal is why the purge must not run at all: the id's claim is held, so
// a fleetsync for it is running and would register everything again.
func (p PurgePlan) Refusal() error {
	if p.Claim == nil || !p.ClaimHeld {
		return nil
	}
	return fmt.Errorf("refusing: cluster id %s is claimed by a running fleetsync (holder %q, Kubernetes cluster %s); stop it first",
		p.Cluster.ID(), p.Claim.Holder, p.Claim.KubeUID)
}

// RemovesClaim reports whether the id's claim goes too: the cluster has left
// nothing in the catalog and no running fleetsync holds the claim.
func (p PurgePlan) RemovesClaim() bool {
	return p.Claim != nil && !p.ClaimHeld && (!p.NodeFound || p.RemovesNode())
}

// RemovesNode reports whether the nodes go once the owned entries are gone.
func (p PurgePlan) RemovesNode() bool {
	return p.NodeFound && len(p.Foreign) == 0 && len(p.NodeChecks) == 0
}

// NodeNames names the plan's nodes for messages: "node k8s-x" or "nodes
// k8s-x, k8s-x.1".
func (p PurgePlan) NodeNames() string {
	switch len(p.Nodes) {
	case 0:
		return "node " + p.Cluster.NodeName()
	case 1:
		return "node " + p.Nodes[0]
	}
	return "nodes " + strings.Join(p.Nodes, ", ")
}

// ByService counts the owned instances per Consul service name.
func (p PurgePlan) ByService() map[string]int { return countByService(p.Owned) }

func countByService(entries []consul.Registered) map[string]int {
	m := map[string]int{}
	for _, e := range entries {
		m[e.Name]++
	}
	return m
}

// newPurgePlan sorts the nodes' entries by ownership. It refuses a node
// that does not carry the cluster's mark: it is someone else's, whatever
// its name says.
func newPurgePlan(c consul.ClusterOwner, nodes []*api.Node, entries []consul.Registered, checks api.HealthChecks) (PurgePlan, error) {
	plan := PurgePlan{Cluster: c}
	if len(nodes) == 0 {
		return plan, nil
	}
	for _, node := range nodes {
		if err := ownsNode(c, node); err != nil {
			return plan, err
		}
		plan.Nodes = append(plan.Nodes, node.Node)
		plan.nodes = append(plan.nodes, node)
	}
	sort.Strings(plan.Nodes)
	sort.Slice(plan.nodes, func(i, j int) bool { return plan.nodes[i].Node < plan.nodes[j].Node })
	plan.NodeFound = true
	for _, e := range entries {
		if c.Owns(e) == nil {
			plan.Owned = append(plan.Owned, e)
		} else {
			plan.Foreign = append(plan.Foreign, e)
		}
	}
	for _, hc := range checks {
		if hc.ServiceID == "" {
			plan.NodeChecks = append(plan.NodeChecks, hc.CheckID)
		}
	}
	sort.Slice(plan.Owned, func(i, j int) bool { return plan.Owned[i].ID < plan.Owned[j].ID })
	sort.Slice(plan.Foreign, func(i, j int) bool { return plan.Foreign[i].ID < plan.Foreign[j].ID })
	sort.Strings(plan.NodeChecks)
	return plan, nil
}

// ownsNode asks the owner whether node, as read, is its own, and words a
// no as a refusal.
func ownsNode(c consul.ClusterOwner, node *api.Node) error {
	if err := c.OwnsNode(consul.Node{Name: node.Node, Address: node.Address, Meta: node.Meta}); err != nil {
		return fmt.Errorf("refusing to touch %w", err)
	}
	return nil
}

// Plan reads the cluster's claim, nodes, entries and node checks. It
// returns an error (and sends nothing) for a node named like the
// cluster's that does not carry its mark.
func (p *Purger) Plan(ctx context.Context) (PurgePlan, error) {
	claim, held, err := claim.Read(ctx, p.api, p.claimPrefix, p.cluster.ID())
	if err != nil {
		return PurgePlan{}, fmt.Errorf("read the claim of cluster %s: %w", p.cluster.ID(), err)
	}
	nodes, err := p.readNodes(ctx)
	if err != nil || len(nodes) == 0 {
		return PurgePlan{Cluster: p.cluster, Claim: claim, ClaimHeld: held}, err
	}
	entries, err := p.store.ReadNode(ctx)
	if err != nil {
		return PurgePlan{}, err
	}
	var checks api.HealthChecks
	for _, n := range nodes {
		hc, _, err := p.nodes.HealthNode(n.Node, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return PurgePlan{}, fmt.Errorf("read checks of node %s: %w", n.Node, err)
		}
		checks = append(checks, hc...)
	}
	plan, err := newPurgePlan(p.cluster, nodes, entries, checks)
	plan.Claim, plan.ClaimHeld = claim, held
	return plan, err
}

// readNodes reads the cluster's nodes: those its node meta lists, and
// k8s-<id> whatever its meta (a node of that name that is not marked as the
// cluster's makes the plan refuse, see newPurgePlan).
func (p *Purger) readNodes(ctx context.Context) ([]*api.Node, error) {
	names, err := p.store.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(names, p.cluster.NodeName()) {
		names = append([]string{p.cluster.NodeName()}, names...)
	}
	var out []*api.Node
	for _, name := range names {
		n, _, err := p.nodes.CatalogNode(name, (&api.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("read node %s: %w", name, err)
		}
		if n != nil && n.Node != nil {
			out = append(out, n.Node)
		}
	}
	return out, nil
}

// PurgeResult is what Execute did.
type PurgeResult struct {
	Cluster      consul.ClusterOwner
	Deregistered int
	Services     int
	Txns         int
	NodesRemoved []string   // nodes this purge deleted
	NodesGone    []string   // empty nodes someone else deleted first
	NodesKept    []KeptNode // empty when read, but not deleted: why
	ClaimRemoved string     // the claim key removed, if any
	Kept         PurgePlan  // what was left on the nodes after the deletes
}

// KeptNode is a node the purge found empty and still did not delete.
type KeptNode struct {
	Node string
	Why  string
}

// Execute deregisters the plan's owned instances (reading again and
// retrying after a conflict), reads again, and then deletes each node
// that is still marked and empty, and the released claim (with the
// shards' fences under it) when no node of the cluster is left. It refuses to go on when owned instances are back
// (a fleetsync of the id still runs) or the claim is held meanwhile.
func (p *Purger) Execute(ctx context.Context, plan PurgePlan) (PurgeResult, error) {
	res := PurgeResult{Cluster: p.cluster, Services: len(plan.ByService())}
	for attempt := 1; len(plan.Owned) > 0; attempt++ {
		applied, err := p.store.Apply(ctx, consul.Change{Deregister: plan.Owned})
		res.Deregistered += applied.Deregistered
		res.Txns += applied.Txns
		if err == nil {
			break
		}
		if !errors.Is(err, consul.ErrConflict) || attempt == purgeConflictRounds {
			return res, fmt.Errorf("deregister instances of cluster %s: %w", p.cluster.ID(), err)
		}
		// Someone changed an entry since we read it: read again, and
		// verify ownership again, before the next try.
		if plan, err = p.Plan(ctx); err != nil {
			return res, err
		}
	}
	after, err := p.Plan(ctx)
	if err != nil {
		return res, err
	}
	res.Kept = after
	if len(after.Owned) > 0 {
		return res, fmt.Errorf("%d instances of cluster %s are on %s again: is a fleetsync with --cluster-id=%s still running?",
			len(after.Owned), p.cluster.ID(), after.NodeNames(), p.cluster.ID())
	}
	if err := after.Refusal(); err != nil {
		return res, err
	}
	if after.RemovesNode() {
		// The nodes were marked and held nothing just now: delete each
		// one that still is, and is unchanged.
		for _, n := range after.nodes {
			fate, err := removeNode(ctx, p.nodes, p.cluster, n)
			if err != nil {
				return res, err
			}
			switch {
			case fate.removed:
				res.NodesRemoved = append(res.NodesRemoved, n.Node)
			case fate.gone:
				res.NodesGone = append(res.NodesGone, n.Node)
			default:
				res.NodesKept = append(res.NodesKept, KeptNode{Node: n.Node, Why: fate.why})
			}
		}
	}
	if after.RemovesClaim() && len(res.NodesKept) == 0 {
		key, err := p.removeClaim(ctx)
		if err != nil {
			return res, err
		}
		res.ClaimRemoved = key
	}
	return res, nil
}

// removeClaim deletes the id's claim key if no session holds it, CAS on the
// index read.
func (p *Purger) removeClaim(ctx context.Context) (string, error) {
	prefix := p.claimPrefix
	if prefix == "" {
		prefix = claim.DefaultPrefix
	}
	key := strings.TrimSuffix(prefix, "/") + "/" + p.cluster.ID()
	pair, _, err := p.api.KV().Get(key, (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil || pair == nil {
		return "", err
	}
	if pair.Session != "" {
		return "", fmt.Errorf("refusing to remove claim %s: a running fleetsync took it meanwhile", key)
	}
	ok, _, err := p.api.KV().DeleteCAS(pair, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("remove claim %s: %w", key, err)
	}
	if !ok {
		return "", fmt.Errorf("claim %s changed while purging; run purge again", key)
	}
	// The shards' fencing tokens (consul/fence) go with the claim: a
	// fleetsync of the id that starts again takes them from generation 1.
	fences := fence.KeyPrefix(prefix, p.cluster.ID())
	if _, err := p.api.KV().DeleteTree(fences, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return key, fmt.Errorf("remove the shards' fences under %s: %w", fences, err)
	}
	return key, nil
}
