package tok8s

import (
	"context"
	"errors"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// lagWait bounds how long a flush waits for the cache to show this
// worker's last writes.
const lagWait = 5 * time.Second

// flush makes one look: desired state, diff, writes. done is true when the
// unit is gone and nothing of it remains.
func (w *Worker) flush(ctx context.Context) (wrote int, done bool, err error) {
	u, target, selected := w.opts.Lookup()
	slices := w.opts.Owned.Slices(u.Namespace, u.Name)
	var svc *corev1.Service
	if u.Mirror || !selected {
		svc, _ = w.opts.Owned.Service(u.Namespace, u.Name)
	}
	if w.lagging(slices, svc) {
		return 0, false, nil // the cache's event for our write re-triggers
	}
	if !selected {
		if len(slices) == 0 && svc == nil {
			return 0, true, nil
		}
		return w.deleteAll(ctx, slices, svc)
	}
	w.mu.Lock()
	entries, filtered, known := w.entries, w.filtered, w.known
	w.mu.Unlock()
	if !known {
		return 0, false, nil // nothing before the first health answer
	}
	if len(entries) == 0 && (u.CatalogDecides || u.Mirror && !w.opts.Config.EmptyIsAnswer) {
		// Consul's catalog lists the name but it has no instance: the
		// catalog's answer that drops the name is on its way, or Consul
		// restarted empty, or the token cannot read the instances. Deleting
		// a mirrored Service is the catalog's call (the supervisor's
		// deletion guard), never an empty health answer's; a unit the
		// guard holds keeps its objects.
		return 0, false, nil
	}
	eps, problems := w.opts.Config.Endpoints(entries)
	kept := 0
	if filtered {
		eps, kept = keepMirrored(eps, slices)
	}
	w.hold(heldObject(u, target, svc), kept, len(entries))
	w.stats.wanted(len(eps))
	if u.Mirror {
		want := w.opts.Config.DesiredService(u, eps)
		if want == nil && filtered {
			return 0, false, nil // the token cannot read them: not gone
		}
		if want == nil {
			return w.deleteAll(ctx, slices, svc)
		}
		if svc != nil && KindOf(svc) != KindOf(want) {
			// Another kind (--to-k8s-mode changed): a clusterIP cannot
			// change in place, so the Service and its slices go and the
			// next flush creates the new kind.
			w.log.Info("Mirror kind changed; replacing the Service", "from", KindOf(svc), "to", KindOf(want))
			return w.deleteAll(ctx, slices, svc)
		}
		// The slices the Service will have, with the owner it has or
		// will have (a UID only once created), so that the flush prepays
		// the Service's write and its slices' together.
		owner := OwnerOf(want.Name, "")
		if svc != nil {
			owner = OwnerOf(svc.Name, svc.UID)
		}
		plan := w.plan(u, eps, slices, owner)
		writes := serviceWrites(want, svc) + plan.writes()
		if svc == nil && w.takenSeen {
			writes = 1 // a name found taken: its create only, no slices
		}
		if ctx, err = w.prepay(ctx, writes); err != nil {
			return 0, false, err
		}
		n, got, err := w.ensureService(ctx, want, svc)
		wrote += n
		if err != nil || got == nil {
			return wrote, false, err
		}
		svc, target = got, got
		if got.UID != owner.UID {
			owner = OwnerOf(got.Name, got.UID)
			plan = w.plan(u, eps, slices, owner)
		}
		w.report(target, ReasonInstanceSkipped, problems)
		n, err = w.apply(ctx, plan)
		return wrote + n, false, err
	}
	if target == nil {
		return 0, false, nil
	}
	w.report(target, ReasonInstanceSkipped, problems)
	plan := w.plan(u, eps, slices, OwnerOf(target.Name, target.UID))
	if ctx, err = w.prepay(ctx, plan.writes()); err != nil {
		return 0, false, err
	}
	n, err := w.apply(ctx, plan)
	return n, false, err
}

// plan is the diff of u's slices, owned by owner, against actual.
func (w *Worker) plan(u Unit, eps []endpoint, actual []*discoveryv1.EndpointSlice, owner metav1.OwnerReference) Plan {
	var desired []*discoveryv1.EndpointSlice
	if !u.Mirror || w.opts.Config.HasSlices() {
		desired = w.opts.Config.DesiredSlices(u, eps, actual, owner)
	}
	return Diff(desired, actual)
}

// serviceWrites estimates the writes ensureService sends: one for a
// create (an adoption prepays its second itself) or for an update of a
// changed Service, none for one that is current.
func serviceWrites(want, have *corev1.Service) int {
	if have == nil || !SameService(want, have) {
		return 1
	}
	return 0
}

// prepay takes a flush's estimated writes from the write budget at once, so
// that they go out back to back instead of each queueing behind every
// other flush's writes (a Service without its slices for the whole mirror).
func (w *Worker) prepay(ctx context.Context, n int) (context.Context, error) {
	if n == 0 {
		return ctx, nil
	}
	return w.opts.Writer.Prepay(ctx, n)
}

// heldObject is the Service a hold's Event is about: the user's in import
// mode, the mirrored one in mirror mode (nil before it exists).
func heldObject(u Unit, target, svc *corev1.Service) *corev1.Service {
	if u.Mirror {
		return svc
	}
	return target
}

// ensureService creates or applies the mirrored Service; got is nil when
// the name is someone else's (reported once, NameTaken).
func (w *Worker) ensureService(ctx context.Context, want, have *corev1.Service) (wrote int, got *corev1.Service, err error) {
	if have != nil {
		if SameService(want, have) {
			return 0, have, nil
		}
		got, err = w.opts.Writer.UpdateService(ctx, have, want)
		if err != nil {
			return 1, nil, err
		}
		w.wrote["svc/"+got.Name] = got.ResourceVersion
		w.wroteAt = w.opts.Clock.Now()
		return 1, got, nil
	}
	got, err = w.opts.Writer.CreateService(ctx, want)
	if apierrors.IsAlreadyExists(err) && w.opts.Config.AdoptConsulK8s {
		u, _, _ := w.opts.Lookup()
		if ctx, err = w.opts.Writer.Prepay(ctx, 1); err != nil { // the adoption's write, beyond the flush's estimate
			return 1, nil, err
		}
		got, err = w.opts.Writer.AdoptService(ctx, want, w.opts.Config.adoptConsulK8s(u, want))
		if err == nil {
			w.log.Info("Adopted consul-k8s's Service of the mirrored name")
			w.takenSeen = false
			w.wrote["svc/"+got.Name] = got.ResourceVersion
			w.wroteAt = w.opts.Clock.Now()
			return 2, got, nil
		}
		if !errors.Is(err, errNotConsulK8s) {
			return 2, nil, err
		}
		err = apierrors.NewAlreadyExists(corev1.Resource("services"), want.Name)
	}
	if apierrors.IsAlreadyExists(err) {
		if w.takenSeen {
			return 0, nil, nil // reported: tried again at the unit's next change, not in a loop
		}
		w.takenSeen = true
		w.log.Warn("A Service of the mirrored name exists and is not ours; leaving it alone")
		if w.opts.Reporter != nil {
			ref := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: want.Namespace, Name: want.Name}}
			w.opts.Reporter.Warning(ref, ReasonNameTaken, "fleetsync would mirror Consul service "+want.Annotations[AnnotationConsulService]+
				" here, but this Service is not fleetsync's; it is left alone")
		}
		return 1, nil, nil
	}
	if err != nil {
		return 1, nil, err
	}
	w.takenSeen = false
	w.wrote["svc/"+got.Name] = got.ResourceVersion
	w.wroteAt = w.opts.Clock.Now()
	return 1, got, nil
}

