package consultest

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/fleetsync/fleetsync/test/stack"
)

// script is one scenario of Consul semantics: it drives a Consul through
// the api client and returns a transcript of what it saw, free of absolute
// index values (those differ between the twin and an agent), so one table
// runs against both.
type script struct {
	name string
	run  func(c *api.Client, node string) []string
	want []string
}

// send sends ops and describes the outcome: "ok" or each failed op as
// "op N: reason".
func send(c *api.Client, ops ...*api.TxnOp) (string, *api.TxnResponse) {
	ok, resp, _, err := c.Txn().Txn(ops, nil)
	switch {
	case err != nil:
		return "error: " + err.Error(), nil
	case ok:
		return "ok", resp
	}
	var out []string
	for _, e := range resp.Errors {
		out = append(out, fmt.Sprintf("op %d: %s", e.OpIndex, e.What))
	}
	return strings.Join(out, "; "), resp
}

func nodeOp(verb api.NodeOp, name, addr string, meta map[string]string, index uint64) *api.TxnOp {
	return &api.TxnOp{Node: &api.NodeTxnOp{Verb: verb, Node: api.Node{Node: name, Address: addr, Meta: meta, ModifyIndex: index}}}
}

func svcOp(verb api.ServiceOp, node, id string, port int, index uint64) *api.TxnOp {
	return &api.TxnOp{Service: &api.ServiceTxnOp{Verb: verb, Node: node, Service: api.AgentService{
		ID: id, Service: "web", Port: port, Tags: []string{"t"}, Meta: map[string]string{"m": "1"}, ModifyIndex: index}}}
}

func checkOp(verb api.CheckOp, node, svcID, status string, index uint64) *api.TxnOp {
	return &api.TxnOp{Check: &api.CheckTxnOp{Verb: verb, Check: api.HealthCheck{
		Node: node, CheckID: "c-" + svcID, Name: "ready", Status: status, ServiceID: svcID, Type: "kubernetes", ModifyIndex: index}}}
}

// services is the node's services as "id:port".
func services(c *api.Client, node string) string {
	list, _, err := c.Catalog().NodeServiceList(node, nil)
	if err != nil {
		return "error: " + err.Error()
	}
	if list == nil || list.Node == nil {
		return "no node"
	}
	var out []string
	for _, s := range list.Services {
		out = append(out, fmt.Sprintf("%s:%d", s.ID, s.Port))
	}
	slices.Sort(out)
	return "[" + strings.Join(out, " ") + "]"
}

func check(c *api.Client, node, id string) *api.HealthCheck {
	checks, _, err := c.Health().Node(node, nil)
	if err != nil {
		return nil
	}
	for _, hc := range checks {
		if hc.CheckID == id {
			return hc
		}
	}
	return nil
}

func catalogNode(c *api.Client, node string) *api.Node {
	n, _, err := c.Catalog().Node(node, nil)
	if err != nil || n == nil {
		return nil
	}
	return n.Node
}

func nodeIndex(c *api.Client, node string) uint64 {
	_, meta, err := c.Catalog().NodeServiceList(node, &api.QueryOptions{Filter: `ID == "" and ID != ""`})
	if err != nil {
		return 0
	}
	return meta.LastIndex
}

func kvIndex(c *api.Client, key string) uint64 {
	_, meta, err := c.KV().Get(key, nil)
	if err != nil {
		return 0
	}
	return meta.LastIndex
}

// move says how an index moved.
func move(before, after uint64) string {
	switch {
	case after > before:
		return "grew"
	case after == before:
		return "same"
	}
	return "dropped"
}

// indexMoves names the indexes a write moved, of: web's and api's own
// (health/service), node's (its services' reads), the nodes table's and
// the checks table's (catalog-wide, consul.CatalogMarks).
func indexMoves(c *api.Client, node string, write func()) string {
	read := func() []uint64 {
		var out []uint64
		for _, name := range []string{"web", "api"} {
			_, meta, _ := c.Health().Service(name, "", false, &api.QueryOptions{Filter: `Service.ID == "" and Service.ID != ""`})
			out = append(out, meta.LastIndex)
		}
		_, meta, _ := c.Catalog().Nodes(&api.QueryOptions{NodeMeta: map[string]string{"probe": "none"}})
		nodes := meta.LastIndex
		_, meta, _ = c.Health().Node("probe", &api.QueryOptions{Filter: `CheckID == "" and CheckID != ""`})
		return append(out, nodeIndex(c, node), nodes, meta.LastIndex)
	}
	before := read()
	write()
	after := read()
	var moved []string
	for i, name := range []string{"web", "api", "node", "nodes", "checks"} {
		if after[i] != before[i] {
			moved = append(moved, name)
		}
	}
	return strings.Join(moved, " ")
}

