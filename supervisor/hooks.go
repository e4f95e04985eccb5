package supervisor

import (
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// Hooks receive the supervisor's fleet-wide measurements, one interface per
// subject. They are called from the supervisor's goroutines and must not
// block; a nil one receives nothing.
type Hooks struct {
	Fleet  FleetHooks
	Shards ShardHooks
	Consul ConsulHooks
}

// FleetHooks hear of the workers and the bootstrap.
type FleetHooks interface {
	WorkerStarted(key k8s.Key)
	WorkerStopped(key k8s.Key)
	WorkerRestarted(key k8s.Key)
	// Bootstrapped: the fleet's gate opened d after Run began; read is
	// the bulk read of the owned state, which found owned instances and
	// foreign entries.
	Bootstrapped(d, read time.Duration, owned, foreign int)
	BootstrapReadFailed(err error)
	InformersSynced()
}

// ShardHooks hear of the shards this replica holds (see GainShard).
type ShardHooks interface {
	ShardGained(shard int)
	ShardLost(shard int)
	ReplicaIDConflict()
}

// ConsulHooks hear of the cluster's Consul nodes and of what the node check
// finds there.
type ConsulHooks interface {
	// ConsulDataLost: Consul lost or rolled back data, seen by signal.
	ConsulDataLost(signal string)
	// ForeignNodes: nodes that look like ours but are not.
	ForeignNodes(n int)
	// ConsulNodes: the Consul nodes the cluster's Services are spread over.
	ConsulNodes(n int)
	// ReadPanicked: a long-running read (bootstrap, node_check, repair)
	// panicked and counts as a failed read.
	ReadPanicked(read string)
	// ForeignChecks: the checks others put on our nodes and instances,
	// as the reads last saw them.
	ForeignChecks(checks []consul.ForeignCheck)
}

// orNop fills the unset hooks with ones that do nothing.
func (h Hooks) orNop() Hooks {
	if h.Fleet == nil {
		h.Fleet = nopHooks{}
	}
	if h.Shards == nil {
		h.Shards = nopHooks{}
	}
	if h.Consul == nil {
		h.Consul = nopHooks{}
	}
	return h
}

// nopHooks does nothing; tests embed it to hear one event.
type nopHooks struct{}

func (nopHooks) WorkerStarted(k8s.Key)                               {}
func (nopHooks) WorkerStopped(k8s.Key)                               {}
func (nopHooks) WorkerRestarted(k8s.Key)                             {}
func (nopHooks) Bootstrapped(time.Duration, time.Duration, int, int) {}
func (nopHooks) BootstrapReadFailed(error)                           {}
func (nopHooks) InformersSynced()                                    {}
func (nopHooks) ShardGained(int)                                     {}
func (nopHooks) ShardLost(int)                                       {}
func (nopHooks) ReplicaIDConflict()                                  {}
func (nopHooks) ConsulDataLost(string)                               {}
func (nopHooks) ForeignNodes(int)                                    {}
func (nopHooks) ConsulNodes(int)                                     {}
func (nopHooks) ReadPanicked(string)                                 {}
func (nopHooks) ForeignChecks([]consul.ForeignCheck)                 {}
