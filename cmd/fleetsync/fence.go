package main

import (
	"context"

	"github.com/hashicorp/go-hclog"

	"github.com/fleetsync/fleetsync/consul"
	consulconn "github.com/fleetsync/fleetsync/consul/conn"
	"github.com/fleetsync/fleetsync/consul/fence"
	"github.com/fleetsync/fleetsync/supervisor"
	"github.com/fleetsync/fleetsync/supervisor/shard"
)

// fencing is the supervisor's Fencing: with --shards above 1, a fencing
// token per shard under the claim prefix (consul/fence), taken as this
// replica gains the shard; a refusal on it is counted and hands the shard
// over (fenced, the shard manager's Fenced, called once the Manager
// exists). With one shard there is no token and no extra op.
func fencing(cfg config, sc shard.Config, cn *consulconn.Conn, scope consul.Scope, m *supervisor.Metrics, fenced func(int), log hclog.Logger) supervisor.Fencing {
	if sc.Shards <= 1 {
		return supervisor.Fencing{}
	}
	f := fence.New(cn.API(), fence.Options{Prefix: cfg.ClaimPrefix, ClusterID: cfg.ClusterID, Holder: sc.ReplicaID,
		RequestTimeout: cfg.ConsulTimeout, Scope: scope, Log: log.Named("fence"), OnFenced: m.ShardFenced})
	return supervisor.Fencing{
		Take: func(ctx context.Context, k int) (consul.Guard, error) {
			t, err := f.Take(ctx, k)
			if err != nil {
				return nil, err
			}
			return t, nil
		},
		Fenced: fenced,
	}
}