var scripts = []script{
	{
		name: "which indexes a write moves",
		run: func(c *api.Client, node string) []string {
			apiOp := &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: node, Service: api.AgentService{ID: "x", Service: "api", Port: 90}}}
			var out []string
			for _, w := range []func(){
				func() {
					send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), svcOp(api.ServiceSet, node, "a", 80, 0), apiOp)
				},
				func() { send(c, svcOp(api.ServiceSet, node, "a", 81, 0)) },
				func() { send(c, checkOp(api.CheckSet, node, "a", api.HealthPassing, 0)) },
				func() { send(c, checkOp(api.CheckSet, node, "a", api.HealthCritical, 0)) },
				func() {
					send(c, &api.TxnOp{Check: &api.CheckTxnOp{Verb: api.CheckDelete, Check: api.HealthCheck{Node: node, CheckID: "c-a"}}})
				},
				func() { send(c, nodeOp(api.NodeSet, node, "10.0.0.2", nil, 0)) },
				func() { send(c, svcOp(api.ServiceDelete, node, "a", 0, 0)) },
				func() { _, _ = c.KV().Put(&api.KVPair{Key: node + "/k", Value: []byte("x")}, nil) },
			} {
				out = append(out, indexMoves(c, node, w))
			}
			return out
		},
		want: []string{
			"web api node nodes",    // a new node with a web and an api instance
			"web node nodes",        // the web instance edited
			"web checks",            // its check added
			"web checks",            // its check's status changed
			"web checks",            // its check deleted
			"web api node nodes",    // the node's address changed
			"web node nodes checks", // the web instance deleted (checks too, though it had none)
			"",                      // a KV write
		},
	},
	{
		name: "a txn is all or nothing",
		run: func(c *api.Client, node string) []string {
			r, _ := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0),
				svcOp(api.ServiceCAS, node, "a", 80, 0),
				svcOp(api.ServiceCAS, node, "b", 80, 12345))
			return []string{r, services(c, node)}
		},
		want: []string{`op 2: failed to set service "b" on node "N", index is stale`, "no node"},
	},
	{
		name: "service cas creates only when absent and updates only at the index read",
		run: func(c *api.Client, node string) []string {
			r1, resp := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, node, "a", 80, 0))
			first := resp.Results[1].Service.ModifyIndex
			r2, _ := send(c, svcOp(api.ServiceCAS, node, "a", 81, 0))
			r3, resp := send(c, svcOp(api.ServiceCAS, node, "a", 82, first))
			second := resp.Results[0].Service.ModifyIndex
			r4, _ := send(c, svcOp(api.ServiceCAS, node, "a", 83, first))
			r5, _ := send(c, svcOp(api.ServiceCAS, node, "missing", 83, first))
			return []string{r1, r2, r3, move(first, second), r4, r5, services(c, node)}
		},
		want: []string{"ok", `op 0: failed to set service "a" on node "N", index is stale`, "ok", "grew",
			`op 0: failed to set service "a" on node "N", index is stale`,
			`op 0: failed to set service "missing" on node "N", index is stale`, "[a:82]"},
	},
	{
		name: "a node op replaces the node record, meta included",
		run: func(c *api.Client, node string) []string {
			if _, err := c.Catalog().Register(&api.CatalogRegistration{Node: node, Address: "10.0.0.1",
				NodeMeta: map[string]string{"a": "1", "b": "2"}, Service: &api.AgentService{ID: "s", Service: "web", Port: 1}}, nil); err != nil {
				return []string{err.Error()}
			}
			before := catalogNode(c, node)
			r, _ := send(c, nodeOp(api.NodeCAS, node, "10.0.0.2", map[string]string{"a": "1"}, before.ModifyIndex))
			after := catalogNode(c, node)
			return []string{r, after.Address, fmt.Sprint(after.Meta), move(before.ModifyIndex, after.ModifyIndex), services(c, node)}
		},
		want: []string{"ok", "10.0.0.2", "map[a:1]", "grew", "[s:1]"},
	},
	{
		name: "node cas and delete-cas",
		run: func(c *api.Client, node string) []string {
			r1, resp := send(c, nodeOp(api.NodeCAS, node, "10.0.0.1", nil, 0), svcOp(api.ServiceSet, node, "a", 80, 0), checkOp(api.CheckSet, node, "a", "passing", 0))
			idx := resp.Results[0].Node.ModifyIndex
			r2, _ := send(c, nodeOp(api.NodeCAS, node, "10.0.0.1", nil, 0))
			r3, _ := send(c, nodeOp(api.NodeCAS, node, "10.0.0.1", nil, idx+1000))
			r4, _ := send(c, nodeOp(api.NodeDeleteCAS, node, "", nil, idx+1000))
			r5, _ := send(c, nodeOp(api.NodeDeleteCAS, node, "", nil, idx))
			return []string{r1, r2, r3, r4, r5, services(c, node), fmt.Sprint(check(c, node, "c-a") == nil)}
		},
		want: []string{"ok", `op 0: failed to set node "N", index is stale`, `op 0: failed to set node "N", index is stale`,
			`op 0: failed to delete node "N", index is stale`, "ok", "no node", "true"},
	},
	{
		name: "an identical write keeps the ModifyIndex; a check-only change moves only the check",
		run: func(c *api.Client, node string) []string {
			_, resp := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, node, "a", 80, 0), checkOp(api.CheckCAS, node, "a", "passing", 0))
			svc, hc := resp.Results[1].Service, resp.Results[2].Check
			nodeBefore := nodeIndex(c, node)
			r1, resp := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, node, "a", 80, svc.ModifyIndex), checkOp(api.CheckCAS, node, "a", "passing", hc.ModifyIndex))
			same := []string{move(resp.Results[0].Node.ModifyIndex, resp.Results[0].Node.ModifyIndex), move(svc.ModifyIndex, resp.Results[1].Service.ModifyIndex), move(hc.ModifyIndex, resp.Results[2].Check.ModifyIndex), move(nodeBefore, nodeIndex(c, node))}
			r2, resp := send(c, svcOp(api.ServiceCAS, node, "a", 80, svc.ModifyIndex), checkOp(api.CheckCAS, node, "a", "warning", hc.ModifyIndex))
			got := check(c, node, "c-a")
			return append(same, r1, r2, move(svc.ModifyIndex, resp.Results[0].Service.ModifyIndex), move(hc.ModifyIndex, resp.Results[1].Check.ModifyIndex),
				got.Status, got.ServiceName, fmt.Sprint(got.ServiceTags), move(nodeBefore, nodeIndex(c, node)))
		},
		want: []string{"same", "same", "same", "same", "ok", "ok", "same", "grew", "warning", "web", "[t]", "same"},
	},
	{
		name: "service delete-cas removes the service and its check",
		run: func(c *api.Client, node string) []string {
			_, resp := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, node, "a", 80, 0), checkOp(api.CheckCAS, node, "a", "passing", 0),
				svcOp(api.ServiceCAS, node, "b", 80, 0))
			idx := resp.Results[1].Service.ModifyIndex
			before := nodeIndex(c, node)
			r1, _ := send(c, svcOp(api.ServiceDeleteCAS, node, "a", 0, idx+1000))
			r2, _ := send(c, svcOp(api.ServiceDeleteCAS, node, "a", 0, idx))
			r3, _ := send(c, svcOp(api.ServiceDeleteCAS, node, "a", 0, idx))
			r4, _ := send(c, svcOp(api.ServiceDelete, node, "gone", 0, 0))
			return []string{r1, r2, r3, r4, services(c, node), fmt.Sprint(check(c, node, "c-a") == nil), move(before, nodeIndex(c, node))}
		},
		want: []string{`op 0: failed to delete service "a" on node "N", index is stale`, "ok",
			`op 0: failed to delete service "a" on node "N", index is stale`, "ok", "[b:80]", "true", "grew"},
	},
	{
		name: "a service needs its node, a service check its service",
		run: func(c *api.Client, node string) []string {
			r1, _ := send(c, svcOp(api.ServiceCAS, node, "a", 80, 0))
			r2, _ := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), checkOp(api.CheckSet, node, "a", "passing", 0))
			// Consul 1.14 loses a check cas's error: the op "succeeds",
			// writes nothing and has no result.
			r3, resp := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), checkOp(api.CheckCAS, node, "a", "passing", 0))
			return []string{r1, r2, r3, fmt.Sprint(len(resp.Results)), fmt.Sprint(check(c, node, "c-a") == nil)}
		},
		want: []string{"op 0: Missing node registration", "op 1: Missing service registration", "ok", "1", "true"},
	},
	{
		name: "a check defaults to critical, takes its service's name and tags, and a txn drops its type",
		run: func(c *api.Client, node string) []string {
			send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, node, "a", 80, 0), checkOp(api.CheckCAS, node, "a", "", 0))
			hc := check(c, node, "c-a")
			return []string{hc.Status, hc.ServiceName, fmt.Sprint(hc.ServiceTags), fmt.Sprintf("%q", hc.Type)}
		},
		want: []string{"critical", "web", "[t]", `""`},
	},
	{
		name: "indexes only grow",
		run: func(c *api.Client, node string) []string {
			missing := nodeIndex(c, node)
			_, resp := send(c, nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, node, "a", 80, 0), svcOp(api.ServiceCAS, node, "b", 80, 0))
			i1 := nodeIndex(c, node)
			send(c, svcOp(api.ServiceDeleteCAS, node, "a", 0, resp.Results[1].Service.ModifyIndex))
			i2 := nodeIndex(c, node)
			send(c, svcOp(api.ServiceCAS, node, "a", 80, 12345)) // fails
			i3 := nodeIndex(c, node)
			k0 := kvIndex(c, node+"/missing")
			if _, err := c.KV().Put(&api.KVPair{Key: node + "/other", Value: []byte("x")}, nil); err != nil {
				return []string{err.Error()}
			}
			k1 := kvIndex(c, node+"/missing")
			if _, err := c.KV().Delete(node+"/other", nil); err != nil {
				return []string{err.Error()}
			}
			k2 := kvIndex(c, node+"/missing")
			return []string{move(missing, i1), move(i1, i2), move(i2, i3), move(k0, k1), move(k1, k2), fmt.Sprint(missing > 0)}
		},
		want: []string{"grew", "grew", "same", "grew", "grew", "true"},
	},
	{
		name: "a kv check-index guard rolls the catalog ops back",
		run: func(c *api.Client, node string) []string {
			key := node + "/claim"
			r0, resp := send(c, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCAS, Key: key, Value: []byte("mine"), Index: 0}})
			idx := resp.Results[0].KV.ModifyIndex
			guard := func(i uint64) *api.TxnOp {
				return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: key, Index: i}}
			}
			r1, _ := send(c, guard(999999), nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0))
			s1 := services(c, node)
			r2, _ := send(c, guard(idx), nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0))
			r3, _ := send(c, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckIndex, Key: node + "/none", Index: 1}})
			return []string{r0, strings.Replace(r1, fmt.Sprint(idx), "I", 1), s1, r2, services(c, node), r3}
		},
		want: []string{"ok", `op 0: failed index check for key "N/claim", current modify index I != 999999`, "no node", "ok", "[]",
			`op 0: failed to check index, key "N/none" doesn't exist`},
	},
	{
		name: "a kv check-session guard passes only the session holding the lock",
		run: func(c *api.Client, node string) []string {
			key := node + "/claim"
			var ids []string
			for range 2 {
				id, _, err := c.Session().Create(&api.SessionEntry{TTL: "60s", Behavior: api.SessionBehaviorRelease}, nil)
				if err != nil {
					return []string{err.Error()}
				}
				defer func() { _, _ = c.Session().Destroy(id, nil) }()
				ids = append(ids, id)
			}
			got, _, err := c.KV().Acquire(&api.KVPair{Key: key, Value: []byte("mine"), Session: ids[0]}, nil)
			if err != nil {
				return []string{err.Error()}
			}
			taken, _, err := c.KV().Acquire(&api.KVPair{Key: key, Value: []byte("theirs"), Session: ids[1]}, nil)
			if err != nil {
				return []string{err.Error()}
			}
			guard := func(k, id string) *api.TxnOp {
				return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: k, Session: id}}
			}
			r0, _ := send(c, guard(key, ids[1]), nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0))
			s0 := services(c, node)
			r1, _ := send(c, guard(key, ids[0]), nodeOp(api.NodeSet, node, "10.0.0.1", nil, 0))
			if _, err := c.Session().Destroy(ids[0], nil); err != nil {
				return []string{err.Error()}
			}
			r2, _ := send(c, guard(key, ids[0]))
			r3, _ := send(c, guard(node+"/none", ids[1]))
			p, _, err := c.KV().Get(key, nil)
			if err != nil || p == nil {
				return []string{fmt.Sprint("read ", key, ": ", err)}
			}
			names := strings.NewReplacer(ids[0], "S0", ids[1], "S1")
			return []string{fmt.Sprint(got, taken), names.Replace(r0), s0, r1, services(c, node), names.Replace(r2), r3,
				fmt.Sprintf("lock %d session %q value %s", p.LockIndex, p.Session, p.Value)}
		},
		want: []string{"true false", `op 0: failed session check for key "N/claim", current session "S0" != "S1"`, "no node", "ok", "[]",
			`op 0: failed session check for key "N/claim", current session "" != "S0"`, `op 0: failed to check session, key "N/none" doesn't exist`,
			`lock 1 session "" value mine`},
	},
	{
		name: "a kv delete-cas of a missing key succeeds, a stale one fails",
		run: func(c *api.Client, node string) []string {
			key := node + "/gone"
			del := func(i uint64) *api.TxnOp {
				return &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVDeleteCAS, Key: key, Index: i}}
			}
			r0, _ := send(c, del(12345))
			ok, _, err := c.KV().DeleteCAS(&api.KVPair{Key: key, ModifyIndex: 12345}, nil)
			if err != nil {
				return []string{err.Error()}
			}
			send(c, &api.TxnOp{KV: &api.KVTxnOp{Verb: api.KVSet, Key: key, Value: []byte("v")}})
			r1, _ := send(c, del(1))
			r2, _ := send(c, svcOp(api.ServiceDeleteCAS, node, "none", 0, 12345))
			r3, _ := send(c, nodeOp(api.NodeDeleteCAS, node, "", nil, 12345))
			return []string{r0, fmt.Sprint(ok), r1, r2, r3}
		},
		want: []string{"ok", "true", `op 0: failed to delete key "N/gone", index is stale`,
			`op 0: failed to delete service "none" on node "N", index is stale`, `op 0: failed to delete node "N", index is stale`},
	},
	{
		name: "reads filter like Consul",
		run: func(c *api.Client, node string) []string {
			send(c, nodeOp(api.NodeSet, node, "10.0.0.1", map[string]string{"owner": node}, 0), svcOp(api.ServiceCAS, node, "web-1", 80, 0),
				svcOp(api.ServiceCAS, node, "web-2", 81, 0), svcOp(api.ServiceCAS, node, "db-1", 82, 0),
				checkOp(api.CheckCAS, node, "web-1", "passing", 0), checkOp(api.CheckCAS, node, "db-1", "passing", 0))
			list, _, err := c.Catalog().NodeServiceList(node, &api.QueryOptions{Filter: `ID matches "^web-"`})
			if err != nil {
				return []string{err.Error()}
			}
			var ids []string
			for _, s := range list.Services {
				ids = append(ids, s.ID)
			}
			slices.Sort(ids)
			checks, _, err := c.Health().Node(node, &api.QueryOptions{Filter: `ServiceID matches "^db-"`})
			if err != nil {
				return []string{err.Error()}
			}
			nodes, _, err := c.Catalog().Nodes(&api.QueryOptions{NodeMeta: map[string]string{"owner": node}, Filter: fmt.Sprintf("Node == %q or Node matches %q", node, "^"+node+`\.[0-9]+$`)})
			if err != nil {
				return []string{err.Error()}
			}
			entries, _, err := c.Health().Service("web", "", false, &api.QueryOptions{NodeMeta: map[string]string{"owner": node}})
			if err != nil {
				return []string{err.Error()}
			}
			var es []string
			for _, e := range entries {
				es = append(es, fmt.Sprintf("%s:%d checks", e.Service.ID, len(e.Checks)))
			}
			slices.Sort(es)
			return []string{fmt.Sprint(ids), fmt.Sprint(len(checks), " ", checks[0].CheckID), fmt.Sprint(len(nodes)), fmt.Sprint(es),
				fmt.Sprint(slices.Sorted(maps.Keys(list.Node.Meta)))}
		},
		want: []string{"[web-1 web-2]", "1 c-db-1", "1", "[db-1:1 checks web-1:1 checks web-2:0 checks]", "[owner]"},
	},
}

