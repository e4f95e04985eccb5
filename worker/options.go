package worker

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/clock"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/consul/budget"
	"github.com/fleetsync/fleetsync/k8s"
)

// Store is the part of the consul client a worker uses.
type Store interface {
	// ReadPrefix reads the entries on the owner's nodes whose ID starts
	// with prefix, owned or not (the worker keeps what ownership accepts).
	ReadPrefix(ctx context.Context, prefix string) ([]consul.Registered, error)
	// ReadService reads the entries of one Consul service name on the
	// owner's nodes in one index-backed request (the anti-entropy read),
	// with the name's index.
	ReadService(ctx context.Context, name string) ([]consul.Registered, uint64, error)
	// ServiceIndex is the index of a Consul service name: it moves with
	// every write of a service or check of that name, by anyone (0:
	// unknown).
	ServiceIndex(ctx context.Context, name string) (uint64, error)
	// NodeIndex is the index of a node: it moves with every write of a
	// service on the node, by anyone.
	NodeIndex(ctx context.Context, node string) (uint64, error)
	// CatalogMarks are two catalog-wide indexes that together move with
	// every catalog write, by anyone (consul.CatalogMarks), from a read
	// begun at or after after, at most a second ago, shared by the fleet.
	CatalogMarks(ctx context.Context, after time.Time) (consul.CatalogMarks, error)
	// Acquire waits for the write budget of one transaction (high:
	// priority); the permit goes out in Change.Permit or is released.
	Acquire(ctx context.Context, high bool) (budget.Permit, error)
	// Apply writes a change as conditional transactions (see package
	// consul).
	Apply(ctx context.Context, ch consul.Change) (consul.Applied, error)
}

// Lookup returns the latest view of the worker's Service from the informer
// cache and whether it is selected for sync. A nil Service with selected
// false means it is gone.
type Lookup func() (svc *k8s.Service, selected bool)

// Reporter turns user-fixable problems into Kubernetes Events.
type Reporter interface {
	Warning(obj k8sruntime.Object, reason, message string)
}

// Event reasons, documented in docs/operations.md.
const (
	ReasonInvalidAnnotation = "InvalidAnnotation"
	ReasonSyncFailed        = "ConsulSyncFailed"
	ReasonEndpointSkipped   = "EndpointSkipped"
	ReasonInstanceSkipped   = "InstanceSkipped" // an external IP, LB ingress or node that gave no instance
)

// DefaultBlockedRecheck is Options.BlockedRecheck's default.
const DefaultBlockedRecheck = 5 * time.Second

// Options build a Worker. Key, Config, Lookup and Store are required.
type Options struct {
	Key      k8s.Key
	Config   Config
	Lookup   Lookup
	Store    Store
	Clock    clock.Clock     // default: the real clock
	Log      hclog.Logger    // default: discard
	Reporter Reporter        // default: none
	Observer Observer        // default: none
	Gate     <-chan struct{} // closed once the fleet is bootstrapped; nil: open
	// Looks, when set, is shared by the fleet's workers: a look (the
	// desired state and its diff, all CPU) holds one of its slots. With
	// as many slots as cores, the 10,000 workers that look at once when
	// the gate opens queue here instead of in the Go scheduler's run
	// queue, where /healthz, /readyz and the informers' goroutines would
	// wait behind all of them. nil: unbounded.
	Looks *Slots
	// Owned is this Service's owned state as read at bootstrap (HoldOwned);
	// the worker takes the map as it is. When OwnedKnown is false the
	// worker reads it from Consul before its first flush.
	Owned      map[string]Held
	OwnedKnown bool
	// Backoff bounds for failed flushes (defaults 200ms and 30s).
	MinBackoff, MaxBackoff time.Duration
	// DrainTimeout bounds the last flush attempted when Run's context is
	// cancelled with a change pending (0: no final flush).
	DrainTimeout time.Duration
	// ResyncPeriod is the anti-entropy period (0: none; see Resync).
	ResyncPeriod time.Duration
	// BlockedRecheck is how often a worker some of whose desired
	// instances are blocked (someone else's entry holds their ID) reads
	// its entries again, so that an instance is registered soon after the
	// foreign entry is gone, not at the next anti-entropy pass (default
	// DefaultBlockedRecheck; negative: never).
	BlockedRecheck time.Duration
	// OnLoss, when set, is told when a CAS conflict's re-read shows that
	// entries this worker wrote are gone or older than written: Consul
	// lost or rolled back data, so every other worker should look too.
	OnLoss func(reason string)
	// Fence, when set, is the fencing token of the Service's shard
	// (consul/fence): every transaction of the worker carries it. A write
	// refused on it (consul.ErrFenced: another replica took the shard)
	// ends Run with ErrFenced, without a retry or a final flush.
	Fence consul.Guard
	// OnName, when set, is told the Service's Consul name at every look,
	// and whether it comes from the Kubernetes name (not the service-name
	// annotation): the supervisor reports two Services that share one by
	// accident.
	OnName func(name string, derived bool)
}
