package k8s

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// sliceNodeIndex indexes EndpointSlices by the nodeName of their endpoints.
const sliceNodeIndex = "node"

// NodeAddress is one entry of a Node's status.addresses.
type NodeAddress struct {
	Type    corev1.NodeAddressType
	Address string
}

// stripNode keeps of a Node only what fleetsync reads: its name, its
// resourceVersion (to tell a resync from a change) and status.addresses. A
// Node object is several KiB (images, conditions, labels); this keeps a
// 5,000-node cache at a few hundred KiB.
func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone: leave it alone
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Status:     corev1.NodeStatus{Addresses: slices.Clone(n.Status.Addresses)},
	}, nil
}

// sliceNodeIndexFunc indexes a labelled slice under every nodeName of its
// endpoints, so that the Services with endpoints on a node are found
// without a scan.
func sliceNodeIndexFunc(obj any) ([]string, error) {
	s, ok := obj.(*cachedSlice)
	if !ok {
		return nil, fmt.Errorf("index endpointslice: unexpected type %T", obj)
	}
	if _, ok := s.serviceKey(); !ok {
		return nil, nil
	}
	var nodes []string
	for _, ep := range s.endpoints {
		if ep.node != "" && !slices.Contains(nodes, ep.node) {
			nodes = append(nodes, ep.node)
		}
	}
	return nodes, nil
}

// nodeHandler turns a Node whose addresses changed (or that came or went)
// into Changed calls for the NodePort Services with endpoints on it: the
// only Services whose instances carry node addresses.
func (w *Watcher) nodeHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: w.nodeChanged,
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if ok1 && ok2 && slices.Equal(o.Status.Addresses, n.Status.Addresses) && w.resync == 0 {
				return
			}
			w.nodeChanged(newObj)
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				w.notifyNode(tombstone.Key)
				return
			}
			w.nodeChanged(obj)
		},
	}
}

func (w *Watcher) nodeChanged(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		w.log.Warn("Ignoring unexpected object from the Node informer", "type", typeName(obj))
		return
	}
	w.notifyNode(n.Name)
}

// notifyNode notifies every NodePort Service with an endpoint on node, once
// each.
func (w *Watcher) notifyNode(node string) {
	for _, key := range w.servicesOnNode(node) {
		w.notify(key)
	}
}

// servicesOnNode returns the NodePort Services with an endpoint on node,
// sorted and deduplicated.
func (w *Watcher) servicesOnNode(node string) []Key {
	objs, err := w.slices.GetIndexer().ByIndex(sliceNodeIndex, node)
	if err != nil {
		w.log.Warn("Cannot look up the EndpointSlices of a node", "node", node, "error", err)
		return nil
	}
	var keys []Key
	for _, obj := range objs {
		s, ok := obj.(*cachedSlice)
		if !ok {
			continue
		}
		key, ok := s.serviceKey()
		if !ok || slices.Contains(keys, key) || !w.isNodePort(key) {
			continue
		}
		keys = append(keys, key)
	}
	slices.SortFunc(keys, compareKeys)
	return keys
}

func (w *Watcher) isNodePort(key Key) bool {
	obj, ok, err := w.services.GetIndexer().GetByKey(key.String())
	if err != nil || !ok {
		return false
	}
	svc, ok := obj.(*corev1.Service)
	return ok && svc.Spec.Type == corev1.ServiceTypeNodePort
}

// nodeAddresses returns the cached addresses of each of names found in the
// Node cache; nil without a Node informer.
func (w *Watcher) nodeAddresses(names []string) map[string][]NodeAddress {
	if w.nodes == nil || len(names) == 0 {
		return nil
	}
	out := make(map[string][]NodeAddress, len(names))
	for _, name := range names {
		obj, ok, err := w.nodes.GetIndexer().GetByKey(name)
		if err != nil || !ok {
			continue
		}
		n, ok := obj.(*corev1.Node)
		if !ok {
			continue
		}
		addrs := make([]NodeAddress, 0, len(n.Status.Addresses))
		for _, a := range n.Status.Addresses {
			addrs = append(addrs, NodeAddress{Type: a.Type, Address: a.Address})
		}
		out[name] = addrs
	}
	return out
}

func compareKeys(a, b Key) int {
	if a.Namespace != b.Namespace {
		if a.Namespace < b.Namespace {
			return -1
		}
		return 1
	}
	switch {
	case a.Name < b.Name:
		return -1
	case a.Name > b.Name:
		return 1
	}
	return 0
}
