package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/fence"
	"github.com/fleetsync/fleetsync/consul/namespaces"
)

// consulConn is fleetsync's way into Consul: the connection (addresses,
// token or login, TLS), the scope, the auth method it logs in with ("":
// none), and what creates the scope's missing namespaces (nil: none).
type consulConn struct {
	*conn.Conn
	scope      consul.Scope
	authMethod string
	namespaces *namespaces.Ensurer
}

// consulConnConfig is the connection part of the flags.
func consulConnConfig(cfg config) conn.Config {
	return conn.Config{
		Addresses: cfg.ConsulAddr.values, Token: cfg.ConsulToken, TokenFile: cfg.ConsulTokenFile,
		CAFile: cfg.ConsulCACert, CertFile: cfg.ConsulCert, KeyFile: cfg.ConsulKey, TLSServerName: cfg.ConsulTLSName,
		SSL: cfg.ConsulSSL, Datacenter: cfg.ConsulDatacenter, Compression: cfg.ConsulGzip,
	}
}

// consulScope is the namespace and partition of the flags, else of
// $CONSUL_NAMESPACE and $CONSUL_PARTITION.
func consulScope(cfg config, getenv func(string) string) consul.Scope {
	s := consul.Scope{Namespace: cfg.ConsulNamespace, Partition: cfg.ConsulPartition,
		MirrorNamespaces: cfg.mirroring(), MirrorPrefix: cfg.MirrorPrefix}
	if s.Namespace == "" && !s.MirrorNamespaces {
		s.Namespace = getenv(conn.NamespaceEnv)
	}
	if s.Partition == "" {
		s.Partition = getenv(conn.PartitionEnv)
	}
	return s
}

func newConsulConn(ctx context.Context, cfg config, log hclog.Logger) (*consulConn, error) {
	cc := &consulConn{scope: consulScope(cfg, os.Getenv)}
	login, err := consulLogin(cfg, cc.scope.Partition, os.Getenv)
	if err != nil {
		return nil, err
	}
	if login != nil {
		cc.authMethod = login.AuthMethod
	}
	connCfg, err := connConfig(cfg)
	if err != nil {
		return nil, err
	}
	cn, err := conn.Dial(ctx, connCfg, conn.DialOptions{Log: log, Login: login})
	if err != nil {
		return nil, err
	}
	cc.Conn = cn
	cc.namespaces = newNamespaceEnsurer(cfg, cn, cc.scope, log.Named("consul-namespaces"))
	return cc, nil
}

// start logs in (with a login auth method), checks the scope and the
// token's permissions on perms, retrying while Consul cannot be reached
// (conn.Conn.Start); a permission the policy lacks is explained.
func (cc *consulConn) start(ctx context.Context, cfg config, store *consul.Client, perms []conn.Permission, log hclog.Logger) error {
	err := cc.Start(ctx, cc.checkScope(store), cc.scope.Partition, perms, log)
	if errors.Is(err, conn.ErrNotPermitted) {
		return cc.permissionError(cfg, "check the Consul ACL token's permissions", err)
	}
	return err
}

// logout ends the login token (at shutdown).
func (cc *consulConn) logout(log hclog.Logger) {
	if cc.authMethod == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cc.Tokens().Logout(ctx); err != nil {
		log.Warn("Cannot log out of Consul; the token expires with the auth method's max token TTL, if any", "error", err)
	}
}

// permissionError explains a request Consul refused for lack of ACL
// permission: which token, and what its policy must grant.
func (cc *consulConn) permissionError(cfg config, what string, err error) error {
	from := "the configured token"
	if cc.authMethod != "" {
		from = fmt.Sprintf("the token of auth method %q (accessor %s; its policies come from the auth method's binding rules)", cc.authMethod, cc.Tokens().Accessor())
	}
	toK8s := ""
	if cfg.ToK8s.Enabled || cfg.ToK8s.Import {
		toK8s = `, and for --to-k8s service_prefix "" and node_prefix "" read (docs/consul-access.md; fleetsync acl-setup --to-k8s)`
	}
	return fmt.Errorf("%s: Consul refused it for lack of ACL permission of %s: %w. The policy must grant key:write on %q, session:write, node:write on k8s-%s and k8s-%s.*, and service:write on the synced names (docs/operations.md, \"Consul ACL policy\")%s",
		what, from, err, strings.TrimSuffix(cfg.ClaimPrefix, "/")+"/", cfg.ClusterID, cfg.ClusterID, toK8s)
}

// withPodMeta adds pod=<namespace>/<name> (from POD_NAMESPACE and POD_NAME,
// the chart's and kustomize base's downward API variables) to the login
// token's meta, as consul-k8s's components do, unless meta names a pod.
func withPodMeta(meta map[string]string, getenv func(string) string) map[string]string {
	ns, name := getenv("POD_NAMESPACE"), getenv("POD_NAME")
	if _, ok := meta["pod"]; ok || ns == "" || name == "" {
		return meta
	}
	if meta == nil {
		meta = map[string]string{}
	}
	meta["pod"] = ns + "/" + name
	return meta
}

// neededPermissions are the checks made at start: node:write on the
// cluster's first node (and on its second with --consul-nodes > 1: the
// node_prefix rule), key:write on the claim key with --claim-cluster-id,
// and with either to-k8s mode service:read and node:read of any name.
func neededPermissions(cfg config, first string) []conn.Permission {
	nodes := []string{first}
	if cfg.ConsulNodes > 1 {
		nodes = append(nodes, first+".1")
	}
	claimKey := ""
	if cfg.Claim {
		claimKey = strings.TrimSuffix(cfg.ClaimPrefix, "/") + "/" + cfg.ClusterID
	}
	out := conn.NeededPermissions(nodes, claimKey)
	if cfg.Shard.Shards > 1 {
		// The shards' fencing tokens (consul/fence), under the claim prefix.
		out = append(out, conn.Permission{Resource: "key", Segment: fence.Key(cfg.ClaimPrefix, cfg.ClusterID, 0), Access: "write"})
	}
	if cfg.ToK8s.Enabled || cfg.ToK8s.Import {
		// Read of every service and node: asked of names nobody has.
		out = append(out, conn.Permission{Resource: "service", Segment: toK8sProbe, Access: "read"},
			conn.Permission{Resource: "node", Segment: toK8sProbe, Access: "read"})
	}
	return out
}

// toK8sProbe is the name the start's permission check asks service:read
// and node:read of for the Consul -> Kubernetes direction: read of any
// name (service_prefix "" and node_prefix "") grants it.
const toK8sProbe = "fleetsync-to-k8s-read-probe"
