package worker

import (
	"maps"
	"reflect"
	"runtime"
	"testing"
	"weak"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
)

// registered is in as Consul holds it on our node, with indexes idx.
func registered(in consul.Instance, idx uint64) consul.Registered {
	return consul.Registered{Instance: cloneInstance(in), Node: "k8s-east", ServiceIndex: idx, CheckIndex: idx + 1, HasCheck: true}
}

func ownedMap(rs ...consul.Registered) map[string]consul.Registered {
	m := make(map[string]consul.Registered, len(rs))
	for _, r := range rs {
		m[r.ID] = r
	}
	return m
}

// holdAll is owned as a worker holds it.
func holdAll(owned map[string]consul.Registered) map[string]Held {
	out := make(map[string]Held, len(owned))
	for id, r := range owned {
		out[id] = Hold(r)
	}
	return out
}

// placeEast puts every instance on k8s-east, where registered puts them.
func placeEast(string) string { return "k8s-east" }

func TestDiff(t *testing.T) {
	a := passing(ready("10.0.0.1", "a"), 8080)
	b := passing(ready("10.0.0.2", "b"), 8080)
	c := passing(ready("fd00::3", "c"), 8080)
	ra, rb, rc := registered(a, 10), registered(b, 20), registered(c, 30)

	edit := func(in consul.Instance, f func(*consul.Instance)) consul.Instance {
		in = cloneInstance(in)
		f(&in)
		return in
	}
	tagged := edit(a, func(i *consul.Instance) { i.Tags = []string{"k8s", "blue", "east"} })
	retagged := edit(a, func(i *consul.Instance) { i.Tags = []string{"east", "k8s"} })
	meta := edit(a, func(i *consul.Instance) { i.Meta["team"] = "payments" })
	newPod := edit(a, func(i *consul.Instance) { i.Meta[MetaPod] = "a-2" })
	portField := edit(a, func(i *consul.Instance) { i.Port = 9090 })
	moved := passing(ready("10.0.0.1", "a"), 9100) // new port: new ID
	addrField := edit(a, func(i *consul.Instance) { i.Address = "10.0.0.9" })
	warning := edit(a, func(i *consul.Instance) {
		i.Check = consul.Check{Status: consul.StatusWarning, Output: OutputTerminating}
	})
	output := edit(a, func(i *consul.Instance) { i.Check.Output = "other" })
	renamed := edit(a, func(i *consul.Instance) { i.Name = "shop-web" })
	noCheck := ra
	noCheck.HasCheck, noCheck.CheckIndex = false, 0
	nilTags := registered(edit(a, func(i *consul.Instance) { i.Tags = nil }), 10)
	emptyTags := edit(a, func(i *consul.Instance) { i.Tags = []string{} })
	onNode3 := ra
	onNode3.Node = "k8s-east.3"

	tests := []struct {
		name    string
		desired []consul.Instance
		owned   map[string]consul.Registered
		want    consul.Change
	}{
		{name: "nothing"},
		{name: "all new", desired: []consul.Instance{a, b, c},
			want: consul.Change{Register: []consul.Instance{a, b, c}}},
		{name: "all same", desired: []consul.Instance{a, b, c}, owned: ownedMap(ra, rb, rc)},
		{name: "same, owned check index irrelevant", desired: []consul.Instance{a},
			owned: ownedMap(consul.Registered{Instance: a, Node: "k8s-east", ServiceIndex: 1, CheckIndex: 99, HasCheck: true})},
		{name: "nil and empty tags are the same", desired: []consul.Instance{emptyTags}, owned: ownedMap(nilTags)},
		{name: "all deleted", owned: ownedMap(rc, ra, rb),
			want: consul.Change{Deregister: []consul.Registered{ra, rb, rc}}},
		{name: "changed tags", desired: []consul.Instance{tagged, b}, owned: ownedMap(ra, rb),
			want: consul.Change{Update: []consul.Update{{Want: tagged, Have: ra}}}},
		{name: "tag order is a change", desired: []consul.Instance{retagged}, owned: ownedMap(ra),
			want: consul.Change{Update: []consul.Update{{Want: retagged, Have: ra}}}},
		{name: "changed user meta", desired: []consul.Instance{meta}, owned: ownedMap(ra),
			want: consul.Change{Update: []consul.Update{{Want: meta, Have: ra}}}},
		{name: "changed pod meta", desired: []consul.Instance{newPod}, owned: ownedMap(ra),
			want: consul.Change{Update: []consul.Update{{Want: newPod, Have: ra}}}},
		{name: "changed port: new instance, old one deregistered", desired: []consul.Instance{moved}, owned: ownedMap(ra),
			want: consul.Change{Register: []consul.Instance{moved}, Deregister: []consul.Registered{ra}}},
		{name: "changed port under the same ID", desired: []consul.Instance{portField}, owned: ownedMap(ra),
			want: consul.Change{Update: []consul.Update{{Want: portField, Have: ra}}}},
		{name: "changed address under the same ID", desired: []consul.Instance{addrField}, owned: ownedMap(ra),
			want: consul.Change{Update: []consul.Update{{Want: addrField, Have: ra}}}},
		{name: "changed check status", desired: []consul.Instance{warning, b}, owned: ownedMap(ra, rb),
			want: consul.Change{Update: []consul.Update{{Want: warning, Have: ra}}}},
		{name: "changed check output", desired: []consul.Instance{output}, owned: ownedMap(ra),
			want: consul.Change{Update: []consul.Update{{Want: output, Have: ra}}}},
		{name: "renamed: deregister and register", desired: []consul.Instance{renamed, b}, owned: ownedMap(ra, rb),
			want: consul.Change{Register: []consul.Instance{renamed}, Deregister: []consul.Registered{ra}}},
		{name: "renamed and changed", desired: []consul.Instance{edit(renamed, func(i *consul.Instance) { i.Port = 1 })}, owned: ownedMap(ra),
			want: consul.Change{Register: []consul.Instance{edit(renamed, func(i *consul.Instance) { i.Port = 1 })}, Deregister: []consul.Registered{ra}}},
		{name: "on another node (fewer or more nodes now): deregister and register", desired: []consul.Instance{a, b}, owned: ownedMap(onNode3, rb),
			want: consul.Change{Register: []consul.Instance{a}, Deregister: []consul.Registered{onNode3}}},
		{name: "owned entry missing its check", desired: []consul.Instance{a}, owned: ownedMap(noCheck),
			want: consul.Change{Update: []consul.Update{{Want: a, Have: noCheck}}}},
		{name: "mixed", desired: []consul.Instance{tagged, c}, owned: ownedMap(rb, ra, registered(moved, 40)),
			want: consul.Change{
				Register:   []consul.Instance{c},
				Update:     []consul.Update{{Want: tagged, Have: ra}},
				Deregister: []consul.Registered{registered(moved, 40), rb}, // sorted by ID
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			desired := make([]consul.Instance, len(tt.desired))
			for i, d := range tt.desired {
				desired[i] = cloneInstance(d)
			}
			mark := MarkOf(testCluster(t))
			held := holdAll(tt.owned)
			owned := maps.Clone(held)
			got := Diff(tt.desired, held, placeEast, mark)
			want := tt.want
			want.Deregister = nil
			for _, r := range tt.want.Deregister {
				want.Deregister = append(want.Deregister, Hold(r).Registered(mark))
			}
			want.Update = nil
			for _, u := range tt.want.Update {
				want.Update = append(want.Update, consul.Update{Want: u.Want, Have: Hold(u.Have).Registered(mark)})
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Diff:\n got %+v\nwant %+v", got, want)
			}
			if got.Empty() != (tt.want.Len() == 0) || got.Len() != tt.want.Len() {
				t.Errorf("Empty() = %v, Len() = %d", got.Empty(), got.Len())
			}
			if !reflect.DeepEqual(desired, append([]consul.Instance{}, tt.desired...)) || !maps.Equal(owned, held) {
				t.Error("Diff modified its inputs")
			}
			// Applying the change to owned gives desired.
			after := maps.Clone(held)
			for _, r := range got.Deregister {
				delete(after, r.ID)
			}
			for _, u := range got.Update {
				after[u.Want.ID] = Hold(registered(u.Want, 0))
			}
			for _, r := range got.Register {
				after[r.ID] = Hold(registered(r, 0))
			}
			if again := Diff(tt.desired, after, placeEast, mark); !again.Empty() {
				t.Errorf("change does not converge: %+v left", again)
			}
		})
	}
}

