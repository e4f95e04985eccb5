package supervisor

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/supervisor/loss"
	"github.com/fleetsync/fleetsync/worker"
)

// ReasonForeignCheck is the Event reason for a check someone else put on
// our node or under one of our instances that takes instances of the
// Service out of Consul's healthy answers and DNS.
const ReasonForeignCheck = "ConsulForeignCheck"

// ForeignCheckSource tells the foreign checks the store's reads saw
// (consul.Client.ForeignChecks): what others registered on our nodes.
type ForeignCheckSource interface {
	ForeignChecks() []consul.ForeignCheck
	// ForeignChecksChanged gets a value when ForeignChecks changed.
	ForeignChecksChanged() <-chan struct{}
}

// foreignCheckState is what the report of foreign checks keeps: the
// rows of /debug/workers (under the supervisor's problemsMu), and, on the
// report's goroutine only, the Services told of each check.
type foreignCheckState struct {
	rows map[k8s.Key][]string
	told map[string]map[k8s.Key]bool // by checkKey: one Event per appearance and Service
}

// runWatches runs the loss watch and the report of foreign checks until
// ctx is done.
func (s *Supervisor) runWatches(ctx context.Context, lw *loss.Watch) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.watchForeignChecks(ctx)
	}()
	lw.Run(ctx)
	<-done
}

// watchForeignChecks reports the foreign checks at once (the bootstrap
// read saw those of every node), then whenever a read sees them change;
// while there are some, also every NodeCheckInterval, for the Services
// whose workers started since on a node with a node check.
func (s *Supervisor) watchForeignChecks(ctx context.Context) {
	changed := s.opts.Store.ForeignChecksChanged()
	for {
		checks := s.opts.Store.ForeignChecks()
		s.reportForeignChecks(checks)
		var tick <-chan time.Time
		stop := func() bool { return false }
		if len(checks) > 0 && s.opts.NodeCheckInterval > 0 {
			t := s.opts.Clock.NewTimer(s.opts.NodeCheckInterval)
			tick, stop = t.C(), t.Stop
		}
		select {
		case <-ctx.Done():
			stop()
			return
		case <-changed:
			stop()
		case <-tick:
		}
	}
}

// outOf says which of Consul's answers a check of that status keeps the
// instances out of: a critical one every healthy answer and DNS, a
// warning one those that ask for passing instances only.
func outOf(status string) string {
	if status == consul.StatusWarning {
		return "Consul's passing-only answers (health queries with ?passing, DNS with only_passing)"
	}
	return "Consul's healthy answers and DNS"
}

// checkKey names one check in the catalog.
func checkKey(f consul.ForeignCheck) string { return f.Node + "/" + f.ServiceID + "/" + f.CheckID }

// describe says what f is, for rows, problems and Events.
func describe(f consul.ForeignCheck) string {
	if f.NodeLevel() {
		return fmt.Sprintf("node check %s on node %s is %s", f.CheckID, f.Node, f.Status)
	}
	return fmt.Sprintf("check %s under instance %s on node %s is %s", f.CheckID, f.ServiceID, f.Node, f.Status)
}

// affected returns the Services with a worker here that f concerns: the
// one whose instance it is under, or, for a node check, every one whose
// instances go on its node (byNode, built once per report: onNodes).
func (s *Supervisor) affected(f consul.ForeignCheck, byNode func() map[string][]k8s.Key) []k8s.Key {
	if f.NodeLevel() {
		return byNode()[f.Node]
	}
	key := k8s.Key{Namespace: f.Meta[worker.MetaNamespace], Name: f.Meta[worker.MetaService]}
	s.mu.Lock()
	_, ok := s.workers[key]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	return []k8s.Key{key}
}

// onNodes returns the Services with a worker here by the node their
// instances go on, each list sorted.
func (s *Supervisor) onNodes() map[string][]k8s.Key {
	layout := s.opts.Worker.Cluster
	if l := s.layout.Load(); l != nil {
		layout = *l
	}
	out := map[string][]k8s.Key{}
	first, spread := layout.NodeName(), layout.Nodes() > 1
	s.mu.Lock()
	for key := range s.workers {
		node := first
		if spread {
			node = layout.NodeNameFor(layout.IDPrefix(key.Namespace, key.Name))
		}
		out[node] = append(out[node], key)
	}
	s.mu.Unlock()
	for _, keys := range out {
		slices.SortFunc(keys, func(a, b k8s.Key) int { return strings.Compare(a.String(), b.String()) })
	}
	return out
}

