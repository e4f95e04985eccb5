package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/ownership"
)

// purgeConflictRounds bounds how often purge reads again and retries after
// a CAS conflict (someone changed an entry between our read and our delete).
const purgeConflictRounds = 5

func runPurge(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("fleetsync purge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerConsulFlags(fs, &cfg)
	clusterID := fs.String("cluster-id", "", "the cluster whose instances and node to remove (required; never read from FLEETSYNC_CLUSTER_ID)")
	yes := fs.Bool("yes", false, "do it; without --yes purge only prints what it would do")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: fleetsync purge --cluster-id=ID [--yes] [flags]\n\n"+
			"Removes from Consul every instance carrying cluster ID's ownership mark, then its node k8s-<ID>\n"+
			"and its cluster-id claim if nothing else is left on the node: for a Kubernetes cluster that is\n"+
			"gone for good. Without --yes it only prints what it would do. Entries without the mark, and every\n"+
			"other cluster's, are never touched. Refused while a running fleetsync holds the id's claim.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := parseSubcommand(fs, &cfg, args, stderr); !ok {
		return code
	}
	if *clusterID == "" {
		fmt.Fprintln(stderr, "fleetsync purge: --cluster-id is required")
		return 2
	}
	cluster, err := ownership.New(*clusterID)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync purge: --cluster-id:", err)
		return 2
	}
	ctx, cancel := commandContext(*timeout)
	defer cancel()
	capi, err := consulapi.NewClient(consulConfig(cfg))
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync purge: consul client:", err)
		return 1
	}
	p := purger{api: capi, nodeAPI: apiNodeCatalog{capi}, cluster: cluster, store: consul.NewClient(capi, cluster, consul.Options{}), claimPrefix: cfg.ClaimPrefix}
	plan, err := p.plan(ctx)
	if err == nil {
		err = plan.refusal()
	}
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync purge:", err)
		return 1
	}
	writePurgePlan(stdout, plan, *yes)
	if !*yes || (!plan.NodeFound && !plan.RemovesClaim()) {
		return 0
	}
	res, err := p.execute(ctx, plan)
	writePurgeResult(stdout, res)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync purge:", err)
		return 1
	}
	return 0
}

// purgePlan is what purge found on a cluster's nodes.
type purgePlan struct {
	Cluster    ownership.Cluster
	NodeFound  bool
	Nodes      []string            // the cluster's marked nodes found
	nodes      []*consulapi.Node   // the same, as read (their ModifyIndex makes the node delete conditional)
	Owned      []consul.Registered // carrying the mark: to deregister
	Foreign    []consul.Registered // without the mark: kept, and they keep the node
	NodeChecks []string            // node-level checks: kept, and they keep the node
	Claim      *consul.ClaimValue  // the id's claim in Consul KV, if any
	ClaimHeld  bool                // a live session (a running fleetsync) holds it
}

// refusal is why purge must not run at all: the id's claim is held, so a
// fleetsync for it is running and would register everything again.
func (p purgePlan) refusal() error {
	if p.Claim == nil || !p.ClaimHeld {
		return nil
	}
	return fmt.Errorf("refusing: cluster id %s is claimed by a running fleetsync (holder %q, Kubernetes cluster %s); stop it first",
		p.Cluster.ID(), p.Claim.Holder, p.Claim.KubeUID)
}

// RemovesClaim reports whether the id's claim goes too: the cluster has left
// nothing in the catalog and no running fleetsync holds the claim.
func (p purgePlan) RemovesClaim() bool {
	return p.Claim != nil && !p.ClaimHeld && (!p.NodeFound || p.RemovesNode())
}

// RemovesNode reports whether the node goes once the owned entries are gone.
func (p purgePlan) RemovesNode() bool {
	return p.NodeFound && len(p.Foreign) == 0 && len(p.NodeChecks) == 0
}

// nodeNames names the plan's nodes for messages.
func (p purgePlan) nodeNames() string {
	switch len(p.Nodes) {
	case 0:
		return "node " + p.Cluster.NodeName()
	case 1:
		return "node " + p.Nodes[0]
	}
	return "nodes " + strings.Join(p.Nodes, ", ")
}

