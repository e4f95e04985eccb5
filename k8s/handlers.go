package k8s

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
)

// serviceHandler turns Service events into Changed calls.
func (w *Watcher) serviceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: w.serviceChanged,
		UpdateFunc: func(oldObj, newObj any) {
			if w.isResync(oldObj, newObj) {
				return
			}
			w.serviceChanged(newObj)
		},
		DeleteFunc: w.serviceDeleted,
	}
}

// sliceHandler turns EndpointSlice events into Changed calls for the
// Service named in the slice's label.
func (w *Watcher) sliceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: w.sliceChanged,
		UpdateFunc: func(oldObj, newObj any) {
			if w.isResync(oldObj, newObj) {
				return
			}
			w.sliceMoved(oldObj, newObj)
			w.sliceChanged(newObj)
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			w.sliceChanged(obj)
		},
	}
}

func (w *Watcher) serviceChanged(obj any) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		w.log.Warn("Ignoring unexpected object from the Service informer", "type", typeName(obj))
		return
	}
	w.notifyService(Key{Namespace: svc.Namespace, Name: svc.Name})
}

// notifyService passes a Service's key to the handler and to OnService.
func (w *Watcher) notifyService(key Key) {
	w.notify(key)
	if w.onService != nil {
		w.onService(key)
	}
}

// serviceDeleted notifies the deleted Service; a tombstone's key is used
// as is, whatever its last known object.
func (w *Watcher) serviceDeleted(obj any) {
	tombstone, ok := obj.(cache.DeletedFinalStateUnknown)
	if !ok {
		w.serviceChanged(obj)
		return
	}
	key, err := ParseKey(tombstone.Key)
	if err != nil {
		w.log.Warn("Ignoring Service tombstone with a bad key", "key", tombstone.Key, "error", err)
		return
	}
	w.notifyService(key)
}

func (w *Watcher) sliceChanged(obj any) {
	s, ok := obj.(*cachedSlice)
	if !ok {
		w.log.Warn("Ignoring unexpected object from the EndpointSlice informer", "type", typeName(obj))
		return
	}
	if key, ok := s.serviceKey(); ok {
		w.notify(key)
	}
}

// sliceMoved notifies the Service a slice used to belong to, when an update
// changed its kubernetes.io/service-name label.
func (w *Watcher) sliceMoved(oldObj, newObj any) {
	oldSlice, ok1 := oldObj.(*cachedSlice)
	newSlice, ok2 := newObj.(*cachedSlice)
	if !ok1 || !ok2 {
		return
	}
	oldKey, hadKey := oldSlice.serviceKey()
	newKey, _ := newSlice.serviceKey()
	if hadKey && oldKey != newKey {
		w.notify(oldKey)
	}
}

// isResync reports whether an update only repeats a cached object (same
// resourceVersion: an informer resync or a relist) and should be dropped,
// which it is unless a resync period asked for such periodic looks.
func (w *Watcher) isResync(oldObj, newObj any) bool {
	if w.resync > 0 {
		return false
	}
	oldMeta, err1 := meta.Accessor(oldObj)
	newMeta, err2 := meta.Accessor(newObj)
	if err1 != nil || err2 != nil {
		return false
	}
	return oldMeta.GetResourceVersion() == newMeta.GetResourceVersion()
}

// notify passes key to the handler, if any.
func (w *Watcher) notify(key Key) {
	if w.handler != nil {
		w.handler.Changed(key)
	}
}
