package k8s

import (
	"fmt"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/client-go/tools/cache"
)

// ingressServiceIndex indexes Ingresses by "namespace/<service>" of every
// backend of a rule path "/".
const ingressServiceIndex = "service"

// IngressRoute is one Ingress rule that sends path "/" to a Service, as
// consul-k8s's ingress sync reads it.
type IngressRoute struct {
	Ingress string // namespace/name of the Ingress
	Rule    int    // index in spec.rules
	Host    string // spec.rules[Rule].host ("" when the rule has none)
	TLS     bool   // Host is listed under spec.tls[].hosts
	// LoadBalancerIP is status.loadBalancer.ingress[0].ip of the Ingress
	// ("" when not provisioned or a hostname).
	LoadBalancerIP string
}

// rootBackends returns the Services that rules of ing send path "/" to, as
// (rule index, service name) pairs in rule order. A rule without an http
// section, without a "/" path or whose "/" backend is not a Service is left
// out: it is just not used.
func rootBackends(ing *networkingv1.Ingress) []struct {
	rule    int
	service string
} {
	var out []struct {
		rule    int
		service string
	}
	for i, rule := range ing.Spec.Rules {
		if rule.HTTP == nil {
			continue
		}
		name := ""
		for _, p := range rule.HTTP.Paths {
			if p.Path == "/" && p.Backend.Service != nil && p.Backend.Service.Name != "" {
				name = p.Backend.Service.Name // the last "/" path wins, as in consul-k8s
			}
		}
		if name != "" {
			out = append(out, struct {
				rule    int
				service string
			}{i, name})
		}
	}
	return out
}

func ingressIndexFunc(obj any) ([]string, error) {
	ing, ok := obj.(*networkingv1.Ingress)
	if !ok {
		return nil, fmt.Errorf("index ingress: unexpected type %T", obj)
	}
	var keys []string
	for _, b := range rootBackends(ing) {
		k := Key{Namespace: ing.Namespace, Name: b.service}.String()
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys, nil
}

// ingressHandler notifies the Services an Ingress routes "/" to, before
// and after the change.
func (w *Watcher) ingressHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { w.ingressChanged(obj) },
		UpdateFunc: func(oldObj, newObj any) {
			if w.isResync(oldObj, newObj) {
				return
			}
			w.ingressChanged(oldObj)
			w.ingressChanged(newObj)
		},
		DeleteFunc: func(obj any) {
			if tombstone, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tombstone.Obj
			}
			w.ingressChanged(obj)
		},
	}
}

func (w *Watcher) ingressChanged(obj any) {
	ing, ok := obj.(*networkingv1.Ingress)
	if !ok {
		w.log.Warn("Ignoring unexpected object from the Ingress informer", "type", typeName(obj))
		return
	}
	keys, _ := ingressIndexFunc(ing)
	for _, k := range keys {
		if key, err := ParseKey(k); err == nil {
			w.notify(key)
		}
	}
}

// ingressRoutes returns the routes of every cached Ingress that sends "/"
// to key, sorted by Ingress then rule; nil without an Ingress informer.
func (w *Watcher) ingressRoutes(key Key) []IngressRoute {
	if w.ingresses == nil {
		return nil
	}
	objs, err := w.ingresses.GetIndexer().ByIndex(ingressServiceIndex, key.String())
	if err != nil {
		w.log.Warn("Cannot look up the Ingresses of a Service", "service", key, "error", err)
		return nil
	}
	var out []IngressRoute
	for _, obj := range objs {
		ing, ok := obj.(*networkingv1.Ingress)
		if !ok {
			continue
		}
		lbIP := ""
		if lb := ing.Status.LoadBalancer.Ingress; len(lb) > 0 {
			lbIP = lb[0].IP
		}
		for _, b := range rootBackends(ing) {
			if b.service != key.Name {
				continue
			}
			host := ing.Spec.Rules[b.rule].Host
			out = append(out, IngressRoute{
				Ingress:        ing.Namespace + "/" + ing.Name,
				Rule:           b.rule,
				Host:           host,
				TLS:            host != "" && tlsHost(ing, host),
				LoadBalancerIP: lbIP,
			})
		}
	}
	slices.SortFunc(out, func(a, b IngressRoute) int {
		if a.Ingress != b.Ingress {
			if a.Ingress < b.Ingress {
				return -1
			}
			return 1
		}
		return a.Rule - b.Rule
	})
	return out
}

func tlsHost(ing *networkingv1.Ingress, host string) bool {
	for _, t := range ing.Spec.TLS {
		if slices.Contains(t.Hosts, host) {
			return true
		}
	}
	return false
}
