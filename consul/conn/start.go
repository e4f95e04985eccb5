package conn

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul/backoff"
)

// startBackoff is the backoff of Start's retries: 500ms doubling to 30s.
var startBackoff = backoff.Policy{Min: 500 * time.Millisecond, Max: 30 * time.Second}

// ErrEnterpriseOnly is matched by the catalog store's CheckScope error when
// Consul does not support the namespace or partition asked for (Consul
// OSS).
var ErrEnterpriseOnly = errors.New("consul: namespaces and admin partitions need Consul Enterprise")

// Start reads which datacenter and cluster the addresses belong to (a Dial
// connection, see Servers.Identify: every later request carries the
// datacenter), logs in (when the connection logs in, see DialOptions.Login), then
// runs checkScope (the catalog store's check of its namespace and
// partition, consul.Client.CheckScope) and checks the token's permissions
// on perms in partition, retrying while Consul cannot be reached. It returns an error only
// for what no retry mends: addresses of several datacenters or clusters
// (ErrNotOneCluster), a datacenter they do not know (ErrUnknownDatacenter),
// the login refused (ErrLogin), a namespace or
// partition Consul does not have (ErrEnterpriseOnly), a permission the
// policy lacks (ErrNotPermitted, from the permission check or from
// checkScope); and nil when ctx ends first.
func (cn *Conn) Start(ctx context.Context, checkScope func(context.Context) error, partition string, perms []Permission, log hclog.Logger) error {
	retry := backoff.New(startBackoff)
	loggedIn := cn.tokens == nil || cn.tokens.login == nil
	identified := cn.servers == nil
	for {
		var err error
		if !identified {
			var id Identity
			if id, err = cn.servers.Identify(ctx, cn.dc); err == nil {
				identified = true
				log.Info("Consul datacenter", "datacenter", cn.servers.Datacenter(), "addresses_are", id.String())
			} else if errors.Is(err, ErrNotOneCluster) || errors.Is(err, ErrUnknownDatacenter) {
				return err
			}
		}
		if identified && !loggedIn {
			if err = cn.tokens.Login(ctx); err == nil {
				loggedIn = true
			} else if errors.Is(err, ErrLogin) {
				return err
			}
		}
		if identified && loggedIn {
			if err = checkScope(ctx); err == nil {
				err = cn.Permissions(ctx, partition, perms)
				if err == nil || errors.Is(err, ErrNotPermitted) {
					return err
				}
			}
			if errors.Is(err, ErrEnterpriseOnly) || errors.Is(err, ErrNotPermitted) {
				return err
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		wait := retry.Next()
		log.Warn("Cannot reach Consul yet; retrying", "retry_in", wait, "error", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}