// runScripts runs every script against c on a node of its own.
func runScripts(t *testing.T, c *api.Client, prefix string) {
	for i, s := range scripts {
		t.Run(s.name, func(t *testing.T) {
			node := fmt.Sprintf("%s-%d", prefix, i)
			var got []string
			for _, g := range s.run(c, node) {
				got = append(got, strings.ReplaceAll(g, node, "N"))
			}
			if !slices.Equal(got, s.want) {
				t.Errorf("transcript\n got %q\nwant %q", got, s.want)
			}
		})
	}
}

// TestTwin pins the twin's Consul semantics.
func TestTwin(t *testing.T) {
	runScripts(t, New(t).Client(), "twin")
}

// TestTwinAgreesWithAgent runs the same scripts against a real Consul
// agent: the twin's semantics are Consul's.
func TestTwinAgreesWithAgent(t *testing.T) {
	a := stack.ConsulT(t)
	awaitOwnNode(t, a.Client, a.NodeName)
	runScripts(t, a.Client, "agent")
}

// awaitOwnNode waits until the agent's own writes to the node table are
// done: its node registered with a passing serfHealth check, and then the
// catalog-wide node index unmoved through a 2 s blocking query. Those
// writes move the index "which indexes a write moves" reads; landing in
// the middle of the script, they moved it under a check delete and a
// check add in two CI runs (2026-12-03), the second after serfHealth
// passed.
func awaitOwnNode(t *testing.T, c *api.Client, node string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var index uint64
	for registered := false; !registered; {
		if time.Now().After(deadline) {
			t.Fatalf("the agent did not register node %s with a passing serfHealth check in 30s", node)
		}
		checks, meta, err := c.Health().Node(node, &api.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Second})
		if err != nil {
			t.Fatalf("the agent's own node %s: %v", node, err)
		}
		for _, hc := range checks {
			registered = registered || hc.CheckID == "serfHealth" && hc.Status == api.HealthPassing
		}
		index = meta.LastIndex
	}
	_, meta, err := c.Catalog().Nodes(nil)
	for err == nil && time.Now().Before(deadline) {
		before := meta.LastIndex
		if _, meta, err = c.Catalog().Nodes(&api.QueryOptions{WaitIndex: before, WaitTime: 2 * time.Second}); err == nil && meta.LastIndex == before {
			return
		}
	}
	t.Fatalf("the catalog's node index did not stand still for 2 s within 30 s (%v)", err)
}

