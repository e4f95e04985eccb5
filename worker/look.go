package worker

import (
	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// look computes the desired state and its diff against the owned state,
// on a short-lived goroutine (aside); the result counts the desired
// instances.
func (w *Worker) look() (ch consul.Change, res syncResult) {
	w.opts.Looks.acquire()
	defer w.opts.Looks.release()
	aside(func() {
		var desired []consul.Instance
		desired, res = w.desired()
		res.desired = len(desired)
		if !res.invalid {
			ch = Diff(desired, w.owned, w.nodeOf, w.mark)
		}
	})
	return ch, res
}

// nodeOf names the Consul node an instance of this cluster belongs on. An
// instance of ours stays where it is when someone else's entry holds its
// ID on the node it would move to (the create there would fail every
// flush of the Service).
func (w *Worker) nodeOf(id string) string {
	home := w.opts.Config.Cluster.NodeNameFor(id)
	if f, taken := w.foreign[id]; taken && f.Node == home {
		if have, ours := w.owned[id]; ours {
			return have.Node
		}
	}
	return home
}

func (w *Worker) selected() bool {
	_, sel := w.opts.Lookup()
	return sel
}

// desired returns the stamped instances wanted in Consul: none when the
// Service is gone or not selected. An invalid Service keeps what it has.
func (w *Worker) desired() ([]consul.Instance, syncResult) {
	w.desiredName = ""
	svc, selected := w.opts.Lookup()
	if svc == nil || !selected {
		return nil, syncResult{}
	}
	spec, err := Desired(svc, w.opts.Config)
	res := syncResult{window: &spec.Window}
	before := w.reported
	w.reported = make(map[string]bool)
	if err != nil {
		res.invalid = true
		res.problem = err.Error()
		w.report(svc, before, ReasonInvalidAnnotation, err.Error())
		return nil, res
	}
	for _, warn := range spec.Warnings {
		w.report(svc, before, ReasonInvalidAnnotation, warn)
	}
	for _, msg := range spec.Skipped {
		w.report(svc, before, ReasonInstanceSkipped, msg)
	}
	w.desiredName = spec.Name
	if w.opts.OnName != nil {
		w.opts.OnName(spec.Name, svc.Annotations[AnnotationName] == "")
	}
	instances, blocked := Unblocked(spec.Instances, w.owned, w.foreign, w.nodeOf)
	for _, msg := range blocked {
		w.report(svc, before, ReasonEntryNotOurs, msg)
	}
	res.blocked = len(blocked)
	for _, p := range svc.Problems {
		w.report(svc, before, ReasonEndpointSkipped, p)
	}
	return instances, res
}

// report sends a Warning event and log line for msg unless it was reported
// for the previous look (before) already.
func (w *Worker) report(svc *k8s.Service, before map[string]bool, reason, msg string) {
	if w.reported[msg] {
		return
	}
	w.reported[msg] = true
	if before[msg] {
		return
	}
	w.log.Warn("Service cannot be synced as it is", "reason", reason, "error", msg)
	if w.opts.Reporter != nil && svc.Object != nil {
		w.opts.Reporter.Warning(svc.Object, reason, msg)
	}
}
