package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/ownership"
)

// The operator subcommands (status, purge) reach Consul exactly as the
// daemon does: the same --consul-* connection flags, their FLEETSYNC_*
// variables and Consul's own CONSUL_* variables (see consulConfig), and
// find the cluster-id claims under the same --claim-prefix.
var consulConnectionFlags = []string{
	"consul-address", "consul-token", "consul-token-file", "consul-ca-file",
	"consul-client-cert", "consul-client-key", "consul-tls-server-name", "consul-ssl",
	"claim-prefix",
}

// registerConsulFlags defines the daemon's Consul connection flags (and
// --claim-prefix) on fs, bound to cfg's fields: the definitions (names,
// usage, defaults) are the daemon's own, taken from config.registerFlags.
func registerConsulFlags(fs *flag.FlagSet, cfg *config) {
	all := flag.NewFlagSet("fleetsync", flag.ContinueOnError)
	cfg.registerFlags(all)
	for _, name := range consulConnectionFlags {
		f := all.Lookup(name)
		fs.Var(f.Value, f.Name, f.Usage)
	}
}

// parseSubcommand applies the FLEETSYNC_* variables of the Consul connection
// flags only (so that, say, FLEETSYNC_CLUSTER_ID in a daemon's environment
// never picks purge's target), then the args. It returns false with the exit
// code when the command must stop here.
func parseSubcommand(fs *flag.FlagSet, cfg *config, args []string, stderr io.Writer) (int, bool) {
	allowed := map[string]bool{}
	for _, name := range consulConnectionFlags {
		allowed[envName(name)] = true
	}
	env := func(k string) string {
		if !allowed[k] {
			return ""
		}
		return os.Getenv(k)
	}
	if err := cfg.parse(fs, args, env); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		fmt.Fprintf(stderr, "%s: %v\n", fs.Name(), err)
		return 2, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return 2, false
	}
	return 0, true
}

// envName is the variable config.parse reads for a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// commandContext is cancelled by SIGINT/SIGTERM and after timeout.
func commandContext(timeout time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	return ctx, func() { cancel(); stop() }
}

func consulURL(c *consulapi.Config) string {
	scheme := c.Scheme
	if scheme == "" {
		scheme = "http"
	}
	return scheme + "://" + c.Address
}

func runStatus(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("fleetsync status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerConsulFlags(fs, &cfg)
	output := fs.String("o", "table", "output format: table or json")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: fleetsync status [flags]\n\n"+
			"Lists every Kubernetes cluster that fleetsync syncs into this Consul: per cluster id, its node\n"+
			"(k8s-<cluster-id>), the services and instances carrying its ownership mark, their checks, the\n"+
			"entries on its node without the mark, the highest ModifyIndex of the node and its entries\n"+
			"(Consul keeps no write times; deletes leave no index), and its cluster-id claim: held by a\n"+
			"running fleetsync, or released. Read-only.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := parseSubcommand(fs, &cfg, args, stderr); !ok {
		return code
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "fleetsync status: -o %q: must be table or json\n", *output)
		return 2
	}
	ctx, cancel := commandContext(*timeout)
	defer cancel()
	ccfg := consulConfig(cfg)
	capi, err := consulapi.NewClient(ccfg)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync status: consul client:", err)
		return 1
	}
	rep, err := readStatus(ctx, capi, cfg.ClaimPrefix)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync status:", err)
		return 1
	}
	rep.Consul = consulURL(ccfg)
	if *output == "json" {
		err = writeStatusJSON(stdout, rep)
	} else {
		err = writeStatusTable(stdout, rep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync status:", err)
		return 1
	}
	return 0
}

// statusReport is what `fleetsync status` prints.
type statusReport struct {
	Consul   string          `json:"consul"`
	Index    uint64          `json:"index"` // the catalog's index when read
	Clusters []clusterStatus `json:"clusters"`
	// Other nodes with external-source=kubernetes that are no fleetsync
	// cluster's node (consul-k8s's k8s-sync, for one).
	Others []otherNode `json:"other_nodes"`
}

type clusterStatus struct {
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
	Claim *claimStatus `json:"claim"`
}

type claimStatus struct {
	consul.ClaimValue
	Held bool `json:"held"` // a live session (a running fleetsync) holds it
}

type otherNode struct {
	Node    string `json:"node"`
	Entries int    `json:"entries"`
}

