package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul"
)

// consulConn is fleetsync's way into Consul: the addresses, the token (a
// static one, or a login), the datacenter and the scope.
type consulConn struct {
	cfg     *consulapi.Config
	api     *consulapi.Client
	tokens  *consul.TokenSource
	servers *consul.Servers
	scope   consul.Scope
	login   bool
}

// consulAddresses splits the --consul-address values (or the default) into
// host:port and the scheme they ask for.
func consulAddresses(cfg config, def string) (addrs []string, scheme string, err error) {
	values := cfg.ConsulAddr.values
	if len(values) == 0 {
		values = []string{def}
	}
	for _, v := range values {
		s := ""
		switch {
		case strings.HasPrefix(v, "https://"):
			s, v = "https", strings.TrimPrefix(v, "https://")
		case strings.HasPrefix(v, "http://"):
			s, v = "http", strings.TrimPrefix(v, "http://")
		}
		v = strings.TrimSuffix(v, "/")
		if s != "" && scheme != "" && s != scheme {
			return nil, "", fmt.Errorf("--consul-address: every address must use the same scheme (%s and %s given)", scheme, s)
		}
		if s != "" {
			scheme = s
		}
		addrs = append(addrs, v)
	}
	return addrs, scheme, nil
}

// consulScope is the namespace and partition of the flags, else of
// $CONSUL_NAMESPACE and $CONSUL_PARTITION.
func consulScope(cfg config, getenv func(string) string) consul.Scope {
	s := consul.Scope{Namespace: cfg.ConsulNamespace, Partition: cfg.ConsulPartition,
		MirrorNamespaces: cfg.MirrorNamespaces, MirrorPrefix: cfg.MirrorPrefix}
	if s.Namespace == "" && !s.MirrorNamespaces {
		s.Namespace = getenv(consulapi.HTTPNamespaceEnvName)
	}
	if s.Partition == "" {
		s.Partition = getenv(consulapi.HTTPPartitionEnvName)
	}
	return s
}

func newConsulConn(ctx context.Context, cfg config, log hclog.Logger) (*consulConn, error) {
	ccfg := consulConfig(cfg)
	addrs, scheme, err := consulAddresses(cfg, ccfg.Address)
	if err != nil {
		return nil, err
	}
	if scheme != "" {
		ccfg.Scheme = scheme
	}
	servers, err := consul.NewServers(ctx, addrs, consul.ServersOptions{Log: log.Named("consul-servers")})
	if err != nil {
		return nil, fmt.Errorf("--consul-address: %w", err)
	}
	cc := &consulConn{cfg: ccfg, servers: servers, scope: consulScope(cfg, os.Getenv), login: cfg.LoginAuthMethod != ""}
	token, tokenFile := ccfg.Token, ccfg.TokenFile
	if cc.login {
		token, tokenFile = "", "" // validate refused the flags; $CONSUL_HTTP_TOKEN* lose to the login
	}
	if cc.tokens, err = consul.NewTokenSource(token, tokenFile, log.Named("consul-token")); err != nil {
		return nil, err
	}
	if cc.api, err = consul.NewAPIClient(ccfg, cc.tokens, servers); err != nil {
		return nil, fmt.Errorf("consul client: %w", err)
	}
	if cc.login {
		meta, _ := cfg.loginMeta() // validated
		meta = withPodMeta(meta, os.Getenv)
		cc.tokens.UseLogin(cc.api, consul.LoginConfig{
			AuthMethod: cfg.LoginAuthMethod, BearerTokenFile: cfg.LoginBearerTokenFile, Meta: meta,
			Datacenter: cfg.LoginDatacenter, Partition: cc.scope.Partition,
		})
	}
	return cc, nil
}

// start logs in (with a login auth method), checks the scope and the
// token's permissions on perms, retrying while Consul cannot be reached; it
// returns an error only for what no retry mends (the login refused, a
// namespace Consul does not have, a permission the policy lacks), and nil
// when ctx ends first.
func (cc *consulConn) start(ctx context.Context, cfg config, store *consul.Client, perms []consul.Permission, log hclog.Logger) error {
	backoff := 500 * time.Millisecond
	loggedIn := !cc.login
	for {
		var err error
		if !loggedIn {
			if err = cc.tokens.Login(ctx); err == nil {
				loggedIn = true
			} else if errors.Is(err, consul.ErrLogin) {
				return err
			}
		}
		if loggedIn {
			if err = store.CheckScope(ctx); err == nil {
				err = consul.Permissions(ctx, cc.cfg.HttpClient, cc.cfg, cc.scope, perms)
				if err == nil {
					return nil
				}
				if errors.Is(err, consul.ErrNotPermitted) {
					return cc.permissionError(cfg, "check the Consul ACL token's permissions", err)
				}
			}
			if errors.Is(err, consul.ErrEnterpriseOnly) {
				return err
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("Cannot reach Consul yet; retrying", "retry_in", backoff, "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}

// logout ends the login token (at shutdown).
func (cc *consulConn) logout(log hclog.Logger) {
	if !cc.login {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cc.tokens.Logout(ctx); err != nil {
		log.Warn("Cannot log out of Consul; the token expires with the auth method's max token TTL, if any", "error", err)
	}
}

// permissionError explains a request Consul refused for lack of ACL
// permission: which token, and what its policy must grant.
func (cc *consulConn) permissionError(cfg config, what string, err error) error {
	from := "the configured token"
	if cc.login {
		from = fmt.Sprintf("the token of auth method %q (accessor %s; its policies come from the auth method's binding rules)", cfg.LoginAuthMethod, cc.tokens.Accessor())
	}
	return fmt.Errorf("%s: Consul refused it for lack of ACL permission of %s: %w. The policy must grant key:write on %q, session:write, node:write on k8s-%s and k8s-%s.*, and service:write on the synced names (docs/operations.md, \"Consul ACL policy\")",
		what, from, err, strings.TrimSuffix(cfg.ClaimPrefix, "/")+"/", cfg.ClusterID, cfg.ClusterID)
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
// node_prefix rule), key:write on the claim key with --claim-cluster-id.
func neededPermissions(cfg config, first string) []consul.Permission {
	nodes := []string{first}
	if cfg.ConsulNodes > 1 {
		nodes = append(nodes, first+".1")
	}
	claimKey := ""
	if cfg.Claim {
		claimKey = strings.TrimSuffix(cfg.ClaimPrefix, "/") + "/" + cfg.ClusterID
	}
	return consul.NeededPermissions(nodes, claimKey)
}