// TestFaultAndWipe: a fault fails requests with a 500; Wipe loses the data
// and lowers the indexes, as a Consul restarted empty does.
func TestFaultAndWipe(t *testing.T) {
	s := New(t)
	c := s.Client()
	if r, _ := send(c, nodeOp(api.NodeSet, "n", "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, "n", "a", 80, 0)); r != "ok" {
		t.Fatal(r)
	}
	before := nodeIndex(c, "n")
	s.SetFault(func(*http.Request) error { return errors.New("No cluster leader") })
	if _, _, err := c.Catalog().NodeServiceList("n", nil); err == nil || !strings.Contains(err.Error(), "No cluster leader") {
		t.Fatalf("read during a fault: err = %v, want the fault", err)
	}
	s.SetFault(nil)
	s.Wipe()
	if got := services(c, "n"); got != "no node" {
		t.Fatalf("after Wipe: %s, want no node", got)
	}
	if after := nodeIndex(c, "n"); after >= before {
		t.Fatalf("index after Wipe %d, want below %d", after, before)
	}
	if s.Txns() != 1 {
		t.Fatalf("Txns = %d, want 1", s.Txns())
	}
}

// TestSnapshotRestore: a restore brings the data and the indexes of the
// snapshot back; the next write lands above every index seen before.
func TestSnapshotRestore(t *testing.T) {
	s := New(t)
	c := s.Client()
	send(c, nodeOp(api.NodeSet, "n", "10.0.0.1", nil, 0), svcOp(api.ServiceCAS, "n", "a", 80, 0))
	snap := s.Snapshot()
	nodeAt, kvAt := nodeIndex(c, "n"), kvIndex(c, "missing")
	send(c, svcOp(api.ServiceCAS, "n", "b", 80, 0))
	if _, err := c.KV().Put(&api.KVPair{Key: "k", Value: []byte("v")}, nil); err != nil {
		t.Fatal(err)
	}
	high := kvIndex(c, "missing")
	s.Restore(snap)
	if got := services(c, "n"); got != "[a:80]" {
		t.Fatalf("after Restore: %s, want [a:80]", got)
	}
	if nodeIndex(c, "n") != nodeAt || kvIndex(c, "missing") != kvAt {
		t.Fatalf("indexes after Restore: node %d kv %d, want %d and %d", nodeIndex(c, "n"), kvIndex(c, "missing"), nodeAt, kvAt)
	}
	_, resp := send(c, svcOp(api.ServiceCAS, "n", "c", 80, 0))
	if got := resp.Results[0].Service.ModifyIndex; got <= high {
		t.Fatalf("write after Restore at index %d, want above %d", got, high)
	}
}
