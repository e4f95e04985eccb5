package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/fleetsync/fleetsync/consul/aclsetup"
	"github.com/fleetsync/fleetsync/ownership"
)

// runACLSetup is `fleetsync acl-setup`: with a management token, create
// the policy, role and binding rule one cluster's fleetsync needs
// (package aclsetup), idempotently, and print what it did.
func runACLSetup(args []string, stdout, stderr io.Writer) int {
	var cfg config
	fs := flag.NewFlagSet("fleetsync acl-setup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	registerConsulFlags(fs, &cfg, false)
	var ac aclsetup.Config
	fs.StringVar(&ac.ClusterID, "cluster-id", "", "the cluster fleetsync runs for (required; never read from FLEETSYNC_CLUSTER_ID)")
	fs.StringVar(&ac.AuthMethod, "auth-method", "", "the Kubernetes auth method fleetsync logs in with (--consul-login-auth-method; consul-k8s: <release>-consul-k8s-component-auth-method): bind fleetsync's ServiceAccount to the role; without it, only the policy and the role (for a token: consul acl token create -role-name fleetsync-<cluster-id>)")
	fs.StringVar(&ac.ServiceAccount, "service-account", "fleetsync", "fleetsync's ServiceAccount, which the binding rule selects (the chart's: the release's full name)")
	fs.StringVar(&ac.Namespace, "service-account-namespace", "fleetsync", "the ServiceAccount's namespace")
	fs.StringVar(&ac.ServicePrefix, "service-prefix-rule", "", "grant service:write only on Consul names starting with this ('': every name)")
	fs.BoolVar(&ac.ToK8s, "to-k8s", false, "also grant what the Consul -> Kubernetes direction reads (--to-k8s, --to-k8s-import): service_prefix \"\" and node_prefix \"\" read")
	timeout := fs.Duration("timeout", time.Minute, "give up after this long")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: fleetsync acl-setup --cluster-id=ID [--auth-method=NAME] [flags]\n\n"+
			"With a management token (CONSUL_HTTP_TOKEN or --consul-token-file), creates what the fleetsync of\n"+
			"cluster ID needs and nothing more: the policy fleetsync-<ID> (its nodes, the synced service names,\n"+
			"the claim's session and key under --claim-prefix), the role fleetsync-<ID> with it, and with\n"+
			"--auth-method a binding rule that gives fleetsync's ServiceAccount the role when it logs in.\n"+
			"Idempotent: run it again after a change of flags; it prints what it created, updated or left.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if code, ok := parseSubcommand(fs, &cfg, args, stderr); !ok {
		return code
	}
	ac.ClaimPrefix = cfg.ClaimPrefix
	if ac.ClusterID == "" {
		fmt.Fprintln(stderr, "fleetsync acl-setup: --cluster-id is required")
		return 2
	}
	if err := ownership.ValidateClusterID(ac.ClusterID); err != nil {
		fmt.Fprintln(stderr, "fleetsync acl-setup: --cluster-id:", err)
		return 2
	}
	if err := ac.Validate(); err != nil {
		fmt.Fprintln(stderr, "fleetsync acl-setup:", err)
		return 2
	}
	ctx, cancel := commandContext(*timeout)
	defer cancel()
	conn, _, err := openConsul(ctx, cfg, false)
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync acl-setup:", err)
		return 1
	}
	changes, err := conn.SetupACL(ctx, ac)
	for _, c := range changes {
		fmt.Fprintln(stdout, c)
	}
	if err != nil {
		fmt.Fprintln(stderr, "fleetsync acl-setup:", err)
		return 1
	}
	fmt.Fprintf(stdout, "Policy %s rules:\n%s", ac.Name(), aclsetup.Rules(ac))
	if ac.AuthMethod != "" {
		fmt.Fprintf(stdout, "fleetsync logs in with --consul-login-auth-method=%s as ServiceAccount %s/%s.\n", ac.AuthMethod, ac.Namespace, ac.ServiceAccount)
	}
	return 0
}
