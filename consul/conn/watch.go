package conn

import "github.com/fleetsync/fleetsync/consul/watch"

// NewWatch returns the blocking queries of the Consul -> Kubernetes
// direction over this connection (its token, TLS and failover).
func (cn *Conn) NewWatch(opts watch.Options) *watch.Client { return watch.New(cn.api, opts) }
