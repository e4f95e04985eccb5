package claim

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul/backoff"
	"github.com/fleetsync/fleetsync/consul/conn"
)

// retryBackoff is the backoff of ClusterIDRetrying, the connection's
// start-up backoff: 500ms doubling to 30s.
var retryBackoff = backoff.Policy{Min: 500 * time.Millisecond, Max: 30 * time.Second}

// ClusterIDRetrying claims opts.ClusterID for the Kubernetes cluster
// whose UID kubeUID reads, before anything is written, retrying while
// Kubernetes or Consul cannot be reached. It returns an error only when
// another Kubernetes cluster has the id (ErrClaimedByOther) or the token
// may not claim it (IsPermissionDenied), and nil, nil when ctx ends first.
// opts.KubeUID is set from kubeUID.
func ClusterIDRetrying(ctx context.Context, cn *conn.Conn, kubeUID func(context.Context) (string, error), opts Options, log hclog.Logger) (*Claim, error) {
	retry := backoff.New(retryBackoff)
	for {
		uid, err := kubeUID(ctx)
		if err == nil {
			opts.KubeUID = uid
			var claim *Claim
			claim, err = ClusterID(ctx, cn.API(), opts)
			if err == nil {
				return claim, nil
			}
			if errors.Is(err, ErrClaimedByOther) || conn.IsPermissionDenied(err) {
				return nil, err // no retry mends these
			}
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		wait := retry.Next()
		log.Warn("Cannot claim the cluster id yet; retrying", "retry_in", wait, "error", err)
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(wait):
		}
	}
}