// reportForeignChecks counts checks, lists each in the rows of the
// Services it concerns, and, for each one not passing, keeps a readiness
// problem and sends one Warning Event per Service it concerns, once per
// appearance (a check that passes again, or goes, and comes back, is
// told again). Nothing here writes to Consul: the checks are not ours.
//
// Only checks that concern a Service with a worker here count: what the
// reads saw of other Services (another replica's shards, at bootstrap) is
// not read again by this replica, so it would go stale.
func (s *Supervisor) reportForeignChecks(checks []consul.ForeignCheck) {
	var counted []consul.ForeignCheck
	defer func() { s.opts.Hooks.Consul.ForeignChecks(counted) }()
	st := &s.checks
	if st.told == nil {
		st.told = map[string]map[k8s.Key]bool{}
	}
	rows := map[k8s.Key][]string{}
	problems := map[string]string{}
	now := map[string]bool{}
	var byNode map[string][]k8s.Key
	onNodes := func() map[string][]k8s.Key {
		if byNode == nil {
			byNode = s.onNodes()
		}
		return byNode
	}
	for _, f := range checks {
		keys := s.affected(f, onNodes)
		if len(keys) == 0 {
			continue
		}
		counted = append(counted, f)
		for _, key := range keys {
			rows[key] = append(rows[key], describe(f))
		}
		if f.Status == consul.StatusPassing {
			continue
		}
		ck := checkKey(f)
		now[ck] = true
		problems["check/"+ck] = fmt.Sprintf("%s, registered by someone else: instances of %d Service(s) are out of %s (fleetsync leaves it alone)", describe(f), len(keys), outOf(f.Status))
		if st.told[ck] == nil {
			st.told[ck] = map[k8s.Key]bool{}
			s.log.Warn("Someone else's check takes our instances out of Consul's healthy answers; it is left alone",
				"node", f.Node, "check", f.CheckID, "service_id", f.ServiceID, "status", f.Status, "services", len(keys))
		}
		for _, key := range keys {
			if !st.told[ck][key] {
				st.told[ck][key] = true
				s.tellForeignCheck(key, f)
			}
		}
	}
	for ck := range st.told {
		if !now[ck] {
			delete(st.told, ck)
			s.log.Info("A foreign check that took our instances out of healthy answers passes or is gone", "check", ck)
		}
	}
	s.problemsMu.Lock()
	defer s.problemsMu.Unlock()
	for k := range s.problems {
		if strings.HasPrefix(k, "check/") {
			delete(s.problems, k)
		}
	}
	maps.Copy(s.problems, problems)
	st.rows = rows
}

// tellForeignCheck sends the Warning Event of f on key's Service.
func (s *Supervisor) tellForeignCheck(key k8s.Key, f consul.ForeignCheck) {
	if s.opts.Reporter == nil {
		return
	}
	svc, _ := s.lookup(key)
	if svc == nil || svc.Object == nil {
		return
	}
	what := "every instance of this Service on that node is"
	if !f.NodeLevel() {
		what = "that instance is"
	}
	out := ""
	if f.Output != "" {
		out = " (output: " + f.Output + ")"
	}
	s.opts.Reporter.Warning(svc.Object, ReasonForeignCheck, fmt.Sprintf(
		"Consul %s%s, registered by someone else, not by fleetsync: %s out of %s; fleetsync never writes or deletes it: whoever registered it must remove it (a catalog deregister of the check)",
		describe(f), out, what, outOf(f.Status)))
}

// ForeignChecks returns, for every Service with a worker that a foreign
// check concerns, the checks (see consul.ForeignCheck), as last reported.
func (s *Supervisor) ForeignChecks() map[k8s.Key][]string {
	s.problemsMu.Lock()
	defer s.problemsMu.Unlock()
	return maps.Clone(s.checks.rows)
}
