package k8s

import (
	"context"
	"errors"
	"fmt"
	"io"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// lastAppliedAnnotation is written by kubectl apply: a full copy of the
// object that fleetsync never reads.
const lastAppliedAnnotation = "kubectl.kubernetes.io/last-applied-configuration"

// stripForCache drops the parts of an object fleetsync never reads before
// the informer stores it: managedFields and kubectl's last-applied copy.
// It mutates in place (the informer hands it a fresh object) and is
// idempotent.
func stripForCache(obj any) (any, error) {
	m, err := meta.Accessor(obj)
	if err != nil {
		return obj, nil // e.g. a tombstone: leave it alone
	}
	m.SetManagedFields(nil)
	if annotations := m.GetAnnotations(); annotations != nil {
		delete(annotations, lastAppliedAnnotation)
	}
	return obj, nil
}

// watchErrorHandler logs a dropped watch through hclog: expiry quietly,
// a normal close or a cancelled context not at all. The informer relists
// or rewatches by itself.
func (w *Watcher) watchErrorHandler(kind string) cache.WatchErrorHandlerWithContext {
	return func(ctx context.Context, _ *cache.Reflector, err error) {
		switch {
		case ctx.Err() != nil, errors.Is(err, io.EOF):
		case apierrors.IsResourceExpired(err), apierrors.IsGone(err):
			w.log.Debug("Watch expired, relisting", "kind", kind, "error", err)
		default:
			w.log.Warn("Watch failed, retrying", "kind", kind, "error", err)
		}
	}
}

func typeName(obj any) string { return fmt.Sprintf("%T", obj) }
