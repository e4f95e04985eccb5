package tok8s

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/fleetsync/fleetsync/consul/watch"
)

// A health answer Consul filtered by ACLs (the token lost service:read on
// the service, or node:read on some of its nodes: Consul answers 200 with
// those instances left out) never removes an endpoint mirrored now: the
// endpoints of the unit's slices that the answer lacks stay as they are,
// those it has are updated as usual, for as long as the answers come
// filtered. The first unfiltered answer is applied as it is.
//
// Consul's streaming backend, which serves blocking reads with an index,
// filters without saying so (watch.Instances.Streamed); a streamed answer
// that drops an instance of the last answer, or that follows a filtered
// one, is read again with index 0, whose answer says.

// read is one health read of the unit; last is the last answer delivered.
func (w *Worker) read(ctx context.Context, index uint64, last watch.Instances) (watch.Instances, uint64, error) {
	a, got, err := w.opts.Health(ctx, w.opts.Unit.ConsulName, index)
	if err != nil || !a.Streamed || !(last.FilteredByACLs || drops(last.Entries, a.Entries)) {
		return a, got, err
	}
	return w.opts.Health(ctx, w.opts.Unit.ConsulName, 0)
}

// drops reports whether an instance of before is missing from after.
func drops(before, after []watch.Entry) bool {
	have := make(map[[2]string]bool, len(after))
	for _, e := range after {
		have[[2]string{e.Node.Name, e.ID}] = true
	}
	for _, e := range before {
		if !have[[2]string{e.Node.Name, e.ID}] {
			return true
		}
	}
	return false
}

// keepMirrored adds to eps every endpoint of actual (the unit's slices)
// that eps lacks, as it is in its slice; kept is how many.
func keepMirrored(eps []endpoint, actual []*discoveryv1.EndpointSlice) (out []endpoint, kept int) {
	key := func(f discoveryv1.AddressType, port int32, addr string) string {
		return string(f) + "/" + strconv.Itoa(int(port)) + "/" + addr
	}
	have := make(map[string]bool, len(eps))
	for _, e := range eps {
		have[key(e.family, e.port, e.ep.Addresses[0])] = true
	}
	out = eps
	for _, s := range actual {
		if len(s.Ports) != 1 || s.Ports[0].Port == nil {
			continue
		}
		port := *s.Ports[0].Port
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 || have[key(s.AddressType, port, ep.Addresses[0])] {
				continue
			}
			have[key(s.AddressType, port, ep.Addresses[0])] = true
			out = append(out, endpoint{family: s.AddressType, port: port, ep: *ep.DeepCopy()})
			kept++
		}
	}
	return out, kept
}

// hold notes whether this look keeps endpoints a filtered answer dropped:
// logged and reported (an Event on obj) once per hold, shown in Status.
func (w *Worker) hold(obj *corev1.Service, kept, answered int) {
	held := kept > 0
	w.stats.held(held)
	switch {
	case held && !w.holding:
		w.log.Warn("Consul health answer filtered by ACLs drops mirrored instances; keeping them as last seen while the token cannot read them",
			"kept", kept, "answered", answered)
		if w.opts.Reporter != nil && obj != nil {
			w.opts.Reporter.Warning(obj, ReasonFilteredByACLs, "Consul filtered the health answer of "+w.opts.Unit.ConsulName+
				" by ACLs (the token lost service:read or node:read): "+strconv.Itoa(kept)+" endpoint(s) it dropped are kept as last seen")
		}
	case !held && w.holding:
		w.log.Info("Consul health answer no longer drops mirrored instances for ACLs; hold released")
	}
	w.holding = held
}
