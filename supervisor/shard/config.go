package shard

import (
	"errors"
	"flag"
	"fmt"
	"time"
)

// MaxShards bounds --shards.
const MaxShards = 1024

// Config is the sharding part of the daemon's flags.
type Config struct {
	// Shards splits Services into this many shards (1: no sharding, no
	// Leases).
	Shards int
	// Namespace of the shard and replica Leases ("" on the command line:
	// the caller picks $POD_NAMESPACE, else default).
	Namespace string
	// ReplicaID is this replica's identity in the Leases, a DNS subdomain
	// name ("" on the command line: the caller picks the host name, the pod
	// name).
	ReplicaID string
	// Lease timing (client-go leader election): a holder that cannot renew
	// for RenewDeadline gives the shard up (its workers stop) at the latest
	// RetryPeriod+RenewDeadline after its last renewal; nobody takes a shard
	// before its Lease went unchanged for LeaseDuration.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
}

// RegisterFlags registers the shard flags on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Shards, "shards", 1, "split Services into this many shards, held by the running replicas through Kubernetes Leases (1: this process syncs everything, no Leases)")
	fs.StringVar(&c.Namespace, "lease-namespace", "", "namespace of the shard and replica Leases (default $POD_NAMESPACE, else default)")
	fs.StringVar(&c.ReplicaID, "replica-id", "", "this replica's identity in the Leases (default the host name: the pod name)")
	fs.DurationVar(&c.LeaseDuration, "lease-duration", 15*time.Second, "shard lease duration: how long a dead replica's shards wait before another takes them")
	fs.DurationVar(&c.RenewDeadline, "lease-renew-deadline", 10*time.Second, "a holder that cannot renew a shard lease for this long stops its workers (plus --lease-retry-period, must be below --lease-duration)")
	fs.DurationVar(&c.RetryPeriod, "lease-retry-period", 2*time.Second, "how often leases are renewed and free shards are tried")
}

// Validate checks the flag values: the shard count, and the lease timing
// when sharded.
func (c Config) Validate() error {
	if c.Shards < 1 || c.Shards > MaxShards {
		return fmt.Errorf("--shards=%d: must be between 1 and %d", c.Shards, MaxShards)
	}
	if c.Shards > 1 && ValidateLeaseTiming(c.LeaseDuration, c.RenewDeadline, c.RetryPeriod) != nil {
		return fmt.Errorf("lease timing: need 0 < --lease-retry-period (%s) < --lease-renew-deadline (%s) and renew deadline + retry period < --lease-duration (%s): a cut-off holder stops its workers before anyone can take its shards",
			c.RetryPeriod, c.RenewDeadline, c.LeaseDuration)
	}
	return nil
}

// validateManager checks what a Manager needs beyond the flags.
func (c Config) validateManager() error {
	if c.Shards < 2 {
		return errors.New("shard leases need --shards of at least 2")
	}
	if err := ValidateLeaseTiming(c.LeaseDuration, c.RenewDeadline, c.RetryPeriod); err != nil {
		return err
	}
	if c.ReplicaID == "" || c.Namespace == "" {
		return errors.New("shard leases need a replica id and a lease namespace")
	}
	return nil
}

// ValidateLeaseTiming checks 0 < retry < renew deadline and renew deadline
// + retry < lease duration: a holder cut off from the API server stops its
// workers RetryPeriod+RenewDeadline after its last renewal at the latest,
// which must come before anyone can take the shard (LeaseDuration after the
// last renewal was seen).
func ValidateLeaseTiming(lease, renew, retry time.Duration) error {
	if !(retry > 0 && retry < renew && renew+retry < lease) {
		return fmt.Errorf("lease timing: need 0 < retry period (%s) < renew deadline (%s) and renew deadline + retry period < lease duration (%s)",
			retry, renew, lease)
	}
	return nil
}

// Lease labels.
const (
	labelCluster = "fleetsync.io/cluster"
	labelRole    = "fleetsync.io/role"
)

// names are the Lease names of one replica of one cluster.
type names struct{ cluster, identity string }

func (n names) shardPrefix() string { return fmt.Sprintf("fleetsync-%s-shard-", n.cluster) }
func (n names) shard(k int) string  { return fmt.Sprintf("%s%d", n.shardPrefix(), k) }
func (n names) replica() string     { return fmt.Sprintf("fleetsync-%s-replica-%s", n.cluster, n.identity) }
func (n names) selector() string    { return labelCluster + "=" + n.cluster }