// apply sends a plan: creates, then updates, then deletes; it stops at the
// first error (the next flush diffs again).
func (w *Worker) apply(ctx context.Context, p Plan) (int, error) {
	n := 0
	now := w.opts.Clock.Now()
	for _, s := range p.Create {
		got, err := w.opts.Writer.CreateSlice(ctx, s)
		n++
		if err != nil {
			return n, err
		}
		w.wrote[got.Name], w.wroteAt = got.ResourceVersion, now
	}
	for _, up := range p.Update {
		got, err := w.opts.Writer.UpdateSlice(ctx, up.Old, up.New)
		n++
		if err != nil {
			return n, err
		}
		w.wrote[got.Name], w.wroteAt = got.ResourceVersion, now
	}
	for _, s := range p.Delete {
		err := w.opts.Writer.DeleteSlice(ctx, s)
		n++
		if err != nil && !apierrors.IsNotFound(err) {
			return n, err
		}
		w.wrote[s.Name], w.wroteAt = "", now
	}
	return n, nil
}

// deleteAll deletes the unit's slices, then its Service (if ours).
func (w *Worker) deleteAll(ctx context.Context, slices []*discoveryv1.EndpointSlice, svc *corev1.Service) (int, bool, error) {
	n, err := w.apply(ctx, Plan{Delete: slices})
	if err != nil || svc == nil {
		return n, false, err
	}
	err = w.opts.Writer.DeleteService(ctx, svc)
	if err != nil && !apierrors.IsNotFound(err) {
		return n + 1, false, err
	}
	w.wrote["svc/"+svc.Name], w.wroteAt = "", w.opts.Clock.Now()
	return n + 1, false, nil
}

// lagging reports whether the cache does not show this worker's last
// writes yet (for at most lagWait): a diff against it would write again.
func (w *Worker) lagging(slices []*discoveryv1.EndpointSlice, svc *corev1.Service) bool {
	if len(w.wrote) == 0 {
		return false
	}
	if w.opts.Clock.Since(w.wroteAt) > lagWait {
		clear(w.wrote)
		return false
	}
	rv := map[string]string{}
	uid := map[string]types.UID{}
	for _, s := range slices {
		rv[s.Name], uid[s.Name] = s.ResourceVersion, s.UID
	}
	if svc != nil {
		rv["svc/"+svc.Name] = svc.ResourceVersion
	}
	for name, want := range w.wrote {
		have, ok := rv[name]
		switch {
		case want == "" && ok: // deleted by us, still cached
			return true
		case want != "" && (!ok || !atLeast(have, want)):
			return true
		}
		delete(w.wrote, name)
	}
	return false
}

// atLeast reports whether resourceVersion have is want or newer: equal,
// or both numbers (as etcd's are) and have the larger.
func atLeast(have, want string) bool {
	if have == want {
		return true
	}
	h, err1 := strconv.ParseUint(have, 10, 64)
	v, err2 := strconv.ParseUint(want, 10, 64)
	return err1 == nil && err2 == nil && h >= v
}

// report sends each problem once while it lasts.
func (w *Worker) report(obj *corev1.Service, reason string, problems []string) {
	now := map[string]bool{}
	for _, p := range problems {
		now[p] = true
		if w.reported[p] {
			continue
		}
		w.log.Warn("Instance skipped", "problem", p)
		if w.opts.Reporter != nil && obj != nil {
			w.opts.Reporter.Warning(obj, reason, p)
		}
	}
	w.reported = now
}
