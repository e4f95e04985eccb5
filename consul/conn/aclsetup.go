package conn

import (
	"context"

	"github.com/fleetsync/fleetsync/consul/aclsetup"
)

// SetupACL creates or updates the ACL objects of cfg with this connection's
// (management) token; see package aclsetup.
func (cn *Conn) SetupACL(ctx context.Context, cfg aclsetup.Config) ([]aclsetup.Change, error) {
	return aclsetup.Apply(ctx, cn.api, cfg)
}
