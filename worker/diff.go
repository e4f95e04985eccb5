package worker

import (
	"sort"

	"github.com/fleetsync/fleetsync/consul"
)

// Diff returns the change that turns owned into desired. It is a pure
// function: desired are stamped instances with unique IDs; owned are the
// verified entries of this Service on our nodes, keyed by ID; nodeOf names
// the node an instance belongs on (nil: wherever it is). An instance whose
// Consul name changed, or that sits on another node than nodeOf says (the
// cluster's number of nodes changed), is deregistered and registered again
// in the same change (the catalog cannot rename or move an entry in place).
// The entries it updates or deletes carry mark (Held.Registered).
func Diff(desired []consul.Instance, owned map[string]Held, nodeOf func(id string) string, mark Mark) consul.Change {
	var ch consul.Change
	want := make(map[string]bool, len(desired))
	for _, d := range desired {
		want[d.ID] = true
		have, ok := owned[d.ID]
		switch {
		case !ok:
			ch.Register = append(ch.Register, d)
		case have.Name != d.Name, nodeOf != nil && have.Node != nodeOf(d.ID):
			ch.Deregister = append(ch.Deregister, have.Registered(mark))
			ch.Register = append(ch.Register, d)
		case !have.HasCheck || !have.Is(d):
			ch.Update = append(ch.Update, consul.Update{Want: d, Have: have.Registered(mark)})
		}
	}
	for id, have := range owned {
		if !want[id] {
			ch.Deregister = append(ch.Deregister, have.Registered(mark))
		}
	}
	sort.Slice(ch.Deregister, func(i, j int) bool { return ch.Deregister[i].ID < ch.Deregister[j].ID })
	return ch
}