func TestOwnedOf(t *testing.T) {
	cluster := testCluster(t)
	a := registered(passing(ready("10.0.0.1", "a"), 8080), 1)
	other := registered(passing(ready("10.0.0.2", "b"), 8080), 2)
	other.Meta[MetaService] = "api"
	foreignNode := registered(passing(ready("10.0.0.3", "c"), 8080), 3)
	foreignNode.Node = "k8s-west"
	foreignMark := registered(passing(ready("10.0.0.4", "d"), 8080), 4)
	foreignMark.Meta["k8s-cluster"] = "west"
	untagged := registered(passing(ready("10.0.0.5", "e"), 8080), 5)
	untagged.Tags = []string{"k8s"}
	otherNS := registered(passing(ready("10.0.0.6", "f"), 8080), 6)
	otherNS.Meta[MetaNamespace] = "dev"
	noService := registered(passing(ready("10.0.0.7", "g"), 8080), 7)
	delete(noService.Meta, MetaService)

	got := OwnedOf(cluster, testKey, []consul.Registered{a, other, foreignNode, foreignMark, untagged, otherNS})
	if want := holdAll(ownedMap(a)); !maps.Equal(got, want) {
		t.Errorf("OwnedOf = %v, want only %s", got, a.ID)
	}
	byKey, skipped := HoldOwned(cluster, []consul.Registered{a, other, foreignNode, foreignMark, untagged, otherNS, noService})
	want := map[k8s.Key]map[string]Held{
		testKey:                          holdAll(ownedMap(a)),
		{Namespace: "shop", Name: "api"}: holdAll(ownedMap(other)),
		{Namespace: "dev", Name: "web"}:  holdAll(ownedMap(otherNS)),
	}
	if !reflect.DeepEqual(byKey, want) || skipped != 4 {
		t.Errorf("HoldOwned = %v, %d skipped; want %v, 4 skipped", byKey, skipped, want)
	}
}

// TestHoldOwnedKeepsNothingOfTheRead: the held maps reach nothing of the
// entries read (their slice, decoded meta maps), so a restart's read is
// garbage once it is grouped, not once every worker is built.
func TestHoldOwnedKeepsNothingOfTheRead(t *testing.T) {
	cluster := testCluster(t)
	read := []consul.Registered{registered(passing(ready("10.0.0.1", "a"), 8080), 1), registered(passing(ready("10.0.0.2", "a"), 8080), 2)}
	read[1].Tags = append([]string{"own-array"}, read[1].Tags...)
	entry, tags := weak.Make(&read[0]), weak.Make(&read[1].Tags[0]) // the slice's array, the tags' own
	byKey, skipped := HoldOwned(cluster, read)
	read = nil
	runtime.GC()
	if entry.Value() != nil {
		t.Error("the held maps keep the entries read reachable")
	}
	if tags.Value() != nil {
		t.Error("the held maps keep an entry's tags reachable")
	}
	if len(byKey[testKey]) != 2 || skipped != 0 {
		t.Errorf("HoldOwned = %v, %d skipped; want 2 entries of %s", byKey, skipped, testKey)
	}
}
