package watch

import (
	"context"
	"fmt"
	"regexp"
	"sort"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-bexpr"
)

// Query narrows one service's health read. Its zero value is the Client's
// own scope, every instance.
type Query struct {
	// Datacenter, Namespace and Partition of the read ("": the Client's;
	// namespaces and partitions exist in Consul Enterprise only).
	Datacenter, Namespace, Partition string
	// Tag, when set, keeps only the instances carrying it (Consul's tag=).
	Tag string
	// Filter, when set, is a Consul filter expression over the health
	// entries (Consul's filter=), evaluated by Consul.
	Filter string
}

var (
	datacenterRE = regexp.MustCompile(`^[a-z0-9_-]+$`)
	tenancyRE    = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,62}[a-zA-Z0-9])?$`)
)

// ValidateDatacenter checks a datacenter name the way Consul's agent
// does: lowercase letters, digits, '-' and '_'.
func ValidateDatacenter(dc string) error {
	if !datacenterRE.MatchString(dc) {
		return fmt.Errorf("not a Consul datacenter name (lowercase letters, digits, - and _)")
	}
	return nil
}

// ValidateTenancy checks a Consul namespace or admin partition name: a
// letter or digit, then up to 62 letters, digits or '-', ending with a
// letter or digit.
func ValidateTenancy(name string) error {
	if !tenancyRE.MatchString(name) {
		return fmt.Errorf("not a Consul namespace or partition name (letters, digits and -, at most 64)")
	}
	return nil
}

// ValidateFilter checks the syntax of a Consul filter expression (Consul
// checks its selectors when it evaluates it).
func ValidateFilter(expr string) error {
	if _, err := bexpr.CreateEvaluator(expr, nil); err != nil {
		return fmt.Errorf("not a Consul filter expression: %w", err)
	}
	return nil
}

func (c *Client) queryOf(ctx context.Context, index uint64, stale bool, q Query) (*api.QueryOptions, func(error) error) {
	o, done := c.query(ctx, index, stale)
	if q.Datacenter != "" {
		o.Datacenter = q.Datacenter
	}
	if q.Namespace != "" {
		o.Namespace = q.Namespace
	}
	if q.Partition != "" {
		o.Partition = q.Partition
	}
	o.Filter = q.Filter
	return o, done
}

// ownScope reports whether q reads the Client's own datacenter, namespace
// and partition: the change feed sees only those.
func (c *Client) ownScope(q Query) bool {
	same := func(a, b string) bool { return a == "" || a == b }
	return same(q.Datacenter, c.opts.Datacenter) && same(q.Namespace, c.opts.Namespace) && same(q.Partition, c.opts.Partition)
}

// HealthQuery is Health narrowed by q. Past MaxWatches a query that would
// block polls instead (see slots), and reads at index 0 (first reads,
// reads after an error) wait for one of the polls' reads, so that workers
// started together do not open a connection each.
func (c *Client) HealthQuery(ctx context.Context, name string, q Query, index uint64) (Instances, uint64, error) {
	switch {
	case c.slots == nil:
		if index != 0 {
			c.blocking.Add(1)
			defer c.blocking.Add(-1)
		}
	case index == 0: // a first read or one after an error: a read like a poll's
		if !c.slots.read(ctx) {
			return Instances{}, 0, ctx.Err()
		}
		defer c.slots.done()
	case c.slots.take():
		defer c.slots.free()
	default:
		ch := c.slots.enter(name, c.ownScope(q))
		defer c.slots.leave(name, ch)
		if !c.slots.wait(ctx, ch) {
			return Instances{}, 0, ctx.Err()
		}
		defer c.slots.done()
		select { // a nudge that came with the timer: this read sees it
		case <-ch:
		default:
		}
		// Read the current state, at once; a nudge that comes meanwhile
		// may be of a change the answer predates: read again (at most
		// pollRereads times, so that a service whose checks change faster
		// than it is read does not keep one of the polls' reads).
		for n := 0; ; n++ {
			a, got, err := c.health(ctx, name, q, 0)
			if err != nil || n == pollRereads || !c.slots.renudged(ch) {
				return a, got, err
			}
		}
	}
	return c.health(ctx, name, q, index)
}

// pollRereads bounds the reads again of one poll (see HealthQuery).
const pollRereads = 2

// health is one health read of name at index.
func (c *Client) health(ctx context.Context, name string, q Query, index uint64) (Instances, uint64, error) {
	raw, meta, err := ask(ctx, c, index, c.opts.MaxStale > 0, func(ctx context.Context, index uint64, stale bool) ([]*api.ServiceEntry, *api.QueryMeta, error) {
		o, done := c.queryOf(ctx, index, stale, q)
		raw, meta, err := c.api.Health().Service(name, q.Tag, false, o)
		return raw, meta, done(err)
	})
	if err != nil {
		return Instances{}, 0, fmt.Errorf("consul health of service %q: %w", name, err)
	}
	out := make([]Entry, 0, len(raw))
	for _, e := range raw {
		if e == nil || e.Node == nil || e.Service == nil {
			continue // Consul never sends these; a garbled answer must not crash us
		}
		out = append(out, entryOf(e))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Node.Name != out[j].Node.Name {
			return out[i].Node.Name < out[j].Node.Name
		}
		return out[i].ID < out[j].ID
	})
	return Instances{Entries: out, FilteredByACLs: meta.ResultsFilteredByACLs, Streamed: meta.QueryBackend == api.QueryBackendStreaming}, meta.LastIndex, nil
}
