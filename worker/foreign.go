package worker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/k8s"
	"github.com/fleetsync/fleetsync/ownership"
)

// ReasonEntryNotOurs is the Event reason for an instance that cannot be
// registered because someone else's entry holds its ID on our node.
const ReasonEntryNotOurs = "ConsulEntryNotOurs"

// ForeignOf keeps the entries on the cluster's nodes that use an instance
// ID of Service key but do not carry the cluster's mark: someone else
// registered (or re-registered) them. They are never written or deleted;
// the desired instance with that ID is left out (a create would fail the
// whole transaction, and with it every other change of the Service).
func ForeignOf(cluster ownership.Cluster, key k8s.Key, entries []consul.Registered) map[string]consul.Registered {
	prefix := cluster.IDPrefix(key.Namespace, key.Name)
	var out map[string]consul.Registered
	for _, r := range entries {
		if !cluster.IsNode(r.Node) || !strings.HasPrefix(r.ID, prefix) || cluster.Owns(r) == nil {
			continue
		}
		if out == nil {
			out = map[string]consul.Registered{}
		}
		out[r.ID] = r
	}
	return out
}

// Unblocked returns desired without the instances whose ID a foreign entry
// holds on the node they would be registered on (and that are not already
// ours elsewhere), with one message per instance left out. It is pure.
func Unblocked(desired []consul.Instance, owned map[string]Held, foreign map[string]consul.Registered, nodeOf func(id string) string) ([]consul.Instance, []string) {
	if len(foreign) == 0 {
		return desired, nil
	}
	var msgs []string
	out := make([]consul.Instance, 0, len(desired))
	for _, d := range desired {
		f, taken := foreign[d.ID]
		if _, ours := owned[d.ID]; taken && !ours && (nodeOf == nil || f.Node == nodeOf(d.ID)) {
			msgs = append(msgs, fmt.Sprintf("instance %s (%s:%d) is not registered: an entry with this ID on node %s was registered by someone else, without this cluster's ownership mark (tags %v, meta %s); fleetsync leaves it untouched: remove it to let the endpoint be registered",
				d.ID, d.Address, d.Port, f.Node, f.Tags, metaOf(f.Meta)))
			continue
		}
		out = append(out, d)
	}
	return out, msgs
}

func metaOf(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("{")
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(k + "=" + m[k])
	}
	b.WriteString("}")
	return b.String()
}