// newPurgePlan sorts the nodes' entries by ownership. It refuses a node
// that does not carry the cluster's mark: it is someone else's, whatever
// its name says.
func newPurgePlan(c ownership.Cluster, nodes []*consulapi.Node, entries []consul.Registered, checks consulapi.HealthChecks) (purgePlan, error) {
	plan := purgePlan{Cluster: c}
	if len(nodes) == 0 {
		return plan, nil
	}
	for _, node := range nodes {
		if err := nodeMarked(c, node); err != nil {
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

func nodeMarked(c ownership.Cluster, node *consulapi.Node) error {
	if !c.IsNode(node.Node) || node.Meta[ownership.MetaExternalSource] != ownership.ExternalSource ||
		node.Meta[ownership.MetaCluster] != c.ID() {
		return fmt.Errorf("refusing to touch node %s: its meta %s=%q, %s=%q is not cluster %s's mark (%s=%s, %s=%s)",
			node.Node, ownership.MetaExternalSource, node.Meta[ownership.MetaExternalSource],
			ownership.MetaCluster, node.Meta[ownership.MetaCluster], c.ID(),
			ownership.MetaExternalSource, ownership.ExternalSource, ownership.MetaCluster, c.ID())
	}
	return nil
}

// purger reads and writes one cluster's nodes. Instances are deleted through
// the consul package's writer (ownership verified on every entry, delete-CAS
// on the index read); a node only by removeNode, conditional on the node as
// read: marked, empty, and unchanged.
type purger struct {
	api         *consulapi.Client
	nodeAPI     nodeCatalog
	cluster     ownership.Cluster
	store       *consul.Client
	claimPrefix string
}

func (p purger) plan(ctx context.Context) (purgePlan, error) {
	claim, held, err := consul.ReadClaim(ctx, p.api, p.claimPrefix, p.cluster.ID())
	if err != nil {
		return purgePlan{}, fmt.Errorf("read the claim of cluster %s: %w", p.cluster.ID(), err)
	}
	nodes, err := p.readNodes(ctx)
	if err != nil || len(nodes) == 0 {
		return purgePlan{Cluster: p.cluster, Claim: claim, ClaimHeld: held}, err
	}
	entries, err := p.store.ReadNode(ctx)
	if err != nil {
		return purgePlan{}, err
	}
	var checks consulapi.HealthChecks
	for _, n := range nodes {
		hc, _, err := p.api.Health().Node(n.Node, (&consulapi.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return purgePlan{}, fmt.Errorf("read checks of node %s: %w", n.Node, err)
		}
		checks = append(checks, hc...)
	}
	plan, err := newPurgePlan(p.cluster, nodes, entries, checks)
	plan.Claim, plan.ClaimHeld = claim, held
	return plan, err
}

// readNodes reads the cluster's nodes: those its node meta lists, and
// k8s-<id> whatever its meta (a node of that name that is not marked as the
// cluster's makes purge refuse, see nodeMarked).
func (p purger) readNodes(ctx context.Context) ([]*consulapi.Node, error) {
	names, err := p.store.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(names, p.cluster.NodeName()) {
		names = append([]string{p.cluster.NodeName()}, names...)
	}
	var out []*consulapi.Node
	for _, name := range names {
		n, _, err := p.api.Catalog().Node(name, (&consulapi.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return nil, fmt.Errorf("read node %s: %w", name, err)
		}
		if n != nil && n.Node != nil {
			out = append(out, n.Node)
		}
	}
	return out, nil
}

// purgeResult is what execute did.
type purgeResult struct {
	Cluster      ownership.Cluster
	Deregistered int
	Services     int
	Txns         int
	NodesRemoved []string   // nodes this purge deleted
	NodesGone    []string   // empty nodes someone else deleted first
	NodesKept    []keptNode // empty when read, but not deleted: why
	ClaimRemoved string     // the claim key removed, if any
	Kept         purgePlan  // what was left on the node after the deletes
}

// keptNode is a node purge found empty and still did not delete.
type keptNode struct {
	Node string
	Why  string
}

func (p purger) execute(ctx context.Context, plan purgePlan) (purgeResult, error) {
	res := purgeResult{Cluster: p.cluster, Services: len(servicesOf(plan.Owned))}
	for round := 1; len(plan.Owned) > 0; round++ {
		applied, err := p.store.Apply(ctx, consul.Change{Deregister: plan.Owned})
		res.Deregistered += applied.Deregistered
		res.Txns += applied.Txns
		if err == nil {
			break
		}
		if !errors.Is(err, consul.ErrConflict) || round == purgeConflictRounds {
			return res, fmt.Errorf("deregister instances of cluster %s: %w", p.cluster.ID(), err)
		}
		// Someone changed an entry since we read it: read again, and
		// verify ownership again, before the next try.
		if plan, err = p.plan(ctx); err != nil {
			return res, err
		}
	}
	after, err := p.plan(ctx)
	if err != nil {
		return res, err
	}
	res.Kept = after
	if len(after.Owned) > 0 {
		return res, fmt.Errorf("%d instances of cluster %s are on %s again: is a fleetsync with --cluster-id=%s still running?",
			len(after.Owned), p.cluster.ID(), after.nodeNames(), p.cluster.ID())
	}
	if err := after.refusal(); err != nil {
		return res, err
	}
	if after.RemovesNode() {
		// The nodes were marked and held nothing just now: delete each
		// one that still is, and is unchanged.
		for _, n := range after.nodes {
			fate, err := removeNode(ctx, p.nodeAPI, p.cluster, n)
			if err != nil {
				return res, err
			}
			switch {
			case fate.removed:
				res.NodesRemoved = append(res.NodesRemoved, n.Node)
			case fate.gone:
				res.NodesGone = append(res.NodesGone, n.Node)
			default:
				res.NodesKept = append(res.NodesKept, keptNode{Node: n.Node, Why: fate.why})
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

// nodeCatalog is the part of the Consul API that removeNode uses.
type nodeCatalog interface {
	CatalogNode(name string, q *consulapi.QueryOptions) (*consulapi.CatalogNode, *consulapi.QueryMeta, error)
	HealthNode(name string, q *consulapi.QueryOptions) (consulapi.HealthChecks, *consulapi.QueryMeta, error)
	Txn(ops consulapi.TxnOps, q *consulapi.QueryOptions) (bool, *consulapi.TxnResponse, *consulapi.QueryMeta, error)
}

type apiNodeCatalog struct{ c *consulapi.Client }

func (a apiNodeCatalog) CatalogNode(name string, q *consulapi.QueryOptions) (*consulapi.CatalogNode, *consulapi.QueryMeta, error) {
	return a.c.Catalog().Node(name, q)
}

func (a apiNodeCatalog) HealthNode(name string, q *consulapi.QueryOptions) (consulapi.HealthChecks, *consulapi.QueryMeta, error) {
	return a.c.Health().Node(name, q)
}

func (a apiNodeCatalog) Txn(ops consulapi.TxnOps, q *consulapi.QueryOptions) (bool, *consulapi.TxnResponse, *consulapi.QueryMeta, error) {
	return a.c.Txn().Txn(ops, q)
}

// purgeFenceMeta is the node meta key removeNode adds before it reads a
// node for the last time (see removeNode).
const purgeFenceMeta = "fleetsync-purging"

// nodeFate is what removeNode did with one node.
type nodeFate struct {
	removed bool   // deleted by us
	gone    bool   // deleted by someone else meanwhile
	why     string // neither: why the node was left
}

// removeNode deletes node, as read when purge found it empty, only if it
// still carries the cluster's mark and holds nothing: Consul deletes a
// node's services and checks with it, so a service registered on it since
// the read would go too. A CAS delete on the index read is not enough for
// that: Consul leaves a node's ModifyIndex alone when a service is
// registered on it with the node's data unchanged (as every fleetsync
// transaction and a plain catalog registration do). So the node is first
// fenced: its meta gets purgeFenceMeta, CAS on the index read (a node
// changed or replaced since is left alone). Any registration that writes
// the node from then on (a catalog registration, an agent's sync, a
// fleetsync transaction: they send the node without the fence) changes it,
// and so its index. The node is then read again, and deleted with a CAS on
// the fenced index only if it is still marked and empty; if not, the fence
// is taken off again (CAS too). Only a write that skips the node (a
// transaction with service ops alone, a registration with SkipNodeUpdate)
// between that read and the delete goes unseen. It returns an error only
// when Consul cannot be asked.
func removeNode(ctx context.Context, api nodeCatalog, c ownership.Cluster, node *consulapi.Node) (nodeFate, error) {
	name := node.Node
	if err := nodeMarked(c, node); err != nil {
		return nodeFate{why: err.Error()}, nil
	}
	fenced := *node
	fenced.Meta = maps.Clone(node.Meta)
	fenced.Meta[purgeFenceMeta] = "true"
	resp, ok, err := nodeTxn(ctx, api, consulapi.NodeCAS, fenced)
	if err != nil {
		return nodeFate{}, fmt.Errorf("fence node %s before deleting it: %w", name, err)
	}
	if !ok || resp == nil || len(resp.Results) == 0 || resp.Results[0].Node == nil {
		now, err := readNode(ctx, api, name)
		switch {
		case err != nil:
			return nodeFate{}, err
		case now == nil:
			return nodeFate{gone: true}, nil
		case now.Node.ModifyIndex != node.ModifyIndex:
			return nodeFate{why: fmt.Sprintf("it changed after purge read it (index %d, now %d), so it is left as it is", node.ModifyIndex, now.Node.ModifyIndex)}, nil
		}
		return nodeFate{why: "Consul refused to fence it before the delete: " + txnErrors(resp)}, nil
	}
	index := resp.Results[0].Node.ModifyIndex
	now, err := readNode(ctx, api, name)
	if err != nil {
		return nodeFate{}, err
	}
	if now == nil {
		return nodeFate{gone: true}, nil
	}
	why, err := nodeInUse(ctx, api, c, now, index)
	if err != nil {
		return nodeFate{}, err
	}
	if why == "" {
		if _, ok, err = nodeTxn(ctx, api, consulapi.NodeDeleteCAS, consulapi.Node{Node: name, ModifyIndex: index}); err != nil {
			return nodeFate{}, fmt.Errorf("delete node %s: %w", name, err)
		}
		if ok {
			return nodeFate{removed: true}, nil
		}
		return nodeFate{why: "it was written to while purge was deleting it, so it is left as it is"}, nil
	}
	unfenced := *node
	unfenced.ModifyIndex = index
	if _, ok, err = nodeTxn(ctx, api, consulapi.NodeCAS, unfenced); err != nil || !ok {
		why += fmt.Sprintf(" (its node meta may still hold %s=true: harmless, gone with the node's next write)", purgeFenceMeta)
	}
	return nodeFate{why: why}, nil
}

// readNode reads node name with its services, consistently; nil when it
// does not exist.
func readNode(ctx context.Context, api nodeCatalog, name string) (*consulapi.CatalogNode, error) {
	n, _, err := api.CatalogNode(name, (&consulapi.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", name, err)
	}
	if n == nil || n.Node == nil {
		return nil, nil
	}
	return n, nil
}

// nodeInUse says why the node read as now must stay ("" when it may go):
// not at the fenced index, no longer marked, or not empty.
func nodeInUse(ctx context.Context, api nodeCatalog, c ownership.Cluster, now *consulapi.CatalogNode, index uint64) (string, error) {
	if now.Node.ModifyIndex != index {
		return "it was written to while purge was deleting it, so it is left as it is", nil
	}
	if err := nodeMarked(c, now.Node); err != nil {
		return err.Error(), nil
	}
	var kept []string
	for _, svc := range now.Services {
		kept = append(kept, fmt.Sprintf("service %s id %s", svc.Service, svc.ID))
	}
	checks, _, err := api.HealthNode(now.Node.Node, (&consulapi.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("read checks of node %s: %w", now.Node.Node, err)
	}
	for _, hc := range checks {
		if hc.ServiceID == "" {
			kept = append(kept, "node check "+hc.CheckID)
		}
	}
	if len(kept) == 0 {
		return "", nil
	}
	sort.Strings(kept)
	return strings.Join(kept, "; ") + " registered on it after purge read it", nil
}

func txnErrors(resp *consulapi.TxnResponse) string {
	if resp == nil || len(resp.Errors) == 0 {
		return "rolled back without errors"
	}
	msgs := make([]string, 0, len(resp.Errors))
	for _, e := range resp.Errors {
		msgs = append(msgs, e.What)
	}
	return strings.Join(msgs, "; ")
}

// nodeTxn sends one node operation as a transaction. ok is false when
// Consul rolled it back (a CAS that failed).
func nodeTxn(ctx context.Context, api nodeCatalog, verb consulapi.NodeOp, node consulapi.Node) (*consulapi.TxnResponse, bool, error) {
	ok, resp, _, err := api.Txn(consulapi.TxnOps{{Node: &consulapi.NodeTxnOp{Verb: verb, Node: node}}},
		(&consulapi.QueryOptions{}).WithContext(ctx))
	return resp, ok, err
}

// removeClaim deletes the id's claim key if no session holds it, CAS on the
// index read.
func (p purger) removeClaim(ctx context.Context) (string, error) {
	prefix := p.claimPrefix
	if prefix == "" {
		prefix = consul.DefaultClaimPrefix
	}
	key := strings.TrimSuffix(prefix, "/") + "/" + p.cluster.ID()
	pair, _, err := p.api.KV().Get(key, (&consulapi.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil || pair == nil {
		return "", err
	}
	if pair.Session != "" {
		return "", fmt.Errorf("refusing to remove claim %s: a running fleetsync took it meanwhile", key)
	}
	ok, _, err := p.api.KV().DeleteCAS(pair, (&consulapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("remove claim %s: %w", key, err)
	}
	if !ok {
		return "", fmt.Errorf("claim %s changed while purging; run purge again", key)
	}
	return key, nil
}

func servicesOf(entries []consul.Registered) map[string]int {
	m := map[string]int{}
	for _, e := range entries {
		m[e.Name]++
	}
	return m
}

func writePurgePlan(w io.Writer, plan purgePlan, yes bool) {
	c := plan.Cluster
	if !plan.NodeFound {
		if plan.RemovesClaim() {
			verb := "would remove"
			if yes {
				verb = "removing"
			}
			fmt.Fprintf(w, "Node %s is not in Consul; %s the released claim of cluster id %s.\n", c.NodeName(), verb, c.ID())
			return
		}
		fmt.Fprintf(w, "Node %s is not in Consul: cluster %s has nothing to purge.\n", c.NodeName(), c.ID())
		return
	}
	verb := "Would deregister"
	if yes {
		verb = "Deregistering"
	}
	by := servicesOf(plan.Owned)
	fmt.Fprintf(w, "%s %d instances of %d services carrying cluster %s's mark, from %s:\n",
		verb, len(plan.Owned), len(by), c.ID(), plan.nodeNames())
	if len(by) > 0 {
		names := make([]string, 0, len(by))
		for n := range by {
			names = append(names, n)
		}
		sort.Strings(names)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SERVICE\tINSTANCES")
		for _, n := range names {
			fmt.Fprintf(tw, "  %s\t%d\n", n, by[n])
		}
		_ = tw.Flush()
	}
	if !yes {
		writeNodeFate(w, plan, false)
		fmt.Fprintf(w, "Dry run: nothing changed. Stop every fleetsync running with --cluster-id=%s, then run again with --yes.\n", c.ID())
	}
}

func writeNodeFate(w io.Writer, plan purgePlan, done bool) {
	c := plan.Cluster
	if plan.RemovesNode() {
		if !done {
			fmt.Fprintf(w, "Would then deregister %s: nothing else is on it.\n", plan.nodeNames())
			if plan.RemovesClaim() {
				fmt.Fprintf(w, "Would then remove the released claim of cluster id %s.\n", c.ID())
			}
		}
		return
	}
	var kept []string
	for _, e := range plan.Foreign {
		kept = append(kept, fmt.Sprintf("service %s id %s", e.Name, e.ID))
	}
	for _, id := range plan.NodeChecks {
		kept = append(kept, "node check "+id)
	}
	verb := "Would keep"
	if done {
		verb = "Kept"
	}
	it := "it"
	if len(plan.Nodes) > 1 {
		it = "them"
	}
	fmt.Fprintf(w, "%s %s: %d entries without cluster %s's mark stay on %s (%s).\n",
		verb, plan.nodeNames(), len(kept), c.ID(), it, strings.Join(kept, "; "))
}

func writePurgeResult(w io.Writer, res purgeResult) {
	if res.Deregistered > 0 || res.Kept.NodeFound || len(res.NodesRemoved) > 0 {
		fmt.Fprintf(w, "Deregistered %d instances of %d services of cluster %s (%d transactions).\n",
			res.Deregistered, res.Services, res.Cluster.ID(), res.Txns)
	}
	if len(res.NodesRemoved) > 0 {
		fmt.Fprintf(w, "Deregistered %s.\n", purgePlan{Cluster: res.Cluster, Nodes: res.NodesRemoved}.nodeNames())
	}
	for _, name := range res.NodesGone {
		fmt.Fprintf(w, "Node %s was deleted by someone else meanwhile.\n", name)
	}
	for _, k := range res.NodesKept {
		fmt.Fprintf(w, "Kept node %s: %s.\n", k.Node, k.Why)
	}
	if len(res.NodesKept) > 0 && res.Kept.Claim != nil && !res.Kept.ClaimHeld {
		fmt.Fprintf(w, "Kept the claim of cluster id %s while a node of the cluster is left; run purge again to look again.\n", res.Cluster.ID())
	}
	if res.Kept.NodeFound && len(res.Kept.Owned) == 0 && !res.Kept.RemovesNode() {
		writeNodeFate(w, res.Kept, true)
	}
	if res.ClaimRemoved != "" {
		fmt.Fprintf(w, "Removed claim %s: the cluster id is free for another Kubernetes cluster.\n", res.ClaimRemoved)
	}
}
