package supervisor

import (
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/fleetsync/fleetsync/k8s"
)

// ReasonNameCollision is the Event reason for two Services that map to one
// Consul service name without asking for it (through --service-prefix or
// --add-namespace-suffix rather than the service-name annotation).
const ReasonNameCollision = "ConsulNameCollision"

// nameIndex knows the Consul name of every running worker's Service, to
// tell when two Services map to one Consul name by accident: their
// instances would be merged silently. Names chosen with the service-name
// annotation on both sides are a merge on purpose and not reported. Names
// are compared as Consul compares them: without case ("Web" and "web" are
// one Consul service).
type nameIndex struct {
	mu    sync.Mutex
	byKey map[k8s.Key]nameUse
	// byName lists the Services of each name, folded (foldName): one,
	// almost always (a
	// slice of one costs 32 bytes, a map of one ~0.6 KiB: 6 MiB at
	// 10,000 Services).
	byName map[string][]k8s.Key
}

type nameUse struct {
	name    string
	derived bool // from the Kubernetes name, not the service-name annotation
}

// set records key's Consul name. It returns the other Services sharing the
// name when key has just joined them and one of the names is derived.
func (x *nameIndex) set(key k8s.Key, name string, derived bool) []k8s.Key {
	x.mu.Lock()
	defer x.mu.Unlock()
	use := nameUse{name, derived}
	if prev, ok := x.byKey[key]; ok {
		if prev == use {
			return nil
		}
		x.dropLocked(key, prev.name)
	}
	if x.byKey == nil {
		x.byKey, x.byName = map[k8s.Key]nameUse{}, map[string][]k8s.Key{}
	}
	x.byKey[key] = use
	folded := foldName(name)
	set := append(x.byName[folded], key) // not there: dropped above, or new
	x.byName[folded] = set
	accidental := derived
	var others []k8s.Key
	for _, k := range set {
		if k != key {
			others = append(others, k)
			accidental = accidental || x.byKey[k].derived
		}
	}
	if len(others) == 0 || !accidental {
		return nil
	}
	sort.Slice(others, func(i, j int) bool { return others[i].String() < others[j].String() })
	return others
}

// remove forgets key (its worker stopped).
func (x *nameIndex) remove(key k8s.Key) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if prev, ok := x.byKey[key]; ok {
		x.dropLocked(key, prev.name)
		delete(x.byKey, key)
	}
}

func (x *nameIndex) dropLocked(key k8s.Key, name string) {
	folded := foldName(name)
	set := slices.DeleteFunc(x.byName[folded], func(k k8s.Key) bool { return k == key })
	if len(set) == 0 {
		delete(x.byName, folded)
		return
	}
	x.byName[folded] = set
}

// foldName is a Consul service name as Consul compares it: its catalog
// indexes service names lowercased.
func foldName(name string) string { return strings.ToLower(name) }

// nameSeen is a worker's report of its Consul name.
func (s *Supervisor) nameSeen(key k8s.Key, name string, derived bool) {
	others := s.names.set(key, name, derived)
	if len(others) == 0 {
		return
	}
	list := make([]string, len(others))
	for i, k := range others {
		list[i] = k.String()
	}
	msg := "Consul service name " + `"` + name + `"` + " of Service " + key.String() + " is also that of Service " + strings.Join(list, ", ") +
		" (through --service-prefix or --add-namespace-suffix): their instances are merged under one Consul service; set the consul.hashicorp.com/service-name annotation to keep them apart, or to the same name on both to merge them on purpose"
	s.log.Warn("Two Services map to one Consul service name", "namespace", key.Namespace, "service", key.Name, "consul_name", name, "also", strings.Join(list, ","))
	if s.opts.Reporter != nil {
		if svc, _ := s.lookup(key); svc != nil && svc.Object != nil {
			s.opts.Reporter.Warning(svc.Object, ReasonNameCollision, msg)
		}
	}
}