func readStatus(ctx context.Context, capi *consulapi.Client, claimPrefix string) (statusReport, error) {
	q := (&consulapi.QueryOptions{NodeMeta: map[string]string{ownership.MetaExternalSource: ownership.ExternalSource}}).WithContext(ctx)
	nodes, meta, err := capi.Catalog().Nodes(q)
	if err != nil {
		return statusReport{}, fmt.Errorf("list nodes with meta %s=%s: %w", ownership.MetaExternalSource, ownership.ExternalSource, err)
	}
	rep := statusReport{Index: meta.LastIndex, Clusters: []clusterStatus{}, Others: []otherNode{}}
	seen := map[string]bool{}
	type found struct {
		cluster ownership.Cluster
		index   uint64
		nodes   int
	}
	var clusters []*found
	byID := map[string]*found{}
	for _, n := range nodes {
		if cluster, ok := clusterOfNode(n); ok {
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
		list, _, err := capi.Catalog().NodeServiceList(n.Node, (&consulapi.QueryOptions{}).WithContext(ctx))
		if err != nil {
			return statusReport{}, fmt.Errorf("read services of node %s: %w", n.Node, err)
		}
		o := otherNode{Node: n.Node}
		if list != nil {
			o.Entries = len(list.Services)
		}
		rep.Others = append(rep.Others, o)
	}
	for _, f := range clusters {
		entries, err := consul.NewClient(capi, f.cluster, consul.Options{}).ReadNode(ctx)
		if err != nil {
			return statusReport{}, err
		}
		s := summarize(f.cluster, f.index, entries)
		s.Nodes = f.nodes
		rep.Clusters = append(rep.Clusters, s)
		seen[f.cluster.ID()] = true
	}
	// Claimed ids without a node (nothing written yet, or purged) are
	// clusters too.
	ids, err := claimedIDs(ctx, capi, claimPrefix)
	if err != nil {
		return statusReport{}, err
	}
	for _, id := range ids {
		if ownership.ValidateClusterID(id) == nil && !seen[id] {
			rep.Clusters = append(rep.Clusters, clusterStatus{ClusterID: id, InstancesByService: map[string]int{}})
		}
	}
	for i := range rep.Clusters {
		c := &rep.Clusters[i]
		v, held, err := consul.ReadClaim(ctx, capi, claimPrefix, c.ClusterID)
		if err != nil {
			return statusReport{}, fmt.Errorf("read the claim of cluster %s: %w", c.ClusterID, err)
		}
		if v != nil {
			c.Claim = &claimStatus{ClaimValue: *v, Held: held}
		}
	}
	sort.Slice(rep.Clusters, func(i, j int) bool { return rep.Clusters[i].ClusterID < rep.Clusters[j].ClusterID })
	sort.Slice(rep.Others, func(i, j int) bool { return rep.Others[i].Node < rep.Others[j].Node })
	return rep, nil
}

// claimedIDs lists the cluster ids that have a claim key under prefix.
func claimedIDs(ctx context.Context, capi *consulapi.Client, prefix string) ([]string, error) {
	if prefix == "" {
		prefix = consul.DefaultClaimPrefix
	}
	prefix = strings.TrimSuffix(prefix, "/") + "/"
	keys, _, err := capi.KV().Keys(prefix, "/", (&consulapi.QueryOptions{}).WithContext(ctx))
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

// clusterOfNode returns the cluster whose synthetic node n is: node meta
// external-source=kubernetes and k8s-cluster=<id>, named k8s-<id> or
// k8s-<id>.<n>.
func clusterOfNode(n *consulapi.Node) (ownership.Cluster, bool) {
	if n.Meta[ownership.MetaExternalSource] != ownership.ExternalSource {
		return ownership.Cluster{}, false
	}
	c, err := ownership.New(n.Meta[ownership.MetaCluster])
	if err != nil || !c.IsNode(n.Node) {
		return ownership.Cluster{}, false
	}
	return c, true
}

// summarize counts what is on one cluster's node.
func summarize(c ownership.Cluster, nodeIndex uint64, entries []consul.Registered) clusterStatus {
	s := clusterStatus{ClusterID: c.ID(), Node: c.NodeName(), LastWriteIndex: nodeIndex, InstancesByService: map[string]int{}}
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

func writeStatusJSON(w io.Writer, rep statusReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

func writeStatusTable(w io.Writer, rep statusReport) error {
	if len(rep.Clusters) == 0 {
		fmt.Fprintf(w, "No fleetsync cluster in Consul at %s (no node k8s-<id> with meta %s=%s and %s=<id>).\n",
			rep.Consul, ownership.MetaExternalSource, ownership.ExternalSource, ownership.MetaCluster)
	} else {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CLUSTER\tNODE\tSERVICES\tINSTANCES\tPASSING\tWARNING\tCRITICAL\tFOREIGN\tLAST WRITE INDEX\tCLAIM")
		for _, c := range rep.Clusters {
			node := c.Node
			switch {
			case node == "":
				node = "-"
			case c.Nodes > 1:
				node = fmt.Sprintf("%s (+%d)", node, c.Nodes-1)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", c.ClusterID, node, c.Services, c.Instances,
				c.Passing, c.Warning, c.Critical, c.Foreign, c.LastWriteIndex, claimText(c.Claim))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "\nConsul %s, catalog index %d. FOREIGN: entries on the node without the cluster's mark (fleetsync never touches them).\n"+
			"CLAIM: held (a fleetsync runs) or released, by the Kubernetes cluster with that kube-system UID.\n",
			rep.Consul, rep.Index)
	}
	if len(rep.Others) > 0 {
		fmt.Fprintf(w, "\nOther nodes with %s=%s (not fleetsync's; consul-k8s writes to k8s-sync):\n", ownership.MetaExternalSource, ownership.ExternalSource)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NODE\tENTRIES")
		for _, o := range rep.Others {
			fmt.Fprintf(tw, "  %s\t%d\n", o.Node, o.Entries)
		}
		return tw.Flush()
	}
	return nil
}

func claimText(c *claimStatus) string {
	if c == nil {
		return "none"
	}
	state := "released"
	if c.Held {
		state = "held"
	}
	return fmt.Sprintf("%s by %s (uid %s)", state, c.Holder, c.KubeUID)
}
