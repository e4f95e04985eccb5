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
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fleetsync/fleetsync/consul/admin"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

// The operator subcommands (status, purge, preflight, acl-setup) reach
// Consul exactly as the daemon does: the same --consul-* connection flags,
// their FLEETSYNC_* variables and Consul's own CONSUL_* variables (see
// conn.Config), and find the cluster-id claims under the same
// --claim-prefix.
var consulConnectionFlags = []string{
	"consul-address", "consul-token", "consul-token-file", "consul-ca-file",
	"consul-client-cert", "consul-client-key", "consul-tls-server-name", "consul-ssl",
	"consul-compression", "claim-prefix",
}

// consulLoginFlags are the daemon's login flags, which status, purge and
// preflight take too (with consul-k8s's CONSUL_LOGIN_* variables); not
// acl-setup, which needs a management token.
var consulLoginFlags = []string{
	"consul-login-auth-method", "consul-login-bearer-token-file", "consul-login-meta",
	"consul-login-datacenter", "consul-login-namespace", "consul-login-partition",
}

// registerConsulFlags defines the daemon's Consul connection flags (and
// --claim-prefix; with login, its login flags) on fs, bound to cfg's
// fields: the definitions (names, usage, defaults) are the daemon's own,
// taken from config.registerFlags.
func registerConsulFlags(fs *flag.FlagSet, cfg *config, login bool) {
	all := flag.NewFlagSet("fleetsync", flag.ContinueOnError)
	cfg.registerFlags(all)
	names := consulConnectionFlags
	if login {
		names = append(slices.Clone(names), consulLoginFlags...)
	}
	for _, name := range names {
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
	for _, name := range append(slices.Clone(consulConnectionFlags), consulLoginFlags...) {
		if fs.Lookup(name) != nil {
			allowed[envName(name)] = true
		}
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

func runStatus(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("fleetsync status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerConsulFlags(fs, &cfg, true)
	output := fs.String("o", "table", "output format: table or json")
	toK8s := fs.Bool("to-k8s", false, "also list the Consul -> Kubernetes objects in the Kubernetes cluster of --kubeconfig/--context: per cluster id and Service, the Services and EndpointSlices carrying a to-k8s mark (mirror or import mode), their endpoints and how many are ready")
	registerKubeFlags(fs, &cfg)
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: fleetsync status [flags]\n\n"+
			"Lists every Kubernetes cluster that fleetsync syncs into this Consul: per cluster id, its node\n"+
			"(k8s-<cluster-id>), the services and instances carrying its ownership mark, their checks, the\n"+
			"entries on its node without the mark, the highest ModifyIndex of the node and its entries\n"+
			"(Consul keeps no write times; deletes leave no index), and its cluster-id claim: held by a\n"+
			"running fleetsync, or released. With --to-k8s, also the Kubernetes objects of the Consul -> Kubernetes\n"+
			"direction (read from --kubeconfig/--context). Read-only.\n\nFlags:\n")
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
	conn, logout, err := openConsul(ctx, cfg, true)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync status:", err)
		return 1
	}
	defer logout()
	inv, err := admin.Inspect(ctx, conn, cfg.ClaimPrefix, ownership.Finder{})
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync status:", err)
		return 1
	}
	rep := statusReport{Consul: conn.URL(), Inventory: inv}
	if *toK8s {
		kube, err := kubeClient(cfg)
		if err == nil {
			rep.ToK8s, err = listMirrored(ctx, kube, k8smark.LabelManagedBy+"="+k8smark.ManagedBy)
		}
		if err != nil {
			fmt.Fprintln(stderr, "fleetsync status:", err)
			return 1
		}
		if rep.ToK8s == nil {
			rep.ToK8s = []*mirrored{}
		}
	}
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

// statusReport is what `fleetsync status` prints: the Consul it read and
// what it found there.
type statusReport struct {
	Consul string `json:"consul"`
	admin.Inventory
	// ToK8s is what status --to-k8s found in Kubernetes (nil without it).
	ToK8s []*mirrored `json:"toK8s,omitempty"`
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
	if rep.ToK8s != nil {
		fmt.Fprintf(w, "\nConsul -> Kubernetes (objects labelled %s=%s):\n", k8smark.LabelManagedBy, k8smark.ManagedBy)
		if err := writeMirroredTable(w, rep.ToK8s); err != nil {
			return err
		}
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

func claimText(c *admin.ClaimStatus) string {
	if c == nil {
		return "none"
	}
	state := "released"
	if c.Held {
		state = "held"
	}
	return fmt.Sprintf("%s by %s (uid %s)", state, c.Holder, c.KubeUID)
}
