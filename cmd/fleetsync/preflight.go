package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/worker"
)

// workerConfig is the worker part of the daemon's flags.
func workerConfig(cfg config, cluster ownership.Cluster, reserved func(string) (string, bool)) worker.Config {
	return worker.Config{
		Cluster: cluster, DefaultWindow: cfg.Window, ServicePrefix: cfg.ServicePrefix,
		AddNamespaceSuffix: cfg.AddNamespaceSuffix, K8sTag: cfg.K8sTag,
		Terminating: worker.TerminatingPolicy(cfg.Terminating), RegisterNotReady: cfg.RegisterNotReady,
		ReservedTag:  reserved,
		NodePortSync: worker.NodePortSyncType(cfg.NodePortSyncType), SyncLoadBalancerEndpoints: cfg.SyncLBEndpoints,
		EnableIngress: cfg.EnableIngress, IngressLoadBalancerIPs: cfg.IngressLBIPs, ConsulK8sMeta: cfg.ConsulK8sMeta,
		StrictAnnotations: cfg.StrictAnnotations,
	}
}

// selector is the Service selection of the daemon's flags.
func selector(cfg config) supervisor.Selector {
	return supervisor.Selector{DefaultSync: cfg.DefaultSync, Allow: cfg.AllowNamespaces.values, Deny: cfg.DenyNamespaces.values, SkipClusterIP: !cfg.SyncClusterIP}
}

type noHandler struct{}

func (noHandler) Changed(k8s.Key) {}

// runPreflight is `fleetsync preflight`: read-only, it compares what
// consul-k8s's catalog sync registered (its node) with what fleetsync,
// run with the same flags, would register, per Service. Exit 1 when some
// Service would lose instances in Consul.
func runPreflight(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("fleetsync preflight", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg.registerFlags(fs)
	node := fs.String("consul-k8s-node-name", "k8s-sync", "the Consul node consul-k8s's catalog sync registers on (its -consul-node-name; chart syncCatalog.consulNodeName)")
	output := fs.String("o", "table", "output: table or json")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: fleetsync preflight --cluster-id=ID [daemon flags] [--consul-k8s-node-name=k8s-sync] [-o table|json]\n\n"+
			"Before switching from consul-k8s: reads the cluster's Services (with the daemon flags given, as\n"+
			"fleetsync would run) and what consul-k8s registered on its Consul node, and prints per Service\n"+
			"what would change: instances (address:port) that would disappear or appear, names, tags, meta,\n"+
			"the check; Services consul-k8s syncs and fleetsync would not, and why; settings whose defaults\n"+
			"differ. Read-only. Exit 1 when anything would disappear from Consul, 0 otherwise.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := cfg.parse(fs, args, os.Getenv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "fleetsync preflight:", err)
		return 2
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(stderr, "fleetsync preflight:", err)
		return 2
	}
	if *output != "table" && *output != "json" {
		fmt.Fprintf(stderr, "fleetsync preflight: -o %q: must be table or json\n", *output)
		return 2
	}
	rep, err := preflight(cfg, *node, *timeout)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync preflight:", err)
		return 1
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = writePreflightTable(stdout, rep)
	}
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync preflight:", err)
		return 1
	}
	if rep.Disappearing > 0 {
		return 1
	}
	return 0
}

// preflight reads Kubernetes and Consul and compares them.
func preflight(cfg config, node string, timeout time.Duration) (preflightReport, error) {
	ctx, cancel := commandContext(timeout)
	defer cancel()
	cluster, err := ownership.New(cfg.ClusterID)
	if err != nil {
		return preflightReport{}, err
	}
	restCfg, err := kubeConfig(cfg)
	if err != nil {
		return preflightReport{}, fmt.Errorf("kubernetes config: %w", err)
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return preflightReport{}, fmt.Errorf("kubernetes client: %w", err)
	}
	conn, logout, err := openConsul(ctx, cfg, true)
	if err != nil {
		return preflightReport{}, err
	}
	defer logout()
	entries, err := conn.ForeignEntries(ctx, node)
	if err != nil {
		return preflightReport{}, err
	}
	w := k8s.NewWatcherWith(kube, k8s.WatcherOptions{Nodes: true, Ingresses: cfg.EnableIngress})
	w.SetHandler(noHandler{})
	wctx, stop := context.WithCancel(ctx)
	defer func() { stop(); w.Wait() }()
	w.Start(wctx)
	if !w.WaitForSync(ctx) {
		return preflightReport{}, fmt.Errorf("kubernetes: the Service and EndpointSlice lists did not complete: %w", ctx.Err())
	}
	sel, wcfg := selector(cfg), workerConfig(cfg, cluster, nil)
	var in []preflightInput
	for _, key := range w.Keys() {
		svc, ok, err := w.Service(key)
		if err != nil || !ok {
			continue
		}
		x := preflightInput{svc: svc, selected: sel.Selected(svc)}
		x.spec, x.err = worker.Desired(svc, wcfg)
		in = append(in, x)
	}
	return comparePreflight(cfg, sel, in, entries, node), nil
}

func writePreflightTable(w io.Writer, rep preflightReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tSERVICE\tCONSUL NAME\tVERDICT\tCONSUL-K8S\tFLEETSYNC\tDETAILS")
	for _, s := range rep.Services {
		details := s.Differences
		if s.Reason != "" {
			details = append([]string{s.Reason}, details...)
		}
		if len(s.Missing) > 0 && len(s.Fleetsync) > 0 {
			details = append(details, "would disappear: "+strings.Join(s.Missing, " "))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", s.Namespace, dash(s.Service), s.Name, s.Verdict, len(s.ConsulK8s), len(s.Fleetsync), strings.Join(details, "; "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nconsul-k8s's node %s compared with what fleetsync would register as cluster %s.\n", rep.ConsulK8sNode, rep.ClusterID)
	for _, s := range rep.Settings {
		fmt.Fprintln(w, "Setting:", s)
	}
	if rep.Disappearing > 0 {
		fmt.Fprintf(w, "%d Services would lose instances in Consul after the switch.\n", rep.Disappearing)
	} else {
		fmt.Fprintln(w, "Nothing consul-k8s registered would disappear.")
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
