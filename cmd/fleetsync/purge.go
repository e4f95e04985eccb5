package main

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/ownership"
)

func runPurge(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("fleetsync purge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerConsulFlags(fs, &cfg, true)
	clusterID := fs.String("cluster-id", "", "the cluster whose instances and node to remove (required; never read from FLEETSYNC_CLUSTER_ID)")
	yes := fs.Bool("yes", false, "do it; without --yes purge only prints what it would do")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	toK8s := fs.Bool("to-k8s", false, "remove instead the cluster's Consul -> Kubernetes objects from the Kubernetes cluster of --kubeconfig/--context: every Service and EndpointSlice carrying the id's to-k8s mark; refused, as without --to-k8s, while a running fleetsync holds the id's claim (read in the Consul of the Consul flags; nothing is written there)")
	registerKubeFlags(fs, &cfg)
	waitReleased := fs.Duration("wait-released", 0, "while a running fleetsync holds the id's claim, wait up to this long for it to stop (a Deployment being deleted) instead of refusing at once (with --to-k8s: with --yes only; its dry run lists without waiting)")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: fleetsync purge --cluster-id=ID [--to-k8s] [--yes] [flags]\n\n"+
			"Removes from Consul every instance carrying cluster ID's ownership mark, then its node k8s-<ID>\n"+
			"and its cluster-id claim if nothing else is left on the node: for a Kubernetes cluster that is\n"+
			"gone for good. Without --yes it only prints what it would do. Entries without the mark, and every\n"+
			"other cluster's, are never touched. Refused while a running fleetsync holds the id's claim.\n"+
			"With --to-k8s: removes the Kubernetes Services and EndpointSlices that cluster ID's Consul -> Kubernetes\n"+
			"direction made (carrying its mark), each deleted only as read (UID and resourceVersion preconditions);\n"+
			"import-mode Services are the user's and stay. Refused too while a running fleetsync holds the id's claim\n"+
			"(it would make them again): the claim is read in Consul, so the Consul flags apply; the dry run still lists.\n\nFlags:\n")
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
	if *toK8s {
		return purgeToK8s(ctx, cfg, cluster, *yes, *waitReleased, stdout, stderr)
	}
	conn, logout, err := openConsul(ctx, cfg, true)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync purge:", err)
		return 1
	}
	defer logout()
	p := admin.NewPurger(conn, cluster, cfg.ClaimPrefix)
	plan, err := planWhenReleased(ctx, p.Plan, *waitReleased, clock.RealClock{}, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync purge:", err)
		return 1
	}
	writePurgePlan(stdout, plan, *yes)
	if !*yes || (!plan.NodeFound && !plan.RemovesClaim()) {
		return 0
	}
	res, err := p.Execute(ctx, plan)
	writePurgeResult(stdout, res)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync purge:", err)
		return 1
	}
	return 0
}

func writePurgePlan(w io.Writer, plan admin.PurgePlan, yes bool) {
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
	by := plan.ByService()
	fmt.Fprintf(w, "%s %d instances of %d services carrying cluster %s's mark, from %s:\n",
		verb, len(plan.Owned), len(by), c.ID(), plan.NodeNames())
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

func writeNodeFate(w io.Writer, plan admin.PurgePlan, done bool) {
	c := plan.Cluster
	if plan.RemovesNode() {
		if !done {
			fmt.Fprintf(w, "Would then deregister %s: nothing else is on it.\n", plan.NodeNames())
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
		verb, plan.NodeNames(), len(kept), c.ID(), it, strings.Join(kept, "; "))
}

func writePurgeResult(w io.Writer, res admin.PurgeResult) {
	if res.Deregistered > 0 || res.Kept.NodeFound || len(res.NodesRemoved) > 0 {
		fmt.Fprintf(w, "Deregistered %d instances of %d services of cluster %s (%d transactions).\n",
			res.Deregistered, res.Services, res.Cluster.ID(), res.Txns)
	}
	if len(res.NodesRemoved) > 0 {
		fmt.Fprintf(w, "Deregistered %s.\n", admin.PurgePlan{Cluster: res.Cluster, Nodes: res.NodesRemoved}.NodeNames())
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
