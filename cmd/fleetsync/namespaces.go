package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/namespaces"
)

// optionalBool is a boolean flag that knows whether it was given.
type optionalBool struct {
	value, set bool
}

func (b *optionalBool) String() string {
	if b == nil || !b.set {
		return ""
	}
	return strconv.FormatBool(b.value)
}

func (b *optionalBool) Set(v string) error {
	x, err := strconv.ParseBool(v)
	if err != nil {
		return errors.New("want true or false")
	}
	b.value, b.set = x, true
	return nil
}

func (b *optionalBool) IsBoolFlag() bool { return true }

// mirroring is whether instances go in their Kubernetes namespace's
// mirror: --enable-k8s-namespace-mirroring when given, else
// --enable-namespaces (the consul chart turns mirroring on with
// namespaces: syncCatalog.consulNamespaces.mirroringK8S is true).
func (c *config) mirroring() bool {
	if c.MirrorNamespaces.set {
		return c.MirrorNamespaces.value
	}
	return c.EnableNamespaces
}

func (c *config) validateNamespaces() error {
	mirror := c.mirroring()
	if c.MirrorPrefix != "" && !mirror {
		return fmt.Errorf("--k8s-namespace-mirroring-prefix=%q needs --enable-k8s-namespace-mirroring (on by default with --enable-namespaces)", c.MirrorPrefix)
	}
	if mirror && c.ConsulNamespace != "" && c.ConsulNamespace != "default" {
		if !c.MirrorNamespaces.set {
			return fmt.Errorf("--consul-namespace=%q with --enable-namespaces: mirroring is on by default with --enable-namespaces (as in the consul chart), which names each instance's namespace after its Kubernetes namespace; add --enable-k8s-namespace-mirroring=false to put every instance in %q", c.ConsulNamespace, c.ConsulNamespace)
		}
		return fmt.Errorf("--consul-namespace=%q and --enable-k8s-namespace-mirroring: choose one (mirroring names each instance's namespace after its Kubernetes namespace)", c.ConsulNamespace)
	}
	return nil
}

// newNamespaceEnsurer is what creates the scope's missing namespaces; nil
// when the scope has none (Consul OSS, or the default namespace).
func newNamespaceEnsurer(cfg config, cn *conn.Conn, scope consul.Scope, log hclog.Logger) *namespaces.Ensurer {
	s := scope.Normal()
	if s.Namespace == "" && !s.MirrorNamespaces {
		return nil
	}
	return namespaces.New(cn.API().Namespaces(), namespaces.Options{
		CrossNamespacePolicy: cfg.CrossNSPolicy, Partition: s.Partition, RequestTimeout: cfg.ConsulTimeout, Log: log,
	})
}

// namespaceEnsurer is the store's Options.Namespaces (a nil interface
// without an ensurer).
func (cc *consulConn) namespaceEnsurer() consul.NamespaceEnsurer {
	if cc.namespaces == nil {
		return nil
	}
	return cc.namespaces
}

// checkScope is the start's check of the scope: the namespace every
// instance and the claim key go in is made to exist (--consul-namespace;
// with mirroring, each namespace is made to exist at its first write),
// then the store checks the scope (Consul OSS refuses a namespace or
// partition: the error names the flag).
func (cc *consulConn) checkScope(store *consul.Client) func(context.Context) error {
	return func(ctx context.Context) error {
		s := cc.scope.Normal()
		if cc.namespaces != nil && !s.MirrorNamespaces {
			if err := cc.namespaces.Ensure(ctx, s.Namespace); err != nil {
				if errors.Is(err, conn.ErrEnterpriseOnly) {
					if serr := store.CheckScope(ctx); serr != nil {
						return serr
					}
				}
				return err
			}
		}
		return store.CheckScope(ctx)
	}
}
